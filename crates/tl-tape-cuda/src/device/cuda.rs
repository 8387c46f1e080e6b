//! The real CUDA device (feature `cuda`): cust 0.3.2 over the driver API, kernels from
//! `kernels/*.cu` built to PTX by `cargo xtask kernels` and embedded with `include_str!`.
//!
//! - `driver`: the process-wide context (created once, never dropped) and modules, raw
//!   memory for the [`CachingAllocator`], copies, launches. All `unsafe` lives there, each
//!   block with a `// SAFETY:` comment.
//! - `launch`: how a primitive runs (allocate, launch, release on failure) and the shared
//!   launch shapes.
//! - [`nccl`]: NCCL (loaded at run time) over this device's buffers, for data-parallel
//!   training on GPUs; its FFI blocks also carry `// SAFETY:` comments.
//! - `prims`: the [`Launch`](super::Launch) impl, the work of each primitive; `index`: the
//!   [`LaunchIndex`](super::LaunchIndex) impl, the index primitives'.
//!
//! Every primitive's operands are checked once, by [`Device`]'s provided methods, for this
//! device as for [`SimDevice`](super::sim::SimDevice); `prims` only does the work, with the
//! same algorithm as the sim and, with
//! [`deterministic_reductions`](crate::determinism::deterministic_reductions) on, the same
//! reduction order. [`CudaDevice::new`] returns [`Error::NoDevice`] where the driver has no
//! device (or is the stub of `cargo xtask cuda-stub`).
//!
//! Runs on GPUs so far, and what they printed: docs/cuda.md.

#[cfg(all(feature = "cuda", feature = "cuda-emu"))]
compile_error!(
    "tl-tape-cuda: features `cuda` (the GPU through libcuda) and `cuda-emu` (the kernel \
     emulator) each select CudaDevice's driver; enable one of them"
);

mod arg;
mod conv;
#[cfg(not(feature = "cuda-emu"))]
mod driver;
#[cfg(feature = "cuda-emu")]
#[path = "cuda/emu.rs"]
mod driver;
#[cfg(feature = "cuda-emu")]
pub use driver::in_reverse_schedule;
mod flash;
mod index;
mod launch;
pub mod nccl;
mod norm;
mod optim;
mod prims;
mod user;

use std::collections::HashMap;

use super::{Batch, Buffer, Device, FlashProducts, FlashTiles, Gemm, GemmTiles, buffer};
use crate::alloc::{Allocation, CachingAllocator, Collected, MemoryUsage};
use crate::traffic::{Traffic, TrafficCounter};
use crate::{Error, Precision, Result, abi};
use driver::{Arg, DeviceMemory};
use launch::{blocks, dims8};
use smallvec::SmallVec;

