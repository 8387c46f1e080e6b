//! The simulation device's [`Launch`] impl: the work of every primitive whose operands
//! [`Device`](crate::device::Device)'s provided methods have already checked (lengths, plans,
//! mapped indices arrive validated), each the twin of its CUDA kernel.

use super::launch::view;
use super::{SimDevice, activation, conv, flash, linalg, norm, pointwise, reduce, rows};
use crate::device::check::{BroadcastPlan, PermutePlan};
use crate::device::{
    Act, AdamSlot, Batch, BiasLayout, Buffer, Flash, Gemm, Launch, MaskedRows, MomentumSlot,
    MomentumUpdate, NormLayout, PointAct, PoolKind, WindowLens, Windows, split_tile,
};
use crate::{Error, Result};

impl Launch for SimDevice {
    fn launch_abs_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("abs_bwd", x, g, pointwise::abs_bwd)
    }

    fn launch_sqrt_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("sqrt_bwd", x, g, pointwise::sqrt_bwd)
    }

    fn launch_relu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("relu_bwd", x, g, pointwise::relu_bwd)
    }

    fn launch_clamp_bwd(&mut self, x: Buffer, g: Buffer, lo: f32, hi: f32) -> Result<Buffer> {
        self.map2("clamp_bwd", x, g, |x, g| pointwise::clamp_bwd(x, g, lo, hi))
    }

    fn launch_inv_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("inv_bwd", x, g, pointwise::inv_bwd)
    }

    fn launch_sigmoid_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("sigmoid_bwd", y, g, pointwise::sigmoid_bwd)
    }

    fn launch_tanh_bwd(&mut self, y: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("tanh_bwd", y, g, pointwise::tanh_bwd)
    }

    fn launch_softplus_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("softplus_bwd", x, g, pointwise::softplus_bwd)
    }

    fn launch_safe_log_bwd(&mut self, x: Buffer, g: Buffer, eps: f32) -> Result<Buffer> {
        self.map2("safe_log_bwd", x, g, |x, g| {
            pointwise::safe_log_bwd(x, g, eps)
        })
    }

    fn launch_add(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("add", a, b, |a, b| a + b)
    }

    fn launch_sub(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("sub", a, b, |a, b| a - b)
    }

    fn launch_mul(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("mul", a, b, |a, b| a * b)
    }

    fn launch_div(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("div", a, b, |a, b| a / b)
    }

    fn launch_max(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("max", a, b, pointwise::max)
    }

    fn launch_min(&mut self, a: Buffer, b: Buffer) -> Result<Buffer> {
        self.map2("min", a, b, pointwise::min)
    }

    fn launch_axpy(&mut self, a: Buffer, b: Buffer, c: f32) -> Result<Buffer> {
        self.map2("axpy", a, b, |a, b| pointwise::axpy(a, b, c))
    }

    fn launch_axpy_assign(&mut self, y: Buffer, c: f32, x: Buffer) -> Result<()> {
        self.axpy_in_place("axpy_assign", y, c, x)?;
        // One kernel on the device, like every other primitive (it was not counted before).
        self.traffic.launch();
        Ok(())
    }

    fn launch_axpy_assign_list(&mut self, c: f32, pairs: &[(Buffer, Buffer)]) -> Result<()> {
        const OP: &str = "axpy_assign_list";
        // Every operand is looked up before any y is written (a released one fails first).
        for &(y, x) in pairs {
            view(&self.live, OP, y)?;
            view(&self.live, OP, x)?;
        }
        for &(y, x) in pairs {
            self.axpy_in_place(OP, y, c, x)?;
        }
        // One kernel on the device for the whole list.
        self.traffic.launch();
        Ok(())
    }

    fn launch_adam_update_list(&mut self, op: &'static str, slots: &[AdamSlot]) -> Result<()> {
        // Every operand is looked up before anything is written (a released one fails first).
        for s in slots {
            for b in [s.w, s.m, s.v, s.g] {
                view(&self.live, op, b)?;
            }
        }
        for s in slots {
            self.update_in_place(op, [s.w, s.m, s.v], s.g, |[w, m, v], g| {
                let (w, m, v) = s.c.element(w, m, v, g);
                [w, m, v]
            })?;
        }
        // One kernel on the device for the whole list.
        self.traffic.launch();
        Ok(())
    }

    fn launch_momentum_update_list(
        &mut self,
        op: &'static str,
        c: &MomentumUpdate,
        slots: &[MomentumSlot],
    ) -> Result<()> {
        for s in slots {
            for b in [s.w, s.b, s.g] {
                view(&self.live, op, b)?;
            }
        }
        for s in slots {
            self.update_in_place(op, [s.w, s.b], s.g, |[w, b], g| {
                let (w, b) = c.element(w, b, g);
                [w, b]
            })?;
        }
        self.traffic.launch();
        Ok(())
    }

    fn launch_div_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("div_bwd", a, b, g, pointwise::div_bwd)
    }

    fn launch_max_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("max_bwd", a, b, g, pointwise::max_bwd)
    }

    fn launch_min_bwd(&mut self, a: Buffer, b: Buffer, g: Buffer) -> Result<(Buffer, Buffer)> {
        self.split3("min_bwd", a, b, g, pointwise::min_bwd)
    }

    fn launch_reduce_axis(
        &mut self,
        op: &'static str,
        x: Buffer,
        [outer, n, inner]: [usize; 3],
        out_len: usize,
        mean: bool,
    ) -> Result<Buffer> {
        self.launch(op, [x], out_len, |[x], out| {
            reduce::axis_sum(x, outer, n, inner, mean, out)
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
        // Per element: the sum `x + b[c]`, then the activation of the rounded sum (kernel
        // tl_add_bias in activation.cu).
        let sum = |x: &[f32], b: &[f32], i: usize| x[i] + b[layout.channel(i)];
        let Some(act) = act else {
            let out = self.launch("add_bias", [x, b], n, |[x, b], out| {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = sum(x, b, i);
                }
            })?;
            return Ok((out, None));
        };
        let f = match act {
            Act::Relu => pointwise::relu,
            Act::Gelu => activation::gelu,
        };
        let (pre, post) = self.launch2("add_bias_act", [x, b], n, |[x, b], pre, post| {
            for (i, (p, y)) in pre.iter_mut().zip(post.iter_mut()).enumerate() {
                *p = sum(x, b, i);
                *y = f(*p);
            }
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
        // The sum `x + b[c]`, then the residual add of the rounded sum (tl_add_bias_res).
        self.launch2(
            "add_bias_residual",
            [x, b, r],
            x.len(),
            |[x, b, r], pre, out| {
                for (i, (p, o)) in pre.iter_mut().zip(out.iter_mut()).enumerate() {
                    *p = x[i] + b[layout.channel(i)];
                    // In the `add`'s operand order (a NaN's payload follows the first).
                    let (a, c) = if r_first { (r[i], *p) } else { (*p, r[i]) };
                    *o = a + c;
                }
            },
        )
    }

    fn launch_broadcast(&mut self, x: Buffer, plan: &BroadcastPlan) -> Result<Buffer> {
        const OP: &str = "broadcast";
        let src = plan.source_indices()?;
        self.launch(OP, [x], plan.to_len, |[x], out| {
            for (o, &i) in out.iter_mut().zip(&src) {
                *o = x[i];
            }
        })
    }

    fn launch_reduce_broadcast(
        &mut self,
        g: Buffer,
        _from: &[usize],
        plan: &BroadcastPlan,
    ) -> Result<Buffer> {
        const OP: &str = "reduce_broadcast";
        let src = plan.source_indices()?;
        self.launch(OP, [g], plan.from_len, |[g], out| {
            // Per output element: its preimage in increasing row-major order of `g`, from 0.
            out.fill(0.0);
            for (&i, &v) in src.iter().zip(g) {
                out[i] += v;
            }
        })
    }

    fn launch_permute(&mut self, x: Buffer, plan: &PermutePlan) -> Result<Buffer> {
        const OP: &str = "permute";
        let src = plan.source_indices()?;
        self.launch(OP, [x], plan.len, |[x], out| {
            for (o, &i) in out.iter_mut().zip(&src) {
                *o = x[i];
            }
        })
    }

    fn launch_softmax_rows(
        &mut self,
        x: Buffer,
        _rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer> {
        self.launch("softmax_rows", [x], x.len(), |[x], out| {
            rows::softmax(x, cols.max(1), c, out)
        })
    }

    fn launch_log_softmax_rows(&mut self, x: Buffer, _rows: usize, cols: usize) -> Result<Buffer> {
        self.launch("log_softmax_rows", [x], x.len(), |[x], out| {
            rows::log_softmax(x, cols.max(1), out)
        })
    }

    fn launch_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        _rows: usize,
        cols: usize,
        c: f32,
    ) -> Result<Buffer> {
        self.launch("softmax_rows_bwd", [y, g], y.len(), |[y, g], out| {
            rows::softmax_bwd(y, g, cols.max(1), c, out)
        })
    }

    fn launch_log_softmax_rows_bwd(
        &mut self,
        y: Buffer,
        g: Buffer,
        _rows: usize,
        cols: usize,
    ) -> Result<Buffer> {
        self.launch("log_softmax_rows_bwd", [y, g], y.len(), |[y, g], out| {
            rows::log_softmax_bwd(y, g, cols.max(1), out)
        })
    }

    fn launch_matmul_acc(&mut self, c: Buffer, a: Buffer, b: Buffer, g: Gemm) -> Result<()> {
        const OP: &str = "matmul_acc";
        let prec = crate::precision::current();
        // One kernel on the device (the product and the add in its epilogue), two when the
        // product is split along k (the add is then the second kernel's).
        let (launches, work) = split_runs(1, g, prec);
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            // The product in a host temporary (the kernel keeps it in registers: no device
            // buffer).
            let mut p = vec![0.0f32; g.m * g.n];
            linalg::gemm_dense(
                view(&d.live, OP, a)?,
                view(&d.live, OP, b)?,
                g,
                1,
                &mut p,
                prec,
            );
            let cs = d.live.get_mut(&c.id()).ok_or(Error::Released {
                op: OP,
                buffer: c.id(),
                len: c.len(),
            })?;
            for (o, v) in cs.block[..c.len()].iter_mut().zip(p) {
                *o += v; // the kernel's __fadd_rn(out, sum)
            }
            d.traffic.launch();
            Ok(())
        })
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
        let count = bt.count;
        let prec = crate::precision::current();
        let (launches, work) = split_runs(count, g, prec);
        self.with_split_passes(op, launches, work.as_slice(), |d| {
            d.launch(op, [a, b], count * lo, |[a, b], out| {
                for z in 0..count {
                    let at = |which| linalg::At::of(bt, g, which, z);
                    linalg::gemm((a, at(0)), (b, at(1)), g, count, (out, at(2)), prec);
                }
            })
        })
    }

    fn launch_norm_stats(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        const OP: &str = "norm_stats";
        let (launches, work) = split_moment_passes(l, l.centred);
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            d.launch(OP, [x], 2 * l.groups, |[x], out| {
                norm::stats(x, l, eps, out)
            })
        })
    }

    fn launch_norm_moments(&mut self, x: Buffer, l: NormLayout) -> Result<Buffer> {
        const OP: &str = "norm_moments";
        let (launches, work) = split_moment_passes(l, true);
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            d.launch(OP, [x], 2 * l.groups, |[x], out| norm::moments(x, l, out))
        })
    }

    fn launch_norm_moments_bwd(
        &mut self,
        x: Buffer,
        moments: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_moments_bwd";
        let n = x.len();
        self.launch(OP, [x, moments, g], n, |[x, mo, g], dx| {
            norm::moments_bwd(x, mo, g, l, dx)
        })
    }

    fn launch_running_update_moments(
        &mut self,
        mean: Buffer,
        var: Buffer,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "running_update_moments";
        self.launch2(
            OP,
            [mean, var, moments],
            mean.len(),
            |[m, v, mo], om, ov| norm::running_update_moments(m, v, mo, momentum, count, om, ov),
        )
    }

    fn launch_running_inv_std(&mut self, var: Buffer, eps: f64) -> Result<Buffer> {
        self.map1("running_inv_std", var, |v| norm::running_inv_std(v, eps))
    }

    fn launch_norm_forward(
        &mut self,
        x: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
        eps: f32,
    ) -> Result<(Buffer, Buffer)> {
        // One kernel on the device (tl_norm_fwd): the statistics are not a launch of their own,
        // the apply below counts it.
        let st = self.run_body("norm_forward", [x], 2 * l.groups, |[x], out| {
            norm::stats(x, l, eps, out)
        })?;
        match self.launch_norm_apply(x, st, gamma, beta, l) {
            Ok(y) => Ok((y, st)),
            Err(e) => {
                crate::device::Device::release(self, st);
                Err(e)
            }
        }
    }

    fn launch_norm_apply(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_apply";
        let n = x.len();
        self.launch(OP, [x, stats, gamma, beta], n, |[x, st, ga, be], y| {
            norm::apply(x, st, ga, be, l, y)
        })
    }

    fn launch_norm_bwd_x(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_bwd_x";
        let n = x.len();
        // Split: tl_norm_split_bwd_sums into a workspace of two sums a chunk before
        // tl_norm_split_bwd_x.
        let (launches, work) = split_pair_sums(l, l.split_parts() > 1);
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            d.launch(OP, [x, stats, gamma, g], n, |[x, st, ga, g], dx| {
                norm::bwd_x(x, st, ga, g, l, dx)
            })
        })
    }

    fn launch_norm_bwd_affine(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_bwd_affine";
        // Split: tl_norm_split_affine_sums into a workspace of two sums a chunk before
        // tl_norm_split_affine_finish.
        let (launches, work) = split_pair_sums(l, l.affine_split());
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            d.launch2(OP, [x, stats, g], l.features(), |[x, st, g], dg, db| {
                norm::bwd_affine(x, st, g, l, dg, db)
            })
        })
    }

    fn launch_masked_softmax_rows(
        &mut self,
        x: Buffer,
        mask: &[bool],
        l: MaskedRows,
    ) -> Result<Buffer> {
        const OP: &str = "masked_softmax_rows";
        self.launch(OP, [x], x.len(), |[x], out| {
            norm::masked_softmax(x, mask, l, out)
        })
    }

    fn launch_flash_fwd(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<(Buffer, Buffer)> {
        let lens = [f.dims.q_len(), f.dims.rows_len()];
        let [o, lse] = self.launch_outs("flash_attention", qkv, lens, |[q, k, v], [o, lse]| {
            flash::forward(&flash::Qkv { q, k, v }, f, o, lse)
        })?;
        Ok((o, lse))
    }

    fn launch_flash_out(&mut self, qkv: [Buffer; 3], lse: Buffer, f: &Flash) -> Result<Buffer> {
        let [q, k, v] = qkv;
        let ins = [q, k, v, lse];
        let [o] = self.launch_outs(
            "flash_attention",
            ins,
            [f.dims.q_len()],
            |[q, k, v, l], [o]| flash::forward_out(&flash::Qkv { q, k, v }, f, l, o),
        )?;
        Ok(o)
    }

    fn launch_flash_lse(&mut self, qkv: [Buffer; 3], f: &Flash) -> Result<Buffer> {
        let [lse] = self.launch_outs(
            "flash_attention",
            qkv,
            [f.dims.rows_len()],
            |[q, k, v], [l]| flash::forward_lse(&flash::Qkv { q, k, v }, f, l),
        )?;
        Ok(lse)
    }

    fn launch_flash_bwd(
        &mut self,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        const OP: &str = "flash_attention_bwd";
        let [q, k, v] = qkv;
        let lens = [f.dims.q_len(), f.dims.rows_len()];
        let ins = [q, k, v, o, go, lse];
        let [dq, delta] = self.launch_outs(OP, ins, lens, |[q, k, v, o, go, lse], [dq, dl]| {
            flash::backward_q(&flash::Qkv { q, k, v }, o, go, lse, f, dq, dl)
        })?;
        let ins = [q, k, v, go, lse, delta];
        let kv_lens = [f.dims.kv_len(); 2];
        let kv = self.launch_outs(OP, ins, kv_lens, |[q, k, v, go, lse, dl], [dk, dv]| {
            flash::backward_kv(&flash::Qkv { q, k, v }, go, lse, dl, f, dk, dv)
        });
        crate::device::Device::release(self, delta);
        match kv {
            Ok([dk, dv]) => Ok([dq, dk, dv]),
            Err(e) => {
                crate::device::Device::release(self, dq);
                Err(e)
            }
        }
    }

    fn launch_im2col(&mut self, x: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer> {
        self.launch("im2col", [x], lens.cols_len(), |[x], out| {
            conv::im2col(x, w, out)
        })
    }

    fn launch_conv_implicit(
        &mut self,
        w: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        let y_len = win.batch * out_channels * lens.small;
        let prec = crate::precision::current();
        self.launch("conv_implicit", [w, x], y_len, |[w, x], out| {
            conv::conv_implicit(w, x, win, out_channels, out, prec)
        })
    }

    fn launch_conv_implicit_dx(
        &mut self,
        w: Buffer,
        g: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        let prec = crate::precision::current();
        self.launch("conv_implicit_dx", [w, g], lens.big_len(), |[w, g], out| {
            conv::conv_implicit_dx(w, g, win, out_channels, out, prec)
        })
    }

    fn launch_conv_implicit_dw(
        &mut self,
        g: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        lens: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit_dw";
        let dw_len = out_channels * win.channels * lens.kernel;
        let prec = crate::precision::current();
        let (launches, work) = split_runs(1, win.dw_gemm(out_channels), prec);
        self.with_split_passes(OP, launches, work.as_slice(), |d| {
            d.launch(OP, [g, x], dw_len, |[g, x], out| {
                conv::conv_implicit_dw(g, x, win, out_channels, out, prec)
            })
        })
    }

    fn launch_col2im(&mut self, cols: Buffer, w: &Windows, lens: WindowLens) -> Result<Buffer> {
        self.launch("col2im", [cols], lens.big_len(), |[c], out| {
            conv::col2im(c, w, out)
        })
    }

    fn launch_pool(
        &mut self,
        x: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.launch("pool", [x], lens.small_len(), |[x], out| {
            conv::pool(x, w, kind, out)
        })
    }

    fn launch_pool_bwd(
        &mut self,
        x: Buffer,
        g: Buffer,
        w: &Windows,
        kind: PoolKind,
        lens: WindowLens,
    ) -> Result<Buffer> {
        self.launch("pool_bwd", [x, g], lens.big_len(), |[x, g], out| {
            conv::pool_bwd(x, g, w, kind, out)
        })
    }

    fn launch_gelu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("gelu_bwd", x, g, activation::gelu_bwd)
    }

    fn launch_silu_bwd(&mut self, x: Buffer, g: Buffer) -> Result<Buffer> {
        self.map2("silu_bwd", x, g, activation::silu_bwd)
    }

    fn launch_point_act_bwd(&mut self, x: Buffer, g: Buffer, act: PointAct) -> Result<Buffer> {
        self.map2(act.kernels().1, x, g, |v, g| {
            super::point_act::backward(act, v, g)
        })
    }
}

