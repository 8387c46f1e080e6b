//! The f32/f64 path of `spectralConv1dRfft`: real FFTs of each channel through `realfft`
//! (`rustfft`, planned in `tl_fft`), then the complex mix of the first `modes` bins, then
//! inverse real FFTs.
//!
//! With `G = rfft` (unnormalized) and `H = irfft` (unnormalized, counting non-edge bins twice
//! and ignoring the DC/Nyquist imaginary parts, as realfft's complex-to-real transform does):
//! forward `y = H(Z)/N`; backward `gZ = (α_k/N)·G(g)` (edge imaginary parts dropped),
//! `dW[k,c,o] = conj(X[k,c])·gZ[k,o]`, `gX[k,c] = Σ_o gZ[k,o]·conj(W[k,c,o])` and
//! `dx = H(gX/α_k)`, which is the transpose of the kept-bin DFT.
//!
//! **Threads.** A batch of B slices runs in three phases, each split across threads by
//! [`crate::par::rows`] when its work reaches the row threshold: the transforms by slice, the
//! mix by mode (`Z`, `gX` and `dW` of one mode on one thread), the inverse transforms by slice.
//! Every value is summed in one fixed order whatever the split: `Z[b,k,o]` over c, `gX[b,k,c]`
//! over o, `dW[k,c,o]` over the slices b in order; so the bits do not depend on the thread count.

use std::sync::Arc;
use tl_fft::{Complex, ComplexToReal, Real, RealToComplex};
use tl_spec::{Error as SpecError, Scalar};

use super::OP;
use crate::Result;
use crate::par;
use tl_spec::alloc::try_zeroed;

/// Plans and buffers for one call (grid `n`, width `w`, `m` kept modes).
pub(super) struct Fft<F: Real> {
    n: usize,
    w: usize,
    m: usize,
    fwd: Arc<dyn RealToComplex<F>>,
    inv: Arc<dyn ComplexToReal<F>>,
    line: Vec<F>,
    spec: Vec<Complex<F>>,
}

fn fft_err(e: tl_fft::FftError) -> crate::Error {
    SpecError::param("spectralConv1dRfft", format!("FFT failed: {e}")).into()
}

impl<F: Real + Scalar> Fft<F> {
    /// The plans of length `n` and a line and a spectrum of it, the buffers allocated
    /// fallibly ([`tl_spec::alloc::try_vec`]: an error naming the op, not an abort) before the
    /// planner's own O(n) tables.
    pub(super) fn new(n: usize, w: usize, m: usize) -> Result<Self> {
        let zero = Complex::new(F::zero(), F::zero());
        let line = tl_spec::alloc::try_vec(OP, "FFT line", n, F::zero())?;
        let spec = try_zeroed_complex(n / 2 + 1, zero)?;
        let tl_fft::Plans {
            forward: fwd,
            inverse: inv,
        } = F::plans(n);
        Ok(Fft {
            n,
            w,
            m,
            spec,
            fwd,
            inv,
            line,
        })
    }

    fn edge(&self, k: usize) -> bool {
        k == 0 || 2 * k == self.n
    }

    /// The first `m` bins of each channel's rfft: `out[k·w + c]`.
    fn rfft(&mut self, x: &[F], out: &mut [Complex<F>]) -> Result<()> {
        let (n, w, m) = (self.n, self.w, self.m);
        for c in 0..w {
            for t in 0..n {
                self.line[t] = x[t * w + c];
            }
            self.fwd
                .process(&mut self.line, &mut self.spec)
                .map_err(fft_err)?;
            for k in 0..m {
                out[k * w + c] = self.spec[k];
            }
        }
        Ok(())
    }

