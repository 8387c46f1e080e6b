//! Whether the node a forward formula is recording will be differentiated: [`CudaTape::apply`]
//! installs it on the calling thread around the formula (a node requires grad when its op is
//! differentiable and one of its parents requires grad, as the tape records it). A formula
//! may skip what only its backward reads when it will not be differentiated: the fused
//! attention under autocast keeps no `Ō` then, and its first pass computes each row's
//! statistics alone. Elsewhere (a backward recomputing a forward, a direct call of a formula)
//! it is `true`: everything is computed.
//!
//! [`CudaTape::apply`]: crate::CudaTape::apply

use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<bool> = const { Cell::new(true) };
}

/// Whether the node being recorded on this thread will be differentiated (`true` unless a
/// tape installed `false`).
pub fn current() -> bool {
    CURRENT.with(Cell::get)
}

/// Install `needs` on this thread until the returned guard is dropped.
pub fn install(needs: bool) -> Guard {
    tl_spec::scoped::install(&CURRENT, needs)
}

/// Restores the setting [`install`] replaced when dropped (on the thread that installed it).
pub type Guard = tl_spec::scoped::Guard<bool>;
