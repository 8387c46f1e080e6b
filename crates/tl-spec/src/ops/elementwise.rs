//! Pointwise ops: value, VJP and JVP of each, side by side.
//!
//! Kink conventions: sign(0) = 0 for `abs`; `relu'(0) = 0`; `clamp` passes gradient only strictly
//! inside (lo, hi); `max`/`min` split a tie's gradient in halves; `sqrt` has derivative 0 at x ≤ 0.
//!
//! NaN propagates, as in PyTorch: `relu`, `sqrt`, `clamp`, `max` and `min` of a NaN are NaN
//! (their scalar rules [`relu1`], [`sqrt1`], [`clamp1`], [`max1`], [`min1`] are shared with the
//! CPU tape and the CUDA simulation); the gradient there is 0 (no rule's condition holds).

use crate::{Error, Result, Scalar, Shape, Tensor};

// ---------------------------------------------------------------------------------------------
// shape rules and parameter checks

/// Shape rule of the binary pointwise ops: both operands must have the same shape.
pub fn binary_shape(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
    if a == b {
        Ok(a.clone())
    } else {
        Err(Error::shape(
            op,
            format!("operands must have the same shape, got {a} and {b} (use broadcastTo first)"),
        ))
    }
}

/// `scale(c)` needs a finite `c`.
pub fn scale_params(c: f64) -> Result<()> {
    finite("scale", "c", c)
}

/// `clamp(lo, hi)` needs finite bounds with lo ≤ hi.
pub fn clamp_params(lo: f64, hi: f64) -> Result<()> {
    finite("clamp", "lo", lo)?;
    finite("clamp", "hi", hi)?;
    if lo > hi {
        return Err(Error::param(
            "clamp",
            format!("lo = {lo} is greater than hi = {hi}"),
        ));
    }
    Ok(())
}

/// `safeLog(eps)` needs a finite eps > 0.
pub fn safe_log_params(eps: f64) -> Result<()> {
    finite("safeLog", "eps", eps)?;
    if eps <= 0.0 {
        return Err(Error::param(
            "safeLog",
            format!("eps must be > 0, got {eps}"),
        ));
    }
    Ok(())
}

fn finite(op: &'static str, name: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::param(op, format!("{name} must be finite, got {v}")))
    }
}

fn zip3<T: Scalar>(
    op: &'static str,
    a: &Tensor<T>,
    b: &Tensor<T>,
    c: &Tensor<T>,
    f: impl Fn(T, T, T) -> T,
) -> Result<Tensor<T>> {
    binary_shape(op, a.shape(), b.shape())?;
    binary_shape(op, a.shape(), c.shape())?;
    let values = (a.data().iter().zip(b.data()).zip(c.data())).map(|((&a, &b), &c)| f(a, b, c));
    let data = crate::alloc::try_collect(op, "output", a.numel(), values)?;
    Tensor::new(a.shape().clone(), data)
}

fn zip4<T: Scalar>(
    op: &'static str,
    [a, b, c, d]: [&Tensor<T>; 4],
    f: impl Fn(T, T, T, T) -> T,
) -> Result<Tensor<T>> {
    for t in [b, c, d] {
        binary_shape(op, a.shape(), t.shape())?;
    }
    let values = (0..a.numel()).map(|i| f(a.data()[i], b.data()[i], c.data()[i], d.data()[i]));
    let data = crate::alloc::try_collect(op, "output", a.numel(), values)?;
    Tensor::new(a.shape().clone(), data)
}

fn half<T: Scalar>() -> T {
    T::lit(0.5)
}

// ---------------------------------------------------------------------------------------------
// add, sub, mul, div

/// `a + b`.
pub fn add<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("add", b, |a, b| a + b)
}
/// VJP of `add`: `(g, g)`.
pub fn add_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    binary_shape("add", a.shape(), b.shape())?;
    binary_shape("add", a.shape(), g.shape())?;
    Ok((g.clone(), g.clone()))
}
/// JVP of `add`: `da + db`.
pub fn add_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("add", [a, b, da, db], |_, _, da, db| da + db)
}

/// `a − b`.
pub fn sub<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("sub", b, |a, b| a - b)
}
/// VJP of `sub`: `(g, −g)`.
pub fn sub_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    binary_shape("sub", a.shape(), b.shape())?;
    binary_shape("sub", a.shape(), g.shape())?;
    Ok((g.clone(), g.try_map("sub", |g| -g)?))
}
/// JVP of `sub`: `da − db`.
pub fn sub_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("sub", [a, b, da, db], |_, _, da, db| da - db)
}

