//! Pointwise kernels: the binary ops (`add`, `sub`, `mul`, `div`, `max`, `min`), the unary maps
//! (`scale`, `abs`, `sqrt`, `exp`, `log`, `inv`, `relu`, `clamp`, `sigmoid`, `tanh`, `softplus`,
//! `safeLog`, `leakyRelu`, `elu`, `geluErf`), `detach` and `constant`.
//!
//! Every kernel is one pass over contiguous slices through [`crate::simd`] (`map`, `zip`,
//! `zip3`): compiled for the best instruction set the CPU has, cut across threads when long,
//! branch-free where the compiler can select; nothing allocates per element. Backward passes reuse the forward output
//! `y` where that is cheaper than recomputing (`exp`, `sigmoid`, `tanh`, `sqrt`, `inv`, `div`).
//! In f32, `exp`, `log`, `tanh`, the sigmoid (`sigmoid`, the backward passes of `softplus`
//! and `safeLog`) and softplus (`softplus`, `safeLog`) are [`tl_spec::approx`]'s (see
//! `ops/approx.rs`). Kink conventions follow SEMANTICS.md: sign(0) = 0, relu'(0) = 0, clamp passes gradient only
//! strictly inside (lo, hi), max/min ties split the gradient in halves, sqrt'(x ≤ 0) = 0;
//! NaN propagates through relu, sqrt, clamp, max and min (the spec's scalar rules, with gradient
//! 0 there);
//! leakyRelu'(0) = negative_slope and elu'(0) = alpha (PyTorch's autograd). `elu` calls libm's
//! `expm1`/`exp`, and `geluErf` erf and exp from `ops/approx.rs` (f32: [`tl_spec::approx`]'s,
//! f64: libm's): their loops run through [`crate::simd`] like the others but stay calls per
//! element.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::elementwise as ew;
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, approx, check_arity, check_saved, check_shape, tensor, wrong_family};
use crate::Result;
use crate::simd::{self, zip, zip3};

/// Forward value of a pointwise op (or `detach`, `constant`).
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    use Op::*;
    let y = match op {
        Add => binary(op, x, |a: T, b: T| a + b)?,
        Sub => binary(op, x, |a: T, b: T| a - b)?,
        Mul => binary(op, x, |a: T, b: T| a * b)?,
        Div => binary(op, x, |a: T, b: T| a / b)?,
        Max => binary(op, x, ew::max1)?,
        Min => binary(op, x, ew::min1)?,
        Scale(c) => {
            let c = T::lit(*c);
            tensor(
                x[0].shape().clone(),
                simd::map(op.name(), x[0].data(), move |v: T| c * v)?,
            )?
        }
        Abs => unary(op, x[0], |v: T| v.abs())?,
        Sqrt => unary(op, x[0], ew::sqrt1)?,
        Exp => unary(op, x[0], approx::exp)?,
        Log => log(op, x[0])?,
        Inv => unary(op, x[0], |v: T| T::one() / v)?,
        Relu => unary(op, x[0], ew::relu1)?,
        Clamp { lo, hi } => {
            let (lo, hi) = (T::lit(*lo), T::lit(*hi));
            tensor(
                x[0].shape().clone(),
                simd::map(op.name(), x[0].data(), move |v: T| ew::clamp1(v, lo, hi))?,
            )?
        }
        Sigmoid => unary(op, x[0], approx::sigmoid)?,
        Tanh => unary(op, x[0], approx::tanh)?,
        Softplus => unary(op, x[0], approx::softplus)?,
        SafeLog { eps } => {
            let (y, t) = safe_log_keeping(op, x[0], T::lit(*eps))?;
            tl_spec::pool::give(t);
            y
        }
        LeakyRelu { negative_slope } => {
            let s = T::lit(*negative_slope);
            unary(op, x[0], move |v: T| if v > T::zero() { v } else { s * v })?
        }
        Elu { alpha } => {
            let a = T::lit(*alpha);
            unary(
                op,
                x[0],
                move |v: T| if v > T::zero() { v } else { a * v.exp_m1() },
            )?
        }
        GeluErf => unary(op, x[0], GeluErfAt)?,
        Detach => x[0].clone(),
        Constant(t) => t.try_cast(op.name())?,
        _ => return Err(wrong_family(op, "elementwise")),
    };
    Ok(y)
}

