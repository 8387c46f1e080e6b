//! The tape's instances for the simulation device and the CUDA device, compiled once, in this
//! crate (as `tl_tape_cpu::instances` does for f32 and f64; the reasons are there): in the dev
//! and test profiles, a crate that uses `CudaTape<SimDevice>` links these instead of compiling
//! the tape and every op's launch code again.

use crate::{CudaTape, Device, SimDevice, ops};

/// The entry points' addresses for `D`, taken so that their instances are compiled here.
fn entry_points<D: Device>() -> [*const (); 11] {
    [
        CudaTape::<D>::apply as *const (),
        CudaTape::<D>::apply_then as *const (),
        CudaTape::<D>::backward_dense as *const (),
        CudaTape::<D>::backward_dense_owned as *const (),
        CudaTape::<D>::backward_dense_from as *const (),
        CudaTape::<D>::backward_first_n as *const (),
        CudaTape::<D>::backward_params as *const (),
        CudaTape::<D>::backward_params_owned as *const (),
        ops::forward::<D> as *const (),
        ops::forward_then::<D> as *const (),
        ops::backward::<D> as *const (),
    ]
}

/// The simulation device's entry points (never called for their value: the function exists
/// so that the instances are compiled in this crate).
pub fn sim() -> [*const (); 11] {
    entry_points::<SimDevice>()
}

/// The CUDA device's entry points, likewise.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub fn cuda() -> [*const (); 11] {
    entry_points::<crate::CudaDevice>()
}