/// `a · b` elementwise.
pub fn mul<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("mul", b, |a, b| a * b)
}
/// VJP of `mul`: `(g·b, g·a)`.
pub fn mul_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    Ok((
        zip3("mul", a, b, g, |_, b, g| g * b)?,
        zip3("mul", a, b, g, |a, _, g| g * a)?,
    ))
}
/// JVP of `mul`: `da·b + a·db`.
pub fn mul_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("mul", [a, b, da, db], |a, b, da, db| da * b + a * db)
}

/// `a / b` (IEEE: division by zero gives ±∞ or NaN).
pub fn div<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("div", b, |a, b| a / b)
}
/// VJP of `div`: `(g/b, −g·a/b²)`.
pub fn div_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    Ok((
        zip3("div", a, b, g, |_, b, g| g / b)?,
        zip3("div", a, b, g, |a, b, g| -g * a / (b * b))?,
    ))
}
/// JVP of `div`: `da/b − a·db/b²`.
pub fn div_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("div", [a, b, da, db], |a, b, da, db| {
        da / b - a * db / (b * b)
    })
}

// ---------------------------------------------------------------------------------------------
// max, min (ties split the gradient in halves)

/// `a` if `a ≥ b` or `a` is NaN, else `b`: the larger, `a` on a tie (so `max(−0, +0) = −0`),
/// NaN if either is NaN (PyTorch's `maximum`).
pub fn max1<T: Scalar>(a: T, b: T) -> T {
    if a >= b || a.is_nan() { a } else { b }
}

/// `a` if `a ≤ b` or `a` is NaN, else `b`: [`max1`]'s mirror (PyTorch's `minimum`).
pub fn min1<T: Scalar>(a: T, b: T) -> T {
    if a <= b || a.is_nan() { a } else { b }
}

/// Elementwise maximum ([`max1`]: NaN if either operand is NaN).
pub fn max<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("max", b, max1)
}
/// VJP of `max`: the larger side gets `g`; a tie gives each side `g/2`.
pub fn max_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let w = |a: T, b: T| {
        if a > b {
            T::one()
        } else if a == b {
            half()
        } else {
            T::zero()
        }
    };
    Ok((
        zip3("max", a, b, g, |a, b, g| w(a, b) * g)?,
        zip3("max", a, b, g, |a, b, g| w(b, a) * g)?,
    ))
}
/// JVP of `max`: the larger side's tangent; a tie averages the two; 0 where either is NaN.
pub fn max_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("max", [a, b, da, db], |a, b, da, db| {
        if a > b {
            da
        } else if a < b {
            db
        } else if a == b {
            half::<T>() * (da + db)
        } else {
            T::zero()
        }
    })
}

/// Elementwise minimum ([`min1`]: NaN if either operand is NaN).
pub fn min<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    a.zip_map("min", b, min1)
}
/// VJP of `min`: the smaller side gets `g`; a tie gives each side `g/2`.
pub fn min_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let w = |a: T, b: T| {
        if a < b {
            T::one()
        } else if a == b {
            half()
        } else {
            T::zero()
        }
    };
    Ok((
        zip3("min", a, b, g, |a, b, g| w(a, b) * g)?,
        zip3("min", a, b, g, |a, b, g| w(b, a) * g)?,
    ))
}
/// JVP of `min`: the smaller side's tangent; a tie averages the two; 0 where either is NaN.
pub fn min_jvp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    da: &Tensor<T>,
    db: &Tensor<T>,
) -> Result<Tensor<T>> {
    zip4("min", [a, b, da, db], |a, b, da, db| {
        if a < b {
            da
        } else if a > b {
            db
        } else if a == b {
            half::<T>() * (da + db)
        } else {
            T::zero()
        }
    })
}

// ---------------------------------------------------------------------------------------------
// unary maps. Each is defined by its value f and derivative f'; VJP = f'(x)·g, JVP = f'(x)·dx.

fn chain<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    t: &Tensor<T>,
    d: impl Fn(T) -> T,
) -> Result<Tensor<T>> {
    x.zip_map(op, t, |x, t| d(x) * t)
}

