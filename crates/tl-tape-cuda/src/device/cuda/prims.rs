//! The CUDA device's [`Launch`] impl: the work of every primitive whose operands
//! [`Device`](crate::device::Device)'s provided methods have already checked (lengths, plans,
//! mapped indices arrive validated). Checks that need device state (a live buffer, the grid
//! limits of a launch) stay here.

use super::CudaDevice;
use super::driver::{self, Arg};
use super::launch::{blocks, dims8};
use crate::device::check::{self, BroadcastPlan, PermutePlan};
use crate::device::sim::reduce::axis_sum_by_block;
use crate::device::{
    Act, AdamSlot, Batch, BiasLayout, Buffer, Flash, Gemm, Launch, MaskedRows, MomentumSlot,
    MomentumUpdate, NormLayout, PointAct, PoolKind, WindowLens, Windows,
};
use crate::{Result, abi};

impl Launch for CudaDevice {
    fn launch_abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_abs_bwd", x, g, &[])
    }

    fn launch_sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_sqrt_bwd", x, g, &[])
    }

    fn launch_relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_relu_bwd", x, g, &[])
    }

    fn launch_clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map2("tl_clamp_bwd", x, g, &[Arg::F32(lo), Arg::F32(hi)])
    }

    fn launch_inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_inv_bwd", x, g, &[])
    }

    fn launch_sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_sigmoid_bwd", y, g, &[])
    }

    fn launch_tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_tanh_bwd", y, g, &[])
    }

    fn launch_softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_softplus_bwd", x, g, &[])
    }

    fn launch_safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer> {
        self.map2("tl_safe_log_bwd", x, g, &[Arg::F32(eps)])
    }

    fn launch_add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_add", a, b, &[])
    }

    fn launch_sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_sub", a, b, &[])
    }

    fn launch_mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_mul", a, b, &[])
    }

    fn launch_div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_div", a, b, &[])
    }

    fn launch_max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_max", a, b, &[])
    }

    fn launch_min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("tl_min", a, b, &[])
    }

    fn launch_axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer> {
        self.map2("tl_axpy", a, b, &[Arg::F32(c)])
    }

    fn launch_axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()> {
        const OP: &str = "axpy_assign";
        let n = y.len();
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

    fn launch_axpy_assign_list(&mut self, c: f32, pairs: &[(Buffer, Buffer)]) -> Result<()> {
        const OP: &str = "axpy_assign_list";
        let Some(&(y0, x0)) = pairs.first() else {
            return Ok(());
        };
        // Unused slots repeat the first pair's pointers with no elements (never read).
        let (py0, px0) = (self.ptr(OP, y0)?, self.ptr(OP, x0)?);
        let mut args = vec![Arg::F32(c), Arg::U32(pairs.len() as u32)];
        let mut longest = 0;
        for k in 0..crate::device::AXPY_LIST_MAX {
            match pairs.get(k) {
                Some(&(y, x)) => {
                    longest = longest.max(y.len());
                    let (py, px) = (self.ptr(OP, y)?, self.ptr(OP, x)?);
                    args.extend([Arg::Ptr(py), Arg::Ptr(px), Arg::U64(y.len() as u64)]);
                }
                None => args.extend([Arg::Ptr(py0), Arg::Ptr(px0), Arg::U64(0)]),
            }
        }
        if longest == 0 {
            return Ok(());
        }
        driver::enter()?;
        let grid = [super::launch::blocks(longest), pairs.len() as u32, 1];
        self.run(OP, "tl_axpy_assign_list", grid, &args)
    }

    fn launch_adam_update_list(&mut self, op: &'static str, slots: &[AdamSlot]) -> Result<()> {
        self.adam_update_list_impl(op, slots)
    }

    fn launch_momentum_update_list(
        &mut self,
        op: &'static str,
        c: &MomentumUpdate,
        slots: &[MomentumSlot],
    ) -> Result<()> {
        self.momentum_update_list_impl(op, c, slots)
    }

    fn launch_div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_div_bwd", a, b, g)
    }

    fn launch_max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_max_bwd", a, b, g)
    }

    fn launch_min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("tl_min_bwd", a, b, g)
    }

    fn launch_reduce_axis(
        &mut self,
        op: &'static str,
        x: Buffer,
        [outer, n, inner]: [usize; 3],
        out_len: usize,
        mean: bool,
    ) -> Result<Buffer> {
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
            if axis_sum_by_block(outer, n, inner) {
                // One block per output (at most AXIS_BLOCK_MAX_OUT of them).
                d.run(op, "tl_axis_sum_block", [out_len as u32, 1, 1], &args)
            } else {
                d.run(op, "tl_axis_sum", [blocks(out_len), 1, 1], &args)
            }
        })
    }

    fn launch_add_bias(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        n: usize,
        act: Option<Act>,
    ) -> Result<(Buffer, Option<Buffer>)> {
        let op = if act.is_some() {
            "add_bias_act"
        } else {
            "add_bias"
        };
        let (px, pb) = (self.ptr(op, x)?, self.ptr(op, b)?);
        // `ch` and `inner` of 0 only occur with n = 0 (no launch); 1 keeps the kernel's
        // divisors non-zero regardless.
        let extra = [
            Arg::U32(crate::abi::to_u32(op, "channels", layout.ch.max(1))?),
            Arg::U32(crate::abi::to_u32(op, "inner", layout.inner.max(1))?),
        ];
        let Some(act) = act else {
            let out = self.with_out(op, n, |d, o| {
                let ptrs = [Arg::Ptr(px), Arg::Ptr(pb), Arg::Ptr(o)];
                d.grid_stride(op, "tl_add_bias", n, &ptrs, &extra)
            })?;
            return Ok((out, None));
        };
        let [pre, post] = self.with_outs::<2>(op, n, |d, [pre, post]| {
            let ptrs = [Arg::Ptr(px), Arg::Ptr(pb), Arg::Ptr(pre), Arg::Ptr(post)];
            let extra = [extra[0], extra[1], Arg::U32(Act::code(Some(act)))];
            d.grid_stride(op, "tl_add_bias_act", n, &ptrs, &extra)
        })?;
        Ok((pre, Some(post)))
    }

    fn launch_add_bias_residual(
        &mut self,
        x: Buffer,
        b: Buffer,
        layout: BiasLayout,
        r: Buffer,
        r_first: bool,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "add_bias_residual";
        let ins = [self.ptr(OP, x)?, self.ptr(OP, b)?, self.ptr(OP, r)?];
        // As in `launch_add_bias`: divisors of at least 1 (0 only with n = 0, no launch).
        let extra = [
            Arg::U32(crate::abi::to_u32(OP, "channels", layout.ch.max(1))?),
            Arg::U32(crate::abi::to_u32(OP, "inner", layout.inner.max(1))?),
            Arg::U32(u32::from(r_first)),
        ];
        let n = x.len();
        let [pre, out] = self.with_outs::<2>(OP, n, |d, [pre, out]| {
            let ptrs = [ins[0], ins[1], ins[2], pre, out].map(Arg::Ptr);
            d.grid_stride(OP, "tl_add_bias_res", n, &ptrs, &extra)
        })?;
        Ok((pre, out))
    }

    fn launch_broadcast(&mut self, x: Buffer, plan: &BroadcastPlan) -> Result<Buffer> {
        const OP: &str = "broadcast";
        self.gather(OP, x, &plan.to, &plan.src_strides, plan.to_len)
    }

    fn launch_reduce_broadcast(
        &mut self,
        g: Buffer,
        from: &[usize],
        plan: &BroadcastPlan,
    ) -> Result<Buffer> {
        const OP: &str = "reduce_broadcast";
        let pg = self.ptr(OP, g)?;
        let to = &plan.to[..];
        let rank = to.len();
        let offset = rank - from.len();
        if self.deterministic() {
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

    fn launch_permute(&mut self, x: Buffer, plan: &PermutePlan) -> Result<Buffer> {
        const OP: &str = "permute";
        self.gather(OP, x, &plan.out, &plan.src_strides, plan.len)
    }

    fn launch_softmax_rows(
        &mut self,
        x: Buffer,
        rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer> {
        self.rows("tl_softmax_rows", &[x], rows, cols, &[Arg::F32(c)])
    }

    fn launch_log_softmax_rows(&mut self, x: Buffer, rows: usize, cols: usize) -> Result<Buffer> {
        self.rows("tl_log_softmax_rows", &[x], rows, cols, &[])
    }

    fn launch_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer> {
        self.rows("tl_softmax_rows_bwd", &[y, g], rows, cols, &[Arg::F32(c)])
    }

    fn launch_log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        self.rows("tl_log_softmax_rows_bwd", &[y, g], rows, cols, &[])
    }

    fn launch_matmul_acc(&mut self, c: Buffer, a: Buffer, b: Buffer, g: Gemm) -> Result<()> {
        self.gemm_into(c, a, b, g)
    }

    fn launch_bmm(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        bt: Batch,
        g: Gemm,
        [_, _, lo]: [usize; 3],
    ) -> Result<Buffer> {
        self.with_out(op, bt.count * lo, |d, out| {
            d.gemm_launch(op, a, b, out, false, bt, g)
        })
    }

    fn launch_norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        self.norm_stats_impl(x, l, eps)
    }

    fn launch_norm_moments(&mut self, x: Buffer, l: NormLayout) -> Result<Buffer> {
        self.norm_moments_impl(x, l)
    }

    fn launch_norm_moments_bwd(
        &mut self,
        x: Buffer,
        moments: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        self.norm_moments_bwd_impl(x, moments, g, l)
    }

    fn launch_running_update_moments(
        &mut self,
        mean: Buffer,
        var: Buffer,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<(Buffer, Buffer)> {
        self.running_update_moments_impl(mean, var, moments, momentum, count)
    }

    fn launch_running_inv_std(&mut self, var: Buffer, eps: f64) -> Result<Buffer> {
        self.map1("tl_running_inv_std", var, &[Arg::F64(eps)])
    }

    fn launch_norm_forward(
        &mut self,
        x: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
        eps: f32,
    ) -> Result<(Buffer, Buffer)> {
        self.norm_forward_impl(x, gamma, beta, l, eps)
    }

    fn launch_norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        self.norm_apply_impl(x, stats, gamma, beta, l)
    }

    fn launch_norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        self.norm_bwd_x_impl(x, stats, gamma, g, l)
    }

    fn launch_norm_bwd_affine(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)> {
        self.norm_bwd_affine_impl(x, stats, g, l)
    }

    fn launch_masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        l: MaskedRows,
    ) -> Result<Buffer> {
        self.masked_softmax_rows_impl(x, mask, l)
    }

    fn launch_flash_fwd(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<(Buffer, Buffer)> {
        self.flash_fwd_impl(qkv, f)
    }

    fn launch_flash_out(&mut self, qkv: [Buffer; 3], lse: Buffer, f: &Flash) -> Result<Buffer> {
        self.flash_pass_impl(qkv, Some(lse), f)
    }

    fn launch_flash_lse(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<Buffer> {
        self.flash_pass_impl(qkv, None, f)
    }

    fn launch_flash_bwd(
        &mut self,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        self.flash_bwd_impl(qkv, o, lse, go, f)
    }

    fn launch_im2col(&mut self, x: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer> {
        self.im2col_impl(x, w, lens)
    }

    fn launch_conv_implicit(
        &mut self,
        w: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.conv_implicit_impl(w, x, win, out_channels, lens)
    }

    fn launch_conv_implicit_dx(
        &mut self,
        w: Buffer,
        g: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.conv_implicit_dx_impl(w, g, win, out_channels, lens)
    }

    fn launch_conv_implicit_dw(
        &mut self,
        g: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.conv_implicit_dw_impl(g, x, win, out_channels, lens)
    }

    fn launch_col2im(&mut self, cols: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer> {
        self.col2im_impl(cols, w, lens)
    }

    fn launch_pool(
        &mut self,
        x: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.pool_impl(x, w, kind, lens)
    }

    fn launch_pool_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.pool_bwd_impl(x, g, w, kind, lens)
    }

    fn launch_gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_gelu_bwd", x, g, &[])
    }

    fn launch_silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tl_silu_bwd", x, g, &[])
    }

    fn launch_point_act_bwd(&mut self, x: Buffer, g: Buffer, act: PointAct) -> Result<Buffer> {
        let (_, kernel, param) = act.kernels();
        match param {
            Some(p) => self.map2(kernel, x, g, &[Arg::F32(p)]),
            None => self.map2(kernel, x, g, &[]),
        }
    }
}
