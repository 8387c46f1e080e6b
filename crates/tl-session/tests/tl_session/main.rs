//! The integration tests of the sessions, one module per topic, in one test binary (linking one
//! binary per file dominated `cargo test`; docs/verification.md). One module, for example:
//! `cargo test -p tl-session --test tl_session optim::`.

#[path = "../common/mod.rs"]
mod common;

// Issue 14: bad input gets errors, not panics, aborts or garbage.
mod bad_input;
mod catalogue;
// `Backend::Cuda`: a clear error without a device, the real device or the kernel emulator with
// `--features cuda` / `cuda-emu` (`cargo test -p tl-session --features cuda-emu --test
// tl_session cuda::`).
mod cuda;
// The proptest fuzz of the public API; it fuzzes in a child process (its own allocation cap).
mod fuzz;
// Passes recorded with gradients off (`Ops::set_grad_enabled`).
mod grad_enabled;
// A step that ends its pass updates the CPU parameters in place.
mod in_place;
mod optim;
mod optim_state;
// RMSprop, Adagrad, clipping and a schedule against real PyTorch (fixtures/make_optimizers.py).
mod optim_torch;
// The CPU tape's buffer pool between steps (`pool_stats`).
mod pool;
// Values no handle reaches are let go (`TensorRef` drops).
mod random;
mod release;
// The linked session's parameters resident on the device between steps.
mod resident;
mod sessions;
mod traffic;
mod train;
mod user_ops;
