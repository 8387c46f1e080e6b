//! `conv` and `convTranspose` (N-D, channels-first, zero padding, batched or not) as
//! `im2col`/`col2im` plus the tiled GEMM (SEMANTICS.md, "Layers").
//!
//! With the big block's column matrix `cols = im2col(big)` laid out `(C·K, N·L)` (C big
//! channels, K kernel cells, N batch, L small cells) and the weight `w` stored `(A, C·K)` (A
//! small channels):
//! - conv (x big, y small): `y' = w · cols(x)` (A, N·L), plus the bias, permuted to (N, A, L);
//!   `dw = g' · cols(x)ᵀ`, `db = Σ g'` per channel, `dx = col2im(wᵀ · g')`, with
//!   `g'` the cotangent permuted to (A, N·L);
//! - convTranspose (x small, y big): `y = col2im(wᵀ · x')` plus the bias, x' = x as (A, N·L);
//!   `dx = w · cols(g)` permuted to (N, A, L), `dw = x' · cols(g)ᵀ`, `db = Σ g` per channel.
//!
//! The permutes are skipped for N = 1, where (A, 1, L) and (1, A, L) share a layout.
//!
//! The conv forward takes the implicit-GEMM kernel instead ([`Device::conv_implicit`]: `y`
//! straight in (N, A, L), no column matrix, no permute), and the conv's input cotangent
//! likewise ([`Device::conv_implicit_dx`]: from `g` as it is, no `wᵀ·g'` columns, no
//! `col2im`), each where [`gates::conv_implicit`] says for its product: at least
//! [`gates::CONV_IMPLICIT_MIN_TILES`] output tiles, where in f32 they give the im2col path's bits. The
//! weight cotangent takes [`Device::conv_implicit_dw`] (from `g` and `x` as they are, no column
//! matrix) where the forward does: it splits `k = N·L` as the GEMM does, so it gives the im2col
//! path's bits at any size. convTranspose keeps `im2col`/`col2im`.
//!
//! Under autocast (bf16, TF32) all three run on the tensor cores, their implicit kernels
//! rounding the operands as they stage them ([`Device::conv_implicit`],
//! [`Device::conv_implicit_dw`], [`Device::conv_implicit_dx`]); the bias cotangent sums g
//! unrounded. Where the gate does not hold, the im2col GEMM runs on the tensor cores, rounding
//! as it stages.

use tl_ir::Op;
use tl_spec::Shape;

use super::{Scratch, with_scratch};
use crate::device::{BiasLayout, Buffer, Device, Gemm, Windows};
use crate::{AnyBuffer, Error, Result, gates};

/// The dims of one conv or convTranspose node.
struct Geo {
    win: Windows,
    /// Small-side channels (w dim 0).
    a: usize,
    /// Cells of one window.
    k: usize,
    /// Cells of the small block.
    l: usize,
}

impl Geo {
    /// From the weight, the input and the output shape (the shape rule has validated them).
    fn of(op: &Op, w: &Shape, x: &Shape, y: &Shape) -> Result<Geo> {
        let (stride, padding, transpose) = match op {
            Op::Conv { stride, padding } => (stride, padding, false),
            Op::ConvTranspose { stride, padding } => (stride, padding, true),
            _ => return Err(Error::kernel(op.name(), "not a conv op")),
        };
        let wd = w.dims();
        if wd.len() < 3 {
            return Err(Error::kernel(op.name(), format!("weight {w} has rank < 3")));
        }
        let d = wd.len() - 2;
        let (big, small) = if transpose { (y, x) } else { (x, y) };
        let split = |s: &Shape| -> Result<(usize, Vec<usize>)> {
            let sd = s.dims();
            match sd.len() {
                r if r == d + 1 => Ok((1, sd[1..].to_vec())),
                r if r == d + 2 => Ok((sd[0], sd[2..].to_vec())),
                _ => Err(Error::kernel(
                    op.name(),
                    format!("operand {s} does not fit weight {w}"),
                )),
            }
        };
        let (batch, big_s) = split(big)?;
        let (_, small_s) = split(small)?;
        let win = Windows {
            batch,
            channels: wd[1],
            big: big_s,
            small: small_s,
            kernel: wd[2..].to_vec(),
            stride: stride.clone(),
            padding: padding.clone(),
        }
        .normalize_strides();
        let lens = win.check(op.name())?;
        // The products' N·L columns: within the kernels' u32 even where the input has no
        // channel (the window's check bounds batch·channels·cells, 0 then).
        let cols = crate::device::check::product(op.name(), &[win.batch, lens.small])?;
        crate::abi::len_u32(op.name(), cols)?;
        Ok(Geo {
            win,
            a: wd[0],
            k: lens.kernel,
            l: lens.small,
        })
    }

