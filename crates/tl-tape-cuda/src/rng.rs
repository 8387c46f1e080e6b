//! The counter-based RNG shared by every backend (SEMANTICS.md, "Randomness"), re-exported from
//! [`tl_spec::rng`] (the one copy of SplitMix64 keying), plus the `f32` forms the device
//! primitives `rand_uniform` and `bernoulli_mask` compute per element.
//!
//! `key(seed, counter) = splitmix64(seed + counter)`; element `i` (row-major) of a draw keyed by
//! `key` uses `u = low 32 bits of splitmix64(key + i)`. All arithmetic wraps.

pub use tl_spec::rng::{bits, key, splitmix64, unit};

/// The uniform value of element `i`: `u / 2³²` rounded to the nearest `f32`, kept in `[0, 1)`
/// (clamped to the largest `f32` below 1, see [`tl_spec::rng::uniform`]).
pub fn uniform(key: u64, i: u64) -> f32 {
    tl_spec::rng::uniform::<f32>(key, i)
}

/// The mask value of element `i`: `1` if `keep_prob > u / 2³²` (compared exactly, in `f64`),
/// else `0`.
pub fn keep(key: u64, i: u64, keep_prob: f64) -> f32 {
    if tl_spec::rng::keep(key, i, keep_prob) {
        1.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_forms_are_the_shared_functions_in_f32() {
        // The reference SplitMix64 sequence through the re-export (the generator seeded with 0).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
        for i in 0..32 {
            let u = unit(9, i);
            assert_eq!(uniform(9, i), (u as f32).min(1.0 - f32::EPSILON / 2.0));
            assert_eq!(keep(9, i, u), 0.0, "keep_prob == u is not kept (strict >)");
            assert_eq!(keep(9, i, 1.0), 1.0);
        }
    }
}
