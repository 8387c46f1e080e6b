//! Kernel arguments as the launching code builds them, for either driver: by value, one per
//! kernel parameter, with the kernel ABI's types.

use std::ffi::c_void;

/// One kernel argument, by value, as the kernel declares it.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// A device pointer (`float*`).
    Ptr(u64),
    /// `u32`.
    U32(u32),
    /// `int` (a signed 32-bit value: the fused attention's causal offset, a user kernel's
    /// `KernelArg::I32`).
    I32(i32),
    /// `u64`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// `Dims8` (eight `u32`, by value).
    Dims([u32; 8]),
}

impl Arg {
    /// The kernel emulator's tag for this argument's type (crates/tl-cuda-build/emu/cuda_emu.h, `TlEmuTag`).
    #[cfg_attr(not(feature = "cuda-emu"), allow(dead_code))]
    pub fn tag(&self) -> u8 {
        match self {
            Arg::Ptr(_) => b'p',
            Arg::U32(_) => b'u',
            Arg::I32(_) => b'i',
            Arg::U64(_) => b'U',
            Arg::F32(_) => b'f',
            Arg::F64(_) => b'd',
            Arg::Dims(_) => b'D',
        }
    }
}

/// CUDA's `kernelParams`: one pointer to each argument's value, pointing into `vals`, which
/// must outlive the launch.
pub fn params(vals: &mut [Arg]) -> Vec<*mut c_void> {
    vals.iter_mut()
        .map(|a| match a {
            Arg::Ptr(v) | Arg::U64(v) => (v as *mut u64).cast(),
            Arg::U32(v) => (v as *mut u32).cast(),
            Arg::I32(v) => (v as *mut i32).cast(),
            Arg::F32(v) => (v as *mut f32).cast(),
            Arg::F64(v) => (v as *mut f64).cast(),
            Arg::Dims(v) => v.as_mut_ptr().cast(),
        })
        .collect()
}
