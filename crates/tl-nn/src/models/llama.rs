//! [`LlamaBlock`]: a LLaMA-style decoder block (RMSNorm, rotary grouped-query attention, a
//! SwiGLU MLP).

use tl_session::{Param, Train};

use crate::error::usage;
use crate::{
    KvCache, Linear, Module, MultiHeadAttention, Parameters, Result, RmsNorm, Rope, Var, Vars,
};

/// The shape of a [`LlamaBlock`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Model width.
    pub d_model: usize,
    /// Query heads (dividing `d_model`).
    pub heads: usize,
    /// Key/value heads (dividing `heads`; `heads` for plain multi-head attention).
    pub kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// The rotary embeddings of the queries and keys (LLaMA 2: base 10000; Meta's code
    /// rotates interleaved pairs, Hugging Face's checkpoints the halves).
    pub rope: Rope,
    /// The RMSNorms' ε (LLaMA: 1e-5 or 1e-6).
    pub eps: f64,
}

/// A LLaMA-style causal decoder block on x (n, d) or (B, n, d): `h = x + attn(attn_norm(x))`,
/// then `h + w2(silu(w1(m)) · w3(m))` with `m = mlp_norm(h)`; the norms are [`RmsNorm`]s, the
/// attention a causal [`MultiHeadAttention::grouped`] with rotary embeddings (its core the op
/// `scaledDotProductAttention`, fused: the flash kernels on CUDA), the MLP's three linear
/// layers without biases. Names: `attn_norm.weight`, `attn.{wq,wk,wv,wo}`, `mlp_norm.weight`,
/// `mlp.{w1,w2,w3}.weight`. PyTorch: torchtune's `llama2` `TransformerSelfAttentionLayer`
/// (`RMSNorm`, `MultiHeadAttention` with `RotaryPositionalEmbeddings`, `FeedForward` with
/// `gate_proj` = w1, `up_proj` = w3, `down_proj` = w2); Hugging Face's `LlamaDecoderLayer`
/// with [`RopeLayout::Halves`](crate::RopeLayout::Halves) (its attention weights are the
/// transposes of `wq`…`wo`).
pub struct LlamaBlock {
    attn_norm: RmsNorm,
    attn: MultiHeadAttention,
    mlp_norm: RmsNorm,
    w1: Linear,
    w2: Linear,
    w3: Linear,
}

impl LlamaBlock {
    /// The block's parameters under `vars`: the norms' weights 1, the attention's as
    /// [`MultiHeadAttention::grouped`], the MLP's as [`Linear`] (PyTorch's defaults). An
    /// error names the block for a `d_ff` of 0 and the layer for any other bad size.
    pub fn new<O: Train>(vars: &Vars<'_, O>, config: &LlamaConfig) -> Result<Self> {
        let c = config;
        if c.d_ff == 0 {
            return Err(usage(
                "LlamaBlock::new",
                format!("the MLP width d_ff must be at least 1, got {c:?}"),
            ));
        }
        let attn =
            MultiHeadAttention::grouped(&vars.pp("attn"), c.d_model, c.heads, c.kv_heads, true)?
                .with_rope(c.rope)?;
        let mlp = vars.pp("mlp");
        let linear = |name: &str, i: usize, o: usize| Linear::with_bias(&mlp.pp(name), i, o, false);
        Ok(LlamaBlock {
            attn_norm: RmsNorm::with_eps(&vars.pp("attn_norm"), c.d_model, c.eps)?,
            attn,
            mlp_norm: RmsNorm::with_eps(&vars.pp("mlp_norm"), c.d_model, c.eps)?,
            w1: linear("w1", c.d_model, c.d_ff)?,
            w2: linear("w2", c.d_ff, c.d_model)?,
            w3: linear("w3", c.d_model, c.d_ff)?,
        })
    }
}

impl LlamaBlock {
    /// [`forward`](Module::forward) of the next positions of a sequence whose earlier ones
    /// this block has seen through `cache` ([`MultiHeadAttention::forward_cached`]: the
    /// attention's keys and values; the rest of the block is per position). Fed a sequence in
    /// chunks, the outputs joined are `forward` of the whole sequence within rounding.
    pub fn forward_cached<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        cache: &mut KvCache<O::T>,
    ) -> Result<Var<'g, O>> {
        let h = (x + &self
            .attn
            .forward_cached(&self.attn_norm.forward(x)?, cache)?)?;
        self.mlp(&h)
    }

    /// `h + w2(silu(w1(m)) · w3(m))`, `m = mlp_norm(h)`.
    fn mlp<'g, O: Train>(&self, h: &Var<'g, O>) -> Result<Var<'g, O>> {
        let m = self.mlp_norm.forward(h)?;
        let gated = (&self.w1.forward(&m)?.silu()? * &self.w3.forward(&m)?)?;
        h + &self.w2.forward(&gated)?
    }
}

impl Parameters for LlamaBlock {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.attn_norm.visit_params(f);
        self.attn.visit_params(f);
        self.mlp_norm.visit_params(f);
        self.w1.visit_params(f);
        self.w2.visit_params(f);
        self.w3.visit_params(f);
    }
}

impl<O: Train> Module<O> for LlamaBlock {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let h = (x + &self.attn.forward(&self.attn_norm.forward(x)?)?)?;
        self.mlp(&h)
    }
}
