//! [`Rope`]: rotary position embeddings (RoFormer, Su et al. 2021) for
//! [`MultiHeadAttention`](super::MultiHeadAttention)'s queries and keys.

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use crate::error::usage;
use crate::{Result, Var};

/// Which pairs of a head's dh features rotate together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Features (2i, 2i + 1): the paper's, Meta's LLaMA code and torchtune's
    /// `RotaryPositionalEmbeddings`.
    Interleaved,
    /// Features (i, i + dh/2): GPT-NeoX's and Hugging Face's `rotate_half`.
    Halves,
}

/// Rotary position embeddings: at position p, feature pair k of each head's query and key is
/// rotated by the angle `p·θ_k`, `θ_k = base^(−2k/dh)` (k < dh/2), so a query-key score depends
/// on their positions' difference only. Positions count from 0 along the sequence axis;
/// queries and keys alike. PyTorch has none in `torch.nn`: torchtune's
/// `RotaryPositionalEmbeddings(dim=dh, base=…)` ([`RopeLayout::Interleaved`]) or Hugging
/// Face's `apply_rotary_pos_emb` ([`RopeLayout::Halves`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// The angles' base (10000 in the paper and LLaMA 2; 500000 in LLaMA 3).
    pub base: f64,
    /// The pairs.
    pub layout: RopeLayout,
}

impl Rope {
    /// The paper's: base 10000, interleaved pairs.
    pub const DEFAULT: Rope = Rope {
        base: 10000.0,
        layout: RopeLayout::Interleaved,
    };

    /// An error naming `what` (the call) unless `base` is finite and > 1 and the head size
    /// `dh` even.
    pub(super) fn check(&self, what: &'static str, dh: usize) -> Result<()> {
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(usage(
                what,
                format!("the base must be finite and > 1, got {}", self.base),
            ));
        }
        if !dh.is_multiple_of(2) {
            return Err(usage(
                what,
                format!("the head size {dh} must be even (features rotate in pairs)"),
            ));
        }
        Ok(())
    }

    /// Feature j's partner and angle index k: (its pair's other feature, k).
    fn pair(&self, dh: usize, j: usize) -> (usize, usize) {
        match self.layout {
            RopeLayout::Interleaved => (j ^ 1, j / 2),
            RopeLayout::Halves => ((j + dh / 2) % dh, j % (dh / 2)),
        }
    }

    /// `x` of (B, n, heads, dh) (n positions from `start`) rotated:
    /// `x ⊙ cos + (x·P) ⊙ sin±`, with P the 0/1 matrix sending each feature to its partner
    /// and `sin±` the sine with the first feature of each pair negated (`(x₁, x₂) ↦ (x₁ cos −
    /// x₂ sin, x₂ cos + x₁ sin)`), the (1, n, 1, dh) tables constants broadcast over the batch
    /// and the heads.
    pub(super) fn rotate<'g, O: Train>(&self, x: &Var<'g, O>, start: usize) -> Result<Var<'g, O>> {
        let (b, n, h, dh) = match x.dims() {
            [b, n, h, dh] => (*b, *n, *h, *dh),
            _ => {
                return Err(usage(
                    "Rope::rotate",
                    format!("need (B, n, heads, dh), got {}", x.shape()),
                ));
            }
        };
        let what = "MultiHeadAttention (rope)";
        let angle = |p: usize, j: usize| {
            let k = self.pair(dh, j).1;
            p as f64 * self.base.powf(-2.0 * k as f64 / dh as f64)
        };
        // The first feature of a pair: the lower index.
        let first = |j: usize| j < self.pair(dh, j).0;
        let cos = Tensor::try_from_fn(what, [1, n, 1, dh], |e| {
            O::T::lit(angle(start + e / dh, e % dh).cos())
        })?;
        let sin = Tensor::try_from_fn(what, [1, n, 1, dh], |e| {
            let (p, j) = (start + e / dh, e % dh);
            let s = angle(p, j).sin();
            O::T::lit(if first(j) { -s } else { s })
        })?;
        // Column j of x·P is x's feature pair(j).0.
        let partner = Tensor::try_from_fn(what, [dh, dh], |e| {
            let (i, j) = (e / dh, e % dh);
            O::T::lit(if self.pair(dh, j).0 == i { 1.0 } else { 0.0 })
        })?;
        let g = x.scope();
        let swapped = x
            .reshape(&[b * n * h, dh])?
            .matmul(&g.constant(partner)?)?
            .reshape(&[b, n, h, dh])?;
        &(x * &g.constant(cos)?)? + &(&swapped * &g.constant(sin)?)?
    }
}
