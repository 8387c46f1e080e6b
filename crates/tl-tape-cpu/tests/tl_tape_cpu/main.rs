//! The integration tests of the CPU tape, one module per topic, in one test binary (linking one
//! binary per file dominated `cargo test`; docs/verification.md). One module, for example:
//! `cargo test -p tl-tape-cpu --test tl_tape_cpu kernels::`.

#[path = "../common/mod.rs"]
mod common;

mod bf16;
mod errors;
mod kernels;
mod oom;
mod pool;
mod saved;
mod simd;
mod tape;
mod threads;
