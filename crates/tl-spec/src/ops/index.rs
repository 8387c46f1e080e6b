//! Indexing: gathers (static, raw, Nat-environment and index-tensor indices) and scatter-adds.
//!
//! Every gather reads *rows* of its operand: a 1-D x of n elements is n rows of one element, a
//! 2-D x of (rows, cols) is rows rows of cols elements. The output is the selected rows stacked
//! in index order. Indices are never differentiable. Static indices are checked at record time
//! (the `*_shape` rules); runtime indices (raw, Nat environment, index tensor) are *totalized*: an
//! out-of-range index yields 0 / a zero row and receives no gradient. The VJP of every gather is
//! the scatter-add of the cotangent rows back into a zero tensor of x's shape, so repeated indices
//! accumulate. Gathers and scatter-adds are linear, so their JVPs are the op applied to tangents.

use crate::{Error, Result, Scalar, Shape, Tensor};

// ---------------------------------------------------------------------------------------------
// the Nat environment

/// The Nat at position `at` of the environment, 0 when `at` is past its end
/// (the seeds' total read).
pub fn nat_at(nats: &[usize], at: usize) -> usize {
    nats.get(at).copied().unwrap_or(0)
}

/// The `k` Nats at positions `at..at + k` of the environment, each read with [`nat_at`] (0 past
/// the end). `k` comes from input: the `k` indices are checked against the allocation cap
/// ([`crate::alloc`]) and allocated fallibly, so an absurd `k` is an error naming `op`, not an
/// abort.
pub fn try_nat_vec_at(op: &'static str, nats: &[usize], at: usize, k: usize) -> Result<Vec<usize>> {
    let mut v = crate::alloc::try_with_capacity(op, "Nat-environment indices", k)?;
    v.extend((0..k).map(|j| at.checked_add(j).map_or(0, |p| nat_at(nats, p))));
    Ok(v)
}

/// An index tensor's element read as a row index: non-negative integral values below `rows`
/// are valid; anything else (negative, fractional, NaN, ±∞, too large) maps to `rows`, which
/// every gather treats as out of range.
pub fn index_value<T: Scalar>(v: T, rows: usize) -> usize {
    let v = v.as_f64();
    if v >= 0.0 && v.fract() == 0.0 && v < rows as f64 {
        v as usize
    } else {
        rows
    }
}

/// The indices held by a 1-D index tensor, via [`index_value`], allocated fallibly (an error
/// naming `op`).
pub fn index_tensor_values<T: Scalar>(
    op: &'static str,
    idx: &Tensor<T>,
    rows: usize,
) -> Result<Vec<usize>> {
    let values = idx.data().iter().map(|&v| index_value(v, rows));
    crate::alloc::try_collect(op, "indices", idx.numel(), values)
}

// ---------------------------------------------------------------------------------------------
// shape rules

fn need_rank(op: &'static str, what: &str, x: &Shape, ranks: &[usize]) -> Result<()> {
    if ranks.contains(&x.rank()) {
        Ok(())
    } else {
        let want: Vec<String> = ranks.iter().map(|r| format!("rank-{r}")).collect();
        Err(Error::shape(
            op,
            format!(
                "{what} must be a {} tensor, got shape {x}",
                want.join(" or ")
            ),
        ))
    }
}

fn check_index(op: &'static str, index: usize, rows: usize, x: &Shape) -> Result<()> {
    if index < rows {
        Ok(())
    } else {
        Err(Error::param(
            op,
            format!("index {index} is out of range for {rows} row(s) of shape {x}"),
        ))
    }
}

/// `(rows, cols)` of a gather operand: (n, 1) for 1-D, (rows, cols) for 2-D.
fn rows_cols(x: &Shape) -> (usize, usize) {
    match *x.dims() {
        [n] => (n, 1),
        [r, c] => (r, c),
        _ => (0, 0),
    }
}

