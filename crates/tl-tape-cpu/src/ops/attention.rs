//! `maskedSoftmax` and `multiHeadAttention`, forward and backward.
//!
//! Attention: the projections Q, K, V = x·W and the output y = C·wo run through one GEMM each
//! (batch folded into rows, ndarray's `general_mat_mul`); the per-head core then runs either
//! - unfused ([`plain`], here): per head the (n, n) scores `S = Q_h K_hᵀ/√d` by GEMM, masked
//!   softmax in place, `O_h = A·V_h` by GEMM into C's head columns (strided views, no copies);
//!   backward `dA = dO_h V_hᵀ`, `dV_h = Aᵀ dO_h`, `dS = A⊙(dA − Σ dA⊙A)/√d`, `dQ_h = dS K_h`,
//!   `dK_h = dSᵀ Q_h`; or
//! - fused ([`flash`]): row by row with an online softmax, never more than one row of scores.
//!
//! The backward recomputes Q, K, V and C (the tape keeps only operands and output).

mod flash;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, Axis, Slice};
use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::attention::mha::{Dims, mha_dims};
use tl_spec::ops::attention::{Mask, masked_softmax_shape};
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, check_arity, check_shape, dot_slice, tensor, wrong_family};
use crate::Result;

/// Forward value of `maskedSoftmax` / `multiHeadAttention`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::MaskedSoftmax { mask } => {
            masked_softmax_shape(x[0].shape(), mask)?;
            let mut y = x[0].data().to_vec();
            let n = mask.n().max(1);
            for (r, row) in y.chunks_exact_mut(n).enumerate() {
                softmax_row(row, Some(mask.row(r % n)));
            }
            tensor(x[0].shape().clone(), y)
        }
        Op::MultiHeadAttention { heads, mask, fused } => {
            let dm = dims(op, x, *heads, mask.as_ref())?;
            let [q, k, v] = projections(op, &dm, x)?;
            let c = if *fused {
                flash::forward(&dm, &q, &k, &v, mask.as_ref())
            } else {
                plain::forward(op, &dm, &q, &k, &v, mask.as_ref())?
            };
            let rows = dm.batch * dm.n;
            let mut y = vec![T::zero(); rows * dm.dm];
            mm(
                op,
                mat(op, &c, rows, dm.p)?,
                mat(op, x[3].data(), dm.p, dm.dm)?,
                T::zero(),
                &mut mat_mut(op, &mut y, rows, dm.dm)?,
            )?;
            tensor(x[4].shape().clone(), y)
        }
        _ => Err(wrong_family(op, "attention")),
    }
}

/// Operand cotangents of `maskedSoftmax` (one) / `multiHeadAttention` (wq, wk, wv, wo, x).
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    check_shape(op, "cotangent", g, y.shape())?;
    match op {
        Op::MaskedSoftmax { mask } => {
            masked_softmax_shape(x[0].shape(), mask)?;
            check_shape(op, "output", y, x[0].shape())?;
            let n = mask.n().max(1);
            let mut dx = vec![T::zero(); y.numel()];
            let rows = y.data().chunks_exact(n).zip(g.data().chunks_exact(n));
            for ((yr, gr), d) in rows.zip(dx.chunks_exact_mut(n)) {
                let dot = dot_slice(yr, gr);
                for ((d, &y), &g) in d.iter_mut().zip(yr).zip(gr) {
                    *d = y * (g - dot);
                }
            }
            Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
        }
        Op::MultiHeadAttention { heads, mask, fused } => {
            let dm = dims(op, x, *heads, mask.as_ref())?;
            check_shape(op, "cotangent", g, x[4].shape())?;
            let (rows, p, dmod) = (dm.batch * dm.n, dm.p, dm.dm);
            let [q, k, v] = projections(op, &dm, x)?;
            // y = C·wo: dC = g·woᵀ, dwo = Cᵀ·g.
            let gv = mat(op, g.data(), rows, dmod)?;
            let mut dc = vec![T::zero(); rows * p];
            let wo = mat(op, x[3].data(), p, dmod)?;
            mm(
                op,
                gv,
                wo.t(),
                T::zero(),
                &mut mat_mut(op, &mut dc, rows, p)?,
            )?;
            let (c, [dq, dk, dv]) = if *fused {
                let c = flash::forward(&dm, &q, &k, &v, mask.as_ref());
                (c, flash::backward(&dm, &q, &k, &v, &dc, mask.as_ref()))
            } else {
                plain::backward(op, &dm, &q, &k, &v, &dc, mask.as_ref())?
            };
            let mut dwo = vec![T::zero(); p * dmod];
            let cv = mat(op, &c, rows, p)?;
            mm(
                op,
                cv.t(),
                gv,
                T::zero(),
                &mut mat_mut(op, &mut dwo, p, dmod)?,
            )?;
            // Q = x·wq: dwq = xᵀ·dQ, dx = Σ dQ·wqᵀ (likewise K, V).
            let xv = mat(op, x[4].data(), rows, dmod)?;
            let mut dx = vec![T::zero(); rows * dmod];
            let mut dw: Vec<Option<Tensor<T>>> = Vec::with_capacity(5);
            for (k, d) in [dq, dk, dv].iter().enumerate() {
                let dv = mat(op, d, rows, p)?;
                let mut dwk = vec![T::zero(); dmod * p];
                mm(
                    op,
                    xv.t(),
                    dv,
                    T::zero(),
                    &mut mat_mut(op, &mut dwk, dmod, p)?,
                )?;
                let wk = mat(op, x[k].data(), dmod, p)?;
                let beta = if k == 0 { T::zero() } else { T::one() };
                mm(op, dv, wk.t(), beta, &mut mat_mut(op, &mut dx, rows, dmod)?)?;
                dw.push(Some(tensor(x[k].shape().clone(), dwk)?));
            }
            dw.push(Some(tensor(x[3].shape().clone(), dwo)?));
            dw.push(Some(tensor(x[4].shape().clone(), dx)?));
            Ok(dw.into_iter().collect())
        }
        _ => Err(wrong_family(op, "attention")),
    }
}