    /// `out[t·w + o] = scale · H(z[k·k_stride + o] for each k)[t]` (unnormalized inverse of
    /// the kept bins of one slice, bin k of channel o at `z[k·k_stride + o]`).
    fn irfft(&mut self, z: &[Complex<F>], k_stride: usize, scale: F, out: &mut [F]) -> Result<()> {
        let (n, w, m) = (self.n, self.w, self.m);
        for o in 0..w {
            self.spec.fill(Complex::new(F::zero(), F::zero()));
            for k in 0..m {
                self.spec[k] = z[k * k_stride + o];
                if self.edge(k) {
                    self.spec[k].im = F::zero();
                }
            }
            self.inv
                .process(&mut self.spec, &mut self.line)
                .map_err(fft_err)?;
            for t in 0..n {
                out[t * w + o] = self.line[t] * scale;
            }
        }
        Ok(())
    }
}

/// The rfft bins of every slice of `x` (B slices of `n·w`): `out[(b·m + k)·w + c]`, scaled by
/// `scale(k)` with the edge bins' imaginary parts dropped when `cotangent` (the backward's gZ).
fn rfft_slices<F: Real + Scalar>(
    x: &[F],
    (n, w, m): (usize, usize, usize),
    cotangent: bool,
) -> Result<Vec<Complex<F>>> {
    let slices = x.len() / (n * w).max(1);
    let zero = Complex::new(F::zero(), F::zero());
    let mut out = try_zeroed_complex(slices * m * w, zero)?;
    let work = transform_work(slices, n, w);
    par::rows(&mut out, m * w, work, &|first, block| {
        let mut f = Fft::new(n, w, m)?;
        for (j, bins) in block.chunks_exact_mut(m * w).enumerate() {
            let b = first + j;
            f.rfft(&x[b * n * w..(b + 1) * n * w], bins)?;
            if cotangent {
                for k in 0..m {
                    let edge = f.edge(k);
                    let a = F::lit(if edge { 1.0 } else { 2.0 } / n as f64);
                    for v in &mut bins[k * w..(k + 1) * w] {
                        *v = Complex::new(v.re * a, if edge { F::zero() } else { v.im * a });
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// The inverse transforms of every slice: `out` (B slices of `n·w`) from the mode-major bins
/// `z[(k·B + b)·w + o]`, scaled by `scale`.
fn irfft_slices<F: Real + Scalar>(
    z: &[Complex<F>],
    (n, w, m): (usize, usize, usize),
    scale: F,
    out: &mut [F],
) -> Result<()> {
    let slices = out.len() / (n * w).max(1);
    let work = transform_work(slices, n, w);
    par::rows(out, n * w, work, &|first, block| {
        let mut f = Fft::new(n, w, m)?;
        for (j, y) in block.chunks_exact_mut(n * w).enumerate() {
            f.irfft(&z[(first + j) * w..], slices * w, scale, y)?;
        }
        Ok(())
    })
}

/// The work [`par::rows`] weighs a batch of transforms by: `n·log₂n` per channel and slice.
fn transform_work(slices: usize, n: usize, w: usize) -> usize {
    let log = (usize::BITS - n.leading_zeros()) as usize;
    slices
        .saturating_mul(n)
        .saturating_mul(w)
        .saturating_mul(log)
}

fn try_zeroed_complex<F: Real + Scalar>(len: usize, zero: Complex<F>) -> Result<Vec<Complex<F>>> {
    Ok(tl_spec::alloc::try_vec(OP, "spectrum", len, zero)?)
}

/// Forward on a batch: `y` (B slices of `n·w`) from `x` and the weights `(wr, wi)` (m, w, w).
pub(super) fn forward<F: Real + Scalar>(
    x: &[F],
    wr: &[F],
    wi: &[F],
    (n, w, m): (usize, usize, usize),
    y: &mut [F],
) -> Result<()> {
    let slices = x.len() / (n * w).max(1);
    let xs = rfft_slices(x, (n, w, m), false)?;
    // Z, mode-major: z[(k·B + b)·w + o] = Σ_c X[b,k,c]·W[k,c,o], c in order.
    let zero = Complex::new(F::zero(), F::zero());
    let mut zs = try_zeroed_complex(m * slices * w, zero)?;
    let mix_work = slices.saturating_mul(w * w);
    par::rows(
        &mut zs,
        slices * w,
        mix_work.saturating_mul(m),
        &|first, block| {
            for (j, zk) in block.chunks_exact_mut(slices * w).enumerate() {
                let k = first + j;
                for (b, z) in zk.chunks_exact_mut(w).enumerate() {
                    for c in 0..w {
                        let a = xs[(b * m + k) * w + c];
                        let row = (k * w + c) * w;
                        for (o, z) in z.iter_mut().enumerate() {
                            *z = *z + a * Complex::new(wr[row + o], wi[row + o]);
                        }
                    }
                }
            }
            Ok(())
        },
    )?;
    let inv_n = F::one() / F::lit(n as f64);
    irfft_slices(&zs, (n, w, m), inv_n, y)
}

/// Backward on a batch: `dx` (B slices) and the weights' cotangents `dwr`, `dwi` (m, w, w,
/// zeroed by the caller) from `x`, the weights and the output cotangent `g`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<F: Real + Scalar>(
    x: &[F],
    wr: &[F],
    wi: &[F],
    g: &[F],
    (n, w, m): (usize, usize, usize),
    dx: &mut [F],
    dwr: &mut [F],
    dwi: &mut [F],
) -> Result<()> {
    let slices = x.len() / (n * w).max(1);
    let xs = rfft_slices(x, (n, w, m), false)?;
    let gz = rfft_slices(g, (n, w, m), true)?;
    let work = slices.saturating_mul(w * w).saturating_mul(m);
    // dW[k,c,o] = Σ_b conj(X[b,k,c])·gZ[b,k,o], b in order; interleaved (re, im) per entry.
    let mut dw = try_zeroed::<F>(OP, "cotangent", 2 * m * w * w)?;
    par::rows(&mut dw, 2 * w * w, work, &|first, block| {
        for (j, dk) in block.chunks_exact_mut(2 * w * w).enumerate() {
            let k = first + j;
            for b in 0..slices {
                let gzk = &gz[(b * m + k) * w..(b * m + k + 1) * w];
                for c in 0..w {
                    let xc = xs[(b * m + k) * w + c].conj();
                    let row = &mut dk[2 * c * w..2 * (c + 1) * w];
                    for (d, &gzo) in row.chunks_exact_mut(2).zip(gzk) {
                        let v = xc * gzo;
                        d[0] += v.re;
                        d[1] += v.im;
                    }
                }
            }
        }
        Ok(())
    })?;
    for ((d, r), i) in dw.chunks_exact(2).zip(dwr.iter_mut()).zip(dwi.iter_mut()) {
        *r = d[0];
        *i = d[1];
    }
    // gX, mode-major: gx[(k·B + b)·w + c] = half_k · Σ_o gZ[b,k,o]·conj(W[k,c,o]), o in order.
    let zero = Complex::new(F::zero(), F::zero());
    let mut gx = try_zeroed_complex(m * slices * w, zero)?;
    let edge = |k: usize| k == 0 || 2 * k == n;
    par::rows(&mut gx, slices * w, work, &|first, block| {
        for (j, gxk) in block.chunks_exact_mut(slices * w).enumerate() {
            let k = first + j;
            let half = if edge(k) { F::one() } else { F::lit(0.5) };
            for (b, out) in gxk.chunks_exact_mut(w).enumerate() {
                let gzk = &gz[(b * m + k) * w..(b * m + k + 1) * w];
                for (c, out) in out.iter_mut().enumerate() {
                    let row = (k * w + c) * w;
                    let mut s = zero;
                    for (o, &gzo) in gzk.iter().enumerate() {
                        s = s + gzo * Complex::new(wr[row + o], wi[row + o]).conj();
                    }
                    *out = s * half;
                }
            }
        }
        Ok(())
    })?;
    irfft_slices(&gx, (n, w, m), F::one(), dx)
}
