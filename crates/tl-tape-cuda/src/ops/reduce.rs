//! Reductions: `sum` is `reduce_sum` (the fixed-order grid reduction) forward and a broadcast of
//! the scalar cotangent backward; `reduceSum(axis)` / `reduceMean(axis)` view the operand as
//! (outer, n, inner) and reduce the middle axis, and broadcast the cotangent back along it
//! (scaled by 1/n for the mean).

use super::with_scratch;
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Result};

/// (outer, n, inner) of `x` around `axis`.
fn split(x: &AnyBuffer, op: &'static str, axis: usize) -> Result<(usize, usize, usize)> {
    Ok(x.shape().split_at_axis(op, axis)?)
}

fn name(mean: bool) -> &'static str {
    if mean { "reduceMean" } else { "reduceSum" }
}

/// Forward of `reduceSum(axis)` (or `reduceMean(axis)` when `mean`).
pub fn axis<D: Device>(dev: &mut D, x: &AnyBuffer, axis: usize, mean: bool) -> Result<Buffer> {
    let (outer, n, inner) = split(x, name(mean), axis)?;
    if mean {
        dev.reduce_axis_mean(x.buffer(), outer, n, inner)
    } else {
        dev.reduce_axis_sum(x.buffer(), outer, n, inner)
    }
}

/// Backward: the cotangent `g` (outer, inner) copied along the reduced axis, times 1/n for the
/// mean.
pub fn axis_back<D: Device>(
    dev: &mut D,
    x: &AnyBuffer,
    axis: usize,
    g: Buffer,
    mean: bool,
) -> Result<Buffer> {
    let (outer, n, inner) = split(x, name(mean), axis)?;
    let (from, to) = ([outer, 1, inner], [outer, n, inner]);
    if !mean {
        return dev.broadcast(g, &from, &to);
    }
    with_scratch(dev, |dev, s| {
        let b = s.tmp(dev.broadcast(g, &from, &to)?);
        dev.scale(b, 1.0 / n as f32)
    })
}
