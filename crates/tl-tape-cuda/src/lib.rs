//! # tl-tape-cuda: the CUDA autograd tape
//!
//! The same tape as `tl-tape-cpu`, over float32 device buffers, generic over the device:
//!
//! - [`device`]: the [`Device`] trait (one method per buffer primitive of TorchLean's CUDA buffer layer) and its
//!   implementations: [`SimDevice`] (host f32, always built; the twin of every kernel, with the
//!   deterministic kernels' reduction order) and, behind feature `cuda`, `CudaDevice` (cust,
//!   kernels from `kernels/*.cu`; see docs/cuda.md), and `nccl`
//!   (NCCL loaded at run time, over `CudaDevice` buffers).
//! - [`alloc`]: the size-class caching allocator and its telemetry ([`MemoryUsage`]);
//!   [`traffic`]: kernel launches and host↔device copies ([`Traffic`]).
//! - [`determinism`]: the deterministic-reductions switch (env `TL_DETERMINISTIC`).
//!   [`gates`]: the size-gated paths' rules (the implicit-GEMM conv) and their test overrides.
//! - [`abi`]: checked `u32` conversions at the kernel ABI. [`rng`]: SplitMix64 keying.
//! - [`wire`]: the f32 wire format (f32 and f64 upload; other scalar types are an error).
//! - [`AnyBuffer`]: a device buffer with its runtime shape.
//! - [`CudaTape`]: leaves, `apply` (shape rule, then device formula), value reads with shape
//!   checks, dense and sparse reverse accumulation, release paths; implements
//!   [`tl_ir::Recorder`], so `GraphData::replay` compiles into it.
//! - [`precision`]: autocast ([`Precision`]: bf16 / TF32 products on tensor cores), set by
//!   [`CudaTape::set_precision`].
//! - [`ops`]: every op of the first op set, forward and backward, composed from primitives.
//! - [`user`]: user ops ([`tl_ir::UserOp`]) on the device: their device implementation
//!   ([`user::DeviceImpl`]) or their reference on the host, and the seeds' generic
//!   [`CudaTape::unary`] / [`CudaTape::binary`].
//! - [`Error`]: names the op and the shapes.
//!
//! ```
//! use tl_ir::{GraphBuilder, Op};
//! use tl_spec::{Shape, Tensor};
//! use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};
//!
//! let mut g = GraphBuilder::new();
//! let x = g.leaf([3], Some("x"))?;
//! let y = g.apply(Op::Exp, &[x])?;
//! let s = g.apply(Op::Sum, &[y])?;
//! let graph = g.finish();
//!
//! let mut tape = CudaTape::new(SimDevice::new());
//! let ids = graph.replay(&mut tape, &[Tensor::<f64>::zeros([3])], &[])?;
//! let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0)?;
//! let grads = tape.backward_dense(ids[s], &seed)?;
//! let dx: Tensor<f64> = grads[ids[x]].download(tape.device())?;
//! assert_eq!(dx.data(), &[1.0, 1.0, 1.0]); // d/dx Σ exp(x) at 0
//! tape.release_grads(grads);
//! seed.release(tape.device_mut());
//! tape.reset();
//! assert_eq!(tape.device().memory_usage().live_bytes, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod abi;
pub mod alloc;
mod any_buffer;
mod backward;
pub mod determinism;
pub mod device;
mod error;
pub mod gates;
// Compiled only where rustc shares generics between crates (the dev and test profiles).
#[cfg(debug_assertions)]
#[doc(hidden)]
pub mod instances;
pub mod needs_backward;
pub mod ops;
pub mod precision;
pub mod rng;
mod tape;
pub mod traffic;
pub mod user;
pub mod wire;

pub use alloc::MemoryUsage;
pub use any_buffer::AnyBuffer;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use device::cuda::CudaDevice;
#[cfg(feature = "cuda-emu")]
pub use device::cuda::in_reverse_schedule;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use device::cuda::nccl;
pub use device::sim::SimDevice;
pub use device::{Batch, Buffer, Device, FlashProducts, FlashTiles, Gemm, GemmTiles};
pub use error::{Error, Result};
pub use precision::Precision;
pub use tape::{CudaTape, Id, Node};
pub use traffic::Traffic;
