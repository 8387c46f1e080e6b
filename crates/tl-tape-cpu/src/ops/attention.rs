//! `maskedSoftmax`, `multiHeadAttention` and `scaledDotProductAttention` (its core without the
//! projections), forward and backward.
//!
//! Attention: the projections Q, K, V = x·W and the output y = C·wo run through one GEMM each
//! (batch folded into rows); the per-head core ([`core`]) then takes the query rows in blocks:
//! per block, the scores `S = Q_blk K_hᵀ/√d` by GEMM, masked softmax in place, `O_blk = A·V_h` by
//! GEMM into C's head columns (strided views, no copies); backward `dA = dO_blk V_hᵀ`,
//! `dV_h += Aᵀ dO_blk`, `dS = A⊙(dA − Σ dA⊙A)/√d`, `dQ_blk = dS K_h`, `dK_h += dSᵀ Q_blk`.
//! Unfused, a block is every row of the sample (the (n, n) scores of one head at a time); fused
//! past [`core::FUSED_KEEP_MAX`] probabilities (memory-lean, [`core::lean`]), a block holds at
//! most [`core::FUSED_SCORES`] scores, so memory stays bounded for long sequences while every
//! step is still a GEMM (each block holds whole rows, so its softmax is exact: no online
//! rescaling). A fused op below that size runs as the unfused one.
//!
//! Through the tape ([`forward_saving`], [`backward_saved`]) the backward reads Q, K, V, C and
//! the probabilities A as the forward left them (PyTorch's saved tensors); memory-lean, it
//! keeps each row's softmax statistics instead of A (its max and the reciprocal of its sum, as
//! FlashAttention keeps the log-sum-exp), so the backward recomputes A block by block with one
//! pass per row (`exp(s − max)·(1/sum)`), not the forward's four. Called directly ([`forward`],
//! [`backward_saved`] with nothing saved) it recomputes everything. The bits are the same either way.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::attention::mha::{Dims, mha_dims};
use tl_spec::ops::attention::sdpa::sdpa_dims;
use tl_spec::ops::attention::{Mask, mask_row_of, masked_softmax_shape};
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{
    Grads, approx, check_arity, check_backward, check_saved, check_shape, dot_slice, sum_slice,
    tensor, wrong_family,
};
use crate::Result;
use crate::gemm::{Mat, matmul, rows, rows_mut};

pub mod core;

/// Forward value of `maskedSoftmax` / `multiHeadAttention`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::MaskedSoftmax { mask } => {
            masked_softmax_shape(x[0].shape(), mask)?;
            let mut y = tl_spec::alloc::try_with_capacity(op.name(), "output", x[0].numel())?;
            y.extend_from_slice(x[0].data());
            let numel = y.len();
            let row = |r| {
                let (b, i) = mask_row_of(mask, numel, r);
                Some(mask.row_in(b, i))
            };
            softmax_rows(&mut y, mask.cols(), row, None);
            tensor(x[0].shape().clone(), y)
        }
        Op::MultiHeadAttention { .. } => {
            let (y, scratch) = mha_forward(op, x, false)?;
            scratch.into_iter().for_each(tl_spec::pool::give);
            Ok(y)
        }
        Op::ScaledDotProductAttention { .. } => {
            let (y, scratch) = sdpa_forward(op, x, false)?;
            scratch.into_iter().for_each(tl_spec::pool::give);
            Ok(y)
        }
        _ => Err(wrong_family(op, "attention")),
    }
}

/// `multiHeadAttention`'s value and what its backward reads, so that it does not compute them
/// again (PyTorch's saved tensors): Q, K, V and C (each (B·n, P)), then the probabilities A
/// ((B, heads, n, n)), or where the op is `fused` and past [`core::FUSED_KEEP_MAX`]
/// probabilities ([`core::lean`]) each row's softmax statistics ((B, heads, n, 2): max, 1/sum).
/// The memory-lean form keeps O(B·n·(P + heads)) floats, not O(B·heads·n²), and its backward
/// recomputes A block by block from the statistics. `scaledDotProductAttention` keeps the
/// probabilities or the statistics only (Q, K, V are its operands, C its value). Any other op:
/// its value and nothing saved. [`backward_saved`] takes the list back.
pub fn forward_saving<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    check_arity(op, x)?;
    match op {
        Op::MultiHeadAttention { .. } => mha_forward(op, x, true),
        Op::ScaledDotProductAttention { .. } => sdpa_forward(op, x, true),
        _ => Ok((forward(op, x)?, Vec::new())),
    }
}

