//! Per-element bodies of the pointwise kernels: what one CUDA thread computes for its index.
//!
//! Each function is the twin of the `kernels/pointwise.cu` body of the same name. Basic
//! arithmetic (`+ − × ÷`, `sqrt`) is correctly rounded on both sides and matches bit for bit
//! (the kernels must be built without FMA contraction: `--fmad=false` or `__fmul_rn`/`__fadd_rn`);
//! `tanh`, the sigmoid (in `sigmoid`, `silu` and the backward passes of `softplus` and
//! `safeLog`), softplus (`softplus`, `safeLog` and its backward) and `safeLog`'s log are
//! [`tl_spec::approx`]'s straight-line functions, whose twins are in `kernels/approx.cuh`: the
//! same bits there and on the CPU tape. The other transcendental functions (`expf`, `logf`)
//! may differ from the host's by the few ulp CUDA documents, so sim vs GPU comparisons of
//! those ops use a tolerance.
//!
//! Conventions are those of SEMANTICS.md ("Pointwise"); NaN propagates through `relu`, `sqrt`,
//! `clamp`, `max` and `min` (the spec's scalar rules, called here).

use tl_spec::ops::elementwise as ew;

/// `|x|`.
pub fn abs(x: f32) -> f32 {
    x.abs()
}

/// `sqrt(max(x, 0))`, NaN propagated ([`tl_spec::ops::elementwise::sqrt1`]).
pub fn sqrt(x: f32) -> f32 {
    ew::sqrt1(x)
}

/// `exp x`.
pub fn exp(x: f32) -> f32 {
    x.exp()
}

/// `ln x`, IEEE: −∞ at 0, NaN below.
pub fn log(x: f32) -> f32 {
    x.ln()
}

/// `1/x`.
pub fn inv(x: f32) -> f32 {
    1.0 / x
}

/// `x` where x > 0 or NaN, else 0 ([`tl_spec::ops::elementwise::relu1`]).
pub fn relu(x: f32) -> f32 {
    ew::relu1(x)
}

/// `1/(1+e)` for x ≥ 0, `e/(1+e)` below, `e = exp(−|x|)`: no overflow either way
/// ([`tl_spec::approx::sigmoid_f32`], `tl_sigmoid_approx` in the kernels).
pub fn sigmoid(x: f32) -> f32 {
    tl_spec::approx::sigmoid_f32(x)
}

/// `tanh x`: saturates to ±1 for large |x|, never `∞/∞ = NaN`
/// ([`tl_spec::approx::tanh_f32`], `tl_tanh_approx` in the kernels).
pub fn tanh(x: f32) -> f32 {
    tl_spec::approx::tanh_f32(x)
}

/// `max(x, 0) + ln(1 + exp(−|x|))` ([`tl_spec::approx::softplus_f32`], `tl_softplus_approx`
/// in the kernels).
pub fn softplus(x: f32) -> f32 {
    tl_spec::approx::softplus_f32(x)
}

/// `log(softplus(x) + eps)`, the log [`tl_spec::approx::log_f32`] (`tl_log_approx` in the
/// kernels).
pub fn safe_log(x: f32, eps: f32) -> f32 {
    tl_spec::approx::log_f32(softplus(x) + eps)
}

/// `min(hi, max(lo, x))`, NaN propagated ([`tl_spec::ops::elementwise::clamp1`]).
pub fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
    ew::clamp1(x, lo, hi)
}

/// sign(x) with sign(0) = 0 (and sign(NaN) = 0).
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// `sign(x) · g`.
pub fn abs_bwd(x: f32, g: f32) -> f32 {
    sign(x) * g
}

/// `g / (2·sqrt(x))` for x > 0, else 0.
pub fn sqrt_bwd(x: f32, g: f32) -> f32 {
    if x > 0.0 { g / (2.0 * x.sqrt()) } else { 0.0 }
}

/// `g` for x > 0, else 0.
pub fn relu_bwd(x: f32, g: f32) -> f32 {
    if x > 0.0 { g } else { 0.0 }
}

