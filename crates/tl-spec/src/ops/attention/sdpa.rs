//! Scaled dot-product attention of merged heads, `(q, k, v) ↦ C`, written as naive loops: the
//! core of [`mha`](super::mha) without its projections (which runs on these functions).
//!
//! q is (nq, P) or batched (B, nq, P), k and v one shape (nk, Pk) or (B, nk, Pk) (as many keys
//! as values; nk = nq in self-attention, another length for cross-attention or a KV cache), P =
//! heads·d with the heads side by side in each row: head h reads columns h·d..(h+1)·d (the
//! layout of `multiHeadAttention`'s Q, K, V). Pk = kv_heads·d, where kv_heads divides heads:
//! P itself (a key head per query head), or fewer for grouped-query attention, where query
//! head h reads key and value head h / (heads / kv_heads) ([`Dims::kv_head`]; multi-query
//! attention: kv_heads = 1). Per sample and head, `A = maskedSoftmax(Q_h K_gᵀ/√d)` (nq, nk),
//! g = kv_head(h), the mask (nq, nk), and `C_h = A·V_g`, written into C's head columns; C has
//! q's shape. PyTorch: `F.scaled_dot_product_attention(q', k', v', attn_mask=mask,
//! enable_gqa=kv_heads < heads)` on `q' = q.view(B, nq, heads, d).transpose(1, 2)` (likewise
//! k', v' with nk and kv_heads), the result transposed back and viewed as (B, nq, P), except
//! that a query whose mask hides every key gets zeros (PyTorch: NaN).
//!
//! The JVP is taken by forward mode through the composition (`tl_ir::compose`), not here.
//!
//! [`autocast_reference`] is the op under autocast (docs/semantics.md, "Mixed precision"):
//! every product's operands rounded, the probabilities included, in f64.

use super::mha::Dims;
use super::{Mask, check_mask, masked_softmax_row};
use crate::precision::Precision;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// What a product reads of a probability or a score cotangent: the value itself (the op), or
/// the value rounded as an autocast product reads it ([`autocast_reference`]).
pub(super) type Read<'a, T> = &'a dyn Fn(T) -> T;

/// The op's name, in its errors.
const OP: &str = "scaledDotProductAttention";

/// Shape rule of `scaledDotProductAttention(q, k, v)` with the static `heads` and `mask`:
/// returns the sizes (`n` = nq, `nk` the keys, `dm` = `p`: no model width of its own) and the
/// output shape (q's).
pub fn sdpa_dims(qkv: [&Shape; 3], heads: usize, mask: Option<&Mask>) -> Result<(Dims, Shape)> {
    let [q, k, v] = qkv;
    let (batch, n, p) = match *q.dims() {
        [n, p] => (1, n, p),
        [b, n, p] => (b, n, p),
        _ => {
            return Err(Error::shape(
                OP,
                format!("q must be (nq, P) or (B, nq, P), got {q}"),
            ));
        }
    };
    let (nk, pk) = match (q.dims(), k.dims()) {
        (&[_, _], &[nk, pk]) => (nk, pk),
        (&[b, _, _], &[kb, nk, pk]) if kb == b => (nk, pk),
        _ => {
            return Err(Error::shape(
                OP,
                format!(
                    "k must be (nk, Pk) for q (nq, P) or (B, nk, Pk) for q (B, nq, P): the same \
                     batch as q {q}, got {k}"
                ),
            ));
        }
    };
    if v != k {
        return Err(Error::shape(
            OP,
            format!("v must have k's shape {k} (one value per key), got {v}"),
        ));
    }
    if n == 0 || nk == 0 {
        return Err(Error::shape(
            OP,
            format!("the sequence is empty (q {q}, k {k}): no query or no key to attend to"),
        ));
    }
    if heads == 0 || p == 0 || p % heads != 0 {
        return Err(Error::param(
            OP,
            format!("heads = {heads} must be ≥ 1 and divide the width P = {p} > 0 of q {q}"),
        ));
    }
    let d = p / heads;
    let kv_heads = pk / d;
    if !pk.is_multiple_of(d) || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(Error::shape(
            OP,
            format!(
                "k {k} has width Pk = {pk}, which must be kv_heads·d for a kv_heads dividing \
                 heads = {heads} (d = P/heads = {d} from q {q}): P = {p} for a key head per \
                 query head, fewer heads for grouped-query attention"
            ),
        ));
    }
    if let Some(m) = mask {
        check_mask(OP, m, Some(batch), n, nk)?;
    }
    let dims = Dims {
        batch,
        n,
        nk,
        dm: p,
        p,
        heads,
        kv_heads,
        d,
    };
    Ok((dims, q.clone()))
}

/// `a·b` zeros for `op` (a buffer of the op), the count checked for overflow and the buffer
/// allocated fallibly: an error naming the op.
pub(super) fn zeros<T: Scalar>(op: &'static str, what: &str, a: usize, b: usize) -> Result<Vec<T>> {
    let n = a.checked_mul(b).ok_or_else(|| Error::TooLarge {
        op,
        detail: format!("{what}: {a}·{b} elements overflow usize"),
    })?;
    crate::alloc::try_zeroed(op, what, n)
}