macro_rules! unary_op {
    ($(#[$doc:meta])* $name:ident, $vjp:ident, $jvp:ident, $op:literal,
     value = |$x:ident| $value:expr, deriv = |$dx:ident| $deriv:expr) => {
        $(#[$doc])*
        pub fn $name<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
            x.try_map($op, |$x| $value)
        }
        #[doc = concat!("VJP of `", $op, "`: `f'(x)·g`.")]
        pub fn $vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
            chain($op, x, g, |$dx| $deriv)
        }
        #[doc = concat!("JVP of `", $op, "`: `f'(x)·dx`.")]
        pub fn $jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
            chain($op, x, dx, |$dx| $deriv)
        }
    };
}

unary_op!(
    /// `|x|`; derivative sign(x) with sign(0) = 0.
    abs, abs_vjp, abs_jvp, "abs",
    value = |x| x.abs(),
    deriv = |x| sign(x)
);
unary_op!(
    /// `sqrt(max(x, 0))`; derivative `1/(2·sqrt(x))` for x > 0, else 0.
    sqrt, sqrt_vjp, sqrt_jvp, "sqrt",
    value = |x| sqrt1(x),
    deriv = |x| if x > T::zero() { T::one() / (T::lit(2.0) * x.sqrt()) } else { T::zero() }
);
unary_op!(
    /// `exp x`.
    exp, exp_vjp, exp_jvp, "exp",
    value = |x| x.exp(),
    deriv = |x| x.exp()
);
unary_op!(
    /// `1/x`; derivative `−1/x²`.
    inv, inv_vjp, inv_jvp, "inv",
    value = |x| T::one() / x,
    deriv = |x| -T::one() / (x * x)
);
unary_op!(
    /// `max(x, 0)` ([`relu1`]); derivative 1 where x > 0, else 0 (0 at x = 0 and at NaN).
    relu, relu_vjp, relu_jvp, "relu",
    value = |x| relu1(x),
    deriv = |x| if x > T::zero() { T::one() } else { T::zero() }
);
unary_op!(
    /// `1/(1+exp(−x))`, evaluated without overflow for either sign.
    sigmoid, sigmoid_vjp, sigmoid_jvp, "sigmoid",
    value = |x| sigmoid1(x),
    deriv = |x| { let s = sigmoid1(x); s * (T::one() - s) }
);
unary_op!(
    /// `tanh x`; derivative `1 − tanh²x`.
    tanh, tanh_vjp, tanh_jvp, "tanh",
    value = |x| x.tanh(),
    deriv = |x| { let t = x.tanh(); T::one() - t * t }
);
unary_op!(
    /// `max(x,0) + log(1 + exp(−|x|))` (the stable form); derivative sigmoid(x).
    softplus, softplus_vjp, softplus_jvp, "softplus",
    value = |x| softplus1(x),
    deriv = |x| sigmoid1(x)
);

fn sign<T: Scalar>(x: T) -> T {
    if x > T::zero() {
        T::one()
    } else if x < T::zero() {
        -T::one()
    } else {
        T::zero()
    }
}

/// `x` where x > 0 or x is NaN, else +0: `max(x, 0)` with NaN propagated (PyTorch's `relu`).
pub fn relu1<T: Scalar>(x: T) -> T {
    if x > T::zero() || x.is_nan() {
        x
    } else {
        T::zero()
    }
}

/// `sqrt(max(x, 0))`, NaN propagated: 0 for x ≤ 0, NaN for NaN.
pub fn sqrt1<T: Scalar>(x: T) -> T {
    if x.is_nan() {
        x
    } else {
        x.max(T::zero()).sqrt()
    }
}

/// `min(hi, max(lo, x))` with NaN propagated (PyTorch's `clamp`).
pub fn clamp1<T: Scalar>(x: T, lo: T, hi: T) -> T {
    min1(hi, max1(lo, x))
}

/// Scalar sigmoid, stable for large |x|.
pub fn sigmoid1<T: Scalar>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// Scalar softplus in the stable form `max(x,0) + log1p(exp(−|x|))`.
pub fn softplus1<T: Scalar>(x: T) -> T {
    x.max(T::zero()) + (-x.abs()).exp().ln_1p()
}

// ---------------------------------------------------------------------------------------------
// log (domain-checked), scale, clamp, safeLog