/// Shape rule of a gather of one element of a 1-D x (→ scalar); `index` is checked when given.
pub fn gather_scalar_shape(op: &'static str, x: &Shape, index: Option<usize>) -> Result<Shape> {
    need_rank(op, "operand", x, &[1])?;
    if let Some(i) = index {
        check_index(op, i, x.dims()[0], x)?;
    }
    Ok(Shape::scalar())
}

/// Shape rule of a gather of one row of a 2-D x (→ (cols)); `index` is checked when given.
pub fn gather_row_shape(op: &'static str, x: &Shape, index: Option<usize>) -> Result<Shape> {
    need_rank(op, "operand", x, &[2])?;
    if let Some(i) = index {
        check_index(op, i, x.dims()[0], x)?;
    }
    Ok(Shape::new(&x.dims()[1..]))
}

/// Shape rule of a gather of `k` elements of a 1-D x (→ (k)).
pub fn gather_scalars_shape(op: &'static str, x: &Shape, k: usize) -> Result<Shape> {
    need_rank(op, "operand", x, &[1])?;
    Ok(Shape::new(&[k]))
}

/// Shape rule of a gather of `k` rows of a 2-D x (→ (k, cols)).
pub fn gather_rows_shape(op: &'static str, x: &Shape, k: usize) -> Result<Shape> {
    need_rank(op, "operand", x, &[2])?;
    Ok(Shape::new(&[k, x.dims()[1]]))
}

/// Shape rule of `gather(x, idx)`: x (n) or (rows, cols), idx 1-D (k) → (k) or (k, cols).
pub fn gather_index_tensor_shape(x: &Shape, idx: &Shape) -> Result<Shape> {
    need_rank("gather", "operand x", x, &[1, 2])?;
    need_rank("gather", "index tensor", idx, &[1])?;
    let k = idx.dims()[0];
    Ok(match *x.dims() {
        [_, c] => Shape::new(&[k, c]),
        _ => Shape::new(&[k]),
    })
}

/// Shape rule of `scatterAddVec(x, v, i)`: x (n), v scalar, i < n → (n).
pub fn scatter_add_vec_shape(x: &Shape, v: &Shape, index: usize) -> Result<Shape> {
    let op = "scatterAddVec";
    need_rank(op, "operand x", x, &[1])?;
    if !v.is_scalar() {
        return Err(Error::shape(
            op,
            format!("v must be a scalar, got shape {v} (x has shape {x})"),
        ));
    }
    check_index(op, index, x.dims()[0], x)?;
    Ok(x.clone())
}

/// Shape rule of `scatterAddRow(x, v, i)`: x (rows, cols), v (cols), i < rows → (rows, cols).
pub fn scatter_add_row_shape(x: &Shape, v: &Shape, index: usize) -> Result<Shape> {
    let op = "scatterAddRow";
    need_rank(op, "operand x", x, &[2])?;
    if v.dims() != &x.dims()[1..] {
        return Err(Error::shape(
            op,
            format!(
                "v must have shape [{}] (a row of x {x}), got {v}",
                x.dims()[1]
            ),
        ));
    }
    check_index(op, index, x.dims()[0], x)?;
    Ok(x.clone())
}

// ---------------------------------------------------------------------------------------------
// values and VJPs

/// The rows of `x` (1-D or 2-D) at `idx`, stacked into `out`; an index ≥ rows gives a zero row.
/// PyTorch: `x[idx]` / `torch.index_select(x, 0, idx)` (which raise instead of totalizing).
pub fn gather<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    idx: &[usize],
    out: Shape,
) -> Result<Tensor<T>> {
    need_rank(op, "operand", x.shape(), &[1, 2])?;
    let (rows, cols) = rows_cols(x.shape());
    let mut data = crate::alloc::try_with_capacity(op, "output", out.numel())?;
    for &i in idx {
        if i < rows {
            data.extend_from_slice(&x.data()[i * cols..(i + 1) * cols]);
        } else {
            data.extend(std::iter::repeat_n(T::zero(), cols));
        }
    }
    Tensor::new(out, data)
}

