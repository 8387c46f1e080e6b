//! The element types a tensor may hold: `f32` and `f64`.

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// A real floating-point element type (`f32` or `f64`).
///
/// Everything generic in the IR and the CPU tape is written against this trait, so the same
/// graph can be evaluated in `f64` (the reference) and `f32` (what devices run).
pub trait Scalar:
    num_traits::Float
    + ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + Default
    + Debug
    + Display
    + Sum
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Send
    + Sync
    + 'static
{
    /// The type's name, as printed in reports (`"f32"`, `"f64"`).
    const NAME: &'static str;

    /// Convert an `f64` literal or parameter to this type (rounding to nearest for `f32`).
    fn lit(v: f64) -> Self;

    /// Widen to `f64` (exact for both `f32` and `f64`).
    fn as_f64(self) -> f64;
}

impl Scalar for f32 {
    const NAME: &'static str = "f32";

    fn lit(v: f64) -> Self {
        v as f32
    }

    fn as_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Scalar for f64 {
    const NAME: &'static str = "f64";

    fn lit(v: f64) -> Self {
        v
    }

    fn as_f64(self) -> f64 {
        self
    }
}
