//! Case generators for the attention family: `maskedSoftmax`, `multiHeadAttention` and
//! `scaledDotProductAttention` (masked or not, fused or not), at small sizes (n ≤ 4, dModel ≤
//! 6, heads ∈ {1, 2}).

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};

use crate::generate::{Size, tensor, tensors};
use crate::{Domain, OpCase};

/// A random mask of `batch` (rows, cols) matrices (rows with nothing allowed included).
fn mask(batch: usize, rows: usize, cols: usize) -> BoxedStrategy<Mask> {
    prop::collection::vec(any::<bool>(), batch * rows * cols)
        .prop_map(move |v| Mask::batched(batch, rows, cols, v).expect("batch·rows·cols entries"))
        .boxed()
}

/// `maskedSoftmax` on (…, n, m) with 0–2 leading axes, n 1–4 (large: up to 12), m = n (square
/// scores) or drawn as n is; with leading axes, one case in two a batched mask (a matrix per
/// element of the first axis).
pub fn masked_softmax(z: Size) -> BoxedStrategy<OpCase> {
    let side = 1..=z.pick(4, 12);
    let cols = prop::option::of(side.clone());
    let lead = prop::collection::vec(1usize..=3, 0..=2);
    (side, cols, lead, any::<bool>())
        .prop_flat_map(|(n, m, lead, batched)| {
            let m = m.unwrap_or(n);
            let mb = lead.first().copied().filter(|_| batched).unwrap_or(1);
            let dims: Vec<usize> = lead.into_iter().chain([n, m]).collect();
            (mask(mb, n, m), tensor(Shape::from(dims), Domain::Any(3.0)))
        })
        .prop_map(|(mask, x)| OpCase::new(Op::MaskedSoftmax { mask }, vec![x]))
        .boxed()
}

/// (n, dModel, heads, head width, batch) of an attention case.
type Sizes = (usize, usize, usize, usize, Option<usize>);

/// The sizes of an attention case: (n, dModel, heads, head width, batch), masked, fused. n
/// 1–4, dModel 1–6, heads 1–2, head width 1–3 (large: n ≤ 16, dModel ≤ 16, head width ≤ 4),
/// unbatched or batched (B ≤ 2). One case in five has n 15–18 (large: 15–34): past the CUDA
/// flash kernels' tile of 16 query rows and keys, so its last tile is partial (small: then
/// unbatched, every operand within 128 elements).
fn sizes(z: Size) -> impl Strategy<Value = (Sizes, bool, bool)> {
    let sizes = (
        prop_oneof![4 => 1..=z.pick(4, 16), 1 => 15..=z.pick(18, 34)],
        1..=z.pick(6, 16),
        1usize..=2,
        1..=z.pick(3, 4),
        prop::option::of(1usize..=2),
    );
    (sizes, any::<bool>(), any::<bool>()).prop_map(move |((n, dm, h, d, batch), m, f)| {
        ((n, dm, h, d, unbatched_past(z, n, batch)), m, f)
    })
}

/// `batch`, or `None` for a small case of a length `n` past the tile (so that its operands
/// stay within the small cases' 128 elements).
fn unbatched_past(z: Size, n: usize, batch: Option<usize>) -> Option<usize> {
    batch.filter(|_| n <= z.pick(4, usize::MAX))
}

/// An (n, nk) mask as `Some` (shared by the batch, or one case in two of a `batch` ≥ 2 a
/// matrix per batch element), or `None`.
fn maybe_mask(
    batch: Option<usize>,
    n: usize,
    nk: usize,
    masked: bool,
) -> BoxedStrategy<Option<Mask>> {
    let per_element = batch.filter(|&b| b > 1);
    match (masked, per_element) {
        (false, _) => Just(None).boxed(),
        (true, None) => mask(1, n, nk).prop_map(Some).boxed(),
        (true, Some(b)) => prop_oneof![Just(1), Just(b)]
            .prop_flat_map(move |mb| mask(mb, n, nk))
            .prop_map(Some)
            .boxed(),
    }
}

/// `multiHeadAttention(wq, wk, wv, wo, x)`: n 1–4, dModel 1–6, heads 1–2, head width 1–3
/// (large: n ≤ 16, dModel ≤ 16, head width ≤ 4), x unbatched or batched (B ≤ 2), one case in
/// five with n 15–18 (large: 15–34), past the flash kernels' tile; with or without a mask (a
/// matrix per batch element one case in two where B ≥ 2), fused or not.
pub fn multi_head_attention(z: Size) -> BoxedStrategy<OpCase> {
    sizes(z)
        .prop_flat_map(|((n, dm, heads, d, batch), masked, fused)| {
            let p = heads * d;
            let x = match batch {
                None => Shape::new(&[n, dm]),
                Some(b) => Shape::new(&[b, n, dm]),
            };
            let w = Shape::new(&[dm, p]);
            let ws = vec![w.clone(), w.clone(), w, Shape::new(&[p, dm])];
            (
                Just((heads, fused)),
                maybe_mask(batch, n, n, masked),
                tensors(ws, Domain::Any(1.0)),
                tensor(x, crate::ANY),
            )
        })
        .prop_map(
            |((heads, fused), mask, mut w, x): (_, _, Vec<Tensor<f64>>, _)| {
                w.push(x);
                let op = Op::MultiHeadAttention { heads, mask, fused };
                OpCase::new(op, w)
            },
        )
        .boxed()
}

/// `scaledDotProductAttention(q, k, v)` on (n, P) or (B, n, P) queries at the sizes of
/// [`multi_head_attention`] (P = heads × head width), with as many keys and values or, one case
/// in two, nk drawn as n is (past the tile one case in five: a long cache under one query,
/// or more queries than keys); one case in three grouped-query attention (the drawn heads are
/// the key heads, each serving two query heads: 2 over 1 or 4 over 2; not in a small case past
/// the tile); with or without an
/// (n, nk) mask, fused or not. The operands are drawn at the scale of `multiHeadAttention`'s
/// projections (entries within ±2), so that scores spread the softmax without saturating it.
pub fn scaled_dot_product_attention(z: Size) -> BoxedStrategy<OpCase> {
    let keys = prop::option::of(prop_oneof![4 => 1..=z.pick(4, 16), 1 => 15..=z.pick(18, 34)]);
    let group = prop_oneof![2 => Just(1usize), 1 => Just(2usize)];
    (sizes(z), keys, group)
        .prop_flat_map(
            move |(((n, _, kv_heads, d, batch), masked, fused), nk, group)| {
                let nk = nk.unwrap_or(n);
                // A small case past the tile keeps one query head per key head (its operands
                // within the small cases' 128 elements).
                let group = group.min(match n.max(nk) <= z.pick(4, usize::MAX) {
                    true => 2,
                    false => 1,
                });
                let heads = kv_heads * group;
                let (p, pk) = (heads * d, kv_heads * d);
                let batch = unbatched_past(z, nk, batch);
                let rows = |n: usize, p: usize| match batch {
                    None => Shape::new(&[n, p]),
                    Some(b) => Shape::new(&[b, n, p]),
                };
                let qkv = vec![rows(n, p), rows(nk, pk), rows(nk, pk)];
                (
                    Just((heads, fused)),
                    maybe_mask(batch, n, nk, masked),
                    tensors(qkv, Domain::Any(2.0)),
                )
            },
        )
        .prop_map(|((heads, fused), mask, qkv)| {
            OpCase::new(Op::ScaledDotProductAttention { heads, mask, fused }, qkv)
        })
        .boxed()
}