/// What a product of `batch` matrices split along k adds on the CUDA device
/// (`CudaDevice::with_split_runs`): the second kernel, `tl_gemm_sum_splits`, and the runs'
/// workspace of `batch · splits · m·n` floats; nothing where it is not split.
fn split_runs(batch: usize, g: Gemm, prec: crate::Precision) -> (usize, Option<usize>) {
    let splits = g.k_splits_tiled(batch, split_tile(prec));
    let mn = g.m * g.n;
    if batch * mn > 0 && splits > 1 {
        (1, Some(batch * splits * mn))
    } else {
        (0, None)
    }
}

/// What split statistics add on the CUDA device (`split_moments`): `tl_norm_split_sq`, after
/// `tl_norm_split_mean` where `centred`, and two workspaces of `parts` sums a group (the
/// mean's taken even where it is not read); nothing where `l`'s sums are not split.
fn split_moment_passes(l: NormLayout, centred: bool) -> (usize, Vec<usize>) {
    let parts = l.split_parts();
    if parts > 1 {
        (1 + usize::from(centred), vec![parts * l.groups; 2])
    } else {
        (0, Vec::new())
    }
}

/// What a split pair of backward sums adds on the CUDA device (`split_bwd_x`,
/// `split_bwd_affine`): the sums' kernel and a workspace of two sums a chunk; nothing where
/// not `split`.
fn split_pair_sums(l: NormLayout, split: bool) -> (usize, Option<usize>) {
    if split {
        (1, Some(2 * l.split_parts() * l.groups))
    } else {
        (0, None)
    }
}