/// `multiHeadAttention`'s value, with Q, K, V, C and A or the row statistics (memory-lean)
/// where `keep` (see [`forward_saving`]).
fn mha_forward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    keep: bool,
) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    let Op::MultiHeadAttention { heads, mask, fused } = op else {
        return Err(wrong_family(op, "attention"));
    };
    let dm = dims(op, x, *heads, mask.as_ref())?;
    let [q, k, v] = projections(op, &dm, x)?;
    let (c, kept) = core_forward(op, &dm, [&q, &k, &v], mask.as_ref(), *fused, keep)?;
    let n_rows = dm.batch * dm.n;
    let mut y = tl_spec::alloc::try_for_overwrite(op.name(), "output", n_rows * dm.dm)?;
    matmul(
        op,
        rows_mut(op, &mut y, n_rows, dm.dm)?,
        false,
        rows(op, &c, n_rows, dm.p)?,
        rows(op, x[3].data(), dm.p, dm.dm)?,
        T::one(),
    )?;
    let saved = [q, k, v, c].into_iter().chain(kept).collect();
    Ok((tensor(x[4].shape().clone(), y)?, saved))
}

/// `scaledDotProductAttention`'s value (C), with the probabilities or the row statistics
/// (memory-lean) where `keep` (see [`forward_saving`]).
fn sdpa_forward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    keep: bool,
) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    let Op::ScaledDotProductAttention { heads, mask, fused } = op else {
        return Err(wrong_family(op, "attention"));
    };
    let dm = sdpa_dims_of(op, x, *heads, mask.as_ref())?;
    let qkv = [x[0].data(), x[1].data(), x[2].data()];
    let (c, kept) = core_forward(op, &dm, qkv, mask.as_ref(), *fused, keep)?;
    Ok((tensor(x[0].shape().clone(), c)?, kept.into_iter().collect()))
}

/// The attention core's C (B·n, P) from Q, K, V, and where `keep` what its backward reads
/// besides them: the probabilities, or each row's statistics when `fused` runs memory-lean
/// ([`core::lean`]).
fn core_forward<T: Scalar>(
    op: &Op,
    dm: &Dims,
    qkv: [&[T]; 3],
    mask: Option<&Mask>,
    fused: bool,
    keep: bool,
) -> Result<(Vec<T>, Option<Vec<T>>)> {
    let lean = core::lean(dm, fused);
    let block = core::block_rows(dm, lean);
    // Every head's probabilities (or statistics) at once: checked against the allocation cap
    // before anything is allocated (the op's value alone may be far smaller).
    let mut kept = match keep {
        true => Some(tl_spec::alloc::try_for_overwrite(
            op.name(),
            core::kept_what(lean),
            core::kept_len(op, dm, lean)?,
        )?),
        false => None,
    };
    let into = match (kept.as_deref_mut(), lean) {
        (Some(a), false) => core::Keep::Probabilities(a),
        (Some(st), true) => core::Keep::Stats(st),
        (None, _) => core::Keep::Nothing,
    };
    let c = core::forward(op, dm, qkv, mask, block, into)?;
    Ok((c, kept))
}

