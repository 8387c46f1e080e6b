//! The simulation device: host `f32` buffers, every primitive written as the twin of its CUDA
//! kernel (same per-element body, same reduction order as the deterministic kernels), allocating
//! through the real [`CachingAllocator`] so telemetry means the same thing as on a GPU.
//!
//! - [`pointwise`]: per-element bodies of the pointwise kernels.
//! - [`reduce`]: the reduction order (fixed grid, two passes, warp-shuffle tree), documented there.
//! - [`rows`]: the softmax row kernels. [`linalg`]: the matmul kernel's arithmetic.
//! - [`norm`]: layer/batch norm statistics, affine map and backward; the masked row softmax.
//! - [`flash`]: the fused attention core, forward and backward, in the kernels' tile order.
//! - [`activation`]: per-element bodies of GELU and SiLU; `index`: gathers, the fixed-order
//!   scatter-add, range copies and the cross-entropy rows (the [`LaunchIndex`](super::LaunchIndex)
//!   impl).
//! - `launch`: how a primitive runs on the host; `prims`: the [`Launch`](super::Launch) impl,
//!   the work of each primitive whose operands [`Device`]'s provided methods have checked.
//!
//! Sim always runs the fixed-order path, whatever [`crate::determinism`] says; the flag exists
//! for the CUDA device's atomic fast paths.

pub mod activation;
pub mod conv;
pub mod flash;
mod index;
mod launch;
pub mod linalg;
pub mod norm;
pub mod point_act;
pub mod pointwise;
mod prims;
pub mod reduce;
pub mod rows;

use std::collections::HashMap;

use super::{Buffer, Device, FlashProducts, buffer};
use crate::alloc::{Allocation, CachingAllocator, Collected, HostMemory, MemoryUsage};
use crate::traffic::{Traffic, TrafficCounter};
use crate::{Result, rng};
use launch::view;

/// The host simulation of a CUDA device. PyTorch has no equivalent; think of it as a CPU
/// backend that keeps the GPU's memory model (explicit release, caching pool) and arithmetic.
#[derive(Debug)]
pub struct SimDevice {
    pool: CachingAllocator<HostMemory>,
    live: HashMap<u64, Allocation<Vec<f32>>>,
    traffic: TrafficCounter,
    /// How the fused attention's core multiplies ([`SimDevice::set_flash_products`]).
    flash_products: FlashProducts,
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
            traffic: TrafficCounter::default(),
            flash_products: FlashProducts::Fma,
        }
    }

    /// How the core of the fused attention nodes run on this device (`multiHeadAttention`,
    /// `scaledDotProductAttention` with `fused`) multiplies from now on
    /// ([`Device::flash_products`]): [`FlashProducts::Fma`] (the default) or
    /// [`FlashProducts::Tf32x3`], its products, forward and backward, on the tensor cores: in
    /// f32 as three TF32 products each (the same function within f32 tolerance, not the FMA
    /// kernels' bits), under autocast the rounded operands' exact products. PyTorch: its f32
    /// `scaled_dot_product_attention` on sm80+ (the memory-efficient kernel, CUTLASS's
    /// 3xTF32).
    pub fn set_flash_products(&mut self, products: FlashProducts) {
        self.flash_products = products;
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
    fn flash_products(&self) -> FlashProducts {
        self.flash_products
    }
    fn upload(&mut self, data: &[f32]) -> Result<Buffer> {
        let b = self.run_body("upload", [], data.len(), |[], out| {
            out.copy_from_slice(data)
        })?;
        self.traffic.upload(data.len());
        Ok(b)
    }
    fn download(&self, b: Buffer) -> Result<Vec<f32>> {
        let v = view(&self.live, "download", b)?.to_vec();
        self.traffic.download(v.len());
        Ok(v)
    }
    fn traffic(&self) -> Traffic {
        self.traffic.get()
    }
    fn size(&self, b: Buffer) -> Result<usize> {
        view(&self.live, "size", b).map(<[f32]>::len)
    }
    fn is_live(&self, b: Buffer) -> bool {
        self.live.contains_key(&b.id())
    }
    fn full(&mut self, n: usize, v: f32) -> Result<Buffer> {
        self.launch("full", [], n, |[], out| out.fill(v))
    }
    fn release(&mut self, b: Buffer) -> bool {
        buffer::release_live(&mut self.pool, &mut self.live, b)
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
    fn round_to(&mut self, x: Buffer, p: crate::precision::Precision) -> Result<Buffer> {
        self.map1("round", x, |v| p.round(v))
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
    fn gelu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("gelu", x, activation::gelu)
    }
    fn silu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("silu", x, activation::silu)
    }
    fn point_act(&mut self, x: Buffer, act: super::PointAct) -> Result<Buffer> {
        self.map1(act.kernels().0, x, |v| point_act::forward(act, v))
    }
}
