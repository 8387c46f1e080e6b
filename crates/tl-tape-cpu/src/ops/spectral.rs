//! `spectralConv1dRfft`: the FNO spectral convolution.
//!
//! For `f32` and `f64` (every scalar type the tapes use) the kernel is `fft`: a real FFT of each
//! channel through `realfft`/`rustfft` (planned in `tl_fft`), the per-mode complex channel mix,
//! inverse real FFTs. Any other `Scalar` type falls back to a direct DFT over the kept modes only
//! (`Plan`: cost `2·N·M·W` per transform, cos/sin tables built once per call from the N twiddles of
//! the grid, angle index `(k·t) mod N`, the inverse's `α_k/N` folded in). Both were measured at FNO
//! sizes (`benches/spectral.rs`): the FFT ties or wins from grid 64 × width 64 on and is 1.35–2.2×
//! faster at grid 256; figures in docs/semantics.md ("## Spectral").

mod fft;

use std::any::Any;

use smallvec::smallvec;
use tl_fft::Real;
use tl_ir::Op;
use tl_spec::alloc::{try_collect, try_with_capacity, try_zeroed};
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

/// The op's name, for the allocation checks of the helpers that do not take the op.
const OP: &str = "spectralConv1dRfft";

/// Forward value of `spectralConv1dRfft` on `(x, wRe, wIm)`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let (n, w, m) = dims(op, x)?;
    if let Some(a) = cast_args::<T, f32>(x) {
        return cast_back(fft_forward_f32(&a, n, w, m)?);
    }
    if let Some(a) = cast_args::<T, f64>(x) {
        return cast_back(fft_forward_f64(&a, n, w, m)?);
    }
    direct_forward(x, n, w, m)
}

/// Forward value through the direct DFT over the kept modes, whatever the scalar type: the
/// fallback [`forward`] takes for types other than f32/f64, public so that `benches/spectral.rs`
/// can compare it with the FFT path.
pub fn forward_direct<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let (n, w, m) = dims(op, x)?;
    direct_forward(x, n, w, m)
}

/// The direct-DFT forward (the fallback for scalar types other than f32/f64).
fn direct_forward<T: Scalar>(x: &[&Tensor<T>], n: usize, w: usize, m: usize) -> Result<Tensor<T>> {
    let plan = Plan::new(n, w, m)?;
    let (wr, wi) = (x[1].data(), x[2].data());
    let mut y = try_zeroed(OP, "output", x[0].numel())?;
    let mut s = plan.scratch()?;
    for (xs, ys) in x[0]
        .data()
        .chunks_exact(plan.slice())
        .zip(y.chunks_exact_mut(plan.slice()))
    {
        plan.rfft(xs, &mut s.ar, &mut s.ai);
        plan.mix(&s.ar, &s.ai, wr, wi, &mut s.br, &mut s.bi);
        plan.irfft(&s.br, &s.bi, ys);
    }
    tensor(x[0].shape().clone(), y)
}

/// Operand cotangents `(dx, dwRe, dwIm)` of `spectralConv1dRfft` for the output cotangent `g`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    _y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let (n, w, m) = dims(op, x)?;
    check_shape(op, "cotangent", g, x[0].shape())?;
    if let (Some(a), Some(g)) = (cast_args::<T, f32>(x), cast_args::<T, f32>(&[g])) {
        return fft_backward_f32(&a, g[0], n, w, m)?
            .into_iter()
            .map(opt_back)
            .collect();
    }
    if let (Some(a), Some(g)) = (cast_args::<T, f64>(x), cast_args::<T, f64>(&[g])) {
        return fft_backward_f64(&a, g[0], n, w, m)?
            .into_iter()
            .map(opt_back)
            .collect();
    }
    direct_backward(x, g, n, w, m)
}

