//! A pre-norm transformer block and a small char-level language model built from it.
//!
//! Block (PyTorch: `nn.TransformerEncoderLayer(norm_first=True, bias=False in attention,
//! activation="gelu", dropout=0)` with a causal mask):
//! `x + mha(ln1(x))`, then `h + fc2(gelu(fc1(ln2(h))))`.
//!
//! Language model (GPT-style): token embedding rows gathered by Nat indices, plus a learned
//! positional embedding, `L` blocks, a final layer norm, and a linear head to vocabulary logits.

use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Shape, Tensor};

use super::SplitMix;
use crate::{Error, Ops, Param, Result, TensorRef};

/// Layer-norm ε of the blocks (PyTorch's default; the op's default is 1e-6).
pub const LN_EPS: f64 = 1e-5;

fn uniform<S: Ops + ?Sized>(
    s: &mut S,
    rng: &mut SplitMix,
    name: &str,
    shape: &[usize],
    bound: f64,
) -> Result<Param> {
    let t = Tensor::<S::T>::from_fn(shape, |_| S::T::lit(rng.uniform(-bound, bound)));
    s.param(t, Some(name), true)
}

fn filled<S: Ops + ?Sized>(s: &mut S, name: &str, n: usize, v: f64) -> Result<Param> {
    s.param(Tensor::from_fn([n], |_| S::T::lit(v)), Some(name), true)
}

fn bad(what: &'static str, detail: String) -> Error {
    Error::Usage { what, detail }
}

/// A pre-norm transformer block's parameters (`{prefix}.ln1.weight`, `{prefix}.attn.wq`, …).
#[derive(Debug, Clone)]
pub struct TransformerBlock {
    /// Model width.
    pub d_model: usize,
    /// Attention heads (divide `d_model`).
    pub heads: usize,
    /// Every parameter in [`names`](Self::names) order: ln1 γ, β; wq, wk, wv, wo (d, d); ln2 γ, β;
    /// fc1 weight (d_ff, d), bias; fc2 weight (d, d_ff), bias.
    pub params: Vec<Param>,
    names: Vec<String>,
}

impl TransformerBlock {
    /// A block of width `d_model` with `heads` heads and MLP width `d_ff`, parameter names
    /// prefixed by `prefix`. Init: layer norms γ = 1, β = 0; attention projections uniform in
    /// ±√(6/(2d)) (PyTorch's xavier init of `in_proj`), linear maps ±1/√fan_in.
    pub fn new<S: Ops + ?Sized>(
        s: &mut S,
        prefix: &str,
        d_model: usize,
        heads: usize,
        d_ff: usize,
        seed: u64,
    ) -> Result<Self> {
        if d_model == 0 || heads == 0 || !d_model.is_multiple_of(heads) || d_ff == 0 {
            return Err(bad(
                "TransformerBlock::new",
                format!(
                    "need heads ≥ 1 dividing d_model ≥ 1 and d_ff ≥ 1, got d_model {d_model}, heads {heads}, d_ff {d_ff}"
                ),
            ));
        }
        let mut rng = SplitMix::new(seed);
        let d = d_model;
        let xavier = (6.0 / (2 * d) as f64).sqrt();
        let (bd, bf) = (1.0 / (d as f64).sqrt(), 1.0 / (d_ff as f64).sqrt());
        let names: Vec<String> = [
            "ln1.weight",
            "ln1.bias",
            "attn.wq",
            "attn.wk",
            "attn.wv",
            "attn.wo",
            "ln2.weight",
            "ln2.bias",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias",
        ]
        .iter()
        .map(|n| format!("{prefix}.{n}"))
        .collect();
        let n = |i: usize| names[i].as_str();
        let params = vec![
            filled(s, n(0), d, 1.0)?,
            filled(s, n(1), d, 0.0)?,
            uniform(s, &mut rng, n(2), &[d, d], xavier)?,
            uniform(s, &mut rng, n(3), &[d, d], xavier)?,
            uniform(s, &mut rng, n(4), &[d, d], xavier)?,
            uniform(s, &mut rng, n(5), &[d, d], bd)?,
            filled(s, n(6), d, 1.0)?,
            filled(s, n(7), d, 0.0)?,
            uniform(s, &mut rng, n(8), &[d_ff, d], bd)?,
            uniform(s, &mut rng, n(9), &[d_ff], bd)?,
            uniform(s, &mut rng, n(10), &[d, d_ff], bf)?,
            uniform(s, &mut rng, n(11), &[d], bf)?,
        ];
        Ok(TransformerBlock {
            d_model,
            heads,
            params,
            names,
        })
    }

