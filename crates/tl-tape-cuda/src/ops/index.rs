//! The index and pointwise-activation family on the CUDA tape: `gelu`, `silu`, `concat0`,
//! `sliceRange0`, `crossEntropy`, every gather and both scatter-adds.
//!
//! - Gathers: one [`Device::gather_rows`] over x viewed as (rows, cols) (a 1-D x is rows of one
//!   element) with host indices from the op, the Nat environment (one position, or a block of positions) or the
//!   downloaded index tensor; totalized (an out-of-range index reads a zero row). Backward: one
//!   [`Device::scatter_add_rows`] (repeated indices accumulate, out-of-range ones get nothing);
//!   the index tensor gets no cotangent.
//! - `concat0`/`sliceRange0`/scatter-adds: contiguous range copies (axis 0 is outermost).
//! - `crossEntropy`: per-row losses from one fused row kernel, then their mean; backward one
//!   fused row kernel, `(softmax − onehot)·g/rows`.

use tl_ir::Op;
use tl_spec::Shape;
use tl_spec::ops::index::{index_value, nat_at, try_nat_vec_at};

use super::with_scratch;
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Error, Result};

/// `(rows, cols)` of a gather/scatter operand: (n, 1) for 1-D, (r, c) for 2-D.
pub fn rows_cols(x: &Shape) -> (usize, usize) {
    match x.dims() {
        &[n] => (n, 1),
        // Saturating: `rest` of an empty operand ([0, 2⁶², 8]) may overflow.
        [r, rest @ ..] => (*r, Shape::saturating_product(rest)),
        [] => (1, 1),
    }
}

/// Elements per axis-0 row of a rank ≥ 1 operand: 0 when the operand holds no element, whatever
/// its other dims (their product may overflow: `[1, 2⁶², 8, 0]`).
fn row_len(x: &Shape) -> usize {
    if x.dims().contains(&0) {
        return 0;
    }
    x.dims().iter().skip(1).product()
}

/// The row indices a gather reads (`idx ≥ rows` is out of range); the index tensor of
/// `gather` is downloaded to the host.
pub fn indices<D: Device>(
    dev: &D,
    op: &Op,
    x: &[&AnyBuffer],
    nats: &[usize],
) -> Result<Vec<usize>> {
    use Op::*;
    let (rows, _) = rows_cols(x[0].shape());
    Ok(match op {
        GatherScalar { index }
        | GatherRow { index }
        | GatherScalarRaw { index }
        | GatherRowRaw { index } => vec![*index],
        GatherScalarNat { at } | GatherRowNat { at } => vec![nat_at(nats, *at)],
        GatherScalarsNatVec { at, k } | GatherRowsNatVec { at, k } => {
            try_nat_vec_at(op.name(), nats, *at, *k)?
        }
        GatherIndexTensor => dev
            .download(x[1].buffer())?
            .into_iter()
            .map(|v| index_value(f64::from(v), rows))
            .collect(),
        _ => return Err(wrong(op)),
    })
}

/// Forward of a gather.
pub fn gather<D: Device>(dev: &mut D, op: &Op, x: &[&AnyBuffer], nats: &[usize]) -> Result<Buffer> {
    let idx = indices(dev, op, x, nats)?;
    let (rows, cols) = rows_cols(x[0].shape());
    dev.gather_rows(x[0].buffer(), rows, cols, &idx)
}

/// Backward of a gather into x: the scatter-add of `g`.
pub fn gather_back<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    g: Buffer,
    nats: &[usize],
) -> Result<Buffer> {
    let idx = indices(dev, op, x, nats)?;
    let (rows, cols) = rows_cols(x[0].shape());
    dev.scatter_add_rows(g, rows, cols, &idx)
}

/// Forward of `sliceRange0(start, len)`.
pub fn slice<D: Device>(dev: &mut D, x: &AnyBuffer, start: usize, len: usize) -> Result<Buffer> {
    let row = row_len(x.shape());
    dev.copy_range(x.buffer(), start * row, len * row)
}

/// Backward of `sliceRange0(start, _)`: `g` in rows `start..`, zeros elsewhere.
pub fn slice_back<D: Device>(
    dev: &mut D,
    x: &AnyBuffer,
    start: usize,
    g: Buffer,
) -> Result<Buffer> {
    let row = row_len(x.shape());
    dev.place_range(g, x.shape().numel(), start * row)
}

/// Forward of `scatterAddVec`/`scatterAddRow` at row `index`: x with v added into that row.
pub fn scatter_add<D: Device>(dev: &mut D, x: &[&AnyBuffer], index: usize) -> Result<Buffer> {
    let (_, cols) = rows_cols(x[0].shape());
    dev.add_range(x[0].buffer(), x[1].buffer(), index * cols)
}

/// Backward of a scatter-add into v: row `index` of `g`.
pub fn scatter_add_back_v<D: Device>(
    dev: &mut D,
    x: &[&AnyBuffer],
    index: usize,
    g: Buffer,
) -> Result<Buffer> {
    let (_, cols) = rows_cols(x[0].shape());
    dev.copy_range(g, index * cols, x[1].shape().numel())
}

/// `(rows, classes, labels)` of a `crossEntropy` on logits `x`.
fn cross_entropy_setup(
    x: &AnyBuffer,
    labels_at: usize,
    nats: &[usize],
) -> Result<(usize, usize, Vec<usize>)> {
    let (rows, c) = match x.shape().dims() {
        &[c] => (1, c),
        d => (
            d.first().copied().unwrap_or(1),
            d.get(1).copied().unwrap_or(1),
        ),
    };
    Ok((
        rows,
        c,
        try_nat_vec_at("crossEntropy", nats, labels_at, rows)?,
    ))
}

/// Forward of `crossEntropy`: `(loss, labels)`, the mean of the per-row losses and the labels
/// on the device, handed back as workspace so the backward does not copy them again.
pub fn cross_entropy<D: Device>(
    dev: &mut D,
    x: &AnyBuffer,
    labels_at: usize,
    nats: &[usize],
) -> Result<(Buffer, Buffer)> {
    const OP: &str = "crossEntropy";
    let (rows, c, labels) = cross_entropy_setup(x, labels_at, nats)?;
    let lab = dev.upload_labels(OP, x.buffer(), rows, c, &labels)?;
    let loss = with_scratch(dev, |dev, s| {
        let per = s.tmp(dev.cross_entropy_rows_on(x.buffer(), rows, c, lab)?);
        dev.reduce_mean(per)
    });
    match loss {
        Ok(l) => Ok((l, lab)),
        Err(e) => {
            dev.release(lab);
            Err(e)
        }
    }
}

/// Backward of `crossEntropy` into the logits: the forward's device labels while they are live
/// (`workspace`), else the labels copied again (after the tape released its workspaces).
pub fn cross_entropy_back<D: Device>(
    dev: &mut D,
    x: &AnyBuffer,
    labels_at: usize,
    g: Buffer,
    nats: &[usize],
    workspace: &[Buffer],
) -> Result<Buffer> {
    let (rows, c, labels) = cross_entropy_setup(x, labels_at, nats)?;
    match workspace.first() {
        Some(&lab) if dev.is_live(lab) => {
            dev.cross_entropy_rows_bwd_on(x.buffer(), g, rows, c, lab)
        }
        _ => dev.cross_entropy_rows_bwd(x.buffer(), g, rows, c, &labels),
    }
}

/// `op` reached a gather formula but is not a gather (a dispatch bug, reported, not a panic).
fn wrong(op: &Op) -> Error {
    Error::kernel(op.name(), "not a gather: no row indices")
}
