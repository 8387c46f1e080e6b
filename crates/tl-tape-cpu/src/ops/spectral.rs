//! `spectralConv1dRfft`: the FNO spectral convolution as a direct DFT over the kept modes only.
//!
//! For grid N, width W and M kept modes the forward costs `2·N·M·W` (forward DFT of the kept
//! bins) `+ 4·M·W²` (per-mode complex channel mix) `+ 2·N·M·W` (inverse) multiply-adds; the
//! backward the same twice. The cos/sin tables are built once per call from the N twiddles of the
//! grid (angle index `(k·t) mod N`), with the inverse's `α_k/N` folded in; every inner loop runs
//! over a contiguous channel row. Why a direct DFT rather than an FFT crate: see the measurements
//! in `docs/semantics.md` ("## Spectral") and `benches/spectral.rs`.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of `spectralConv1dRfft` on `(x, wRe, wIm)`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let plan = Plan::of(op, x)?;
    let (wr, wi) = (x[1].data(), x[2].data());
    let mut y = vec![T::zero(); x[0].numel()];
    let mut s = plan.scratch();
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
    let plan = Plan::of(op, x)?;
    check_shape(op, "cotangent", g, x[0].shape())?;
    let (wr, wi) = (x[1].data(), x[2].data());
    let mut dx = vec![T::zero(); x[0].numel()];
    let mut dwr = vec![T::zero(); wr.len()];
    let mut dwi = vec![T::zero(); wi.len()];
    let mut s = plan.scratch();
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

/// Sizes and twiddle tables of one call.
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
    fn of(op: &Op, x: &[&Tensor<T>]) -> Result<Self> {
        let Op::SpectralConv1dRfft { modes } = *op else {
            return Err(wrong_family(op, "spectral"));
        };
        // The shape rule ran at record time; re-check what indexing below relies on.
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
        let twiddle: Vec<(f64, f64)> = (0..n)
            .map(|j| (2.0 * std::f64::consts::PI * j as f64 / n as f64).sin_cos())
            .collect();
        let mut plan = Plan {
            n,
            m: modes,
            w,
            cos: Vec::with_capacity(modes * n),
            sin: Vec::with_capacity(modes * n),
            icos: Vec::with_capacity(modes * n),
            isin: Vec::with_capacity(modes * n),
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

    fn scratch(&self) -> Scratch<T> {
        let z = vec![T::zero(); self.m * self.w];
        Scratch {
            ar: z.clone(),
            ai: z.clone(),
            br: z.clone(),
            bi: z,
        }
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
