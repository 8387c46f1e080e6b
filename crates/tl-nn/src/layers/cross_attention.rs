//! [`MultiHeadAttention::forward_qkv`]: attention of queries over separate keys and values
//! (cross-attention: a decoder over an encoder's memory), and the attention of the layers with
//! rotary embeddings or grouped heads: the projections, then the catalogue's
//! `scaledDotProductAttention`.

use tl_session::Train;
use tl_spec::ops::attention::Mask;

use super::{At, MultiHeadAttention};
use crate::{Result, Var};

impl MultiHeadAttention {
    /// Attention of `query` over `key` and `value` (cross-attention: `key` = `value` = an
    /// encoder's output): `Q = query·Wq`, `K = key·Wk`, `V = value·Wv`, per head
    /// `softmax(QKᵀ/√(d/heads))·V`, heads concatenated, `·Wo`. `query` is (nq, d) or (B, nq,
    /// d); `key` and `value` are (nk, d) or (B, nk, d), the same rank and batch as `query`.
    /// `key_keep` (true = attend) masks keys: nk values shared by the batch, or B·nk (batch
    /// element b's keys at b·nk..); with [`causal`](Self::causal), query i sees keys j ≤ i
    /// (nq = nk). A query left with no key to attend to is an error (PyTorch gives NaN). With
    /// [`rope`](Self::rope), queries and keys are rotated by their positions (0, 1, … along
    /// each); a [`grouped`](Self::grouped) layer's key/value heads each serve their group of
    /// query heads. The output has `query`'s shape. PyTorch: `mha(query, key, value,
    /// key_padding_mask=~keep, need_weights=False)` with `nn.MultiheadAttention(d, heads,
    /// bias=False, batch_first=True)`.
    ///
    /// The projections are `matmul`s (and the rotations, with rope, products with constant
    /// tables); the core is the catalogue's `scaledDotProductAttention` over the nk keys, its
    /// mask shared by the batch or (a key mask per batch element) one matrix per element,
    /// fused as [`flash`](Self::flash) says (on CUDA the flash kernels: O((nq + nk)·d) memory,
    /// never the (B·heads, nq, nk) scores). It runs on every backend and in the linked session;
    /// with `query` = `key` = `value` it is the layer's forward within rounding
    /// (`tests/nn/rnn.rs`, beside PyTorch's values and gradients).
    pub fn forward_qkv<'g, O: Train>(
        &self,
        query: &Var<'g, O>,
        key: &Var<'g, O>,
        value: &Var<'g, O>,
        key_keep: Option<&[bool]>,
    ) -> Result<Var<'g, O>> {
        let (at, (batch, nq, nk)) = self.qkv_sizes(query, key, value)?;
        let b = batch.unwrap_or(1);
        if self.causal && nq != nk {
            return Err(at.input(format!(
                "a causal layer attends {nq} queries over {nk} keys: causal needs as many of \
                 each (forward_qkv_masked takes Mask::causal_lower_right or causal_upper_left)"
            )));
        }
        if let Some(keep) = key_keep
            && keep.len() != nk
            && keep.len() != b * nk
        {
            return Err(at.input(format!(
                "key_keep has {} value(s): need {nk} (one per key) or {} (per batch element)",
                keep.len(),
                b * nk
            )));
        }
        let causal = self.causal;
        let shared = |i: usize, j: usize| key_keep.is_none_or(|k| k[j]) && (!causal || j <= i);
        let per_batch = |bi: usize, i: usize, j: usize| {
            key_keep.is_some_and(|k| k[bi * nk + j]) && (!causal || j <= i)
        };
        let keys = match key_keep {
            None if !causal => Keys::All,
            Some(k) if k.len() != nk => Keys::PerBatch(&per_batch),
            _ => Keys::Shared(&shared),
        };
        self.attend((query, key, value), (batch, nq, nk), keys, &at)
    }

    /// [`forward_qkv`](Self::forward_qkv) under an explicit attention mask (true = attend):
    /// one (nq, nk) matrix shared by the batch, or one per batch element ([`Mask::batched`]
    /// over the B of `query`). The mask is the whole rule, as PyTorch's `attn_mask` is: the
    /// layer's [`causal`](Self::causal) flag does not add to it. For queries that are the last
    /// nq positions of the keys' sequence (a chunk of a prompt over its prefix) the causal
    /// mask is [`Mask::causal_lower_right`]`(nq, nk)`; PyTorch's `is_causal` over keys of
    /// another length is [`Mask::causal_upper_left`]`(nq, nk)`. A causal or key-padding mask
    /// runs the flash kernels on CUDA as the layer's own masks do. A mask of other sizes or
    /// batch, or a query left with no key (PyTorch gives NaN), is an error naming the layer.
    /// PyTorch: `mha(query, key, value, attn_mask=~mask, need_weights=False)` (a batched
    /// mask: PyTorch's (B·heads, nq, nk) with each element's matrix repeated over its heads).
    pub fn forward_qkv_masked<'g, O: Train>(
        &self,
        query: &Var<'g, O>,
        key: &Var<'g, O>,
        value: &Var<'g, O>,
        mask: &Mask,
    ) -> Result<Var<'g, O>> {
        let (at, (batch, nq, nk)) = self.qkv_sizes(query, key, value)?;
        let b = batch.unwrap_or(1);
        if (mask.rows(), mask.cols()) != (nq, nk) || (mask.batch() != 1 && mask.batch() != b) {
            return Err(at.input(format!(
                "forward_qkv_masked: the mask is {} matrix(es) of {}×{} where the inputs need \
                 (nq, nk) = ({nq}, {nk}), one matrix or one per batch element ({b})",
                mask.batch(),
                mask.rows(),
                mask.cols()
            )));
        }
        self.attend((query, key, value), (batch, nq, nk), Keys::Mask(mask), &at)
    }

    /// The layer's error context (on the operands' runtime) and the batch (`None`: unbatched),
    /// query and key counts of `forward_qkv`'s operands ([`qkv_shapes`]).
    fn qkv_sizes<'a, 'g: 'a, O: Train>(
        &'a self,
        query: &Var<'g, O>,
        key: &Var<'g, O>,
        value: &Var<'g, O>,
    ) -> Result<(At<'a, O>, QkvSizes)> {
        let at = At::new(query.scope().rt, self, &self.wq);
        let d = self.checked_width("MultiHeadAttention::forward_qkv", &at)?;
        let sizes = qkv_shapes(d, query, key, value, &at)?;
        Ok((at, sizes))
    }

    /// The attention of [`forward_qkv`](Self::forward_qkv) with its shapes checked: the
    /// projections, the rotations with [`rope`](Self::rope), then the core, the op
    /// `scaledDotProductAttention` under `keys`' mask. A query left with no key is an error naming the layer.
    pub(super) fn attend<'g, O: Train>(
        &self,
        (query, key, value): (&Var<'g, O>, &Var<'g, O>, &Var<'g, O>),
        (batch, nq, nk): (Option<usize>, usize, usize),
        keys: Keys<'_>,
        at: &At<'_, O>,
    ) -> Result<Var<'g, O>> {
        let b = batch.unwrap_or(1);
        keys.check_every_query_has_a_key(b, nq, nk, at)?;
        let y = || -> Result<Var<'g, O>> {
            let q = self.heads_of(query, &self.wq, (b, nq), Some(0))?;
            let k = self.heads_of(key, &self.wk, (b, nk), Some(0))?;
            let v = self.heads_of(value, &self.wv, (b, nk), None)?;
            self.core_and_output((q, k, v), (batch, nq, nk), &keys)
        };
        y().map_err(|e| at.op_error(e))
    }

    /// `x` (\[B,\] n, d) projected by `w` into (B, n, heads, dh) (W's heads: `heads`, or
    /// `kv_heads` for wk and wv), rotated with [`rope`](Self::rope) from position `start`
    /// where that is given.
    pub(super) fn heads_of<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        w: &tl_session::Param,
        (b, n): (usize, usize),
        start: Option<usize>,
    ) -> Result<Var<'g, O>> {
        let d = self.wq.shape().dims()[0];
        let dh = d / self.heads;
        let heads = w.shape().dims()[1] / dh;
        let t = x
            .reshape(&[b * n, d])?
            .matmul(&x.scope().param(w)?)?
            .reshape(&[b, n, heads, dh])?;
        match (&self.rope, start) {
            (Some(rope), Some(start)) => rope.rotate(&t, start),
            _ => Ok(t),
        }
    }

    /// The core `scaledDotProductAttention` on Q (B, nq, heads, dh) and K, V (B, nk, kv_heads,
    /// dh) with the heads merged (each key head serving its group of query heads in the op
    /// itself: no copy per query head), under `keys`' mask, then `·Wo`: (\[B,\] nq, d) as
    /// `batch` says.
    pub(super) fn core_and_output<'g, O: Train>(
        &self,
        (q, k, v): (Var<'g, O>, Var<'g, O>, Var<'g, O>),
        (batch, nq, nk): (Option<usize>, usize, usize),
        keys: &Keys<'_>,
    ) -> Result<Var<'g, O>> {
        let g = q.scope();
        let (b, d, h) = (batch.unwrap_or(1), self.wq.shape().dims()[0], self.heads);
        let mask = keys.mask(b, nq, nk)?;
        // (B, n, kv_heads·dh) with the heads merged, as the op takes them.
        let pk = self.kv_heads * (d / h);
        let [k, v] = [k, v].map(|t| t.reshape(&[b, nk, pk]));
        let c = q.reshape(&[b, nq, d])?.scaled_dot_product_attention(
            &k?,
            &v?,
            h,
            mask.as_ref(),
            self.flash,
        )?;
        let out = c.reshape(&[b * nq, d])?.matmul(&g.param(&self.wo)?)?;
        match batch {
            Some(b) => out.reshape(&[b, nq, d]),
            None => out.reshape(&[nq, d]),
        }
    }
}