/// `g` strictly inside (lo, hi), else 0.
pub fn clamp_bwd(x: f32, g: f32, lo: f32, hi: f32) -> f32 {
    if x > lo && x < hi { g } else { 0.0 }
}

/// `−g / (x·x)`.
pub fn inv_bwd(x: f32, g: f32) -> f32 {
    -g / (x * x)
}

/// `g · (y · (1 − y))` from the sigmoid output `y`.
pub fn sigmoid_bwd(y: f32, g: f32) -> f32 {
    g * (y * (1.0 - y))
}

/// `g · (1 − y·y)` from the tanh output `y`.
pub fn tanh_bwd(y: f32, g: f32) -> f32 {
    g * (1.0 - y * y)
}

/// `g · sigmoid(x)`.
pub fn softplus_bwd(x: f32, g: f32) -> f32 {
    g * sigmoid(x)
}

/// `g · (sigmoid(x) / (softplus(x) + eps))`.
pub fn safe_log_bwd(x: f32, g: f32, eps: f32) -> f32 {
    g * (sigmoid(x) / (softplus(x) + eps))
}

/// `a` if `a ≥ b` or `a` is NaN, else `b` ([`tl_spec::ops::elementwise::max1`]).
pub fn max(a: f32, b: f32) -> f32 {
    ew::max1(a, b)
}

/// `a` if `a ≤ b` or `a` is NaN, else `b` ([`tl_spec::ops::elementwise::min1`]).
pub fn min(a: f32, b: f32) -> f32 {
    ew::min1(a, b)
}

/// `a + c·b`, two roundings (no FMA).
pub fn axpy(a: f32, b: f32, c: f32) -> f32 {
    a + c * b
}

/// `(g / b, −g·a / (b·b))`.
pub fn div_bwd(a: f32, b: f32, g: f32) -> (f32, f32) {
    (g / b, -g * a / (b * b))
}

/// The gradient split of `max`: `(g, 0)` if a > b, `(0, g)` if b > a, halves on a tie,
/// `(0, 0)` where either is NaN.
pub fn max_bwd(a: f32, b: f32, g: f32) -> (f32, f32) {
    if a > b {
        (g, 0.0)
    } else if a == b {
        (0.5 * g, 0.5 * g)
    } else if a < b {
        (0.0, g)
    } else {
        (0.0, 0.0)
    }
}

/// The gradient split of `min`: `(g, 0)` if a < b, `(0, g)` if b < a, halves on a tie.
pub fn min_bwd(a: f32, b: f32, g: f32) -> (f32, f32) {
    max_bwd(b, a, g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_forms_do_not_overflow() {
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert_eq!(softplus(200.0), 200.0);
        assert!(safe_log(-200.0, 1e-6).is_finite());
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert!(log(-1.0).is_nan());
    }

    #[test]
    fn kink_conventions() {
        assert_eq!(abs_bwd(0.0, 3.0), 0.0);
        assert_eq!(relu_bwd(0.0, 3.0), 0.0);
        assert_eq!(sqrt_bwd(0.0, 3.0), 0.0);
        assert_eq!(clamp_bwd(1.0, 3.0, 1.0, 2.0), 0.0);
        assert_eq!(clamp_bwd(1.5, 3.0, 1.0, 2.0), 3.0);
        assert_eq!(max_bwd(2.0, 2.0, 3.0), (1.5, 1.5));
        assert_eq!(min_bwd(1.0, 2.0, 3.0), (3.0, 0.0));
        assert_eq!(max_bwd(1.0, 2.0, 3.0), (0.0, 3.0));
        assert_eq!(max_bwd(f32::NAN, 2.0, 3.0), (0.0, 0.0));
        assert_eq!(min_bwd(1.0, f32::NAN, 3.0), (0.0, 0.0));
        assert!(max(1.0, f32::NAN).is_nan() && min(f32::NAN, 1.0).is_nan());
        assert!(relu(f32::NAN).is_nan() && sqrt(f32::NAN).is_nan());
        assert!(clamp(f32::NAN, 0.0, 1.0).is_nan());
    }
}
