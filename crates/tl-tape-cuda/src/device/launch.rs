//! The work half of the validated primitives: [`Launch`], the required `launch_<name>` methods
//! that [`Device`]'s provided methods call once they have checked their operands.
//!
//! A primitive whose operands need checking is written in two halves. The public [`Device`]
//! method runs the pure operand checks — [`check`](super::check),
//! [`index_check`](super::index_check), [`NormLayout`]'s, [`Windows::check`], and the
//! [`crate::abi`] conversions they make — once, for every
//! implementation, and computes what the implementations need from them (a [`WindowLens`], a
//! [`BroadcastPlan`], indices mapped to `u32`, ...). It then calls `launch_<name>`, which only
//! does the work: look the operands up (a released buffer is still an error there: that
//! depends on device state), allocate, run the kernel. The index primitives' half is a trait of
//! its own, [`LaunchIndex`], which each device implements in its `index` module. Callers use
//! the [`Device`] methods; these traits are public only because [`Device`] names them as its
//! supertraits.

#[cfg(doc)]
use super::Device;
use super::check::{BroadcastPlan, PermutePlan};
use super::{
    Act, AdamSlot, Batch, BiasLayout, Buffer, Flash, Gemm, MaskedRows, MomentumSlot,
    MomentumUpdate, NormLayout, PoolKind, WindowLens, Windows,
};
use crate::Result;

