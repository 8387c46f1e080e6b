//! The index kernels of `kernels/index.cu` on host slices: row gathers, the scatter-add (always
//! the fixed order: per output row, its sources in increasing order, from 0), range copies and
//! the fused cross-entropy rows (row max and sum in the block-tree order of [`super::reduce`]).

use super::SimDevice;
use super::reduce::{block_max, block_sum};
use crate::Result;
use crate::device::Buffer;
use crate::device::index_check::ScatterPlan;

pub(super) fn gather_rows(
    d: &mut SimDevice,
    x: Buffer,
    rows: usize,
    cols: usize,
    idx: &[u32],
) -> Result<Buffer> {
    d.launch("gather_rows", [x], idx.len() * cols, |[x], out| {
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
    idx: &[u32],
) -> Result<Buffer> {
    let plan = ScatterPlan::new(rows, idx);
    d.launch("scatter_add_rows", [g], rows * cols, |[g], out| {
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
    d.launch("copy_range", [x], len, |[x], out| {
        out.copy_from_slice(&x[start..start + len])
    })
}

pub(super) fn place_range(
    d: &mut SimDevice,
    g: Buffer,
    len: usize,
    start: usize,
) -> Result<Buffer> {
    let n = g.len();
    d.launch("place_range", [g], len, |[g], out| {
        out.fill(0.0);
        out[start..start + n].copy_from_slice(g);
    })
}

pub(super) fn concat(d: &mut SimDevice, a: Buffer, b: Buffer) -> Result<Buffer> {
    d.launch("concat", [a, b], a.len() + b.len(), |[a, b], out| {
        let (oa, ob) = out.split_at_mut(a.len());
        oa.copy_from_slice(a);
        ob.copy_from_slice(b);
    })
}

pub(super) fn add_range(d: &mut SimDevice, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
    d.launch("add_range", [x, v], x.len(), |[x, v], out| {
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
    labels: Buffer,
) -> Result<Buffer> {
    d.launch(
        "cross_entropy_rows",
        [x, labels],
        rows,
        |[x, labels], out| {
            for (r, (o, &l)) in out.iter_mut().zip(labels).enumerate() {
                let l = l.to_bits() as usize;
                *o = if l < cols {
                    let xr = &x[r * cols..(r + 1) * cols];
                    lse(xr) - xr[l]
                } else {
                    0.0
                };
            }
        },
    )
}

pub(super) fn cross_entropy_rows_bwd(
    d: &mut SimDevice,
    x: Buffer,
    g: Buffer,
    rows: usize,
    cols: usize,
    labels: Buffer,
) -> Result<Buffer> {
    d.launch(
        "cross_entropy_rows_bwd",
        [x, g, labels],
        x.len(),
        |[x, g, labels], out| {
            let k = g[0] / rows as f32;
            for (r, &l) in labels.iter().enumerate() {
                let (xr, dr) = (
                    &x[r * cols..(r + 1) * cols],
                    &mut out[r * cols..(r + 1) * cols],
                );
                let l = l.to_bits() as usize;
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
        },
    )
}
