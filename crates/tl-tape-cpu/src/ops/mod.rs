//! The CPU kernels, one module per op family, and the dispatch from an [`Op`] to them.
//!
//! TEMPORARY: until the fast kernels land, forward and backward delegate to the reference
//! rules of `tl_ir::rules`.

use smallvec::SmallVec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use crate::Result;

/// Operand cotangents of one node: one entry per operand, `None` where no gradient flows.
pub type Grads<T> = SmallVec<[Option<Tensor<T>>; 3]>;

/// Forward value of `op` on `x` (shapes already checked by the shape rule).
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    Ok(tl_ir::rules::value(op, x)?)
}

/// Operand cotangents of `op` at `x` with output `y` and output cotangent `g`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    let _ = y;
    Ok(tl_ir::rules::vjp(op, x, g)?.into_iter().collect())
}

/// `acc += c` elementwise (same shape, checked by the caller).
pub fn accumulate<T: Scalar>(acc: &mut Tensor<T>, c: &Tensor<T>) {
    for (a, &b) in acc.data_mut().iter_mut().zip(c.data()) {
        *a += b;
    }
}
