//! The counter-based RNG shared by every backend (SEMANTICS.md, "Randomness"): the one copy of
//! these functions, used by the reference ops ([`crate::ops::random`]), the CPU kernels and the
//! CUDA tape's simulation device.
//!
//! `key(seed, counter) = splitmix64(seed + counter)`; element `i` (row-major) of a draw keyed by
//! `key` uses `u = low 32 bits of splitmix64(key + i)`. All arithmetic wraps. By that formula
//! seed s + 1 at counter c draws what seed s draws at counter c + 1: runs meant to be
//! independent take seeds further apart than the draws they make (a hash of the run's name,
//! not 0, 1, 2). PyTorch has no
//! counter-based equivalent (its generators are stateful); this is the scheme of JAX's and
//! TorchLean's keyed randomness.

use crate::Scalar;

/// SplitMix64's output function applied to `z` (wrapping arithmetic).
pub fn splitmix64(z: u64) -> u64 {
    let z1 = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z2 = (z1 ^ (z1 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z3 = (z2 ^ (z2 >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z3 ^ (z3 >> 31)
}

/// The key of draw number `counter` under `seed`: `splitmix64(seed + counter)`.
pub fn key(seed: u64, counter: u64) -> u64 {
    splitmix64(seed.wrapping_add(counter))
}

/// The 32 random bits of element `i` of a draw keyed by `key`.
pub fn bits(key: u64, i: u64) -> u32 {
    splitmix64(key.wrapping_add(i)) as u32
}

/// `u / 2³²` for element `i` of a draw keyed by `key`, exactly (in `f64`), in `[0, 1)`.
pub fn unit(key: u64, i: u64) -> f64 {
    f64::from(bits(key, i)) / 4_294_967_296.0
}

/// The uniform value of element `i` in `T`: [`unit()`] rounded to the nearest `T`, kept in
/// `[0, 1)`. PyTorch: one element of `torch.rand`.
///
/// In `f64` this is exactly `u / 2³²`. Rounding to `f32` would give exactly `1.0` for the top
/// 2⁷ values of `u` (probability 2⁻²⁵), so the result is clamped to the largest `T` below 1
/// (`1 − ε/2`), as every backend does.
pub fn uniform<T: Scalar>(key: u64, i: u64) -> T {
    let v = T::lit(unit(key, i));
    if v < T::one() { v } else { below_one() }
}

/// The largest `T` below 1: `1 − ε/2`.
pub fn below_one<T: Scalar>() -> T {
    T::one() - T::epsilon() / (T::one() + T::one())
}

/// A standard normal value for element `i` of a draw keyed by `key`, by Box–Muller from the
/// uniforms of positions `2i` and `2i + 1`: `√(−2 ln(1 − u₁))·cos(2π u₂)` (finite: `1 − u₁ > 0`).
/// PyTorch: one element of `torch.randn` (another generator, the same distribution).
pub fn normal(key: u64, i: u64) -> f64 {
    let j = i.wrapping_mul(2);
    let (u1, u2) = (unit(key, j), unit(key, j.wrapping_add(1)));
    (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Whether element `i` of a Bernoulli mask keyed by `key` is kept: `keep_prob > u / 2³²`,
/// compared exactly in `f64` (so `keep_prob = 0` keeps nothing and `keep_prob = 1` everything).
pub fn keep(key: u64, i: u64, keep_prob: f64) -> bool {
    keep_prob > unit(key, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference SplitMix64 generator seeded with 0 (its state
        // advances by the golden gamma, so output k is splitmix64 of (k-1)·gamma).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(key(5, 7), splitmix64(12));
        assert_eq!(bits(u64::MAX, 1), splitmix64(0) as u32);
        // Wrapping: seed + counter and key + i overflow silently, and so do a normal's
        // positions 2i and 2i + 1.
        assert_eq!(key(u64::MAX, 1), splitmix64(0));
        assert!(normal(3, u64::MAX).is_finite());
        assert_eq!(normal(3, u64::MAX), normal(3, u64::MAX >> 1));
    }

    #[test]
    fn uniform_stays_below_one_and_mask_compares_exactly() {
        // u = 2³² − 1 rounds to 1.0 in f32; the clamp keeps it below 1.
        let top = u32::MAX as f64 / 4_294_967_296.0;
        assert_eq!(top as f32, 1.0);
        assert_eq!(below_one::<f32>(), 1.0 - f32::EPSILON / 2.0);
        assert!(below_one::<f32>() < 1.0 && below_one::<f64>() < 1.0);
        assert_eq!(f32::from_bits(below_one::<f32>().to_bits() + 1), 1.0);
        // The f64 path is exact; the f32 path is its rounding.
        for i in 0..64 {
            let u = unit(11, i);
            assert_eq!(uniform::<f64>(11, i), u);
            assert_eq!(uniform::<f32>(11, i), (u as f32).min(below_one()));
            assert_eq!(u * 4_294_967_296.0, f64::from(bits(11, i)));
        }
        let u = unit(9, 3);
        assert!(!keep(9, 3, u), "keep_prob == u is not kept (strict >)");
        assert!(keep(9, 3, u + 1e-12));
        assert!(!keep(9, 3, 0.0));
        assert!(keep(9, 3, 1.0));
    }
}
