//! bfloat16 mixed precision: the reference every bf16 path is checked against.
//!
//! A bf16 value is the top 16 bits of an f32 (sign, the same 8 exponent bits, 7 fraction
//! bits). Under bf16 autocast a *product* (matmul, bmm, linear, conv, attention's products)
//! reads each f32 operand rounded to bf16 and accumulates in f32; every other value, the
//! master weights and the optimizer state stay f32 (docs/semantics.md, "## Mixed precision").
//!
//! - [`round`]: f32 → the nearest bf16 (ties to even), held in an f32; NaN stays NaN (quiet),
//!   ±∞ stays ±∞, a finite value past the largest bf16 (by half an ulp or more) rounds to ±∞,
//!   subnormals round like any other value.
//! - [`to_bits`] / [`from_bits`]: the 16-bit encoding.
//! - [`matmul`]: the reference of a bf16 product, `Σ_k round(a_ik)·round(b_kj)` in f64. Each
//!   product of two bf16 values is exact in f32 (8 + 8 significant bits ≤ 24) and in f64, so
//!   the only rounding a bf16 path may add is its f32 accumulation: [`accumulation_bound`]
//!   bounds it for every summation order.

use crate::{Result, Tensor};

/// The 16-bit bf16 encoding of the f32 `x` rounded to nearest, ties to even (see the module
/// docs). A NaN keeps its sign and top payload bits and is made quiet.
#[inline]
pub fn to_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    // Adding 0x7fff (+1 when the kept part is odd) carries into the kept half exactly when
    // the dropped half is above one half, or exactly one half with an odd kept part. A carry
    // out of the largest finite exponent gives the infinity's encoding, as rounding should.
    let bias = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// The f32 whose top half is `bits` (exact: every bf16 is an f32).
#[inline]
pub fn from_bits(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32.
#[inline]
pub fn round(x: f32) -> f32 {
    from_bits(to_bits(x))
}

/// Every element of `t` rounded to bf16 ([`round`]), as an f64 tensor (exact).
pub fn round_tensor(t: &Tensor<f32>) -> Result<Tensor<f64>> {
    t.try_map("bf16", round)?.try_cast("bf16")
}

/// The reference of a bf16 matrix product: `(m, k)·(k, n)` of the f32 operands rounded to
/// bf16, each product and the sum in f64 ([`crate::ops::linalg::matmul`]). A bf16 path's f32
/// result differs from it by at most [`accumulation_bound`].
pub fn matmul(a: &Tensor<f32>, b: &Tensor<f32>) -> Result<Tensor<f64>> {
    crate::ops::linalg::matmul(&round_tensor(a)?, &round_tensor(b)?)
}

/// How far an f32 accumulation of `terms` exact products (plus one scaling by a power-of-two
/// or unit `alpha` and one addition to an existing f32 output) may stray from the exact sum,
/// in any order: `(terms + 2)·2⁻²⁴·Σ|products|` (the standard bound for recursive summation,
/// `γ_n ≤ n·u/(1 − n·u)`, with room for the two extra roundings and `n·u` far below 1), plus
/// `(terms + 2)·2⁻¹²⁶` for hardware that flushes subnormal products and sums to zero
/// (AVX512-BF16's `vdpbf16ps` and AMX do). `abs_sum` is `Σ_k |round(a_ik)·round(b_kj)|` (plus
/// `|c|` when accumulating).
pub fn accumulation_bound(terms: usize, abs_sum: f64) -> f64 {
    let n = terms as f64 + 2.0;
    n * f64::from(f32::EPSILON) / 2.0 * abs_sum + n * f64::from(f32::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition by exact arithmetic: the two bf16 neighbours of `x`, the nearer one, the
    /// even one on a tie.
    fn nearest(x: f32) -> f32 {
        let lo = from_bits((x.to_bits() >> 16) as u16);
        let hi = from_bits(((x.to_bits() >> 16) + 1) as u16);
        // Past the largest finite bf16 the upper neighbour is ±2^128 as if the exponent
        // went on; landing there is overflow to ±∞.
        let hi_v = match hi.is_infinite() {
            true => f64::from(hi.signum()) * 2f64.powi(128),
            false => f64::from(hi),
        };
        let (dl, dh) = (
            (f64::from(x) - f64::from(lo)).abs(),
            (hi_v - f64::from(x)).abs(),
        );
        if dl < dh || (dl == dh && (lo.to_bits() >> 16).is_multiple_of(2)) {
            lo
        } else {
            hi
        }
    }

    #[test]
    fn rounding_is_to_nearest_even_everywhere() {
        // Every 2^12-th f32 bit pattern plus the patterns around each kept-part boundary.
        let mut checked = 0;
        for hi in (0u32..0x1_0000).step_by(7) {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000] {
                let x = f32::from_bits((hi << 16) | lo);
                if x.is_nan() {
                    assert!(round(x).is_nan(), "{:#x}", x.to_bits());
                    continue;
                }
                let want = if x.is_infinite() { x } else { nearest(x) };
                assert_eq!(round(x).to_bits(), want.to_bits(), "{:#x}", x.to_bits());
                checked += 1;
            }
        }
        assert!(checked > 60_000);
    }

    #[test]
    fn ties_nan_infinity_and_overflow() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: the even side is 1.
        assert_eq!(round(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round(-1.0 - 3.0 * 2f32.powi(-8)), -1.0 - 2f32.powi(-6));
        // Just above a tie rounds up.
        assert_eq!(
            round(f32::from_bits(0x3f80_8001)),
            f32::from_bits(0x3f81_0000)
        );
        assert_eq!(round(f32::INFINITY), f32::INFINITY);
        assert_eq!(round(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert_eq!(round(f32::MAX), f32::INFINITY);
        assert_eq!(round(-f32::MAX), f32::NEG_INFINITY);
        // A NaN whose payload sits only in the dropped half stays NaN (not ∞).
        let nan = f32::from_bits(0x7f80_0001);
        assert!(nan.is_nan() && round(nan).is_nan());
        assert!(round(-f32::NAN).is_sign_negative());
        // Subnormals round too, ±0 stays.
        assert_eq!(round(f32::from_bits(0x0000_8000)).to_bits(), 0);
        assert_eq!(round(f32::from_bits(0x0001_8000)).to_bits(), 0x0002_0000);
        assert_eq!(round(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(from_bits(to_bits(3.0)), 3.0);
    }

    #[test]
    fn the_reference_product_rounds_the_operands_first() {
        // 1 + 2^-9 rounds to 1, 3 stays: the reference is 3, not 3 + 3·2^-9.
        let a = Tensor::new([1, 2], vec![1.0 + 2f32.powi(-9), 1.0]).unwrap();
        let b = Tensor::new([2, 1], vec![3.0, 0.0]).unwrap();
        assert_eq!(matmul(&a, &b).unwrap().data(), &[3.0]);
        let e = matmul(&a, &a).unwrap_err().to_string();
        assert!(e.contains("matmul"), "{e}");
        assert!(accumulation_bound(10, 1.0) > 12.0 * 5.9e-8);
        assert!(accumulation_bound(10, 1.0) < 12.0 * 6.0e-8 + 1e-30);
    }
}
