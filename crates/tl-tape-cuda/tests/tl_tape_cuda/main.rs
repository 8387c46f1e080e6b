//! The integration tests of the CUDA tape, one module per topic, in one test binary (linking
//! one binary per file dominated `cargo test`; docs/verification.md). One module, for example:
//! `cargo test -p tl-tape-cuda --test tl_tape_cuda ops::`.

#[path = "../common/mod.rs"]
mod common;

// Autocast (bf16 / TF32 products) on the sim; the kernels' side is gpu::tensor_cores::.
mod autocast;
mod conv;
// The implicit-GEMM conv forward on the sim (its kernel: gpu::).
mod conv_implicit;
mod determinism;
mod device;
mod flash;
mod fused;
// The real device (`--features cuda`) or the kernel emulator (`--features cuda-emu`):
// `cargo test -p tl-tape-cuda --features cuda-emu --test tl_tape_cuda gpu::`.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod gpu;
mod index;
mod lifetime;
// NCCL over CudaDevice buffers: the loader's errors always, the collectives with
// TL_NCCL_LIBRARY set (CI: `cargo xtask nccl-stub`).
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod nccl;
mod norm;
mod ops;
mod oversized;
mod random;
mod user_ops;
mod wire;
// User ops with kernels from a user's .cu: the sim twin always, the kernels under cuda-emu.
mod user_kernels;