/// `ln x`; errors on any x ≤ 0 or NaN (never a silent NaN).
pub fn log<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    check_positive("log", x)?;
    x.try_map("log", |x| x.ln())
}
/// VJP of `log`: `g/x`.
pub fn log_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    check_positive("log", x)?;
    chain("log", x, g, |x| T::one() / x)
}
/// JVP of `log`: `dx/x`.
pub fn log_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    check_positive("log", x)?;
    chain("log", x, dx, |x| T::one() / x)
}

fn check_positive<T: Scalar>(op: &'static str, x: &Tensor<T>) -> Result<()> {
    match x.data().iter().position(|&v| v.is_nan() || v <= T::zero()) {
        None => Ok(()),
        Some(i) => Err(Error::domain(
            op,
            format!(
                "input of shape {} has non-positive value {} at flat index {i}",
                x.shape(),
                x.data()[i]
            ),
        )),
    }
}

/// `c · x`.
pub fn scale<T: Scalar>(x: &Tensor<T>, c: T) -> Result<Tensor<T>> {
    x.try_map("scale", |x| c * x)
}
/// VJP of `scale`: `c · g`.
pub fn scale_vjp<T: Scalar>(x: &Tensor<T>, c: T, g: &Tensor<T>) -> Result<Tensor<T>> {
    chain("scale", x, g, |_| c)
}
/// JVP of `scale`: `c · dx`.
pub fn scale_jvp<T: Scalar>(x: &Tensor<T>, c: T, dx: &Tensor<T>) -> Result<Tensor<T>> {
    chain("scale", x, dx, |_| c)
}

/// `min(hi, max(lo, x))` ([`clamp1`]: NaN stays NaN).
pub fn clamp<T: Scalar>(x: &Tensor<T>, lo: T, hi: T) -> Result<Tensor<T>> {
    x.try_map("clamp", |x| clamp1(x, lo, hi))
}
fn clamp_deriv<T: Scalar>(x: T, lo: T, hi: T) -> T {
    if x > lo && x < hi {
        T::one()
    } else {
        T::zero()
    }
}
/// VJP of `clamp`: `g` strictly inside (lo, hi), 0 at and beyond the bounds.
pub fn clamp_vjp<T: Scalar>(x: &Tensor<T>, lo: T, hi: T, g: &Tensor<T>) -> Result<Tensor<T>> {
    chain("clamp", x, g, |x| clamp_deriv(x, lo, hi))
}
/// JVP of `clamp`: `dx` strictly inside (lo, hi), else 0.
pub fn clamp_jvp<T: Scalar>(x: &Tensor<T>, lo: T, hi: T, dx: &Tensor<T>) -> Result<Tensor<T>> {
    chain("clamp", x, dx, |x| clamp_deriv(x, lo, hi))
}

