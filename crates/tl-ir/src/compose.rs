//! Composite ops recorded from primitive ones.
//!
//! [`multi_head_attention`] records the same computation as [`Op::MultiHeadAttention`] from
//! `matmul`, `reshape`, `swapAdjacent`, `swapLastTwo`, `bmm`, `scale` and `maskedSoftmax` (or
//! `softmax` without a mask), [`scaled_dot_product_attention`] its core
//! ([`Op::ScaledDotProductAttention`]) from the same ops but `matmul`. They are the references
//! the fused ops are tested against, and forward mode through them is the attention ops' JVP
//! rule ([`multi_head_attention_jvp`], [`scaled_dot_product_attention_jvp`]).

use tl_spec::ops::attention::{Mask, mha, sdpa};
use tl_spec::{Scalar, Shape, Tensor};

use crate::{GraphBuilder, Id, Op, Result};

/// Record multi-head self-attention on `x` (n, dModel) or (B, n, dModel) with projections `wq`,
/// `wk`, `wv` (dModel, P) and `wo` (P, dModel), `heads` dividing P, and an optional hard mask
/// (n, n), as a composition of primitive ops. Errors are those of the fused op's shape rule.
/// PyTorch: the body of `F.multi_head_attention_forward` without biases or dropout.
#[allow(clippy::too_many_arguments)]
pub fn multi_head_attention(
    b: &mut GraphBuilder,
    wq: Id,
    wk: Id,
    wv: Id,
    wo: Id,
    x: Id,
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Id> {
    let fused = Op::MultiHeadAttention {
        heads,
        mask: mask.cloned(),
        fused: false,
    };
    let ids = [wq, wk, wv, wo, x];
    let shapes = ids
        .iter()
        .map(|&i| b.graph().shape(i).cloned())
        .collect::<Result<Vec<Shape>>>()?;
    let refs: Vec<&Shape> = shapes.iter().collect();
    let out_shape = fused.infer_shape(&refs)?;
    let (dm, _) = mha::mha_dims([refs[0], refs[1], refs[2], refs[3]], refs[4], heads, mask)?;
    let mha::Dims {
        batch, n, heads, d, ..
    } = dm;
    let sh = |dims: &[usize]| Op::Reshape(Shape::new(dims));
    let batched = shapes[4].rank() == 3;
    let rows = if batched {
        b.apply(sh(&[batch * n, dm.dm]), &[x])?
    } else {
        x
    };
    // (B·n, P) → (B, n, h, d) → (B, h, n, d) → (B·h, n, d)
    let mut split = |w: Id| -> Result<Id> {
        let t = b.apply(Op::Matmul, &[rows, w])?;
        let t = b.apply(sh(&[batch, n, heads, d]), &[t])?;
        let t = b.apply(Op::SwapAdjacent(1), &[t])?;
        b.apply(sh(&[batch * heads, n, d]), &[t])
    };
    let (q, k, v) = (split(wq)?, split(wk)?, split(wv)?);
    let c = heads_core(b, [q, k, v], dm, mask)?;
    let y = b.apply(Op::Matmul, &[c, wo])?;
    if batched {
        b.apply(Op::Reshape(out_shape), &[y])
    } else {
        Ok(y)
    }
}

/// The attention core on per-head Q (B·h, n, d), K and V (B·h, nk, d): `softmax(QKᵀ/√d)·V`
/// (masked, (n, nk) scores), merged back into (B·n, P).
fn heads_core(
    b: &mut GraphBuilder,
    [q, k, v]: [Id; 3],
    dm: mha::Dims,
    mask: Option<&Mask>,
) -> Result<Id> {
    let mha::Dims {
        batch,
        n,
        p,
        heads,
        d,
        ..
    } = dm;
    let sh = |dims: &[usize]| Op::Reshape(Shape::new(dims));
    let kt = b.apply(Op::SwapLastTwo, &[k])?;
    let s = b.apply(Op::Bmm, &[q, kt])?;
    let s = b.apply(Op::Scale(1.0 / (d as f64).sqrt()), &[s])?;
    let a = match mask {
        // A mask per batch element: the scores as (B, h, n, nk), matrix b for element b.
        Some(m) if m.batch() > 1 => {
            let s = b.apply(sh(&[batch, heads, n, dm.nk]), &[s])?;
            let a = b.apply(Op::MaskedSoftmax { mask: m.clone() }, &[s])?;
            b.apply(sh(&[batch * heads, n, dm.nk]), &[a])?
        }
        Some(m) => b.apply(Op::MaskedSoftmax { mask: m.clone() }, &[s])?,
        None => b.apply(Op::Softmax, &[s])?,
    };
    let o = b.apply(Op::Bmm, &[a, v])?;
    // (B·h, n, d) → (B, h, n, d) → (B, n, h, d) → (B·n, P)
    let o = b.apply(sh(&[batch, heads, n, d]), &[o])?;
    let o = b.apply(Op::SwapAdjacent(1), &[o])?;
    b.apply(sh(&[batch * n, p]), &[o])
}

/// Record `scaledDotProductAttention` on `q` ((n, P) or (B, n, P)), `k`, `v` ((nk, Pk) or
/// (B, nk, Pk)), heads merged, as a composition of primitive ops: the heads split out by
/// `reshape` and `swapAdjacent` (with fewer key heads, each repeated for its query heads by
/// `broadcastTo`, whose VJP sums their cotangents), then [`multi_head_attention`]'s core.
/// Errors are those of the fused op's shape rule.
pub fn scaled_dot_product_attention(
    b: &mut GraphBuilder,
    [q, k, v]: [Id; 3],
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Id> {
    let shapes = [q, k, v]
        .iter()
        .map(|&i| b.graph().shape(i).cloned())
        .collect::<Result<Vec<Shape>>>()?;
    let (dm, out_shape) = sdpa::sdpa_dims([&shapes[0], &shapes[1], &shapes[2]], heads, mask)?;
    let mha::Dims {
        batch,
        n,
        nk,
        heads,
        kv_heads,
        d,
        ..
    } = dm;
    let sh = |dims: &[usize]| Op::Reshape(Shape::new(dims));
    // (B, n, P) → (B, n, h, d) → (B, h, n, d) → (B·h, n, d); keys and values of kv_heads
    // first (B, nk, kv, 1, d) → (B, nk, kv, h/kv, d): each key head beside its query heads.
    let mut split = |t: Id, n: usize, of: usize| -> Result<Id> {
        let t = match of < heads {
            true => {
                let t = b.apply(sh(&[batch, n, of, 1, d]), &[t])?;
                let to = Shape::new(&[batch, n, of, heads / of, d]);
                b.apply(Op::BroadcastTo(to), &[t])?
            }
            false => t,
        };
        let t = b.apply(sh(&[batch, n, heads, d]), &[t])?;
        let t = b.apply(Op::SwapAdjacent(1), &[t])?;
        b.apply(sh(&[batch * heads, n, d]), &[t])
    };
    let (q, k, v) = (
        split(q, n, heads)?,
        split(k, nk, kv_heads)?,
        split(v, nk, kv_heads)?,
    );
    let c = heads_core(b, [q, k, v], dm, mask)?;
    b.apply(Op::Reshape(out_shape), &[c])
}

/// The JVP of `scaledDotProductAttention` at operands `x = [q, k, v]` along tangents `dx`:
/// forward mode ([`crate::GraphData::jvp`]) through [`scaled_dot_product_attention`].
pub fn scaled_dot_product_attention_jvp<T: Scalar>(
    x: &[&Tensor<T>],
    dx: &[&Tensor<T>],
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Tensor<T>> {
    jvp_through(x, dx, &[], |b, ids| match *ids {
        [q, k, v] => scaled_dot_product_attention(b, [q, k, v], heads, mask),
        _ => Err(arity("scaledDotProductAttention", 3, ids.len())),
    })
}

/// The JVP of `multiHeadAttention` at operands `x = [wq, wk, wv, wo, x]` along tangents `dx`:
/// forward mode ([`crate::GraphData::jvp`]) through [`multi_head_attention`].
pub fn multi_head_attention_jvp<T: Scalar>(
    x: &[&Tensor<T>],
    dx: &[&Tensor<T>],
    heads: usize,
    mask: Option<&Mask>,
    nats: &[usize],
) -> Result<Tensor<T>> {
    jvp_through(x, dx, nats, |b, ids| match *ids {
        [wq, wk, wv, wo, xi] => multi_head_attention(b, wq, wk, wv, wo, xi, heads, mask),
        _ => Err(arity("multiHeadAttention", 5, ids.len())),
    })
}

/// The arity error of `op`.
fn arity(op: &'static str, expected: usize, got: usize) -> crate::Error {
    crate::Error::Spec(tl_spec::Error::Arity { op, expected, got })
}

/// Forward mode at `x` along `dx` through the graph `record` builds on one leaf per operand
/// (returning its output id): the output's tangent.
fn jvp_through<T: Scalar>(
    x: &[&Tensor<T>],
    dx: &[&Tensor<T>],
    nats: &[usize],
    record: impl FnOnce(&mut GraphBuilder, &[Id]) -> Result<Id>,
) -> Result<Tensor<T>> {
    let mut b = GraphBuilder::new();
    let ids = x
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None))
        .collect::<Result<Vec<Id>>>()?;
    let out = record(&mut b, &ids)?;
    let leaves: Vec<Tensor<T>> = x.iter().map(|&t| t.clone()).collect();
    let tangents: Vec<Tensor<T>> = dx.iter().map(|&t| t.clone()).collect();
    let mut dots = b.finish().jvp(&leaves, nats, &tangents)?;
    Ok(dots.swap_remove(out))
}
