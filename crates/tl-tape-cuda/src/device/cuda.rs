//! The real CUDA device (feature `cuda`): cust 0.3.2 over the driver API, kernels from
//! `kernels/*.cu` built to PTX by `cargo xtask kernels` and embedded with `include_str!`.
//!
//! - [`driver`]: the process-wide context (created once, never dropped) and modules, raw
//!   memory for the [`CachingAllocator`], copies, launches. All `unsafe` lives there, each
//!   block with a `// SAFETY:` comment.
//! - `launch`: how a primitive runs (allocate, launch, release on failure) and the shared
//!   launch shapes.
//!
//! Every primitive runs the same argument checks as [`SimDevice`](super::sim::SimDevice)
//! ([`check`], [`crate::abi`]) before touching memory, and the same algorithm; with
//! [`deterministic_reductions`](crate::determinism::deterministic_reductions) on, the same
//! reduction order. [`CudaDevice::new`] returns [`Error::NoDevice`] where the driver has no
//! device (or is the stub of `cargo xtask cuda-stub`).
//!
//! Not yet run on a GPU: see docs/cuda.md.

mod conv;
mod driver;
mod index;
mod launch;
mod norm;

use std::collections::HashMap;

use super::check::{self, BroadcastPlan, PermutePlan};
use super::{Buffer, Device, Gemm, NormLayout, PoolKind, Windows};
use crate::alloc::{Allocation, CachingAllocator, Collected, MemoryUsage};
use crate::{Error, Result, abi, determinism};
use driver::{Arg, DeviceMemory};
use launch::{blocks, dims8};

/// The CUDA device: GPU 0 of the process-wide context, a caching allocator over its memory,
/// and the embedded kernels. PyTorch: `torch.device("cuda")` with its caching allocator.
#[derive(Debug)]
pub struct CudaDevice {
    pool: CachingAllocator<DeviceMemory>,
    live: HashMap<u64, Allocation<u64>>,
    funcs: HashMap<&'static str, usize>,
}

impl CudaDevice {
    /// Initialize the driver (once per process), make its context current on this thread,
    /// and load the kernels. [`Error::NoDevice`] when there is no usable GPU.
    pub fn new() -> Result<Self> {
        driver::enter()?;
        let mut d = CudaDevice {
            pool: CachingAllocator::new(DeviceMemory),
            live: HashMap::new(),
            funcs: HashMap::new(),
        };
        // Resolve one kernel now, so a PTX the driver refuses fails here, not at first use.
        d.func("tl_full")?;
        Ok(d)
    }

    /// Set how many cached bytes a non-forced `collect` keeps.
    pub fn set_cache_limit(&mut self, bytes: usize) {
        self.pool.set_cache_limit(bytes);
    }

    /// Number of live buffers.
    pub fn live_buffers(&self) -> usize {
        self.live.len()
    }

    fn gemm(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        batch: usize,
        g: Gemm,
    ) -> Result<Buffer> {
        let [_, _, lo] = check::gemm_lens(op, a, b, batch, g)?;
        let (pa, pb) = (self.ptr(op, a)?, self.ptr(op, b)?);
        let gx = g.n.div_ceil(64);
        let gy = g.m.div_ceil(64);
        if gy > 65_535 {
            return Err(Error::kernel(
                op,
                format!("m = {} exceeds the grid limit 65535·64", g.m),
            ));
        }
        let gx = abi::to_u32(op, "grid", gx)?;
        self.with_out(op, batch * lo, |d, out| {
            if batch * lo == 0 {
                return Ok(());
            }
            let args = [
                Arg::Ptr(pa),
                Arg::Ptr(pb),
                Arg::Ptr(out),
                Arg::U32(batch as u32),
                Arg::U32(g.m as u32),
                Arg::U32(g.k as u32),
                Arg::U32(g.n as u32),
                Arg::U32(u32::from(g.ta)),
                Arg::U32(u32::from(g.tb)),
            ];
            d.run(
                op,
                "tl_gemm",
                [gx, gy as u32, batch.min(65_535) as u32],
                &args,
            )
        })
    }