/// `log(softplus(x) + eps)`: finite for every finite x. (Not `log(max(x, eps))`.)
pub fn safe_log<T: Scalar>(x: &Tensor<T>, eps: T) -> Result<Tensor<T>> {
    x.try_map("safeLog", |x| (softplus1(x) + eps).ln())
}
fn safe_log_deriv<T: Scalar>(x: T, eps: T) -> T {
    sigmoid1(x) / (softplus1(x) + eps)
}
/// VJP of `safeLog`: `sigmoid(x)/(softplus(x)+eps) · g`.
pub fn safe_log_vjp<T: Scalar>(x: &Tensor<T>, eps: T, g: &Tensor<T>) -> Result<Tensor<T>> {
    chain("safeLog", x, g, |x| safe_log_deriv(x, eps))
}
/// JVP of `safeLog`: `sigmoid(x)/(softplus(x)+eps) · dx`.
pub fn safe_log_jvp<T: Scalar>(x: &Tensor<T>, eps: T, dx: &Tensor<T>) -> Result<Tensor<T>> {
    chain("safeLog", x, dx, |x| safe_log_deriv(x, eps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor<f64> {
        Tensor::vector(v.to_vec())
    }

    #[test]
    fn kink_conventions() {
        let x = t(&[-1.0, 0.0, 2.0]);
        let g = t(&[1.0, 1.0, 1.0]);
        assert_eq!(abs_vjp(&x, &g).unwrap().data(), &[-1.0, 0.0, 1.0]);
        assert_eq!(relu_vjp(&x, &g).unwrap().data(), &[0.0, 0.0, 1.0]);
        assert_eq!(sqrt_vjp(&x, &g).unwrap().data()[..2], [0.0, 0.0]);
        assert_eq!(sqrt(&x).unwrap().data(), &[0.0, 0.0, 2f64.sqrt()]);
        let c = t(&[-1.0, -0.5, 0.0, 1.0, 2.0]);
        let gc = t(&[1.0; 5]);
        assert_eq!(
            clamp_vjp(&c, -1.0, 1.0, &gc).unwrap().data(),
            &[0.0, 1.0, 1.0, 0.0, 0.0]
        );
        assert_eq!(
            clamp(&c, -1.0, 1.0).unwrap().data(),
            &[-1.0, -0.5, 0.0, 1.0, 1.0]
        );
    }

    #[test]
    fn max_min_ties_split_in_halves() {
        let a = t(&[1.0, 2.0, 3.0]);
        let b = t(&[1.0, 5.0, 0.0]);
        let g = t(&[4.0, 4.0, 4.0]);
        let (da, db) = max_vjp(&a, &b, &g).unwrap();
        assert_eq!(da.data(), &[2.0, 0.0, 4.0]);
        assert_eq!(db.data(), &[2.0, 4.0, 0.0]);
        let (da, db) = min_vjp(&a, &b, &g).unwrap();
        assert_eq!(da.data(), &[2.0, 4.0, 0.0]);
        assert_eq!(db.data(), &[2.0, 0.0, 4.0]);
    }

    #[test]
    fn nan_propagates_with_zero_gradient() {
        let nan = f64::NAN;
        let x = t(&[nan]);
        let one = t(&[1.0]);
        for y in [relu(&x), sqrt(&x), clamp(&x, -1.0, 1.0)] {
            assert!(y.unwrap().data()[0].is_nan());
        }
        for d in [
            relu_vjp(&x, &one),
            sqrt_vjp(&x, &one),
            clamp_vjp(&x, -1.0, 1.0, &one),
        ] {
            assert_eq!(d.unwrap().data(), &[0.0]);
        }
        for (a, b) in [(nan, 1.0), (1.0, nan), (nan, nan)] {
            let (a, b) = (t(&[a]), t(&[b]));
            assert!(max(&a, &b).unwrap().data()[0].is_nan());
            assert!(min(&a, &b).unwrap().data()[0].is_nan());
            let (da, db) = max_vjp(&a, &b, &one).unwrap();
            assert_eq!((da.data(), db.data()), (&[0.0][..], &[0.0][..]));
            assert_eq!(max_jvp(&a, &b, &one, &one).unwrap().data(), &[0.0]);
            assert_eq!(min_jvp(&a, &b, &one, &one).unwrap().data(), &[0.0]);
        }
        // Ties and signed zeros as before: the first operand wins a tie.
        assert!(max1(-0.0f64, 0.0).is_sign_negative());
        assert!(relu1(-0.0f64).is_sign_positive());
    }

    #[test]
    fn log_of_non_positive_is_an_error() {
        let e = log(&t(&[1.0, 0.0])).unwrap_err().to_string();
        assert!(e.contains("log") && e.contains("index 1"), "{e}");
        assert!(log(&t(&[f64::NAN])).is_err());
    }

    #[test]
    fn stable_forms_do_not_overflow() {
        let x = t(&[-1000.0, 1000.0]);
        assert_eq!(sigmoid(&x).unwrap().data(), &[0.0, 1.0]);
        assert_eq!(softplus(&x).unwrap().data(), &[0.0, 1000.0]);
        assert!(
            safe_log(&x, 1e-6)
                .unwrap()
                .data()
                .iter()
                .all(|v| v.is_finite())
        );
        // safeLog is log(softplus(x) + eps), not log(max(x, eps)).
        let v = safe_log(&t(&[0.0]), 1e-6).unwrap().data()[0];
        assert!((v - (2f64.ln() + 1e-6).ln()).abs() < 1e-15);
    }

    #[test]
    fn binary_shape_mismatch_names_op_and_shapes() {
        let e = add(&t(&[1.0]), &t(&[1.0, 2.0])).unwrap_err().to_string();
        assert!(
            e.contains("add") && e.contains("[1]") && e.contains("[2]"),
            "{e}"
        );
    }

    #[test]
    fn bad_params_are_errors() {
        assert!(clamp_params(1.0, 0.0).is_err());
        assert!(safe_log_params(0.0).is_err());
        assert!(scale_params(f64::INFINITY).is_err());
    }
}
