//! The simulation device: host `f32` buffers, every primitive written as the twin of its CUDA
//! kernel (same per-element body, same reduction order as the deterministic kernels), allocating
//! through the real [`CachingAllocator`] so telemetry means the same thing as on a GPU.
//!
//! - [`pointwise`]: per-element bodies of the pointwise kernels.
//! - [`reduce`]: the reduction order (fixed grid, two passes, warp-shuffle tree), documented there.
//! - [`rows`]: the softmax row kernels. [`linalg`]: the matmul kernel's arithmetic.
//! - [`norm`]: layer/batch norm statistics, affine map and backward; the masked row softmax.
//! - [`activation`]: per-element bodies of GELU and SiLU; `index`: gathers, the fixed-order
//!   scatter-add, range copies and the cross-entropy rows.
//!
//! Sim always runs the fixed-order path, whatever [`crate::determinism`] says; the flag exists
//! for the CUDA device's atomic fast paths.

pub mod activation;
pub mod conv;
mod index;
mod launch;
pub mod linalg;
pub mod norm;
pub mod pointwise;
pub mod reduce;
pub mod rows;

use std::collections::HashMap;

use super::check::{self, BroadcastPlan, PermutePlan};
use super::{Buffer, Device, Gemm, NormLayout, PoolKind, Windows, norm as layout};
use crate::alloc::{Allocation, CachingAllocator, Collected, HostMemory, MemoryUsage};
use crate::{Error, Result, rng};
use launch::view;

/// The host simulation of a CUDA device. PyTorch has no equivalent; think of it as a CPU
/// backend that keeps the GPU's memory model (explicit release, caching pool) and arithmetic.
#[derive(Debug)]
pub struct SimDevice {
    pool: CachingAllocator<HostMemory>,
    live: HashMap<u64, Allocation<Vec<f32>>>,
}

impl Default for SimDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl SimDevice {
    /// A device with unlimited (host) memory.
    pub fn new() -> Self {
        Self::with_memory(HostMemory::new())
    }

    /// A device that refuses to hold more than `bytes` (size classes, live and cached).
    pub fn with_memory_limit(bytes: usize) -> Self {
        Self::with_memory(HostMemory::with_limit(bytes))
    }

    fn with_memory(mem: HostMemory) -> Self {
        SimDevice {
            pool: CachingAllocator::new(mem),
            live: HashMap::new(),
        }
    }

    /// The allocator (its counters, its raw memory).
    pub fn allocator(&self) -> &CachingAllocator<HostMemory> {
        &self.pool
    }

    /// Set how many cached bytes a non-forced `collect` keeps.
    pub fn set_cache_limit(&mut self, bytes: usize) {
        self.pool.set_cache_limit(bytes);
    }

    /// Number of live buffers.
    pub fn live_buffers(&self) -> usize {
        self.live.len()
    }
}

