//! `exp`, `tanh`, the logistic sigmoid, `ln` and softplus for f32 in straight-line arithmetic
//! (and `erf`, [`erf_f32`], in scalar branches)
//! (selects, bit moves and fused multiply-adds, no calls where the CPU has FMA), so that a
//! loop over a slice compiles to SIMD. They are shared bit for bit: the CPU tape's f32 kernels
//! call them, the CUDA simulation device calls them where its kernel does, and
//! `kernels/approx.cuh` has their twins (`tl_exp_approx`, `tl_tanh_approx`,
//! `tl_sigmoid_approx`, `tl_log_approx`, `tl_softplus_approx`: the same operations in the same
//! order, built with `--fmad=false`, each [`f32::mul_add`] here a `__fmaf_rn` there), so the
//! sides agree exactly, which libm's `expf`/`tanhf`/`log1pf` and CUDA's do not.
//!
//! A fused multiply-add rounds once, exactly as IEEE 754 specifies it, on every side: an FMA
//! instruction where the CPU has one (the AVX2 and AVX-512 loops), libm's `fmaf` where it does
//! not (the baseline build, the simulation device), `__fmaf_rn` on the GPU. Only the time
//! differs. Written out, not contracted: Rust never fuses `a·b + c` by itself, and the kernels
//! are built with `--fmad=false`.
//!
//! Accuracy, checked below on dense sweeps against f64: `exp_f32` within 2 ulp (subnormal
//! results within 1e-45 absolute), `tanh_f32` and `log_f32` within 2 ulp, `sigmoid_f32` and
//! `softplus_f32` within 3 ulp; NaN stays NaN, ±∞ give what libm gives.

/// `e^x` in f32: x = n·ln 2 + r with |r| ≤ ln 2 / 2 (Cody–Waite, two-part ln 2), a degree-6
/// polynomial for e^r (Cephes' `expf` coefficients) in fused multiply-adds, then two scalings
/// by powers of two so that n from −150 to 128 needs no special case (results below 2⁻¹²⁶
/// round as subnormals, once).
///
/// No select at the end: x is clamped to [−104, 89], where the arithmetic itself gives what
/// the true e^x rounds to outside the finite range. Every x above ln(f32::MAX) (88.72284 and
/// up) has n = 128 and e^r ≥ 1, so e^r·2⁶⁴·2⁶⁴ overflows to +∞; every x below −103.97208 has
/// n = −150 and e^r < 1, so e^r·2⁻⁷⁵·2⁻⁷⁵ is under half the smallest subnormal and rounds to
/// 0 (both checked over every f32 there by the tests). A NaN passes the clamp and makes e^r
/// NaN, whatever n its bits give.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const HI: f32 = 89.0;
    const LO: f32 = -104.0;
    let xc = x.clamp(LO, HI);
    // Round to nearest by the 1.5·2²³ shift (|x·log₂e| < 2²²): `f32::round` is a libm call
    // on baseline x86-64 (no SSE4.1), which would stop the loop from vectorizing.
    const SHIFT: f32 = 12_582_912.0;
    let shifted = xc.mul_add(std::f32::consts::LOG2_E, SHIFT);
    let n = shifted - SHIFT;
    let r = (-n).mul_add(LN2_HI, xc);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = 1.987_569_1e-4_f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let er = (p * r).mul_add(r, r) + 1.0;
    // n as an integer, read from the shifted sum's low mantissa bits (the same n as `n as
    // i32`, whose saturating conversion does not vectorize), split by an arithmetic shift
    // into n1 + n2 = n with both in [−75, 64].
    let n = (shifted.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let (n1, n2) = (n >> 1, n.wrapping_sub(n >> 1));
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    er * pow2(n1) * pow2(n2)
}

