//! The verification harness (DESIGN.md "Verification harness"): every check and hand-worked
//! convention of the conformance suite, one module per topic, in one test binary (linking one
//! binary per file dominated `cargo test`; docs/verification.md). One module, for example:
//! `cargo test -p tl-conformance --test conformance backprop::`.

mod adjoint;
mod attention;
mod autocast;
mod backprop;
mod bad_input;
mod case_timeout;
mod conv_implicit;
mod conv_pool;
mod conventions;
mod cuda_gates;
// Needs the kernel emulator: `--features cuda-emu`.
#[cfg(feature = "cuda-emu")]
mod cuda_emu;
// Needs a real GPU at run time (skips without one): `--features cuda`, the GPU bundle.
#[cfg(feature = "cuda")]
mod cuda_gpu;
mod cuda_sim;
mod dag;
mod edge_cases;
mod finite_diff;
mod forward;
mod gates;
mod grid;
mod hard;
mod index;
mod model;
mod model_zoo;
mod nn_layers;
mod nn_losses;
mod norm;
mod optim;
mod random;
mod registry;
mod session;
mod session_state;
mod spectral;
mod tape_api;
mod teeth;
mod teeth_sim;
mod tolerance;
mod user_ops;
mod verify;
