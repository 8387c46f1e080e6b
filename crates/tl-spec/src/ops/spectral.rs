//! The FNO spectral convolution `spectralConv1dRfft` (SEMANTICS.md, "Layers"), written with
//! explicit real DFT basis matrices so that every step is a plain sum.
//!
//! For x (grid N, width W), weights wRe, wIm (modes M, W, W), with `C[k,t] = cos(2πkt/N)` and
//! `S[k,t] = sin(2πkt/N)` (angles reduced exactly as `2π·((k·t) mod N)/N`):
//!
//! ```text
//! Xr[k,c] =  Σ_t x[t,c]·C[k,t]        Xi[k,c] = −Σ_t x[t,c]·S[k,t]          (k < M)
//! Zr[k,o] =  Σ_c Xr·wRe[k,c,o] − Xi·wIm[k,c,o]
//! Zi[k,o] =  Σ_c Xr·wIm[k,c,o] + Xi·wRe[k,c,o]
//! y[t,o]  =  (1/N)·Σ_k α_k·(Zr[k,o]·C[k,t] − Zi[k,o]·S[k,t])
//! ```
//!
//! with `α_k = 1` for the DC bin and, for even N, the Nyquist bin `k = N/2`, and `α_k = 2`
//! otherwise (the bins `N − k` of a real signal's spectrum are the conjugates of the kept bins).
//! `S` is set to exactly 0 on the DC and Nyquist rows, which is what drops those bins' imaginary
//! parts. Each step is linear, so the op is bilinear in x and (wRe, wIm); the VJP applies the
//! transposed steps in reverse and the JVP is `f(dx, w) + f(x, dw)`.
//!
//! A batched x (B, N, W) is the same op on each of the B slices; weight gradients sum over B.

use crate::alloc::{try_with_capacity, try_zeroed};
use crate::{Error, Result, Scalar, Shape, Tensor};

const OP: &str = "spectralConv1dRfft";

/// Shape rule: x (grid, width) or (B, grid, width), grid ≥ 1; wRe and wIm (modes, width, width);
/// `1 ≤ modes ≤ grid/2 + 1`. The output has x's shape.
pub fn spectral_conv1d_shape(x: &Shape, w_re: &Shape, w_im: &Shape, modes: usize) -> Result<Shape> {
    let (_, n, w) = dims(x)?;
    if modes == 0 || modes > n / 2 + 1 {
        return Err(Error::param(
            OP,
            format!(
                "modes must lie in 1..={} for grid {n} (x {x}), got {modes}",
                n / 2 + 1
            ),
        ));
    }
    let want = Shape::new(&[modes, w, w]);
    for (name, s) in [("wRe", w_re), ("wIm", w_im)] {
        if s != &want {
            return Err(Error::shape(
                OP,
                format!("{name} has shape {s}, expected {want} for x {x} and modes {modes}"),
            ));
        }
    }
    Ok(x.clone())
}

/// (batch, grid, width) of x, which must be rank 2 or 3 with a non-empty grid.
fn dims(x: &Shape) -> Result<(usize, usize, usize)> {
    let (b, n, w) = match *x.dims() {
        [n, w] => (1, n, w),
        [b, n, w] => (b, n, w),
        _ => {
            return Err(Error::shape(
                OP,
                format!("x must be (grid, width) or (batch, grid, width), got {x}"),
            ));
        }
    };
    if n == 0 {
        return Err(Error::shape(
            OP,
            format!("grid must be non-empty, got x {x}"),
        ));
    }
    Ok((b, n, w))
}

/// The kept part of the real DFT basis: `cos`, `sin` (M×N, row k) and the weights `α_k/N`.
struct Basis<T> {
    n: usize,
    m: usize,
    w: usize,
    cos: Vec<T>,
    sin: Vec<T>,
    inv: Vec<T>,
}

