//! Row softmax and log-softmax along the last axis (leading axes folded into rows; a scalar is
//! one row of one column), both stable (the row max is subtracted first), log-softmax computed
//! directly as `x − m − log Σ exp(x − m)`, never as `log(softmax)` (the exponentials in f32 by
//! [`tl_spec::approx::exp_f32`], summed in the blocked order of `sum_slice`).
//!
//! The backward passes reuse the forward output: softmax `dx = y·(g − Σ g·y)`, log-softmax
//! `dx = g − exp(y)·Σ g`. Both directions run their rows as [`crate::simd::vectorize`] kernels
//! (the CPU's widest instruction set; the row max in 16 lanes); a row of −∞ stays NaN, as in
//! PyTorch (`maskedSoftmax` is the form that gives such rows zeros).

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, approx, check_arity, check_shape, dot_slice, sum_slice, tensor, wrong_family};
use crate::Result;

/// Forward value of `softmax` / `logSoftmax`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let x = x[0];
    let log = match op {
        Op::Softmax => false,
        Op::LogSoftmax => true,
        _ => return Err(wrong_family(op, "softmax")),
    };
    let c = cols(op, x)?;
    let out = tl_spec::alloc::try_for_overwrite(op.name(), "output", x.numel())?;
    // logSoftmax's exponentials of one row, summed after (a loop that sums as it goes would
    // run one element at a time).
    let exps = match log {
        true => tl_spec::alloc::try_for_overwrite(op.name(), "row exponentials", c)?,
        false => Vec::new(),
    };
    let out = crate::simd::vectorize(Forward {
        x: x.data(),
        c,
        log,
        out,
        exps,
    });
    tensor(x.shape().clone(), out)
}

/// The forward's rows as a kernel for [`crate::simd::vectorize`] (compiled for the CPU's best
/// instruction set; the max in 16 lanes, [`super::attention::row_max`]).
struct Forward<'a, T> {
    x: &'a [T],
    c: usize,
    log: bool,
    /// The output (every value overwritten).
    out: Vec<T>,
    /// logSoftmax's row of exponentials (`c` values; empty for softmax).
    exps: Vec<T>,
}

impl<T: Scalar> crate::simd::Kernel for Forward<'_, T> {
    type Output = Vec<T>;

    #[inline(always)]
    fn call(self) -> Vec<T> {
        let (mut out, mut exps) = (self.out, self.exps);
        let rows = self
            .x
            .chunks_exact(self.c)
            .zip(out.chunks_exact_mut(self.c));
        for (row, o) in rows {
            let m = super::attention::row_max(row, None);
            for (o, &v) in o.iter_mut().zip(row) {
                *o = v - m;
            }
            if self.log {
                for (e, &v) in exps.iter_mut().zip(o.iter()) {
                    *e = approx::exp(v);
                }
                let lse = sum_slice(&exps).ln();
                for o in o.iter_mut() {
                    *o -= lse;
                }
            } else {
                for o in o.iter_mut() {
                    *o = approx::exp(*o);
                }
                let inv = T::one() / sum_slice(o);
                for o in o.iter_mut() {
                    *o *= inv;
                }
            }
        }
        tl_spec::pool::give(exps);
        out
    }
}

/// Operand cotangent of `softmax` / `logSoftmax`, from the forward output `y`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let x = x[0];
    let log = match op {
        Op::Softmax => false,
        Op::LogSoftmax => true,
        _ => return Err(wrong_family(op, "softmax")),
    };
    check_shape(op, "output", y, x.shape())?;
    check_shape(op, "cotangent", g, x.shape())?;
    let c = cols(op, x)?;
    let dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", y.numel())?;
    let dx = crate::simd::vectorize(Backward {
        y: y.data(),
        g: g.data(),
        c,
        log,
        dx,
    });
    Ok(smallvec![Some(tensor(x.shape().clone(), dx)?)])
}

/// The backward's rows as a kernel for [`crate::simd::vectorize`].
struct Backward<'a, T> {
    y: &'a [T],
    g: &'a [T],
    c: usize,
    log: bool,
    /// The cotangent (every value overwritten).
    dx: Vec<T>,
}

