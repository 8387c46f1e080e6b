//! The kernel side of the worked example: the exact-erf GELU's CUDA kernels
//! (`gelu_erf.cu`: `tl_gelu_erf_fwd`, `tl_gelu_erf_bwd`) as the op's device implementation.
//!
//! - on a GPU (feature `cuda`): the committed `gelu_erf.ptx` (nvcc 13.0 through
//!   `tl_cuda_build`, `cargo xtask kernels`; `cargo xtask kernels --check` keeps it current),
//!   loaded by the driver at the first launch;
//! - on the kernel emulator (feature `cuda-emu`): `gelu_erf.cu` compiled for the host by
//!   tl-nn's `build.rs` (`tl_cuda_build::Emulator`, library `tl_nn_gelu_erf`), named here with
//!   `emu_kernels!`;
//! - on the simulation device: the op's sim twin, its reference in f32 on the host.
//!
//! Attach it with `tl_tape_cuda::user::with_device(op, kernel::device_impl())`.

use tl_tape_cuda::user::{DeviceImpl, ElementwiseKernels, KernelModule};

// The emulator build of gelu_erf.cu is linked into tl-nn's library (tl-nn's build.rs): this
// links tl-nn into the example even where nothing else in it names tl-nn.
#[cfg(feature = "cuda-emu")]
extern crate tl_nn as _;

/// `gelu_erf.cu` in its compiled forms: the PTX, and the emulator build where tl-nn's feature
/// `cuda-emu` is on.
pub fn module() -> KernelModule {
    KernelModule::new("gelu_erf")
        .ptx(include_str!("gelu_erf.ptx"))
        .emu(tl_tape_cuda::emu_kernels!(tl_nn_gelu_erf))
}

/// The exact-erf GELU on the device: `tl_gelu_erf_fwd(x, y, n)` forward and
/// `tl_gelu_erf_bwd(x, g, dx, n)` backward, each one grid-stride launch over the `n` elements.
pub fn device_impl() -> DeviceImpl {
    ElementwiseKernels::new(module(), "tl_gelu_erf_fwd", "tl_gelu_erf_bwd").device_impl()
}
