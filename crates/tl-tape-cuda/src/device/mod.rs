//! The device layer: one trait, [`Device`], with one method per buffer primitive of TorchLean's CUDA buffer
//! layer, and its implementations.
//!
//! - [`sim::SimDevice`] (always built): host `f32`, every primitive written as the twin of its
//!   CUDA kernel — same algorithm, same reduction order as the deterministic kernels — so all
//!   tape logic runs, and is tested, on machines without a GPU.
//! - `cuda::CudaDevice` (feature `cuda`): cust, kernels from `kernels/*.cu` (PTX embedded).
//!
//! Buffers are float32, contiguous, row-major, and addressed by [`Buffer`] handles. A handle is
//! plain data (`Copy`); the allocation behind it lives until it is released explicitly
//! ([`Device::release`], idempotent), like a device pointer whose finalizer may run twice. Using
//! a released handle is an [`Error::Released`](crate::Error::Released), never undefined
//! behaviour. Every primitive returns fresh buffers except [`Device::axpy_assign`],
//! [`Device::axpy_assign_list`] and the optimizer steps ([`Device::adam_update`],
//! [`Device::momentum_update`] and their list forms), which update their operands in place
//! (optimizer steps, gradient accumulation).
//!
//! Every launch checks its element counts and dims against the `u32` kernel ABI
//! ([`crate::abi`]) and its operands' lengths ([`check`]) before touching memory. The operand
//! checks are written once, here: a primitive with operands to check is a provided [`Device`]
//! method that checks them and calls its `launch_<name>` method of [`Launch`], which each
//! implementation writes and which only does the work.

pub mod bias;
mod buffer;
pub mod check;
pub mod flash;
mod flash_round;
pub mod index_check;
pub mod launch;
pub mod norm;
pub mod optim;
pub mod point_act;
pub mod sim;
pub mod window;

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[allow(unsafe_code)]
pub mod cuda;

use crate::alloc::{Collected, MemoryUsage};
use crate::precision::Precision;
use crate::traffic::Traffic;
use crate::{Result, abi};
pub use bias::{Act, BiasLayout};
pub use buffer::{
    Batch, Buffer, FlashTiles, GEMM_TILE, Gemm, GemmTiles, SPLIT_K_MAX, SPLIT_K_MIN_CHUNK,
    SPLIT_K_TILES, TC_TILE, WIDE_MIN_TILES, split_tile,
};
use check::{BroadcastPlan, PermutePlan};
pub use flash::{
    FLASH_BITS, FLASH_CAUSAL, FLASH_KEEP, FLASH_MAX_HEAD, FLASH_ONE_PASS_MAX_HEAD,
    FLASH_TC_MAX_HEAD, FLASH_TILE, Flash, FlashDims, FlashLens, FlashMask, FlashProducts,
};
pub use launch::{Launch, LaunchIndex};
pub use norm::{MaskedRows, NormLayout};
pub use optim::{AdamSlot, AdamUpdate, MomentumSlot, MomentumUpdate, OPTIM_LIST_MAX};
pub use point_act::PointAct;
pub use window::{PoolKind, WindowLens, Windows};

/// The highest rank `permute`, `broadcast` and `reduce_broadcast` accept (the kernels pass dims
/// and strides in fixed arrays of this length).
pub const MAX_RANK: usize = 8;

/// The pairs one [`Device::axpy_assign_list`] launch takes (the kernel's parameter slots).
pub const AXPY_LIST_MAX: usize = 8;

/// One method per buffer primitive (TorchLean's CUDA buffer layer, first op set).
///
/// Kernel parameters that come from the host (`c`, `lo`, `hi`, `eps`) are `f32`, as the kernels
/// receive them. Lengths of operands must agree as each method says; a mismatch is an
/// [`Error::Kernel`](crate::Error::Kernel) naming the primitive and the lengths.
///
/// The methods that check operands are provided: they check, once for every implementation,
/// and call their `launch_<name>` method of [`Launch`], which an implementation writes instead.
pub trait Device: Launch {
    /// A short name of the implementation (`"sim"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// This device as one that launches the user's own kernels (`CudaDevice`, on a GPU or on
    /// the kernel emulator), or `None` (the default; the simulation device): a user op whose
    /// implementation launches kernels runs its sim twin there ([`crate::user`]).
    fn user_kernels(&mut self) -> Option<&mut dyn crate::user::KernelDevice> {
        None
    }

    /// How the core of the fused attention nodes on this device multiplies
    /// ([`FlashProducts`]; `SimDevice::set_flash_products`, and `CudaDevice`'s under features
    /// `cuda`, `cuda-emu`): the attention ops build their [`Flash`] with it where it applies
    /// (heads up to [`FLASH_TC_MAX_HEAD`], f32 or autocast; elsewhere [`FlashProducts::Fma`]).
    /// [`FlashProducts::Fma`] unless the device says otherwise (the default: a device without
    /// tensor-core kernels).
    fn flash_products(&self) -> FlashProducts {
        FlashProducts::Fma
    }

    // ---- memory ------------------------------------------------------------------------------

    /// Copy host elements into a fresh buffer. PyTorch: `torch.tensor(data, device="cuda")`.
    fn upload(&mut self, data: &[f32]) -> Result<Buffer>;

    /// [`upload`](Self::upload) with a token (TorchLean's `ofFloatArrayIO`). In Rust every upload
    /// is already a distinct allocation; the token is accepted for parity and ignored.
    fn upload_with_token(&mut self, data: &[f32], token: u64) -> Result<Buffer> {
        let _ = token;
        self.upload(data)
    }

    /// Copy a buffer back to the host. PyTorch: `t.cpu()`.
    fn download(&self, b: Buffer) -> Result<Vec<f32>>;

    /// The element count of a live buffer.
    fn size(&self, b: Buffer) -> Result<usize>;

    /// Whether `b` names a live allocation of this device.
    fn is_live(&self, b: Buffer) -> bool;

    /// A buffer of `n` zeros. PyTorch: `torch.zeros(n)`.
    fn zeros(&mut self, n: usize) -> Result<Buffer> {
        self.full(n, 0.0)
    }

    /// A buffer of `n` copies of `v`. PyTorch: `torch.full((n,), v)`.
    fn full(&mut self, n: usize, v: f32) -> Result<Buffer>;

    /// Release the allocation behind `b` to the allocator. Idempotent: returns whether a live
    /// allocation was freed (`false` the second time, or for a handle of another device).
    fn release(&mut self, b: Buffer) -> bool;

    /// Release `workspace` and return `keep` (TorchLean's `release_then`).
    fn release_then<K>(&mut self, workspace: Buffer, keep: K) -> K
    where
        Self: Sized,
    {
        self.release(workspace);
        keep
    }

    /// Release every buffer of `bufs`; returns how many live allocations were freed.
    fn release_all<I: IntoIterator<Item = Buffer>>(&mut self, bufs: I) -> usize
    where
        Self: Sized,
    {
        bufs.into_iter().filter(|&b| self.release(b)).count()
    }

    /// The allocator's counters.
    fn memory_usage(&self) -> MemoryUsage;

    /// Kernel launches and host↔device copies since the device was made ([`Traffic`]).
    fn traffic(&self) -> Traffic;

    /// Return cached blocks to the device (all of them when `force`). Live buffers are untouched.
    fn collect(&mut self, force: bool) -> Collected;

    // ---- randomness (SEMANTICS.md, "Randomness") ----------------------------------------------

