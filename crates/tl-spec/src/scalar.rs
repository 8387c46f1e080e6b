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

    /// `x` as the concrete type it is, so a kernel can reach type-specific code (the CPU GEMM)
    /// without `unsafe`; [`Typed::Other`] for any other implementor.
    fn typed(x: &[Self]) -> Typed<'_> {
        let _ = x;
        Typed::Other
    }

    /// [`Scalar::typed`] for a writable slice.
    fn typed_mut(x: &mut [Self]) -> TypedMut<'_> {
        let _ = x;
        TypedMut::Other
    }
}

/// A slice of some [`Scalar`] seen as its concrete type ([`Scalar::typed`]).
#[derive(Debug)]
pub enum Typed<'a> {
    /// The slice holds `f32`s.
    F32(&'a [f32]),
    /// The slice holds `f64`s.
    F64(&'a [f64]),
    /// Another element type.
    Other,
}

/// A writable slice of some [`Scalar`] seen as its concrete type ([`Scalar::typed_mut`]).
#[derive(Debug)]
pub enum TypedMut<'a> {
    /// The slice holds `f32`s.
    F32(&'a mut [f32]),
    /// The slice holds `f64`s.
    F64(&'a mut [f64]),
    /// Another element type.
    Other,
}

impl Scalar for f32 {
    const NAME: &'static str = "f32";

    #[inline(always)]
    fn lit(v: f64) -> Self {
        v as f32
    }

    #[inline(always)]
    fn as_f64(self) -> f64 {
        f64::from(self)
    }

    fn typed(x: &[f32]) -> Typed<'_> {
        Typed::F32(x)
    }

    fn typed_mut(x: &mut [f32]) -> TypedMut<'_> {
        TypedMut::F32(x)
    }
}

impl Scalar for f64 {
    const NAME: &'static str = "f64";

    #[inline(always)]
    fn lit(v: f64) -> Self {
        v
    }

    #[inline(always)]
    fn as_f64(self) -> f64 {
        self
    }

    fn typed(x: &[f64]) -> Typed<'_> {
        Typed::F64(x)
    }

    fn typed_mut(x: &mut [f64]) -> TypedMut<'_> {
        TypedMut::F64(x)
    }
}
