//! Activations of the Elementwise family: `gelu` (tanh approximation), `silu`, `geluErf` (the
//! exact GELU), `leakyRelu` and `elu`. All are pointwise: VJP = f'(x)·g, JVP = f'(x)·dx.
//!
//! Kink conventions (PyTorch's autograd): `leakyRelu'(0) = negative_slope` and
//! `elu'(0) = alpha` (the x ≤ 0 branch is taken at 0).

use super::elementwise::sigmoid1;
use crate::special::erf;
use crate::{Error, Result, Scalar, Tensor};

/// `leakyRelu(negative_slope)` needs a finite slope (PyTorch accepts any, negative included).
pub fn leaky_relu_params(negative_slope: f64) -> Result<()> {
    finite("leakyRelu", "negative_slope", negative_slope)
}

/// `elu(alpha)` needs a finite alpha (PyTorch accepts any, negative included).
pub fn elu_params(alpha: f64) -> Result<()> {
    finite("elu", "alpha", alpha)
}

fn finite(op: &'static str, name: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::param(op, format!("{name} must be finite, got {v}")))
    }
}

/// √(2/π), the tanh-GELU constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh-GELU.
const GELU_CUBIC: f64 = 0.044_715;

/// Scalar tanh-GELU `0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))`.
pub fn gelu1<T: Scalar>(x: T) -> T {
    let u = T::lit(SQRT_2_OVER_PI) * (x + T::lit(GELU_CUBIC) * x * x * x);
    T::lit(0.5) * x * (T::one() + u.tanh())
}

/// Derivative of [`gelu1`]: `0.5(1 + t) + 0.5·x·(1 − t²)·√(2/π)(1 + 3·0.044715x²)`, t = tanh(u).
/// Where tanh has saturated (1 − t² = 0) the second term is 0, so huge |x| never gives 0·∞.
pub fn gelu_deriv1<T: Scalar>(x: T) -> T {
    let c = T::lit(SQRT_2_OVER_PI);
    let a = T::lit(GELU_CUBIC);
    let half = T::lit(0.5);
    let t = (c * (x + a * x * x * x)).tanh();
    let sech2 = T::one() - t * t;
    let inner = if sech2 == T::zero() {
        T::zero()
    } else {
        half * x * sech2 * c * (T::one() + T::lit(3.0) * a * x * x)
    };
    half * (T::one() + t) + inner
}

/// Scalar SiLU `x·sigmoid(x)` (stable sigmoid).
pub fn silu1<T: Scalar>(x: T) -> T {
    x * sigmoid1(x)
}

/// Derivative of [`silu1`]: `s·(1 + x·(1 − s))`, s = sigmoid(x).
pub fn silu_deriv1<T: Scalar>(x: T) -> T {
    let s = sigmoid1(x);
    s * (T::one() + x * (T::one() - s))
}

/// `gelu(x)` elementwise, tanh form. PyTorch: `F.gelu(x, approximate="tanh")`.
pub fn gelu<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    x.try_map("gelu", gelu1)
}
/// VJP of `gelu`: `gelu'(x)·g`.
pub fn gelu_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    x.zip_map("gelu", g, |x, g| gelu_deriv1(x) * g)
}
/// JVP of `gelu`: `gelu'(x)·dx`.
pub fn gelu_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    gelu_vjp(x, dx)
}

/// `silu(x) = x·sigmoid(x)` elementwise. PyTorch: `F.silu(x)`.
pub fn silu<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    x.try_map("silu", silu1)
}
/// VJP of `silu`: `silu'(x)·g`.
pub fn silu_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    x.zip_map("silu", g, |x, g| silu_deriv1(x) * g)
}
/// JVP of `silu`: `silu'(x)·dx`.
pub fn silu_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    silu_vjp(x, dx)
}

/// `1/√2`.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`, the standard normal density at 0.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// Scalar exact GELU `x·Φ(x) = ½·x·(1 + erf(x/√2))`.
pub fn gelu_erf1<T: Scalar>(x: T) -> T {
    T::lit(0.5) * x * (T::one() + erf(x * T::lit(FRAC_1_SQRT_2)))
}

/// Derivative of [`gelu_erf1`]: `Φ(x) + x·φ(x)`, φ(x) = e^{−x²/2}/√(2π).
pub fn gelu_erf_deriv1<T: Scalar>(x: T) -> T {
    let cdf = T::lit(0.5) * (T::one() + erf(x * T::lit(FRAC_1_SQRT_2)));
    let pdf = T::lit(FRAC_1_SQRT_2PI) * (T::lit(-0.5) * x * x).exp();
    cdf + x * pdf
}

