//! Reductions: `sum` (all elements), `reduceSum(axis)` and `reduceMean(axis)` (axis removed).

use crate::{Error, Result, Scalar, Shape, Tensor};

/// Sum of all elements → scalar.
pub fn sum<T: Scalar>(x: &Tensor<T>) -> Tensor<T> {
    Tensor::scalar(x.data().iter().copied().sum())
}
/// VJP of `sum`: `g` (a scalar) copied to every element.
pub fn sum_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    if !g.shape().is_scalar() {
        return Err(Error::shape(
            "sum",
            format!("cotangent must be a scalar, got {}", g.shape()),
        ));
    }
    Tensor::try_full("sum", x.shape().clone(), g.data()[0])
}

/// Shape rule of `reduceSum` / `reduceMean`: the axis is removed.
pub fn reduce_axis_shape(op: &'static str, x: &Shape, axis: usize) -> Result<Shape> {
    x.remove_axis(op, axis)
}

fn reduce_axis<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    axis: usize,
    scale: T,
) -> Result<Tensor<T>> {
    let (outer, n, inner) = x.shape().split_at_axis(op, axis)?;
    let out_shape = reduce_axis_shape(op, x.shape(), axis)?;
    let src = x.data();
    let len = out_shape.check_size(op)?;
    let mut out = crate::alloc::try_vec(op, "output", len, T::zero())?;
    if len == 0 {
        // No output element: nothing to sum. The loops below would still walk `outer` (which
        // can be 2⁶² for an input such as [2⁶², 3, 0]) with an empty inner extent.
        return Tensor::new(out_shape, out);
    }
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = T::zero();
            for k in 0..n {
                acc += src[(o * n + k) * inner + i];
            }
            out[o * inner + i] = acc * scale;
        }
    }
    Tensor::new(out_shape, out)
}

fn expand_axis<T: Scalar>(
    op: &'static str,
    x: &Shape,
    axis: usize,
    g: &Tensor<T>,
    scale: T,
) -> Result<Tensor<T>> {
    let expected = reduce_axis_shape(op, x, axis)?;
    if g.shape() != &expected {
        return Err(Error::shape(
            op,
            format!("cotangent has shape {}, expected {expected}", g.shape()),
        ));
    }
    let (_, n, inner) = x.split_at_axis(op, axis)?;
    let gd = g.data();
    Tensor::try_from_fn(op, x.clone(), |flat| {
        let o = flat / (n * inner);
        let i = flat % inner;
        gd[o * inner + i] * scale
    })
}

/// Sum along `axis` (removed). PyTorch: `x.sum(dim=axis)`.
pub fn reduce_sum<T: Scalar>(x: &Tensor<T>, axis: usize) -> Result<Tensor<T>> {
    reduce_axis("reduceSum", x, axis, T::one())
}
/// VJP of `reduceSum`: `g` copied along the reduced axis.
pub fn reduce_sum_vjp<T: Scalar>(x: &Tensor<T>, axis: usize, g: &Tensor<T>) -> Result<Tensor<T>> {
    expand_axis("reduceSum", x.shape(), axis, g, T::one())
}

/// Mean along `axis` (removed), dividing by that axis' length. PyTorch: `x.mean(dim=axis)`.
pub fn reduce_mean<T: Scalar>(x: &Tensor<T>, axis: usize) -> Result<Tensor<T>> {
    let n = x.shape().dim("reduceMean", axis)?;
    reduce_axis("reduceMean", x, axis, T::one() / T::lit(n as f64))
}
/// VJP of `reduceMean`: `g / n` copied along the reduced axis.
pub fn reduce_mean_vjp<T: Scalar>(x: &Tensor<T>, axis: usize, g: &Tensor<T>) -> Result<Tensor<T>> {
    let n = x.shape().dim("reduceMean", axis)?;
    expand_axis(
        "reduceMean",
        x.shape(),
        axis,
        g,
        T::one() / T::lit(n as f64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_reductions_by_hand() {
        let x = Tensor::<f64>::from_fn([2, 3], |i| i as f64); // [[0,1,2],[3,4,5]]
        assert_eq!(reduce_sum(&x, 0).unwrap().data(), &[3.0, 5.0, 7.0]);
        assert_eq!(reduce_sum(&x, 1).unwrap().data(), &[3.0, 12.0]);
        assert_eq!(reduce_mean(&x, 1).unwrap().data(), &[1.0, 4.0]);
        let g = Tensor::vector(vec![1.0, 2.0]);
        assert_eq!(
            reduce_mean_vjp(&x, 1, &g).unwrap().data(),
            &[
                1.0 / 3.0,
                1.0 / 3.0,
                1.0 / 3.0,
                2.0 / 3.0,
                2.0 / 3.0,
                2.0 / 3.0
            ]
        );
        assert_eq!(sum(&x).item().unwrap(), 15.0);
    }

    #[test]
    fn axis_out_of_range_is_an_error() {
        let x = Tensor::<f64>::zeros([2, 3]);
        let e = reduce_sum(&x, 2).unwrap_err().to_string();
        assert!(e.contains("reduceSum") && e.contains("axis 2"), "{e}");
    }
}
