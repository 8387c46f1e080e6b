//! The float32 wire format: how host scalars travel to and from device buffers (TorchLean's CUDA
//! bridge, `TensorConv`).
//!
//! Device buffers hold `f32`, row-major. A tape generic over `T: Scalar` uploads by converting
//! each element: `f32` is copied as is; `f64` is rounded to the nearest `f32`. Reading back widens
//! `f32` to `T` exactly. Any other scalar type has no declared wire format and fails with
//! [`Error::NoWireFormat`] at the upload or download, rather than at compile time, so code that
//! is generic over `T: Scalar` (a session with CPU and CUDA backends) still compiles for every
//! `T` and fails loudly only if a CUDA upload is actually requested. To allow another type,
//! add it to [`wire_format`].

use std::any::TypeId;

use tl_spec::Scalar;

use crate::{Error, Result};

/// How a scalar type is carried as `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    /// The type is `f32`: copied bit for bit.
    F32,
    /// The type is `f64`: rounded to the nearest `f32` on upload, widened exactly on download.
    F64,
}

/// The wire format of `T`, or `None` when `T` has none.
pub fn wire_format<T: Scalar>() -> Option<WireFormat> {
    let t = TypeId::of::<T>();
    if t == TypeId::of::<f32>() {
        Some(WireFormat::F32)
    } else if t == TypeId::of::<f64>() {
        Some(WireFormat::F64)
    } else {
        None
    }
}

fn require<T: Scalar>(op: &'static str) -> Result<WireFormat> {
    wire_format::<T>().ok_or(Error::NoWireFormat {
        op,
        scalar: T::NAME,
    })
}

/// Host elements → `f32` wire elements (round to nearest for `f64`).
pub fn to_wire<T: Scalar>(op: &'static str, data: &[T]) -> Result<Vec<f32>> {
    require::<T>(op)?;
    // For both supported types `as_f64` is exact and `as f32` rounds to nearest (a no-op for f32).
    Ok(data.iter().map(|&v| v.as_f64() as f32).collect())
}

/// `f32` wire elements → host elements (exact for both supported types).
pub fn from_wire<T: Scalar>(op: &'static str, data: &[f32]) -> Result<Vec<T>> {
    require::<T>(op)?;
    Ok(data.iter().map(|&v| T::lit(f64::from(v))).collect())
}

/// A host scalar parameter (a `scale` constant, clamp bounds) as the `f32` a kernel receives.
pub fn param(v: f64) -> f32 {
    v as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_is_bit_exact_and_f64_rounds_to_nearest() {
        let xs = [1.0f32, -0.0, f32::MIN_POSITIVE, 3.0e38];
        let w = to_wire("upload", &xs).unwrap();
        assert!(w.iter().zip(&xs).all(|(a, b)| a.to_bits() == b.to_bits()));
        let third = to_wire("upload", &[1.0f64 / 3.0]).unwrap()[0];
        assert_eq!(third, 1.0f32 / 3.0);
        let back: Vec<f64> = from_wire("download", &[third]).unwrap();
        assert_eq!(back[0], f64::from(1.0f32 / 3.0));
        assert_eq!(wire_format::<f64>(), Some(WireFormat::F64));
    }
}