/// Softmax of one row in place over the allowed entries (all when `allowed` is `None`);
/// disallowed entries, and every entry of a row with nothing allowed, become exactly 0.
pub(crate) fn softmax_row<T: Scalar>(row: &mut [T], allowed: Option<&[bool]>) {
    let ok = |j: usize| allowed.is_none_or(|a| a.get(j).copied().unwrap_or(false));
    let mut m = T::neg_infinity();
    for (j, &v) in row.iter().enumerate() {
        if ok(j) && v > m {
            m = v;
        }
    }
    if m == T::neg_infinity() {
        row.fill(T::zero());
        return;
    }
    let mut z = T::zero();
    for (j, v) in row.iter_mut().enumerate() {
        *v = if ok(j) { (*v - m).exp() } else { T::zero() };
        z += *v;
    }
    let inv = T::one() / z;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

fn dims<T: Scalar>(op: &Op, x: &[&Tensor<T>], heads: usize, mask: Option<&Mask>) -> Result<Dims> {
    let w = [x[0].shape(), x[1].shape(), x[2].shape(), x[3].shape()];
    let (dm, _) = mha_dims(w, x[4].shape(), heads, mask)
        .map_err(|e| SpecError::shape(op.name(), e.to_string()))?;
    Ok(dm)
}

/// Q, K, V (B·n, P) by one GEMM each.
fn projections<T: Scalar>(op: &Op, dm: &Dims, x: &[&Tensor<T>]) -> Result<[Vec<T>; 3]> {
    let rows = dm.batch * dm.n;
    let xv = mat(op, x[4].data(), rows, dm.dm)?;
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for (k, o) in out.iter_mut().enumerate() {
        *o = vec![T::zero(); rows * dm.p];
        let w = mat(op, x[k].data(), dm.dm, dm.p)?;
        mm(op, xv, w, T::zero(), &mut mat_mut(op, o, rows, dm.p)?)?;
    }
    Ok(out)
}

/// `c ← a·b + beta·c` on (possibly strided) views; mismatched dims are an error, not a panic.
fn mm<T: Scalar>(
    op: &Op,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) -> Result<()> {
    if a.ncols() != b.nrows() || c.dim() != (a.nrows(), b.ncols()) {
        return Err(SpecError::shape(
            op.name(),
            format!(
                "gemm operands {:?} · {:?} do not fit a {:?} output",
                a.dim(),
                b.dim(),
                c.dim()
            ),
        )
        .into());
    }
    general_mat_mul(T::one(), &a, &b, beta, c);
    Ok(())
}

fn mat<'a, T: Scalar>(op: &Op, data: &'a [T], r: usize, c: usize) -> Result<ArrayView2<'a, T>> {
    ArrayView2::from_shape((r, c), data)
        .map_err(|e| SpecError::shape(op.name(), format!("matrix view: {e}")).into())
}

fn mat_mut<'a, T: Scalar>(
    op: &Op,
    data: &'a mut [T],
    r: usize,
    c: usize,
) -> Result<ArrayViewMut2<'a, T>> {
    ArrayViewMut2::from_shape((r, c), data)
        .map_err(|e| SpecError::shape(op.name(), format!("matrix view: {e}")).into())
}

/// The unfused core: materialized (heads, n, n) scores per sample.
mod plain {
    use super::*;

    /// C (B·n, P) from Q, K, V.
    pub(super) fn forward<T: Scalar>(
        op: &Op,
        dm: &Dims,
        q: &[T],
        k: &[T],
        v: &[T],
        mask: Option<&Mask>,
    ) -> Result<Vec<T>> {
        let mut c = vec![T::zero(); dm.batch * dm.n * dm.p];
        for b in 0..dm.batch {
            scores(op, dm, b, q, k, v, mask, Some(&mut c))?;
        }
        Ok(c)
    }

