//! Matrix-product kernels: `matmul`, `bmm` and `linear`, forward and backward, all through one
//! real GEMM ([`gemm`], which hands ndarray views to [`crate::gemm::matmul`]: faer's kernels,
//! chosen at run time for the CPU). Transposed operands are strided views (`.t()`), never
//! copies.
//!
//! - matmul: `C = A·B`; `dA = G·Bᵀ`, `dB = Aᵀ·G`
//! - bmm: the same per batch
//! - linear(w, b, x): `Y = X·Wᵀ + b` with x viewed as (rows, in) (a 1-D x is one row);
//!   `dW = Gᵀ·X`, `db = Σ_rows G`, `dX = G·W`

use crate::gemm::{Mat, rows};
use ndarray::ArrayView2;
use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Shape, Tensor};

use super::{Grads, check_arity, check_backward, check_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of a matrix product.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::Matmul => {
            let (m, n, p) = matmul_dims(op, x[0], x[1])?;
            let mut c = tl_spec::alloc::try_for_overwrite(op.name(), "output", m * p)?;
            let a = view(op, x[0].data(), m, n)?;
            let b = view(op, x[1].data(), n, p)?;
            gemm(op, &a, &b, T::zero(), &mut c)?;
            tensor([m, p], c)
        }
        Op::Bmm => {
            let (bs, m, n, p) = bmm_dims(op, x[0], x[1])?;
            let mut c = tl_spec::alloc::try_for_overwrite(op.name(), "output", bs * m * p)?;
            for_each_batch(
                bs,
                [m * n, n * p, m * p],
                x[0].data(),
                x[1].data(),
                &mut c,
                |a, b, c| gemm(op, &view(op, a, m, n)?, &view(op, b, n, p)?, T::zero(), c),
            )?;
            tensor([bs, m, p], c)
        }
        Op::Linear => {
            let (w, b, xs) = (x[0], x[1], x[2]);
            let (out, inp, rows, y_shape) = linear_dims(op, w, b, xs)?;
            // Y starts as b in every row, then Y += X·Wᵀ.
            let mut y = tl_spec::alloc::try_with_capacity(op.name(), "output", rows * out)?;
            for _ in 0..rows {
                y.extend_from_slice(b.data());
            }
            let xv = view(op, xs.data(), rows, inp)?;
            let wv = view(op, w.data(), out, inp)?;
            gemm(op, &xv, &wv.t(), T::one(), &mut y)?;
            tensor(y_shape, y)
        }
        _ => Err(wrong_family(op, "linalg")),
    }
}

