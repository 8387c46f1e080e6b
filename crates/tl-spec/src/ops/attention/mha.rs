//! Multi-head self-attention, `(wq, wk, wv, wo, x) ↦ y`, written as naive loops.
//!
//! x is (n, dModel) or batched (B, n, dModel); wq, wk, wv are (dModel, P) and wo (P, dModel) with
//! P = heads·headDim. Q, K, V = x·W (no biases); head h uses columns h·d..(h+1)·d (the reshape
//! (n, P) → (n, heads, d) → (heads, n, d)); per head A = maskedSoftmax(Q Kᵀ/√d) and O = A·V;
//! the heads are concatenated back into C (n, P) and y = C·wo.
//!
//! The JVP is taken by forward mode through the composition (`tl_ir::compose`), not here.

use super::{Mask, check_mask, sdpa};
use crate::ops::linalg::gemm;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// The op's name, in its errors.
const OP: &str = "multiHeadAttention";

/// `a·b` zeros (a buffer of the op), an error naming the op.
fn zeros<T: Scalar>(what: &str, a: usize, b: usize) -> Result<Vec<T>> {
    sdpa::zeros(OP, what, a, b)
}

/// The sizes of one attention application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Batch size (1 when x is unbatched).
    pub batch: usize,
    /// Sequence length n (the queries).
    pub n: usize,
    /// The keys (and values): n for `multiHeadAttention` (self-attention); for
    /// `scaledDotProductAttention`, k's length.
    pub nk: usize,
    /// Model width dModel (for `scaledDotProductAttention`, which has none, P).
    pub dm: usize,
    /// Projection width P = heads·d.
    pub p: usize,
    /// Number of heads (of the queries).
    pub heads: usize,
    /// Number of key and value heads: `heads` for `multiHeadAttention`; for
    /// `scaledDotProductAttention`, k's width over d, a divisor of `heads` (grouped-query
    /// attention: query head h reads key head [`Dims::kv_head`]`(h)`).
    pub kv_heads: usize,
    /// Head width d.
    pub d: usize,
}

impl Dims {
    /// The width of a row of K and V: `kv_heads·d` (P when every query head has its own).
    pub fn pk(&self) -> usize {
        self.kv_heads * self.d
    }

    /// The key and value head query head `h` reads ([`kv_head`]).
    pub fn kv_head(&self, h: usize) -> usize {
        kv_head(h, self.heads, self.kv_heads)
    }
}

/// The key and value head that query head `h` of `heads` reads among `kv_heads` (dividing
/// `heads`): `h / (heads / kv_heads)`, so that each key head serves a run of consecutive query
/// heads (PyTorch's `enable_gqa`, which repeats each key head `heads / kv_heads` times with
/// `repeat_interleave`). The one rule of grouped-query attention: the spec, the CUDA device's
/// flash sizes and its grouped products read it here (`tl_fa_kv_head` and `mat_at` in
/// `kernels/` are its device twins).
pub fn kv_head(h: usize, heads: usize, kv_heads: usize) -> usize {
    h / (heads / kv_heads.max(1)).max(1)
}

/// Shape rule of `multiHeadAttention(wq, wk, wv, wo, x)` with the static `heads` and `mask`;
/// returns the sizes and the output shape (x's).
pub fn mha_dims(
    w: [&Shape; 4],
    x: &Shape,
    heads: usize,
    mask: Option<&Mask>,
) -> Result<(Dims, Shape)> {
    let op = OP;
    let (batch, n, dm) = match *x.dims() {
        [n, dm] => (1, n, dm),
        [b, n, dm] => (b, n, dm),
        _ => {
            return Err(Error::shape(
                op,
                format!("x must be (n, dModel) or (B, n, dModel), got {x}"),
            ));
        }
    };
    if n == 0 {
        return Err(Error::shape(
            op,
            format!("the sequence is empty (x {x}): no key to attend to"),
        ));
    }
    let [wq, wk, wv, wo] = w;
    let p = match *wq.dims() {
        [r, p] if r == dm => p,
        _ => {
            return Err(Error::shape(
                op,
                format!("wq must be (dModel = {dm}, P) for x {x}, got {wq}"),
            ));
        }
    };
    for (name, s) in [("wk", wk), ("wv", wv)] {
        if s.dims() != [dm, p] {
            return Err(Error::shape(
                op,
                format!("{name} must be ({dm}, {p}) like wq, got {s}"),
            ));
        }
    }
    if wo.dims() != [p, dm] {
        return Err(Error::shape(
            op,
            format!("wo must be (P = {p}, dModel = {dm}), got {wo}"),
        ));
    }
    if heads == 0 || p == 0 || p % heads != 0 {
        return Err(Error::param(
            op,
            format!("heads = {heads} must be ≥ 1 and divide the projection width P = {p} > 0"),
        ));
    }
    if let Some(m) = mask {
        check_mask(op, m, Some(batch), n, n)?;
    }
    let dims = Dims {
        batch,
        n,
        nk: n,
        dm,
        p,
        heads,
        kv_heads: heads,
        d: p / heads,
    };
    Ok((dims, x.clone()))
}

