//! The error measure every check reports.
//!
//! **Tensor error.** For a result `got` and a reference `want` of the same shape,
//!
//! ```text
//! err(got, want) = max_i |got_i − want_i| / max(1, max_j |want_j|)
//! ```
//!
//! i.e. the largest absolute deviation, relative to the reference's largest magnitude once that
//! exceeds 1 (so tiny reference values are compared absolutely and large ones relatively, and a
//! small element next to a large one in the same tensor is judged on the tensor's scale, which is
//! the scale its rounding error lives on). A NaN or infinity on either side that is not matched
//! exactly on the other gives `+∞`; a shape mismatch is reported separately by the checks.
//!
//! **Scalar error** (adjoint identities, finite differences of a scalar):
//! `|a − b| / max(1, |a|, |b|)`.
//!
//! **Ulp distance** (the sim against the CPU f32 tape on pointwise and shape ops,
//! [`crate::checks::sim`]): for two f32 values, how many representable f32 lie between them
//! plus one ([`ulp_distance`]): 0 for equal values (`−0 = +0`, NaN = NaN), 1 for neighbours,
//! `u64::MAX` when only one side is NaN or the infinities differ. Unlike the tensor error it
//! does not forgive a small element next to a large one: each element is judged on its own
//! magnitude.
//!
//! Tolerances ([`crate::Tol`]) are thresholds on these numbers.

use tl_spec::{Scalar, Tensor};

/// `max_i |got_i − want_i| / max(1, max_j |want_j|)`; `+∞` when non-finite values disagree.
/// The shapes must already be known to match (extra elements on either side are ignored).
pub fn tensor_err<T: Scalar>(got: &Tensor<T>, want: &Tensor<f64>) -> f64 {
    let scale = want
        .data()
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    let mut worst = 0.0f64;
    for (&g, &w) in got.data().iter().zip(want.data()) {
        let g = g.as_f64();
        let d = if g.is_finite() && w.is_finite() {
            (g - w).abs() / scale
        } else if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else {
            f64::INFINITY
        };
        worst = worst.max(d);
    }
    worst
}

/// `|a − b| / max(1, |a|, |b|)`; `+∞` when either is not finite.
pub fn scalar_err(a: f64, b: f64) -> f64 {
    if a.is_finite() && b.is_finite() {
        (a - b).abs() / 1f64.max(a.abs()).max(b.abs())
    } else {
        f64::INFINITY
    }
}

/// The flat index of the worst element under [`tensor_err`] (for failure messages).
pub fn worst_index<T: Scalar>(got: &Tensor<T>, want: &Tensor<f64>) -> Option<usize> {
    got.data()
        .iter()
        .zip(want.data())
        .map(|(&g, &w)| {
            let d = (g.as_f64() - w).abs();
            if d.is_nan() { f64::INFINITY } else { d }
        })
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

/// The ulp distance between two f32 values (see the module docs).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    if a.is_infinite() || b.is_infinite() {
        return if a == b { 0 } else { u64::MAX };
    }
    // Map the bits onto a line where neighbouring floats are neighbouring integers and both
    // zeros are 0.
    let ord = |x: f32| {
        let bits = x.to_bits();
        let mag = i64::from(bits & 0x7fff_ffff);
        if bits >> 31 == 1 { -mag } else { mag }
    };
    ord(a).abs_diff(ord(b))
}

/// The largest [`ulp_distance`] between corresponding elements and the flat index where it
/// occurs (`(0, 0)` for empty tensors).
pub fn tensor_ulps(got: &Tensor<f32>, want: &Tensor<f32>) -> (u64, usize) {
    got.data()
        .iter()
        .zip(want.data())
        .map(|(&g, &w)| ulp_distance(g, w))
        .enumerate()
        .fold(
            (0, 0),
            |(m, at), (i, d)| if d > m { (d, i) } else { (m, at) },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_references_are_compared_absolutely_large_ones_relatively() {
        let want = Tensor::vector(vec![0.0, 1e-3]);
        let got = Tensor::vector(vec![1e-6, 1e-3]);
        assert!((tensor_err(&got, &want) - 1e-6).abs() < 1e-18);
        let want = Tensor::vector(vec![1000.0, 1.0]);
        let got = Tensor::vector(vec![1001.0, 1.0]);
        assert!((tensor_err(&got, &want) - 1e-3).abs() < 1e-15);
    }

    #[test]
    fn non_finite_disagreement_is_infinite() {
        let want = Tensor::vector(vec![1.0]);
        assert_eq!(
            tensor_err(&Tensor::vector(vec![f64::NAN]), &want),
            f64::INFINITY
        );
        let inf = Tensor::vector(vec![f64::INFINITY]);
        assert_eq!(tensor_err(&inf, &inf), 0.0);
        assert_eq!(scalar_err(1.0, f64::NAN), f64::INFINITY);
        assert_eq!(
            worst_index(
                &Tensor::vector(vec![1.0, 5.0f32]),
                &Tensor::vector(vec![1.0, 2.0])
            ),
            Some(1)
        );
    }

    #[test]
    fn ulps_count_representable_floats_between_values() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(0.0, -0.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        // Across zero: the smallest subnormals either side are 2 apart.
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(ulp_distance(f32::NAN, f32::NAN), 0);
        assert_eq!(ulp_distance(f32::NAN, 1.0), u64::MAX);
        assert_eq!(ulp_distance(f32::INFINITY, f32::MAX), u64::MAX);
        let (a, b) = (
            Tensor::vector(vec![1.0f32, 2.0]),
            Tensor::vector(vec![1.0f32, 2.5]),
        );
        assert_eq!(tensor_ulps(&a, &b), (1 << 21, 1));
    }

    #[test]
    fn scalar_error_is_relative_above_one() {
        assert!((scalar_err(200.0, 202.0) - 2.0 / 202.0).abs() < 1e-15);
        assert!((scalar_err(0.0, 1e-3) - 1e-3).abs() < 1e-15);
    }
}