    /// The parameter names, in [`params`](Self::params) order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Record every parameter as a leaf (linked sessions need all leaves before the first op).
    pub fn use_params<S: Ops + ?Sized>(&self, s: &mut S) -> Result<Vec<TensorRef>> {
        self.params.iter().map(|p| s.use_param(p)).collect()
    }

    /// The block applied to `x` (B, n, d_model) with parameter leaves from
    /// [`use_params`](Self::use_params) and an optional attention mask (n, n).
    pub fn forward<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        leaves: &[TensorRef],
        x: &TensorRef,
        mask: Option<&Mask>,
    ) -> Result<TensorRef> {
        let (b, n) = match *x.shape().dims() {
            [b, n, d] if d == self.d_model && leaves.len() == 12 => (b, n),
            _ => {
                return Err(bad(
                    "TransformerBlock::forward",
                    format!(
                        "x must be (B, n, {}) with 12 leaves, got {} and {} leaves",
                        self.d_model,
                        x.shape(),
                        leaves.len()
                    ),
                ));
            }
        };
        let l = leaves;
        let h = s.layer_norm(x, &l[0], &l[1], LN_EPS)?;
        let a = s.multi_head_attention(
            &l[2],
            &l[3],
            &l[4],
            &l[5],
            &h,
            self.heads,
            mask.cloned(),
            false,
        )?;
        let x = s.add(x, &a)?;
        let h = s.layer_norm(&x, &l[6], &l[7], LN_EPS)?;
        let flat = s.reshape(&h, Shape::new(&[b * n, self.d_model]))?;
        let h = s.linear(&l[8], &l[9], &flat)?;
        let h = s.gelu(&h)?;
        let h = s.linear(&l[10], &l[11], &h)?;
        let h = s.reshape(&h, Shape::new(&[b, n, self.d_model]))?;
        s.add(&x, &h)
    }
}

/// The shape of a [`TransformerLm`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length (tokens per sequence).
    pub context: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP width of each block.
    pub d_ff: usize,
    /// Number of blocks.
    pub blocks: usize,
}

/// A char-level transformer language model's parameters.
#[derive(Debug, Clone)]
pub struct TransformerLm {
    /// The configuration it was built with.
    pub config: LmConfig,
    /// Token embedding (vocab, d), positional embedding (context, d).
    pub embed: (Param, Param),
    /// The blocks.
    pub blocks: Vec<TransformerBlock>,
    /// Final layer norm γ, β and the head's weight (vocab, d) and bias (vocab).
    pub out: [Param; 4],
    mask: Mask,
}

/// The parameter leaves of one recorded forward pass ([`TransformerLm::use_params`]).
#[derive(Debug, Clone)]
pub struct LmLeaves {
    embed: (TensorRef, TensorRef),
    blocks: Vec<Vec<TensorRef>>,
    out: Vec<TensorRef>,
}