    /// The probabilities A (heads, n, n) of sample `b`; also writes `O_h = A·V_h` into C's head
    /// columns when `c` is given.
    #[allow(clippy::too_many_arguments)]
    fn scores<T: Scalar>(
        op: &Op,
        dm: &Dims,
        b: usize,
        q: &[T],
        k: &[T],
        v: &[T],
        mask: Option<&Mask>,
        c: Option<&mut Vec<T>>,
    ) -> Result<Vec<T>> {
        let Dims { n, p, d, heads, .. } = *dm;
        let scale = T::one() / T::lit(d as f64).sqrt();
        let blk = b * n * p..(b + 1) * n * p;
        let (qb, kb, vb) = (
            mat(op, &q[blk.clone()], n, p)?,
            mat(op, &k[blk.clone()], n, p)?,
            mat(op, &v[blk.clone()], n, p)?,
        );
        let mut a = vec![T::zero(); heads * n * n];
        let mut c = c;
        for (h, ah) in a.chunks_exact_mut(n * n).enumerate() {
            let cols = Slice::from(h * d..(h + 1) * d);
            let mut av = mat_mut(op, ah, n, n)?;
            general_mat_mul_checked(
                op,
                scale,
                qb.slice_axis(Axis(1), cols),
                kb.slice_axis(Axis(1), cols).t(),
                &mut av,
            )?;
            for (i, row) in ah.chunks_exact_mut(n).enumerate() {
                softmax_row(row, mask.map(|m| m.row(i)));
            }
            if let Some(c) = c.as_mut() {
                let mut cb = mat_mut(op, &mut c[blk.clone()], n, p)?;
                let mut ch = cb.slice_axis_mut(Axis(1), cols);
                mm(
                    op,
                    mat(op, ah, n, n)?,
                    vb.slice_axis(Axis(1), cols),
                    T::zero(),
                    &mut ch,
                )?;
            }
        }
        Ok(a)
    }

    fn general_mat_mul_checked<T: Scalar>(
        op: &Op,
        alpha: T,
        a: ArrayView2<'_, T>,
        b: ArrayView2<'_, T>,
        c: &mut ArrayViewMut2<'_, T>,
    ) -> Result<()> {
        mm(op, a, b, T::zero(), c)?;
        c.mapv_inplace(|v| v * alpha);
        Ok(())
    }

    /// `(C, [dQ, dK, dV])` from Q, K, V and dC.
    #[allow(clippy::type_complexity)]
    pub(super) fn backward<T: Scalar>(
        op: &Op,
        dm: &Dims,
        q: &[T],
        k: &[T],
        v: &[T],
        dc: &[T],
        mask: Option<&Mask>,
    ) -> Result<(Vec<T>, [Vec<T>; 3])> {
        let Dims { n, p, d, .. } = *dm;
        let scale = T::one() / T::lit(d as f64).sqrt();
        let len = dm.batch * n * p;
        let mut c = vec![T::zero(); len];
        let (mut dq, mut dk, mut dv) = (
            vec![T::zero(); len],
            vec![T::zero(); len],
            vec![T::zero(); len],
        );
        let mut da = vec![T::zero(); n * n];
        for b in 0..dm.batch {
            let a = scores(op, dm, b, q, k, v, mask, Some(&mut c))?;
            let blk = b * n * p..(b + 1) * n * p;
            let (qb, kb, vb) = (
                mat(op, &q[blk.clone()], n, p)?,
                mat(op, &k[blk.clone()], n, p)?,
                mat(op, &v[blk.clone()], n, p)?,
            );
            let dcb = mat(op, &dc[blk.clone()], n, p)?;
            for (h, ah) in a.chunks_exact(n * n).enumerate() {
                let cols = Slice::from(h * d..(h + 1) * d);
                let av = mat(op, ah, n, n)?;
                let doh = dcb.slice_axis(Axis(1), cols);
                // dA = dO_h·V_hᵀ; dV_h = Aᵀ·dO_h.
                mm(
                    op,
                    doh,
                    vb.slice_axis(Axis(1), cols).t(),
                    T::zero(),
                    &mut mat_mut(op, &mut da, n, n)?,
                )?;
                let mut dvb = mat_mut(op, &mut dv[blk.clone()], n, p)?;
                mm(
                    op,
                    av.t(),
                    doh,
                    T::zero(),
                    &mut dvb.slice_axis_mut(Axis(1), cols),
                )?;
                // dS = A⊙(dA − Σ dA⊙A)·scale, in place.
                for (ar, dr) in ah.chunks_exact(n).zip(da.chunks_exact_mut(n)) {
                    let dot = dot_slice(ar, dr);
                    for (dv, &a) in dr.iter_mut().zip(ar) {
                        *dv = a * (*dv - dot) * scale;
                    }
                }
                let ds = mat(op, &da, n, n)?;
                let mut dqb = mat_mut(op, &mut dq[blk.clone()], n, p)?;
                mm(
                    op,
                    ds,
                    kb.slice_axis(Axis(1), cols),
                    T::zero(),
                    &mut dqb.slice_axis_mut(Axis(1), cols),
                )?;
                let mut dkb = mat_mut(op, &mut dk[blk.clone()], n, p)?;
                mm(
                    op,
                    ds.t(),
                    qb.slice_axis(Axis(1), cols),
                    T::zero(),
                    &mut dkb.slice_axis_mut(Axis(1), cols),
                )?;
            }
        }
        Ok((c, [dq, dk, dv]))
    }
}
