//! [`KvCache`] and [`MultiHeadAttention::forward_cached`]: a causal layer's attention over a
//! sequence given a chunk of positions at a time, the earlier positions' keys and values kept
//! between passes (generating a token at a time without recomputing the prefix).

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use super::cross_attention::Keys;
use super::{At, MultiHeadAttention};
use crate::{Result, Var};

/// The keys (rotated, where the layer has rotary embeddings) and the values a causal
/// [`MultiHeadAttention`] has computed for the positions seen so far, one (B, t, kv_heads, dh)
/// tensor each, kept on the host between passes. One cache per layer and sequence batch, and
/// one layout: the first chunk decides whether the cache takes batched (B, m, d) chunks or
/// unbatched (m, d) ones, and a chunk of the other layout is an error (until
/// [`clear`](Self::clear)). PyTorch: the `past_key_values` of Hugging Face's models,
/// torchtune's `KVCache`.
#[derive(Debug, Clone)]
pub struct KvCache<T: Scalar> {
    keys_values: Option<Cached<T>>,
}

/// The cached keys and values, (B, t, kv_heads, dh) each.
type KeysValues<T> = (Tensor<T>, Tensor<T>);

/// What a cache holds: the keys and values, and whether its chunks were batched (B, m, d),
/// not (m, d) (held as B = 1).
#[derive(Debug, Clone)]
struct Cached<T: Scalar> {
    keys_values: KeysValues<T>,
    batched: bool,
}

impl<T: Scalar> Default for KvCache<T> {
    fn default() -> Self {
        KvCache { keys_values: None }
    }
}

impl<T: Scalar> KvCache<T> {
    /// An empty cache: the next chunk starts at position 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The positions cached (where the next chunk starts).
    pub fn len(&self) -> usize {
        self.keys_values
            .as_ref()
            .map_or(0, |c| c.keys_values.0.shape().dims()[1])
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every position (a new sequence starts at position 0).
    pub fn clear(&mut self) {
        self.keys_values = None;
    }
}

impl MultiHeadAttention {
    /// The causal self-attention of `x`, (m, d) or (B, m, d), the next m positions of a
    /// sequence whose first `cache.len()` positions this layer has seen through `cache`: the
    /// new queries attend to the cached keys and values and to their own, position t + i
    /// seeing keys up to t + i (with [`rope`](Self::rope), rotated at their positions), and
    /// the new keys and values join the cache. Fed a sequence in chunks (of one token, when
    /// generating), the outputs joined are [`forward`](crate::Module::forward) of the whole
    /// sequence within rounding (`tests/nn/rnn.rs`, on four sessions). Every chunk runs the
    /// core `scaledDotProductAttention` of its m queries over the t + m keys, under the causal
    /// mask aligned at the bottom right ([`Mask::causal_lower_right`](tl_spec::ops::attention::Mask::causal_lower_right):
    /// on CUDA the flash kernels, the mask as its diagonal). Meant for inference: the cached keys and values enter each pass as
    /// constants, so no gradient reaches the earlier positions. Errors name the layer: a layer
    /// that is not causal, an input of the wrong width, a cache of another batch size or
    /// layer shape, a batched chunk for a cache of unbatched ones or the reverse; a chunk
    /// refused leaves the cache as it was.
    pub fn forward_cached<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        cache: &mut KvCache<O::T>,
    ) -> Result<Var<'g, O>> {
        let g = x.scope();
        let at = At::new(g.rt, self, &self.wq);
        let d = self.checked_width("MultiHeadAttention::forward_cached", &at)?;
        let (batch, m) = self.tokens(x, "forward_cached: ", &at)?;
        if !self.causal {
            return Err(at.input(
                "forward_cached needs a causal layer (a cached prefix sees no later position)",
            ));
        }
        let (b, t) = (batch.unwrap_or(1), cache.len());
        if let Some(c) = &cache.keys_values
            && c.batched != batch.is_some()
        {
            let layout = |batched: bool| match batched {
                true => format!("batched (B, n, {d})"),
                false => format!("unbatched (n, {d})"),
            };
            return Err(at.input(format!(
                "forward_cached: the cache holds {t} position(s) of {} chunks (keys {}), this input {} is {}: one cache takes chunks of one layout (clear it, or use a cache per layout)",
                layout(c.batched),
                c.keys_values.0.shape(),
                x.shape(),
                layout(batch.is_some())
            )));
        }
        let kv_dims = [b, t, self.kv_heads, d / self.heads];
        if let Some(Cached {
            keys_values: (k, _),
            ..
        }) = &cache.keys_values
            && k.shape().dims() != kv_dims
        {
            return Err(at.input(format!(
                "forward_cached: the cache holds keys {} where this input and layer need (B, t, kv_heads, dh) = {kv_dims:?}",
                k.shape()
            )));
        }
        let y = || -> Result<(Var<'g, O>, KeysValues<O::T>)> {
            let q = self.heads_of(x, &self.wq, (b, m), Some(t))?;
            let k = self.heads_of(x, &self.wk, (b, m), Some(t))?;
            let v = self.heads_of(x, &self.wv, (b, m), None)?;
            // (B, t, kv, dh) then (B, m, kv, dh): joined along the positions by swapping them
            // to the front, joining, and swapping back.
            let join = |old: &Tensor<O::T>, new: &Var<'g, O>| -> Result<Var<'g, O>> {
                let old = g.constant(old.clone())?.swap_adjacent(0)?;
                old.concat0(&new.swap_adjacent(0)?)?.swap_adjacent(0)
            };
            let (k, v) = match &cache.keys_values {
                Some(Cached {
                    keys_values: (kc, vc),
                    ..
                }) => (join(kc, &k)?, join(vc, &v)?),
                None => (k, v),
            };
            let kept = (k.value()?, v.value()?);
            let n = t + m;
            let causal = move |i: usize, j: usize| j <= t + i;
            let keys = Keys::Shared(&causal);
            let y = self.core_and_output((q, k, v), (batch, m, n), &keys)?;
            Ok((y, kept))
        };
        let (y, kept) = y().map_err(|e| at.op_error(e))?;
        cache.keys_values = Some(Cached {
            keys_values: kept,
            batched: batch.is_some(),
        });
        Ok(y)
    }
}