    fn n(&self) -> usize {
        self.win.batch
    }

    fn ck(&self) -> usize {
        self.win.channels * self.k
    }

    /// A small operand (N, A, L) as (A, N·L): a fresh permute, or `s` itself for N = 1.
    fn small_to_rows<D: Device>(&self, dev: &mut D, sc: &mut Scratch, s: Buffer) -> Result<Buffer> {
        if self.n() == 1 {
            Ok(s)
        } else {
            Ok(sc.tmp(dev.permute(s, &[self.n(), self.a, self.l], &[1, 0, 2])?))
        }
    }

    /// (A, N·L) back to (N, A, L); `r` is a temporary (or returned for N = 1).
    fn rows_to_small<D: Device>(&self, dev: &mut D, r: Buffer) -> Result<Buffer> {
        if self.n() == 1 {
            Ok(r)
        } else {
            dev.permute(r, &[self.a, self.n(), self.l], &[1, 0, 2])
        }
    }
}

/// Forward of `conv` / `convTranspose` on operands `(w, b, x)` with output shape `shape`.
pub fn forward<D: Device>(dev: &mut D, op: &Op, x: &[&AnyBuffer], shape: &Shape) -> Result<Buffer> {
    forward_with(dev, op, x, shape, |dev, y, b, layout| {
        dev.add_bias(y, b, layout)
    })
}

/// The forward up to its bias, then `epilogue(dev, y, b, layout)`: `y` is the unbiased output
/// in the output's layout (N, ch, spatial), a temporary released afterwards, and `layout` says
/// how the bias `b` broadcasts over it. [`forward`] adds the bias; the CUDA tape's fused pair
/// adds it and applies the activation that follows ([`super::forward_then`]).
pub fn forward_with<D: Device, R>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    shape: &Shape,
    epilogue: impl FnOnce(&mut D, Buffer, Buffer, BiasLayout) -> Result<R>,
) -> Result<R> {
    let geo = Geo::of(op, x[0].shape(), x[2].shape(), shape)?;
    let (w, b, xb) = (x[0].buffer(), x[1].buffer(), x[2].buffer());
    let (n, a, l, ck) = (geo.n(), geo.a, geo.l, geo.ck());
    with_scratch(dev, |dev, sc| {
        if matches!(op, Op::Conv { .. }) && gates::conv_implicit(a, n * l) {
            // Under autocast the device rounds w and x as its tensor-core kernel stages them.
            let y = sc.tmp(dev.conv_implicit(w, xb, &geo.win, a)?);
            epilogue(dev, y, b, BiasLayout::new(n, a, l))
        } else if matches!(op, Op::Conv { .. }) {
            let cols = sc.tmp(dev.im2col(xb, &geo.win)?);
            let y = sc.tmp(dev.matmul(w, cols, Gemm::nn(a, ck, n * l))?);
            // (A, N·L) to (N, A, L) before the bias: the permute moves the same f32 sums.
            let y = if n == 1 {
                y
            } else {
                sc.tmp(geo.rows_to_small(dev, y)?)
            };
            epilogue(dev, y, b, BiasLayout::new(n, a, l))
        } else {
            let xr = geo.small_to_rows(dev, sc, xb)?;
            let cols = sc.tmp(dev.matmul(w, xr, Gemm::nn(ck, a, n * l).with_t(true, false))?);
            let y = sc.tmp(dev.col2im(cols, &geo.win)?);
            let c = geo.win.channels;
            let bl = shape.numel() / (n * c).max(1);
            epilogue(dev, y, b, BiasLayout::new(n, c, bl))
        }
    })
}