/// Operand cotangents of `maskedSoftmax` (one) / `multiHeadAttention` (wq, wk, wv, wo, x),
/// reading what [`forward_saving`] kept (`saved`); with `saved` empty it recomputes Q, K, V, C and A from the operands. Either way the cotangents have the same bits
/// (the same kernels in the same order produced them). A list that is not what the forward
/// saves for these operands is an error naming the op.
pub fn backward_saved<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    check_backward(op, x, y, g)?;
    match op {
        Op::MaskedSoftmax { mask } => {
            masked_softmax_shape(x[0].shape(), mask)?;
            check_shape(op, "output", y, x[0].shape())?;
            let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", g.numel())?;
            dx.copy_from_slice(g.data());
            softmax_vjp_rows(y.data(), &mut dx, mask.cols(), None);
            Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
        }
        Op::MultiHeadAttention { heads, mask, fused } => {
            let dm = dims(op, x, *heads, mask.as_ref())?;
            let lean = core::lean(&dm, *fused);
            check_shape(op, "cotangent", g, x[4].shape())?;
            let (n_rows, p, dmod) = (dm.batch * dm.n, dm.p, dm.dm);
            // What the forward kept, or the same values computed again.
            let recomputed = match saved {
                [] => Some(projections(op, &dm, x)?),
                _ => None,
            };
            let kept = match &recomputed {
                Some([q, k, v]) => core::Kept {
                    qkv: [q, k, v],
                    c: None,
                    a: None,
                    stats: None,
                },
                None => core::Kept::from_saved(op, &dm, lean, saved)?,
            };
            // y = C·wo: dC = g·woᵀ, dwo = Cᵀ·g.
            let gv = rows(op, g.data(), n_rows, dmod)?;
            let wo = rows(op, x[3].data(), p, dmod)?;
            let mut dc = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", n_rows * p)?;
            let dcv = rows_mut(op, &mut dc, n_rows, p)?;
            matmul(op, dcv, false, gv, wo.t(), T::one())?;
            let block = core::block_rows(&dm, lean);
            let (c, dqkv) = core::backward(op, &dm, &kept, &dc, mask.as_ref(), block)?;
            let cv = rows(op, c.as_deref().or(kept.c).unwrap_or_default(), n_rows, p)?;
            let mut dwo = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", p * dmod)?;
            let dwov = rows_mut(op, &mut dwo, p, dmod)?;
            matmul(op, dwov, false, cv.t(), gv, T::one())?;
            // Q = x·wq: dwq = xᵀ·dQ, dx = Σ dQ·wqᵀ (likewise K, V).
            let xv = rows(op, x[4].data(), n_rows, dmod)?;
            let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", n_rows * dmod)?;
            let mut dw: Grads<T> = smallvec![];
            for (k, d) in dqkv.iter().enumerate() {
                let dv = rows(op, d, n_rows, p)?;
                let mut dwk = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", dmod * p)?;
                let dwkv = rows_mut(op, &mut dwk, dmod, p)?;
                matmul(op, dwkv, false, xv.t(), dv, T::one())?;
                let wk = rows(op, x[k].data(), dmod, p)?;
                let dxv = rows_mut(op, &mut dx, n_rows, dmod)?;
                matmul(op, dxv, k > 0, dv, wk.t(), T::one())?;
                dw.push(Some(tensor(x[k].shape().clone(), dwk)?));
            }
            dw.push(Some(tensor(x[3].shape().clone(), dwo)?));
            dw.push(Some(tensor(x[4].shape().clone(), dx)?));
            // The scratch goes back to the tape's spares (crate::pool); what the forward kept
            // stays with the tape's node.
            [dc].into_iter()
                .chain(c)
                .chain(dqkv)
                .chain(recomputed.into_iter().flatten())
                .for_each(tl_spec::pool::give);
            Ok(dw)
        }
        Op::ScaledDotProductAttention { heads, mask, fused } => {
            let dm = sdpa_dims_of(op, x, *heads, mask.as_ref())?;
            check_shape(op, "cotangent", g, x[0].shape())?;
            let lean = core::lean(&dm, *fused);
            // Q, K, V are the operands and C the value; the probabilities or the statistics
            // as the forward kept them, or computed again.
            let qkv = [x[0].data(), x[1].data(), x[2].data()];
            let last = match saved {
                [] => None,
                _ => {
                    check_saved(op, saved, &[core::kept_len(op, &dm, lean)?])?;
                    Some(saved[0].as_slice())
                }
            };
            let kept = core::Kept {
                qkv,
                c: Some(y.data()),
                a: last.filter(|_| !lean),
                stats: last.filter(|_| lean),
            };
            let block = core::block_rows(&dm, lean);
            let (c, dqkv) = core::backward(op, &dm, &kept, g.data(), mask.as_ref(), block)?;
            c.into_iter().for_each(tl_spec::pool::give);
            let mut d: Grads<T> = smallvec![];
            for (xi, dx) in x.iter().zip(dqkv) {
                d.push(Some(tensor(xi.shape().clone(), dx)?));
            }
            Ok(d)
        }
        _ => Err(wrong_family(op, "attention")),
    }
}

/// [`softmax_row`] of every `n`-long row of `x` (row `r` allowed where `allowed(r)` says),
/// compiled for the CPU's best instruction set ([`crate::simd`]); with `stats`, row `r`'s max
/// and 1/sum go to `stats[2r]`, `stats[2r + 1]` (for [`softmax_rows_from`]).
pub(crate) fn softmax_rows<'m, T: Scalar>(
    x: &mut [T],
    n: usize,
    allowed: impl Fn(usize) -> Option<&'m [bool]>,
    stats: Option<&mut [T]>,
) {
    struct Rows<'a, T, A> {
        x: &'a mut [T],
        n: usize,
        allowed: A,
        stats: Option<&'a mut [T]>,
    }
    impl<'m, T: Scalar, A: Fn(usize) -> Option<&'m [bool]>> crate::simd::Kernel for Rows<'_, T, A> {
        type Output = ();
        #[inline(always)]
        fn call(mut self) {
            for (r, row) in self.x.chunks_exact_mut(self.n.max(1)).enumerate() {
                let (m, inv) = softmax_row(row, (self.allowed)(r));
                if let Some(st) = self
                    .stats
                    .as_deref_mut()
                    .and_then(|s| s.get_mut(2 * r..2 * r + 2))
                {
                    st.copy_from_slice(&[m, inv]);
                }
            }
        }
    }
    crate::simd::vectorize(Rows {
        x,
        n,
        allowed,
        stats,
    });
}