/// The direct-DFT backward (the fallback for scalar types other than f32/f64).
fn direct_backward<T: Scalar>(
    x: &[&Tensor<T>],
    g: &Tensor<T>,
    n: usize,
    w: usize,
    m: usize,
) -> Result<Grads<T>> {
    let plan = Plan::new(n, w, m)?;
    let (wr, wi) = (x[1].data(), x[2].data());
    let mut dx = try_zeroed(OP, "cotangent", x[0].numel())?;
    let mut dwr = try_zeroed(OP, "cotangent", wr.len())?;
    let mut dwi = try_zeroed(OP, "cotangent", wi.len())?;
    let mut s = plan.scratch()?;
    let slices = x[0]
        .data()
        .chunks_exact(plan.slice())
        .zip(g.data().chunks_exact(plan.slice()))
        .zip(dx.chunks_exact_mut(plan.slice()));
    for ((xs, gs), dxs) in slices {
        plan.rfft(xs, &mut s.ar, &mut s.ai);
        plan.irfft_t(gs, &mut s.br, &mut s.bi);
        plan.mix_t_w(&s.ar, &s.ai, &s.br, &s.bi, &mut dwr, &mut dwi);
        plan.mix_t_x(&s.br, &s.bi, wr, wi, &mut s.ar, &mut s.ai);
        plan.rfft_t(&s.ar, &s.ai, dxs);
    }
    Ok(smallvec![
        Some(tensor(x[0].shape().clone(), dx)?),
        Some(tensor(x[1].shape().clone(), dwr)?),
        Some(tensor(x[2].shape().clone(), dwi)?),
    ])
}

/// (grid, width, modes), validated (the shape rule ran at record time; what indexing relies on
/// is checked again here).
fn dims<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(usize, usize, usize)> {
    let Op::SpectralConv1dRfft { modes } = *op else {
        return Err(wrong_family(op, "spectral"));
    };
    let (n, w) = match *x[0].shape().dims() {
        [n, w] | [_, n, w] => (n, w),
        _ => (0, 0),
    };
    if n == 0 || modes == 0 || modes > n / 2 + 1 {
        return Err(SpecError::param(
            op.name(),
            format!("modes {modes} invalid for x {}", x[0].shape()),
        )
        .into());
    }
    let ws = tl_spec::Shape::new(&[modes, w, w]);
    check_shape(op, "wRe", x[1], &ws)?;
    check_shape(op, "wIm", x[2], &ws)?;
    Ok((n, w, modes))
}

/// The operands as `Tensor<F>` when `T` is `F`.
fn cast_args<'a, T: Scalar, F: Scalar>(x: &[&'a Tensor<T>]) -> Option<Vec<&'a Tensor<F>>> {
    x.iter()
        .map(|t| (*t as &dyn Any).downcast_ref::<Tensor<F>>())
        .collect()
}

/// A `Tensor<F>` as the `Tensor<T>` it is (`T` is `F`).
fn cast_back<T: Scalar, F: Scalar>(t: Tensor<F>) -> Result<Tensor<T>> {
    let b: Box<dyn Any> = Box::new(t);
    b.downcast::<Tensor<T>>()
        .map(|b| *b)
        .map_err(|_| SpecError::param("spectralConv1dRfft", "scalar type mismatch").into())
}

fn opt_back<T: Scalar, F: Scalar>(t: Option<Tensor<F>>) -> Result<Option<Tensor<T>>> {
    t.map(cast_back).transpose()
}

// The FFT paths as plain functions of f32 and f64, so that they are compiled once, here: a
// generic one would be compiled again (rustfft's planner and every algorithm it may pick, for
// both types) in every crate that instantiates `forward`/`backward`, half of each test and
// example binary's code (docs/verification.md, "Generic code compiled once").

#[inline(never)]
fn fft_forward_f32(x: &[&Tensor<f32>], n: usize, w: usize, m: usize) -> Result<Tensor<f32>> {
    fft_forward(x, n, w, m)
}

#[inline(never)]
fn fft_forward_f64(x: &[&Tensor<f64>], n: usize, w: usize, m: usize) -> Result<Tensor<f64>> {
    fft_forward(x, n, w, m)
}

#[inline(never)]
fn fft_backward_f32(
    x: &[&Tensor<f32>],
    g: &Tensor<f32>,
    n: usize,
    w: usize,
    m: usize,
) -> Result<Grads<f32>> {
    fft_backward(x, g, n, w, m)
}

#[inline(never)]
fn fft_backward_f64(
    x: &[&Tensor<f64>],
    g: &Tensor<f64>,
    n: usize,
    w: usize,
    m: usize,
) -> Result<Grads<f64>> {
    fft_backward(x, g, n, w, m)
}

fn fft_forward<F: Scalar + Real>(
    x: &[&Tensor<F>],
    n: usize,
    w: usize,
    m: usize,
) -> Result<Tensor<F>> {
    let mut y = try_zeroed(OP, "output", x[0].numel())?;
    fft::forward(x[0].data(), x[1].data(), x[2].data(), (n, w, m), &mut y)?;
    tensor(x[0].shape().clone(), y)
}