/// Operand cotangents of a pointwise op at `x`, with output `y` and output cotangent `g`.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    use Op::*;
    if let Constant(_) = op {
        return Ok(Grads::new());
    }
    if op.family() != tl_ir::Family::Elementwise {
        return Err(wrong_family(op, "elementwise"));
    }
    // Every pointwise op preserves its operands' (common) shape.
    let s = x[0].shape();
    for t in &x[1..] {
        check_shape(op, "second operand", t, s)?;
    }
    check_shape(op, "output", y, s)?;
    check_shape(op, "cotangent", g, s)?;
    let (xd, yd, gd) = (x[0].data(), y.data(), g.data());
    let one = |v: Vec<T>| -> Result<Grads<T>> { Ok(smallvec![Some(tensor(s.clone(), v)?)]) };
    let two = |u: Vec<T>, v: Vec<T>| -> Result<Grads<T>> {
        Ok(smallvec![
            Some(tensor(s.clone(), u)?),
            Some(tensor(s.clone(), v)?)
        ])
    };
    let (zero, one_t, half) = (T::zero(), T::one(), T::lit(0.5));
    match op {
        Add => Ok(smallvec![Some(g.clone()), Some(g.clone())]),
        Sub => Ok(smallvec![
            Some(g.clone()),
            Some(tensor(s.clone(), simd::map(op.name(), gd, |v: T| -v)?)?)
        ]),
        Mul => two(
            zip(op.name(), gd, x[1].data(), |g: T, b: T| g * b)?,
            zip(op.name(), gd, xd, |g: T, a: T| g * a)?,
        ),
        Div => {
            // da = g/b; db = −g·a/b² = −da·y (y = a/b).
            let da = zip(op.name(), gd, x[1].data(), |g: T, b: T| g / b)?;
            let db = zip(op.name(), &da, yd, |d: T, y: T| -(d * y))?;
            two(da, db)
        }
        Max | Min => {
            let bd = x[1].data();
            let sign = if matches!(op, Max) { one_t } else { -one_t };
            // Weight of the first operand: 1 where it wins, 1/2 on a tie, 0 where it loses.
            let w = move |a: T, b: T| {
                let (a, b) = (sign * a, sign * b);
                if a > b {
                    one_t
                } else if a == b {
                    half
                } else {
                    zero
                }
            };
            two(
                zip3(op.name(), gd, xd, bd, |g: T, a: T, b: T| w(a, b) * g)?,
                zip3(op.name(), gd, xd, bd, |g: T, a: T, b: T| w(b, a) * g)?,
            )
        }
        Scale(c) => {
            let c = T::lit(*c);
            one(simd::map(op.name(), gd, move |v: T| c * v)?)
        }
        Abs => one(zip(op.name(), gd, xd, |g: T, x: T| {
            if x > zero {
                g
            } else if x < zero {
                -g
            } else {
                zero
            }
        })?),
        Sqrt => one(zip3(op.name(), gd, xd, yd, |g: T, x: T, y: T| {
            if x > zero { g / (y + y) } else { zero }
        })?),
        Exp => one(zip(op.name(), gd, yd, |g: T, y: T| g * y)?),
        Log => one(zip(op.name(), gd, xd, |g: T, x: T| g / x)?),
        Inv => one(zip(op.name(), gd, yd, |g: T, y: T| -(g * y * y))?),
        Relu => one(zip(
            op.name(),
            gd,
            xd,
            |g: T, x: T| if x > zero { g } else { zero },
        )?),
        Clamp { lo, hi } => {
            let (lo, hi) = (T::lit(*lo), T::lit(*hi));
            one(zip(op.name(), gd, xd, |g: T, x: T| {
                if x > lo && x < hi { g } else { zero }
            })?)
        }
        Sigmoid => one(zip(op.name(), gd, yd, |g: T, y: T| g * (y * (one_t - y)))?),
        Tanh => one(zip(op.name(), gd, yd, |g: T, y: T| g * (one_t - y * y))?),
        Softplus => one(zip(op.name(), gd, xd, |g: T, x: T| g * approx::sigmoid(x))?),
        SafeLog { eps } => one(zip(op.name(), gd, xd, SafeLogBackward(T::lit(*eps)))?),
        LeakyRelu { negative_slope } => {
            let s = T::lit(*negative_slope);
            one(zip(
                op.name(),
                gd,
                xd,
                move |g: T, x: T| if x > zero { g } else { s * g },
            )?)
        }
        Elu { alpha } => {
            let a = T::lit(*alpha);
            one(zip(op.name(), gd, xd, move |g: T, x: T| {
                if x > zero { g } else { a * x.exp() * g }
            })?)
        }
        GeluErf => one(zip(op.name(), gd, xd, GeluErfBackward)?),
        Detach => Ok(smallvec![None]),
        _ => Err(wrong_family(op, "elementwise")),
    }
}

