//! The counter-based RNG shared by every backend (SEMANTICS.md, "Randomness").
//!
//! `key(seed, counter) = splitmix64(seed + counter)`; element `i` (row-major) of a draw keyed by
//! `key` uses `u = low 32 bits of splitmix64(key + i)`. All arithmetic wraps. The device
//! primitives `rand_uniform` and `bernoulli_mask` take the key; this module holds the host side
//! (the same functions the kernels compute per element).

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

/// The largest `f32` below 1.
const BELOW_ONE: f32 = 1.0 - f32::EPSILON / 2.0;

/// The uniform value of element `i`: `u / 2³²` rounded to the nearest `f32`, kept in `[0, 1)`.
///
/// `u / 2³²` is exact in `f64`; rounding it to `f32` would give exactly `1.0` for the top
/// 2⁷ values of `u` (probability 2⁻²⁵), so the result is clamped to the largest `f32` below 1.
pub fn uniform(key: u64, i: u64) -> f32 {
    let u = f64::from(bits(key, i)) / 4_294_967_296.0;
    (u as f32).min(BELOW_ONE)
}

/// The mask value of element `i`: `1` if `keep_prob > u / 2³²` (compared exactly, in `f64`),
/// else `0`.
pub fn keep(key: u64, i: u64, keep_prob: f64) -> f32 {
    let u = f64::from(bits(key, i)) / 4_294_967_296.0;
    if keep_prob > u { 1.0 } else { 0.0 }
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
    }

    #[test]
    fn uniform_stays_below_one_and_mask_compares_exactly() {
        // u = 2³² − 1 rounds to 1.0 in f32; the clamp keeps it below 1.
        assert_eq!(
            ((u32::MAX as f64 / 4_294_967_296.0) as f32).min(BELOW_ONE),
            BELOW_ONE
        );
        const { assert!(BELOW_ONE < 1.0) };
        let u = f64::from(bits(9, 3)) / 4_294_967_296.0;
        assert_eq!(keep(9, 3, u), 0.0, "keep_prob == u is not kept (strict >)");
        assert_eq!(keep(9, 3, u + 1e-12), 1.0);
        assert_eq!(keep(9, 3, 0.0), 0.0);
        assert_eq!(keep(9, 3, 1.0), 1.0);
    }
}