/// `geluErf(x) = x·Φ(x)` elementwise. PyTorch: `F.gelu(x)` (`approximate="none"`).
pub fn gelu_erf<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    x.try_map("geluErf", gelu_erf1)
}
/// VJP of `geluErf`: `(Φ(x) + x·φ(x))·g`.
pub fn gelu_erf_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    x.zip_map("geluErf", g, |x, g| gelu_erf_deriv1(x) * g)
}
/// JVP of `geluErf`: `(Φ(x) + x·φ(x))·dx`.
pub fn gelu_erf_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    gelu_erf_vjp(x, dx)
}

/// `x` for x > 0, else `negative_slope·x`. PyTorch: `F.leaky_relu(x, negative_slope)`.
pub fn leaky_relu<T: Scalar>(x: &Tensor<T>, negative_slope: T) -> Result<Tensor<T>> {
    x.try_map("leakyRelu", |x| {
        if x > T::zero() { x } else { negative_slope * x }
    })
}
/// VJP of `leakyRelu`: `g` where x > 0, else `negative_slope·g` (x = 0 included).
pub fn leaky_relu_vjp<T: Scalar>(
    x: &Tensor<T>,
    negative_slope: T,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    x.zip_map("leakyRelu", g, |x, g| {
        if x > T::zero() { g } else { negative_slope * g }
    })
}
/// JVP of `leakyRelu`: the VJP's factor times `dx`.
pub fn leaky_relu_jvp<T: Scalar>(
    x: &Tensor<T>,
    negative_slope: T,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    leaky_relu_vjp(x, negative_slope, dx)
}

/// `x` for x > 0, else `alpha·(eˣ − 1)` (as `expm1`). PyTorch: `F.elu(x, alpha)`.
pub fn elu<T: Scalar>(x: &Tensor<T>, alpha: T) -> Result<Tensor<T>> {
    x.try_map(
        "elu",
        |x| if x > T::zero() { x } else { alpha * x.exp_m1() },
    )
}
/// VJP of `elu`: `g` where x > 0, else `alpha·eˣ·g` (x = 0 included).
pub fn elu_vjp<T: Scalar>(x: &Tensor<T>, alpha: T, g: &Tensor<T>) -> Result<Tensor<T>> {
    x.zip_map("elu", g, |x, g| {
        if x > T::zero() {
            g
        } else {
            alpha * x.exp() * g
        }
    })
}
/// JVP of `elu`: the VJP's factor times `dx`.
pub fn elu_jvp<T: Scalar>(x: &Tensor<T>, alpha: T, dx: &Tensor<T>) -> Result<Tensor<T>> {
    elu_vjp(x, alpha, dx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values and derivatives from PyTorch 2 (`F.gelu`, `F.leaky_relu(x, 0.2)`,
    /// `F.elu(x, 0.5)` in float64, gradients by autograd), kinks included.
    #[test]
    fn new_activations_match_pytorch() {
        let x = Tensor::vector(vec![0.0f64, -0.0, 1.0, -1.0]);
        let ones = Tensor::ones([4]);
        let close = |a: &[f64], b: &[f64]| {
            for (u, v) in a.iter().zip(b) {
                assert!((u - v).abs() <= 1e-15 * v.abs().max(1.0), "{a:?} vs {b:?}");
            }
        };
        close(
            gelu_erf(&x).unwrap().data(),
            &[0.0, -0.0, 0.841344746068543, -0.15865525393145702],
        );
        close(
            gelu_erf_vjp(&x, &ones).unwrap().data(),
            &[0.5, 0.5, 1.0833154705876864, -0.08331547058768635],
        );
        let l = leaky_relu(&x, 0.2).unwrap();
        assert_eq!(l.data(), &[0.0, -0.0, 1.0, -0.2]);
        assert!(l.data()[1].is_sign_negative());
        assert_eq!(
            leaky_relu_vjp(&x, 0.2, &ones).unwrap().data(),
            &[0.2, 0.2, 1.0, 0.2]
        );
        close(
            elu(&x, 0.5).unwrap().data(),
            &[0.0, -0.0, 1.0, -0.31606027941427883],
        );
        close(
            elu_vjp(&x, 0.5, &ones).unwrap().data(),
            &[0.5, 0.5, 1.0, 0.18393972058572117],
        );
        assert!(leaky_relu_params(f64::NAN).is_err());
        assert!(
            elu_params(f64::INFINITY)
                .unwrap_err()
                .to_string()
                .contains("elu")
        );
        assert!(elu_params(-1.0).is_ok());
    }

    #[test]
    fn known_points_and_large_inputs() {
        assert!((gelu1(1.0f64) - 0.841_191_990_608_276_8).abs() < 1e-15);
        assert_eq!(gelu1(0.0f64), 0.0);
        assert!((silu1(1.0f64) - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
        for x in [1e4f32, -1e4, 1e20, -1e20] {
            for v in [gelu1(x), gelu_deriv1(x), silu1(x), silu_deriv1(x)] {
                assert!(v.is_finite(), "{x}: {v}");
            }
        }
        assert_eq!(gelu1(-1e20f32), 0.0);
        assert_eq!(gelu_deriv1(1e20f32), 1.0);
    }
}
