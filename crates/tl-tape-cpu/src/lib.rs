//! # tl-tape-cpu: the CPU autograd tape
//!
//! - [`Tape`]: leaves, op application (shape rule, then kernel), value reads with shape checks,
//!   dense reverse accumulation ([`Tape::backward_dense`], [`Tape::backward_dense_from`],
//!   [`Tape::backward_first_n`]) and sparse gradients for chosen leaves ([`Tape::backward_params`]).
//!   Implements [`tl_ir::Recorder`], so `GraphData::replay` compiles into it.
//! - [`ops`]: the CPU kernels, one module per op family.
//! - [`CustomOp`] / [`ClosureOp`]: user-defined ops.
//! - [`Error`]: names the op and the shapes.

mod custom;
mod error;
pub mod ops;
mod tape;

pub use custom::{ClosureOp, CustomOp};
pub use error::{Error, Result};
pub use tape::{Id, Node, NodeKind, Tape};
