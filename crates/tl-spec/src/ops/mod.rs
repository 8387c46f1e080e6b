//! The reference semantics of every op, one module per family. In each module an op's value,
//! its `*_vjp` (reverse mode: operand cotangents from the output cotangent `g`) and its `*_jvp`
//! (forward mode: output tangent from operand tangents) stand side by side, with the op's shape
//! rule (`*_shape`) and parameter checks (`*_params`) that `tl_ir::Op::infer_shape` dispatches to.
//!
//! Conventions (ties, kinks, stable forms) are those of the project's `docs/semantics.md`.

pub mod activation;
pub mod attention;
pub mod concat;
pub mod conv;
pub mod cross_entropy;
pub mod elementwise;
pub mod index;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod spectral;
pub mod window;

use crate::{Error, Result, Scalar, Tensor};

/// Check that a (co)tangent `g` of op `op` has the shape of `x`; the error names the op and both
/// shapes.
pub(crate) fn same_shape<T: Scalar>(op: &'static str, x: &Tensor<T>, g: &Tensor<T>) -> Result<()> {
    if x.shape() == g.shape() {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!(
                "(co)tangent has shape {}, expected {}",
                g.shape(),
                x.shape()
            ),
        ))
    }
}