/// The work of each [`Device`] primitive whose operands [`Device`] validates (see the module
/// docs). Implement it next to [`Device`]; call the [`Device`] methods, never these.
#[doc(hidden)]
pub trait Launch: LaunchIndex {
    /// The work of [`Device::abs_bwd`]; operands already validated by it — callers use `abs_bwd`.
    fn launch_abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::sqrt_bwd`]; operands already validated by it — callers use `sqrt_bwd`.
    fn launch_sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::relu_bwd`]; operands already validated by it — callers use `relu_bwd`.
    fn launch_relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::clamp_bwd`]; operands already validated by it — callers
    /// use `clamp_bwd`.
    fn launch_clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer>;
    /// The work of [`Device::inv_bwd`]; operands already validated by it — callers use `inv_bwd`.
    fn launch_inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::sigmoid_bwd`]; operands already validated by it — callers
    /// use `sigmoid_bwd`.
    fn launch_sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::tanh_bwd`]; operands already validated by it — callers use `tanh_bwd`.
    fn launch_tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::softplus_bwd`]; operands already validated by it — callers
    /// use `softplus_bwd`.
    fn launch_softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::safe_log_bwd`]; operands already validated by it — callers
    /// use `safe_log_bwd`.
    fn launch_safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer>;
    /// The work of [`Device::add`]; operands already validated by it — callers use `add`.
    fn launch_add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::sub`]; operands already validated by it — callers use `sub`.
    fn launch_sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::mul`]; operands already validated by it — callers use `mul`.
    fn launch_mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::div`]; operands already validated by it — callers use `div`.
    fn launch_div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::max`]; operands already validated by it — callers use `max`.
    fn launch_max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::min`]; operands already validated by it — callers use `min`.
    fn launch_min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::axpy`]; operands already validated by it — callers use `axpy`.
    fn launch_axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer>;
    /// The work of [`Device::axpy_assign`]; operands already validated by it — callers
    /// use `axpy_assign`.
    fn launch_axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()>;
    /// The work of [`Device::axpy_assign_list`] for at most
    /// [`AXPY_LIST_MAX`](crate::device::AXPY_LIST_MAX) pairs that share no buffer with another
    /// pair, lengths checked: one launch — callers use `axpy_assign_list`.
    fn launch_axpy_assign_list(&mut self, c: f32, pairs: &[(Buffer, Buffer)]) -> Result<()>;
    /// The work of [`Device::adam_update_list`] (and of [`Device::adam_update`], one slot) for
    /// at most [`OPTIM_LIST_MAX`](crate::device::OPTIM_LIST_MAX) slots that share no buffer and
    /// whose coefficients agree but for the bias corrections (the kernel takes the others from
    /// slot 0), operands checked: one launch, its errors naming `op` (the method called) —
    /// callers use those methods.
    fn launch_adam_update_list(&mut self, op: &'static str, slots: &[AdamSlot]) -> Result<()>;
    /// The work of [`Device::momentum_update_list`] (and of [`Device::momentum_update`], one
    /// slot) for at most [`OPTIM_LIST_MAX`](crate::device::OPTIM_LIST_MAX) slots that share no
    /// buffer, operands checked: one launch, its errors naming `op` — callers use those
    /// methods.
    fn launch_momentum_update_list(
        &mut self,
        op: &'static str,
        c: &MomentumUpdate,
        slots: &[MomentumSlot],
    ) -> Result<()>;
    /// The work of [`Device::div_bwd`]; operands already validated by it — callers use `div_bwd`.
    fn launch_div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::max_bwd`]; operands already validated by it — callers use `max_bwd`.
    fn launch_max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::min_bwd`]; operands already validated by it — callers use `min_bwd`.
    fn launch_min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::gelu_bwd`]; operands already validated by it — callers use `gelu_bwd`.
    fn launch_gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::silu_bwd`]; operands already validated by it — callers use `silu_bwd`.
    fn launch_silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer>;
    /// The work of [`Device::point_act_bwd`]; operands already validated by it — callers use
    /// `point_act_bwd`.
    fn launch_point_act_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        act: crate::device::PointAct,
    ) -> Result<Buffer>;
    /// The work of [`Device::reduce_axis_sum`] (`mean` false) and [`Device::reduce_axis_mean`]
    /// (`mean` true), `op` the caller's name; operands already validated by them — callers use
    /// those. `x` viewed as `[outer, n, inner]`; `out_len = outer·inner`, checked.
    fn launch_reduce_axis(
        &mut self,
        op: &'static str,
        x: Buffer,
        dims: [usize; 3],
        out_len: usize,
        mean: bool,
    ) -> Result<Buffer>;
    /// The work of [`Device::add_bias_residual`]; operands already validated by it — callers
    /// use `add_bias_residual`.
    fn launch_add_bias_residual(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        r: Buffer,
        r_first: bool,
    ) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::add_bias`] (`act` `None`) and [`Device::add_bias_act`]; operands
    /// already validated by them, `n` the output length. Returns the sum and, with `act`, its
    /// activation.
    fn launch_add_bias(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        n: usize,
        act: Option<Act>,
    ) -> Result<(Buffer, Option<Buffer>)>;
    /// The work of [`Device::broadcast`]; operands already validated by it — callers
    /// use `broadcast`.
    /// `plan` is the checked broadcast of `x`'s dims.
    fn launch_broadcast(&mut self, x: Buffer, plan: &BroadcastPlan) -> Result<Buffer>;
    /// The work of [`Device::reduce_broadcast`]; operands already validated by it — callers
    /// use `reduce_broadcast`.
    /// `plan` is the checked broadcast from `from`.
    fn launch_reduce_broadcast(
        &mut self,
        g: Buffer,
        from: &[usize],
        plan: &BroadcastPlan,
    ) -> Result<Buffer>;
    /// The work of [`Device::permute`]; operands already validated by it — callers use `permute`.
    /// `plan` is the checked permutation.
    fn launch_permute(&mut self, x: Buffer, plan: &PermutePlan) -> Result<Buffer>;
    /// The work of [`Device::softmax_rows`] (`c` = 1) and [`Device::scaled_softmax_rows`];
    /// operands already validated by them — callers use those. Softmax of `c·x` per row.
    fn launch_softmax_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer>;
    /// The work of [`Device::log_softmax_rows`]; operands already validated by it — callers
    /// use `log_softmax_rows`.
    fn launch_log_softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer>;
    /// The work of [`Device::softmax_rows_bwd`] (`c` = 1) and
    /// [`Device::scaled_softmax_rows_bwd`]; operands already validated by them — callers use
    /// those. `c` times the softmax VJP per row.
    fn launch_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer>;
    /// The work of [`Device::log_softmax_rows_bwd`]; operands already validated by it — callers
    /// use `log_softmax_rows_bwd`.
    fn launch_log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer>;
    /// The work of [`Device::matmul_acc`]; operands already validated by it (`c` has `m·n`
    /// elements and is neither operand) — callers use `matmul_acc`.
    fn launch_matmul_acc(&mut self, c: Buffer, a: Buffer, b: Buffer, g: Gemm) -> Result<()>;
    /// The work of [`Device::matmul`] (one plain product), [`Device::bmm`] and
    /// [`Device::bmm_heads`], `op` the caller's name; operands already validated by them —
    /// callers use those. `lens` are [`check::gemm_lens`](super::check::gemm_lens)' (per
    /// product).
    fn launch_bmm(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        bt: Batch,
        g: Gemm,
        lens: [usize; 3],
    ) -> Result<Buffer>;
    /// The work of [`Device::norm_stats`]; operands already validated by it — callers
    /// use `norm_stats`.
    fn launch_norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer>;
    /// The work of [`Device::norm_moments`]; operands already validated by it — callers
    /// use `norm_moments`.
    fn launch_norm_moments(&mut self, x: Buffer, l: NormLayout) -> Result<Buffer>;
    /// The work of [`Device::norm_moments_bwd`]; operands already validated by it — callers
    /// use `norm_moments_bwd`.
    fn launch_norm_moments_bwd(
        &mut self,
        x: Buffer,
        moments: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer>;
    /// The work of [`Device::running_update_moments`]; operands already validated by it —
    /// callers use `running_update_moments`.
    fn launch_running_update_moments(
        &mut self,
        mean: Buffer,
        var: Buffer,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::running_inv_std`]; operands already validated by it — callers
    /// use `running_inv_std`.
    fn launch_running_inv_std(&mut self, var: Buffer, eps: f64) -> Result<Buffer>;
    /// The work of [`Device::norm_forward`] where it is one launch
    /// ([`NormLayout::fused_forward`]; the other layouts take `launch_norm_stats` and
    /// `launch_norm_apply`); operands already validated by it — callers use `norm_forward`.
    /// Where `l` is not [`centred`](NormLayout::centred), `beta` is a live stand-in (γ), never
    /// read.
    fn launch_norm_forward(
        &mut self,
        x: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
        eps: f32,
    ) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::norm_apply`]; operands already validated by it — callers
    /// use `norm_apply`. Where `l` is not [`centred`](NormLayout::centred), `beta` is a live
    /// stand-in (γ), never read.
    fn launch_norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer>;
    /// The work of [`Device::norm_bwd_x`]; operands already validated by it — callers
    /// use `norm_bwd_x`.
    fn launch_norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer>;
    /// The work of [`Device::norm_bwd_affine`]; operands already validated by it — callers
    /// use `norm_bwd_affine`.
    fn launch_norm_bwd_affine(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)>;
    /// The work of [`Device::masked_softmax_rows`]; operands already validated by it — callers
    /// use `masked_softmax_rows`.
    fn launch_masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        l: MaskedRows,
    ) -> Result<Buffer>;
    /// The work of [`Device::flash_attention`]; operands already validated by it — callers
    /// use `flash_attention`.
    fn launch_flash_fwd(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<(Buffer, Buffer)>;
    /// The forward's second pass under autocast (`TL_FA_OUT`): `O = Σ_j round(exp(s − lse))·v_j`
    /// from the lse a plain forward on the same (rounded) operands wrote; the work of
    /// [`Device::flash_attention_rounded`], operands already validated by it.
    fn launch_flash_out(&mut self, qkv: [Buffer; 3], lse: Buffer, f: &Flash) -> Result<Buffer>;
    /// The forward's statistics alone (`TL_FA_STATS`): lse as the plain forward writes it, no
    /// O (the first pass under autocast when nothing reads Ō); operands already validated by
    /// [`Device::flash_attention`].
    fn launch_flash_lse(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<Buffer>;
    /// The work of [`Device::flash_attention_bwd`]; operands already validated by it —
    /// callers use `flash_attention_bwd`.
    fn launch_flash_bwd(
        &mut self,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
        f: &Flash,
    ) -> Result<[Buffer; 3]>;
    /// The work of [`Device::im2col`]; operands already validated by it — callers use `im2col`.
    /// `lens` are [`Windows::check`]'s.
    fn launch_im2col(&mut self, x: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer>;
    /// The work of [`Device::conv_implicit`]; operands already validated by it — callers use
    /// `conv_implicit`. `lens` are [`Windows::check`]'s.
    fn launch_conv_implicit(
        &mut self,
        w: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer>;
    /// The work of [`Device::conv_implicit_dx`]; operands already validated by it — callers
    /// use `conv_implicit_dx`. `lens` are [`Windows::check`]'s.
    fn launch_conv_implicit_dx(
        &mut self,
        w: Buffer,
        g: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer>;
    /// The work of [`Device::conv_implicit_dw`]; operands already validated by it — callers
    /// use `conv_implicit_dw`. `lens` are [`Windows::check`]'s.
    fn launch_conv_implicit_dw(
        &mut self,
        g: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer>;
    /// The work of [`Device::col2im`]; operands already validated by it — callers use `col2im`.
    /// `lens` are [`Windows::check`]'s.
    fn launch_col2im(&mut self, cols: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer>;
    /// The work of [`Device::pool`]; operands already validated by it — callers use `pool`.
    /// `lens` are [`Windows::check`]'s.
    fn launch_pool(
        &mut self,
        x: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer>;
    /// The work of [`Device::pool_bwd`]; operands already validated by it — callers use `pool_bwd`.
    /// `lens` are [`Windows::check`]'s.
    fn launch_pool_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer>;
}

/// The work of the index primitives (`kernels/index.cu`), a part of [`Launch`] that each
/// device writes in its own `index` module. Operands arrive validated, as for [`Launch`];
/// call the [`Device`] methods, never these.
#[doc(hidden)]
pub trait LaunchIndex {
    /// The work of [`Device::gather_rows`]; operands already validated by it — callers
    /// use `gather_rows`.
    /// `idx` as [`index_check::row_indices`](super::index_check::row_indices) maps it.
    fn launch_gather_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer>;
    /// The work of [`Device::scatter_add_rows`]; operands already validated by it — callers
    /// use `scatter_add_rows`.
    /// `idx` as [`index_check::row_indices`](super::index_check::row_indices) maps it.
    fn launch_scatter_add_rows(
        &mut self,
        g: Buffer,
        rows: usize,
        cols: usize,
        idx: &[u32],
    ) -> Result<Buffer>;
    /// The work of [`Device::copy_range`]; operands already validated by it — callers
    /// use `copy_range`.
    fn launch_copy_range(&mut self, x: Buffer, start: usize, len: usize) -> Result<Buffer>;
    /// The work of [`Device::place_range`]; operands already validated by it — callers
    /// use `place_range`.
    fn launch_place_range(&mut self, g: Buffer, len: usize, start: usize) -> Result<Buffer>;
    /// The work of [`Device::concat`]; operands already validated by it — callers use `concat`.
    fn launch_concat(&mut self, a: Buffer, b: Buffer) -> Result<Buffer>;
    /// The work of [`Device::add_range`]; operands already validated by it — callers
    /// use `add_range`.
    fn launch_add_range(&mut self, x: Buffer, v: Buffer, start: usize) -> Result<Buffer>;
    /// The work of [`Device::cross_entropy_rows`]; operands already validated by it — callers
    /// use `cross_entropy_rows`.
    /// `labels` as [`index_check::labels`](super::index_check::labels) maps them.
    fn launch_cross_entropy_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer>;
    /// The work of [`Device::cross_entropy_rows_bwd`]; operands already validated by it — callers
    /// use `cross_entropy_rows_bwd`.
    /// `labels` as [`index_check::labels`](super::index_check::labels) maps them.
    fn launch_cross_entropy_rows_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        labels: Buffer,
    ) -> Result<Buffer>;
}