/// `safeLog`'s value and its `softplus(x) + eps` (what its backward divides by, so that it
/// evaluates no second softplus; [`backward_saved`]); every other op: its value, nothing kept.
pub fn forward_saving<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    check_arity(op, x)?;
    match op {
        Op::SafeLog { eps } => {
            let (y, t) = safe_log_keeping(op, x[0], T::lit(*eps))?;
            Ok((y, vec![t]))
        }
        _ => Ok((forward(op, x)?, Vec::new())),
    }
}

/// [`backward`] reading `safeLog`'s `softplus(x) + eps` from `saved` ([`forward_saving`]);
/// with `saved` empty it evaluates the softplus again. The same bits either way; a list that
/// does not fit (any list for an op that keeps nothing) is an error naming the op.
pub fn backward_saved<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    if saved.is_empty() {
        return backward(op, x, y, g);
    }
    check_arity(op, x)?;
    let s = x[0].shape();
    check_shape(op, "output", y, s)?;
    check_shape(op, "cotangent", g, s)?;
    let Op::SafeLog { .. } = op else {
        check_saved(op, saved, &[])?;
        return backward(op, x, y, g);
    };
    check_saved(op, saved, &[x[0].numel()])?;
    let dx = zip3(
        op.name(),
        g.data(),
        x[0].data(),
        &saved[0],
        SafeLogBackwardFromT,
    )?;
    Ok(smallvec![Some(tensor(s.clone(), dx)?)])
}

/// `½·v·(1 + erf(v/√2))`, the exact GELU.
#[inline(always)]
fn gelu_erf<T: Scalar>(v: T) -> T {
    let half = T::lit(0.5);
    half * v * (T::one() + approx::erf(v * T::lit(std::f64::consts::FRAC_1_SQRT_2)))
}

/// `Φ(v) + v·φ(v)`, the exact GELU's slope: `½(1 + erf(v/√2)) + v·e^{−v²/2}/√(2π)`.
#[inline(always)]
fn gelu_erf_slope<T: Scalar>(v: T) -> T {
    let half = T::lit(0.5);
    let cdf = half * (T::one() + approx::erf(v * T::lit(std::f64::consts::FRAC_1_SQRT_2)));
    let pdf = T::lit(0.398_942_280_401_432_7) * approx::exp(-(half * v * v));
    cdf + v * pdf
}

/// `f` at every element of `x`.
fn unary<T: Scalar>(op: &Op, x: &Tensor<T>, f: impl simd::Map1<T>) -> Result<Tensor<T>> {
    tensor(x.shape().clone(), simd::map(op.name(), x.data(), f)?)
}

/// Same-shape binary map; the error names the op and both shapes.
fn binary<T: Scalar>(op: &Op, x: &[&Tensor<T>], f: impl simd::Map2<T>) -> Result<Tensor<T>> {
    let (a, b) = (x[0], x[1]);
    if a.shape() != b.shape() {
        return Err(SpecError::shape(
            op.name(),
            format!(
                "operands must have the same shape, got {} and {}",
                a.shape(),
                b.shape()
            ),
        )
        .into());
    }
    tensor(a.shape().clone(), zip(op.name(), a.data(), b.data(), f)?)
}

/// `ln x`, after checking every element is positive (a NaN or x ≤ 0 is an error naming the op,
/// the shape, the value and its flat index).
fn log<T: Scalar>(op: &Op, x: &Tensor<T>) -> Result<Tensor<T>> {
    let d = x.data();
    let bad = (!all_positive(d))
        .then(|| d.iter().position(|&v| v.is_nan() || v <= T::zero()))
        .flatten();
    if let Some(i) = bad {
        return Err(SpecError::domain(
            op.name(),
            format!(
                "input of shape {} has non-positive value {} at flat index {i}",
                x.shape(),
                d[i]
            ),
        )
        .into());
    }
    tensor(x.shape().clone(), simd::map(op.name(), d, approx::log)?)
}

/// Whether every element is > 0 (a NaN is not): one pass without an early exit, so that it
/// runs at the CPU's width ([`simd::vectorize`]); the caller looks for the culprit only when
/// there is one.
fn all_positive<T: Scalar>(d: &[T]) -> bool {
    struct AllPositive<'a, T>(&'a [T]);
    impl<T: Scalar> simd::Kernel for AllPositive<'_, T> {
        type Output = bool;
        #[inline(always)]
        fn call(self) -> bool {
            let positive = |c: &[T]| c.iter().fold(true, |ok, &v| ok & (v > T::zero()));
            self.0.chunks(1024).all(positive)
        }
    }
    simd::vectorize(AllPositive(d))
}