    fn rows(
        &mut self,
        kernel: &'static str,
        ins: &[Buffer],
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        let op = &kernel[3..];
        check::rows_cols(op, ins[0], rows, cols)?;
        if let [y, g] = ins {
            check::same_len(op, *y, *g)?;
        }
        let mut args = ins
            .iter()
            .map(|&b| self.ptr(op, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        let n = ins[0].len();
        self.with_out(op, n, |d, out| {
            if n == 0 {
                return Ok(());
            }
            args.extend([Arg::Ptr(out), Arg::U32(rows as u32), Arg::U32(cols as u32)]);
            d.run(op, kernel, [rows.min(65_535) as u32, 1, 1], &args)
        })
    }

    fn axis(
        &mut self,
        op: &'static str,
        x: Buffer,
        outer: usize,
        n: usize,
        inner: usize,
        mean: bool,
    ) -> Result<Buffer> {
        check::len_is(op, "input", x, check::product(op, &[outer, n, inner])?)?;
        let out_len = check::product(op, &[outer, inner])?;
        let px = self.ptr(op, x)?;
        let dims = [
            abi::to_u32(op, "outer", outer)?,
            abi::to_u32(op, "n", n)?,
            abi::to_u32(op, "inner", inner)?,
        ];
        self.with_out(op, out_len, |d, out| {
            if out_len == 0 {
                return Ok(());
            }
            let args = [
                Arg::Ptr(px),
                Arg::Ptr(out),
                Arg::U32(dims[0]),
                Arg::U32(dims[1]),
                Arg::U32(dims[2]),
                Arg::U32(u32::from(mean)),
            ];
            d.run(op, "tl_axis_sum", [blocks(out_len), 1, 1], &args)
        })
    }

    fn gather(
        &mut self,
        op: &'static str,
        x: Buffer,
        out_dims: &[usize],
        strides: &[usize],
        n: usize,
    ) -> Result<Buffer> {
        let px = self.ptr(op, x)?;
        let extra = [
            Arg::U32(out_dims.len() as u32),
            Arg::Dims(dims8(out_dims, 1)),
            Arg::Dims(dims8(strides, 0)),
        ];
        self.with_out(op, n, |d, out| {
            d.grid_stride(op, "tl_gather", n, &[Arg::Ptr(px), Arg::Ptr(out)], &extra)
        })
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload(&mut self, data: &[f32]) -> Result<Buffer> {
        self.with_out("upload", data.len(), |_, out| {
            driver::copy_to_device(out, data)
        })
    }

    fn download(&self, b: Buffer) -> Result<Vec<f32>> {
        let p = self.ptr("download", b)?;
        driver::enter()?;
        driver::copy_to_host(p, b.len())
    }

    fn size(&self, b: Buffer) -> Result<usize> {
        self.ptr("size", b).map(|_| b.len())
    }

    fn is_live(&self, b: Buffer) -> bool {
        self.live.contains_key(&b.id())
    }

    fn zeros(&mut self, n: usize) -> Result<Buffer> {
        self.full(n, 0.0)
    }

    fn full(&mut self, n: usize, v: f32) -> Result<Buffer> {
        self.with_out("full", n, |d, out| {
            d.grid_stride("full", "tl_full", n, &[Arg::Ptr(out)], &[Arg::F32(v)])
        })
    }

    fn release(&mut self, b: Buffer) -> bool {
        match self.live.remove(&b.id()) {
            Some(a) => {
                self.pool.free(a);
                true
            }
            None => false,
        }
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.pool.usage()
    }

    fn collect(&mut self, force: bool) -> Collected {
        if driver::enter().is_err() {
            return Collected::default();
        }
        self.pool.collect(force)
    }

    fn rand_uniform(&mut self, n: usize, key: u64) -> Result<Buffer> {
        self.with_out("rand_uniform", n, |d, out| {
            d.grid_stride(
                "rand_uniform",
                "tl_rand_uniform",
                n,
                &[Arg::Ptr(out)],
                &[Arg::U64(key)],
            )
        })
    }

    fn bernoulli_mask(&mut self, n: usize, key: u64, keep_prob: f64) -> Result<Buffer> {
        let extra = [Arg::U64(key), Arg::F64(keep_prob)];
        self.with_out("bernoulli_mask", n, |d, out| {
            d.grid_stride(
                "bernoulli_mask",
                "tl_bernoulli_mask",
                n,
                &[Arg::Ptr(out)],
                &extra,
            )
        })
    }

    fn abs(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_abs", x, &[])
    }
    fn sqrt(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_sqrt", x, &[])
    }
    fn exp(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_exp", x, &[])
    }
    fn log(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_log", x, &[])
    }
    fn inv(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_inv", x, &[])
    }
    fn relu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_relu", x, &[])
    }
    fn sigmoid(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_sigmoid", x, &[])
    }
    fn tanh(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_tanh", x, &[])
    }
    fn softplus(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_softplus", x, &[])
    }
    fn safe_log(&mut self, x: Buffer, eps: f32) -> Result<Buffer> {
        self.map1("tl_safe_log", x, &[Arg::F32(eps)])
    }
    fn clamp(&mut self, x: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map1("tl_clamp", x, &[Arg::F32(lo), Arg::F32(hi)])
    }
    fn scale(&mut self, x: Buffer, c: f32) -> Result<Buffer> {
        self.map1("tl_scale", x, &[Arg::F32(c)])
    }

    fn abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_abs_bwd", x, g, &[])
    }
    fn sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_sqrt_bwd", x, g, &[])
    }
    fn relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_relu_bwd", x, g, &[])
    }
    fn clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map2("tl_clamp_bwd", x, g, &[Arg::F32(lo), Arg::F32(hi)])
    }
    fn inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_inv_bwd", x, g, &[])
    }
    fn sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_sigmoid_bwd", y, g, &[])
    }
    fn tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_tanh_bwd", y, g, &[])
    }
    fn softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_softplus_bwd", x, g, &[])
    }
    fn safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer> {
        self.map2("tl_safe_log_bwd", x, g, &[Arg::F32(eps)])
    }

    fn add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_add", a, b, &[])
    }
    fn sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_sub", a, b, &[])
    }
    fn mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_mul", a, b, &[])
    }
    fn div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_div", a, b, &[])
    }
    fn max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_max", a, b, &[])
    }
    fn min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_min", a, b, &[])
    }
    fn axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer> {
        self.map2("tl_axpy", a, b, &[Arg::F32(c)])
    }

    fn axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()> {
        const OP: &str = "axpy_assign";
        let n = check::same_len(OP, y, x)?;
        let (py, px) = (self.ptr(OP, y)?, self.ptr(OP, x)?);
        driver::enter()?;
        self.grid_stride(
            OP,
            "tl_axpy_assign",
            n,
            &[Arg::Ptr(py), Arg::Ptr(px)],
            &[Arg::F32(c)],
        )
    }

    fn div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_div_bwd", a, b, g)
    }
    fn max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_max_bwd", a, b, g)
    }
    fn min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_min_bwd", a, b, g)
    }

    fn reduce_sum(&mut self, x: Buffer) -> Result<Buffer> {
        self.full_reduce("reduce_sum", x, false)
    }

    fn reduce_mean(&mut self, x: Buffer) -> Result<Buffer> {
        self.full_reduce("reduce_mean", x, true)
    }

    fn reduce_axis_sum(
        &mut self,
        x: Buffer,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<Buffer> {
        self.axis("reduce_axis_sum", x, outer, n, inner, false)
    }

    fn reduce_axis_mean(
        &mut self,
        x: Buffer,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<Buffer> {
        self.axis("reduce_axis_mean", x, outer, n, inner, true)
    }

    fn broadcast(&mut self, x: Buffer, from: &[usize], to: &[usize]) -> Result<Buffer> {
        const OP: &str = "broadcast";
        let plan = BroadcastPlan::new(OP, from, to)?;
        check::len_is(OP, "input", x, plan.from_len)?;
        self.gather(OP, x, &plan.to, &plan.src_strides, plan.to_len)
    }

    fn reduce_broadcast(&mut self, g: Buffer, from: &[usize], to: &[usize]) -> Result<Buffer> {
        const OP: &str = "reduce_broadcast";
        let plan = BroadcastPlan::new(OP, from, to)?;
        check::len_is(OP, "cotangent", g, plan.to_len)?;
        let pg = self.ptr(OP, g)?;
        let rank = to.len();
        let offset = rank - from.len();
        if determinism::deterministic_reductions() {
            // Kept axes (the output's), reduced axes (walked per output), cotangent strides.
            let kept = |k: usize| k >= offset && from[k - offset] != 1;
            let keep: Vec<usize> = (0..rank).map(|k| if kept(k) { to[k] } else { 1 }).collect();
            let red: Vec<usize> = (0..rank).map(|k| if kept(k) { 1 } else { to[k] }).collect();
            let n_red = check::product(OP, &red)?;
            let extra = [
                Arg::U32(rank as u32),
                Arg::Dims(dims8(&keep, 1)),
                Arg::Dims(dims8(&red, 1)),
                Arg::Dims(dims8(&check::strides(to), 0)),
                Arg::U64(n_red as u64),
            ];
            self.with_out(OP, plan.from_len, |d, out| {
                d.grid_stride(
                    OP,
                    "tl_reduce_broadcast",
                    plan.from_len,
                    &[Arg::Ptr(pg), Arg::Ptr(out)],
                    &extra,
                )
            })
        } else {
            let extra = [
                Arg::U32(rank as u32),
                Arg::Dims(dims8(&plan.to, 1)),
                Arg::Dims(dims8(&plan.src_strides, 0)),
            ];
            self.with_out(OP, plan.from_len, |d, out| {
                d.grid_stride(
                    OP,
                    "tl_full",
                    plan.from_len,
                    &[Arg::Ptr(out)],
                    &[Arg::F32(0.0)],
                )?;
                d.grid_stride(
                    OP,
                    "tl_reduce_broadcast_atomic",
                    plan.to_len,
                    &[Arg::Ptr(pg), Arg::Ptr(out)],
                    &extra,
                )
            })
        }
    }

    fn permute(&mut self, x: Buffer, dims: &[usize], perm: &[usize]) -> Result<Buffer> {
        const OP: &str = "permute";
        let plan = PermutePlan::new(OP, dims, perm)?;
        check::len_is(OP, "input", x, plan.len)?;
        self.gather(OP, x, &plan.out, &plan.src_strides, plan.len)
    }

    fn softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        self.rows("tl_softmax_rows", &[x], rows, cols)
    }

    fn log_softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        self.rows("tl_log_softmax_rows", &[x], rows, cols)
    }

    fn softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        self.rows("tl_softmax_rows_bwd", &[y, g], rows, cols)
    }

    fn log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        self.rows("tl_log_softmax_rows_bwd", &[y, g], rows, cols)
    }

    fn matmul(&mut self, a: Buffer, b: Buffer, g: Gemm) -> Result<Buffer> {
        self.gemm("matmul", a, b, 1, g)
    }

    fn bmm(&mut self, a: Buffer, b: Buffer, batch: usize, g: Gemm) -> Result<Buffer> {
        self.gemm("bmm", a, b, batch, g)
    }

    fn norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        self.norm_stats_impl(x, l, eps)
    }
    fn norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        self.norm_apply_impl(x, stats, gamma, beta, l)
    }
    fn norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        self.norm_bwd_x_impl(x, stats, gamma, g, l)
    }
    fn norm_bwd_affine(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)> {
        self.norm_bwd_affine_impl(x, stats, g, l)
    }
    fn masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        rows: usize,
        n: usize,
    ) -> Result<Buffer> {
        self.masked_softmax_rows_impl(x, mask, rows, n)
    }

    fn im2col(&mut self, x: Buffer, w: &Windows) -> Result<Buffer> {
        self.im2col_impl(x, w)
    }

    fn col2im(&mut self, cols: Buffer, w: &Windows) -> Result<Buffer> {
        self.col2im_impl(cols, w)
    }

    fn pool(&mut self, x: Buffer, w: &Windows, kind: PoolKind) -> Result<Buffer> {
        self.pool_impl(x, w, kind)
    }

    fn pool_bwd(&mut self, x: Buffer, g: Buffer, w: &Windows, kind: PoolKind) -> Result<Buffer> {
        self.pool_bwd_impl(x, g, w, kind)
    }

    fn gelu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_gelu", x, &[])
    }
    fn gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_gelu_bwd", x, g, &[])
    }
    fn silu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_silu", x, &[])
    }
    fn silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_silu_bwd", x, g, &[])
    }

    fn gather_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        idx: &[usize],
    ) -> Result<Buffer> {
        index::gather_rows(self, x, rows, cols, idx)
    }
    fn scatter_add_rows(
        &mut self,
        g: Buffer,
        rows: usize,
        cols: usize,
        idx: &[usize],
    ) -> Result<Buffer> {
        index::scatter_add_rows(self, g, rows, cols, idx)
    }
    fn copy_range(&mut self, x: Buffer, start: usize, len: usize) -> Result<Buffer> {
        index::copy_range(self, x, start, len)
    }
    fn place_range(&mut self, g: Buffer, len: usize, start: usize) -> Result<Buffer> {
        index::place_range(self, g, len, start)
    }
    fn concat(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        index::concat(self, a, b)
    }
    fn add_range(&mut self, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
        index::add_range(self, x, v, start)
    }
    fn cross_entropy_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: &[usize],
    ) -> Result<Buffer> {
        index::cross_entropy_rows(self, x, rows, cols, labels)
    }
    fn cross_entropy_rows_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: &[usize],
    ) -> Result<Buffer> {
        index::cross_entropy_rows_bwd(self, x, g, rows, cols, labels)
    }
}