/// Operand cotangents of a matrix product; that of operand `k` is computed only where
/// `needed[k]` is true (missing entries count as true, so `&[]` computes all); the others are
/// `None`. The tape passes its parents'
/// `requires_grad`, so e.g. `linear`'s input gradient (a full GEMM) is skipped for a data batch.
pub fn backward_masked<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    needed: &[bool],
) -> Result<Grads<T>> {
    check_backward(op, x, y, g)?;
    let need = |k: usize| needed.get(k).copied().unwrap_or(true);
    match op {
        Op::Matmul => {
            let (m, n, p) = matmul_dims(op, x[0], x[1])?;
            check_shape(op, "cotangent", g, &Shape::new(&[m, p]))?;
            let (a, b) = (view(op, x[0].data(), m, n)?, view(op, x[1].data(), n, p)?);
            let gv = view(op, g.data(), m, p)?;
            let da = need(0).then(|| {
                let mut da = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", m * n)?;
                gemm(op, &gv, &b.t(), T::zero(), &mut da)?;
                tensor(x[0].shape().clone(), da)
            });
            let db = need(1).then(|| {
                let mut db = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", n * p)?;
                gemm(op, &a.t(), &gv, T::zero(), &mut db)?;
                tensor(x[1].shape().clone(), db)
            });
            Ok(smallvec![da.transpose()?, db.transpose()?])
        }
        Op::Bmm => {
            let (bs, m, n, p) = bmm_dims(op, x[0], x[1])?;
            check_shape(op, "cotangent", g, &Shape::new(&[bs, m, p]))?;
            let da = need(0).then(|| {
                let mut da = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", bs * m * n)?;
                let sizes = [m * p, n * p, m * n];
                for_each_batch(bs, sizes, g.data(), x[1].data(), &mut da, |g, b, d| {
                    gemm(
                        op,
                        &view(op, g, m, p)?,
                        &view(op, b, n, p)?.t(),
                        T::zero(),
                        d,
                    )
                })?;
                tensor(x[0].shape().clone(), da)
            });
            let db = need(1).then(|| {
                let mut db = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", bs * n * p)?;
                let sizes = [m * n, m * p, n * p];
                for_each_batch(bs, sizes, x[0].data(), g.data(), &mut db, |a, g, d| {
                    gemm(
                        op,
                        &view(op, a, m, n)?.t(),
                        &view(op, g, m, p)?,
                        T::zero(),
                        d,
                    )
                })?;
                tensor(x[1].shape().clone(), db)
            });
            Ok(smallvec![da.transpose()?, db.transpose()?])
        }
        Op::Linear => {
            let (w, b, xs) = (x[0], x[1], x[2]);
            let (out, inp, rows, y_shape) = linear_dims(op, w, b, xs)?;
            check_shape(op, "cotangent", g, &y_shape)?;
            let gv = view(op, g.data(), rows, out)?;
            let dw = need(0).then(|| {
                let xv = view(op, xs.data(), rows, inp)?;
                let mut dw = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", out * inp)?;
                gemm(op, &gv.t(), &xv, T::zero(), &mut dw)?;
                tensor(w.shape().clone(), dw)
            });
            let db = need(1).then(|| {
                let mut db = tl_spec::alloc::try_zeroed(op.name(), "cotangent", out)?;
                if out > 0 {
                    for grow in g.data().chunks_exact(out) {
                        for (d, &v) in db.iter_mut().zip(grow) {
                            *d += v;
                        }
                    }
                }
                tensor(b.shape().clone(), db)
            });
            let dx = need(2).then(|| {
                let wv = view(op, w.data(), out, inp)?;
                let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", rows * inp)?;
                gemm(op, &gv, &wv, T::zero(), &mut dx)?;
                tensor(xs.shape().clone(), dx)
            });
            Ok(smallvec![dw.transpose()?, db.transpose()?, dx.transpose()?])
        }
        _ => Err(wrong_family(op, "linalg")),
    }
}

/// `c ← a·b + beta·c` (`beta` 0 or 1) with `c` a row-major (a.rows, b.cols) slice. Dimension
/// mismatches are errors naming the op. Row- and column-major views (`.t()`) go to the GEMM as
/// they are; any other layout is copied first.
pub fn gemm<T: Scalar>(
    op: &Op,
    a: &ArrayView2<'_, T>,
    b: &ArrayView2<'_, T>,
    beta: T,
    c: &mut [T],
) -> Result<()> {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    if k != k2 || c.len() != m * n {
        return Err(SpecError::shape(
            op.name(),
            format!(
                "gemm operands ({m}, {k}) · ({k2}, {n}) do not fit a {}-element output",
                c.len()
            ),
        )
        .into());
    }
    let accumulate = if beta == T::zero() {
        false
    } else if beta == T::one() {
        true
    } else {
        return Err(shape_error(
            op,
            format!("gemm with beta = {beta} (only 0 or 1)"),
        ));
    };
    let (mut a_copy, mut b_copy) = (Vec::new(), Vec::new());
    let a = mat_view(op, a, &mut a_copy)?;
    let b = mat_view(op, b, &mut b_copy)?;
    let c = crate::gemm::rows_mut(op, c, m, n)?;
    crate::gemm::matmul(op, c, accumulate, a, b, T::one())
}