/// `tanh x` in f32 (Cephes' `tanhf`): for |x| < 0.625 the odd polynomial
/// `|x| + |x|·z·P(z)`, z = x², else `1 − 2/(e^{2|x|} + 1)` with [`exp_f32`]; the sign of x put
/// back last (so `tanh(−0) = −0`). Both branches are computed and one selected, so a loop
/// over a slice vectorizes. Saturates to ±1 for large |x| (no overflow); NaN stays NaN.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let mut p = -5.704_988_7e-3_f32;
    p = p.mul_add(z, 2.063_909e-2);
    p = p.mul_add(z, -5.373_971_6e-2);
    p = p.mul_add(z, 1.333_144_2e-1);
    p = p.mul_add(z, -3.333_328e-1);
    let small = (p * z).mul_add(a, a);
    let e = exp_f32(a + a);
    let big = 1.0 - 2.0 / (e + 1.0);
    let r = if a < 0.625 { small } else { big };
    r.copysign(x)
}

/// `ln x` in f32 (Cephes' `logf`): x = m·2^e with m in [√½, √2), then
/// `ln(1 + (m − 1)) + e·ln 2` by Cephes' degree-8 polynomial (a private helper shared with
/// [`softplus_f32`]); a subnormal x is scaled by 2²³ first (exact). Straight-line (selects,
/// bit moves and fused multiply-adds), so a loop over a slice vectorizes. `ln 0 = −∞`, `ln(+∞) = +∞`, NaN for x < 0 and for NaN.
/// Shared bit for bit with `tl_log_approx` in the kernels, used on all three sides for
/// `safeLog`'s outer log; the `log` op itself uses it on the CPU tape only (the simulation
/// device and the CUDA kernel keep libm's and CUDA's `logf` there, a few ulp apart: the
/// derivative `g/x` does not read the log, so nothing cancels).
#[inline(always)]
pub fn log_f32(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let subnormal = x < f32::MIN_POSITIVE;
    let xs = if subnormal { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits();
    // The exponent of xs for m in [0.5, 1): garbage for x ≤ 0, +∞ and NaN, selected away below.
    let e = ((bits >> 23) & 0xff) as i32 - 126 - if subnormal { 23 } else { 0 };
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let low = m < SQRT_HALF;
    let e = (if low { e - 1 } else { e }) as f32;
    let f = if low { m + m - 1.0 } else { m - 1.0 };
    let r = log_reduced(f, e);
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        x
    } else if x > 0.0 {
        r
    } else {
        f32::NAN
    }
}

/// `ln(1 + f) + e·ln 2` for f in [√½ − 1, √2 − 1] and a whole e (Cephes' `logf` kernel):
/// `f − f²/2 + f³·P(f)` with a degree-8 P, in fused multiply-adds, and the two-part ln 2
/// times e. What [`log_f32`] and [`softplus_f32`] reduce their argument to.
#[inline(always)]
fn log_reduced(f: f32, e: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let z = f * f;
    let mut p = 7.037_683_6e-2_f32;
    p = p.mul_add(f, -1.151_461e-1);
    p = p.mul_add(f, 1.167_699_9e-1);
    p = p.mul_add(f, -1.242_014_1e-1);
    p = p.mul_add(f, 1.424_932_3e-1);
    p = p.mul_add(f, -1.666_805_8e-1);
    p = p.mul_add(f, 2.000_071_4e-1);
    p = p.mul_add(f, -2.499_999_4e-1);
    p = p.mul_add(f, 3.333_333e-1);
    let y = (p * f) * z;
    let y = LN2_LO.mul_add(e, y);
    let y = (-0.5f32).mul_add(z, y);
    LN2_HI.mul_add(e, f + y)
}

