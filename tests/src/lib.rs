//! # tl-conformance: the verification harness
//!
//! Every op of `tl_ir::Op` is checked, on every backend, against the pure reference:
//!
//! 1. **forward** — compiled tape values (`GraphData::replay` into the backend) == IR `eval`;
//! 2. **backprop** — backend `backward_dense` == IR `backprop_all` (the core claim);
//! 3. **finite differences** — spec VJP == central differences of the spec value (f64);
//! 4. **adjoint** — ⟨J v, w⟩ = ⟨v, Jᵀ w⟩ between the JVP and the VJP;
//! 6. **CUDA** — the CUDA tape on the simulation device ([`CudaSim`]) == the CPU f32 tape, and
//!    deterministic mode is bit-identical across runs ([`checks::sim`]).
//! 7. **bad input** — wrong leaf shapes and counts, seed shapes and output ids are errors that
//!    name them, never a panic or `Ok`, on any [`Backend`] ([`checks::bad_input`]).
//!
//! Checks 1–2 run in f64 (tolerance 1e-10) and f32 (1e-4, scaled by reduction length) through
//! the [`Backend`] trait, on the CPU tape and the CUDA sim; all run per op and on random DAGs
//! with fan-out. Ops without a CUDA formula yet make their sim cells [`PENDING`].
//! [`checks::tape_api`] checks `backward_dense_from`, `backward_first_n` and `backward_params`
//! ([`TapeApi`]).
//!
//! Table of contents:
//! - [`registry`]: one [`OpInfo`] per `Op` variant (an exhaustive match: a new variant does not
//!   compile without an entry), with its case strategy, applicable checks and tolerances;
//!   [`entries`] and [`generate`] build the strategies, [`domain`] keeps values off kinks.
//! - [`dag`]: random DAGs composed of registry ops.
//! - [`checks`]: the checks, per op and per DAG; [`Backend`] / [`CpuTape`] / [`CudaSim`]
//!   ([`backend`]). Beyond one op: the conventions at kinks, ties, bounds, signed zeros and
//!   NaN on every backend ([`checks::conventions`]), hard inputs f32 vs f64
//!   ([`checks::hard`]), sizes past the kernels' grid limits ([`checks::grid`]).
//! - [`metric`]: the error definition; [`report`]: [`Report`] and the proptest driver
//!   [`run_check`]; [`config`]: `TL_CASES` / `TL_SEED`; [`watchdog`]: the case timeout
//!   (`TL_CASE_TIMEOUT`, [`set_case_timeout`]): a case that does not return (a hanging op or
//!   backend) ends the process with a message naming the check, instead of hanging the run.
//! - [`verify`]: every check for every op, tabulated (used by the `tl-verify` binary).
//! - [`user`]: the harness as a library — checks 0–7 on your own op ([`user::check_user_op`])
//!   and the catalogue's suite on your own backend ([`user::check_backend`]); [`model`]: your
//!   own model on every session against the IR in f64, and that against finite differences
//!   ([`model::check_model`]).
//! - [`nn`]: tl-nn's layers on every session against the same computation in plain catalogue
//!   ops; [`checks::session_state`]: the sessions' state after Nat writes, parameter writes,
//!   optimizer steps, new inputs and resets, eager = linked = a fresh recomputation.

pub mod backend;
pub mod case;
pub mod checks;
pub mod config;
pub mod dag;
pub mod domain;
pub mod entries;
pub mod generate;
mod guard;
pub mod metric;
pub mod model;
pub mod nn;
mod nn_activations;
pub mod nn_attention;
mod nn_cross_entropy;
pub mod nn_losses;
pub mod registry;
pub mod report;
pub mod user;
pub mod verify;
pub mod watchdog;

pub use backend::{Backend, CpuTape, CudaSim, TapeApi, TapeProgram};
pub use case::{GraphCase, OpCase, Values, With};
pub use config::RunConfig;
pub use domain::{ANY, Domain, kink_margin};
/// The property-testing crate the harness draws its cases with, for [`user::UserEntry::new`]'s
/// shape generators.
pub use proptest;
pub use registry::{Applies, OpInfo, Tol};
pub use report::{
    CaseError, CaseResult, Check, Measured, OnPending, PENDING, Report, assert_all_passed,
    run_check, run_check_pending,
};
pub use watchdog::{case_timeout, set_case_timeout};
/// The README's Rust example, compiled and run by `cargo test` so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
