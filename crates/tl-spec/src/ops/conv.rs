//! N-D convolution (cross-correlation) and transposed convolution, channels-first, zero padding,
//! groups 1, dilation 1, spatial rank 1..=8 taken from the weight.
//!
//! Both ops relate a big spatial block to a small one through the same windows
//! ([`super::window`]), with the weight laid out `(small channels, big channels, kernel...)`:
//! - `conv(w, b, x)`: x is big, `y[a, o] = b[a] + Σ_{c,k} w[a, c, k]·x[c, o·s + k − p]`;
//! - `convTranspose(w, b, x)`: x is small, y is big and receives
//!   `Σ_{a, o, k : o·s + k − p = j} w[a, c, k]·x[a, o]` — the adjoint of conv w.r.t. its input.
//!
//! Both are bilinear in (w, x), so their JVP is `op(dw, db, x) + op(w, 0, dx)`.

use super::window::{Window, check_params, forward_out, split_operand};
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Stride and padding of a conv, one entry per spatial axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvParams<'a> {
    /// Stride per spatial axis (≥ 1).
    pub stride: &'a [usize],
    /// Zero padding per spatial axis, both sides.
    pub padding: &'a [usize],
}

/// The validated geometry of a conv or convTranspose.
struct Geo {
    win: Window,
    /// Channels of the small side (conv: outC; convT: inC) = weight dim 0.
    small_c: usize,
    /// Channels of the big side (conv: inC; convT: outC) = weight dim 1.
    big_c: usize,
    transpose: bool,
}

impl Geo {
    fn new(transpose: bool, w: &Shape, b: &Shape, x: &Shape, p: ConvParams<'_>) -> Result<Geo> {
        let op = if transpose { "convTranspose" } else { "conv" };
        let wd = w.dims();
        if wd.len() < 3 {
            return Err(Error::shape(
                op,
                format!("weight {w} must have rank ≥ 3 (outC, inC, kernel...)"),
            ));
        }
        let d = wd.len() - 2;
        let kernel = &wd[2..];
        check_params(op, d, Some(kernel), p.stride, p.padding)?;
        let (batch, xc, xs) = split_operand(op, "input", x, d)?;
        let (small_c, big_c) = (wd[0], wd[1]);
        let (in_c, out_c) = if transpose {
            (small_c, big_c)
        } else {
            (big_c, small_c)
        };
        if xc != in_c {
            return Err(Error::shape(
                op,
                format!("input {x} has {xc} channel(s), weight {w} expects {in_c}"),
            ));
        }
        if b.dims() != [out_c] {
            return Err(Error::shape(
                op,
                format!("bias {b} must be [{out_c}] (outC of weight {w})"),
            ));
        }
        let (big, small) = if transpose {
            (transpose_out(op, x, xs, kernel, p)?, xs.to_vec())
        } else {
            let small = forward_out(op, x, xs, kernel, p.stride, p.padding)?;
            (xs.to_vec(), small)
        };
        let win = Window {
            batch,
            big,
            small,
            kernel: kernel.to_vec(),
            stride: p.stride.to_vec(),
            padding: p.padding.to_vec(),
        };
        Ok(Geo {
            win,
            small_c,
            big_c,
            transpose,
        })
    }

    fn out_shape(&self) -> Shape {
        if self.transpose {
            self.win.shape(self.big_c, &self.win.big)
        } else {
            self.win.shape(self.small_c, &self.win.small)
        }
    }

