//! `crossEntropy` (Loss family): mean over rows of `−logSoftmax(logits)[r, label_r]`, the labels
//! read from positions `labels_at..labels_at + rows` of the Nat environment.
//!
//! A label ≥ classes is totalized: that row contributes 0 to the sum (it is still counted in the
//! mean's denominator) and gets no gradient. PyTorch raises on such a label; its `ignore_index`
//! is the nearest analogue (but PyTorch also drops ignored rows from the mean).

use super::index::try_nat_vec_at;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Shape rule: logits (classes) or (rows, classes) with rows, classes ≥ 1 → scalar.
pub fn cross_entropy_shape(logits: &Shape) -> Result<Shape> {
    let ok = matches!(logits.dims(), &[c] if c > 0)
        || matches!(logits.dims(), &[r, c] if r > 0 && c > 0);
    if ok {
        Ok(Shape::scalar())
    } else {
        Err(Error::shape(
            "crossEntropy",
            format!("logits must be (classes) or (rows, classes), both non-empty, got {logits}"),
        ))
    }
}

/// `(rows, classes)` of valid logits (a 1-D tensor is one row).
fn dims(logits: &Shape) -> Result<(usize, usize)> {
    cross_entropy_shape(logits)?;
    Ok(match logits.dims() {
        &[c] => (1, c),
        d => (d[0], d[1]),
    })
}

/// The labels the op reads (positions `labels_at..labels_at + rows` of the Nat environment) for `logits` of shape `logits`.
pub fn labels(logits: &Shape, nats: &[usize], labels_at: usize) -> Result<Vec<usize>> {
    let (rows, _) = dims(logits)?;
    try_nat_vec_at("crossEntropy", nats, labels_at, rows)
}

/// Row softmax `p` and log-sum-exp of one row (max-shifted).
fn lse<T: Scalar>(row: &[T]) -> T {
    let m = row.iter().copied().fold(T::neg_infinity(), T::max);
    m + row.iter().map(|&v| (v - m).exp()).sum::<T>().ln()
}

/// Mean over rows of `lse(row) − row[label]` (0 for a row whose label is ≥ classes).
/// PyTorch: `F.cross_entropy(logits, labels)` (mean reduction).
pub fn cross_entropy<T: Scalar>(logits: &Tensor<T>, labels: &[usize]) -> Result<Tensor<T>> {
    let (rows, c) = dims(logits.shape())?;
    let mut s = T::zero();
    for (row, &l) in logits.data().chunks(c).zip(labels) {
        if l < c {
            s += lse(row) - row[l];
        }
    }
    Ok(Tensor::scalar(s / T::lit(rows as f64)))
}

/// VJP of `crossEntropy`: `(softmax(row) − onehot(label)) / rows · g` per valid row, 0 otherwise.
pub fn cross_entropy_vjp<T: Scalar>(
    logits: &Tensor<T>,
    labels: &[usize],
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    let (rows, c) = dims(logits.shape())?;
    let g = g.item().map_err(|_| {
        Error::shape(
            "crossEntropy",
            format!("cotangent must be a scalar, got {}", g.shape()),
        )
    })?;
    let k = g / T::lit(rows as f64);
    let mut out = crate::alloc::try_with_capacity("crossEntropy", "gradient", logits.numel())?;
    for (row, &l) in logits.data().chunks(c).zip(labels) {
        if l < c {
            let z = lse(row);
            out.extend(row.iter().enumerate().map(|(j, &v)| {
                let onehot = if j == l { T::one() } else { T::zero() };
                ((v - z).exp() - onehot) * k
            }));
        } else {
            out.extend(std::iter::repeat_n(T::zero(), c));
        }
    }
    Tensor::new(logits.shape().clone(), out)
}

/// JVP of `crossEntropy`: `Σ_valid rows (Σ_j p_j·dx_j − dx_label) / rows`.
pub fn cross_entropy_jvp<T: Scalar>(
    logits: &Tensor<T>,
    labels: &[usize],
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    if dx.shape() != logits.shape() {
        return Err(Error::shape(
            "crossEntropy",
            format!(
                "tangent has shape {}, expected {}",
                dx.shape(),
                logits.shape()
            ),
        ));
    }
    let (rows, c) = dims(logits.shape())?;
    let mut s = T::zero();
    for ((row, dr), &l) in logits.data().chunks(c).zip(dx.data().chunks(c)).zip(labels) {
        if l < c {
            let z = lse(row);
            let pd: T = row.iter().zip(dr).map(|(&v, &d)| (v - z).exp() * d).sum();
            s += pd - dr[l];
        }
    }
    Ok(Tensor::scalar(s / T::lit(rows as f64)))
}
