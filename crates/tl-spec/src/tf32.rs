//! TensorFloat-32 mixed precision: the rounding of a TF32 product's operands.
//!
//! A TF32 value is an f32 with its 13 low fraction bits zero (sign, 8 exponent bits, 10
//! fraction bits: 11 significant bits). Under TF32 autocast a *product* (the same ones as
//! bf16's, [`crate::bf16`]) reads each f32 operand rounded to TF32 and accumulates in f32.
//!
//! - [`round`]: f32 → TF32, to nearest with **ties away from zero**, as PTX's
//!   `cvt.rna.tf32.f32` (CUDA's `wmma::__float_to_tf32`) rounds; NaN stays NaN (made quiet,
//!   sign kept), ±∞ stays ±∞, a finite value at or past the largest TF32 plus half an ulp
//!   becomes ±∞, subnormals round like any other value, ±0 stays.
//! - [`matmul`]: the reference of a TF32 product, `Σ_k round(a_ik)·round(b_kj)` in f64. A
//!   product of two TF32 values (11 + 11 significant bits) is exact in f32, so
//!   [`crate::bf16::accumulation_bound`] bounds a TF32 path's f32 accumulation too.

use crate::{Result, Tensor};

/// Fraction bits an f32 has that a TF32 value drops.
const DROPPED: u32 = 13;

/// `x` rounded to the nearest TF32 value, ties away from zero, as an f32 (module docs).
#[inline]
pub fn round(x: f32) -> f32 {
    let bits = x.to_bits();
    if x.is_nan() {
        return f32::from_bits(bits | 0x0040_0000);
    }
    // Adding half the dropped part's range to the magnitude carries into the kept bits from
    // one half up (ties away from zero); a carry out of the largest finite exponent gives the
    // infinity's encoding. ±∞ has no low bits to carry.
    let half = 1u32 << (DROPPED - 1);
    let mask = !((1u32 << DROPPED) - 1);
    match x.is_infinite() {
        true => x,
        false => f32::from_bits(bits.wrapping_add(half) & mask),
    }
}

/// Every element of `t` rounded to TF32 ([`round`]), as an f64 tensor (exact).
pub fn round_tensor(t: &Tensor<f32>) -> Result<Tensor<f64>> {
    t.try_map("tf32", round)?.try_cast("tf32")
}

/// The reference of a TF32 matrix product: `(m, k)·(k, n)` of the f32 operands rounded to
/// TF32, each product and the sum in f64. A TF32 path's f32 result differs from it by at most
/// [`crate::bf16::accumulation_bound`].
pub fn matmul(a: &Tensor<f32>, b: &Tensor<f32>) -> Result<Tensor<f64>> {
    crate::ops::linalg::matmul(&round_tensor(a)?, &round_tensor(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition by exact arithmetic: the two TF32 neighbours of `x` (its magnitude
    /// truncated, and one ulp up), the nearer one, the one away from zero on a tie.
    fn nearest(x: f32) -> f32 {
        let lo = f32::from_bits(x.to_bits() & !0x1fff);
        let hi_bits = (x.to_bits() & !0x1fff) + 0x2000;
        let hi = f32::from_bits(hi_bits);
        // Past the largest finite TF32 the upper neighbour is ±2^128 as if the exponent went
        // on; landing there is overflow to ±∞.
        let hi_v = match hi.is_infinite() {
            true => f64::from(hi.signum()) * 2f64.powi(128),
            false => f64::from(hi),
        };
        let (dl, dh) = (
            (f64::from(x) - f64::from(lo)).abs(),
            (hi_v - f64::from(x)).abs(),
        );
        if dl < dh { lo } else { hi }
    }

    #[test]
    fn rounding_is_to_nearest_ties_away_everywhere() {
        // Every 7th value of the top 16 bits with low parts around each kept-part boundary.
        let mut checked = 0;
        for hi in (0u32..0x1_0000).step_by(7) {
            for lo in [
                0u32, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2fff, 0x3000, 0xb123, 0xffff,
            ] {
                let x = f32::from_bits((hi << 16) | lo);
                if x.is_nan() {
                    assert!(round(x).is_nan(), "{:#x}", x.to_bits());
                    continue;
                }
                let want = if x.is_infinite() { x } else { nearest(x) };
                assert_eq!(round(x).to_bits(), want.to_bits(), "{:#x}", x.to_bits());
                assert_eq!(round(x).to_bits() & 0x1fff, 0, "{:#x}", x.to_bits());
                checked += 1;
            }
        }
        assert!(checked > 90_000);
    }

    #[test]
    fn ties_nan_infinity_and_overflow() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: away from zero (bf16 would go even).
        assert_eq!(round(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
        assert_eq!(round(-1.0 - 2f32.powi(-11)), -1.0 - 2f32.powi(-10));
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: away again.
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
        // Just below a tie rounds down.
        assert_eq!(round(f32::from_bits(0x3f80_0fff)), 1.0);
        assert_eq!(round(f32::INFINITY), f32::INFINITY);
        assert_eq!(round(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert_eq!(round(f32::MAX), f32::INFINITY);
        assert_eq!(round(-f32::MAX), f32::NEG_INFINITY);
        // The largest TF32 stays; a NaN whose payload sits only in the dropped bits stays NaN.
        assert_eq!(
            round(f32::from_bits(0x7f7f_e000)),
            f32::from_bits(0x7f7f_e000)
        );
        let nan = f32::from_bits(0x7f80_0001);
        assert!(round(nan).is_nan());
        assert!(round(-f32::NAN).is_sign_negative());
        // Subnormals round too, ±0 stays.
        assert_eq!(round(f32::from_bits(0x0000_1000)).to_bits(), 0x0000_2000);
        assert_eq!(round(f32::from_bits(0x0000_0fff)).to_bits(), 0);
        assert_eq!(round(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn the_reference_product_rounds_the_operands_first() {
        // 1 + 2^-12 rounds to 1: the reference is 3, not 3 + 3·2^-12.
        let a = Tensor::new([1, 2], vec![1.0 + 2f32.powi(-12), 1.0]).unwrap();
        let b = Tensor::new([2, 1], vec![3.0, 0.0]).unwrap();
        assert_eq!(matmul(&a, &b).unwrap().data(), &[3.0]);
        // 11 + 11 significant bits: the largest TF32 significands multiply exactly in f32.
        let m = round(2.0 - 2f32.powi(-10));
        assert_eq!(f64::from(m * m), f64::from(m) * f64::from(m));
    }
}
