//! Reduction kernels: `sum` (every element → scalar), `reduceSum(axis)` and `reduceMean(axis)`
//! (the axis is removed, no keepdim), and their backward passes (copies of `g` along the reduced
//! axis).
//!
//! An axis reduction views the input as (outer, n, inner). With `inner > 1` each of the `n` input
//! rows is added into the output row (a vectorizable axpy); with `inner == 1` (the last axis)
//! each row is summed with eight accumulators.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Shape, Tensor};

use super::{Grads, check_arity, check_backward, check_shape, sum_slice, tensor, wrong_family};
use crate::Result;

/// Forward value of a reduction.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let x = x[0];
    match op {
        Op::Sum => Ok(Tensor::scalar(sum_slice(x.data()))),
        Op::ReduceSum(axis) => reduce_axis(op, x, *axis, false),
        Op::ReduceMean(axis) => reduce_axis(op, x, *axis, true),
        _ => Err(wrong_family(op, "reduce")),
    }
}

/// Operand cotangent of a reduction: `g` copied along the reduced axes (÷ n for the mean).
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_backward(op, x, y, g)?;
    let x = x[0];
    let dx = match op {
        Op::Sum => {
            check_shape(op, "cotangent", g, &Shape::scalar())?;
            let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", x.numel())?;
            dx.fill(g.data()[0]);
            tensor(x.shape().clone(), dx)?
        }
        Op::ReduceSum(axis) => expand_axis(op, x.shape(), *axis, g, false)?,
        Op::ReduceMean(axis) => expand_axis(op, x.shape(), *axis, g, true)?,
        _ => return Err(wrong_family(op, "reduce")),
    };
    Ok(smallvec![Some(dx)])
}

/// `(outer, n, inner)` around `axis` and the output shape; an axis out of range is an error
/// naming the op, the axis and the shape.
fn split(op: &Op, s: &Shape, axis: usize) -> Result<(usize, usize, usize, Shape)> {
    let d = s.dims();
    if axis >= d.len() {
        return Err(SpecError::param(
            op.name(),
            format!("axis {axis} out of range for shape {s} (rank {})", d.len()),
        )
        .into());
    }
    // Saturating: a zero-element input may have dims whose product overflows; the output's
    // size is checked before anything is allocated.
    let outer = d[..axis].iter().fold(1usize, |a, &b| a.saturating_mul(b));
    let inner = d[axis + 1..]
        .iter()
        .fold(1usize, |a, &b| a.saturating_mul(b));
    let mut out = d.to_vec();
    out.remove(axis);
    Ok((outer, d[axis], inner, Shape::new(&out)))
}

fn reduce_axis<T: Scalar>(op: &Op, x: &Tensor<T>, axis: usize, mean: bool) -> Result<Tensor<T>> {
    let (_, n, inner, out_shape) = split(op, x.shape(), axis)?;
    let len = out_shape.check_size(op.name())?;
    let src = x.data();
    let mut out = tl_spec::alloc::try_vec(op.name(), "output", len, T::zero())?;
    if inner == 1 {
        if n > 0 {
            for (o, row) in out.iter_mut().zip(src.chunks_exact(n)) {
                *o = sum_slice(row);
            }
        }
    } else if inner > 0 && n > 0 {
        for (orow, block) in out.chunks_exact_mut(inner).zip(src.chunks_exact(n * inner)) {
            for row in block.chunks_exact(inner) {
                for (o, &v) in orow.iter_mut().zip(row) {
                    *o += v;
                }
            }
        }
    }
    if mean {
        let scale = T::one() / T::lit(n as f64);
        for o in &mut out {
            *o *= scale;
        }
    }
    tensor(out_shape, out)
}

