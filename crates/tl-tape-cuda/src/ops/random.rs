//! Seeded randomness on the device: `randUniform` and `bernoulliMask` are the device primitives
//! keyed by `key(seed, counter)`; `dropout` is `(x · mask) · (1/keep)` with `mul` and `scale`.
//! The backward regenerates the mask from the same key (counter-based: no state, no workspace)
//! and applies the same two steps to the cotangent.

use crate::device::{Buffer, Device};
use crate::ops::{elementwise as ew, with_scratch};
use crate::{Result, rng};

/// `randUniform` of `n` elements.
pub fn uniform<D: Device>(dev: &mut D, n: usize, seed: u64, counter: u64) -> Result<Buffer> {
    dev.rand_uniform(n, rng::key(seed, counter))
}

/// `bernoulliMask` of `n` elements.
pub fn mask<D: Device>(
    dev: &mut D,
    n: usize,
    keep: f64,
    seed: u64,
    counter: u64,
) -> Result<Buffer> {
    dev.bernoulli_mask(n, rng::key(seed, counter), keep)
}

/// `(v · mask) · (1/keep)` for the `n`-element buffer `v`: dropout's forward (v = x) and its
/// backward (v = g).
pub fn dropout<D: Device>(
    dev: &mut D,
    v: Buffer,
    n: usize,
    keep: f64,
    seed: u64,
    counter: u64,
) -> Result<Buffer> {
    with_scratch(dev, |d, s| {
        let m = s.tmp(mask(d, n, keep, seed, counter)?);
        let vm = s.tmp(d.mul(v, m)?);
        d.scale(vm, ew::param(1.0 / keep))
    })
}