impl Device for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn upload(&mut self, data: &[f32]) -> Result<Buffer> {
        self.launch("upload", [], data.len(), |[], out| {
            out.copy_from_slice(data)
        })
    }

    fn download(&self, b: Buffer) -> Result<Vec<f32>> {
        Ok(view(&self.live, "download", b)?.to_vec())
    }

    fn size(&self, b: Buffer) -> Result<usize> {
        view(&self.live, "size", b).map(<[f32]>::len)
    }

    fn is_live(&self, b: Buffer) -> bool {
        self.live.contains_key(&b.id())
    }

    fn zeros(&mut self, n: usize) -> Result<Buffer> {
        self.full(n, 0.0)
    }

    fn full(&mut self, n: usize, v: f32) -> Result<Buffer> {
        self.launch("full", [], n, |[], out| out.fill(v))
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
        self.pool.collect(force)
    }

    fn rand_uniform(&mut self, n: usize, key: u64) -> Result<Buffer> {
        self.launch("rand_uniform", [], n, |[], out| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = rng::uniform(key, i as u64);
            }
        })
    }

    fn bernoulli_mask(&mut self, n: usize, key: u64, keep_prob: f64) -> Result<Buffer> {
        self.launch("bernoulli_mask", [], n, |[], out| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = rng::keep(key, i as u64, keep_prob);
            }
        })
    }

    fn abs(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("abs", x, pointwise::abs)
    }
    fn sqrt(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("sqrt", x, pointwise::sqrt)
    }
    fn exp(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("exp", x, pointwise::exp)
    }
    fn log(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("log", x, pointwise::log)
    }
    fn inv(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("inv", x, pointwise::inv)
    }
    fn relu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("relu", x, pointwise::relu)
    }
    fn sigmoid(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("sigmoid", x, pointwise::sigmoid)
    }
    fn tanh(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tanh", x, pointwise::tanh)
    }
    fn softplus(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("softplus", x, pointwise::softplus)
    }
    fn safe_log(&mut self, x: Buffer, eps: f32) -> Result<Buffer> {
        self.map1("safe_log", x, |v| pointwise::safe_log(v, eps))
    }
    fn clamp(&mut self, x: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map1("clamp", x, |v| pointwise::clamp(v, lo, hi))
    }
    fn scale(&mut self, x: Buffer, c: f32) -> Result<Buffer> {
        self.map1("scale", x, |v| c * v)
    }

    fn abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("abs_bwd", x, g, pointwise::abs_bwd)
    }
    fn sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("sqrt_bwd", x, g, pointwise::sqrt_bwd)
    }
    fn relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("relu_bwd", x, g, pointwise::relu_bwd)
    }
    fn clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map2("clamp_bwd", x, g, |x, g| pointwise::clamp_bwd(x, g, lo, hi))
    }
    fn inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("inv_bwd", x, g, pointwise::inv_bwd)
    }
    fn sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("sigmoid_bwd", y, g, pointwise::sigmoid_bwd)
    }
    fn tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tanh_bwd", y, g, pointwise::tanh_bwd)
    }
    fn softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("softplus_bwd", x, g, pointwise::softplus_bwd)
    }
    fn safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer> {
        self.map2("safe_log_bwd", x, g, |x, g| {
            pointwise::safe_log_bwd(x, g, eps)
        })
    }

    fn add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("add", a, b, |a, b| a + b)
    }
    fn sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("sub", a, b, |a, b| a - b)
    }
    fn mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("mul", a, b, |a, b| a * b)
    }
    fn div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("div", a, b, |a, b| a / b)
    }
    fn max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("max", a, b, pointwise::max)
    }
    fn min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("min", a, b, pointwise::min)
    }
    fn axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer> {
        self.map2("axpy", a, b, |a, b| pointwise::axpy(a, b, c))
    }

    fn axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()> {
        const OP: &str = "axpy_assign";
        let n = check::same_len(OP, y, x)?;
        let xs = view(&self.live, OP, x)?.to_vec();
        let ys = self.live.get_mut(&y.id()).ok_or(Error::Released {
            op: OP,
            buffer: y.id(),
            len: y.len(),
        })?;
        for (o, &v) in ys.block[..n].iter_mut().zip(&xs) {
            *o = pointwise::axpy(*o, v, c);
        }
        Ok(())
    }

    fn div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("div_bwd", a, b, g, pointwise::div_bwd)
    }
    fn max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("max_bwd", a, b, g, pointwise::max_bwd)
    }
    fn min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("min_bwd", a, b, g, pointwise::min_bwd)
    }

    fn reduce_sum(&mut self, x: Buffer) -> Result<Buffer> {
        self.launch("reduce_sum", [x], 1, |[x], out| {
            out[0] = reduce::grid_sum(x)
        })
    }

    fn reduce_mean(&mut self, x: Buffer) -> Result<Buffer> {
        self.launch("reduce_mean", [x], 1, |[x], out| {
            out[0] = reduce::grid_sum(x) / x.len() as f32;
        })
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
        let src = plan.source_indices();
        self.launch(OP, [x], plan.to_len, |[x], out| {
            for (o, &i) in out.iter_mut().zip(&src) {
                *o = x[i];
            }
        })
    }

    fn reduce_broadcast(&mut self, g: Buffer, from: &[usize], to: &[usize]) -> Result<Buffer> {
        const OP: &str = "reduce_broadcast";
        let plan = BroadcastPlan::new(OP, from, to)?;
        check::len_is(OP, "cotangent", g, plan.to_len)?;
        let src = plan.source_indices();
        self.launch(OP, [g], plan.from_len, |[g], out| {
            // Per output element: its preimage in increasing row-major order of `g`, from 0.
            out.fill(0.0);
            for (&i, &v) in src.iter().zip(g) {
                out[i] += v;
            }
        })
    }

    fn permute(&mut self, x: Buffer, dims: &[usize], perm: &[usize]) -> Result<Buffer> {
        const OP: &str = "permute";
        let plan = PermutePlan::new(OP, dims, perm)?;
        check::len_is(OP, "input", x, plan.len)?;
        let src = plan.source_indices();
        self.launch(OP, [x], plan.len, |[x], out| {
            for (o, &i) in out.iter_mut().zip(&src) {
                *o = x[i];
            }
        })
    }

    fn softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        check::rows_cols("softmax_rows", x, rows, cols)?;
        self.launch("softmax_rows", [x], x.len(), |[x], out| {
            rows::softmax(x, cols.max(1), out)
        })
    }

    fn log_softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        check::rows_cols("log_softmax_rows", x, rows, cols)?;
        self.launch("log_softmax_rows", [x], x.len(), |[x], out| {
            rows::log_softmax(x, cols.max(1), out)
        })
    }

    fn softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        check::rows_cols("softmax_rows_bwd", y, rows, cols)?;
        check::same_len("softmax_rows_bwd", y, g)?;
        self.launch("softmax_rows_bwd", [y, g], y.len(), |[y, g], out| {
            rows::softmax_bwd(y, g, cols.max(1), out)
        })
    }

    fn log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        check::rows_cols("log_softmax_rows_bwd", y, rows, cols)?;
        check::same_len("log_softmax_rows_bwd", y, g)?;
        self.launch("log_softmax_rows_bwd", [y, g], y.len(), |[y, g], out| {
            rows::log_softmax_bwd(y, g, cols.max(1), out)
        })
    }

    fn matmul(&mut self, a: Buffer, b: Buffer, g: Gemm) -> Result<Buffer> {
        self.bmm_named("matmul", a, b, 1, g)
    }

    fn bmm(&mut self, a: Buffer, b: Buffer, batch: usize, g: Gemm) -> Result<Buffer> {
        self.bmm_named("bmm", a, b, batch, g)
    }

    fn norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        l.check_x("norm_stats", x)?;
        self.launch("norm_stats", [x], 2 * l.groups, |[x], out| {
            norm::stats(x, l, eps, out)
        })
    }

    fn norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_apply";
        let n = l.check_x(OP, x)?;
        l.check_stats(OP, stats)?;
        l.check_affine(OP, "gamma", gamma)?;
        l.check_affine(OP, "beta", beta)?;
        self.launch(OP, [x, stats, gamma, beta], n, |[x, st, ga, be], y| {
            norm::apply(x, st, ga, be, l, y)
        })
    }

    fn norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_bwd_x";
        let n = l.check_x(OP, x)?;
        l.check_stats(OP, stats)?;
        l.check_affine(OP, "gamma", gamma)?;
        check::same_len(OP, x, g)?;
        self.launch(OP, [x, stats, gamma, g], n, |[x, st, ga, g], dx| {
            norm::bwd_x(x, st, ga, g, l, dx)
        })
    }

    fn norm_bwd_affine(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_bwd_affine";
        l.check_x(OP, x)?;
        l.check_stats(OP, stats)?;
        check::same_len(OP, x, g)?;
        self.launch2(OP, [x, stats, g], l.features(), |[x, st, g], dg, db| {
            norm::bwd_affine(x, st, g, l, dg, db)
        })
    }

    fn masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        rows: usize,
        n: usize,
    ) -> Result<Buffer> {
        const OP: &str = "masked_softmax_rows";
        layout::check_masked(OP, x, mask, rows, n)?;
        self.launch(OP, [x], x.len(), |[x], out| {
            norm::masked_softmax(x, mask, n.max(1), out)
        })
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
        self.map1("gelu", x, activation::gelu)
    }
    fn gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("gelu_bwd", x, g, activation::gelu_bwd)
    }
    fn silu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("silu", x, activation::silu)
    }
    fn silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("silu_bwd", x, g, activation::silu_bwd)
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