/// `safeLog`'s value, `ln(softplus(x) + eps)`, as two passes: `softplus(x) + eps`, then its
/// log. One pass took 466 µs for 256×1024 on one core, the two 336 µs (`benches/families.rs`):
/// the exponential, softplus's log and the outer log are one chain of ~60 dependent operations
/// per vector, longer than the out-of-order window overlaps. The same operations on the same
/// values (the sum rounded to `T` either way), so the same bits. Returns the value and the
/// first pass, `softplus(x) + eps` (what [`forward_saving`] keeps).
fn safe_log_keeping<T: Scalar>(op: &Op, x: &Tensor<T>, eps: T) -> Result<(Tensor<T>, Vec<T>)> {
    let t = simd::map(op.name(), x.data(), SoftplusPlus(eps))?;
    let y = simd::map(op.name(), &t, approx::log)?;
    Ok((tensor(x.shape().clone(), y)?, t))
}

/// `softplus(x) + eps` at one element (a named [`simd::Map1`]: its body is too large for a
/// closure to inline into the SIMD loop).
#[derive(Clone, Copy)]
struct SoftplusPlus<T>(T);

impl<T: Scalar> simd::Map1<T> for SoftplusPlus<T> {
    #[inline(always)]
    fn at(self, x: T) -> T {
        approx::softplus(x) + self.0
    }
}

/// `safeLog`'s cotangent at one element, `g·sigmoid(x)/(softplus(x) + eps)`.
#[derive(Clone, Copy)]
struct SafeLogBackward<T>(T);

impl<T: Scalar> simd::Map2<T> for SafeLogBackward<T> {
    #[inline(always)]
    fn at(self, g: T, x: T) -> T {
        g * (approx::sigmoid(x) / (approx::softplus(x) + self.0))
    }
}

/// [`SafeLogBackward`] from `(g, x, t)` with `t = softplus(x) + eps` as the forward kept it.
#[derive(Clone, Copy)]
struct SafeLogBackwardFromT;

/// The exact GELU as a named [`simd::Map1`]: its body (erf's intervals, two `exp`s) is too
/// large for a closure to be inlined into the SIMD loop, and a call per element runs erf's
/// FMAs at the baseline width, through libm's `fmaf`.
#[derive(Clone, Copy)]
struct GeluErfAt;

impl<T: Scalar> simd::Map1<T> for GeluErfAt {
    #[inline(always)]
    fn at(self, v: T) -> T {
        gelu_erf(v)
    }
}

/// `g · gelu_erf'(x)`, named for the same reason.
#[derive(Clone, Copy)]
struct GeluErfBackward;

impl<T: Scalar> simd::Map2<T> for GeluErfBackward {
    #[inline(always)]
    fn at(self, g: T, x: T) -> T {
        gelu_erf_slope(x) * g
    }
}