/// `v` as a GEMM view: row-major or column-major data as it is, anything else copied into
/// `copy` (row-major).
fn mat_view<'a, T: Scalar>(
    op: &Op,
    v: &ArrayView2<'a, T>,
    copy: &'a mut Vec<T>,
) -> Result<Mat<'a, T>> {
    let (r, c) = v.dim();
    if let Some(s) = v.to_slice() {
        rows(op, s, r, c)
    } else if let Some(s) = (*v).reversed_axes().to_slice() {
        Ok(rows(op, s, c, r)?.t())
    } else {
        *copy = v.iter().copied().collect();
        rows(op, copy, r, c)
    }
}

/// A row-major (rows, cols) view of `data` (an error, not a panic, if the length is wrong).
fn view<'a, T: Scalar>(
    op: &Op,
    data: &'a [T],
    rows: usize,
    cols: usize,
) -> Result<ArrayView2<'a, T>> {
    ArrayView2::from_shape((rows, cols), data).map_err(|e| layout_error(op, e))
}

fn layout_error(op: &Op, e: ndarray::ShapeError) -> crate::Error {
    SpecError::shape(op.name(), format!("matrix view: {e}")).into()
}

/// Run `f` on the `k`-th blocks of `a`, `b` and `c` for every batch `k`; `sizes` are the three
/// block lengths.
fn for_each_batch<T: Scalar>(
    bs: usize,
    sizes: [usize; 3],
    a: &[T],
    b: &[T],
    c: &mut [T],
    mut f: impl FnMut(&[T], &[T], &mut [T]) -> Result<()>,
) -> Result<()> {
    let [sa, sb, sc] = sizes;
    for k in 0..bs {
        let (ak, bk) = (&a[k * sa..(k + 1) * sa], &b[k * sb..(k + 1) * sb]);
        f(ak, bk, &mut c[k * sc..(k + 1) * sc])?;
    }
    Ok(())
}

fn shape_error(op: &Op, detail: String) -> crate::Error {
    SpecError::shape(op.name(), detail).into()
}

/// (m, n, p) of `(m, n) · (n, p)`.
fn matmul_dims<T: Scalar>(op: &Op, a: &Tensor<T>, b: &Tensor<T>) -> Result<(usize, usize, usize)> {
    match (a.shape().dims(), b.shape().dims()) {
        (&[m, n], &[n2, p]) if n == n2 => Ok((m, n, p)),
        _ => Err(shape_error(
            op,
            format!(
                "expected (m, n) · (n, p), got {} · {}",
                a.shape(),
                b.shape()
            ),
        )),
    }
}

/// (B, m, n, p) of `(B, m, n) · (B, n, p)`.
fn bmm_dims<T: Scalar>(
    op: &Op,
    a: &Tensor<T>,
    b: &Tensor<T>,
) -> Result<(usize, usize, usize, usize)> {
    match (a.shape().dims(), b.shape().dims()) {
        (&[ba, m, n], &[bb, n2, p]) if ba == bb && n == n2 => Ok((ba, m, n, p)),
        _ => Err(shape_error(
            op,
            format!(
                "expected (B, m, n) · (B, n, p), got {} · {}",
                a.shape(),
                b.shape()
            ),
        )),
    }
}