fn fft_backward<F: Scalar + Real>(
    x: &[&Tensor<F>],
    g: &Tensor<F>,
    n: usize,
    w: usize,
    m: usize,
) -> Result<Grads<F>> {
    let mut dx = try_zeroed(OP, "cotangent", x[0].numel())?;
    let mut dwr = try_zeroed(OP, "cotangent", x[1].numel())?;
    let mut dwi = try_zeroed(OP, "cotangent", x[2].numel())?;
    let (xd, wr, wi) = (x[0].data(), x[1].data(), x[2].data());
    fft::backward(xd, wr, wi, g.data(), (n, w, m), &mut dx, &mut dwr, &mut dwi)?;
    Ok(smallvec![
        Some(tensor(x[0].shape().clone(), dx)?),
        Some(tensor(x[1].shape().clone(), dwr)?),
        Some(tensor(x[2].shape().clone(), dwi)?),
    ])
}

/// Sizes and twiddle tables of one call of the direct-DFT fallback.
struct Plan<T> {
    n: usize,
    m: usize,
    w: usize,
    /// `cos(2πkt/N)`, row k (M×N).
    cos: Vec<T>,
    /// `sin(2πkt/N)`, row k, exactly 0 on the DC and Nyquist rows.
    sin: Vec<T>,
    /// `cos` scaled by `α_k/N` (the inverse's weights).
    icos: Vec<T>,
    /// `sin` scaled by `α_k/N`.
    isin: Vec<T>,
}

/// Per-slice spectra (M×W each), reused across batch slices.
struct Scratch<T> {
    ar: Vec<T>,
    ai: Vec<T>,
    br: Vec<T>,
    bi: Vec<T>,
}

impl<T: Scalar> Plan<T> {
    fn new(n: usize, w: usize, modes: usize) -> Result<Self> {
        let turn = |j| (2.0 * std::f64::consts::PI * j as f64 / n as f64).sin_cos();
        let twiddle = try_collect(OP, "twiddles", n, (0..n).map(turn))?;
        let table = || try_with_capacity(OP, "DFT table", modes.saturating_mul(n));
        let mut plan = Plan {
            n,
            m: modes,
            w,
            cos: table()?,
            sin: table()?,
            icos: table()?,
            isin: table()?,
        };
        for k in 0..modes {
            let edge = k == 0 || 2 * k == n;
            let a = if edge { 1.0 } else { 2.0 } / n as f64;
            for t in 0..n {
                let (s, c) = twiddle[(k * t) % n];
                let s = if edge { 0.0 } else { s };
                plan.cos.push(T::lit(c));
                plan.sin.push(T::lit(s));
                plan.icos.push(T::lit(a * c));
                plan.isin.push(T::lit(a * s));
            }
        }
        Ok(plan)
    }

    /// Elements of one batch slice (N·W, at least 1 so chunking never sees 0).
    fn slice(&self) -> usize {
        (self.n * self.w).max(1)
    }

    fn scratch(&self) -> Result<Scratch<T>> {
        let z = || try_zeroed(OP, "spectrum", self.m * self.w);
        Ok(Scratch {
            ar: z()?,
            ai: z()?,
            br: z()?,
            bi: z()?,
        })
    }

    /// `re[k,·] = Σ_t cos[k,t]·x[t,·]`, `im[k,·] = −Σ_t sin[k,t]·x[t,·]`.
    fn rfft(&self, x: &[T], re: &mut [T], im: &mut [T]) {
        let (n, w) = (self.n, self.w.max(1));
        for (k, (r, i)) in re
            .chunks_exact_mut(w)
            .zip(im.chunks_exact_mut(w))
            .enumerate()
        {
            r.fill(T::zero());
            i.fill(T::zero());
            let rows = self.cos[k * n..(k + 1) * n].iter().zip(&self.sin[k * n..]);
            for ((&c, &s), xt) in rows.zip(x.chunks_exact(w)) {
                for ((r, i), &v) in r.iter_mut().zip(i.iter_mut()).zip(xt) {
                    *r += c * v;
                    *i -= s * v;
                }
            }
        }
    }

