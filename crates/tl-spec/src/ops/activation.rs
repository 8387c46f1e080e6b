//! Smooth activations of the Elementwise family: `gelu` (tanh approximation) and `silu`.
//! Both are pointwise: VJP = f'(x)·g, JVP = f'(x)·dx.

use super::elementwise::sigmoid1;
use crate::{Result, Scalar, Tensor};

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
pub fn gelu<T: Scalar>(x: &Tensor<T>) -> Tensor<T> {
    x.map(gelu1)
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
pub fn silu<T: Scalar>(x: &Tensor<T>) -> Tensor<T> {
    x.map(silu1)
}
/// VJP of `silu`: `silu'(x)·g`.
pub fn silu_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    x.zip_map("silu", g, |x, g| silu_deriv1(x) * g)
}
/// JVP of `silu`: `silu'(x)·dx`.
pub fn silu_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    silu_vjp(x, dx)
}

#[cfg(test)]
mod tests {
    use super::*;

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