/// The softmax's vector-Jacobian product, row by row in place: each row of `d` holds the
/// cotangent g of the matching row y of `y` and becomes `y ⊙ (g − ⟨y, g⟩)`, times `scale`
/// when given (the attention's `1/√d`), as a [`crate::simd::vectorize`] kernel (the same
/// operations in the same order at every width, so the same bits).
pub(crate) fn softmax_vjp_rows<T: Scalar>(y: &[T], d: &mut [T], n: usize, scale: Option<T>) {
    struct Rows<'a, T> {
        y: &'a [T],
        d: &'a mut [T],
        n: usize,
        scale: Option<T>,
    }
    impl<T: Scalar> crate::simd::Kernel for Rows<'_, T> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            let n = self.n.max(1);
            for (yr, dr) in self.y.chunks_exact(n).zip(self.d.chunks_exact_mut(n)) {
                let dot = dot_slice(yr, dr);
                match self.scale {
                    Some(c) => dr
                        .iter_mut()
                        .zip(yr)
                        .for_each(|(g, &y)| *g = y * (*g - dot) * c),
                    None => dr
                        .iter_mut()
                        .zip(yr)
                        .for_each(|(g, &y)| *g = y * (*g - dot)),
                }
            }
        }
    }
    crate::simd::vectorize(Rows { y, d, n, scale });
}

/// The rows [`softmax_rows`] makes of the same scores, from the statistics it kept (`stats[2r]`
/// the max, `stats[2r + 1]` 1/sum): `exp(v − max)·(1/sum)` where allowed, `0·(1/sum)`
/// elsewhere, in one pass per row. The same operations on the same values, so the same bits.
pub(crate) fn softmax_rows_from<'m, T: Scalar>(
    x: &mut [T],
    n: usize,
    allowed: impl Fn(usize) -> Option<&'m [bool]>,
    stats: &[T],
) {
    struct Rows<'a, T, A> {
        x: &'a mut [T],
        n: usize,
        allowed: A,
        stats: &'a [T],
    }
    impl<'m, T: Scalar, A: Fn(usize) -> Option<&'m [bool]>> crate::simd::Kernel for Rows<'_, T, A> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            let rows = self.x.chunks_exact_mut(self.n.max(1));
            for ((r, row), st) in rows.enumerate().zip(self.stats.chunks_exact(2)) {
                let (m, inv) = (st[0], st[1]);
                if m == T::neg_infinity() {
                    row.fill(T::zero());
                    continue;
                }
                match (self.allowed)(r) {
                    None => row.iter_mut().for_each(|v| *v = approx::exp(*v - m) * inv),
                    Some(ok) => {
                        let n = row.len().min(ok.len());
                        let (head, tail) = row.split_at_mut(n);
                        // As the forward: the select, then the scaling (a NaN sum makes
                        // every entry NaN there, the disallowed ones included).
                        for (v, &ok) in head.iter_mut().zip(&ok[..n]) {
                            let e = approx::exp(*v - m);
                            *v = if ok { e } else { T::zero() } * inv;
                        }
                        tail.fill(T::zero() * inv);
                    }
                }
            }
        }
    }
    crate::simd::vectorize(Rows {
        x,
        n,
        allowed,
        stats,
    });
}