    /// `n` uniform values in `[0, 1)`, element `i` from `splitmix64(key + i)` ([`crate::rng`]).
    fn rand_uniform(&mut self, n: usize, key: u64) -> Result<Buffer>;

    /// `n` mask values: 1 where `keep_prob > u_i / 2³²`, else 0 ([`crate::rng::keep`]).
    fn bernoulli_mask(&mut self, n: usize, key: u64, keep_prob: f64) -> Result<Buffer>;

    // ---- pointwise, unary (forward) -----------------------------------------------------------

    /// `|x|`.
    fn abs(&mut self, x: Buffer) -> Result<Buffer>;
    /// `sqrt(max(x, 0))`.
    fn sqrt(&mut self, x: Buffer) -> Result<Buffer>;
    /// `exp x`.
    fn exp(&mut self, x: Buffer) -> Result<Buffer>;
    /// `ln x`, IEEE (`ln 0 = −∞`, `ln x = NaN` for x < 0: no domain error on the device).
    fn log(&mut self, x: Buffer) -> Result<Buffer>;
    /// `1/x`.
    fn inv(&mut self, x: Buffer) -> Result<Buffer>;
    /// `max(x, 0)`.
    fn relu(&mut self, x: Buffer) -> Result<Buffer>;
    /// `1/(1+exp(−x))`, stable for either sign.
    fn sigmoid(&mut self, x: Buffer) -> Result<Buffer>;
    /// `tanh x`; ±1 (never NaN) for large |x|.
    fn tanh(&mut self, x: Buffer) -> Result<Buffer>;
    /// `max(x,0) + log1p(exp(−|x|))`.
    fn softplus(&mut self, x: Buffer) -> Result<Buffer>;
    /// `log(softplus(x) + eps)`.
    fn safe_log(&mut self, x: Buffer, eps: f32) -> Result<Buffer>;
    /// `min(hi, max(lo, x))`.
    fn clamp(&mut self, x: Buffer, lo: f32, hi: f32) -> Result<Buffer>;
    /// `c · x`.
    fn scale(&mut self, x: Buffer, c: f32) -> Result<Buffer>;
    /// `x` as a product under `p` reads it ([`Precision::round`]: each element rounded to bf16,
    /// nearest, ties to even, or to TF32, nearest, ties away; unchanged for `F32`), a fresh
    /// buffer. PyTorch: `x.to(torch.bfloat16).float()`.
    fn round_to(&mut self, x: Buffer, p: Precision) -> Result<Buffer>;
    /// A device-to-device copy (a scale-by-one launch, as in TorchLean: bit-exact).
    fn copy(&mut self, x: Buffer) -> Result<Buffer> {
        self.scale(x, 1.0)
    }

    // ---- pointwise, unary (backward: `x` or `y` the forward input/output, `g` the cotangent) --

