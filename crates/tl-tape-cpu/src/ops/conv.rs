//! Convolution kernels: `conv` and `convTranspose`, N-D (spatial rank 1..=8), through im2col and
//! the GEMM of [`super::linalg::gemm`].
//!
//! The weight is `(A, C, k..)` with A the channels of the small side (conv output, convT input)
//! and C those of the big side (conv input, convT output). Per batch entry, with
//! `cols = im2col(big)` of shape `(C·K, O)` (K kernel cells, O small cells, padded cells 0):
//! - conv: `y = W·cols + b`; backward `dW += G·colsᵀ`, `dx = col2im(Wᵀ·G)`, `db = Σ G`;
//! - convTranspose: `y = col2im(Wᵀ·x) + b`; backward `dx = W·im2col(G)`,
//!   `dW += x·im2col(G)ᵀ`, `db = Σ G`.
//!
//! The window index table is built once per call ([`super::window`]); im2col and col2im are
//! flat gathers/scatters through it, with one `cols` buffer reused across the batch.

use ndarray::{ArrayView2, ShapeBuilder};
use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use super::linalg::gemm;
use super::window::{Geometry, PAD, Table, bad, split};
use super::{Grads, check_arity, check_shape, sum_slice, tensor, wrong_family};
use crate::Result;

/// The dims of one conv application.
struct Conv {
    transpose: bool,
    batches: usize,
    batched: bool,
    /// Small-side channels (weight dim 0).
    a: usize,
    /// Big-side channels (weight dim 1).
    c: usize,
    geo: Geometry,
}

impl Conv {
    fn of<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Conv> {
        let (transpose, stride, padding) = match op {
            Op::Conv { stride, padding } => (false, stride, padding),
            Op::ConvTranspose { stride, padding } => (true, stride, padding),
            _ => return Err(wrong_family(op, "conv")),
        };
        check_arity(op, x)?;
        let (w, b, xs) = (
            x[0].shape().dims(),
            x[1].shape().dims(),
            x[2].shape().dims(),
        );
        if w.len() < 3 {
            return Err(bad(op, format!("weight {w:?} must have rank ≥ 3")));
        }
        let d = w.len() - 2;
        let (batches, xc, spatial) = split(op, "input", xs, d)?;
        let (a, c) = (w[0], w[1]);
        let (in_c, out_c) = if transpose { (a, c) } else { (c, a) };
        if xc != in_c || b != [out_c] {
            return Err(bad(
                op,
                format!("weight {w:?}, bias {b:?} and input {xs:?} disagree"),
            ));
        }
        let geo = if transpose {
            Geometry::transposed(op, &spatial, &w[2..], stride, padding)?
        } else {
            Geometry::forward(op, &spatial, &w[2..], stride, padding)?
        };
        Ok(Conv {
            transpose,
            batches,
            batched: xs.len() == d + 2,
            a,
            c,
            geo,
        })
    }

    fn out_dims(&self) -> Vec<usize> {
        let mut dims = Vec::with_capacity(self.geo.big.len() + 2);
        if self.batched {
            dims.push(self.batches);
        }
        if self.transpose {
            dims.push(self.c);
            dims.extend_from_slice(&self.geo.big);
        } else {
            dims.push(self.a);
            dims.extend_from_slice(&self.geo.small);
        }
        dims
    }
}

/// `cols[(c·K + k)·O + o] = big[c·B + table[k·O + o]]` (0 where padded).
fn im2col<T: Scalar>(t: &Table, channels: usize, big: &[T], cols: &mut [T]) {
    let (kl, ol, bl) = (t.kernel_len, t.small_len, t.big_len);
    for c in 0..channels {
        let plane = &big[c * bl..(c + 1) * bl];
        for k in 0..kl {
            let row = &mut cols[(c * kl + k) * ol..(c * kl + k + 1) * ol];
            for (r, &i) in row.iter_mut().zip(&t.idx[k * ol..(k + 1) * ol]) {
                *r = if i == PAD { T::zero() } else { plane[i] };
            }
        }
    }
}

/// `big[c·B + table[k·O + o]] += cols[(c·K + k)·O + o]` (padded cells dropped).
fn col2im<T: Scalar>(t: &Table, channels: usize, cols: &[T], big: &mut [T]) {
    let (kl, ol, bl) = (t.kernel_len, t.small_len, t.big_len);
    for c in 0..channels {
        let plane = &mut big[c * bl..(c + 1) * bl];
        for k in 0..kl {
            let row = &cols[(c * kl + k) * ol..(c * kl + k + 1) * ol];
            for (&v, &i) in row.iter().zip(&t.idx[k * ol..(k + 1) * ol]) {
                if i != PAD {
                    plane[i] += v;
                }
            }
        }
    }
}

fn view<'a, T: Scalar>(
    op: &Op,
    data: &'a [T],
    rows: usize,
    cols: usize,
) -> Result<ArrayView2<'a, T>> {
    ArrayView2::from_shape((rows, cols).strides((cols, 1)), data)
        .map_err(|e| bad(op, format!("matrix view: {e}")))
}