/// Q, K, V of all rows (B·n, P).
fn projections<T: Scalar>(dm: &Dims, w: [&Tensor<T>; 3], x: &Tensor<T>) -> Result<[Vec<T>; 3]> {
    let rows = dm.batch * dm.n;
    let project = |w: &Tensor<T>| -> Result<Vec<T>> {
        let mut o = zeros("projection", rows, dm.p)?;
        gemm(
            x.data(),
            false,
            w.data(),
            false,
            rows,
            dm.dm,
            dm.p,
            &mut o,
            true,
        );
        Ok(o)
    };
    Ok([project(w[0])?, project(w[1])?, project(w[2])?])
}

/// Multi-head self-attention. PyTorch: `nn.MultiheadAttention(dModel, heads, bias=False)` in
/// self-attention with `in_proj` = [wqᵀ; wkᵀ; wvᵀ], `out_proj` = woᵀ and a boolean mask of the
/// opposite polarity (PyTorch's `attn_mask` true = masked out).
pub fn multi_head_attention<T: Scalar>(
    w: [&Tensor<T>; 4],
    x: &Tensor<T>,
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Tensor<T>> {
    let (dm, shape) = mha_dims(w.map(Tensor::shape), x.shape(), heads, mask)?;
    let [q, k, v] = projections(&dm, [w[0], w[1], w[2]], x)?;
    let (n, p) = (dm.n, dm.p);
    let mut y = zeros("output", dm.batch * n, dm.dm)?;
    for b in 0..dm.batch {
        let r = b * n * p..(b + 1) * n * p;
        let (_, c) = sdpa::sample(
            OP,
            &dm,
            [&q[r.clone()], &k[r.clone()], &v[r]],
            (mask, b),
            &|x| x,
        )?;
        let yb = &mut y[b * n * dm.dm..(b + 1) * n * dm.dm];
        gemm(&c, false, w[3].data(), false, n, p, dm.dm, yb, true);
    }
    Tensor::new(shape, y)
}

/// VJP of `multiHeadAttention`: `[dwq, dwk, dwv, dwo, dx]` for the output cotangent `g`.
pub fn multi_head_attention_vjp<T: Scalar>(
    w: [&Tensor<T>; 4],
    x: &Tensor<T>,
    heads: usize,
    mask: Option<&Mask>,
    g: &Tensor<T>,
) -> Result<[Tensor<T>; 5]> {
    let (dm, shape) = mha_dims(w.map(Tensor::shape), x.shape(), heads, mask)?;
    if g.shape() != &shape {
        return Err(Error::shape(
            OP,
            format!("cotangent has shape {}, expected {shape}", g.shape()),
        ));
    }
    let (n, p) = (dm.n, dm.p);
    let [q, k, v] = projections(&dm, [w[0], w[1], w[2]], x)?;
    let rows = dm.batch * n;
    let (mut dq, mut dk, mut dv) = (
        zeros("gradient", rows, p)?,
        zeros("gradient", rows, p)?,
        zeros("gradient", rows, p)?,
    );
    let mut dwo = zeros("weight gradient", p, dm.dm)?;
    for b in 0..dm.batch {
        let r = b * n * p..(b + 1) * n * p;
        let qkv = [&q[r.clone()], &k[r.clone()], &v[r.clone()]];
        let (a, c) = sdpa::sample(OP, &dm, qkv, (mask, b), &|x| x)?;
        let gb = &g.data()[b * n * dm.dm..(b + 1) * n * dm.dm];
        // y = C·wo: dwo += Cᵀ·g, dC = g·woᵀ.
        gemm(&c, true, gb, false, p, n, dm.dm, &mut dwo, true);
        let mut dc = zeros("gradient", n, p)?;
        gemm(gb, false, w[3].data(), true, n, dm.dm, p, &mut dc, true);
        let out = [&mut dq[r.clone()], &mut dk[r.clone()], &mut dv[r]];
        sdpa::sample_vjp(&dm, qkv, (&a, &dc), out, &|x| x);
    }
    // Q = x·wq: dwq = xᵀ·dQ, dx += dQ·wqᵀ (and likewise for K and V).
    let mut dx = zeros("input gradient", rows, dm.dm)?;
    let mut dws = Vec::with_capacity(3);
    for (dproj, wk) in [(&dq, w[0]), (&dk, w[1]), (&dv, w[2])] {
        let mut dw = zeros("weight gradient", dm.dm, p)?;
        gemm(x.data(), true, dproj, false, dm.dm, rows, p, &mut dw, true);
        gemm(dproj, false, wk.data(), true, rows, p, dm.dm, &mut dx, true);
        dws.push(Tensor::new(wk.shape().clone(), dw)?);
    }
    let [dwq, dwk, dwv]: [Tensor<T>; 3] = dws
        .try_into()
        .map_err(|_| Error::param(OP, "internal: three projections"))?;
    Ok([
        dwq,
        dwk,
        dwv,
        Tensor::new(w[3].shape().clone(), dwo)?,
        Tensor::new(shape, dx)?,
    ])
}