/// Which keys each query may attend to.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a> {
    /// Every key.
    All,
    /// `allowed(i, j)`: query i may attend to key j, in every batch element.
    Shared(&'a dyn Fn(usize, usize) -> bool),
    /// The (nq, nk) mask, shared by every batch element or one matrix per element (taken by
    /// the op as it is).
    Mask(&'a Mask),
    /// `allowed(b, i, j)`: query i of batch element b may attend to key j.
    PerBatch(&'a dyn Fn(usize, usize, usize) -> bool),
}

impl Keys<'_> {
    /// Whether query i of batch element b may attend to key j.
    fn allowed(&self, b: usize, i: usize, j: usize) -> bool {
        match self {
            Keys::All => true,
            Keys::Shared(f) => f(i, j),
            Keys::Mask(m) => m.allowed_in(b, i, j),
            Keys::PerBatch(f) => f(b, i, j),
        }
    }

    /// An error naming the layer for a query with no key left (the op would give it zeros,
    /// PyTorch NaN).
    fn check_every_query_has_a_key<O: Train>(
        &self,
        b: usize,
        nq: usize,
        nk: usize,
        at: &At<'_, O>,
    ) -> Result<()> {
        let batches = match self {
            Keys::All => return Ok(()),
            Keys::Shared(_) => 1,
            Keys::Mask(m) => m.batch(),
            Keys::PerBatch(_) => b,
        };
        for bi in 0..batches {
            for i in 0..nq {
                if !(0..nk).any(|j| self.allowed(bi, i, j)) {
                    return Err(at.input(format!(
                        "query {i} of batch element {bi} has no key to attend to (the mask hides them all)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The mask of `scaledDotProductAttention` over `b` batch elements of nq queries and nk
    /// keys (`None`: every key): one (nq, nk) matrix for every batch element, or one per
    /// element for `PerBatch`. A causal or key-padding mask is recognized when it is made
    /// ([`Mask::form`]): the flash kernels take it in O(b·nk) words.
    fn mask(&self, b: usize, nq: usize, nk: usize) -> Result<Option<Mask>> {
        Ok(match self {
            Keys::All => None,
            Keys::Shared(f) => Some(Mask::from_fn_rectangular(nq, nk, f)?),
            Keys::Mask(m) => Some((*m).clone()),
            Keys::PerBatch(f) => Some(Mask::from_fn_batched(b, nq, nk, f)?),
        })
    }
}

/// The batch (`None`: unbatched), query count and key count of attention's operands.
type QkvSizes = (Option<usize>, usize, usize);

/// The batch (None: unbatched), query count and key count of `forward_qkv`'s operands: query
/// (nq, d) or (B, nq, d); key and value of one shape, (nk, d) or (B, nk, d) as the query.
fn qkv_shapes<O: Train>(
    d: usize,
    query: &Var<'_, O>,
    key: &Var<'_, O>,
    value: &Var<'_, O>,
    at: &At<'_, O>,
) -> Result<QkvSizes> {
    let shapes = || {
        format!(
            "query {}, key {}, value {}",
            query.shape(),
            key.shape(),
            value.shape()
        )
    };
    if key.shape() != value.shape() {
        return Err(at.input(format!("key and value must have one shape: {}", shapes())));
    }
    match (query.dims(), key.dims()) {
        ([nq, wq], [nk, wk]) if *wq == d && *wk == d => Ok((None, *nq, *nk)),
        ([bq, nq, wq], [bk, nk, wk]) if *wq == d && *wk == d && bq == bk => {
            Ok((Some(*bq), *nq, *nk))
        }
        _ => Err(at.input(format!(
            "need query (nq, {d}) or (B, nq, {d}) and key, value (nk, {d}) or (B, nk, {d}) alike: {}",
            shapes()
        ))),
    }
}