/// Forward value of `conv` / `convTranspose`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let cv = Conv::of(op, x)?;
    let (w, b, input) = (x[0].data(), x[1].data(), x[2].data());
    let t = cv.geo.table();
    let (a, c, kl, ol, bl) = (cv.a, cv.c, t.kernel_len, t.small_len, t.big_len);
    let wv = view(op, w, a, c * kl)?;
    let mut cols = vec![T::zero(); c * kl * ol];
    if cv.transpose {
        let mut y = vec![T::zero(); cv.batches * c * bl];
        for n in 0..cv.batches {
            let xn = view(op, &input[n * a * ol..(n + 1) * a * ol], a, ol)?;
            gemm(op, &wv.t(), &xn, T::zero(), &mut cols)?;
            let yn = &mut y[n * c * bl..(n + 1) * c * bl];
            col2im(&t, c, &cols, yn);
            add_bias(yn, b, bl);
        }
        tensor(cv.out_dims(), y)
    } else {
        let mut y = vec![T::zero(); cv.batches * a * ol];
        for n in 0..cv.batches {
            im2col(&t, c, &input[n * c * bl..(n + 1) * c * bl], &mut cols);
            let yn = &mut y[n * a * ol..(n + 1) * a * ol];
            gemm(op, &wv, &view(op, &cols, c * kl, ol)?, T::zero(), yn)?;
            add_bias(yn, b, ol);
        }
        tensor(cv.out_dims(), y)
    }
}

fn add_bias<T: Scalar>(y: &mut [T], b: &[T], cells: usize) {
    for (row, &bc) in y.chunks_exact_mut(cells.max(1)).zip(b) {
        for v in row {
            *v += bc;
        }
    }
}

/// Operand cotangents `(dw, db, dx)` of `conv` / `convTranspose`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    let cv = Conv::of(op, x)?;
    let out = tl_spec::Shape::from(cv.out_dims());
    check_shape(op, "output", y, &out)?;
    check_shape(op, "cotangent", g, &out)?;
    let (w, input, gd) = (x[0].data(), x[2].data(), g.data());
    let t = cv.geo.table();
    let (a, c, kl, ol, bl) = (cv.a, cv.c, t.kernel_len, t.small_len, t.big_len);
    let wv = view(op, w, a, c * kl)?;
    let mut cols = vec![T::zero(); c * kl * ol];
    let mut dw = vec![T::zero(); a * c * kl];
    let mut dx = vec![T::zero(); input.len()];
    let out_c = if cv.transpose { c } else { a };
    let mut db = vec![T::zero(); out_c];
    for n in 0..cv.batches {
        if cv.transpose {
            // g is big (C, B), x small (A, O).
            let gn = &gd[n * c * bl..(n + 1) * c * bl];
            im2col(&t, c, gn, &mut cols);
            let colv = view(op, &cols, c * kl, ol)?;
            let xn = view(op, &input[n * a * ol..(n + 1) * a * ol], a, ol)?;
            gemm(
                op,
                &wv,
                &colv,
                T::zero(),
                &mut dx[n * a * ol..(n + 1) * a * ol],
            )?;
            gemm(op, &xn, &colv.t(), T::one(), &mut dw)?;
            bias_sums(&mut db, gn, bl);
        } else {
            // x is big (C, B), g small (A, O).
            im2col(&t, c, &input[n * c * bl..(n + 1) * c * bl], &mut cols);
            let gn = &gd[n * a * ol..(n + 1) * a * ol];
            let gv = view(op, gn, a, ol)?;
            gemm(
                op,
                &gv,
                &view(op, &cols, c * kl, ol)?.t(),
                T::one(),
                &mut dw,
            )?;
            gemm(op, &wv.t(), &gv, T::zero(), &mut cols)?;
            col2im(&t, c, &cols, &mut dx[n * c * bl..(n + 1) * c * bl]);
            bias_sums(&mut db, gn, ol);
        }
    }
    Ok(smallvec![
        Some(tensor(x[0].shape().clone(), dw)?),
        Some(tensor(x[1].shape().clone(), db)?),
        Some(tensor(x[2].shape().clone(), dx)?),
    ])
}

fn bias_sums<T: Scalar>(db: &mut [T], g: &[T], cells: usize) {
    for (d, row) in db.iter_mut().zip(g.chunks_exact(cells.max(1))) {
        *d += sum_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_d_conv_and_its_transpose_by_hand() {
        // 1×1×2×2 weight [[1, 2], [3, 4]] on a 3×3 ramp, stride 1, no padding.
        let w = Tensor::<f64>::new([1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::<f64>::vector(vec![1.0]);
        let x = Tensor::<f64>::new([1, 3, 3], (0..9).map(f64::from).collect()).unwrap();
        let y = forward(&Op::conv2d(1, 0), &[&w, &b, &x]).unwrap();
        // Window at (0,0): 0·1 + 1·2 + 3·3 + 4·4 = 27; each step right adds 10, down adds 30.
        assert_eq!(y.shape().dims(), &[1, 2, 2]);
        assert_eq!(y.data(), &[28.0, 38.0, 58.0, 68.0]);
        // convTranspose of a single 1 at (0,0) with padding 0 places w there: out 2×2 = w + b.
        let one = Tensor::<f64>::new([1, 1, 1], vec![1.0]).unwrap();
        let yt = forward(&Op::conv_transpose2d(1, 0), &[&w, &b, &one]).unwrap();
        assert_eq!(yt.data(), &[2.0, 3.0, 4.0, 5.0]);
    }
}
