//! The real CUDA device (feature `cuda`) — **not written yet**.
//!
//! This is the one module of the workspace that will be allowed to use `unsafe` (the crate
//! denies it everywhere else; every block here will carry a `// SAFETY:` comment). What goes
//! here, per DESIGN.md "CUDA" and docs/cuda.md "What remains":
//!
//! - `CudaDevice`: one process-wide cust `Context` that is never dropped, a stream, the
//!   [`CachingAllocator`](crate::alloc::CachingAllocator) over `cudaMalloc`/`cudaFree`
//!   (a `RawMemory` whose `mem_info` is `cudaMemGetInfo`), and the kernels of
//!   `kernels/*.cu`, compiled to PTX by `cargo xtask kernels` and embedded with `include_str!`.
//! - `impl Device for CudaDevice`, launching each primitive with the arguments checked by
//!   [`crate::device::check`] and [`crate::abi`] exactly as [`super::sim::SimDevice`] does,
//!   and, when [`crate::determinism::deterministic_reductions`] is on, the fixed-order
//!   reduction kernels whose order [`super::sim::reduce`] documents.
//!
//! Until then, building with `--features cuda` compiles this empty module and nothing else
//! changes.