impl TransformerLm {
    /// Parameters for `config` from `seed`. Embeddings are uniform in ±0.1; names `tok_emb`,
    /// `pos_emb`, `block{k}.*`, `ln_f.weight`, `ln_f.bias`, `head.weight`, `head.bias`.
    pub fn new<S: Ops + ?Sized>(s: &mut S, config: &LmConfig, seed: u64) -> Result<Self> {
        let c = config;
        if c.vocab == 0 || c.context == 0 {
            return Err(bad(
                "TransformerLm::new",
                format!("vocab and context must be at least 1, got {c:?}"),
            ));
        }
        let mut rng = SplitMix::new(seed);
        let tok = uniform(s, &mut rng, "tok_emb", &[c.vocab, c.d_model], 0.1)?;
        let pos = uniform(s, &mut rng, "pos_emb", &[c.context, c.d_model], 0.1)?;
        let blocks = (0..c.blocks)
            .map(|k| {
                let bseed = rng.next_u64();
                TransformerBlock::new(s, &format!("block{k}"), c.d_model, c.heads, c.d_ff, bseed)
            })
            .collect::<Result<Vec<_>>>()?;
        let bd = 1.0 / (c.d_model.max(1) as f64).sqrt();
        let out = [
            filled(s, "ln_f.weight", c.d_model, 1.0)?,
            filled(s, "ln_f.bias", c.d_model, 0.0)?,
            uniform(s, &mut rng, "head.weight", &[c.vocab, c.d_model], bd)?,
            uniform(s, &mut rng, "head.bias", &[c.vocab], bd)?,
        ];
        Ok(TransformerLm {
            config: c.clone(),
            embed: (tok, pos),
            blocks,
            out,
            mask: Mask::causal(c.context)?,
        })
    }

    /// Every parameter: embeddings, blocks, final norm and head.
    pub fn params(&self) -> Vec<Param> {
        let mut v = vec![self.embed.0.clone(), self.embed.1.clone()];
        for b in &self.blocks {
            v.extend(b.params.iter().cloned());
        }
        v.extend(self.out.iter().cloned());
        v
    }

    /// The parameter names, in [`params`](Self::params) order.
    pub fn param_names(&self) -> Vec<String> {
        let mut v = vec!["tok_emb".to_owned(), "pos_emb".to_owned()];
        for b in &self.blocks {
            v.extend(b.names().iter().cloned());
        }
        v.extend(["ln_f.weight", "ln_f.bias", "head.weight", "head.bias"].map(String::from));
        v
    }

    /// Record every parameter as a leaf (linked sessions need all leaves before the first op).
    pub fn use_params<S: Ops + ?Sized>(&self, s: &mut S) -> Result<LmLeaves> {
        Ok(LmLeaves {
            embed: (s.use_param(&self.embed.0)?, s.use_param(&self.embed.1)?),
            blocks: self
                .blocks
                .iter()
                .map(|b| b.use_params(s))
                .collect::<Result<_>>()?,
            out: self
                .out
                .iter()
                .map(|p| s.use_param(p))
                .collect::<Result<_>>()?,
        })
    }

    /// Next-token logits (batch·context, vocab) of `batch` sequences whose `batch·context` token
    /// ids sit in the Nat environment from position `tokens_at` (row-major: sequence, position).
    /// Causal: position t sees positions ≤ t only.
    pub fn forward<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        leaves: &LmLeaves,
        tokens_at: usize,
        batch: usize,
    ) -> Result<TensorRef> {
        let c = &self.config;
        let (n, d) = (c.context, c.d_model);
        let rows = s.gather_rows_nat_vec(&leaves.embed.0, tokens_at, batch * n)?;
        let x = s.reshape(&rows, Shape::new(&[batch, n, d]))?;
        let pos = s.broadcast_to(&leaves.embed.1, Shape::new(&[batch, n, d]))?;
        let mut h = s.add(&x, &pos)?;
        for (b, l) in self.blocks.iter().zip(&leaves.blocks) {
            h = b.forward(s, l, &h, Some(&self.mask))?;
        }
        let o = &leaves.out;
        let h = s.layer_norm(&h, &o[0], &o[1], LN_EPS)?;
        let flat = s.reshape(&h, Shape::new(&[batch * n, d]))?;
        s.linear(&o[2], &o[3], &flat)
    }
}