    /// Transpose of [`Plan::rfft`]: `dx[t,·] = Σ_k cos[k,t]·re[k,·] − sin[k,t]·im[k,·]`.
    fn rfft_t(&self, re: &[T], im: &[T], dx: &mut [T]) {
        let (n, w) = (self.n, self.w.max(1));
        dx.fill(T::zero());
        for (k, (r, i)) in re.chunks_exact(w).zip(im.chunks_exact(w)).enumerate() {
            let rows = self.cos[k * n..(k + 1) * n].iter().zip(&self.sin[k * n..]);
            for ((&c, &s), d) in rows.zip(dx.chunks_exact_mut(w)) {
                for ((d, &r), &i) in d.iter_mut().zip(r).zip(i) {
                    *d += c * r - s * i;
                }
            }
        }
    }

    /// `y[t,·] = Σ_k icos[k,t]·zr[k,·] − isin[k,t]·zi[k,·]`.
    fn irfft(&self, zr: &[T], zi: &[T], y: &mut [T]) {
        let (n, w) = (self.n, self.w.max(1));
        for (t, yt) in y.chunks_exact_mut(w).enumerate() {
            yt.fill(T::zero());
            for (k, (r, i)) in zr.chunks_exact(w).zip(zi.chunks_exact(w)).enumerate() {
                let (c, s) = (self.icos[k * n + t], self.isin[k * n + t]);
                for ((y, &r), &i) in yt.iter_mut().zip(r).zip(i) {
                    *y += c * r - s * i;
                }
            }
        }
    }

    /// Transpose of [`Plan::irfft`]: `gr[k,·] = Σ_t icos[k,t]·g[t,·]`, `gi = −Σ_t isin·g`.
    fn irfft_t(&self, g: &[T], gr: &mut [T], gi: &mut [T]) {
        let (n, w) = (self.n, self.w.max(1));
        for (k, (r, i)) in gr
            .chunks_exact_mut(w)
            .zip(gi.chunks_exact_mut(w))
            .enumerate()
        {
            r.fill(T::zero());
            i.fill(T::zero());
            let rows = self.icos[k * n..(k + 1) * n]
                .iter()
                .zip(&self.isin[k * n..]);
            for ((&c, &s), gt) in rows.zip(g.chunks_exact(w)) {
                for ((r, i), &v) in r.iter_mut().zip(i.iter_mut()).zip(gt) {
                    *r += c * v;
                    *i -= s * v;
                }
            }
        }
    }

    /// `z[k,·] = Σ_c x[k,c]·w[k,c,·]` in complex arithmetic.
    fn mix(&self, xr: &[T], xi: &[T], wr: &[T], wi: &[T], zr: &mut [T], zi: &mut [T]) {
        let w = self.w.max(1);
        let ww = w * w;
        let per_mode = xr.chunks_exact(w).zip(xi.chunks_exact(w));
        let out = zr.chunks_exact_mut(w).zip(zi.chunks_exact_mut(w));
        let weights = wr.chunks_exact(ww).zip(wi.chunks_exact(ww));
        for (((a, b), (zr, zi)), (wr, wi)) in per_mode.zip(out).zip(weights) {
            zr.fill(T::zero());
            zi.fill(T::zero());
            for (((&a, &b), p), q) in a
                .iter()
                .zip(b)
                .zip(wr.chunks_exact(w))
                .zip(wi.chunks_exact(w))
            {
                for (((zr, zi), &p), &q) in zr.iter_mut().zip(zi.iter_mut()).zip(p).zip(q) {
                    *zr += a * p - b * q;
                    *zi += a * q + b * p;
                }
            }
        }
    }

    /// Transpose of [`Plan::mix`] in x: `gx[k,c] = Σ_o gz[k,o]·conj(w[k,c,o])`.
    fn mix_t_x(&self, gr: &[T], gi: &[T], wr: &[T], wi: &[T], xr: &mut [T], xi: &mut [T]) {
        let w = self.w.max(1);
        let ww = w * w;
        let per_mode = gr.chunks_exact(w).zip(gi.chunks_exact(w));
        let out = xr.chunks_exact_mut(w).zip(xi.chunks_exact_mut(w));
        let weights = wr.chunks_exact(ww).zip(wi.chunks_exact(ww));
        for (((a, b), (xr, xi)), (wr, wi)) in per_mode.zip(out).zip(weights) {
            let rows = xr.iter_mut().zip(xi.iter_mut());
            for ((xr, xi), (p, q)) in rows.zip(wr.chunks_exact(w).zip(wi.chunks_exact(w))) {
                let (mut sr, mut si) = (T::zero(), T::zero());
                for (((&a, &b), &p), &q) in a.iter().zip(b).zip(p).zip(q) {
                    sr += a * p + b * q;
                    si += b * p - a * q;
                }
                *xr = sr;
                *xi = si;
            }
        }
    }