    /// `sign(x) · g`, sign(0) = 0.
    fn abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("abs_bwd", x, g)?;
        self.launch_abs_bwd(x, g)
    }
    /// `g / (2·sqrt(x))` where x > 0, else 0.
    fn sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("sqrt_bwd", x, g)?;
        self.launch_sqrt_bwd(x, g)
    }
    /// `g` where x > 0, else 0.
    fn relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("relu_bwd", x, g)?;
        self.launch_relu_bwd(x, g)
    }
    /// `g` strictly inside (lo, hi), else 0.
    fn clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        check::same_len("clamp_bwd", x, g)?;
        self.launch_clamp_bwd(x, g, lo, hi)
    }
    /// `−g / (x·x)`.
    fn inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("inv_bwd", x, g)?;
        self.launch_inv_bwd(x, g)
    }
    /// `g · y · (1 − y)` from the output `y = sigmoid(x)`.
    fn sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("sigmoid_bwd", y, g)?;
        self.launch_sigmoid_bwd(y, g)
    }
    /// `g · (1 − y·y)` from the output `y = tanh(x)`.
    fn tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("tanh_bwd", y, g)?;
        self.launch_tanh_bwd(y, g)
    }
    /// `g · sigmoid(x)`.
    fn softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("softplus_bwd", x, g)?;
        self.launch_softplus_bwd(x, g)
    }
    /// `g · sigmoid(x) / (softplus(x) + eps)`.
    fn safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer> {
        check::same_len("safe_log_bwd", x, g)?;
        self.launch_safe_log_bwd(x, g, eps)
    }

    // ---- pointwise, binary (equal lengths) ----------------------------------------------------

    /// `a + b`.
    fn add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("add", a, b)?;
        self.launch_add(a, b)
    }
    /// `a − b`.
    fn sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("sub", a, b)?;
        self.launch_sub(a, b)
    }
    /// `a · b`.
    fn mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("mul", a, b)?;
        self.launch_mul(a, b)
    }
    /// `a / b`.
    fn div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("div", a, b)?;
        self.launch_div(a, b)
    }
    /// Elementwise maximum (`a` on a tie).
    fn max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("max", a, b)?;
        self.launch_max(a, b)
    }
    /// Elementwise minimum (`a` on a tie).
    fn min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        check::same_len("min", a, b)?;
        self.launch_min(a, b)
    }
    /// `a + c · b` (BLAS axpy, out of place).
    fn axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer> {
        check::same_len("axpy", a, b)?;
        self.launch_axpy(a, b, c)
    }
    /// `y ← y + c · x` in place (optimizer steps, gradient accumulation). `y` and `x` may be the
    /// same buffer.
    fn axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()> {
        check::same_len("axpy_assign", y, x)?;
        self.launch_axpy_assign(y, c, x)
    }
    /// `y ← y + c · x` for every pair `(y, x)`, in order: the same values as
    /// [`axpy_assign`](Device::axpy_assign) pair by pair, in one launch per
    /// [`AXPY_LIST_MAX`] pairs (an optimizer step over every parameter; PyTorch's
    /// `torch._foreach_add_(ys, xs, alpha=c)`). Pairs that share a buffer with another pair (a
    /// `y` twice, or one pair's `y` as another's `x`) run one launch each, in order; `y` and `x`
    /// of one pair may be the same buffer. Every pair's lengths are checked before anything
    /// runs.
    fn axpy_assign_list(&mut self, c: f32, pairs: &[(Buffer, Buffer)]) -> Result<()> {
        for &(y, x) in pairs {
            check::same_len("axpy_assign_list", y, x)?;
        }
        // Shared: a `y` twice, or a pair's `x` that is another pair's `y` (one pass, not a
        // comparison of every two pairs: a step over hundreds of parameters calls this).
        let mut ys = std::collections::HashMap::with_capacity(pairs.len());
        let twice = pairs
            .iter()
            .enumerate()
            .any(|(k, &(y, _))| ys.insert(y.id(), k).is_some());
        let crossed = || {
            (pairs.iter().enumerate()).any(|(k, &(_, x))| ys.get(&x.id()).is_some_and(|&j| j != k))
        };
        if twice || crossed() {
            return pairs
                .iter()
                .try_for_each(|&(y, x)| self.launch_axpy_assign(y, c, x));
        }
        pairs
            .chunks(AXPY_LIST_MAX)
            .try_for_each(|chunk| self.launch_axpy_assign_list(c, chunk))
    }

    /// One Adam(W) step in place: `w` and its moments `m`, `v` updated from the gradient `g`,
    /// per element as [`AdamUpdate::element`] says (the composed step's operations in its
    /// order, so its bits), in one launch. All four the same length; `w`, `m`, `v` and `g`
    /// distinct buffers. PyTorch: `torch.optim.Adam(…, fused=True)`'s step for one parameter.
    fn adam_update(
        &mut self,
        w: Buffer,
        m: Buffer,
        v: Buffer,
        g: Buffer,
        c: &AdamUpdate,
    ) -> Result<()> {
        const OP: &str = "adam_update";
        check::same_len(OP, w, m)?;
        check::same_len(OP, w, v)?;
        check::same_len(OP, w, g)?;
        check::distinct(OP, &[("w", w), ("m", m), ("v", v), ("g", g)])?;
        let c = *c;
        self.launch_adam_update_list(OP, &[AdamSlot { w, m, v, g, c }])
    }

    /// One momentum SGD step in place (a step after the first): `w` and its momentum buffer
    /// `b` updated from the gradient `g`, per element as [`MomentumUpdate::element`] says, in
    /// one launch. All three the same length and distinct buffers. PyTorch: `torch.optim.SGD(…,
    /// momentum=μ)`'s step for one parameter.
    fn momentum_update(
        &mut self,
        w: Buffer,
        b: Buffer,
        g: Buffer,
        c: &MomentumUpdate,
    ) -> Result<()> {
        const OP: &str = "momentum_update";
        check::same_len(OP, w, b)?;
        check::same_len(OP, w, g)?;
        check::distinct(OP, &[("w", w), ("b", b), ("g", g)])?;
        self.launch_momentum_update_list(OP, c, &[MomentumSlot { w, b, g }])
    }

    /// One Adam(W) step of every parameter of `slots` ([`AdamSlot`]: `w`, `m`, `v` updated in
    /// place from `g` with the slot's coefficients): each slot's elements as
    /// [`adam_update`](Device::adam_update) computes them, so its bits, in one launch per
    /// [`OPTIM_LIST_MAX`] slots whose coefficients agree but for the bias corrections (those
    /// come per slot: [`AdamUpdate::shares_launch_with`]; slots that differ otherwise go in
    /// launches of their own). Within each slot the lengths agree and the buffers are
    /// distinct, checked for every slot before anything runs (an error naming the slot); a list
    /// in which one buffer occurs in two slots runs one launch per slot, in order. PyTorch:
    /// `torch.optim.Adam(…, foreach=True)`'s multi-tensor step.
    fn adam_update_list(&mut self, slots: &[AdamSlot]) -> Result<()> {
        const OP: &str = "adam_update_list";
        let bufs = slots.iter().map(|s| [s.w, s.m, s.v, s.g]);
        if optim::check_list(OP, ["w", "m", "v", "g"], bufs)? {
            return slots
                .iter()
                .try_for_each(|s| self.launch_adam_update_list(OP, std::slice::from_ref(s)));
        }
        optim::adam_launches(slots)
            .iter()
            .try_for_each(|chunk| self.launch_adam_update_list(OP, chunk))
    }

    /// One momentum SGD step (a step after the first) of every parameter of `slots`
    /// ([`MomentumSlot`]: `w`, `b` updated in place from `g`) with the coefficients `c`: each
    /// slot's elements as [`momentum_update`](Device::momentum_update) computes them, in one
    /// launch per [`OPTIM_LIST_MAX`] slots. Checked as
    /// [`adam_update_list`](Device::adam_update_list), with the same fallback to one launch a
    /// slot when a buffer occurs in two slots. PyTorch: `torch.optim.SGD(…, momentum=μ,
    /// foreach=True)`'s step.
    fn momentum_update_list(&mut self, c: &MomentumUpdate, slots: &[MomentumSlot]) -> Result<()> {
        const OP: &str = "momentum_update_list";
        let bufs = slots.iter().map(|s| [s.w, s.b, s.g]);
        if optim::check_list(OP, ["w", "b", "g"], bufs)? {
            return slots.iter().try_for_each(|s| {
                self.launch_momentum_update_list(OP, c, std::slice::from_ref(s))
            });
        }
        slots
            .chunks(OPTIM_LIST_MAX)
            .try_for_each(|chunk| self.launch_momentum_update_list(OP, c, chunk))
    }

    // ---- pointwise, binary (backward) ---------------------------------------------------------

    /// `(g / b, −g·a / (b·b))`.
    fn div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        check::same_len3("div_bwd", a, b, g)?;
        self.launch_div_bwd(a, b, g)
    }
    /// `(g·[a > b], g·[b > a])`, each side `g/2` on a tie.
    fn max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        check::same_len3("max_bwd", a, b, g)?;
        self.launch_max_bwd(a, b, g)
    }
    /// `(g·[a < b], g·[b < a])`, each side `g/2` on a tie.
    fn min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        check::same_len3("min_bwd", a, b, g)?;
        self.launch_min_bwd(a, b, g)
    }

    // ---- reductions ---------------------------------------------------------------------------

    /// Sum of all elements into a length-1 buffer (0 for an empty buffer). Fixed order on sim and
    /// in deterministic mode: see [`sim::reduce`].
    fn reduce_sum(&mut self, x: Buffer) -> Result<Buffer>;
    /// `reduce_sum(x) / len` into a length-1 buffer (NaN for an empty buffer, as in PyTorch).
    fn reduce_mean(&mut self, x: Buffer) -> Result<Buffer>;
    /// `x` viewed as (outer, n, inner) summed over the middle axis → (outer, inner).
    fn reduce_axis_sum(
        &mut self,
        x: Buffer,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<Buffer> {
        let out_len = check::axis_lens("reduce_axis_sum", x, outer, n, inner)?;
        self.launch_reduce_axis("reduce_axis_sum", x, [outer, n, inner], out_len, false)
    }
    /// [`reduce_axis_sum`](Self::reduce_axis_sum) divided by `n`.
    fn reduce_axis_mean(
        &mut self,
        x: Buffer,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<Buffer> {
        let out_len = check::axis_lens("reduce_axis_mean", x, outer, n, inner)?;
        self.launch_reduce_axis("reduce_axis_mean", x, [outer, n, inner], out_len, true)
    }

    // ---- bias epilogue ([`bias`]) -------------------------------------------------------------

    /// `x + b` with the bias `b` (ch) broadcast over `x` (outer, ch, inner): one launch for the
    /// chain `add(x, broadcast(b))`, with its bits. PyTorch: `x + b.view(ch, 1)` (the bias add
    /// of `F.linear` / `F.conv2d`).
    fn add_bias(&mut self, x: Buffer, b: Buffer, layout: BiasLayout) -> Result<Buffer> {
        let n = layout.check("add_bias", x, b)?;
        let (sum, _) = self.launch_add_bias(x, b, layout, n, None)?;
        Ok(sum)
    }
    /// [`add_bias`](Self::add_bias) followed by `act`, in one launch: returns the sum (the
    /// activation's input, which its VJP reads) and the activation of it, each with the bits
    /// the separate launches give. PyTorch: `F.relu(F.linear(x, w, b))` under a fusing compiler.
    fn add_bias_act(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        act: Act,
    ) -> Result<(Buffer, Buffer)> {
        let n = layout.check("add_bias_act", x, b)?;
        match self.launch_add_bias(x, b, layout, n, Some(act))? {
            (sum, Some(y)) => Ok((sum, y)),
            (sum, None) => {
                self.release(sum);
                Err(crate::Error::kernel(
                    "add_bias_act",
                    "the launch returned no activation",
                ))
            }
        }
    }

    /// [`add_bias`](Self::add_bias) followed by a residual add of `r` (as long as `x`), in
    /// one launch: returns the sum and `r + sum` (`sum + r` unless `r_first`), each with the
    /// bits of the separate launches (`add` of the two). PyTorch: `r + F.linear(x, w, b)`
    /// under a fusing compiler, the residual branch of a transformer block.
    fn add_bias_residual(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        r: Buffer,
        r_first: bool,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "add_bias_residual";
        let n = layout.check(OP, x, b)?;
        check::len_is(OP, "residual", r, n)?;
        self.launch_add_bias_residual(x, b, layout, r, r_first)
    }

    // ---- layout -------------------------------------------------------------------------------

    /// numpy broadcast of `x` (dims `from`) to dims `to` (right-aligned; size-1 dims expand).
    /// PyTorch: `x.expand(to).contiguous()`.
    fn broadcast(&mut self, x: Buffer, from: &[usize], to: &[usize]) -> Result<Buffer> {
        let plan = BroadcastPlan::new("broadcast", from, to)?;
        check::len_is("broadcast", "input", x, plan.from_len)?;
        self.launch_broadcast(x, &plan)
    }
    /// The reduction back: `g` (dims `to`) summed over the broadcast axes to dims `from`.
    /// PyTorch: `g.sum_to_size(from)`.
    fn reduce_broadcast(&mut self, g: Buffer, from: &[usize], to: &[usize]) -> Result<Buffer> {
        let plan = BroadcastPlan::new("reduce_broadcast", from, to)?;
        check::len_is("reduce_broadcast", "cotangent", g, plan.to_len)?;
        self.launch_reduce_broadcast(g, from, &plan)
    }
    /// Permute the axes of `x` (dims `dims`): output axis k is input axis `perm[k]`.
    /// Rank ≤ [`MAX_RANK`]. PyTorch: `x.permute(perm).contiguous()`.
    fn permute(&mut self, x: Buffer, dims: &[usize], perm: &[usize]) -> Result<Buffer> {
        let plan = PermutePlan::new("permute", dims, perm)?;
        check::len_is("permute", "input", x, plan.len)?;
        self.launch_permute(x, &plan)
    }
    /// (m, n) → (n, m). PyTorch: `x.t().contiguous()`.
    fn transpose2d(&mut self, x: Buffer, m: usize, n: usize) -> Result<Buffer> {
        self.permute(x, &[m, n], &[1, 0])
    }

    // ---- row softmax (rows × cols, along the last axis) ---------------------------------------

    /// `exp(x − m) / Σ exp(x − m)` per row, m the row max.
    fn softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        self.scaled_softmax_rows(x, 1.0, rows, cols)
    }
    /// `softmax(c·x)` per row: the chain `scale` → [`softmax_rows`](Self::softmax_rows) in one
    /// launch, with its bits (each pass reads the rounded product `c·x`). PyTorch:
    /// `torch.softmax(c * x, -1)`, as in attention's `QKᵀ/√d`.
    fn scaled_softmax_rows(
        &mut self,
        x: Buffer,
        c: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        check::rows_cols("softmax_rows", x, rows, cols)?;
        self.launch_softmax_rows(x, rows, cols, c)
    }
    /// `x − m − log Σ exp(x − m)` per row, computed directly.
    fn log_softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        check::rows_cols("log_softmax_rows", x, rows, cols)?;
        self.launch_log_softmax_rows(x, rows, cols)
    }
    /// Softmax VJP from its output: `y · (g − Σ g·y)` per row.
    fn softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        self.scaled_softmax_rows_bwd(y, g, 1.0, rows, cols)
    }
    /// `c · softmax_rows_bwd(y, g)`: the VJP of [`scaled_softmax_rows`](Self::scaled_softmax_rows)
    /// with respect to `x` (the chain `softmax_rows_bwd` → `scale` in one launch, same bits).
    fn scaled_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        c: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        check::rows_cols("softmax_rows_bwd", y, rows, cols)?;
        check::same_len("softmax_rows_bwd", y, g)?;
        self.launch_softmax_rows_bwd(y, g, rows, cols, c)
    }
    /// Log-softmax VJP from its output: `g − exp(y) · Σ g` per row.
    fn log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        check::rows_cols("log_softmax_rows_bwd", y, rows, cols)?;
        check::same_len("log_softmax_rows_bwd", y, g)?;
        self.launch_log_softmax_rows_bwd(y, g, rows, cols)
    }

    // ---- linear algebra -----------------------------------------------------------------------

    /// `op(a) · op(b)` → (m, n). PyTorch: `a @ b` (with `.t()` for the flags).
    fn matmul(&mut self, a: Buffer, b: Buffer, g: Gemm) -> Result<Buffer> {
        let lens = check::gemm_lens("matmul", a, b, Batch::plain(1), g)?;
        self.launch_bmm("matmul", a, b, Batch::plain(1), g, lens)
    }
    /// `c ← c + op(a)·op(b)` in place: each element of the product summed as
    /// [`matmul`](Self::matmul) sums it, then added to `c`'s element with one rounding, so the
    /// bits of `add(c, matmul(a, b))` without the product's buffer and the add's launch.
    /// `c` must have `m·n` elements and be neither operand. PyTorch: `torch.addmm(c, a, b,
    /// out=c)`.
    fn matmul_acc(&mut self, c: Buffer, a: Buffer, b: Buffer, g: Gemm) -> Result<()> {
        const OP: &str = "matmul_acc";
        let lens = check::gemm_lens(OP, a, b, Batch::plain(1), g)?;
        check::len_is(OP, "accumulator", c, lens[2])?;
        if c.id() == a.id() || c.id() == b.id() {
            return Err(crate::Error::kernel(
                OP,
                "the accumulator is also an operand (the product would read what it writes)",
            ));
        }
        self.launch_matmul_acc(c, a, b, g)
    }
    /// `batch` independent products, operands and result stored batch-major.
    /// PyTorch: `torch.bmm`.
    fn bmm(&mut self, a: Buffer, b: Buffer, batch: usize, g: Gemm) -> Result<Buffer> {
        let bt = Batch::plain(batch);
        let lens = check::gemm_lens("bmm", a, b, bt, g)?;
        self.launch_bmm("bmm", a, b, bt, g, lens)
    }
    /// `bt.count` independent products whose operands and result lie as `bt` says: each
    /// one head-merged (the (groups, rows, heads, cols) layout of an attention projection) or
    /// product-major. Every output element is summed as [`bmm`](Self::bmm) sums it, so the
    /// bits of `bmm` on the permuted operands, without the permutes' launches and copies.
    /// `bt.heads` must be at least 1 and divide `bt.count`; a grouped operand
    /// ([`Batch::grouped`]: `kv_heads` heads a row, shared by runs of `heads / kv_heads`
    /// products) has `count·kv_heads/heads` matrices, read as `bmm` would read their copies.
    /// PyTorch: `torch.matmul` on `x.view(B, n, H, d).transpose(1, 2)` (and, grouped, on
    /// `k.repeat_interleave(heads / kv_heads, 1)`).
    fn bmm_heads(&mut self, a: Buffer, b: Buffer, bt: Batch, g: Gemm) -> Result<Buffer> {
        const OP: &str = "bmm_heads";
        check::batch(OP, bt)?;
        let lens = check::gemm_lens(OP, a, b, bt, g)?;
        self.launch_bmm(OP, a, b, bt, g, lens)
    }

    // ---- norm (layer/batch norm pieces, masked softmax) ---------------------------------------

    /// Per group of `l` (see [`NormLayout`]), centred on its first element x₀: the mean d̄ of
    /// `x − x₀` and `1/sqrt(var + eps)` with the biased variance `Σ((x − x₀) − d̄)²/m` taken in
    /// a second pass and clamped at ≥ 0, both sums in the block-tree order. Returns
    /// `2·groups` values: the d̄s, then the reciprocal standard deviations; the kernels that
    /// read them centre x as `(x − x₀) − d̄`, x₀ read from x (the group's mean is `x₀ + d̄`; the
    /// shift keeps the centred values exact to the rounding of the group's spread, not of its
    /// mean). PyTorch: `torch.var_mean(x, unbiased=False)` per group (PyTorch keeps the mean).
    /// Where `l` is not [`centred`](NormLayout::centred) (RMS norm) x₀ = d̄ = 0: no mean pass,
    /// the d̄s are 0 and the variance is `Σ x²/m` (PyTorch: `x.pow(2).mean(-1)`).
    fn norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        l.check_x("norm_stats", x)?;
        self.launch_norm_stats(x, l, eps)
    }
    /// Per group of `l`: the mean `μ = x₀ + d̄` and the biased variance, the sums of
    /// [`norm_stats`](Self::norm_stats) (its d̄ and the variance it adds ε to, the same bits).
    /// Returns `2·groups` values: the means, then the variances (`batchMoments`).
    /// PyTorch: `torch.var_mean(x, unbiased=False)` per group.
    fn norm_moments(&mut self, x: Buffer, l: NormLayout) -> Result<Buffer> {
        l.check_x("norm_moments", x)?;
        self.launch_norm_moments(x, l)
    }
    /// The VJP of [`norm_moments`](Self::norm_moments): with `g = [gμ…, gv…]` and `moments`
    /// its output, per element of group k (m elements) `dx = (gμ_k + 2·gv_k·(x − μ_k))/m`.
    fn norm_moments_bwd(
        &mut self,
        x: Buffer,
        moments: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_moments_bwd";
        l.check_x(OP, x)?;
        check::len_is(OP, "moments", moments, 2 * l.groups)?;
        check::len_is(OP, "cotangent", g, 2 * l.groups)?;
        self.launch_norm_moments_bwd(x, moments, g, l)
    }
    /// BatchNorm's running-statistics update, both statistics in one launch, into two fresh
    /// buffers: from `moments` (`2·n` values: the batch means, then the biased batch variances
    /// of `count` elements each, [`norm_moments`](Self::norm_moments)' output, `batchMoments`'
    /// (2, C)), per element the running `mean` (`n`) takes the rule of
    /// [`running_update`](tl_spec::ops::norm::running_update) with
    /// [`RunningStat::Mean`](tl_spec::ops::norm::RunningStat::Mean) and the running `var` (`n`) with
    /// [`RunningStat::Variance`](tl_spec::ops::norm::RunningStat::Variance) of
    /// `count`, each on the operands widened to f64 and rounded once to f32: the bits of the
    /// two updates one statistic at a time. `momentum` must be in [0, 1]. Returns the new mean
    /// and the new variance. PyTorch: `running_mean.mul_(1 − m).add_(μ, alpha=m)` and
    /// `running_var.mul_(1 − m).add_(var·count/(count − 1), alpha=m)` (`nn.BatchNorm2d`'s
    /// training forward, two kernels).
    fn running_update_moments(
        &mut self,
        mean: Buffer,
        var: Buffer,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "running_update_moments";
        let n = check::same_len(OP, mean, var)?;
        check::len_is(OP, "moments", moments, 2 * n)?;
        tl_spec::ops::norm::running_momentum(OP, momentum)?;
        self.launch_running_update_moments(mean, var, moments, momentum, count)
    }
    /// BatchNorm's eval scale from its running variance, into a fresh buffer: per element
    /// [`running_inv_std`](tl_spec::ops::norm::running_inv_std), `1/sqrt(var + eps)` on the
    /// variance widened to f64, rounded once to f32 (the host's rule, so an eval pass has the
    /// same bits on every backend). `eps` must be finite and > 0. PyTorch:
    /// `torch.rsqrt(running_var + eps)` (`F.batch_norm` in eval mode, in f32).
    fn running_inv_std(&mut self, var: Buffer, eps: f64) -> Result<Buffer> {
        const OP: &str = "running_inv_std";
        if !(eps > 0.0 && eps.is_finite()) {
            let detail = format!("eps must be finite and > 0, got {eps}");
            return Err(crate::Error::kernel(OP, detail));
        }
        self.launch_running_inv_std(var, eps)
    }
    /// `y = ((x − x₀) − d̄)·rstd·γ + β` per element from [`norm_stats`](Self::norm_stats)'
    /// output, x₀ the first element of the element's group; where `l` is not
    /// [`centred`](NormLayout::centred) (RMS norm) `y = x·rstd·γ`, and `beta` must be `None`
    /// (it must be `Some` for a centred layout; either mismatch is an error naming the
    /// primitive).
    fn norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Option<Buffer>,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_apply";
        l.check_x(OP, x)?;
        l.check_stats(OP, stats)?;
        l.check_affine(OP, "gamma", gamma)?;
        // Not centred: γ stands in for β, unread (the kernels take a live pointer).
        let beta = l.check_beta(OP, gamma, beta)?;
        self.launch_norm_apply(x, stats, gamma, beta, l)
    }
    /// [`norm_stats`](Self::norm_stats) then [`norm_apply`](Self::norm_apply): `(y, stats)`,
    /// the bits of the two. One launch where the groups are short
    /// ([`NormLayout::fused_forward`]), two otherwise, or, where the statistics' sums are
    /// split ([`NormLayout::split_parts`]), their own launches (two or three) and the apply.
    /// PyTorch: `torch.native_layer_norm` (the output with the saved mean and rstd). `beta` as for `norm_apply`: `Some` exactly
    /// where `l` is [`centred`](NormLayout::centred) (RMS norm: `None`; PyTorch:
    /// `F.rms_norm`).
    fn norm_forward(
        &mut self,
        x: Buffer,
        gamma: Buffer,
        beta: Option<Buffer>,
        l: NormLayout,
        eps: f32,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_forward";
        l.check_x(OP, x)?;
        l.check_affine(OP, "gamma", gamma)?;
        // Not centred: γ stands in for β, unread (the kernels take a live pointer).
        let beta = l.check_beta(OP, gamma, beta)?;
        if l.fused_forward() {
            return self.launch_norm_forward(x, gamma, beta, l, eps);
        }
        let st = self.launch_norm_stats(x, l, eps)?;
        match self.launch_norm_apply(x, st, gamma, beta, l) {
            Ok(y) => Ok((y, st)),
            Err(e) => {
                self.release(st);
                Err(e)
            }
        }
    }
    /// The normalization's input cotangent in closed form: per group of m elements, with
    /// `x̂ = ((x − x₀) − d̄)·rstd` ([`norm_stats`](Self::norm_stats)) and `ĝ = g·γ`,
    /// `dx = rstd/m · (m·ĝ − Σ ĝ − x̂·Σ ĝ·x̂)`; where `l` is not
    /// [`centred`](NormLayout::centred) (RMS norm: `x̂ = x·rstd`, the mean is no function of x)
    /// `dx = rstd/m · (m·ĝ − x̂·Σ ĝ·x̂)`.
    fn norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_bwd_x";
        l.check_x(OP, x)?;
        l.check_stats(OP, stats)?;
        l.check_affine(OP, "gamma", gamma)?;
        check::same_len(OP, x, g)?;
        self.launch_norm_bwd_x(x, stats, gamma, g, l)
    }
    /// `(dγ, dβ) = (Σ g·x̂, Σ g)` per γ/β entry, each summed over its elements in increasing
    /// index order (no atomics); x̂ as in [`norm_bwd_x`](Self::norm_bwd_x). A layout that is
    /// not [`centred`](NormLayout::centred) has no β: its dβ (still `Σ g`) is the caller's to
    /// release.
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
        self.launch_norm_bwd_affine(x, stats, g, l)
    }
    /// Softmax of each row of x (rows, n) over the entries its mask row allows; other
    /// entries, and every entry of a row with nothing allowed, are exactly 0. `mask` is one or
    /// more (m, n) matrices back to back (row-major, true = allowed: an (nq, nk) attention
    /// mask, m = nq), one per batch element or one shared by all; they split x's rows in order
    /// into equal shares, and row `r` of a share takes its matrix's row `r mod m`
    /// ([`MaskedRows`]: for (B·H, nq, nk) scores and B matrices, the H·nq
    /// rows of batch element b take matrix b). Rows must be a whole number of blocks of m per
    /// matrix. Its VJP is [`softmax_rows_bwd`](Self::softmax_rows_bwd) (y is 0 where masked).
    /// PyTorch: `softmax(x.masked_fill(~mask, -inf), -1)` with NaN rows set to 0, the mask
    /// (B, 1, nq, nk) or (nq, nk).
    fn masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        rows: usize,
        n: usize,
        m: usize,
    ) -> Result<Buffer> {
        let l = MaskedRows::check("masked_softmax_rows", x, mask, rows, n, m)?;
        self.launch_masked_softmax_rows(x, mask, l)
    }

    // ---- attention (kernels/attention.cu; [`flash`]) -------------------------------------------

    /// The fused ("flash") attention core on Q (B, nq, H, d) and K, V (B, nk, H, d), each
    /// head-merged ([`flash`]): per head (b, h) `O = softmax(Q Kᵀ/√d)·V` over the keys `f.mask`
    /// allows in batch element b (one mask shared by all, or one per element: [`FlashMask`]; a
    /// row with none: zeros), in tiles of [`FLASH_TILE`] keys with the online softmax
    /// (running max and sum, the output rescaled per tile), so no row of scores is ever stored.
    /// Returns `(O, lse)`: O head-merged like Q, lse (B·H·nq) each query row's `m + ln l` (−∞
    /// for a row with nothing allowed), which
    /// [`flash_attention_bwd`](Self::flash_attention_bwd) reads. Head sizes
    /// `1..=`[`FLASH_MAX_HEAD`]; larger ones, buffers of other lengths, and a mask made for
    /// other (nq, nk) or another batch, are errors before launch. PyTorch:
    /// `F.scaled_dot_product_attention(q, k, v, attn_mask)` (its flash backend; `attn_mask`
    /// (L, S) or (B, 1, L, S)).
    ///
    /// Under autocast ([`Flash::round`] bf16 or TF32) the products read rounded operands
    /// (`O = round(A)·round(V)`, A the softmax of `round(Q)·round(K)ᵀ/√d`) in two passes over
    /// the keys, still O(n·d) memory: the first keeps each row's statistics alone (no P·V), the
    /// second gives O ([`flash_attention_rounded`](Self::flash_attention_rounded)'s O and lse
    /// bit for bit, without its Ō, which only a backward reads).
    fn flash_attention(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<(Buffer, Buffer)> {
        f.check_forward("flash_attention", qkv)?;
        if !f.round.is_autocast() {
            return self.launch_flash_fwd(qkv, f);
        }
        let (o, lse, _) = flash_round::forward(self, qkv, f, false)?;
        Ok((o, lse))
    }
    /// The fused core under autocast ([`Flash::round`] bf16 or TF32; an f32 core is an error:
    /// [`flash_attention`](Self::flash_attention)): `[O, lse, Ō]`, O and lse as
    /// `flash_attention` gives them and `Ō = A·round(V)`, the output of the unrounded
    /// probabilities, which [`flash_attention_bwd`](Self::flash_attention_bwd) takes in place
    /// of O under autocast (its `delta = Σ_j A_ij·dA_ij` reads the unrounded A). Two passes
    /// over the keys: the plain forward (lse, Ō), then `O = Σ_j round(exp(s − lse))·round(v_j)`.
    fn flash_attention_rounded(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<[Buffer; 3]> {
        const OP: &str = "flash_attention_rounded";
        f.check_forward(OP, qkv)?;
        if !f.round.is_autocast() {
            return Err(crate::Error::kernel(
                OP,
                "the core's products are f32 (Flash::round = F32); an f32 core has no rounded \
                 output: use flash_attention",
            ));
        }
        match flash_round::forward(self, qkv, f, true)? {
            (o, lse, Some(exact)) => Ok([o, lse, exact]),
            (o, lse, None) => {
                self.release(o);
                self.release(lse);
                Err(crate::Error::kernel(OP, "the first pass kept no Ō"))
            }
        }
    }
    /// The VJP of [`flash_attention`](Self::flash_attention) for the cotangent `go` of O, from
    /// its output `o` and `lse`: `[dQ, dK, dV]` (dQ of Q's length, dK and dV of K's),
    /// recomputing the probabilities tile by tile from lse (`p = exp(s − lse)`,
    /// `dS = p·(dP − Σ dO⊙O)/√d`). Two launches (dQ by query
    /// tiles, dK and dV by key tiles), no atomics, on the sim and, with deterministic
    /// reductions on, on CUDA; with them off (and d ≤ [`FLASH_ONE_PASS_MAX_HEAD`]) CUDA runs
    /// the one-pass backward (dK, dV by key blocks, dQ added across them with `atomicAdd`:
    /// last-bit differences between runs; [`crate::gates::flash_bwd_one_pass`]).
    ///
    /// Under autocast ([`Flash::round`] bf16 or TF32) `o` must be Ō, the third buffer of
    /// [`flash_attention_rounded`](Self::flash_attention_rounded) (O itself would put the
    /// rounding of A into delta); Q, K, V and dO are read rounded, and p and dS are rounded
    /// before the sums read them (`dV = round(A)ᵀ·round(dO)`, `dQ = round(dS)·round(K)`,
    /// `dK = round(dS)ᵀ·round(Q)`).
    fn flash_attention_bwd(
        &mut self,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        f.check_backward("flash_attention_bwd", qkv, o, lse, go)?;
        match f.round.is_autocast() {
            false => self.launch_flash_bwd(qkv, o, lse, go, f),
            true => flash_round::backward(self, qkv, o, lse, go, f),
        }
    }

    // ---- conv ---------------------------------------------------------------------------------

    /// Unfold the big operand `x` `(batch, channels, big...)` into the column matrix
    /// `(channels, kernel, batch, small)`: `cols[c, k, n, o] = x[n, c, cell(o, k)]`, 0 for
    /// padding ([`Windows::cell`]). PyTorch: `F.unfold` (with the batch moved inside).
    fn im2col(&mut self, x: Buffer, w: &Windows) -> Result<Buffer> {
        let lens = w.check("im2col")?;
        check::len_is("im2col", "input", x, lens.big_len())?;
        self.launch_im2col(x, w, lens)
    }
    /// The convolution `y[n, a, o] = Σ_p w[a, p] · cols[p, n, o]` with `cols = im2col(x)`
    /// (`p = c·K + k` over the input channels and kernel cells), by the implicit-GEMM kernel:
    /// the column matrix is never made, each tile of it is gathered from `x` as it is staged.
    /// `w` is `(out_channels, channels, kernel...)`, `x` `(batch, channels, big...)`, the result
    /// `(batch, out_channels, small...)`, no bias. Each output sums its terms in increasing `p`
    /// from 0 as `fma(w, x, acc)` (a padding cell as `fma(w, 0, acc)`): the bits of
    /// `matmul(w, im2col(x))` wherever that product is not split along `k` ([`Gemm::k_chunk`]),
    /// permuted to `(batch, out_channels, small)`. PyTorch: `F.conv2d` (and 1-D/3-D) without
    /// bias, dilation 1, groups 1.
    ///
    /// Under autocast ([`crate::precision::current`] `Bf16` / `Tf32`) the tensor-core kernel
    /// runs it (`tl_conv_implicit_tc`, 128×128 tiles), each operand element rounded as it is
    /// staged ([`Precision::round`](crate::Precision::round)): on the sim and the emulator the
    /// sum above of the rounded operands (each product exact in f32), plus `0.0` where
    /// `channels·K` is not a multiple of [`TC_K`](sim::linalg::TC_K) (the slice's zero padding:
    /// a `−0` sum becomes `+0`), the bits of the im2col path's tensor-core GEMM where that is
    /// not split along `k`; on a GPU the tensor cores' order, within
    /// [`tl_spec::bf16::accumulation_bound`].
    fn conv_implicit(
        &mut self,
        w: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit";
        let lens = win.check(OP)?;
        check::len_is(OP, "input", x, lens.big_len())?;
        let w_len = check::product(OP, &[out_channels, win.channels, lens.kernel])?;
        check::len_is(OP, "weight", w, w_len)?;
        let y_len = check::product(OP, &[win.batch, out_channels, lens.small])?;
        abi::len_u32(OP, y_len)?;
        abi::len_u32(OP, w_len)?;
        self.launch_conv_implicit(w, x, win, out_channels, lens)
    }
    /// The input cotangent of [`conv_implicit`](Self::conv_implicit) by the implicit-GEMM
    /// kernel: `dx = col2im(wᵀ · g')` (`g'` the cotangent `g` `(batch, out_channels, small...)`
    /// as `(out_channels, batch·small)`) without the column matrix; the result is
    /// `(batch, channels, big...)`. Each element sums, over its window cells `k` from last to
    /// first where a small cell `o` reads it, `part = Σ_a w[a, c, k]·g[n, a, o]` (`fma` from 0 in
    /// increasing `a`) as `acc + part` from 0: the bits of the gather `col2im` over the GEMM
    /// wherever that GEMM is not split along `k` ([`Gemm::k_chunk`]). Fixed order in both
    /// reduction modes. PyTorch: `torch.nn.grad.conv2d_input`.
    fn conv_implicit_dx(
        &mut self,
        w: Buffer,
        g: Buffer,
        win: &Windows,
        out_channels: usize,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit_dx";
        let lens = win.check(OP)?;
        let g_len = check::product(OP, &[win.batch, out_channels, lens.small])?;
        check::len_is(OP, "cotangent", g, g_len)?;
        let w_len = check::product(OP, &[out_channels, win.channels, lens.kernel])?;
        check::len_is(OP, "weight", w, w_len)?;
        abi::len_u32(OP, g_len)?;
        abi::len_u32(OP, w_len)?;
        self.launch_conv_implicit_dx(w, g, win, out_channels, lens)
    }
    /// The weight cotangent of [`conv_implicit`](Self::conv_implicit) by the implicit-GEMM
    /// kernel: `dw = g' · im2col(x)ᵀ` (`g'` the cotangent `g` `(batch, out_channels, small...)`
    /// as `(out_channels, batch·small)`) without the column matrix nor the permute of `g`; the
    /// result is `(out_channels, channels, kernel...)`. Element `(a, q)` (`q = c·K + k`) sums
    /// `g[n, a, o]·x[n, c, cell(o, k)]` over `p = n·L + o` (a padding cell as `fma(g, 0, acc)`)
    /// split as the GEMM `Gemm::nn(out_channels, batch·small, channels·K)` splits its `k`
    /// ([`Gemm::k_chunk`]): each run in increasing `p` from 0 as `fma`, the runs added in
    /// increasing order from 0 (one run: its sum). So the bits of `matmul(g', im2col(x))` with
    /// `b` transposed at every size, split or not. Fixed order in both reduction modes.
    /// PyTorch: `torch.nn.grad.conv2d_weight` (dilation 1, groups 1).
    ///
    /// Under autocast the tensor-core kernel runs it (`tl_conv_implicit_dw_tc`, 128×128 tiles,
    /// the split counting them as the tensor-core GEMM's does: [`split_tile`]), each operand
    /// element rounded as it is staged: on the sim and the emulator the bits of the im2col
    /// path's tensor-core GEMM at every size; on a GPU the tensor cores' order.
    fn conv_implicit_dw(
        &mut self,
        g: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit_dw";
        let lens = win.check(OP)?;
        check::len_is(OP, "input", x, lens.big_len())?;
        let g_len = check::product(OP, &[win.batch, out_channels, lens.small])?;
        check::len_is(OP, "cotangent", g, g_len)?;
        let w_len = check::product(OP, &[out_channels, win.channels, lens.kernel])?;
        abi::len_u32(OP, g_len)?;
        abi::len_u32(OP, w_len)?;
        self.launch_conv_implicit_dw(g, x, win, out_channels, lens)
    }
    /// The adjoint of [`im2col`](Self::im2col): `x[n, c, j] = Σ cols[c, k, n, o]` over the
    /// window cells `(o, k)` that read `j`. On sim and in deterministic mode each output element
    /// sums its cells in increasing `o`; otherwise one `atomicAdd` per column element.
    /// PyTorch: `F.fold`.
    fn col2im(&mut self, cols: Buffer, w: &Windows) -> Result<Buffer> {
        let lens = w.check("col2im")?;
        check::len_is("col2im", "columns", cols, lens.cols_len())?;
        self.launch_col2im(cols, w, lens)
    }
    /// Pool each window of `x` `(batch, channels, big...)` into `(batch, channels, small...)`.
    /// PyTorch: `F.max_pool*d` / `F.avg_pool*d` (see [`PoolKind`]).
    fn pool(&mut self, x: Buffer, w: &Windows, kind: PoolKind) -> Result<Buffer> {
        let lens = w.check("pool")?;
        check::len_is("pool", "input", x, lens.big_len())?;
        self.launch_pool(x, w, kind, lens)
    }
    /// VJP of [`pool`](Self::pool) at `x` for the cotangent `g` (small): max routes each
    /// window's cotangent to its first argmax, avg spreads `g/volume` over the real cells,
    /// smooth max weights it by softmax(β·v). On sim and in deterministic mode each input
    /// element sums its windows in increasing order; otherwise `atomicAdd` per window cell.
    fn pool_bwd(&mut self, x: Buffer, g: Buffer, w: &Windows, kind: PoolKind) -> Result<Buffer> {
        const OP: &str = "pool_bwd";
        let lens = w.check(OP)?;
        check::len_is(OP, "input", x, lens.big_len())?;
        check::len_is(OP, "cotangent", g, lens.small_len())?;
        self.launch_pool_bwd(x, g, w, kind, lens)
    }

    // ---- activation (kernels/activation.cu; SEMANTICS: docs/semantics.md "gelu", "silu") ----

    /// `0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))`. PyTorch: `F.gelu(x, approximate="tanh")`.
    fn gelu(&mut self, x: Buffer) -> Result<Buffer>;
    /// GELU VJP: `g · (0.5(1 + t) + 0.5·x·(1 − t²)·√(2/π)(1 + 3·0.044715x²))`, the second term
    /// taken as 0 once `tanh` has saturated.
    fn gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("gelu_bwd", x, g)?;
        self.launch_gelu_bwd(x, g)
    }
    /// `x · sigmoid(x)` with the stable sigmoid. PyTorch: `F.silu`.
    fn silu(&mut self, x: Buffer) -> Result<Buffer>;
    /// SiLU VJP: `g · s·(1 + x(1 − s))`, `s = sigmoid(x)`.
    fn silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        check::same_len("silu_bwd", x, g)?;
        self.launch_silu_bwd(x, g)
    }
    /// `leakyRelu`, `elu` or the exact GELU ([`PointAct`]) at every element. PyTorch:
    /// `F.leaky_relu`, `F.elu`, `F.gelu`.
    fn point_act(&mut self, x: Buffer, act: PointAct) -> Result<Buffer>;
    /// VJP of [`point_act`](Self::point_act) at `x` for the cotangent `g`; at x = 0 the
    /// x ≤ 0 branch (PyTorch's autograd).
    fn point_act_bwd(&mut self, x: Buffer, g: Buffer, act: PointAct) -> Result<Buffer> {
        check::same_len(act.kernels().1, x, g)?;
        self.launch_point_act_bwd(x, g, act)
    }

    // ---- index (kernels/index.cu) -------------------------------------------------------------
    //
    // Index operands are host slices, uploaded by the device per launch (the sim reads them
    // directly). The gathers are totalized as SEMANTICS.md "Indexing" says: an index ≥ `rows`
    // reads a zero row and receives nothing in the scatter-add; ranges of the copy primitives
    // must lie inside their operand (an error before launch otherwise).

    /// Rows `idx` of `x` viewed as (rows, cols) → (idx.len(), cols); a zero row for an index ≥
    /// rows. PyTorch: `torch.index_select(x, 0, idx)` (which raises instead of zero-filling).
    fn gather_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        idx: &[usize],
    ) -> Result<Buffer> {
        let idx = index_check::row_indices("gather_rows", rows, cols, idx)?;
        check::len_is("gather_rows", "input", x, rows * cols)?;
        self.launch_gather_rows(x, rows, cols, &idx)
    }
    /// The gather's VJP: zeros of (rows, cols) with row `r` of `g` (idx.len(), cols) added into
    /// row `idx[r]`; repeated indices accumulate, indices ≥ rows are skipped. Fixed order
    /// (per output, indices in order) on sim and in deterministic mode, atomics otherwise.
    /// PyTorch: `torch.zeros(rows, cols).index_add_(0, idx, g)`.
    fn scatter_add_rows(
        &mut self,
        g: Buffer,
        rows: usize,
        cols: usize,
        idx: &[usize],
    ) -> Result<Buffer> {
        const OP: &str = "scatter_add_rows";
        let idx = index_check::row_indices(OP, rows, cols, idx)?;
        check::len_is(OP, "cotangent", g, idx.len() * cols)?;
        self.launch_scatter_add_rows(g, rows, cols, &idx)
    }
    /// Elements `start..start + len` of `x`. PyTorch: `x.flatten()[start:start+len].clone()`.
    fn copy_range(&mut self, x: Buffer, start: usize, len: usize) -> Result<Buffer> {
        index_check::range("copy_range", "input", x, start, len)?;
        self.launch_copy_range(x, start, len)
    }
    /// `len` zeros with `g` written at `start..start + g.len()` (the VJP of
    /// [`copy_range`](Self::copy_range)).
    fn place_range(&mut self, g: Buffer, len: usize, start: usize) -> Result<Buffer> {
        index_check::fits("place_range", "output", start, g.len(), len)?;
        self.launch_place_range(g, len, start)
    }
    /// `a` followed by `b`. PyTorch: `torch.cat([a.flatten(), b.flatten()])`.
    fn concat(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        index_check::concat_len("concat", a, b)?;
        self.launch_concat(a, b)
    }
    /// A copy of `x` with `v` added at `start..start + v.len()`.
    /// PyTorch: `x.clone().flatten().index_add_(0, arange(start, start+len), v)`.
    fn add_range(&mut self, x: Buffer, v: Buffer, start: usize) -> Result<Buffer> {
        index_check::range("add_range", "input", x, start, v.len())?;
        self.launch_add_range(x, v, start)
    }
    /// Per-row cross-entropy of logits `x` (rows, cols): `lse(row) − row[label]` with a
    /// max-shifted log-sum-exp, 0 for a label ≥ cols → (rows).
    /// PyTorch: `F.cross_entropy(x, labels, reduction="none")`.
    fn cross_entropy_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: &[usize],
    ) -> Result<Buffer>
    where
        Self: Sized,
    {
        let lab = self.upload_labels("cross_entropy_rows", x, rows, cols, labels)?;
        let out = self.cross_entropy_rows_on(x, rows, cols, lab);
        self.release_then(lab, out)
    }
    /// VJP of the mean of [`cross_entropy_rows`](Self::cross_entropy_rows) for the scalar
    /// cotangent `g`: `(softmax(row) − onehot(label)) · g/rows`, zero rows for labels ≥ cols.
    fn cross_entropy_rows_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: &[usize],
    ) -> Result<Buffer>
    where
        Self: Sized,
    {
        let lab = self.upload_labels("cross_entropy_rows_bwd", x, rows, cols, labels)?;
        let out = self.cross_entropy_rows_bwd_on(x, g, rows, cols, lab);
        self.release_then(lab, out)
    }
    /// Copy the row labels of a cross-entropy on logits `x` (rows, cols) to the device once,
    /// for [`cross_entropy_rows_on`](Self::cross_entropy_rows_on) and its VJP: one element per
    /// row holding the label's `u32` bit pattern, a label ≥ cols stored as `cols` (no class: a
    /// zero row). `op` names the caller in errors (a label count other than `rows`).
    /// PyTorch: `torch.tensor(labels, device="cuda")`.
    fn upload_labels(
        &mut self,
        op: &'static str,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: &[usize],
    ) -> Result<Buffer> {
        let labels = index_check::labels(op, x, rows, cols, labels)?;
        let bits: Vec<f32> = labels.into_iter().map(f32::from_bits).collect();
        self.upload(&bits)
    }
    /// [`cross_entropy_rows`](Self::cross_entropy_rows) with labels already on the device
    /// ([`upload_labels`](Self::upload_labels)). Any label value ≥ cols gives a zero row, so
    /// no buffer content reads out of bounds.
    fn cross_entropy_rows_on(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        index_check::label_buffer("cross_entropy_rows", x, rows, cols, labels)?;
        self.launch_cross_entropy_rows(x, rows, cols, labels)
    }
    /// [`cross_entropy_rows_bwd`](Self::cross_entropy_rows_bwd) with labels already on the
    /// device ([`upload_labels`](Self::upload_labels)).
    fn cross_entropy_rows_bwd_on(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer> {
        const OP: &str = "cross_entropy_rows_bwd";
        index_check::label_buffer(OP, x, rows, cols, labels)?;
        check::len_is(OP, "cotangent", g, 1)?;
        self.launch_cross_entropy_rows_bwd(x, g, rows, cols, labels)
    }
}