/// VJP of a gather: the cotangent rows of `g` scatter-added into zeros of `x_shape` at `idx`
/// (repeated indices accumulate; out-of-range ones contribute nothing).
pub fn gather_vjp<T: Scalar>(
    op: &'static str,
    x_shape: &Shape,
    idx: &[usize],
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    need_rank(op, "operand", x_shape, &[1, 2])?;
    let (rows, cols) = rows_cols(x_shape);
    if g.numel() != idx.len() * cols {
        return Err(Error::shape(
            op,
            format!(
                "cotangent has shape {}, expected {} row(s) of {cols}",
                g.shape(),
                idx.len()
            ),
        ));
    }
    let mut dx = Tensor::try_zeros(op, x_shape.clone())?;
    let d = dx.data_mut();
    for (&i, gr) in idx.iter().zip(g.data().chunks(cols.max(1))) {
        if i < rows {
            for (a, &b) in d[i * cols..(i + 1) * cols].iter_mut().zip(gr) {
                *a += b;
            }
        }
    }
    Ok(dx)
}

/// `x` with row `index` increased by `v` (functional). PyTorch: `x.index_add(0, i, v)`.
pub fn scatter_add<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    v: &Tensor<T>,
    index: usize,
) -> Result<Tensor<T>> {
    let (rows, cols) = rows_cols(x.shape());
    if index >= rows || v.numel() != cols {
        return Err(Error::shape(
            op,
            format!(
                "cannot add v of shape {} into row {index} of x {}",
                v.shape(),
                x.shape()
            ),
        ));
    }
    let mut out = x.clone();
    for (a, &b) in out.data_mut()[index * cols..(index + 1) * cols]
        .iter_mut()
        .zip(v.data())
    {
        *a += b;
    }
    Ok(out)
}

/// VJP of a scatter-add: `(g, g[index])` with `g[index]` shaped like `v`.
pub fn scatter_add_vjp<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    v: &Tensor<T>,
    index: usize,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let (rows, cols) = rows_cols(x.shape());
    if g.shape() != x.shape() || index >= rows {
        return Err(Error::shape(
            op,
            format!("cotangent has shape {}, expected {}", g.shape(), x.shape()),
        ));
    }
    let row = &g.data()[index * cols..(index + 1) * cols];
    let dv = Tensor::new(
        v.shape().clone(),
        crate::alloc::try_copy(op, "gradient", row)?,
    )?;
    Ok((g.clone(), dv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_reads_are_total() {
        let nats = [3, 1, 4];
        assert_eq!(nat_at(&nats, 2), 4);
        assert_eq!(nat_at(&nats, 3), 0);
        assert_eq!(try_nat_vec_at("t", &nats, 1, 4).unwrap(), vec![1, 4, 0, 0]);
        assert_eq!(
            try_nat_vec_at("t", &nats, usize::MAX, 2).unwrap(),
            vec![0, 0]
        );
        assert_eq!(try_nat_vec_at("g", &nats, 1, 4).unwrap(), vec![1, 4, 0, 0]);
        let e = try_nat_vec_at("gatherScalarsNatVec", &nats, 0, 1 << 61).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    op: "gatherScalarsNatVec",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn index_values_outside_the_naturals_are_out_of_range() {
        for (v, want) in [
            (2.0, 2),
            (-1.0, 5),
            (1.5, 5),
            (f64::NAN, 5),
            (5.0, 5),
            (0.0, 0),
        ] {
            assert_eq!(index_value(v, 5), want, "{v}");
        }
    }

    #[test]
    fn gather_and_its_vjp_by_hand() {
        let x = Tensor::<f64>::new([3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let idx = [2, 7, 2, 0];
        let y = gather("g", &x, &idx, Shape::new(&[4, 2])).unwrap();
        assert_eq!(y.data(), &[5.0, 6.0, 0.0, 0.0, 5.0, 6.0, 1.0, 2.0]);
        let g = Tensor::from_fn([4, 2], |i| i as f64 + 1.0);
        let dx = gather_vjp("g", x.shape(), &idx, &g).unwrap();
        assert_eq!(dx.data(), &[7.0, 8.0, 0.0, 0.0, 6.0, 8.0]);
    }
}