impl<T: Scalar> Basis<T> {
    /// The tables of `m` bins over a grid of `n` for `w` channels; the m·n entries of each
    /// table checked and allocated fallibly (an error naming the op).
    fn new(n: usize, m: usize, w: usize) -> Result<Self> {
        let entries = m.checked_mul(n).ok_or_else(|| Error::TooLarge {
            op: OP,
            detail: format!("the DFT basis of {m} mode(s) × a grid of {n} overflows"),
        })?;
        let mut cos = try_with_capacity(OP, "DFT basis", entries)?;
        let mut sin = try_with_capacity(OP, "DFT basis", entries)?;
        for k in 0..m {
            let edge = k == 0 || 2 * k == n;
            for t in 0..n {
                let a = 2.0 * std::f64::consts::PI * ((k * t) % n) as f64 / n as f64;
                cos.push(T::lit(a.cos()));
                sin.push(if edge { T::zero() } else { T::lit(a.sin()) });
            }
        }
        let inv = (0..m)
            .map(|k| {
                let alpha = if k == 0 || 2 * k == n { 1.0 } else { 2.0 };
                T::lit(alpha / n as f64)
            })
            .collect();
        Ok(Basis {
            n,
            m,
            w,
            cos,
            sin,
            inv,
        })
    }

    /// (Xr, Xi), each M×W, of one slice x (N×W).
    fn rfft(&self, x: &[T]) -> (Vec<T>, Vec<T>) {
        let (n, m, w) = (self.n, self.m, self.w);
        let (mut re, mut im) = (vec![T::zero(); m * w], vec![T::zero(); m * w]);
        for k in 0..m {
            for t in 0..n {
                let (c, s) = (self.cos[k * n + t], self.sin[k * n + t]);
                for ch in 0..w {
                    re[k * w + ch] += x[t * w + ch] * c;
                    im[k * w + ch] -= x[t * w + ch] * s;
                }
            }
        }
        (re, im)
    }

    /// Transpose of [`Basis::rfft`]: `g[t,c] = Σ_k C[k,t]·gr[k,c] − S[k,t]·gi[k,c]`.
    fn rfft_t(&self, gr: &[T], gi: &[T]) -> Vec<T> {
        let (n, m, w) = (self.n, self.m, self.w);
        let mut g = vec![T::zero(); n * w];
        for k in 0..m {
            for t in 0..n {
                let (c, s) = (self.cos[k * n + t], self.sin[k * n + t]);
                for ch in 0..w {
                    g[t * w + ch] += c * gr[k * w + ch] - s * gi[k * w + ch];
                }
            }
        }
        g
    }

    /// The real signal (N×W) of the kept bins (Zr, Zi), each M×W.
    fn irfft(&self, zr: &[T], zi: &[T]) -> Vec<T> {
        let (n, m, w) = (self.n, self.m, self.w);
        let mut y = vec![T::zero(); n * w];
        for k in 0..m {
            for t in 0..n {
                let c = self.cos[k * n + t] * self.inv[k];
                let s = self.sin[k * n + t] * self.inv[k];
                for o in 0..w {
                    y[t * w + o] += zr[k * w + o] * c - zi[k * w + o] * s;
                }
            }
        }
        y
    }

    /// Transpose of [`Basis::irfft`]: `(α_k/N)·(Σ_t C[k,t]·g[t,o], −Σ_t S[k,t]·g[t,o])`.
    fn irfft_t(&self, g: &[T]) -> (Vec<T>, Vec<T>) {
        let (n, m, w) = (self.n, self.m, self.w);
        let (mut gr, mut gi) = (vec![T::zero(); m * w], vec![T::zero(); m * w]);
        for k in 0..m {
            for t in 0..n {
                let c = self.cos[k * n + t] * self.inv[k];
                let s = self.sin[k * n + t] * self.inv[k];
                for o in 0..w {
                    gr[k * w + o] += c * g[t * w + o];
                    gi[k * w + o] -= s * g[t * w + o];
                }
            }
        }
        (gr, gi)
    }

    /// The per-mode complex channel mix `Z[k,·] = X[k,·]·(wRe + i·wIm)[k]`.
    fn mix(&self, xr: &[T], xi: &[T], wr: &[T], wi: &[T]) -> (Vec<T>, Vec<T>) {
        let (m, w) = (self.m, self.w);
        let (mut zr, mut zi) = (vec![T::zero(); m * w], vec![T::zero(); m * w]);
        for k in 0..m {
            for c in 0..w {
                let (a, b) = (xr[k * w + c], xi[k * w + c]);
                for o in 0..w {
                    let (p, q) = (wr[(k * w + c) * w + o], wi[(k * w + c) * w + o]);
                    zr[k * w + o] += a * p - b * q;
                    zi[k * w + o] += a * q + b * p;
                }
            }
        }
        (zr, zi)
    }

