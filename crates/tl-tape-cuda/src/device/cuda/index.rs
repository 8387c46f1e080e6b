//! The index primitives on the CUDA device (`kernels/index.cu`). Host index slices, checked
//! and mapped to `u32` by [`Device`]'s provided methods ([`index_check`](crate::device::index_check)), are uploaded to a temporary device buffer
//! (u32 bit patterns in an f32 allocation of the pool) for the launch, and released after it,
//! whatever the outcome.
//!
//! Scatter-add: in deterministic mode, one thread per output element walks its sources in
//! increasing order ([`ScatterPlan`], built on the host); otherwise one `atomicAdd` per
//! cotangent element into zeros.

use super::CudaDevice;
use super::driver::{self, Arg};
use crate::Result;
use crate::device::index_check::ScatterPlan;
use crate::device::{Buffer, Device, LaunchIndex};

/// Upload `vals` (as raw `u32` bits) to a temporary buffer, run `body` with its address, then
/// release the temporary.
fn with_u32(
    d: &mut CudaDevice,
    op: &'static str,
    vals: &[u32],
    body: impl FnOnce(&mut CudaDevice, u64) -> Result<Buffer>,
) -> Result<Buffer> {
    let bits: Vec<f32> = vals.iter().map(|&v| f32::from_bits(v)).collect();
    let tmp = d.with_out(op, bits.len(), |d, out| {
        d.traffic.upload(bits.len());
        driver::copy_to_device(out, &bits)
    })?;
    let r = d.ptr(op, tmp).and_then(|p| body(d, p));
    d.release(tmp);
    r
}

impl LaunchIndex for CudaDevice {
    fn launch_gather_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer> {
        const OP: &str = "gather_rows";
        let px = self.ptr(OP, x)?;
        let n = idx.len() * cols;
        let extra = [Arg::U32(rows as u32), Arg::U32(cols as u32)];
        with_u32(self, OP, idx, |d, pi| {
            d.with_out(OP, n, |d, out| {
                let ptrs = [Arg::Ptr(px), Arg::Ptr(pi), Arg::Ptr(out)];
                d.grid_stride(OP, "tl_gather_rows", n, &ptrs, &extra)
            })
        })
    }

    fn launch_scatter_add_rows(
        &mut self,
        g: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer> {
        const OP: &str = "scatter_add_rows";
        let pg = self.ptr(OP, g)?;
        let n_out = rows * cols;
        // An empty output (`rows` may then be any size, with `cols` 0) takes the plain path,
        // which launches nothing: no plan of rows + 1 offsets.
        if self.deterministic() && n_out > 0 {
            // Fixed order: offsets (rows + 1) then order, in one upload.
            let plan = ScatterPlan::new(rows, idx);
            let meta: Vec<u32> = plan.offsets.iter().chain(&plan.order).copied().collect();
            let order_at = 4 * (rows as u64 + 1);
            with_u32(self, OP, &meta, |d, pm| {
                d.with_out(OP, n_out, |d, out| {
                    let ptrs = [pg, pm, pm + order_at, out].map(Arg::Ptr);
                    d.grid_stride(
                        OP,
                        "tl_scatter_add_rows",
                        n_out,
                        &ptrs,
                        &[Arg::U32(cols as u32)],
                    )
                })
            })
        } else {
            let n_in = idx.len() * cols;
            let extra = [Arg::U32(rows as u32), Arg::U32(cols as u32)];
            with_u32(self, OP, idx, |d, pi| {
                d.with_out(OP, n_out, |d, out| {
                    d.grid_stride(OP, "tl_full", n_out, &[Arg::Ptr(out)], &[Arg::F32(0.0)])?;
                    let ptrs = [Arg::Ptr(pg), Arg::Ptr(pi), Arg::Ptr(out)];
                    d.grid_stride(OP, "tl_scatter_add_rows_atomic", n_in, &ptrs, &extra)
                })
            })
        }
    }

    fn launch_copy_range(&mut self, x: Buffer, start: usize, len: usize) -> Result<Buffer> {
        const OP: &str = "copy_range";
        let px = self.ptr(OP, x)?;
        self.with_out(OP, len, |d, out| {
            let ptrs = [Arg::Ptr(px), Arg::Ptr(out)];
            d.grid_stride(OP, "tl_copy_range", len, &ptrs, &[Arg::U64(start as u64)])
        })
    }

    fn launch_place_range(&mut self, g: Buffer, len: usize, start: usize) -> Result<Buffer> {
        const OP: &str = "place_range";
        let pg = self.ptr(OP, g)?;
        let extra = [Arg::U64(start as u64), Arg::U64(g.len() as u64)];
        self.with_out(OP, len, |d, out| {
            let ptrs = [Arg::Ptr(pg), Arg::Ptr(out)];
            d.grid_stride(OP, "tl_place_range", len, &ptrs, &extra)
        })
    }

    fn launch_concat(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        const OP: &str = "concat";
        let n = a.len() + b.len();
        let (pa, pb) = (self.ptr(OP, a)?, self.ptr(OP, b)?);
        self.with_out(OP, n, |d, out| {
            let ptrs = [pa, pb, out].map(Arg::Ptr);
            d.grid_stride(OP, "tl_concat", n, &ptrs, &[Arg::U64(a.len() as u64)])
        })
    }

    fn launch_add_range(&mut self, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
        const OP: &str = "add_range";
        let (px, pv) = (self.ptr(OP, x)?, self.ptr(OP, v)?);
        let n = x.len();
        let extra = [Arg::U64(start as u64), Arg::U64(v.len() as u64)];
        self.with_out(OP, n, |d, out| {
            let ptrs = [px, pv, out].map(Arg::Ptr);
            d.grid_stride(OP, "tl_add_range", n, &ptrs, &extra)
        })
    }

    fn launch_cross_entropy_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        self.rows_to("tl_cross_entropy_rows", &[x, labels], rows, rows, cols, &[])
    }

    fn launch_cross_entropy_rows_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        self.rows(
            "tl_cross_entropy_rows_bwd",
            &[x, labels, g],
            rows,
            cols,
            &[],
        )
    }
}