/// One sample's attention (q: its (n, P) rows, k, v: its (nk, P) rows): the probabilities A
/// (heads, n, nk) and C (n, P), under batch element `b`'s matrix of the mask, C's product
/// reading each probability through `read`. `op` names the caller in allocation errors.
pub(super) fn sample<T: Scalar>(
    op: &'static str,
    dm: &Dims,
    [q, k, v]: [&[T]; 3],
    (mask, b): (Option<&Mask>, usize),
    read: Read<'_, T>,
) -> Result<(Vec<T>, Vec<T>)> {
    let Dims {
        n, nk, p, heads, d, ..
    } = *dm;
    let pk = dm.pk();
    let scale = T::one() / T::lit(d as f64).sqrt();
    let all = vec![true; nk];
    let mut a = zeros(op, "attention weights", heads, n.saturating_mul(nk))?;
    let mut c = zeros(op, "attention output", n, p)?;
    let mut s = vec![T::zero(); nk];
    for h in 0..heads {
        let g = dm.kv_head(h);
        for i in 0..n {
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = (0..d)
                    .map(|t| q[i * p + h * d + t] * k[j * pk + g * d + t])
                    .sum::<T>()
                    * scale;
            }
            let allowed = mask.map_or(&all[..], |m| m.row_in(b, i));
            let arow = &mut a[(h * n + i) * nk..(h * n + i + 1) * nk];
            masked_softmax_row(&s, allowed, arow);
            for t in 0..d {
                c[i * p + h * d + t] = (0..nk).map(|j| read(arow[j]) * v[j * pk + g * d + t]).sum();
            }
        }
    }
    Ok((a, c))
}

/// One sample's VJP: adds into `dq` (its (n, P) rows), `dk`, `dv` (its (nk, Pk) rows) the
/// cotangents of q, k, v for C's cotangent `dc`, from the sample's operands and its
/// probabilities `a` ([`sample`]), the products reading each probability and score cotangent
/// through `read` (the softmax VJP reads them as they are). A key head's cotangents sum its
/// query heads' in increasing order.
pub(super) fn sample_vjp<T: Scalar>(
    dm: &Dims,
    [q, k, v]: [&[T]; 3],
    (a, dc): (&[T], &[T]),
    [dq, dk, dv]: [&mut [T]; 3],
    read: Read<'_, T>,
) {
    let Dims {
        n, nk, p, heads, d, ..
    } = *dm;
    let pk = dm.pk();
    let scale = T::one() / T::lit(d as f64).sqrt();
    for h in 0..heads {
        let g = dm.kv_head(h);
        let col = |i: usize, t: usize| i * p + h * d + t;
        let kcol = |j: usize, t: usize| j * pk + g * d + t;
        for i in 0..n {
            let arow = &a[(h * n + i) * nk..(h * n + i + 1) * nk];
            // O_i = Σ_j A_ij V_j: dA_ij = dO_i·V_j, dV_j += A_ij dO_i.
            let da: Vec<T> = (0..nk)
                .map(|j| (0..d).map(|t| dc[col(i, t)] * v[kcol(j, t)]).sum())
                .collect();
            for j in 0..nk {
                let aj = read(arow[j]);
                for t in 0..d {
                    dv[kcol(j, t)] += aj * dc[col(i, t)];
                }
            }
            // Softmax VJP, then S_ij = scale·Q_i·K_j.
            let dot: T = arow.iter().zip(&da).map(|(&a, &g)| a * g).sum();
            for j in 0..nk {
                let ds = read(arow[j] * (da[j] - dot) * scale);
                for t in 0..d {
                    dq[col(i, t)] += ds * k[kcol(j, t)];
                    dk[kcol(j, t)] += ds * q[col(i, t)];
                }
            }
        }
    }
}

/// Sample `b`'s rows of q (n of them) and of k and v (nk of them).
fn sample_of<'a, T: Scalar>(dm: &Dims, [q, k, v]: [&'a Tensor<T>; 3], b: usize) -> [&'a [T]; 3] {
    let (lq, lk) = (dm.n * dm.p, dm.nk * dm.pk());
    [
        &q.data()[b * lq..][..lq],
        &k.data()[b * lk..][..lk],
        &v.data()[b * lk..][..lk],
    ]
}

