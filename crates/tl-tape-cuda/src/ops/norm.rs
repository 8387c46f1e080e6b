//! `layerNorm`, `rmsNorm` and `batchnormChannelFirst` on the device: one launch forward
//! ([`Device::norm_forward`]: `tl_norm_fwd`, or [`Device::norm_stats`] then
//! [`Device::norm_apply`] for groups longer than
//! [`NORM_FUSED_MAX`](crate::device::norm::NORM_FUSED_MAX)) and at most two backward
//! ([`Device::norm_bwd_x`] for dx, [`Device::norm_bwd_affine`] for dγ and dβ), in the compact
//! closed forms of SEMANTICS.md (`dx = rstd/m·(m·ĝ − Σ ĝ − x̂·Σ ĝ·x̂)`, `dγ = Σ g·x̂`,
//! `dβ = Σ g`). The forward keeps the per-group statistics (the means d̄ of x − x₀ about each
//! group's first element x₀, reciprocal standard deviations) as the node's workspace; the
//! backward reuses them while they are live and recomputes them once the tape has released
//! workspaces.
//!
//! `rmsNorm` (x, γ) is layerNorm's layout not centred ([`NormLayout::rms`]): x₀ = d̄ = 0, so
//! `x̂ = x·rstd` with `rstd = 1/sqrt(Σ x²/m + ε)`, `y = x̂·γ` (no β), `dx = rstd/m·(m·ĝ −
//! x̂·Σ ĝ·x̂)` and `dγ = Σ g·x̂`; the same kernels, its statistics' d̄s 0. It has two operands:
//! the dβ `norm_bwd_affine` computes with dγ is released.
//!
//! `batchMoments` is the statistics alone, one launch each way: [`Device::norm_moments`]
//! (`[μ…, var…]`) and [`Device::norm_moments_bwd`] (`dx = (gμ + 2·gv·(x − μ))/m`, μ read
//! from the op's output).

use tl_ir::Op;
use tl_spec::Error as SpecError;

use super::{elementwise as ew, with_scratch};
use crate::device::{Buffer, Device, NormLayout};
use crate::{AnyBuffer, Result};

/// The layout and ε of a normalization op on x.
pub fn layout(op: &Op, x: &AnyBuffer) -> Result<(NormLayout, f32)> {
    match *op {
        Op::LayerNorm { eps } => {
            let (rows, cols) = x.shape().rows_cols();
            Ok((NormLayout::layer(rows, cols), ew::param(eps)))
        }
        Op::RmsNorm { eps } => {
            let (rows, cols) = x.shape().rows_cols();
            Ok((NormLayout::rms(rows, cols), ew::param(eps)))
        }
        Op::BatchNorm { eps } => Ok((channels(op, x)?, ew::param(eps))),
        _ => Err(SpecError::param(op.name(), "not a normalization op").into()),
    }
}

/// The per-channel layout of x (C, H, W) or (N, C, H, W) (`batchnormChannelFirst`,
/// `batchMoments`).
fn channels(op: &Op, x: &AnyBuffer) -> Result<NormLayout> {
    let (n, c, hw) = match *x.shape().dims() {
        // Saturating: an empty x's other dims may overflow (the layout's u32 check refuses).
        [c, h, w] => (1, c, h.saturating_mul(w)),
        [n, c, h, w] => (n, c, h.saturating_mul(w)),
        _ => {
            return Err(SpecError::shape(
                op.name(),
                format!("x must be (C, H, W) or (N, C, H, W), got {}", x.shape()),
            )
            .into());
        }
    };
    Ok(NormLayout::channels(n, c, hw))
}

/// `batchMoments`' value, `[μ…, var…]` ((2, C)).
pub fn moments<D: Device>(dev: &mut D, op: &Op, x: &AnyBuffer) -> Result<Buffer> {
    let l = channels(op, x)?;
    dev.norm_moments(x.buffer(), l)
}

/// `batchMoments`' cotangent dx from its output `y` (the means it reads) and cotangent `g`.
pub fn moments_back<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &AnyBuffer,
    y: &AnyBuffer,
    g: Buffer,
) -> Result<Buffer> {
    let l = channels(op, x)?;
    dev.norm_moments_bwd(x.buffer(), y.buffer(), g, l)
}

/// Forward: `(y, stats)`, the statistics handed back as workspace. `beta` is `None` for
/// `rmsNorm` (arity 2) and `Some` for the others; [`Device::norm_forward`] rejects a mismatch.
pub fn forward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &AnyBuffer,
    gamma: &AnyBuffer,
    beta: Option<&AnyBuffer>,
) -> Result<(Buffer, Buffer)> {
    let (l, eps) = layout(op, x)?;
    dev.norm_forward(
        x.buffer(),
        gamma.buffer(),
        beta.map(AnyBuffer::buffer),
        l,
        eps,
    )
}

/// The cotangents `[dx, dγ, dβ]` that `needs` asks for; for `rmsNorm` (no β) dβ is always
/// `None`, the Σ g that `norm_bwd_affine` computes with dγ released.
pub fn backward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &AnyBuffer,
    gamma: &AnyBuffer,
    g: Buffer,
    needs: &[bool],
    workspace: &[Buffer],
) -> Result<[Option<Buffer>; 3]> {
    let (l, eps) = layout(op, x)?;
    let need = |k: usize| needs.get(k).copied().unwrap_or(false) && (k < 2 || l.centred);
    if !need(0) && !need(1) && !need(2) {
        return Ok([None, None, None]);
    }
    with_scratch(dev, |dev, s| {
        let stats = match workspace.first() {
            Some(&st) if dev.is_live(st) => st,
            _ => s.tmp(dev.norm_stats(x.buffer(), l, eps)?),
        };
        let dx = if need(0) {
            Some(dev.norm_bwd_x(x.buffer(), stats, gamma.buffer(), g, l)?)
        } else {
            None
        };
        if !need(1) && !need(2) {
            return Ok([dx, None, None]);
        }
        let (dg, db) = match dev.norm_bwd_affine(x.buffer(), stats, g, l) {
            Ok(p) => p,
            Err(e) => {
                dev.release_all(dx);
                return Err(e);
            }
        };
        let keep = |dev: &mut D, k: usize, b: Buffer| {
            if need(k) {
                Some(b)
            } else {
                dev.release(b);
                None
            }
        };
        let dg = keep(dev, 1, dg);
        let db = keep(dev, 2, db);
        Ok([dx, dg, db])
    })
}
