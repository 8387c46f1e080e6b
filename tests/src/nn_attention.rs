//! The reference of tl-nn's cross-attention (`MultiHeadAttention::forward_qkv`) for the
//! layer check (`nn::LayerSpec::CrossAttention`), written another way than the layer composes
//! it: each batch element and each head on its own, the head's columns picked by a 0/1 matrix
//! (where the layer reshapes and swaps axes), the heads put back by its transpose and summed,
//! the batch elements joined by `concat`; rotary position embeddings as one block-diagonal
//! matrix of 2×2 rotations on each head's flattened (n·dh) queries and keys, where the layer
//! multiplies by cosine and sine tables and a pair-swapping matrix; a grouped layer's query
//! head picking its key/value head's columns, where the layer broadcasts each key/value head
//! to its group.

use tl_ir::{GraphBuilder, Id, Op};
use tl_nn::{Rope, RopeLayout};
use tl_spec::{Shape, Tensor};

/// A masked score's additive bias (the layer's too: a weight of 0 in f32 and f64).
const MASKED: f64 = -1e30;

/// The sizes of one cross-attention case.
#[derive(Debug, Clone, Copy)]
pub struct CrossSizes {
    /// Heads.
    pub heads: usize,
    /// Key/value heads (dividing `heads`; query head i reads key/value head i·kv_heads/heads).
    pub kv_heads: usize,
    /// Width per head.
    pub head_dim: usize,
    /// Queries.
    pub nq: usize,
    /// Keys (the memory's rows).
    pub nk: usize,
    /// Batch size, if the inputs have a batch axis.
    pub batch: Option<usize>,
    /// Rotary position embeddings of the queries and keys.
    pub rope: Option<Rope>,
    /// Query i attends to keys j ≤ i only (nq = nk).
    pub causal: bool,
}

/// The (n·dh, n·dh) matrix that rotates a head's flattened rows: at position p, the pair
/// (j₁, j₂) of angle index k turns by `p·base^(−2k/dh)`, `(x₁, x₂) ↦ (x₁ cos − x₂ sin,
/// x₂ cos + x₁ sin)`, as row vector times matrix.
fn rotation(rope: Rope, n: usize, dh: usize) -> Tensor<f64> {
    let pairs: Vec<(usize, usize, usize)> = (0..dh / 2)
        .map(|k| match rope.layout {
            RopeLayout::Interleaved => (2 * k, 2 * k + 1, k),
            RopeLayout::Halves => (k, k + dh / 2, k),
        })
        .collect();
    let w = n * dh;
    let mut r = vec![0.0; w * w];
    for p in 0..n {
        for &(a, b, k) in &pairs {
            let phi = p as f64 * rope.base.powf(-2.0 * k as f64 / dh as f64);
            let (ia, ib) = (p * dh + a, p * dh + b);
            r[ia * w + ia] = phi.cos();
            r[ib * w + ia] = -phi.sin();
            r[ib * w + ib] = phi.cos();
            r[ia * w + ib] = phi.sin();
        }
    }
    Tensor::new([w, w], r).expect("sized")
}

/// `t` (n, dh) rotated by [`rotation`]: flattened to one row, times the matrix, back.
fn rotated(b: &mut GraphBuilder, rope: Rope, t: Id, n: usize, dh: usize) -> tl_ir::Result<Id> {
    let row = b.apply(Op::Reshape(Shape::new(&[1, n * dh])), &[t])?;
    let r = b.apply(Op::Constant(rotation(rope, n, dh)), &[])?;
    let turned = b.apply(Op::Matmul, &[row, r])?;
    b.apply(Op::Reshape(Shape::new(&[n, dh])), &[turned])
}

