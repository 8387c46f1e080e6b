//! The reference semantics of every op, one module per family. In each module an op's value,
//! its `*_vjp` (reverse mode: operand cotangents from the output cotangent `g`) and its `*_jvp`
//! (forward mode: output tangent from operand tangents) stand side by side, with the op's shape
//! rule (`*_shape`) and parameter checks (`*_params`) that `tl_ir::Op::infer_shape` dispatches to.
//!
//! Conventions (ties, kinks, stable forms) are those of the project's `docs/semantics.md`.

pub mod activation;
pub mod concat;
pub mod cross_entropy;
pub mod elementwise;
pub mod index;
pub mod linalg;
pub mod loss;
pub mod reduce;
pub mod shape;
pub mod softmax;