    /// The op's name: `conv` or `convTranspose`.
    fn op(&self) -> &'static str {
        if self.transpose {
            "convTranspose"
        } else {
            "conv"
        }
    }

    /// `n` zeros for a product's result, allocated fallibly (an error naming the op).
    fn zeros<T: Scalar>(&self, what: &str, n: usize) -> Result<Vec<T>> {
        crate::alloc::try_zeroed(self.op(), what, n)
    }

    /// The window table of the products below, or `None` where their loops (over the batch,
    /// the small side's channels and the big side's) run no iteration: the result is then
    /// zeros, and a kernel whose table no machine holds is no error (an empty weight's dims
    /// may be huge).
    fn windows(&self) -> Result<Option<Vec<Vec<Option<usize>>>>> {
        if [self.win.batches(), self.small_c, self.big_c].contains(&0) {
            return Ok(None);
        }
        self.win.windows(self.op()).map(Some)
    }

    /// `small[n, a, o] = Σ_{c,k} w[a, c, k]·big[n, c, pos(o, k)]`.
    fn correlate<T: Scalar>(&self, w: &[T], big: &[T]) -> Result<Vec<T>> {
        let (kl, bl, sl) = (
            self.win.kernel_len(),
            self.win.big_len(),
            self.win.small_len(),
        );
        let len = self
            .win
            .checked_len(self.op(), self.small_c, &self.win.small)?;
        let mut out = self.zeros("output", len)?;
        let Some(windows) = self.windows()? else {
            return Ok(out);
        };
        for n in 0..self.win.batches() {
            for a in 0..self.small_c {
                for (o, win) in windows.iter().enumerate() {
                    let mut s = T::zero();
                    for c in 0..self.big_c {
                        for (k, pos) in win.iter().enumerate() {
                            if let Some(pos) = pos {
                                s += w[(a * self.big_c + c) * kl + k]
                                    * big[(n * self.big_c + c) * bl + pos];
                            }
                        }
                    }
                    out[(n * self.small_c + a) * sl + o] = s;
                }
            }
        }
        Ok(out)
    }

    /// `big[n, c, pos(o, k)] += w[a, c, k]·small[n, a, o]` (the adjoint of [`Geo::correlate`]).
    fn spread<T: Scalar>(&self, w: &[T], small: &[T]) -> Result<Vec<T>> {
        let (kl, bl, sl) = (
            self.win.kernel_len(),
            self.win.big_len(),
            self.win.small_len(),
        );
        let len = self.win.checked_len(self.op(), self.big_c, &self.win.big)?;
        let mut out = self.zeros("output", len)?;
        let Some(windows) = self.windows()? else {
            return Ok(out);
        };
        for n in 0..self.win.batches() {
            for a in 0..self.small_c {
                for (o, win) in windows.iter().enumerate() {
                    let v = small[(n * self.small_c + a) * sl + o];
                    for c in 0..self.big_c {
                        for (k, pos) in win.iter().enumerate() {
                            if let Some(pos) = pos {
                                out[(n * self.big_c + c) * bl + pos] +=
                                    w[(a * self.big_c + c) * kl + k] * v;
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// `dw[a, c, k] = Σ_{n,o} small[n, a, o]·big[n, c, pos(o, k)]`.
    fn weight_grad<T: Scalar>(&self, small: &[T], big: &[T]) -> Result<Vec<T>> {
        let (kl, bl, sl) = (
            self.win.kernel_len(),
            self.win.big_len(),
            self.win.small_len(),
        );
        let dims = [&[self.small_c, self.big_c][..], &self.win.kernel].concat();
        let len = Shape::new(&dims).check_size(self.op())?;
        let mut dw = self.zeros("weight gradient", len)?;
        let Some(windows) = self.windows()? else {
            return Ok(dw);
        };
        for n in 0..self.win.batches() {
            for a in 0..self.small_c {
                for (o, win) in windows.iter().enumerate() {
                    let v = small[(n * self.small_c + a) * sl + o];
                    for c in 0..self.big_c {
                        for (k, pos) in win.iter().enumerate() {
                            if let Some(pos) = pos {
                                dw[(a * self.big_c + c) * kl + k] +=
                                    v * big[(n * self.big_c + c) * bl + pos];
                            }
                        }
                    }
                }
            }
        }
        Ok(dw)
    }

    /// Output channels and spatial cells per channel.
    fn out_layout(&self) -> (usize, usize) {
        if self.transpose {
            (self.big_c, self.win.big_len())
        } else {
            (self.small_c, self.win.small_len())
        }
    }

    fn add_bias<T: Scalar>(&self, y: &mut [T], b: &[T]) {
        let (ch, cells) = self.out_layout();
        for (i, v) in y.iter_mut().enumerate() {
            *v += b[(i / cells.max(1)) % ch.max(1)];
        }
    }

    fn bias_grad<T: Scalar>(&self, g: &[T]) -> Result<Vec<T>> {
        let (ch, cells) = self.out_layout();
        let mut db = self.zeros("bias gradient", ch)?;
        for (i, &v) in g.iter().enumerate() {
            db[(i / cells.max(1)) % ch.max(1)] += v;
        }
        Ok(db)
    }
}

/// convTranspose's big dims `(s − 1)·stride + k − 2p`; an error unless all are ≥ 1.
fn transpose_out(
    op: &'static str,
    x: &Shape,
    xs: &[usize],
    kernel: &[usize],
    p: ConvParams<'_>,
) -> Result<Vec<usize>> {
    (0..xs.len())
        .map(|i| {
            let full = xs[i]
                .saturating_sub(1)
                .checked_mul(p.stride[i])
                .and_then(|f| f.checked_add(kernel[i]))
                .ok_or_else(|| Error::TooLarge {
                    op,
                    detail: format!(
                        "the output extent ({} − 1)·{} + {} of spatial axis {i} of input {x} overflows usize",
                        xs[i], p.stride[i], kernel[i]
                    ),
                })?;
            // `full ≤ 2p` without computing 2p (which may overflow).
            let pad = p.padding[i];
            if xs[i] == 0 || pad >= full || full - pad <= pad {
                Err(Error::shape(
                    op,
                    format!(
                        "input {x} with kernel {kernel:?}, stride {:?} and padding {:?} gives an empty output along spatial axis {i}",
                        p.stride, p.padding
                    ),
                ))
            } else {
                Ok(full - pad - pad)
            }
        })
        .collect()
}

/// Shape rule of `conv` (`transpose = false`) and `convTranspose` (`true`).
pub fn conv_shape(
    transpose: bool,
    w: &Shape,
    b: &Shape,
    x: &Shape,
    p: ConvParams<'_>,
) -> Result<Shape> {
    Ok(Geo::new(transpose, w, b, x, p)?.out_shape())
}

fn check_g<T: Scalar>(geo: &Geo, what: &str, g: &Tensor<T>) -> Result<()> {
    let want = geo.out_shape();
    if g.shape() == &want {
        Ok(())
    } else {
        Err(Error::shape(
            geo.op(),
            format!("{what} has shape {}, expected {want}", g.shape()),
        ))
    }
}

/// N-D cross-correlation `y = b + w ⋆ x`. PyTorch: `F.conv1d/2d/3d(x, w, b, stride, padding)`.
pub fn conv<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
) -> Result<Tensor<T>> {
    apply(false, w, b, x, p)
}

/// N-D transposed convolution. PyTorch: `F.conv_transpose1d/2d/3d(x, w, b, stride, padding)`.
pub fn conv_transpose<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
) -> Result<Tensor<T>> {
    apply(true, w, b, x, p)
}

fn apply<T: Scalar>(
    transpose: bool,
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
) -> Result<Tensor<T>> {
    let geo = Geo::new(transpose, w.shape(), b.shape(), x.shape(), p)?;
    let mut y = if transpose {
        geo.spread(w.data(), x.data())?
    } else {
        geo.correlate(w.data(), x.data())?
    };
    geo.add_bias(&mut y, b.data());
    Tensor::new(geo.out_shape(), y)
}

/// VJP of `conv`: `(dw, db, dx)` = (Σ g ⊗ x windows, Σ g over batch and space, spread of g).
pub fn conv_vjp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    vjp(false, w, b, x, p, g)
}

/// VJP of `convTranspose`: `dx` is the conv of g with w; `dw` pairs x with windows of g.
pub fn conv_transpose_vjp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    vjp(true, w, b, x, p, g)
}

fn vjp<T: Scalar>(
    transpose: bool,
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    let geo = Geo::new(transpose, w.shape(), b.shape(), x.shape(), p)?;
    check_g(&geo, "cotangent", g)?;
    let (dw, dx) = if transpose {
        (
            geo.weight_grad(x.data(), g.data())?,
            geo.correlate(w.data(), g.data())?,
        )
    } else {
        (
            geo.weight_grad(g.data(), x.data())?,
            geo.spread(w.data(), g.data())?,
        )
    };
    let db = geo.bias_grad(g.data())?;
    Ok((
        Tensor::new(w.shape().clone(), dw)?,
        Tensor::new(b.shape().clone(), db)?,
        Tensor::new(x.shape().clone(), dx)?,
    ))
}

/// Tangents of the three operands of a conv.
#[derive(Debug, Clone, Copy)]
pub struct ConvTangents<'a, T: Scalar> {
    /// Weight tangent.
    pub dw: &'a Tensor<T>,
    /// Bias tangent.
    pub db: &'a Tensor<T>,
    /// Input tangent.
    pub dx: &'a Tensor<T>,
}

/// JVP of `conv` (bilinear): `conv(dw, db, x) + conv(w, 0, dx)`.
pub fn conv_jvp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    t: ConvTangents<'_, T>,
) -> Result<Tensor<T>> {
    jvp(false, w, b, x, p, t)
}

