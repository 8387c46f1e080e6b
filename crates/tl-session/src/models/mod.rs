//! Model builders written once against [`crate::Ops`], so each runs eager (CPU, CUDA) and
//! linked: an MLP, a small CNN, a 1-D Fourier neural operator and a char-level transformer language
//! model (with a block builder usable alone).

mod cnn;
mod data;
mod fno;
mod mlp;
mod transformer;

pub use cnn::{Cnn, CnnConfig, CnnLeaves};
pub use data::regression_grid;
pub use fno::{Fno1d, FnoConfig, FnoLeaves};
pub use mlp::{Activation, Mlp};
pub use transformer::{LN_EPS, LmConfig, LmLeaves, TransformerBlock, TransformerLm};

/// SplitMix64: a tiny deterministic generator for parameter initialisation.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }
}
