//! `crossEntropy` with labels from the Nat environment (positions `labels_at..labels_at + rows`): per
//! row `lse(row) − row[label]` with a max-shifted log-sum-exp, averaged over all rows; a label ≥
//! classes contributes 0 and gets no gradient. Backward: `(softmax(row) − onehot) · g / rows`,
//! with each row's log-sum-exp as the forward kept it ([`forward_saving`]) or computed again.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::index::try_nat_vec_at;
use tl_spec::{Scalar, Shape, Tensor};

use super::{
    Grads, approx, check_arity, check_saved, check_shape, out_shape, tensor, wrong_family,
};
use crate::Result;

/// Forward value of `crossEntropy`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>], nats: &[usize]) -> Result<Tensor<T>> {
    let (y, kept) = forward_saving(op, x, nats)?;
    kept.into_iter().for_each(tl_spec::pool::give);
    Ok(y)
}

/// The value and each row's log-sum-exp (what [`backward_saved`] reads instead of computing it
/// again; 0 for a row whose label is out of range, which has no gradient).
pub fn forward_saving<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    nats: &[usize],
) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    let (rows, c, labels) = setup(op, x, nats)?;
    let mut z = tl_spec::alloc::try_zeroed(op.name(), "workspace", rows)?;
    let mut s = T::zero();
    for ((row, &l), z) in x[0].data().chunks_exact(c).zip(&labels).zip(&mut z) {
        if l < c {
            *z = lse(row);
            s += *z - row[l];
        }
    }
    Ok((Tensor::scalar(s / T::lit(rows as f64)), vec![z]))
}

/// Cotangent of the logits, reading each row's log-sum-exp from `saved` ([`forward_saving`]);
/// with `saved` empty it computes them again. The same bits either way; a list that does not fit is an
/// error naming the op.
pub fn backward_saved<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    nats: &[usize],
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    let (rows, c, labels) = setup(op, x, nats)?;
    check_shape(op, "output", y, &Shape::scalar())?;
    check_shape(op, "cotangent", g, &Shape::scalar())?;
    let kept = match saved {
        [] => None,
        _ => {
            check_saved(op, saved, &[rows])?;
            Some(&saved[0])
        }
    };
    let mut dx = tl_spec::alloc::try_zeroed(op.name(), "cotangent", x[0].numel())?;
    crate::simd::vectorize(BackwardRows {
        x: x[0].data(),
        dx: &mut dx,
        c,
        labels: &labels,
        kept: kept.map(|z| &z[..]),
        k: g.data()[0] / T::lit(rows as f64),
    });
    Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
}

/// The backward's rows, `(softmax(row) − onehot)·k`, as a [`crate::simd::vectorize`] kernel:
/// compiled for the CPU's best instruction set, so the exponentials vectorize and their fused
/// multiply-adds are instructions (at the baseline they are libm calls).
struct BackwardRows<'a, T> {
    x: &'a [T],
    dx: &'a mut [T],
    c: usize,
    labels: &'a [usize],
    kept: Option<&'a [T]>,
    k: T,
}

impl<T: Scalar> crate::simd::Kernel for BackwardRows<'_, T> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let (c, k) = (self.c, self.k);
        let cells = self.x.chunks_exact(c).zip(self.dx.chunks_exact_mut(c));
        for (i, ((row, d), &l)) in cells.zip(self.labels).enumerate() {
            if l < c {
                let z = self.kept.map_or_else(|| lse(row), |z| z[i]);
                for (d, &v) in d.iter_mut().zip(row) {
                    *d = approx::exp(v - z) * k;
                }
                d[l] -= k;
            }
        }
    }
}

/// Rows, classes and labels of a checked `crossEntropy` application.
fn setup<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    nats: &[usize],
) -> Result<(usize, usize, Vec<usize>)> {
    check_arity(op, x)?;
    let Op::CrossEntropy { labels_at } = op else {
        return Err(wrong_family(op, "crossEntropy"));
    };
    out_shape(op, x)?;
    let (rows, c) = match x[0].shape().dims() {
        &[c] => (1, c),
        d => (d[0], d[1]),
    };
    Ok((rows, c, try_nat_vec_at(op.name(), nats, *labels_at, rows)?))
}

/// `m + log Σ exp(v − m)`, m the row max.
#[inline(always)]
fn lse<T: Scalar>(row: &[T]) -> T {
    let m = row.iter().copied().fold(T::neg_infinity(), T::max);
    let mut s = T::zero();
    for &v in row {
        s += (v - m).exp(); // a running sum: scalar either way, libm's expf is faster there
    }
    m + s.ln()
}
