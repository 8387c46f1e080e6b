//! The index kernels of `kernels/index.cu` on host slices: row gathers, the scatter-add (always
//! the fixed order: per output row, its sources in increasing order, from 0), range copies and
//! the fused cross-entropy rows (row max and sum in the block-tree order of [`super::reduce`]).

use super::SimDevice;
use super::reduce::{block_max, block_sum};
use crate::Result;
use crate::device::index_check::ScatterPlan;
use crate::device::{Buffer, LaunchIndex};

/// `(m + ln Σ exp(x − m))` of one row, in the kernel's block order.
fn lse(xr: &[f32]) -> f32 {
    let cols = xr.len();
    let m = block_max(cols, |j| xr[j]);
    let s = block_sum(cols, |j| (xr[j] - m).exp());
    m + s.ln()
}

impl LaunchIndex for SimDevice {
    fn launch_gather_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer> {
        self.launch("gather_rows", [x], idx.len() * cols, |[x], out| {
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

    fn launch_scatter_add_rows(
        &mut self,
        g: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer> {
        self.launch("scatter_add_rows", [g], rows * cols, |[g], out| {
            // Built only for an output with elements (no kernel runs for an empty one, whose
            // `rows` may be any size when `cols` is 0).
            let plan = ScatterPlan::new(rows, idx);
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

    fn launch_copy_range(&mut self, x: Buffer, start: usize, len: usize) -> Result<Buffer> {
        self.launch("copy_range", [x], len, |[x], out| {
            out.copy_from_slice(&x[start..start + len])
        })
    }

    fn launch_place_range(&mut self, g: Buffer, len: usize, start: usize) -> Result<Buffer> {
        let n = g.len();
        self.launch("place_range", [g], len, |[g], out| {
            out.fill(0.0);
            out[start..start + n].copy_from_slice(g);
        })
    }

    fn launch_concat(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.launch("concat", [a, b], a.len() + b.len(), |[a, b], out| {
            let (oa, ob) = out.split_at_mut(a.len());
            oa.copy_from_slice(a);
            ob.copy_from_slice(b);
        })
    }

    fn launch_add_range(&mut self, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
        self.launch("add_range", [x, v], x.len(), |[x, v], out| {
            out.copy_from_slice(x);
            for (o, &b) in out[start..start + v.len()].iter_mut().zip(v) {
                *o += b;
            }
        })
    }

    fn launch_cross_entropy_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        self.launch(
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

    fn launch_cross_entropy_rows_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        self.launch(
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
}
