//! The f32/f64 path of `spectralConv1dRfft`: real FFTs of each channel through `realfft`
//! (`rustfft`, planned in `tl_fft`), then the complex mix of the first `modes` bins, then
//! inverse real FFTs.
//!
//! With `G = rfft` (unnormalized) and `H = irfft` (unnormalized, counting non-edge bins twice
//! and ignoring the DC/Nyquist imaginary parts, as realfft's complex-to-real transform does):
//! forward `y = H(Z)/N`; backward `gZ = (α_k/N)·G(g)` (edge imaginary parts dropped),
//! `dW[k,c,o] = conj(X[k,c])·gZ[k,o]`, `gX[k,c] = Σ_o gZ[k,o]·conj(W[k,c,o])` and
//! `dx = H(gX/α_k)`, which is the transpose of the kept-bin DFT.

use std::sync::Arc;
use tl_fft::{Complex, ComplexToReal, Real, RealToComplex};
use tl_spec::{Error as SpecError, Scalar};

use super::OP;
use crate::Result;
use tl_spec::alloc::try_vec;

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
    pub(super) fn new(n: usize, w: usize, m: usize) -> Self {
        let tl_fft::Plans {
            forward: fwd,
            inverse: inv,
        } = F::plans(n);
        Fft {
            n,
            w,
            m,
            spec: fwd.make_output_vec(),
            fwd,
            inv,
            line: vec![F::zero(); n],
        }
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

    /// `out[t·w + o] = scale · H(z[·, o])[t]` (unnormalized inverse of the kept bins).
    fn irfft(&mut self, z: &[Complex<F>], scale: F, out: &mut [F]) -> Result<()> {
        let (n, w, m) = (self.n, self.w, self.m);
        for o in 0..w {
            self.spec.fill(Complex::new(F::zero(), F::zero()));
            for k in 0..m {
                self.spec[k] = z[k * w + o];
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

    /// Forward on one slice.
    pub(super) fn forward(&mut self, x: &[F], wr: &[F], wi: &[F], y: &mut [F]) -> Result<()> {
        let (w, m) = (self.w, self.m);
        let zero = Complex::new(F::zero(), F::zero());
        let mut xs = try_vec(OP, "spectrum", m * w, zero)?;
        self.rfft(x, &mut xs)?;
        let mut zs = try_vec(OP, "spectrum", m * w, zero)?;
        for k in 0..m {
            for c in 0..w {
                let a = xs[k * w + c];
                let row = (k * w + c) * w;
                for (o, z) in zs[k * w..(k + 1) * w].iter_mut().enumerate() {
                    *z = *z + a * Complex::new(wr[row + o], wi[row + o]);
                }
            }
        }
        let inv_n = F::one() / F::lit(self.n as f64);
        self.irfft(&zs, inv_n, y)
    }

    /// Backward on one slice: writes `dx`, accumulates `dwr`, `dwi`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        &mut self,
        x: &[F],
        wr: &[F],
        wi: &[F],
        g: &[F],
        dx: &mut [F],
        dwr: &mut [F],
        dwi: &mut [F],
    ) -> Result<()> {
        let (n, w, m) = (self.n, self.w, self.m);
        let zero = Complex::new(F::zero(), F::zero());
        let mut xs = try_vec(OP, "spectrum", m * w, zero)?;
        self.rfft(x, &mut xs)?;
        let mut gz = try_vec(OP, "spectrum", m * w, zero)?;
        self.rfft(g, &mut gz)?;
        for k in 0..m {
            let edge = self.edge(k);
            let a = F::lit(if edge { 1.0 } else { 2.0 } / n as f64);
            for v in &mut gz[k * w..(k + 1) * w] {
                *v = Complex::new(v.re * a, if edge { F::zero() } else { v.im * a });
            }
        }
        let mut gx = try_vec(OP, "spectrum", m * w, zero)?;
        for k in 0..m {
            let half = if self.edge(k) { F::one() } else { F::lit(0.5) };
            for c in 0..w {
                let xc = xs[k * w + c].conj();
                let row = (k * w + c) * w;
                let mut s = zero;
                for (o, &gzo) in gz[k * w..(k + 1) * w].iter().enumerate() {
                    let d = xc * gzo;
                    dwr[row + o] += d.re;
                    dwi[row + o] += d.im;
                    s = s + gzo * Complex::new(wr[row + o], wi[row + o]).conj();
                }
                gx[k * w + c] = s * half;
            }
        }
        self.irfft(&gx, F::one(), dx)
    }
}
