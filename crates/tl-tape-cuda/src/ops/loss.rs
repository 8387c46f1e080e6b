//! `mseLoss(ŷ, y) = Σ(ŷ − y)² / N` (N the element count, 1 for a scalar or an empty tensor, as in
//! the reference). The forward keeps `d = ŷ − y` as the node's workspace; the backward reuses it
//! while it is live and recomputes it once the tape has released workspaces after a backprop.

use super::with_scratch;
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Result};

fn n(yhat: &AnyBuffer) -> usize {
    yhat.shape().numel().max(1)
}

/// Forward: `(loss, d)` with `d = ŷ − y` handed back as workspace.
pub fn mse<D: Device>(dev: &mut D, yhat: &AnyBuffer, y: &AnyBuffer) -> Result<(Buffer, Buffer)> {
    let d = dev.sub(yhat.buffer(), y.buffer())?;
    let loss = with_scratch(dev, |dev, s| {
        let sq = s.tmp(dev.mul(d, d)?);
        if yhat.shape().numel() == 0 {
            dev.reduce_sum(sq)
        } else {
            dev.reduce_mean(sq)
        }
    });
    match loss {
        Ok(l) => Ok((l, d)),
        Err(e) => {
            dev.release(d);
            Err(e)
        }
    }
}

/// Backward: `dŷ = (2g/N)·d`, `dy = −dŷ`, only the ones `needs` asks for.
pub fn mse_back<D: Device>(
    dev: &mut D,
    yhat: &AnyBuffer,
    y: &AnyBuffer,
    g: Buffer,
    needs: &[bool],
    workspace: &[Buffer],
) -> Result<(Option<Buffer>, Option<Buffer>)> {
    if !needs[0] && !needs[1] {
        return Ok((None, None));
    }
    let c = 2.0 / n(yhat) as f32;
    let dims = yhat.shape().dims();
    with_scratch(dev, |dev, s| {
        let d = match workspace.first() {
            Some(&d) if dev.is_live(d) => d,
            _ => s.tmp(dev.sub(yhat.buffer(), y.buffer())?),
        };
        let gb = s.tmp(dev.broadcast(g, &[], dims)?);
        let gd = s.tmp(dev.mul(gb, d)?);
        let da = dev.scale(gd, c)?;
        if !needs[1] {
            return Ok((Some(da), None));
        }
        let db = match dev.scale(da, -1.0) {
            Ok(db) => db,
            Err(e) => {
                dev.release(da);
                return Err(e);
            }
        };
        if needs[0] {
            Ok((Some(da), Some(db)))
        } else {
            dev.release(da);
            Ok((None, Some(db)))
        }
    })
}
