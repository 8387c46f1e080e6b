//! [`Rng`]: a seeded random stream for users (shuffles, token windows, sampling), on the
//! project's counter RNG (`tl_spec::rng`, SEMANTICS.md "Randomness"): stream `s` of seed
//! `seed` has the key `key(seed, s) = splitmix64(seed + s)`, and its draw number `i` is
//! `splitmix64(key + i)`, the element `i` of a tensor drawn with that key. So a stream is
//! reproducible from `(seed, stream, counter)` alone, on every machine, and resumes exactly
//! from [`Rng::counter`] / [`Rng::set_counter`].
//!
//! PyTorch: a `torch.Generator` with `manual_seed`, and `torch.rand`, `torch.randn`,
//! `torch.randint(n)`, `torch.randperm(n)` drawing from it (another generator, the same
//! distributions).

use tl_spec::rng;

use crate::Result;
use crate::error::usage;

/// A seeded stream of random numbers on the project's counter RNG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    key: u64,
    counter: u64,
}

impl Rng {
    /// The stream of `seed` (stream 0: [`Rng::stream`]`(seed, 0)`).
    pub fn new(seed: u64) -> Self {
        Self::stream(seed, 0)
    }

    /// Stream number `stream` of `seed`, independent of the others: e.g. one per epoch. Its
    /// key is `key(seed, stream)`, as the session's draw number `stream` under that seed.
    pub fn stream(seed: u64, stream: u64) -> Self {
        Rng {
            key: rng::key(seed, stream),
            counter: 0,
        }
    }

    /// How many 64-bit draws the stream has made (the position to resume from).
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Moves the stream to draw number `counter` (a value read by [`Rng::counter`] resumes
    /// the stream exactly).
    pub fn set_counter(&mut self, counter: u64) {
        self.counter = counter;
    }

    /// The next 64 random bits: `splitmix64(key + counter)`; its low 32 bits are
    /// `tl_spec::rng::bits(key, counter)`.
    pub fn next_u64(&mut self) -> u64 {
        let v = rng::splitmix64(self.key.wrapping_add(self.counter));
        self.counter = self.counter.wrapping_add(1);
        v
    }

    /// A uniform value in `[0, 1)`: `tl_spec::rng::unit(key, counter)` (32 random bits over
    /// 2³², exact in `f64`). PyTorch: `torch.rand(())`.
    pub fn uniform(&mut self) -> f64 {
        let u = rng::unit(self.key, self.counter);
        self.counter = self.counter.wrapping_add(1);
        u
    }

    /// A standard normal value by Box–Muller from the next two uniforms
    /// (`tl_spec::rng::normal`; an odd counter first skips one draw so the pair is aligned).
    /// PyTorch: `torch.randn(())`.
    pub fn normal(&mut self) -> f64 {
        let pair = self.counter.div_ceil(2);
        self.counter = pair.wrapping_mul(2).wrapping_add(2);
        rng::normal(self.key, pair)
    }

    /// A uniform integer in `0..n`, unbiased (a 64-bit draw rejected when it falls in the
    /// incomplete last block of `n`). `n = 0` is an error. PyTorch: `torch.randint(n, ())`.
    pub fn below(&mut self, n: usize) -> Result<usize> {
        if n == 0 {
            return Err(usage("Rng::below", "n must be at least 1, got 0"));
        }
        Ok(self.index(n))
    }

    /// A uniform integer in `0..n` for `n ≥ 1` (the body of [`Rng::below`]).
    fn index(&mut self, n: usize) -> usize {
        let n = n as u64;
        // The largest multiple of n that fits: draws at or above it would favour small values.
        let zone = u64::MAX - (u64::MAX % n + 1) % n;
        loop {
            let v = self.next_u64();
            if v <= zone {
                return (v % n) as usize;
            }
        }
    }

    /// Shuffles `items` in place (Fisher–Yates, every order equally likely).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        fisher_yates(items, |bound| self.index(bound));
    }

    /// A random permutation of `0..n` (allocated fallibly: an `n` too large to hold is an
    /// error). PyTorch: `torch.randperm(n)`.
    pub fn permutation(&mut self, n: usize) -> Result<Vec<usize>> {
        let mut p = tl_spec::alloc::try_with_capacity("Rng::permutation", "permutation", n)?;
        p.extend(0..n);
        self.shuffle(&mut p);
        Ok(p)
    }
}

/// Fisher–Yates: for `i` from the end down to 1, swap item `i` with item `pick(i + 1)` (which
/// must return a value below its argument).
pub(crate) fn fisher_yates<T>(items: &mut [T], mut pick: impl FnMut(usize) -> usize) {
    for i in (1..items.len()).rev() {
        items.swap(i, pick(i + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_the_counter_rng_elements() {
        let mut r = Rng::stream(5, 3);
        let k = rng::key(5, 3);
        assert_eq!(r.next_u64() as u32, rng::bits(k, 0));
        assert_eq!(r.uniform(), rng::unit(k, 1));
        // Counter 2 is even: the pair (2, 3) is normal element 1.
        assert_eq!(r.normal(), rng::normal(k, 1));
        assert_eq!(r.counter(), 4);
        r.set_counter(5);
        // Odd: skip to the pair (6, 7), element 3.
        assert_eq!(r.normal(), rng::normal(k, 3));
        assert_eq!(r.counter(), 8);
    }

    #[test]
    fn below_rejects_the_incomplete_block() {
        // n = 2^63 + 1: zone is the largest multiple of n minus 1, so values above it retry.
        let n = (1u64 << 63) + 1;
        let zone = u64::MAX - (u64::MAX % n + 1) % n;
        assert_eq!(zone, n - 1, "only one whole block of n fits in 2^64");
        // n a power of two: every value is accepted.
        let n = 1u64 << 10;
        assert_eq!(u64::MAX - (u64::MAX % n + 1) % n, u64::MAX);
        let mut r = Rng::new(1);
        assert!((0..1000).all(|_| r.below(3).unwrap() < 3));
        assert_eq!(r.below(1).unwrap(), 0);
    }
}