impl<T: Scalar> simd::Map3<T> for SafeLogBackwardFromT {
    #[inline(always)]
    fn at(self, g: T, x: T, t: T) -> T {
        g * (approx::sigmoid(x) / t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(d: &[f64]) -> Tensor<f64> {
        Tensor::vector(d.to_vec())
    }

    fn grad1(op: &Op, x: &Tensor<f64>) -> Vec<f64> {
        let y = forward(op, &[x]).unwrap();
        let g = Tensor::ones(x.shape().clone());
        let gr = backward(op, &[x], &y, &g).unwrap();
        gr[0].as_ref().unwrap().data().to_vec()
    }

    /// `log`'s domain check is one vectorized pass: at every SIMD level, a culprit anywhere
    /// (the tail past the last full vector included) is found with its flat index, and an
    /// input that is all positive (a subnormal and +∞ among them) passes.
    #[test]
    fn log_finds_a_non_positive_value_at_every_level() {
        let _level = crate::simd::tests::hold_level();
        let n = 2049;
        let good: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32).collect();
        for level in crate::simd::Level::available() {
            assert!(crate::simd::set_level(Some(level)));
            let mut ok = good.clone();
            ok[3] = 1e-40;
            ok[7] = f32::INFINITY;
            let y = forward(&Op::Log, &[&Tensor::vector(ok)]).unwrap();
            assert_eq!(y.data()[7], f32::INFINITY);
            for at in [0, 1500, n - 1] {
                for bad in [0.0, -0.0, -1.0, f32::NAN, f32::NEG_INFINITY] {
                    let mut x = good.clone();
                    x[at] = bad;
                    let e = forward(&Op::Log, &[&Tensor::vector(x)])
                        .unwrap_err()
                        .to_string();
                    assert!(
                        e.contains(&format!("flat index {at}")),
                        "{level:?} {bad}: {e}"
                    );
                }
            }
        }
        crate::simd::set_level(None);
    }

    #[test]
    fn kink_conventions_by_hand() {
        let x = v(&[-1.0, 0.0, 2.0]);
        assert_eq!(grad1(&Op::Abs, &x), [-1.0, 0.0, 1.0]);
        assert_eq!(grad1(&Op::Relu, &x), [0.0, 0.0, 1.0]);
        assert_eq!(grad1(&Op::Sqrt, &x)[..2], [0.0, 0.0]);
        assert_eq!(
            forward(&Op::Sqrt, &[&x]).unwrap().data(),
            &[0.0, 0.0, 2f64.sqrt()]
        );
        let c = v(&[-1.0, -0.5, 0.0, 1.0, 2.0]);
        let clamp = Op::Clamp { lo: -1.0, hi: 1.0 };
        assert_eq!(grad1(&clamp, &c), [0.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(
            forward(&clamp, &[&c]).unwrap().data(),
            &[-1.0, -0.5, 0.0, 1.0, 1.0]
        );
    }

    #[test]
    fn max_min_ties_split_in_halves() {
        let (a, b, g) = (v(&[1.0, 2.0, 3.0]), v(&[1.0, 5.0, 0.0]), v(&[4.0; 3]));
        let y = forward(&Op::Max, &[&a, &b]).unwrap();
        assert_eq!(y.data(), &[1.0, 5.0, 3.0]);
        let gr = backward(&Op::Max, &[&a, &b], &y, &g).unwrap();
        assert_eq!(gr[0].as_ref().unwrap().data(), &[2.0, 0.0, 4.0]);
        assert_eq!(gr[1].as_ref().unwrap().data(), &[2.0, 4.0, 0.0]);
        let y = forward(&Op::Min, &[&a, &b]).unwrap();
        assert_eq!(y.data(), &[1.0, 2.0, 0.0]);
        let gr = backward(&Op::Min, &[&a, &b], &y, &g).unwrap();
        assert_eq!(gr[0].as_ref().unwrap().data(), &[2.0, 4.0, 0.0]);
        assert_eq!(gr[1].as_ref().unwrap().data(), &[2.0, 0.0, 4.0]);
    }

    #[test]
    fn stable_forms_do_not_overflow() {
        let x = v(&[-1000.0, 1000.0]);
        assert_eq!(forward(&Op::Sigmoid, &[&x]).unwrap().data(), &[0.0, 1.0]);
        assert_eq!(
            forward(&Op::Softplus, &[&x]).unwrap().data(),
            &[0.0, 1000.0]
        );
        assert_eq!(forward(&Op::Tanh, &[&x]).unwrap().data(), &[-1.0, 1.0]);
        let sl = Op::SafeLog { eps: 1e-6 };
        assert!(
            forward(&sl, &[&x])
                .unwrap()
                .data()
                .iter()
                .all(|v| v.is_finite())
        );
        assert!(grad1(&sl, &x).iter().all(|v| v.is_finite()));
        // safeLog(0) = log(log 2 + eps), not log(max(0, eps)).
        let y0 = forward(&sl, &[&v(&[0.0])]).unwrap().data()[0];
        assert!((y0 - (2f64.ln() + 1e-6).ln()).abs() < 1e-15);
    }

    #[test]
    fn detach_and_constant_give_no_gradient() {
        let x = v(&[1.0, 2.0]);
        let y = forward(&Op::Detach, &[&x]).unwrap();
        assert!(y.shares_storage_with(&x));
        let gr = backward(&Op::Detach, &[&x], &y, &x).unwrap();
        assert_eq!(gr.len(), 1);
        assert!(gr[0].is_none());
        let c = Op::Constant(Tensor::vector(vec![0.25, -1.5]));
        let y = forward::<f32>(&c, &[]).unwrap();
        assert_eq!(y.data(), &[0.25f32, -1.5]);
        assert!(backward(&c, &[], &y, &y).unwrap().is_empty());
    }

    #[test]
    fn log_of_non_positive_names_op_shape_and_index() {
        let e = forward(&Op::Log, &[&v(&[1.0, 0.5, -2.0])])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("log") && e.contains("[3]") && e.contains("index 2"),
            "{e}"
        );
        assert!(forward(&Op::Log, &[&v(&[f64::NAN])]).is_err());
    }

    #[test]
    fn mismatched_cotangent_is_an_error() {
        let x = v(&[1.0, 2.0]);
        let y = forward(&Op::Exp, &[&x]).unwrap();
        let e = backward(&Op::Exp, &[&x], &y, &v(&[1.0]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exp") && e.contains("[1]") && e.contains("[2]"),
            "{e}"
        );
    }
}