/// The CUDA device: GPU 0 of the process-wide context, a caching allocator over its memory,
/// and the embedded kernels. PyTorch: `torch.device("cuda")` with its caching allocator.
#[derive(Debug)]
pub struct CudaDevice {
    pool: CachingAllocator<DeviceMemory>,
    live: HashMap<u64, Allocation<u64>>,
    funcs: HashMap<&'static str, usize>,
    /// This device's choice of reduction path; `None` follows the process-wide flag.
    deterministic: Option<bool>,
    /// Which tiling the matrix products take.
    gemm_tiles: GemmTiles,
    /// Which tiling the fused attention forward takes.
    flash_tiles: FlashTiles,
    /// How the fused attention's f32 core multiplies.
    flash_products: FlashProducts,
    /// Kernel launches and copies so far.
    traffic: TrafficCounter,
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
            deterministic: None,
            gemm_tiles: GemmTiles::Auto,
            flash_tiles: FlashTiles::Auto,
            flash_products: FlashProducts::Fma,
            traffic: TrafficCounter::default(),
        };
        // Resolve one kernel now, so a PTX the driver refuses fails here, not at first use.
        d.func("tl_full")?;
        Ok(d)
    }

    /// Set how many cached bytes a non-forced `collect` keeps.
    pub fn set_cache_limit(&mut self, bytes: usize) {
        self.pool.set_cache_limit(bytes);
    }

    /// Force this device's reductions onto the fixed-order path (`Some(true)`), the atomic
    /// path (`Some(false)`), or follow the process-wide flag
    /// ([`set_deterministic_reductions`](crate::determinism::set_deterministic_reductions),
    /// env `TL_DETERMINISTIC`; `None`, the default). PyTorch:
    /// `torch.use_deterministic_algorithms`, per device.
    pub fn set_deterministic(&mut self, on: Option<bool>) {
        self.deterministic = on;
    }

    /// Whether this device's reductions take the fixed-order path now.
    pub fn deterministic(&self) -> bool {
        self.deterministic
            .unwrap_or_else(crate::determinism::deterministic_reductions)
    }

    /// Which tiling this device's matrix products run ([`GemmTiles::Auto`] by default: the
    /// wide tiles for large products). The results are the same bits either way; forcing one
    /// is for tests and measurements. PyTorch has no such switch (cuBLAS picks its kernel).
    pub fn set_gemm_tiles(&mut self, tiles: GemmTiles) {
        self.gemm_tiles = tiles;
    }

    /// The tiling set by [`set_gemm_tiles`](Self::set_gemm_tiles).
    pub fn gemm_tiles(&self) -> GemmTiles {
        self.gemm_tiles
    }

    /// Which tilings this device's fused attention runs ([`FlashTiles::Auto`] by default).
    /// The same bits either way; the GPU bench times each (`attention-core/flash-narrow-d128`,
    /// `attention-core/flash-wide/n*`) beside the default so that the default follows the
    /// measurement.
    pub fn set_flash_tiles(&mut self, tiles: FlashTiles) {
        self.flash_tiles = tiles;
    }

    /// The tiling set by [`set_flash_tiles`](Self::set_flash_tiles).
    pub fn flash_tiles(&self) -> FlashTiles {
        self.flash_tiles
    }

    /// How the core of the fused attention nodes run on this device (`multiHeadAttention`,
    /// `scaledDotProductAttention` with `fused`) multiplies from now on
    /// ([`Device::flash_products`]): [`FlashProducts::Fma`] (the default) or
    /// [`FlashProducts::Tf32x3`], its products, forward and backward, on the tensor cores
    /// (`tl_flash_*_tc`): in f32 as three TF32 products each (the same function within f32
    /// tolerance, not the FMA kernels' bits), under autocast the rounded operands' exact
    /// products. PyTorch: its f32 `scaled_dot_product_attention` on sm80+ (the
    /// memory-efficient kernel, CUTLASS's 3xTF32).
    pub fn set_flash_products(&mut self, products: FlashProducts) {
        self.flash_products = products;
    }

    /// Number of live buffers.
    pub fn live_buffers(&self) -> usize {
        self.live.len()
    }

    /// `c ← c + op(a)·op(b)` (operands checked by `Device::matmul_acc`).
    pub(super) fn gemm_into(&mut self, c: Buffer, a: Buffer, b: Buffer, g: Gemm) -> Result<()> {
        const OP: &str = "matmul_acc";
        let pc = self.ptr(OP, c)?;
        self.gemm_launch(OP, a, b, pc, true, Batch::plain(1), g)
    }

    /// `tl_gemm` (`tl_gemm_wide` where [`GemmTiles::side`] says 128) writing (`into == false`)
    /// or adding into (`into == true`) the buffer at `out`,
    /// the `bt.count` products' matrices where `bt` says. A product with few output tiles is
    /// split along `k` ([`Gemm::k_chunk`]): `tl_gemm` writes each run's sums to a pool
    /// workspace (product-major), `tl_gemm_sum_splits` adds them into `out` (laid out as `bt`
    /// says). Under autocast ([`crate::precision::current`] `Bf16` / `Tf32`) the products run
    /// on the tensor cores instead: `tl_gemm_tc` (128×128 tiles, 256 threads, the same
    /// arguments plus the precision, the split counting its own tiles: [`super::split_tile`]),
    /// whatever the tiling setting.
    #[allow(clippy::too_many_arguments)]
    fn gemm_launch(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        out: u64,
        into: bool,
        bt: Batch,
        g: Gemm,
    ) -> Result<()> {
        let (pa, pb) = (self.ptr(op, a)?, self.ptr(op, b)?);
        let (batch, mn) = (bt.count, g.m * g.n);
        if batch * mn == 0 {
            return Ok(());
        }
        let current = crate::precision::current();
        let tile = super::split_tile(current);
        let (kc, splits) = (g.k_chunk_tiled(batch, tile), g.k_splits_tiled(batch, tile));
        let prec = match kernel_code(current) {
            0 => None,
            code => Some(code),
        };
        let (kernel, side, threads) = match prec {
            Some(_) => ("tl_gemm_tc", super::TC_TILE, 256),
            None => match self.gemm_tiles.side(g.m, g.n, batch * splits) {
                128 => ("tl_gemm_wide", 128, 256),
                side => ("tl_gemm", side, 256),
            },
        };
        let gy = g.m.div_ceil(side);
        if gy > 65_535 {
            return Err(Error::kernel(
                op,
                format!("m = {} exceeds the grid limit 65535·{side}", g.m),
            ));
        }
        let gx = abi::to_u32(op, "grid", g.n.div_ceil(side))?;
        // Checked by `check::batch` (u32) and `check::gemm_lens` (each dim u32, the result's
        // length too).
        let (heads, kv_heads) = (Arg::U32(bt.heads as u32), Arg::U32(bt.kv_heads as u32));
        let product = |out: u64, into: bool, merged: u32| {
            let mut args: SmallVec<[Arg; 15]> = smallvec::smallvec![
                Arg::Ptr(pa),
                Arg::Ptr(pb),
                Arg::Ptr(out),
                Arg::U32(batch as u32),
                Arg::U32(g.m as u32),
                Arg::U32(g.k as u32),
                Arg::U32(g.n as u32),
                Arg::U32(u32::from(g.ta)),
                Arg::U32(u32::from(g.tb)),
                Arg::U32(u32::from(into)),
                Arg::U32(kc as u32), // at most max(k, 1)
                heads,
                Arg::U32(merged),
                kv_heads,
            ];
            args.extend(prec.map(Arg::U32));
            args
        };
        let grid = |jobs: usize| [gx, gy as u32, jobs.min(65_535) as u32];
        let merged = bt.merged_bits();
        if splits == 1 {
            let args = product(out, into, merged);
            return self.run_blocks_of(op, kernel, grid(batch), threads, &args);
        }
        self.with_split_runs(op, out, into, bt, g, splits, |d, part| {
            // The runs' sums product-major in the workspace: the result's flag cleared.
            let runs = product(part, false, merged & !0b100);
            d.run_blocks_of(op, kernel, grid(batch * splits), threads, &runs)
        })
    }

    /// A product split along `k` into `splits` runs ([`Gemm::k_splits_tiled`]): `runs(d, part)`
    /// writes each run's `(m, n)` sums product-major into a pool workspace at `part`
    /// (`bt.count · splits` matrices), then `tl_gemm_sum_splits` adds them in increasing order into `out` (`=`, or
    /// `+=` with `into`; laid out as `bt` says), and the workspace is released. The second half
    /// of [`gemm_launch`](Self::gemm_launch) and of the implicit-GEMM conv's weight cotangent.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn with_split_runs(
        &mut self,
        op: &'static str,
        out: u64,
        into: bool,
        bt: Batch,
        g: Gemm,
        splits: usize,
        runs: impl FnOnce(&mut Self, u64) -> Result<()>,
    ) -> Result<()> {
        let (batch, mn) = (bt.count, g.m * g.n);
        self.with_workspace(op, batch * splits * mn, |d, part| {
            runs(d, part)?;
            let total = batch * mn;
            // Checked by the callers (`check::batch`, `check::gemm_lens`, `Windows::check`):
            // every count is a u32.
            let sum = [
                Arg::Ptr(part),
                Arg::Ptr(out),
                Arg::U64(total as u64),
                Arg::U64(mn as u64),
                Arg::U32(splits as u32),
                Arg::U32(u32::from(into)),
                Arg::U32(g.n as u32),
                Arg::U32(bt.heads as u32),
                Arg::U32(u32::from(bt.merged[2])),
            ];
            d.run(op, "tl_gemm_sum_splits", [blocks(total), 1, 1], &sum)
        })
    }

    /// A row kernel `kernel(ins..., out, rows, cols, extra...)`, one block per row, with an
    /// output as long as the first operand.
    fn rows(
        &mut self,
        kernel: &'static str,
        ins: &[Buffer],
        rows: usize,
        cols: usize,
        extra: &[Arg],
    ) -> Result<Buffer> {
        self.rows_to(kernel, ins, ins[0].len(), rows, cols, extra)
    }

    /// [`rows`](Self::rows) with an output of `n` elements.
    fn rows_to(
        &mut self,
        kernel: &'static str,
        ins: &[Buffer],
        n: usize,
        rows: usize,
        cols: usize,
        extra: &[Arg],
    ) -> Result<Buffer> {
        let op = &kernel[3..];
        let mut args = ins
            .iter()
            .map(|&b| self.ptr(op, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        self.with_out(op, n, |d, out| {
            if n == 0 {
                return Ok(());
            }
            args.extend([Arg::Ptr(out), Arg::U32(rows as u32), Arg::U32(cols as u32)]);
            args.extend_from_slice(extra);
            d.run(op, kernel, [rows.min(65_535) as u32, 1, 1], &args)
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
        driver::NAME
    }
    fn flash_products(&self) -> FlashProducts {
        self.flash_products
    }
    fn user_kernels(&mut self) -> Option<&mut dyn crate::user::KernelDevice> {
        Some(self)
    }
    fn upload(&mut self, data: &[f32]) -> Result<Buffer> {
        self.with_out("upload", data.len(), |d, out| {
            d.traffic.upload(data.len());
            driver::copy_to_device(out, data)
        })
    }
    fn download(&self, b: Buffer) -> Result<Vec<f32>> {
        let p = self.ptr("download", b)?;
        driver::enter()?;
        self.traffic.download(b.len());
        driver::copy_to_host(p, b.len())
    }
    fn traffic(&self) -> Traffic {
        self.traffic.get()
    }
    fn size(&self, b: Buffer) -> Result<usize> {
        self.ptr("size", b).map(|_| b.len())
    }
    fn is_live(&self, b: Buffer) -> bool {
        self.live.contains_key(&b.id())
    }
    fn full(&mut self, n: usize, v: f32) -> Result<Buffer> {
        self.with_out("full", n, |d, out| {
            d.grid_stride("full", "tl_full", n, &[Arg::Ptr(out)], &[Arg::F32(v)])
        })
    }
    fn release(&mut self, b: Buffer) -> bool {
        buffer::release_live(&mut self.pool, &mut self.live, b)
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
    fn round_to(&mut self, x: Buffer, p: Precision) -> Result<Buffer> {
        self.map1("tl_round", x, &[Arg::U32(kernel_code(p))])
    }
    fn reduce_sum(&mut self, x: Buffer) -> Result<Buffer> {
        self.full_reduce("reduce_sum", x, false)
    }
    fn reduce_mean(&mut self, x: Buffer) -> Result<Buffer> {
        self.full_reduce("reduce_mean", x, true)
    }
    fn gelu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_gelu", x, &[])
    }
    fn silu(&mut self, x: Buffer) -> Result<Buffer> {
        self.map1("tl_silu", x, &[])
    }
    fn point_act(&mut self, x: Buffer, act: super::PointAct) -> Result<Buffer> {
        let (kernel, _, param) = act.kernels();
        match param {
            Some(p) => self.map1(kernel, x, &[Arg::F32(p)]),
            None => self.map1(kernel, x, &[]),
        }
    }
}

/// The kernels' code of `p` (`prec` of `tl_gemm_tc` and `tl_round`): 0 f32, 1 bf16, 2 TF32.
fn kernel_code(p: Precision) -> u32 {
    match p {
        Precision::F32 => 0,
        Precision::Bf16 => 1,
        Precision::Tf32 => 2,
    }
}

#[cfg(all(test, feature = "cuda-emu"))]
mod tests {
    //! The per-device reduction switch, on the kernel emulator.
    use super::*;
    use crate::SimDevice;

    /// The bits of `x` (4096 values) summed into one by the broadcast backward.
    fn sum(d: &mut impl Device, x: &[f32]) -> u32 {
        let b = d.upload(x).unwrap();
        let s = d.reduce_broadcast(b, &[1], &[x.len()]).unwrap();
        d.download(s).unwrap()[0].to_bits()
    }

    #[test]
    fn set_deterministic_overrides_the_process_flag_for_this_device() {
        // Values whose sum depends on the order of the additions.
        let x: Vec<f32> = (0..4096u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) as f32 / 65_536.0 - 128.0) * 1e-3)
            .collect();
        let reference = sum(&mut SimDevice::new(), &x);
        let mut d = CudaDevice::new().unwrap();
        assert_eq!(
            d.deterministic(),
            crate::determinism::deterministic_reductions()
        );
        // Threads in reverse order: the atomic kernel adds in another order, the fixed-order
        // one does not care.
        driver::set_reverse_schedule(true);
        d.set_deterministic(Some(true));
        assert!(d.deterministic());
        let fixed = sum(&mut d, &x);
        d.set_deterministic(Some(false));
        assert!(!d.deterministic());
        let atomic = sum(&mut d, &x);
        driver::set_reverse_schedule(false);
        assert_eq!(
            fixed, reference,
            "fixed order: the sim's bits, whatever the flag"
        );
        let (a, r) = (f32::from_bits(atomic), f32::from_bits(reference));
        assert!((a - r).abs() <= 1e-4 * r.abs().max(1.0), "{a} vs {r}");
        assert_ne!(atomic, reference, "the atomic kernel did not run");
    }
}
