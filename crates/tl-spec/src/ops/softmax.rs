//! Softmax and log-softmax along the last axis; leading axes are folded into rows.
//! A scalar is treated as one row of one column.

use super::same_shape;
use crate::alloc::try_with_capacity;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Shape rule of `softmax` / `logSoftmax`: shape-preserving; the last axis must be non-empty.
pub fn softmax_shape(op: &'static str, x: &Shape) -> Result<Shape> {
    if x.rank() > 0 && x.dims()[x.rank() - 1] == 0 {
        return Err(Error::shape(
            op,
            format!("last axis must be non-empty, got shape {x}"),
        ));
    }
    Ok(x.clone())
}

fn rows<T: Scalar>(x: &Tensor<T>) -> impl Iterator<Item = &[T]> {
    let (_, c) = x.shape().rows_cols();
    x.data().chunks(c.max(1))
}

/// `exp(x − m) / Σ exp(x − m)` per row, m the row max. PyTorch: `torch.softmax(x, -1)`.
pub fn softmax<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    let mut out = try_with_capacity("softmax", "output", x.numel())?;
    for row in rows(x) {
        let m = row.iter().copied().fold(T::neg_infinity(), T::max);
        let z: T = row.iter().map(|&v| (v - m).exp()).sum();
        out.extend(row.iter().map(|&v| (v - m).exp() / z));
    }
    Tensor::new(x.shape().clone(), out)
}
/// VJP of `softmax`: `y · (g − Σ g·y)` per row.
pub fn softmax_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    same_shape("softmax", x, g)?;
    let y = softmax(x)?;
    let (_, c) = x.shape().rows_cols();
    let mut out = try_with_capacity("softmax", "gradient", x.numel())?;
    for (yr, gr) in y.data().chunks(c.max(1)).zip(g.data().chunks(c.max(1))) {
        let dot: T = yr.iter().zip(gr).map(|(&y, &g)| y * g).sum();
        out.extend(yr.iter().zip(gr).map(|(&y, &g)| y * (g - dot)));
    }
    Tensor::new(x.shape().clone(), out)
}
/// JVP of `softmax`: `y · (dx − Σ y·dx)` per row.
pub fn softmax_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    // The softmax Jacobian is symmetric, so the JVP has the VJP's formula.
    softmax_vjp(x, dx)
}

/// `x − m − log Σ exp(x − m)` per row, computed directly (never `log(softmax)`).
pub fn log_softmax<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    let mut out = try_with_capacity("logSoftmax", "output", x.numel())?;
    for row in rows(x) {
        let m = row.iter().copied().fold(T::neg_infinity(), T::max);
        let lse = row.iter().map(|&v| (v - m).exp()).sum::<T>().ln();
        out.extend(row.iter().map(|&v| v - m - lse));
    }
    Tensor::new(x.shape().clone(), out)
}
/// VJP of `logSoftmax`: `g − exp(y) · Σ g` per row.
pub fn log_softmax_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    same_shape("logSoftmax", x, g)?;
    let p = softmax(x)?;
    let (_, c) = x.shape().rows_cols();
    let mut out = try_with_capacity("logSoftmax", "gradient", x.numel())?;
    for (pr, gr) in p.data().chunks(c.max(1)).zip(g.data().chunks(c.max(1))) {
        let s: T = gr.iter().copied().sum();
        out.extend(pr.iter().zip(gr).map(|(&p, &g)| g - p * s));
    }
    Tensor::new(x.shape().clone(), out)
}
/// JVP of `logSoftmax`: `dx − Σ softmax(x)·dx` per row.
pub fn log_softmax_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    same_shape("logSoftmax", x, dx)?;
    let p = softmax(x)?;
    let (_, c) = x.shape().rows_cols();
    let mut out = try_with_capacity("logSoftmax", "tangent", x.numel())?;
    for (pr, dr) in p.data().chunks(c.max(1)).zip(dx.data().chunks(c.max(1))) {
        let s: T = pr.iter().zip(dr).map(|(&p, &d)| p * d).sum();
        out.extend(dr.iter().map(|&d| d - s));
    }
    Tensor::new(x.shape().clone(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sum_to_one_and_large_inputs_are_stable() {
        let x = Tensor::<f64>::new([2, 3], vec![1000.0, 1001.0, 1002.0, -5.0, 0.0, 5.0]).unwrap();
        let y = softmax(&x).unwrap();
        for r in y.data().chunks(3) {
            assert!((r.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        let l = log_softmax(&x).unwrap();
        assert!(l.data().iter().all(|v| v.is_finite()));
        // Shift invariance: row 0 equals softmax of [0, 1, 2].
        let e: Vec<f64> = [0.0f64, 1.0, 2.0].iter().map(|v| v.exp()).collect();
        let z: f64 = e.iter().sum();
        assert!((y.data()[2] - e[2] / z).abs() < 1e-15);
        assert!((l.data()[0] - (e[0] / z).ln()).abs() < 1e-12);
    }
}