/// `softplus x = max(x, 0) + ln(1 + u)`, u = e^{−|x|} ([`exp_f32`], in (0, 1]): the stable
/// form of SEMANTICS.md. `ln(1 + u)` without rounding 1 + u where that would lose u: for
/// u < √2 − 1 it is the polynomial of [`log_f32`] at f = u itself (exact, so a tiny u keeps
/// every bit: softplus(−30) is e^{−30}, not 0), above it at f = (1 + u)/2 − 1 and e = 1
/// (1 + u in [√2, 2] rounded once; with u's own error that is the 3 ulp, near x = −0.56).
/// Both computed and one selected, so a loop over a slice vectorizes. +∞ at +∞, 0 at −∞, NaN
/// stays NaN. Shared bit for bit with `tl_softplus_approx` in the kernels.
#[inline(always)]
pub fn softplus_f32(x: f32) -> f32 {
    const SQRT2_M1: f32 = 0.414_213_57;
    let u = exp_f32(-x.abs());
    let big = u >= SQRT2_M1;
    let f = if big { (1.0 + u) * 0.5 - 1.0 } else { u };
    let e = if big { 1.0 } else { 0.0 };
    x.max(0.0) + log_reduced(f, e)
}

/// The logistic sigmoid `1/(1 + e^{−x})` without overflow for either sign: with
/// `e = exp_f32(−|x|)` (never above 1), `1/(1 + e)` for x ≥ 0 and `e/(1 + e)` below, both
/// written as one division of a selected numerator (the same bits as either branch alone), so
/// a loop over a slice vectorizes. 0.5 at ±0, 1 at +∞, 0 at −∞; NaN stays NaN.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let e = exp_f32(-x.abs());
    let num = if x >= 0.0 { 1.0 } else { e };
    num / (1.0 + e)
}

/// The error function in f32: FreeBSD's `erff` (Sun's rational approximations on
/// [0, 0.84375), [0.84375, 1.25), [1.25, 1/0.35), [1/0.35, 6), then ±1), with its two `expf`
/// calls [`exp_f32`], the sign of x put back last. Straight-line: every interval's value is
/// computed and the one for |x| selected, each with the operations, in the order, of the
/// branch it replaces (`tl_erf_approx` in `kernels/approx.cuh` keeps the branches: the same
/// bits), so a loop over a slice vectorizes (the CPU tape's f32 `geluErf`).
/// Within 2 ulp of the true value (checked below); NaN stays NaN, `erf(±∞) = ±1`.
// The constants are FreeBSD's literals as written (and as `approx.cuh` writes them): each rounds
// to the same f32 as its shortest spelling, and keeping them verbatim lets a reader compare.
#[allow(clippy::excessive_precision)]
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    const ERX: f32 = 8.450_629_115_1e-1;
    let a = x.abs();
    // [0, 0.84375): x + x·R(x²)/S(x²), odd by itself.
    let z = x * x;
    let (r, s) = erf_small_rs(z);
    let small = x + x * (r / s);
    // [0.84375, 1.25): erx + P(|x| − 1)/Q(|x| − 1).
    let s = a - 1.0;
    let (p, q) = erf_middle_pq(s);
    let middle = ERX + p / q;
    // [1.25, 6): 1 − exp(−z² − 0.5625)·exp((z − a)(z + a) + R/S)/a, z = a with its low 13
    // bits cleared, (R, S) of [1.25, 1/0.35) or of [1/0.35, 6).
    let s = 1.0 / (a * a);
    let (r1, s1) = erf_tail_near_rs(s);
    let (r2, s2) = erf_tail_far_rs(s);
    let near = a < f32::from_bits(0x4036_db6d);
    let (r, big_s) = (if near { r1 } else { r2 }, if near { s1 } else { s2 });
    let z = f32::from_bits(a.to_bits() & 0xffff_e000);
    let tail = 1.0 - exp_f32(-z * z - 0.5625) * exp_f32((z - a) * (z + a) + r / big_s) / a;
    let y = if a < 1.25 {
        middle
    } else if a < 6.0 {
        tail
    } else {
        1.0
    };
    if a.is_nan() {
        x
    } else if a < 0.843_75 {
        small
    } else {
        y.copysign(x)
    }
}