    /// Transpose of [`Basis::mix`] in X: `gX[k,c] = Σ_o gZ[k,o]·conj(w[k,c,o])`.
    fn mix_t_x(&self, gzr: &[T], gzi: &[T], wr: &[T], wi: &[T]) -> (Vec<T>, Vec<T>) {
        let (m, w) = (self.m, self.w);
        let (mut gr, mut gi) = (vec![T::zero(); m * w], vec![T::zero(); m * w]);
        for k in 0..m {
            for c in 0..w {
                for o in 0..w {
                    let (p, q) = (wr[(k * w + c) * w + o], wi[(k * w + c) * w + o]);
                    let (a, b) = (gzr[k * w + o], gzi[k * w + o]);
                    gr[k * w + c] += a * p + b * q;
                    gi[k * w + c] += b * p - a * q;
                }
            }
        }
        (gr, gi)
    }

    /// Transpose of [`Basis::mix`] in w, accumulated into (gwr, gwi).
    #[allow(clippy::too_many_arguments)]
    fn mix_t_w(&self, xr: &[T], xi: &[T], gzr: &[T], gzi: &[T], gwr: &mut [T], gwi: &mut [T]) {
        let (m, w) = (self.m, self.w);
        for k in 0..m {
            for c in 0..w {
                let (a, b) = (xr[k * w + c], xi[k * w + c]);
                for o in 0..w {
                    let (p, q) = (gzr[k * w + o], gzi[k * w + o]);
                    gwr[(k * w + c) * w + o] += a * p + b * q;
                    gwi[(k * w + c) * w + o] += a * q - b * p;
                }
            }
        }
    }
}

fn setup<T: Scalar>(
    x: &Tensor<T>,
    w_re: &Tensor<T>,
    w_im: &Tensor<T>,
    modes: usize,
) -> Result<(usize, Basis<T>)> {
    spectral_conv1d_shape(x.shape(), w_re.shape(), w_im.shape(), modes)?;
    let (b, n, w) = dims(x.shape())?;
    Ok((b, Basis::new(n, modes, w)?))
}

/// `y = irfft(keep_modes(rfft(x)) · (wRe + i·wIm))` per channel mix, as in the module docs.
/// PyTorch: the `SpectralConv1d` layer of the FNO reference code (`torch.fft.rfft`, an einsum
/// `"bix,iox->box"` over the first `modes` bins, `torch.fft.irfft(n=grid)`), channels last.
pub fn spectral_conv1d<T: Scalar>(
    x: &Tensor<T>,
    w_re: &Tensor<T>,
    w_im: &Tensor<T>,
    modes: usize,
) -> Result<Tensor<T>> {
    let (_, basis) = setup(x, w_re, w_im, modes)?;
    let mut out = try_with_capacity(OP, "output", x.numel())?;
    for xs in x.data().chunks(basis.n * basis.w.max(1)) {
        let (xr, xi) = basis.rfft(xs);
        let (zr, zi) = basis.mix(&xr, &xi, w_re.data(), w_im.data());
        out.extend(basis.irfft(&zr, &zi));
    }
    Tensor::new(x.shape().clone(), out)
}

