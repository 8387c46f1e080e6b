//! Elementwise ops. Every pointwise op is one device primitive forward and one backward (see the
//! dispatch in [`super`]); `exp` and `log` reuse `mul`/`div` for their backward, `sigmoid` and
//! `tanh` differentiate from their output. `detach` is a view with no gradient; `constant`
//! uploads its tensor. Conventions (kinks, ties, stable forms) are SEMANTICS.md's; `log` is IEEE
//! on the device (no domain error), as SEMANTICS.md allows for CUDA.

use tl_spec::Tensor;

use crate::device::{Buffer, Device};
use crate::{Result, wire};

/// A static `f64` op parameter (`scale`'s c, `clamp`'s bounds, `safeLog`'s ε) as the `f32` the
/// kernel receives (rounded to nearest).
pub fn param(v: f64) -> f32 {
    wire::param(v)
}

/// Upload a `constant` node's tensor (f64 rounded to f32).
pub fn constant<D: Device>(dev: &mut D, t: &Tensor<f64>) -> Result<Buffer> {
    let data = wire::to_wire("constant", t.data())?;
    dev.upload(&data)
}
