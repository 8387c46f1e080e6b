//! The f32 and f64 instances of the tape and the op kernels, compiled once, in this crate.
//!
//! Every op is generic over its scalar type, and a generic function is compiled in the crate
//! that names a concrete type for it: each test and example binary of the workspace compiled
//! the whole op library again, for f32 and for f64 (four fifths of an example's LLVM IR were
//! the op kernels and rustfft's planner). Where rustc shares generics between crates (at
//! `opt-level` 0 and 1: the dev and test profiles), a crate links the instances its
//! dependencies already compiled instead; naming the entry points here, for both types, makes
//! this crate compile them. An optimised build does not share generics, so the module is
//! compiled only with debug assertions (the dev and test profiles), and release builds compile
//! what they did before (docs/verification.md, "Generic code compiled once").

use tl_spec::Scalar;

use crate::{Tape, ops};

/// The entry points' addresses for `T`, taken so that their instances are compiled here.
fn entry_points<T: Scalar>() -> [*const (); 9] {
    [
        ops::forward::<T> as *const (),
        ops::forward_saving::<T> as *const (),
        ops::backward::<T> as *const (),
        ops::backward_needed::<T> as *const (),
        Tape::<T>::apply as *const (),
        Tape::<T>::backward_dense as *const (),
        Tape::<T>::backward_dense_from as *const (),
        Tape::<T>::backward_first_n as *const (),
        Tape::<T>::backward_params as *const (),
    ]
}

/// The f32 and f64 entry points (never called for their value: the function exists so that
/// the instances are compiled in this crate, see the module doc).
#[doc(hidden)]
pub fn f32_and_f64() -> [[*const (); 9]; 2] {
    [entry_points::<f32>(), entry_points::<f64>()]
}