/// Scaled dot-product attention of merged heads (module docs). PyTorch:
/// `F.scaled_dot_product_attention` on the heads split out and transposed.
pub fn scaled_dot_product_attention<T: Scalar>(
    qkv: [&Tensor<T>; 3],
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Tensor<T>> {
    let (dm, shape) = sdpa_dims(qkv.map(Tensor::shape), heads, mask)?;
    let mut c = zeros(OP, "output", dm.batch, dm.n * dm.p)?;
    for b in 0..dm.batch {
        let (_, cb) = sample(OP, &dm, sample_of(&dm, qkv, b), (mask, b), &|x| x)?;
        c[b * dm.n * dm.p..][..dm.n * dm.p].copy_from_slice(&cb);
    }
    Tensor::new(shape, c)
}

/// VJP of `scaledDotProductAttention`: `[dq, dk, dv]` for the output cotangent `g`.
pub fn scaled_dot_product_attention_vjp<T: Scalar>(
    qkv: [&Tensor<T>; 3],
    heads: usize,
    mask: Option<&Mask>,
    g: &Tensor<T>,
) -> Result<[Tensor<T>; 3]> {
    let (dm, shape) = sdpa_dims(qkv.map(Tensor::shape), heads, mask)?;
    if g.shape() != &shape {
        return Err(Error::shape(
            OP,
            format!("cotangent has shape {}, expected {shape}", g.shape()),
        ));
    }
    let (lq, lk) = (dm.n * dm.p, dm.nk * dm.pk());
    let mut d = [
        zeros(OP, "gradient", dm.batch, lq)?,
        zeros(OP, "gradient", dm.batch, lk)?,
        zeros(OP, "gradient", dm.batch, lk)?,
    ];
    for b in 0..dm.batch {
        let x = sample_of(&dm, qkv, b);
        let (a, _) = sample(OP, &dm, x, (mask, b), &|x| x)?;
        let [dq, dk, dv] = &mut d;
        let out = [
            &mut dq[b * lq..][..lq],
            &mut dk[b * lk..][..lk],
            &mut dv[b * lk..][..lk],
        ];
        sample_vjp(&dm, x, (&a, &g.data()[b * lq..][..lq]), out, &|x| x);
    }
    let [dq, dk, dv] = d;
    let ks = qkv[1].shape();
    Ok([
        Tensor::new(shape, dq)?,
        Tensor::new(ks.clone(), dk)?,
        Tensor::new(ks.clone(), dv)?,
    ])
}

/// The op under autocast at `p` (docs/semantics.md, "Mixed precision", "attention"), in f64:
/// `[C, dq, dk, dv]` for the output cotangent `g`. Every product reads its operands rounded
/// ([`Precision::round`]): q, k, v and g; the probabilities A where `A·V` and `dV = Aᵀ·dO`
/// read them and `dS = A·(dA − Σ_j A·dA)/√d` where `dQ = dS·K` and `dK = dSᵀ·Q` read it, each
/// as its value rounded to f32, then to the setting (a path computes them in f32); the
/// softmax and its VJP on the unrounded A. An f32 path differs from it by its f32 arithmetic
/// and, where its f32 probability (or dS) and this one round to neighbouring values, by one
/// unit of the rounding on that term. `Precision::F32`: the op's value and VJP in f64.
pub fn autocast_reference(
    p: Precision,
    qkv: [&Tensor<f32>; 3],
    heads: usize,
    mask: Option<&Mask>,
    g: &Tensor<f32>,
) -> Result<[Tensor<f64>; 4]> {
    let r = |t: &Tensor<f32>| t.try_map(OP, |x| p.round(x))?.try_cast::<f64>(OP);
    let [q, k, v, g] = [r(qkv[0])?, r(qkv[1])?, r(qkv[2])?, r(g)?];
    let (dm, shape) = sdpa_dims([q.shape(), k.shape(), v.shape()], heads, mask)?;
    if g.shape() != &shape {
        return Err(Error::shape(
            OP,
            format!("cotangent has shape {}, expected {shape}", g.shape()),
        ));
    }
    let read = |x: f64| match p.is_autocast() {
        true => f64::from(p.round(x as f32)),
        false => x,
    };
    let (lq, lk) = (dm.n * dm.p, dm.nk * dm.pk());
    let mut c = zeros(OP, "output", dm.batch, lq)?;
    let mut d = [
        zeros(OP, "gradient", dm.batch, lq)?,
        zeros(OP, "gradient", dm.batch, lk)?,
        zeros(OP, "gradient", dm.batch, lk)?,
    ];
    for b in 0..dm.batch {
        let x = sample_of(&dm, [&q, &k, &v], b);
        let (a, cb) = sample(OP, &dm, x, (mask, b), &read)?;
        c[b * lq..][..lq].copy_from_slice(&cb);
        let [dq, dk, dv] = &mut d;
        let out = [
            &mut dq[b * lq..][..lq],
            &mut dk[b * lk..][..lk],
            &mut dv[b * lk..][..lk],
        ];
        sample_vjp(&dm, x, (&a, &g.data()[b * lq..][..lq]), out, &read);
    }
    let [dq, dk, dv] = d;
    let ks = k.shape();
    Ok([
        Tensor::new(shape.clone(), c)?,
        Tensor::new(shape, dq)?,
        Tensor::new(ks.clone(), dk)?,
        Tensor::new(ks.clone(), dv)?,
    ])
}
