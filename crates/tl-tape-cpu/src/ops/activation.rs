//! `gelu` (tanh approximation, as PyTorch's `approximate="tanh"`) and `silu`: one pass over
//! contiguous slices each, forward and backward. Both are stable for large |x|: tanh and the
//! sigmoid saturate, and the GELU derivative drops its second term once tanh has saturated.
//! In f32 the GELU's tanh is [`approx::tanh`] (the loops vectorize), the one the simulation
//! device and the CUDA kernel use, so all three give the same bits.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use super::{Grads, approx, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044_715;

/// Forward value of `gelu` / `silu`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let (c, a, half) = (T::lit(SQRT_2_OVER_PI), T::lit(GELU_CUBIC), T::lit(0.5));
    match op {
        Op::Gelu => Ok(x[0].map(|v| half * v * (T::one() + approx::tanh(c * (v + a * v * v * v))))),
        Op::Silu => Ok(x[0].map(|v| v * sigmoid(v))),
        _ => Err(wrong_family(op, "activation")),
    }
}

/// Operand cotangent of `gelu` / `silu`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let s = x[0].shape();
    check_shape(op, "output", y, s)?;
    check_shape(op, "cotangent", g, s)?;
    let (c, a, half, one) = (
        T::lit(SQRT_2_OVER_PI),
        T::lit(GELU_CUBIC),
        T::lit(0.5),
        T::one(),
    );
    let pairs = x[0].data().iter().zip(g.data());
    let dx: Vec<T> = match op {
        Op::Gelu => pairs
            .map(|(&v, &g)| {
                let t = approx::tanh(c * (v + a * v * v * v));
                let sech2 = one - t * t;
                let tail = if sech2 == T::zero() {
                    T::zero()
                } else {
                    half * v * sech2 * c * (one + T::lit(3.0) * a * v * v)
                };
                (half * (one + t) + tail) * g
            })
            .collect(),
        Op::Silu => pairs
            .map(|(&v, &g)| {
                let s = sigmoid(v);
                s * (one + v * (one - s)) * g
            })
            .collect(),
        _ => return Err(wrong_family(op, "activation")),
    };
    Ok(smallvec![Some(tensor(s.clone(), dx)?)])
}

/// The logistic sigmoid without overflow for either sign.
fn sigmoid<T: Scalar>(v: T) -> T {
    if v >= T::zero() {
        T::one() / (T::one() + (-v).exp())
    } else {
        let e = v.exp();
        e / (T::one() + e)
    }
}