/// VJP of `spectralConv1dRfft`: `(dx, dwRe, dwIm)` for the output cotangent `g`.
pub fn spectral_conv1d_vjp<T: Scalar>(
    x: &Tensor<T>,
    w_re: &Tensor<T>,
    w_im: &Tensor<T>,
    modes: usize,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    let (_, basis) = setup(x, w_re, w_im, modes)?;
    if g.shape() != x.shape() {
        return Err(Error::shape(
            OP,
            format!("cotangent has shape {}, expected {}", g.shape(), x.shape()),
        ));
    }
    let slice = basis.n * basis.w.max(1);
    let mut dx = try_with_capacity(OP, "gradient", x.numel())?;
    let mut dwr = try_zeroed(OP, "weight gradient", w_re.numel())?;
    let mut dwi = try_zeroed(OP, "weight gradient", w_im.numel())?;
    for (xs, gs) in x.data().chunks(slice).zip(g.data().chunks(slice)) {
        let (xr, xi) = basis.rfft(xs);
        let (gzr, gzi) = basis.irfft_t(gs);
        basis.mix_t_w(&xr, &xi, &gzr, &gzi, &mut dwr, &mut dwi);
        let (gxr, gxi) = basis.mix_t_x(&gzr, &gzi, w_re.data(), w_im.data());
        dx.extend(basis.rfft_t(&gxr, &gxi));
    }
    Ok((
        Tensor::new(x.shape().clone(), dx)?,
        Tensor::new(w_re.shape().clone(), dwr)?,
        Tensor::new(w_im.shape().clone(), dwi)?,
    ))
}

/// JVP of `spectralConv1dRfft` (bilinear): `f(dx, wRe, wIm) + f(x, dwRe, dwIm)`.
#[allow(clippy::too_many_arguments)]
pub fn spectral_conv1d_jvp<T: Scalar>(
    x: &Tensor<T>,
    w_re: &Tensor<T>,
    w_im: &Tensor<T>,
    modes: usize,
    dx: &Tensor<T>,
    dw_re: &Tensor<T>,
    dw_im: &Tensor<T>,
) -> Result<Tensor<T>> {
    let a = spectral_conv1d(dx, w_re, w_im, modes)?;
    if dx.shape() != x.shape() {
        return Err(Error::shape(
            OP,
            format!("tangent has shape {}, expected {}", dx.shape(), x.shape()),
        ));
    }
    let b = spectral_conv1d(x, dw_re, dw_im, modes)?;
    a.zip_map(OP, &b, |p, q| p + q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_real_mode_with_identity_weights_is_the_mean() {
        // modes = 1, wRe = I, wIm = 0: only the DC bin survives, so y[t,c] = mean_t x[·,c].
        let x = Tensor::<f64>::new([4, 2], vec![1.0, 0.0, 2.0, 1.0, 3.0, 0.0, 6.0, -1.0]).unwrap();
        let wr = Tensor::<f64>::new([1, 2, 2], vec![1.0, 0.0, 0.0, 1.0]).unwrap();
        let wi = Tensor::<f64>::zeros([1, 2, 2]);
        let y = spectral_conv1d(&x, &wr, &wi, 1).unwrap();
        for t in 0..4 {
            assert!((y.data()[2 * t] - 3.0).abs() < 1e-15);
            assert!(y.data()[2 * t + 1].abs() < 1e-15);
        }
        // All modes with identity weights reproduce x (the inverse undoes the forward).
        let wr =
            Tensor::<f64>::from_fn(
                [3, 2, 2],
                |i| if i % 4 == 0 || i % 4 == 3 { 1.0 } else { 0.0 },
            );
        let wi = Tensor::<f64>::zeros([3, 2, 2]);
        let y = spectral_conv1d(&x, &wr, &wi, 3).unwrap();
        for (a, b) in y.data().iter().zip(x.data()) {
            assert!((a - b).abs() < 1e-14, "{y:?}");
        }
    }

    #[test]
    fn shape_rule_rejects_bad_modes_and_weights() {
        let x = Shape::new(&[8, 3]);
        let w = |m: usize| Shape::new(&[m, 3, 3]);
        assert!(spectral_conv1d_shape(&x, &w(5), &w(5), 5).is_ok());
        let e = spectral_conv1d_shape(&x, &w(6), &w(6), 6).unwrap_err();
        assert!(matches!(e, Error::Param { .. }), "{e}");
        assert!(spectral_conv1d_shape(&x, &w(0), &w(0), 0).is_err());
        assert!(spectral_conv1d_shape(&x, &w(4), &w(5), 5).is_err());
        assert!(spectral_conv1d_shape(&Shape::new(&[8]), &w(1), &w(1), 1).is_err());
        assert!(spectral_conv1d_shape(&Shape::new(&[0, 3]), &w(1), &w(1), 1).is_err());
    }
}
