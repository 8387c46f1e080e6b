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
    fn scalar_error_is_relative_above_one() {
        assert!((scalar_err(200.0, 202.0) - 2.0 / 202.0).abs() < 1e-15);
        assert!((scalar_err(0.0, 1e-3) - 1e-3).abs() < 1e-15);
    }
}