fn expand_axis<T: Scalar>(
    op: &Op,
    x: &Shape,
    axis: usize,
    g: &Tensor<T>,
    mean: bool,
) -> Result<Tensor<T>> {
    let (_, n, inner, out_shape) = split(op, x, axis)?;
    check_shape(op, "cotangent", g, &out_shape)?;
    let gd = g.data();
    // Every element is written below (each block is `n` rows of `inner`).
    let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", x.numel())?;
    let scale = if mean {
        T::one() / T::lit(n as f64)
    } else {
        T::one()
    };
    let value = |v: T| if mean { v * scale } else { v };
    if n > 0 && inner > 0 {
        for (block, grow) in dx.chunks_exact_mut(n * inner).zip(gd.chunks_exact(inner)) {
            if inner == 1 {
                // The last axis: one value per block (a copy per element would be a call).
                block.fill(value(grow[0]));
                continue;
            }
            for row in block.chunks_exact_mut(inner) {
                if mean {
                    for (d, &v) in row.iter_mut().zip(grow) {
                        *d = v * scale;
                    }
                } else {
                    row.copy_from_slice(grow);
                }
            }
        }
    }
    tensor(x.clone(), dx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_reductions_by_hand() {
        let x = Tensor::<f64>::from_fn([2, 3], |i| i as f64); // [[0,1,2],[3,4,5]]
        let f = |op: Op| forward(&op, &[&x]).unwrap().data().to_vec();
        assert_eq!(f(Op::ReduceSum(0)), [3.0, 5.0, 7.0]);
        assert_eq!(f(Op::ReduceSum(1)), [3.0, 12.0]);
        assert_eq!(f(Op::ReduceMean(0)), [1.5, 2.5, 3.5]);
        assert_eq!(f(Op::ReduceMean(1)), [1.0, 4.0]);
        assert_eq!(f(Op::Sum), [15.0]);
        let op = Op::ReduceMean(0);
        let y = forward(&op, &[&x]).unwrap();
        let g = Tensor::vector(vec![2.0, 4.0, 6.0]);
        let dx = backward(&op, &[&x], &y, &g).unwrap();
        assert_eq!(
            dx[0].as_ref().unwrap().data(),
            &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
        );
    }

    /// The backward writes every element of a buffer it takes from the pool without a fill:
    /// spare buffers full of NaN must not show through, on the last axis (one value per
    /// block) or an inner one.
    #[test]
    fn axis_backward_overwrites_a_spare_buffer_everywhere() {
        let x = Tensor::<f64>::from_fn([2, 3, 2], |i| i as f64);
        let mut spare = tl_spec::pool::Pool::<f64>::new();
        let cases: [(Op, Vec<f64>, Vec<f64>); 4] = [
            (
                Op::ReduceSum(2),
                (1..=6).map(f64::from).collect(),
                [1., 1., 2., 2., 3., 3., 4., 4., 5., 5., 6., 6.].to_vec(),
            ),
            (
                Op::ReduceMean(2),
                (1..=6).map(f64::from).collect(),
                [0.5, 0.5, 1., 1., 1.5, 1.5, 2., 2., 2.5, 2.5, 3., 3.].to_vec(),
            ),
            (
                Op::ReduceSum(1),
                [1., 2., 3., 4.].to_vec(),
                [1., 2., 1., 2., 1., 2., 3., 4., 3., 4., 3., 4.].to_vec(),
            ),
            (
                Op::ReduceMean(0),
                (1..=6).map(f64::from).collect(),
                [0.5, 1., 1.5, 2., 2.5, 3., 0.5, 1., 1.5, 2., 2.5, 3.].to_vec(),
            ),
        ];
        for (op, g, want) in cases {
            spare.put(vec![f64::NAN; 12]);
            let _installed = tl_spec::pool::install(&mut spare);
            let y = forward(&op, &[&x]).unwrap();
            let g = Tensor::new(y.shape().clone(), g).unwrap();
            let dx = backward(&op, &[&x], &y, &g).unwrap();
            assert_eq!(dx[0].as_ref().unwrap().data(), &want[..], "{op:?}");
        }
    }

    #[test]
    fn axis_out_of_range_names_op_axis_and_shape() {
        let x = Tensor::<f64>::zeros([2, 3]);
        let e = forward(&Op::ReduceSum(2), &[&x]).unwrap_err().to_string();
        assert!(
            e.contains("reduceSum") && e.contains("axis 2") && e.contains("[2, 3]"),
            "{e}"
        );
    }
}
