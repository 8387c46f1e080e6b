//! [`MultiHeadAttention::forward_qkv`]: attention of queries over separate keys and values
//! (cross-attention: a decoder over an encoder's memory), composed from catalogue ops.

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use super::{At, MultiHeadAttention};
use crate::{Result, Var};

/// What a masked score becomes: far enough below any score that its weight is 0 in f32 and
/// f64 (e^(−1e30 − m) underflows), finite so that nothing turns into NaN.
const MASKED: f64 = -1e30;

impl MultiHeadAttention {
    /// Attention of `query` over `key` and `value` (cross-attention: `key` = `value` = an
    /// encoder's output): `Q = query·Wq`, `K = key·Wk`, `V = value·Wv`, per head
    /// `softmax(QKᵀ/√(d/heads))·V`, heads concatenated, `·Wo`. `query` is (nq, d) or (B, nq,
    /// d); `key` and `value` are (nk, d) or (B, nk, d), the same rank and batch as `query`.
    /// `key_keep` (true = attend) masks keys: nk values shared by the batch, or B·nk (batch
    /// element b's keys at b·nk..); with [`causal`](Self::causal), query i sees keys j ≤ i
    /// (nq = nk). A query left with no key to attend to is an error (PyTorch gives NaN). With
    /// [`rope`](Self::rope), queries and keys are rotated by their positions (0, 1, … along
    /// each). The output has `query`'s shape. PyTorch: `mha(query, key, value,
    /// key_padding_mask=~keep, need_weights=False)` with `nn.MultiheadAttention(d, heads,
    /// bias=False, batch_first=True)`.
    ///
    /// Composed from `matmul`, `swapAdjacent`, `bmm`, `softmax` and a constant score bias for
    /// the mask (the attention op of the catalogue, which [`forward`](crate::Module::forward)
    /// runs, takes one input), so it runs on every backend and in the linked session, and
    /// keeps the (B·heads, nq, nk) scores where the fused op does not; with `query` = `key` =
    /// `value` it is the layer's forward within rounding (`tests/nn/rnn.rs`, beside PyTorch's
    /// values and gradients).
    pub fn forward_qkv<'g, O: Train>(
        &self,
        query: &Var<'g, O>,
        key: &Var<'g, O>,
        value: &Var<'g, O>,
        key_keep: Option<&[bool]>,
    ) -> Result<Var<'g, O>> {
        let g = query.scope();
        let at = At::new(g.rt, self, &self.wq);
        let d = self.wq.shape().dims()[0];
        let (batch, nq, nk) = qkv_shapes(d, query, key, value, &at)?;
        let b = batch.unwrap_or(1);
        if self.causal && nq != nk {
            return Err(at.input(format!(
                "a causal layer attends {nq} queries over {nk} keys: causal needs as many of each"
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
        let allowed = |bi: usize, i: usize, j: usize| {
            let kept = key_keep.is_none_or(|k| if k.len() == nk { k[j] } else { k[bi * nk + j] });
            kept && (!self.causal || j <= i)
        };
        let masked = key_keep.is_some() || self.causal;
        let allowed: Option<&Allowed<'_>> = masked.then_some(&allowed);
        self.composed((query, key, value), (batch, nq, nk), allowed, &at)
    }

    /// The attention composed from catalogue ops (see [`forward_qkv`](Self::forward_qkv)), the
    /// shapes checked: `allowed(b, i, j)` says whether query i of batch element b may attend
    /// to key j (`None`: every key), and the queries and keys are rotated first with
    /// [`rope`](Self::rope).
    pub(super) fn composed<'g, O: Train>(
        &self,
        (query, key, value): (&Var<'g, O>, &Var<'g, O>, &Var<'g, O>),
        (batch, nq, nk): (Option<usize>, usize, usize),
        allowed: Option<&Allowed<'_>>,
        at: &At<'_, O>,
    ) -> Result<Var<'g, O>> {
        let g = query.scope();
        let d = self.wq.shape().dims()[0];
        let b = batch.unwrap_or(1);
        let bias = allowed
            .map(|allowed| score_bias::<O>(b, nq, nk, allowed, at))
            .transpose()?;
        let (h, dh) = (self.heads, d / self.heads);
        let y = || -> Result<Var<'g, O>> {
            // (B·n, d)·W → (B, n, h, dh) → (B, h, n, dh) → (B·h, n, dh).
            let split = |x: &Var<'g, O>, w: &tl_session::Param, n: usize| -> Result<Var<'g, O>> {
                x.reshape(&[b * n, d])?
                    .matmul(&g.param(w)?)?
                    .reshape(&[b, n, h, dh])?
                    .swap_adjacent(1)?
                    .reshape(&[b * h, n, dh])
            };
            let mut q = split(query, &self.wq, nq)?;
            let mut k = split(key, &self.wk, nk)?;
            let v = split(value, &self.wv, nk)?;
            if let Some(rope) = &self.rope {
                q = rope.rotate(&q)?;
                k = rope.rotate(&k)?;
            }
            let mut scores = q
                .bmm(&k.swap_last_two()?)?
                .scale(1.0 / (dh as f64).sqrt())?;
            if let Some(bias) = bias {
                // (B, h, nq, nk) + the (B, 1, nq, nk) bias, broadcast over the heads.
                let bias = g.constant(bias)?;
                scores = (&scores.reshape(&[b, h, nq, nk])? + &bias)?.reshape(&[b * h, nq, nk])?;
            }
            let out = scores
                .softmax()?
                .bmm(&v)?
                .reshape(&[b, h, nq, dh])?
                .swap_adjacent(1)?
                .reshape(&[b * nq, d])?
                .matmul(&g.param(&self.wo)?)?;
            match batch {
                Some(b) => out.reshape(&[b, nq, d]),
                None => out.reshape(&[nq, d]),
            }
        };
        y().map_err(|e| at.op_error(e))
    }
}

/// Whether query i of batch element b may attend to key j: `allowed(b, i, j)`.
pub(super) type Allowed<'a> = dyn Fn(usize, usize, usize) -> bool + 'a;

/// The scores' additive mask, (B, 1, nq, nk): 0 where `allowed`, [`MASKED`] elsewhere; an
/// error naming the layer for a query with no key left.
fn score_bias<O: Train>(
    b: usize,
    nq: usize,
    nk: usize,
    allowed: &Allowed<'_>,
    at: &At<'_, O>,
) -> Result<Tensor<O::T>> {
    for bi in 0..b {
        for i in 0..nq {
            if !(0..nk).any(|j| allowed(bi, i, j)) {
                return Err(at.input(format!(
                    "query {i} of batch element {bi} has no key to attend to (the mask hides them all)"
                )));
            }
        }
    }
    Ok(Tensor::try_from_fn(
        "MultiHeadAttention (composed)",
        [b, 1, nq, nk],
        |e| {
            let (bi, i, j) = (e / (nq * nk), e / nk % nq, e % nk);
            O::T::lit(if allowed(bi, i, j) { 0.0 } else { MASKED })
        },
    )?)
}

/// The batch (None: unbatched), query count and key count of `forward_qkv`'s operands: query
/// (nq, d) or (B, nq, d); key and value of one shape, (nk, d) or (B, nk, d) as the query.
fn qkv_shapes<O: Train>(
    d: usize,
    query: &Var<'_, O>,
    key: &Var<'_, O>,
    value: &Var<'_, O>,
    at: &At<'_, O>,
) -> Result<(Option<usize>, usize, usize)> {
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