/// `softmax(Q_h·K_hᵀ/√dh + bias)·V_h` per batch element and head, summed back into the model
/// width and projected by Wo: `w` are the leaves of Wq, Wk, Wv, Wo ((d, d), (d, kv·dh) twice,
/// (d, d), applied as `x·W`), `x` the queries' node ((nq, d) or (B, nq, d)), `memory` the
/// keys' and values' node ((nk, d) or (B, nk, d): a constant for cross-attention, `x` itself
/// for self-attention), `keep` the key mask (B·nk values, true = attend); with `causal`, query
/// i attends to keys j ≤ i only.
pub fn cross_attention_ref(
    b: &mut GraphBuilder,
    s: CrossSizes,
    w: &[Id],
    x: Id,
    memory: Id,
    keep: Option<&[bool]>,
) -> tl_ir::Result<Id> {
    let (h, dh, nq, nk) = (s.heads, s.head_dim, s.nq, s.nk);
    let (d, dkv) = (h * dh, s.kv_heads * dh);
    let batches = s.batch.unwrap_or(1);
    let flat = b.apply(Op::Reshape(Shape::new(&[batches * nq, d])), &[x])?;
    let flat_memory = b.apply(Op::Reshape(Shape::new(&[batches * nk, d])), &[memory])?;
    let mut joined: Option<Id> = None;
    for bi in 0..batches {
        let xb = b.apply(
            Op::Slice {
                start: bi * nq,
                len: nq,
            },
            &[flat],
        )?;
        let mb = b.apply(
            Op::Slice {
                start: bi * nk,
                len: nk,
            },
            &[flat_memory],
        )?;
        let q = b.apply(Op::Matmul, &[xb, w[0]])?;
        let k = b.apply(Op::Matmul, &[mb, w[1]])?;
        let v = b.apply(Op::Matmul, &[mb, w[2]])?;
        let allowed =
            |i: usize, j: usize| keep.is_none_or(|keep| keep[bi * nk + j]) && (!s.causal || j <= i);
        let bias = (keep.is_some() || s.causal).then(|| {
            Tensor::from_fn([nq, nk], |e| match allowed(e / nk, e % nk) {
                true => 0.0,
                false => MASKED,
            })
        });
        let mut heads: Option<Id> = None;
        for head in 0..h {
            // Column j of the (d, dh) picker is model column head·dh + j.
            let pick = Tensor::from_fn([d, dh], |e| {
                f64::from(u8::from(e / dh == head * dh + e % dh))
            });
            let put = tl_spec::ops::shape::transpose2d(&pick).expect("2-D");
            let pick = b.apply(Op::Constant(pick), &[])?;
            // Its key/value head's columns of K and V, (dkv, dh).
            let kv_head = head * s.kv_heads / h;
            let pick_kv = Tensor::from_fn([dkv, dh], |e| {
                f64::from(u8::from(e / dh == kv_head * dh + e % dh))
            });
            let pick_kv = b.apply(Op::Constant(pick_kv), &[])?;
            let mut qh = b.apply(Op::Matmul, &[q, pick])?;
            let mut kh = b.apply(Op::Matmul, &[k, pick_kv])?;
            if let Some(rope) = s.rope {
                qh = rotated(b, rope, qh, nq, dh)?;
                kh = rotated(b, rope, kh, nk, dh)?;
            }
            let vh = b.apply(Op::Matmul, &[v, pick_kv])?;
            let kt = b.apply(Op::Transpose2d, &[kh])?;
            let scores = b.apply(Op::Matmul, &[qh, kt])?;
            let mut scores = b.apply(Op::Scale(1.0 / (dh as f64).sqrt()), &[scores])?;
            if let Some(bias) = &bias {
                let bias = b.apply(Op::Constant(bias.clone()), &[])?;
                scores = b.apply(Op::Add, &[scores, bias])?;
            }
            let probs = b.apply(Op::Softmax, &[scores])?;
            let oh = b.apply(Op::Matmul, &[probs, vh])?;
            let put = b.apply(Op::Constant(put), &[])?;
            let back = b.apply(Op::Matmul, &[oh, put])?;
            heads = Some(match heads {
                Some(acc) => b.apply(Op::Add, &[acc, back])?,
                None => back,
            });
        }
        let heads = heads.expect("at least one head");
        let y = b.apply(Op::Matmul, &[heads, w[3]])?;
        joined = Some(match joined {
            Some(acc) => b.apply(Op::Concat, &[acc, y])?,
            None => y,
        });
    }
    let joined = joined.expect("at least one batch element");
    let out = match s.batch {
        Some(n) => vec![n, nq, d],
        None => vec![nq, d],
    };
    b.apply(Op::Reshape(Shape::new(&out)), &[joined])
}
