//! # tl-spec: the reference semantics
//!
//! Shapes, tensors and, for every op, its value, VJP and JVP as pure functions written to be
//! obviously right rather than fast. Every other crate is checked against this one.
//!
//! - [`Shape`], [`Tensor`], [`Scalar`] (f32, f64)
//! - [`broadcast`]: numpy-style broadcasting and its reduction back
//! - [`ops`]: one module per op family, each op's value, `*_vjp` and `*_jvp` side by side
//! - [`rng`]: the counter-based SplitMix64 keying every backend shares
//! - [`Error`]: every message names the op and the shapes
//! - [`approx`]: f32 `exp` and `tanh` in straight-line arithmetic, shared bit for bit by the
//!   CPU kernels, the CUDA simulation device and the CUDA kernels
//! - [`env`](mod@env): reading the `TL_*` environment variables (a value, or the default with one
//!   warning)
//! - [`alloc`]: the allocation cap every buffer whose size comes from input is checked against
//! - [`pool`]: buffer reuse across steps, a tape's spare buffers handed to its kernels
//! - [`bf16`]: bfloat16 rounding and the reference of a bf16 product (mixed precision)
//! - [`tf32`]: TensorFloat-32 rounding and its reference; [`precision`]: the autocast setting
//!   ([`precision::Precision`]) every tape shares
//! - [`scoped`]: a thread-local setting for a scope (the autocast setting, the gate overrides)

pub mod alloc;
pub mod approx;
pub mod bf16;
pub mod broadcast;
pub mod env;
mod error;
pub mod ops;
pub mod pool;
pub mod precision;
pub mod rng;
mod scalar;
pub mod scoped;
mod shape;
pub mod special;
mod tensor;
mod tensor_host;
pub mod tf32;

pub use broadcast::{broadcast_to, can_broadcast_to, reduce_to};
pub use error::{Error, Result};
pub use scalar::{Scalar, Typed, TypedMut};
pub use shape::Shape;
pub use tensor::Tensor;