impl<T: Scalar> crate::simd::Kernel for Backward<'_, T> {
    type Output = Vec<T>;

    #[inline(always)]
    fn call(self) -> Vec<T> {
        let mut dx = self.dx;
        let rows = self.y.chunks_exact(self.c).zip(self.g.chunks_exact(self.c));
        for ((yr, gr), d) in rows.zip(dx.chunks_exact_mut(self.c)) {
            if self.log {
                let s = sum_slice(gr);
                for ((d, &y), &g) in d.iter_mut().zip(yr).zip(gr) {
                    *d = g - approx::exp(y) * s;
                }
            } else {
                let dot = dot_slice(yr, gr);
                for ((d, &y), &g) in d.iter_mut().zip(yr).zip(gr) {
                    *d = y * (g - dot);
                }
            }
        }
        dx
    }
}

/// The row length (last axis; 1 for a scalar). An empty last axis is an error.
fn cols<T: Scalar>(op: &Op, x: &Tensor<T>) -> Result<usize> {
    let (_, c) = x.shape().rows_cols();
    if c == 0 {
        return Err(SpecError::shape(
            op.name(),
            format!("last axis must be non-empty, got shape {}", x.shape()),
        )
        .into());
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_normalize_and_large_inputs_are_stable() {
        let x = Tensor::<f64>::new([2, 3], vec![1000.0, 1001.0, 1002.0, -5.0, 0.0, 5.0]).unwrap();
        let y = forward(&Op::Softmax, &[&x]).unwrap();
        for r in y.data().chunks(3) {
            assert!((r.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        let e: Vec<f64> = [0.0f64, 1.0, 2.0].iter().map(|v| v.exp()).collect();
        let z: f64 = e.iter().sum();
        assert!((y.data()[2] - e[2] / z).abs() < 1e-15);
        let l = forward(&Op::LogSoftmax, &[&x]).unwrap();
        assert!((l.data()[0] - (e[0] / z).ln()).abs() < 1e-12);
        // A row far below the max would underflow in log(softmax); the direct form stays finite.
        let far = Tensor::<f64>::vector(vec![0.0, -2000.0]);
        assert_eq!(
            forward(&Op::LogSoftmax, &[&far]).unwrap().data()[1],
            -2000.0
        );
        // A scalar is one row of one column.
        let s = Tensor::<f64>::scalar(3.5);
        assert_eq!(forward(&Op::Softmax, &[&s]).unwrap().data(), &[1.0]);
        assert_eq!(forward(&Op::LogSoftmax, &[&s]).unwrap().data(), &[0.0]);
    }

    #[test]
    fn a_row_of_negative_infinity_is_nan_and_leaves_the_others_alone() {
        // PyTorch: softmax of an all −∞ row is NaN (maskedSoftmax is the form that gives 0).
        let x = Tensor::<f32>::new(
            [2, 3],
            vec![f32::NEG_INFINITY; 3]
                .into_iter()
                .chain([0.0, 1.0, 2.0])
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for op in [Op::Softmax, Op::LogSoftmax] {
            let y = forward(&op, &[&x]).unwrap();
            assert!(
                y.data()[..3].iter().all(|v| v.is_nan()),
                "{op}: {:?}",
                y.data()
            );
            assert!(
                y.data()[3..].iter().all(|v| v.is_finite()),
                "{op}: {:?}",
                y.data()
            );
        }
    }

    #[test]
    fn gradients_are_orthogonal_to_constant_shifts() {
        // Softmax is shift invariant along a row, so each row of dx sums to zero.
        let x = Tensor::<f64>::from_fn([2, 4], |i| (i as f64 * 0.7).sin());
        let g = Tensor::<f64>::from_fn([2, 4], |i| (i as f64 * 1.3).cos());
        for op in [Op::Softmax, Op::LogSoftmax] {
            let y = forward(&op, &[&x]).unwrap();
            let dx = backward(&op, &[&x], &y, &g).unwrap();
            for r in dx[0].as_ref().unwrap().data().chunks(4) {
                assert!(r.iter().sum::<f64>().abs() < 1e-14, "{op}: {r:?}");
            }
        }
    }
}