/// (out, in, rows, output shape) of `linear(w, b, x)`: w (out, in), b (out), x (in) or (B, in).
fn linear_dims<T: Scalar>(
    op: &Op,
    w: &Tensor<T>,
    b: &Tensor<T>,
    x: &Tensor<T>,
) -> Result<(usize, usize, usize, Shape)> {
    let bad = || {
        shape_error(
            op,
            format!(
                "expected weight (out, in), bias (out), input (in) or (B, in); got {}, {}, {}",
                w.shape(),
                b.shape(),
                x.shape()
            ),
        )
    };
    let &[out, inp] = w.shape().dims() else {
        return Err(bad());
    };
    if b.shape().dims() != [out] {
        return Err(bad());
    }
    match *x.shape().dims() {
        [i] if i == inp => Ok((out, inp, 1, Shape::new(&[out]))),
        [rows, i] if i == inp => Ok((out, inp, rows, Shape::new(&[rows, out]))),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_and_linear_by_hand() {
        let a = Tensor::<f64>::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::<f64>::new([2, 1], vec![5.0, 6.0]).unwrap();
        let c = forward(&Op::Matmul, &[&a, &b]).unwrap();
        assert_eq!(c.data(), &[17.0, 39.0]);
        let g = Tensor::new([2, 1], vec![1.0, -1.0]).unwrap();
        let gr = backward_masked(&Op::Matmul, &[&a, &b], &c, &g, &[]).unwrap();
        // dA = g·bᵀ = [[5, 6], [-5, -6]]; dB = aᵀ·g = [[1-3], [2-4]]
        assert_eq!(gr[0].as_ref().unwrap().data(), &[5.0, 6.0, -5.0, -6.0]);
        assert_eq!(gr[1].as_ref().unwrap().data(), &[-2.0, -2.0]);
        // linear: W (3, 2), b (3), x (2) = [0, 1]: y = W[:, 1] + b
        let w = Tensor::<f64>::from_fn([3, 2], |i| i as f64 - 2.0);
        let bias = Tensor::vector(vec![0.5, -1.0, 2.0]);
        let x = Tensor::vector(vec![0.0, 1.0]);
        let y = forward(&Op::Linear, &[&w, &bias, &x]).unwrap();
        assert_eq!(y.data(), &[-0.5, 0.0, 5.0]);
    }

    #[test]
    fn masked_backward_skips_only_the_unneeded_cotangents() {
        let w = Tensor::<f64>::from_fn([3, 2], |i| i as f64 - 2.0);
        let b = Tensor::vector(vec![0.5, -1.0, 2.0]);
        let x = Tensor::<f64>::from_fn([4, 2], |i| (i * i) as f64);
        let y = forward(&Op::Linear, &[&w, &b, &x]).unwrap();
        let g = Tensor::from_fn([4, 3], |i| 1.0 - i as f64);
        let full = backward_masked(&Op::Linear, &[&w, &b, &x], &y, &g, &[]).unwrap();
        let some =
            backward_masked(&Op::Linear, &[&w, &b, &x], &y, &g, &[true, false, false]).unwrap();
        assert_eq!(some[0], full[0]);
        assert!(some[1].is_none() && some[2].is_none() && full[2].is_some());
        let a = Tensor::<f64>::from_fn([2, 3], |i| i as f64);
        let c = forward(&Op::Matmul, &[&a, &w]).unwrap();
        let gc = Tensor::ones([2, 2]);
        let full = backward_masked(&Op::Matmul, &[&a, &w], &c, &gc, &[]).unwrap();
        let some = backward_masked(&Op::Matmul, &[&a, &w], &c, &gc, &[false, true]).unwrap();
        assert!(some[0].is_none());
        assert_eq!(some[1], full[1]);
    }

    #[test]
    fn inconsistent_operands_are_errors_not_panics() {
        let a = Tensor::<f32>::zeros([2, 3]);
        let e = forward(&Op::Matmul, &[&a, &a]).unwrap_err().to_string();
        assert!(e.contains("matmul") && e.contains("[2, 3] · [2, 3]"), "{e}");
        let e = gemm(
            &Op::Matmul,
            &a.view().into_dimensionality().unwrap(),
            &a.view().into_dimensionality().unwrap(),
            0.0,
            &mut [0.0; 4],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("matmul"), "{e}");
        let w = Tensor::<f32>::zeros([4, 3]);
        let e = forward(&Op::Linear, &[&w, &Tensor::zeros([3]), &Tensor::zeros([3])])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("linear") && e.contains("[4, 3]") && e.contains("[3]"),
            "{e}"
        );
    }
}