/// Backward of `conv` / `convTranspose`: cotangents of `(w, b, x)` where `needs` says.
pub fn backward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    y: &AnyBuffer,
    g: Buffer,
    needs: &[bool],
) -> Result<[Option<Buffer>; 3]> {
    let geo = Geo::of(op, x[0].shape(), x[2].shape(), y.shape())?;
    let (w, xb) = (x[0].buffer(), x[2].buffer());
    let (n, a, l, ck) = (geo.n(), geo.a, geo.l, geo.ck());
    let mut out: [Option<Buffer>; 3] = [None, None, None];
    let r = with_scratch(dev, |dev, sc| {
        if matches!(op, Op::Conv { .. }) {
            let big: usize = geo.win.big.iter().product();
            let dx_implicit =
                needs[2] && gates::conv_implicit(geo.win.channels, n.saturating_mul(big));
            // The weight cotangent follows the forward's gate (its column matrix is the
            // forward's operand); its kernel splits k as the GEMM does, so any size gives the
            // same bits.
            let dw_implicit = needs[0] && gates::conv_implicit(a, n * l);
            let gr = if (needs[0] && !dw_implicit) || needs[1] || (needs[2] && !dx_implicit) {
                geo.small_to_rows(dev, sc, g)?
            } else {
                g
            };
            if dw_implicit {
                out[0] = Some(dev.conv_implicit_dw(g, xb, &geo.win, a)?);
            } else if needs[0] {
                let cols = sc.tmp(dev.im2col(xb, &geo.win)?);
                out[0] = Some(dev.matmul(gr, cols, geo.win.dw_gemm(a))?);
            }
            if needs[1] {
                out[1] = Some(dev.reduce_axis_sum(gr, a, n * l, 1)?);
            }
            if dx_implicit {
                // Under autocast the device rounds w and g as its tensor-core kernel stages them.
                out[2] = Some(dev.conv_implicit_dx(w, g, &geo.win, a)?);
            } else if needs[2] {
                let dcols =
                    sc.tmp(dev.matmul(w, gr, Gemm::nn(ck, a, n * l).with_t(true, false))?);
                out[2] = Some(dev.col2im(dcols, &geo.win)?);
            }
        } else {
            let gcols = if needs[0] || needs[2] {
                sc.tmp(dev.im2col(g, &geo.win)?)
            } else {
                g
            };
            if needs[0] {
                let xr = geo.small_to_rows(dev, sc, xb)?;
                out[0] = Some(dev.matmul(xr, gcols, Gemm::nn(a, n * l, ck).with_t(false, true))?);
            }
            if needs[1] {
                let c = geo.win.channels;
                let bl = y.shape().numel() / (n * c).max(1);
                let per = sc.tmp(dev.reduce_axis_sum(g, n * c, bl, 1)?);
                out[1] = Some(dev.reduce_axis_sum(per, 1, n, c)?);
            }
            if needs[2] {
                let dr = dev.matmul(w, gcols, Gemm::nn(a, ck, n * l))?;
                if n == 1 {
                    out[2] = Some(dr);
                } else {
                    sc.tmp(dr);
                    out[2] = Some(geo.rows_to_small(dev, dr)?);
                }
            }
        }
        Ok(())
    });
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            dev.release_all(out.into_iter().flatten());
            Err(e)
        }
    }
}