/// [`erf_f32`] on [0, 0.84375): R(z) and S(z) of z = x².
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn erf_small_rs(z: f32) -> (f32, f32) {
    let r = 1.283_791_661_3e-1
        + z * (-3.250_420_987_6e-1
            + z * (-2.848_174_981_8e-2 + z * (-5.770_270_247e-3 + z * -2.376_301_745_2e-5)));
    let s = 1.0
        + z * (3.979_172_110_6e-1
            + z * (6.502_225_25e-2
                + z * (5.081_306_211_7e-3 + z * (1.324_947_370_4e-4 + z * -3.960_228_241_3e-6))));
    (r, s)
}

/// [`erf_f32`] on [0.84375, 1.25): P(s) and Q(s) of s = |x| − 1.
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn erf_middle_pq(s: f32) -> (f32, f32) {
    let p = -2.362_118_568_3e-3
        + s * (4.148_561_060_4e-1
            + s * (-3.722_078_800_2e-1
                + s * (3.183_466_196_1e-1
                    + s * (-1.108_946_949_2e-1
                        + s * (3.547_830_507_2e-2 + s * -2.166_375_517_8e-3)))));
    let q = 1.0
        + s * (1.064_208_820_5e-1
            + s * (5.403_979_420_7e-1
                + s * (7.182_865_589_9e-2
                    + s * (1.261_712_163_7e-1
                        + s * (1.363_708_358_3e-2 + s * 1.198_450_010_3e-2)))));
    (p, q)
}

/// [`erf_f32`] on [1.25, 1/0.35): R(s) and S(s) of s = 1/x².
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn erf_tail_near_rs(s: f32) -> (f32, f32) {
    let r = -9.864_944_033_3e-3
        + s * (-6.938_585_639e-1
            + s * (-1.055_862_617_5e1
                + s * (-6.237_533_187_9e1
                    + s * (-1.623_966_674_8e2
                        + s * (-1.846_050_872_8e2
                            + s * (-8.128_743_743_9e1 + s * -9.814_329_147_3))))));
    let big_s = 1.0
        + s * (1.965_127_182e1
            + s * (1.376_577_606_2e2
                + s * (4.345_658_874_5e2
                    + s * (6.453_872_680_7e2
                        + s * (4.290_081_481_9e2
                            + s * (1.086_350_021_4e2
                                + s * (6.570_249_557_5 + s * -6.042_441_353_2e-2)))))));
    (r, big_s)
}

