//! # tl-ir: the op vocabulary and a typed graph IR
//!
//! - [`Op`]: every op once, with its static parameters, its [`Family`] and its shape rule
//!   ([`Op::infer_shape`], the only place operand shapes are checked).
//! - [`GraphData`] / [`GraphBuilder`]: leaves (inputs and parameters) then op nodes; typed by construction.
//! - Pure algorithms over tl-spec: [`GraphData::eval`], [`GraphData::backprop_all`] (dense
//!   reverse accumulation over every id), [`GraphData::jvp`].
//! - [`Recorder`] and [`GraphData::replay`]: compile a graph into any tape.
//! - [`rules`]: each op's reference value, VJP and JVP, one match per face.
//! - [`compose`]: composite ops recorded from primitive ones (multi-head attention).
//! - [`user`]: ops defined outside the catalogue ([`UserOp`], held by [`Op::User`]).

mod backprop;
pub mod compose;
mod error;
mod eval;
mod graph;
mod jvp;
mod op;
mod op_windowed;
mod replay;
pub mod rules;
pub mod user;

pub use error::{Error, Result};
pub use graph::{GraphBuilder, GraphData, Id, Leaf, Node};
pub use op::{Family, Op};
pub use replay::{Recorder, Then};
pub use tl_spec::{Scalar, Shape, Tensor};
pub use user::{Param, UserOp, UserOpRef};
