//! Losses: `mseLoss` (mean reduction).

use crate::{Error, Result, Scalar, Shape, Tensor};

/// Shape rule of `mseLoss(ŷ, y)`: equal shapes → scalar.
pub fn mse_loss_shape(yhat: &Shape, y: &Shape) -> Result<Shape> {
    if yhat == y {
        Ok(Shape::scalar())
    } else {
        Err(Error::shape(
            "mseLoss",
            format!("prediction {yhat} and target {y} must have the same shape"),
        ))
    }
}

fn n<T: Scalar>(s: &Shape) -> T {
    T::lit(s.numel().max(1) as f64)
}

/// `Σ(ŷ − y)² / N`, N the element count (1 for a scalar). PyTorch: `F.mse_loss(ŷ, y)`.
pub fn mse_loss<T: Scalar>(yhat: &Tensor<T>, y: &Tensor<T>) -> Result<Tensor<T>> {
    mse_loss_shape(yhat.shape(), y.shape())?;
    let s: T = yhat
        .data()
        .iter()
        .zip(y.data())
        .map(|(&a, &b)| (a - b) * (a - b))
        .sum();
    Ok(Tensor::scalar(s / n(yhat.shape())))
}
/// VJP of `mseLoss`: `(2(ŷ−y)/N · g, −2(ŷ−y)/N · g)`.
pub fn mse_loss_vjp<T: Scalar>(
    yhat: &Tensor<T>,
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    mse_loss_shape(yhat.shape(), y.shape())?;
    let g = g.item().map_err(|_| {
        Error::shape(
            "mseLoss",
            format!("cotangent must be a scalar, got {}", g.shape()),
        )
    })?;
    let c = T::lit(2.0) * g / n(yhat.shape());
    let d = yhat.zip_map("mseLoss", y, |a, b| c * (a - b))?;
    let neg = d.try_map("mseLoss", |v| -v)?;
    Ok((d, neg))
}
/// JVP of `mseLoss`: `Σ 2(ŷ−y)(dŷ−dy) / N`.
pub fn mse_loss_jvp<T: Scalar>(
    yhat: &Tensor<T>,
    y: &Tensor<T>,
    dyhat: &Tensor<T>,
    dy: &Tensor<T>,
) -> Result<Tensor<T>> {
    mse_loss_shape(yhat.shape(), y.shape())?;
    mse_loss_shape(dyhat.shape(), dy.shape())?;
    mse_loss_shape(yhat.shape(), dy.shape())?;
    let s: T = (0..yhat.numel())
        .map(|i| T::lit(2.0) * (yhat.data()[i] - y.data()[i]) * (dyhat.data()[i] - dy.data()[i]))
        .sum();
    Ok(Tensor::scalar(s / n(yhat.shape())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_reduction_by_hand() {
        let a = Tensor::<f64>::vector(vec![1.0, 2.0, 3.0, 4.0]);
        let b = Tensor::<f64>::vector(vec![0.0, 2.0, 1.0, 4.0]);
        assert_eq!(mse_loss(&a, &b).unwrap().item().unwrap(), (1.0 + 4.0) / 4.0);
        let s = mse_loss(&Tensor::scalar(3.0), &Tensor::scalar(1.0)).unwrap();
        assert_eq!(s.item().unwrap(), 4.0);
    }
}
