//! `concat0` and `sliceRange0` along axis 0: both are contiguous block copies (axis 0 is the
//! outermost axis of a row-major tensor). Backward: `concat0` splits the cotangent,
//! `sliceRange0` writes it into rows `start..start+len` of zeros.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::alloc::try_copy;
use tl_spec::{Scalar, Shape, Tensor};

use super::{Grads, check_arity, check_shape, out_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of `concat0` / `sliceRange0`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let out = out_shape(op, x)?;
    match op {
        Op::Concat => {
            let mut data = tl_spec::alloc::try_with_capacity(op.name(), "output", out.numel())?;
            data.extend_from_slice(x[0].data());
            data.extend_from_slice(x[1].data());
            tensor(out, data)
        }
        Op::Slice { start, len } => {
            let row = row_len(x[0].shape());
            let rows = &x[0].data()[start * row..(start + len) * row];
            tensor(out, tl_spec::alloc::try_copy(op.name(), "output", rows)?)
        }
        _ => Err(wrong_family(op, "concat/slice")),
    }
}

/// Operand cotangents of `concat0` / `sliceRange0`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let out = out_shape(op, x)?;
    check_shape(op, "output", y, &out)?;
    check_shape(op, "cotangent", g, &out)?;
    match op {
        Op::Concat => {
            let (ga, gb) = g.data().split_at(x[0].numel());
            Ok(smallvec![
                Some(tensor(
                    x[0].shape().clone(),
                    try_copy(op.name(), "cotangent", ga)?
                )?),
                Some(tensor(
                    x[1].shape().clone(),
                    try_copy(op.name(), "cotangent", gb)?
                )?)
            ])
        }
        Op::Slice { start, .. } => {
            let row = row_len(x[0].shape());
            let mut dx = tl_spec::alloc::try_zeroed(op.name(), "cotangent", x[0].numel())?;
            let at = start * row;
            dx[at..at + g.numel()].copy_from_slice(g.data());
            Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
        }
        _ => Err(wrong_family(op, "concat/slice")),
    }
}

/// Elements per axis-0 row (rank ≥ 1, checked by the shape rule).
/// 0 when the operand holds no element, whatever its other dims (their product may overflow:
/// `[1, 2⁶², 8, 0]`).
fn row_len(s: &Shape) -> usize {
    if s.dims().contains(&0) {
        return 0;
    }
    s.dims()[1..].iter().product()
}