/// Softmax of one row in place over the allowed entries (all when `allowed` is `None`);
/// disallowed entries, and every entry of a row with nothing allowed, become exactly 0.
/// Returns the row's max and the reciprocal of its sum of exponentials (−∞ and 0 for a row
/// with nothing allowed), what [`softmax_rows_from`] needs to make the row again. Inlined so
/// that the callers' [`crate::simd::vectorize`] compiles it at their width.
#[inline(always)]
pub(crate) fn softmax_row<T: Scalar>(row: &mut [T], allowed: Option<&[bool]>) -> (T, T) {
    let m = row_max(row, allowed);
    if m == T::neg_infinity() {
        row.fill(T::zero());
        return (m, T::zero());
    }
    // Exponentials first, then the sum: two loops the compiler vectorizes (one loop that
    // also accumulated would stay scalar). Entries past the end of the mask are disallowed.
    match allowed {
        None => row.iter_mut().for_each(|v| *v = approx::exp(*v - m)),
        Some(ok) => {
            let n = row.len().min(ok.len());
            let (head, tail) = row.split_at_mut(n);
            // Every entry's exponential, then a select: an exponential under a branch is not
            // vectorized (it ran one element at a time). A disallowed entry's exponential is
            // computed and dropped, so the kept values are the same.
            for (v, &ok) in head.iter_mut().zip(&ok[..n]) {
                let e = approx::exp(*v - m);
                *v = if ok { e } else { T::zero() };
            }
            tail.fill(T::zero());
        }
    }
    let z = sum_slice(row);
    let inv = T::one() / z;
    for v in row.iter_mut() {
        *v *= inv;
    }
    (m, inv)
}

/// The largest allowed entry of `row` (−∞ when none is), in 16 independent lanes so that it
/// vectorizes. The same value as a left-to-right scan: a maximum does not depend on the order
/// (NaNs are skipped either way; of two equal zeros either sign may win, and `v − m` is then
/// the same for every entry but a zero, whose exponential is 1 either way).
#[inline(always)]
pub(crate) fn row_max<T: Scalar>(row: &[T], allowed: Option<&[bool]>) -> T {
    const LANES: usize = 16;
    let mut acc = [T::neg_infinity(); LANES];
    // Selects, not a conditional store, so that the masked loop vectorizes too.
    let take = |a: &mut T, v: T, ok: bool| {
        let v = if ok { v } else { T::neg_infinity() };
        *a = if v > *a { v } else { *a };
    };
    match allowed {
        None => {
            let chunks = row.chunks_exact(LANES);
            let rest = chunks.remainder();
            for c in chunks {
                for (a, &v) in acc.iter_mut().zip(c) {
                    take(a, v, true);
                }
            }
            for (a, &v) in acc.iter_mut().zip(rest) {
                take(a, v, true);
            }
        }
        Some(ok) => {
            let n = row.len().min(ok.len());
            let (row, ok) = (&row[..n], &ok[..n]);
            let (rows, oks) = (row.chunks_exact(LANES), ok.chunks_exact(LANES));
            let (rest, ok_rest) = (rows.remainder(), oks.remainder());
            for (c, o) in rows.zip(oks) {
                for ((a, &v), &o) in acc.iter_mut().zip(c).zip(o) {
                    take(a, v, o);
                }
            }
            for ((a, &v), &o) in acc.iter_mut().zip(rest).zip(ok_rest) {
                take(a, v, o);
            }
        }
    }
    acc.into_iter()
        .fold(T::neg_infinity(), |m, v| if v > m { v } else { m })
}

fn dims<T: Scalar>(op: &Op, x: &[&Tensor<T>], heads: usize, mask: Option<&Mask>) -> Result<Dims> {
    let w = [x[0].shape(), x[1].shape(), x[2].shape(), x[3].shape()];
    let (dm, _) = mha_dims(w, x[4].shape(), heads, mask)
        .map_err(|e| SpecError::shape(op.name(), e.to_string()))?;
    Ok(dm)
}

/// The sizes of a `scaledDotProductAttention` node (`dm` = P).
fn sdpa_dims_of<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    heads: usize,
    mask: Option<&Mask>,
) -> Result<Dims> {
    let qkv = [x[0].shape(), x[1].shape(), x[2].shape()];
    let (dm, _) =
        sdpa_dims(qkv, heads, mask).map_err(|e| SpecError::shape(op.name(), e.to_string()))?;
    Ok(dm)
}

/// Q, K, V (B·n, P) by one GEMM each.
fn projections<T: Scalar>(op: &Op, dm: &Dims, x: &[&Tensor<T>]) -> Result<[Vec<T>; 3]> {
    let n_rows = dm.batch * dm.n;
    let xv = rows(op, x[4].data(), n_rows, dm.dm)?;
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for (k, o) in out.iter_mut().enumerate() {
        *o = tl_spec::alloc::try_for_overwrite(op.name(), "projection", n_rows * dm.p)?;
        let w = rows(op, x[k].data(), dm.dm, dm.p)?;
        matmul(op, rows_mut(op, o, n_rows, dm.p)?, false, xv, w, T::one())?;
    }
    Ok(out)
}