/// JVP of `convTranspose` (bilinear): `convT(dw, db, x) + convT(w, 0, dx)`.
pub fn conv_transpose_jvp<T: Scalar>(
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    t: ConvTangents<'_, T>,
) -> Result<Tensor<T>> {
    jvp(true, w, b, x, p, t)
}

fn jvp<T: Scalar>(
    transpose: bool,
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
    p: ConvParams<'_>,
    t: ConvTangents<'_, T>,
) -> Result<Tensor<T>> {
    let op = if transpose { "convTranspose" } else { "conv" };
    for (what, a, da) in [("weight", w, t.dw), ("bias", b, t.db), ("input", x, t.dx)] {
        if a.shape() != da.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "{what} tangent has shape {}, expected {}",
                    da.shape(),
                    a.shape()
                ),
            ));
        }
    }
    let mut y = apply(transpose, t.dw, t.db, x, p)?;
    let zero = Tensor::try_zeros(op, b.shape().clone())?;
    y.add_assign(&apply(transpose, w, &zero, t.dx, p)?)?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_output_needs_no_window_table() {
        // No output channel: an empty output, whatever the kernel's volume (2⁶⁶ cells here,
        // over a one-cell input padded by 2³² on each side).
        let w = Tensor::<f64>::zeros([0, 1, 1 << 33, 1 << 33]);
        let b = Tensor::<f64>::zeros([0]);
        let x = Tensor::<f64>::ones([1, 1, 1]);
        let p = ConvParams {
            stride: &[1, 1],
            padding: &[1 << 32, 1 << 32],
        };
        let y = conv(&w, &b, &x, p).unwrap();
        assert_eq!((y.shape().dims(), y.data().len()), (&[0, 2, 2][..], 0));
        let (dw, db, dx) = conv_vjp(&w, &b, &x, p, &y).unwrap();
        assert_eq!((dw.data().len(), db.data().len()), (0, 0));
        assert_eq!(dx.data(), &[0.0]);
    }

    #[test]
    fn one_d_conv_by_hand() {
        // w = [1, 2], x = [1, 2, 3], stride 1, padding 1: windows [0,1], [1,2], [2,3], [3,0].
        let w = Tensor::<f64>::new([1, 1, 2], vec![1.0, 2.0]).unwrap();
        let b = Tensor::<f64>::vector(vec![0.5]);
        let x = Tensor::<f64>::new([1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        let p = ConvParams {
            stride: &[1],
            padding: &[1],
        };
        let y = conv(&w, &b, &x, p).unwrap();
        assert_eq!(y.data(), &[2.5, 5.5, 8.5, 3.5]);
        // convTranspose of [1, 1] with the same w (1 in, 1 out), padding 0: [1, 3, 2] + b.
        let x2 = Tensor::<f64>::new([1, 2], vec![1.0, 1.0]).unwrap();
        let p0 = ConvParams {
            stride: &[1],
            padding: &[0],
        };
        let y2 = conv_transpose(&w, &b, &x2, p0).unwrap();
        assert_eq!(y2.data(), &[1.5, 3.5, 2.5]);
    }
}
