//! Special functions the catalogue needs beyond `num_traits::Float`: the error function.
//!
//! One `erf` serves the reference (`tl_spec::ops::activation::gelu_erf`), the CPU tape's
//! kernels and the CUDA simulation device, so the three evaluate the same function.

use crate::Scalar;

/// The error function `erf x = 2/√π ∫₀ˣ e^{−t²} dt`, in any [`Scalar`]: libm's `erf` (the
/// FreeBSD/musl implementation, Sun's rational approximations; within 1 ulp in f64) evaluated in
/// f64 and rounded once to `T`, so the f32 result is within 1 ulp of the true value too.
/// `erf(±0) = ±0`, `erf(±∞) = ±1`, NaN stays NaN.
pub fn erf<T: Scalar>(x: T) -> T {
    T::lit(libm::erf(x.as_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values from mpmath (50 digits), rounded to f64.
    #[test]
    fn erf_at_known_points() {
        let cases = [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (1e-10, 1.128_379_167_095_512_6e-10),
            (3.5, 0.999_999_256_901_627_7),
        ];
        for (x, want) in cases {
            for (x, want) in [(x, want), (-x, -want)] {
                let got: f64 = erf(x);
                assert!(
                    (got - want).abs() <= 2.0 * f64::EPSILON * want.abs(),
                    "erf({x}) = {got}"
                );
                // f32: the input rounds by at most half an ulp, erf' ≤ 2/√π.
                let got32 = f64::from(erf(x as f32));
                let tol = 2.0 * f64::from(f32::EPSILON) * want.abs();
                assert!((got32 - want).abs() <= tol, "erf({x} as f32) = {got32}");
            }
        }
        assert_eq!(erf(6.0f64), 1.0);
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(-0.0f64).is_sign_negative());
        assert!(erf(f64::NAN).is_nan());
    }
}
