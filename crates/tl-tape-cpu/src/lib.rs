//! # tl-tape-cpu: the CPU autograd tape
//!
//! - [`Tape`]: leaves, op application (shape rule, then kernel), value reads with shape checks,
//!   dense reverse accumulation ([`Tape::backward_dense`], [`Tape::backward_dense_from`],
//!   [`Tape::backward_first_n`]) and sparse gradients for chosen leaves ([`Tape::backward_params`]).
//!   Implements [`tl_ir::Recorder`], so `GraphData::replay` compiles into it. It keeps a pool
//!   of spare buffers ([`tl_spec::pool`]) that its kernels draw from, so a pass after
//!   [`Tape::clear`] runs in the last pass's buffers.
//! - [`ops`]: the CPU kernels, one module per op family.
//! - [`gemm`]: the one matrix product they use (micro-kernel chosen at run time for the CPU) and
//!   its thread knob, [`set_threads`] / `TL_NUM_THREADS`.
//! - [`par`]: independent rows (pool planes, conv batch entries) split across those threads.
//! - [`simd`]: the instruction set of the element-wise loops, chosen at run time (AVX-512,
//!   AVX2 or the baseline; `TL_SIMD` / [`simd::set_level`] force one).
//! - [`precision`]: bf16 autocast of a tape's matrix products ([`Tape::set_precision`]) and
//!   the kernel they run on.
//! - [`gates`]: per-thread overrides of every size-, shape- and thread-gated fast path, so tests
//!   can force each one on or off (no override: the production decisions).
//! - [`Error`]: names the op and the shapes.

// `Error` carries shapes inline (two `Shape`s, each a small vector), so it exceeds clippy's
// 128-byte threshold for `Result<_, Error>`. Errors are the cold path and the type is public API
// shared with the IR's error; boxing it is a separate, coordinated change.

mod error;
pub mod gates;
pub mod gemm;
// Compiled only where rustc shares generics between crates (the dev and test profiles).
#[cfg(debug_assertions)]
#[doc(hidden)]
pub mod instances;
pub mod ops;
pub mod par;
pub mod precision;
pub mod simd;
mod tape;

pub use error::{Error, Result};
pub use gemm::{set_threads, threads};
pub use precision::Precision;
pub use tape::{Id, Node, NodeKind, Tape};
