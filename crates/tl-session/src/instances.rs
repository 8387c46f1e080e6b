//! The sessions' f32 and f64 instances, compiled once, in this crate (as
//! `tl_tape_cpu::instances` does for the op kernels; the reasons are there): in the dev and
//! test profiles, a test or example that drives a `Session<f32>` links these instead of
//! compiling the sessions' recording, backward and optimizer paths again.

use tl_spec::Scalar;

use crate::{LinkedSession, Ops, Session, Train};

/// The entry points' addresses for `T`, taken so that their instances are compiled here.
fn entry_points<T: Scalar>() -> [*const (); 13] {
    [
        <Session<T> as Ops>::apply as *const (),
        <Session<T> as Train>::backward_step as *const (),
        <Session<T> as Train>::read as *const (),
        Session::<T>::backward as *const (),
        Session::<T>::backward_with_seed as *const (),
        Session::<T>::step as *const (),
        <LinkedSession<T> as Ops>::apply as *const (),
        <LinkedSession<T> as Train>::backward_step as *const (),
        <LinkedSession<T> as Train>::read as *const (),
        LinkedSession::<T>::compile as *const (),
        LinkedSession::<T>::backward_dense_all as *const (),
        LinkedSession::<T>::jvp as *const (),
        LinkedSession::<T>::step as *const (),
    ]
}

/// The f32 and f64 entry points (never called for their value: the function exists so that
/// the instances are compiled in this crate).
pub fn f32_and_f64() -> [[*const (); 13]; 2] {
    [entry_points::<f32>(), entry_points::<f64>()]
}
