//! The index kernels of `kernels/index.cu` on host slices: row gathers, the scatter-add (always
//! the fixed order: per output row, its sources in increasing order, from 0), range copies and
//! the fused cross-entropy rows (row max and sum in the block-tree order of [`super::reduce`]).

use super::SimDevice;
use super::reduce::{block_max, block_sum};
use crate::Result;
use crate::device::index_check::{self, ScatterPlan};
use crate::device::{Buffer, check};

pub(super) fn gather_rows(
    d: &mut SimDevice,
    x: Buffer,
    rows: usize,
    cols: usize,
    idx: &[usize],
) -> Result<Buffer> {
    const OP: &str = "gather_rows";
    let idx = index_check::row_indices(OP, rows, cols, idx)?;
    check::len_is(OP, "input", x, rows * cols)?;
    d.launch(OP, [x], idx.len() * cols, |[x], out| {
        for (&s, o) in idx.iter().zip(out.chunks_mut(cols.max(1))) {
            let s = s as usize;
            if s < rows {
                o.copy_from_slice(&x[s * cols..(s + 1) * cols]);
            } else {
                o.fill(0.0);
            }
        }
    })
}

pub(super) fn scatter_add_rows(
    d: &mut SimDevice,
    g: Buffer,
    rows: usize,
    cols: usize,
    idx: &[usize],
) -> Result<Buffer> {
    const OP: &str = "scatter_add_rows";
    let idx = index_check::row_indices(OP, rows, cols, idx)?;
    check::len_is(OP, "cotangent", g, idx.len() * cols)?;
    let plan = ScatterPlan::new(rows, &idx);
    d.launch(OP, [g], rows * cols, |[g], out| {
        for (j, o) in out.chunks_mut(cols.max(1)).enumerate() {
            for (c, o) in o.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for &r in plan.sources(j) {
                    acc += g[r as usize * cols + c];
                }
                *o = acc;
            }
        }
    })
}

pub(super) fn copy_range(d: &mut SimDevice, x: Buffer, start: usize, len: usize) -> Result<Buffer> {
    const OP: &str = "copy_range";
    index_check::range(OP, "input", x, start, len)?;
    d.launch(OP, [x], len, |[x], out| {
        out.copy_from_slice(&x[start..start + len])
    })
}

pub(super) fn place_range(
    d: &mut SimDevice,
    g: Buffer,
    len: usize,
    start: usize,
) -> Result<Buffer> {
    const OP: &str = "place_range";
    let n = g.len();
    index_check::fits(OP, "output", start, n, len)?;
    d.launch(OP, [g], len, |[g], out| {
        out.fill(0.0);
        out[start..start + n].copy_from_slice(g);
    })
}

pub(super) fn concat(d: &mut SimDevice, a: Buffer, b: Buffer) -> Result<Buffer> {
    const OP: &str = "concat";
    let n = index_check::concat_len(OP, a, b)?;
    d.launch(OP, [a, b], n, |[a, b], out| {
        let (oa, ob) = out.split_at_mut(a.len());
        oa.copy_from_slice(a);
        ob.copy_from_slice(b);
    })
}

pub(super) fn add_range(d: &mut SimDevice, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
    const OP: &str = "add_range";
    index_check::range(OP, "input", x, start, v.len())?;
    d.launch(OP, [x, v], x.len(), |[x, v], out| {
        out.copy_from_slice(x);
        for (o, &b) in out[start..start + v.len()].iter_mut().zip(v) {
            *o += b;
        }
    })
}

/// `(m + ln Σ exp(x − m))` of one row, in the kernel's block order.
fn lse(xr: &[f32]) -> f32 {
    let cols = xr.len();
    let m = block_max(cols, |j| xr[j]);
    let s = block_sum(cols, |j| (xr[j] - m).exp());
    m + s.ln()
}

pub(super) fn cross_entropy_rows(
    d: &mut SimDevice,
    x: Buffer,
    rows: usize,
    cols: usize,
    labels: &[usize],
) -> Result<Buffer> {
    const OP: &str = "cross_entropy_rows";
    let labels = index_check::labels(OP, x, rows, cols, labels)?;
    d.launch(OP, [x], rows, |[x], out| {
        for (r, (o, &l)) in out.iter_mut().zip(&labels).enumerate() {
            let l = l as usize;
            *o = if l < cols {
                let xr = &x[r * cols..(r + 1) * cols];
                lse(xr) - xr[l]
            } else {
                0.0
            };
        }
    })
}

pub(super) fn cross_entropy_rows_bwd(
    d: &mut SimDevice,
    x: Buffer,
    g: Buffer,
    rows: usize,
    cols: usize,
    labels: &[usize],
) -> Result<Buffer> {
    const OP: &str = "cross_entropy_rows_bwd";
    let labels = index_check::labels(OP, x, rows, cols, labels)?;
    check::len_is(OP, "cotangent", g, 1)?;
    d.launch(OP, [x, g], x.len(), |[x, g], out| {
        let k = g[0] / rows as f32;
        for (r, &l) in labels.iter().enumerate() {
            let (xr, dr) = (
                &x[r * cols..(r + 1) * cols],
                &mut out[r * cols..(r + 1) * cols],
            );
            let l = l as usize;
            if l >= cols {
                dr.fill(0.0);
                continue;
            }
            let z = lse(xr);
            for (j, (o, &v)) in dr.iter_mut().zip(xr).enumerate() {
                let v = (v - z).exp() * k;
                *o = if j == l { v - k } else { v };
            }
        }
    })
}
