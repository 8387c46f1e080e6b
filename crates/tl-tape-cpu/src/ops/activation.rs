//! `gelu` (tanh approximation, as PyTorch's `approximate="tanh"`) and `silu`: one pass over
//! contiguous slices each, forward and backward. Both are stable for large |x|: tanh and the
//! sigmoid saturate, and the GELU derivative drops its second term once tanh has saturated.
//! In f32 the GELU's tanh is [`tl_spec::approx::tanh_f32`] and SiLU's sigmoid
//! [`tl_spec::approx::sigmoid_f32`] (the loops vectorize), the ones the simulation device and
//! the CUDA kernels use, so all three give the same bits.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use super::{Grads, approx, check_arity, check_saved, check_shape, tensor, wrong_family};
use crate::Result;
use crate::simd::{self, Map1, Map2, Map3};

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044_715;

/// Forward value of `gelu` / `silu`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::Gelu => tensor(
            x[0].shape().clone(),
            simd::map(op.name(), x[0].data(), Gelu::new())?,
        ),
        Op::Silu => tensor(
            x[0].shape().clone(),
            simd::map(op.name(), x[0].data(), Silu)?,
        ),
        _ => Err(wrong_family(op, "activation")),
    }
}

/// `gelu`'s value and its `tanh` term `t` (what its backward reads, so that it evaluates no
/// second tanh; [`backward_saved`]); `silu`: its value and nothing kept.
pub fn forward_saving<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    check_arity(op, x)?;
    match op {
        Op::Gelu => {
            let gelu = Gelu::new();
            let t = simd::map(op.name(), x[0].data(), GeluTanh(gelu))?;
            let y = simd::zip(op.name(), x[0].data(), &t, GeluFromTanh(gelu))?;
            Ok((tensor(x[0].shape().clone(), y)?, vec![t]))
        }
        _ => Ok((forward(op, x)?, Vec::new())),
    }
}

/// Operand cotangent of `gelu` / `silu`, reading `gelu`'s `t` from `saved` ([`forward_saving`]);
/// with `saved` empty it evaluates the tanh again. The same bits either way; a list that does not fit is an error
/// naming the op.
pub fn backward_saved<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    let s = x[0].shape();
    check_shape(op, "output", y, s)?;
    check_shape(op, "cotangent", g, s)?;
    if !saved.is_empty() {
        // gelu keeps its tanh term; silu keeps nothing.
        let gelu = [x[0].numel()];
        check_saved(op, saved, if *op == Op::Gelu { &gelu[..] } else { &[] })?;
    }
    let dx: Vec<T> = match (op, saved.first()) {
        (Op::Gelu, None) => simd::zip(op.name(), x[0].data(), g.data(), GeluBackward(Gelu::new()))?,
        (Op::Gelu, Some(t)) => simd::zip3(
            op.name(),
            x[0].data(),
            t,
            g.data(),
            GeluBackwardFromTanh(Gelu::new()),
        )?,
        (Op::Silu, _) => simd::zip(op.name(), x[0].data(), g.data(), SiluBackward)?,
        _ => return Err(wrong_family(op, "activation")),
    };
    Ok(smallvec![Some(tensor(s.clone(), dx)?)])
}

/// GELU's constants, in `T`; its value at one element ([`Map1`]).
#[derive(Clone, Copy)]
struct Gelu<T> {
    c: T,
    a: T,
    half: T,
}

impl<T: Scalar> Gelu<T> {
    fn new() -> Self {
        Gelu {
            c: T::lit(SQRT_2_OVER_PI),
            a: T::lit(GELU_CUBIC),
            half: T::lit(0.5),
        }
    }

    /// `tanh(√(2/π)(v + 0.044715·v³))`, the cubic as `((a·v)·v)·v`.
    #[inline(always)]
    fn t(self, v: T) -> T {
        approx::tanh(self.c * (v + self.a * v * v * v))
    }
}

impl<T: Scalar> Map1<T> for Gelu<T> {
    /// `0.5·v·(1 + t)`.
    #[inline(always)]
    fn at(self, v: T) -> T {
        self.half * v * (T::one() + self.t(v))
    }
}

/// GELU's `t` at one element ([`Map1`]).
#[derive(Clone, Copy)]
struct GeluTanh<T>(Gelu<T>);

impl<T: Scalar> Map1<T> for GeluTanh<T> {
    #[inline(always)]
    fn at(self, v: T) -> T {
        self.0.t(v)
    }
}

/// GELU's value from `(v, t)` ([`Map2`]): [`Gelu`]'s formula with its `t` given.
#[derive(Clone, Copy)]
struct GeluFromTanh<T>(Gelu<T>);

impl<T: Scalar> Map2<T> for GeluFromTanh<T> {
    #[inline(always)]
    fn at(self, v: T, t: T) -> T {
        self.0.half * v * (T::one() + t)
    }
}

/// GELU's cotangent at one element from `(v, g)` ([`Map2`]).
#[derive(Clone, Copy)]
struct GeluBackward<T>(Gelu<T>);

impl<T: Scalar> Map2<T> for GeluBackward<T> {
    #[inline(always)]
    fn at(self, v: T, g: T) -> T {
        gelu_cotangent(self.0, v, self.0.t(v), g)
    }
}

/// GELU's cotangent at one element from `(v, t, g)` ([`Map3`]), `t` as the forward kept it.
#[derive(Clone, Copy)]
struct GeluBackwardFromTanh<T>(Gelu<T>);

impl<T: Scalar> Map3<T> for GeluBackwardFromTanh<T> {
    #[inline(always)]
    fn at(self, v: T, t: T, g: T) -> T {
        gelu_cotangent(self.0, v, t, g)
    }
}

/// `(0.5(1 + t) + 0.5·v·sech²·√(2/π)·(1 + 3a·v²))·g` with `sech² = 1 − t²`, the second term 0
/// once `sech² = 0`.
#[inline(always)]
fn gelu_cotangent<T: Scalar>(gelu: Gelu<T>, v: T, t: T, g: T) -> T {
    let Gelu { c, a, half } = gelu;
    let one = T::one();
    let sech2 = one - t * t;
    let tail = if sech2 == T::zero() {
        T::zero()
    } else {
        half * v * sech2 * c * (one + T::lit(3.0) * a * v * v)
    };
    (half * (one + t) + tail) * g
}

/// SiLU's value at one element, `v·σ(v)` ([`Map1`]).
#[derive(Clone, Copy)]
struct Silu;

impl<T: Scalar> Map1<T> for Silu {
    #[inline(always)]
    fn at(self, v: T) -> T {
        v * approx::sigmoid(v)
    }
}

/// SiLU's cotangent at one element from `(v, g)`, `σ(1 + v(1 − σ))·g` ([`Map2`]).
#[derive(Clone, Copy)]
struct SiluBackward;

impl<T: Scalar> Map2<T> for SiluBackward {
    #[inline(always)]
    fn at(self, v: T, g: T) -> T {
        let s = approx::sigmoid(v);
        s * (T::one() + v * (T::one() - s)) * g
    }
}