/// [`erf_f32`] on [1/0.35, 6): R(s) and S(s) of s = 1/x².
#[allow(clippy::excessive_precision)]
#[inline(always)]
fn erf_tail_far_rs(s: f32) -> (f32, f32) {
    let r = -9.864_943_102e-3
        + s * (-7.992_832_660_7e-1
            + s * (-1.775_795_555_1e1
                + s * (-1.606_363_830_6e2
                    + s * (-6.375_664_672_9e2
                        + s * (-1.025_095_092_8e3 + s * -4.835_191_955_6e2)))));
    let big_s = 1.0
        + s * (3.033_806_037_9e1
            + s * (3.257_925_109_9e2
                + s * (1.536_729_614_3e3
                    + s * (3.199_858_154_3e3
                        + s * (2.553_050_293e3
                            + s * (4.745_285_339_4e2 + s * -2.244_095_230_1e1))))));
    (r, big_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FreeBSD's `erff` with its branches, as `kernels/approx.cuh` writes it: the reference
    /// the straight-line [`erf_f32`] must equal bit for bit.
    #[allow(clippy::excessive_precision)]
    fn erf_f32_branches(x: f32) -> f32 {
        const ERX: f32 = 8.450_629_115_1e-1;
        let a = x.abs();
        if a.is_nan() {
            return x;
        }
        let y = if a < 0.843_75 {
            let z = x * x;
            let (r, s) = erf_small_rs(z);
            return x + x * (r / s);
        } else if a < 1.25 {
            let s = a - 1.0;
            let (p, q) = erf_middle_pq(s);
            ERX + p / q
        } else if a < 6.0 {
            let s = 1.0 / (a * a);
            let (r, big_s) = if a < f32::from_bits(0x4036_db6d) {
                erf_tail_near_rs(s)
            } else {
                erf_tail_far_rs(s)
            };
            let z = f32::from_bits(a.to_bits() & 0xffff_e000);
            1.0 - exp_f32(-z * z - 0.5625) * exp_f32((z - a) * (z + a) + r / big_s) / a
        } else {
            1.0
        };
        y.copysign(x)
    }

    /// Every f32 in [lo, hi] with a stride of `step` bit patterns, plus the ends.
    fn sweep(lo: f32, hi: f32, step: u32) -> Vec<f32> {
        let mut out = Vec::new();
        let mut push_range = |a: f32, b: f32| {
            // Bit patterns are monotonic in magnitude for one sign.
            let (a, b) = (a.to_bits(), b.to_bits());
            let (a, b) = (a.min(b), a.max(b));
            let mut k = a;
            while k <= b {
                out.push(f32::from_bits(k));
                k = match k.checked_add(step) {
                    Some(k) => k,
                    None => break,
                };
            }
        };
        if lo < 0.0 {
            push_range(-0.0, lo);
        }
        if hi > 0.0 {
            push_range(0.0, hi);
        }
        out
    }

    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let spacing = f64::from(f32::from_bits(w.abs().to_bits() + 1)) - f64::from(w.abs());
        (f64::from(got) - want).abs() / spacing
    }

    /// The worst ulp error of `f` against the f64 `reference` over `xs`, and where; a result
    /// the reference puts below the smallest normal f32 is held to `tiny` absolute instead
    /// (asserted here, naming `name`).
    fn worst_ulps(
        name: &str,
        xs: impl IntoIterator<Item = f32>,
        f: impl Fn(f32) -> f32,
        reference: impl Fn(f64) -> f64,
        tiny: f64,
    ) -> (f64, f32) {
        let mut worst = (0.0, 0.0f32);
        for x in xs {
            let (got, want) = (f(x), reference(f64::from(x)));
            if want.abs() < f64::from(f32::MIN_POSITIVE) {
                let err = (f64::from(got) - want).abs();
                assert!(err <= tiny, "{name}({x:e}) = {got:e}, {want:e}");
                continue;
            }
            let u = ulps(got, want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        worst
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_f64_exp_everywhere() {
        let xs = sweep(-103.9, 88.72, 97);
        let worst = worst_ulps("exp", xs, exp_f32, f64::exp, 1.5e-45);
        assert!(worst.0 <= 2.0, "worst {} ulp at {}", worst.0, worst.1);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72).is_finite());
    }

    /// Every f32 from `a` to `b` (one sign), no stride.
    fn every(a: f32, b: f32) -> impl Iterator<Item = f32> {
        let (a, b) = (a.to_bits(), b.to_bits());
        (a.min(b)..=a.max(b)).map(f32::from_bits)
    }

    #[test]
    fn exp_overflows_and_underflows_exactly_where_the_true_exp_leaves_the_f32_range() {
        // No select does this: the clamp to [−104, 89] and the arithmetic. Above ln(f32::MAX)
        // the correctly rounded e^x is +∞, below −150·ln 2 it is 0; every f32 near both ends.
        for x in every(88.0, 90.0) {
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            if (want as f32).is_infinite() {
                assert_eq!(got, f32::INFINITY, "exp({x:e})");
            } else {
                assert!(
                    got.is_finite() && ulps(got, want) <= 2.0,
                    "exp({x:e}) = {got:e}"
                );
            }
        }
        for x in every(-103.5, -105.0) {
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            assert_eq!(
                got == 0.0,
                want as f32 == 0.0,
                "exp({x:e}) = {got:e}, {want:e}"
            );
            assert!(
                (f64::from(got) - want).abs() <= 1.5e-45,
                "exp({x:e}) = {got:e}"
            );
        }
        assert_eq!(exp_f32(1e30), f32::INFINITY);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert_eq!(exp_f32(f32::MAX), f32::INFINITY);
        assert_eq!(exp_f32(f32::MIN), 0.0);
    }

    #[test]
    fn tanh_is_within_two_ulp_of_the_f64_tanh_everywhere() {
        let mut worst = (0.0, 0.0f32);
        // Beyond 9.1, tanh rounds to ±1 in f32.
        for x in sweep(-9.5, 9.5, 31) {
            let (got, want) = (tanh_f32(x), f64::from(x).tanh());
            let u = ulps(got.abs(), want.abs());
            assert_eq!(
                got.is_sign_negative(),
                x.is_sign_negative(),
                "tanh({x}) = {got}"
            );
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(worst.0 <= 2.0, "worst {} ulp at {}", worst.0, worst.1);
        assert_eq!(tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh_f32(20.0), 1.0);
        assert_eq!(tanh_f32(-1e30), -1.0);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
        // Both branches meet at the switch without a step.
        let below = f32::from_bits(0.625f32.to_bits() - 1);
        assert!((tanh_f32(0.625) - tanh_f32(below)).abs() <= 2.0 * f32::EPSILON);
    }

    #[test]
    fn sigmoid_is_within_three_ulp_of_the_f64_sigmoid_everywhere() {
        // Below −103.9 the f32 result is 0 (e^x under the smallest subnormal); above 17 it is 1.
        let xs = sweep(-103.0, 20.0, 61);
        let reference = |x: f64| 1.0 / (1.0 + (-x).exp());
        let worst = worst_ulps("sigmoid", xs, sigmoid_f32, reference, 3e-45);
        assert!(worst.0 <= 3.0, "worst {} ulp at {}", worst.0, worst.1);
        assert_eq!(sigmoid_f32(0.0), 0.5);
        assert_eq!(sigmoid_f32(-0.0), 0.5);
        assert_eq!(sigmoid_f32(f32::INFINITY), 1.0);
        assert_eq!(sigmoid_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid_f32(30.0), 1.0);
        assert_eq!(sigmoid_f32(-200.0), 0.0);
        assert!(sigmoid_f32(f32::NAN).is_nan());
        // Symmetric to the last bit where 1 − σ is exact: σ(−x) = e/(1 + e), σ(x) = 1/(1 + e).
        for x in [0.25f32, 1.0, 3.5, 9.0] {
            let (e, p, m) = (exp_f32(-x), sigmoid_f32(x), sigmoid_f32(-x));
            assert_eq!((p, m), (1.0 / (1.0 + e), e / (1.0 + e)), "x = {x}");
        }
    }

    #[test]
    fn softplus_is_within_three_ulp_of_the_f64_softplus_everywhere() {
        let reference = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
        // Below −103.9 the f32 result is 0 (e^x under the smallest subnormal); from 2²⁴ up it
        // is x.
        let xs = sweep(-103.0, 3.0e7, 53);
        let worst = worst_ulps("softplus", xs, softplus_f32, reference, 1.5e-45);
        assert!(worst.0 <= 3.0, "worst {} ulp at {:e}", worst.0, worst.1);
        // Where u = e^{−|x|} crosses √2 − 1 (|x| = 0.881): both branches, every f32 near it.
        for x in every(0.87, 0.89).chain(every(-0.87, -0.89)) {
            let u = ulps(softplus_f32(x), reference(f64::from(x)));
            assert!(u <= 3.0, "softplus({x:e}): {u} ulp");
        }
        assert_eq!(softplus_f32(0.0), std::f32::consts::LN_2);
        assert_eq!(softplus_f32(-0.0), std::f32::consts::LN_2);
        assert_eq!(softplus_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(softplus_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(softplus_f32(1e30), 1e30);
        assert_eq!(softplus_f32(-200.0), 0.0);
        // A tiny u keeps its bits: ln(1 + u) is not rounded through 1 + u.
        assert_eq!(softplus_f32(-30.0), exp_f32(-30.0));
        assert!(softplus_f32(f32::NAN).is_nan());
    }

    #[test]
    fn log_is_within_two_ulp_of_the_f64_log_everywhere() {
        // Every positive finite f32 with a stride of 97 bit patterns: subnormals, [√½, √2)
        // around 1 (where the result is tiny), up to f32::MAX.
        let mut k = 1u32;
        let mut xs = Vec::new();
        while k < f32::INFINITY.to_bits() {
            xs.push(f32::from_bits(k));
            k += 97;
        }
        xs.extend([
            f32::MIN_POSITIVE,
            f32::MAX,
            1.0,
            2.0,
            0.5,
            1.0 + f32::EPSILON,
            1.0 - 1e-7,
        ]);
        // ln 1 = 0 is the only result under the smallest normal: held to 0 exactly.
        let worst = worst_ulps("log", xs, log_f32, f64::ln, 0.0);
        assert!(worst.0 <= 2.0, "worst {} ulp at {:e}", worst.0, worst.1);
        assert_eq!(log_f32(1.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(log_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(f32::INFINITY), f32::INFINITY);
        assert!(log_f32(-1.0).is_nan());
        assert!(log_f32(-f32::MIN_POSITIVE / 4.0).is_nan());
        assert!(log_f32(f32::NEG_INFINITY).is_nan());
        assert!(log_f32(f32::NAN).is_nan());
        assert_eq!(log_f32(std::f32::consts::E), 1.0);
    }

    /// The straight-line `erf_f32` is the branches' function bit for bit: at every interval's
    /// edge and its neighbours, on a dense sweep of [−7, 7], and on every 4099th bit pattern
    /// (NaNs, infinities and subnormals of both signs among them).
    #[test]
    fn erf_f32_straight_line_equals_the_branches() {
        let edges = [
            0.0f32,
            1e-30,
            0.843_75,
            1.25,
            f32::from_bits(0x4036_db6d),
            6.0,
        ];
        let near = edges
            .iter()
            .flat_map(|e| [e.to_bits().saturating_sub(1), e.to_bits(), e.to_bits() + 1])
            .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]);
        let sweep = (0..=280_000).map(|i| -7.0 + i as f32 * 5e-5);
        let patterns = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099));
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, -0.0];
        for x in near.chain(sweep).chain(patterns).chain(specials) {
            let (got, want) = (erf_f32(x), erf_f32_branches(x));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "erf_f32({x:e}) = {got:e}, the branches give {want:e}"
            );
        }
    }

    /// Every f32 (about five minutes in release: `cargo test --release -p tl-spec --lib --
    /// --ignored erf_f32_equals_the_branches_on_every_f32`).
    #[test]
    #[ignore = "every f32: run in release"]
    fn erf_f32_equals_the_branches_on_every_f32() {
        let bad = (0..=u32::MAX)
            .map(f32::from_bits)
            .filter(|&x| {
                let (got, want) = (erf_f32(x), erf_f32_branches(x));
                got.to_bits() != want.to_bits() && !(got.is_nan() && want.is_nan())
            })
            .count();
        assert_eq!(bad, 0);
    }

    /// `erf_f32` against libm's f64 `erf` on a dense sweep of [−7, 7] and at the branch edges.
    #[test]
    fn erf_f32_is_within_2_ulp() {
        let ulp = |v: f32| (f32::from_bits(v.abs().to_bits() + 1) - v.abs()).max(f32::MIN_POSITIVE);
        let mut worst = 0.0f64;
        let edges = [
            0.0f32,
            -0.0,
            1e-30,
            0.843_75,
            1.25,
            f32::from_bits(0x4036_db6d),
            6.0,
        ];
        let sweep = (0..=280_000).map(|i| -7.0 + i as f32 * 5e-5);
        for x in edges.into_iter().chain(edges.map(|e| -e)).chain(sweep) {
            let want = libm::erf(f64::from(x));
            let got = erf_f32(x);
            let err = (f64::from(got) - want).abs() / f64::from(ulp(want as f32));
            worst = worst.max(err);
        }
        assert!(worst <= 2.0, "worst {worst} ulp");
        assert!(erf_f32(-0.0).is_sign_negative());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
    }
}
