//! The f32 kernels' `exp`, `log`, `tanh`, sigmoid and softplus: [`tl_spec::approx`]'s
//! straight-line versions (selects and FMAs, no calls), so a loop over a slice compiles to SIMD;
//! f64 keeps libm, the precise path.
//!
//! - `exp` where the loop is a map (softmax and the attention's probabilities, whose sum is a
//!   separate loop; the softmax, log-softmax, cross-entropy and smooth max-pool backward
//!   passes; `exp`). A loop that sums as it goes stays scalar whatever `exp` it calls, and there
//!   libm's `expf` (table-driven) is the faster one, so those keep it. `tl verify --backend
//!   cuda-sim` keeps these ops within its 8 ulp of the simulation device (libm there).
//! - `log` in the `log` op, likewise within 8 ulp of the simulation device's libm `logf` (its
//!   backward `g/x` reads no log); and as `safeLog`'s outer log, where the simulation device
//!   and the kernels call it too (below).
//! - softplus in `softplus` and in `safeLog` and its backward: the simulation device and the
//!   kernels compute the same function (`tl_softplus_approx`), so these agree bit for bit too.
//! - `tanh` in `gelu` and the `tanh` op; the sigmoid in the `sigmoid` op, `silu` and the
//!   backward passes of `softplus` and `safeLog`. Their derivatives cancel (`1 + tanh u` near
//!   u = −2.5, `1 − tanh²`, `1 − σ`), so the CPU tape can only leave libm where the simulation
//!   device and the CUDA kernels compute the very same function: they do (`tl_spec::approx`
//!   and its twins in `kernels/approx.cuh`), and the three agree bit for bit.

use tl_spec::Scalar;
use tl_spec::approx::{erf_f32, exp_f32, log_f32, sigmoid_f32, softplus_f32, tanh_f32};

/// Whether `T` is f32 (the other [`Scalar`] is f64).
#[inline(always)]
fn is_f32<T: Scalar>() -> bool {
    size_of::<T>() == 4
}

/// `e^v`: [`exp_f32`] for f32, libm for f64.
#[inline(always)]
pub(crate) fn exp<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(exp_f32(v.as_f64() as f32)))
    } else {
        v.exp()
    }
}

/// `tanh v`: [`tanh_f32`] for f32, libm for f64.
#[inline(always)]
pub(crate) fn tanh<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(tanh_f32(v.as_f64() as f32)))
    } else {
        v.tanh()
    }
}

/// `erf v`: [`erf_f32`] for f32 (the simulation device's and the kernels' erf, so `geluErf`
/// agrees bit for bit), libm's f64 `erf` ([`tl_spec::special::erf`]) for f64.
#[inline(always)]
pub(crate) fn erf<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(erf_f32(v.as_f64() as f32)))
    } else {
        tl_spec::special::erf(v)
    }
}

/// `ln v`: [`log_f32`] for f32, libm for f64.
#[inline(always)]
pub(crate) fn log<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(log_f32(v.as_f64() as f32)))
    } else {
        v.ln()
    }
}

/// The logistic sigmoid: [`sigmoid_f32`] for f32; for f64 the same formula with libm's `exp`
/// (`e = exp(−|v|)`, then `1/(1 + e)` for v ≥ 0, `e/(1 + e)` below).
#[inline(always)]
pub(crate) fn sigmoid<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(sigmoid_f32(v.as_f64() as f32)))
    } else {
        let e = (-v.abs()).exp();
        let num = if v >= T::zero() { T::one() } else { e };
        num / (T::one() + e)
    }
}

/// `softplus v = max(v, 0) + ln(1 + e^{−|v|})`: [`softplus_f32`] for f32; for f64 the same
/// stable form with libm's `exp` and `ln_1p`.
#[inline(always)]
pub(crate) fn softplus<T: Scalar>(v: T) -> T {
    if is_f32::<T>() {
        T::lit(f64::from(softplus_f32(v.as_f64() as f32)))
    } else {
        v.max(T::zero()) + (-v.abs()).exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generic_faces_take_the_f32_path_for_f32_and_libm_for_f64() {
        let x = 0.731_f64;
        assert_eq!(exp(x), x.exp());
        assert_eq!(tanh(x), x.tanh());
        assert_eq!(exp(x as f32), exp_f32(x as f32));
        assert_eq!(tanh(x as f32), tanh_f32(x as f32));
        assert_eq!(tanh(-2.5f32), tanh_f32(-2.5));
        assert_eq!(sigmoid(-1.5f32), sigmoid_f32(-1.5));
        assert_eq!(log(x), x.ln());
        assert_eq!(log(x as f32), log_f32(x as f32));
        assert_eq!(sigmoid(x), 1.0 / (1.0 + (-x).exp()));
        assert_eq!(sigmoid(-x), (-x).exp() / (1.0 + (-x).exp()));
        assert_eq!(softplus(-x), (-x).exp().ln_1p());
        assert_eq!(softplus(x as f32), softplus_f32(x as f32));
    }
}
