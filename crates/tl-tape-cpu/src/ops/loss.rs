//! Loss kernels: `mseLoss(ŷ, y) = Σ(ŷ − y)² / N` with N the element count (1 for a scalar), and
//! its VJP `(2(ŷ − y)/N · g, −2(ŷ − y)/N · g)`.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::alloc::try_collect;
use tl_spec::{Error as SpecError, Scalar, Shape, Tensor};

use super::{Grads, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of a loss.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::MseLoss => {
            same_shapes(op, x[0], x[1])?;
            let mut acc = [T::zero(); 8];
            let (a, b) = (x[0].data().chunks_exact(8), x[1].data().chunks_exact(8));
            let (ra, rb) = (a.remainder(), b.remainder());
            for (ca, cb) in a.zip(b) {
                for ((s, &p), &q) in acc.iter_mut().zip(ca).zip(cb) {
                    let d = p - q;
                    *s += d * d;
                }
            }
            let mut s = acc.iter().fold(T::zero(), |s, &v| s + v);
            for (&p, &q) in ra.iter().zip(rb) {
                s += (p - q) * (p - q);
            }
            Ok(Tensor::scalar(s / count(x[0].shape())))
        }
        _ => Err(wrong_family(op, "loss")),
    }
}

/// Operand cotangents of a loss (the cotangent `g` is a scalar).
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    match op {
        Op::MseLoss => {
            same_shapes(op, x[0], x[1])?;
            check_shape(op, "cotangent", g, y.shape())?;
            check_shape(op, "cotangent", g, &Shape::scalar())?;
            let c = T::lit(2.0) * g.data()[0] / count(x[0].shape());
            let n = x[0].numel();
            let diff = x[0].data().iter().zip(x[1].data());
            let da = try_collect(op.name(), "cotangent", n, diff.map(|(&p, &q)| c * (p - q)))?;
            let db = try_collect(op.name(), "cotangent", n, da.iter().map(|&v| -v))?;
            Ok(smallvec![
                Some(tensor(x[0].shape().clone(), da)?),
                Some(tensor(x[1].shape().clone(), db)?)
            ])
        }
        _ => Err(wrong_family(op, "loss")),
    }
}

fn count<T: Scalar>(s: &Shape) -> T {
    T::lit(s.numel().max(1) as f64)
}

fn same_shapes<T: Scalar>(op: &Op, a: &Tensor<T>, b: &Tensor<T>) -> Result<()> {
    if a.shape() == b.shape() {
        Ok(())
    } else {
        Err(SpecError::shape(
            op.name(),
            format!(
                "prediction {} and target {} must have the same shape",
                a.shape(),
                b.shape()
            ),
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_reduction_and_vjp_by_hand() {
        let a = Tensor::<f64>::vector(vec![1.0, 2.0, 3.0, 4.0]);
        let b = Tensor::<f64>::vector(vec![0.0, 2.0, 1.0, 4.0]);
        let y = forward(&Op::MseLoss, &[&a, &b]).unwrap();
        assert_eq!(y.item().unwrap(), (1.0 + 4.0) / 4.0);
        let gr = backward(&Op::MseLoss, &[&a, &b], &y, &Tensor::scalar(2.0)).unwrap();
        // 2(a−b)/N·g = (a − b) with N = 4, g = 2
        assert_eq!(gr[0].as_ref().unwrap().data(), &[1.0, 0.0, 2.0, 0.0]);
        assert_eq!(gr[1].as_ref().unwrap().data(), &[-1.0, -0.0, -2.0, -0.0]);
        let s = forward(&Op::MseLoss, &[&Tensor::scalar(3.0), &Tensor::scalar(1.0)]).unwrap();
        assert_eq!(s.item().unwrap(), 4.0);
    }
}