    /// Transpose of [`Plan::mix`] in w, accumulated: `dw[k,c,o] += x[k,c]·conj-pairing gz[k,o]`.
    fn mix_t_w(&self, xr: &[T], xi: &[T], gr: &[T], gi: &[T], dwr: &mut [T], dwi: &mut [T]) {
        let w = self.w.max(1);
        let ww = w * w;
        let per_mode = xr.chunks_exact(w).zip(xi.chunks_exact(w));
        let grads = gr.chunks_exact(w).zip(gi.chunks_exact(w));
        let out = dwr.chunks_exact_mut(ww).zip(dwi.chunks_exact_mut(ww));
        for (((a, b), (p, q)), (dr, di)) in per_mode.zip(grads).zip(out) {
            let rows = dr.chunks_exact_mut(w).zip(di.chunks_exact_mut(w));
            for ((&a, &b), (dr, di)) in a.iter().zip(b).zip(rows) {
                for (((dr, di), &p), &q) in dr.iter_mut().zip(di.iter_mut()).zip(p).zip(q) {
                    *dr += a * p + b * q;
                    *di += a * q - b * p;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fft_path_and_direct_fallback_agree_forward_and_backward() {
        for (b, n, w) in [
            (1usize, 8usize, 3usize),
            (2, 9, 2),
            (1, 1, 2),
            (1, 2, 1),
            (2, 16, 4),
        ] {
            for m in 1..=n / 2 + 1 {
                let f = |len: usize, s: usize| {
                    (0..len)
                        .map(|i| ((i * (2 * s + 3) + s) as f64 * 0.71).sin())
                        .collect()
                };
                let x = Tensor::<f64>::new([b, n, w], f(b * n * w, 1)).unwrap();
                let wr = Tensor::<f64>::new([m, w, w], f(m * w * w, 2)).unwrap();
                let wi = Tensor::<f64>::new([m, w, w], f(m * w * w, 3)).unwrap();
                let g = Tensor::<f64>::new([b, n, w], f(b * n * w, 4)).unwrap();
                let args = [&x, &wr, &wi];
                let close = |p: &Tensor<f64>, q: &Tensor<f64>| {
                    let e = p.data().iter().zip(q.data()).map(|(a, b)| (a - b).abs());
                    assert!(
                        e.fold(0.0, f64::max) < 1e-12,
                        "grid {n} modes {m}: {p:?} {q:?}"
                    );
                };
                close(
                    &fft_forward(&args, n, w, m).unwrap(),
                    &direct_forward(&args, n, w, m).unwrap(),
                );
                let a = fft_backward(&args, &g, n, w, m).unwrap();
                let d = direct_backward(&args, &g, n, w, m).unwrap();
                for (p, q) in a.iter().zip(&d) {
                    close(p.as_ref().unwrap(), q.as_ref().unwrap());
                }
            }
        }
    }

    #[test]
    fn all_modes_with_identity_weights_reproduce_x_on_even_and_odd_grids() {
        for (n, w) in [(6usize, 2usize), (7, 3), (1, 2)] {
            let m = n / 2 + 1;
            let x = Tensor::<f64>::from_fn([2, n, w], |i| ((i * 37 % 11) as f64) - 5.0);
            let wr = Tensor::<f64>::from_fn([m, w, w], |i| {
                if i % (w * w) % (w + 1) == 0 { 1.0 } else { 0.0 }
            });
            let wi = Tensor::<f64>::zeros([m, w, w]);
            let op = Op::SpectralConv1dRfft { modes: m };
            let y = forward(&op, &[&x, &wr, &wi]).unwrap();
            for (a, b) in y.data().iter().zip(x.data()) {
                assert!((a - b).abs() < 1e-12, "grid {n}: {a} vs {b}");
            }
            let bad = Op::SpectralConv1dRfft { modes: m + 1 };
            assert!(forward(&bad, &[&x, &wr, &wi]).is_err());
        }
    }
}
