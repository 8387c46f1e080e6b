//! Concatenation and slicing along axis 0 (the seeds' `concat0`/`concat1d` and
//! `sliceRange0`/`slice1d`). Both are linear: their JVPs are the op applied to the tangents; the
//! VJP of `concat0` splits the cotangent, that of `sliceRange0` pads it with zeros.

use crate::alloc::{try_copy, try_with_capacity};
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Shape rule of `concat0(a, b)`: ranks ≥ 1 with equal trailing dims → (a₀ + b₀, rest...).
pub fn concat_shape(a: &Shape, b: &Shape) -> Result<Shape> {
    if a.rank() == 0 || b.rank() == 0 || a.dims()[1..] != b.dims()[1..] {
        return Err(Error::shape(
            "concat0",
            format!(
                "operands need rank ≥ 1 and equal trailing dims to join along axis 0, got {a} and {b}"
            ),
        ));
    }
    let mut dims = a.dims().to_vec();
    dims[0] = dims[0]
        .checked_add(b.dims()[0])
        .ok_or_else(|| Error::TooLarge {
            op: "concat0",
            detail: format!("axis 0 of {a} joined to that of {b} overflows usize"),
        })?;
    Ok(Shape::from(dims))
}

/// `concat0(a, b)`: the rows of `a` then those of `b`. PyTorch: `torch.cat([a, b], dim=0)`.
pub fn concat<T: Scalar>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    let out = concat_shape(a.shape(), b.shape())?;
    let mut data = try_with_capacity("concat0", "output", out.numel())?;
    data.extend_from_slice(a.data());
    data.extend_from_slice(b.data());
    Tensor::new(out, data)
}

/// VJP of `concat0`: the cotangent split back into the operands' parts.
pub fn concat_vjp<T: Scalar>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    let out = concat_shape(a.shape(), b.shape())?;
    if g.shape() != &out {
        return Err(Error::shape(
            "concat0",
            format!("cotangent has shape {}, expected {out}", g.shape()),
        ));
    }
    let (ga, gb) = g.data().split_at(a.numel());
    Ok((
        Tensor::new(a.shape().clone(), try_copy("concat0", "gradient", ga)?)?,
        Tensor::new(b.shape().clone(), try_copy("concat0", "gradient", gb)?)?,
    ))
}

/// Shape rule of `sliceRange0(start, len)`: rank ≥ 1 and `start + len ≤ x₀` → (len, rest...).
pub fn slice_shape(x: &Shape, start: usize, len: usize) -> Result<Shape> {
    if x.rank() == 0 {
        return Err(Error::shape(
            "sliceRange0",
            format!("cannot slice a scalar along axis 0 (shape {x})"),
        ));
    }
    let n = x.dims()[0];
    if start.checked_add(len).is_none_or(|end| end > n) {
        return Err(Error::param(
            "sliceRange0",
            format!("range {start}..{start}+{len} is out of bounds for axis 0 of shape {x}"),
        ));
    }
    let mut dims = x.dims().to_vec();
    dims[0] = len;
    Ok(Shape::from(dims))
}

/// `sliceRange0(start, len)`: `x[start..start+len]` along axis 0. PyTorch: `x[start:start+len]`
/// (which clamps an out-of-range slice; here it is an error).
pub fn slice<T: Scalar>(x: &Tensor<T>, start: usize, len: usize) -> Result<Tensor<T>> {
    let out = slice_shape(x.shape(), start, len)?;
    let row = row_len(x.shape());
    let rows = &x.data()[start * row..(start + len) * row];
    Tensor::new(out, try_copy("sliceRange0", "output", rows)?)
}

/// VJP of `sliceRange0`: the cotangent placed at rows `start..start+len` of zeros of x's shape.
pub fn slice_vjp<T: Scalar>(
    x: &Tensor<T>,
    start: usize,
    len: usize,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    let out = slice_shape(x.shape(), start, len)?;
    if g.shape() != &out {
        return Err(Error::shape(
            "sliceRange0",
            format!("cotangent has shape {}, expected {out}", g.shape()),
        ));
    }
    let row = row_len(x.shape());
    let mut dx = Tensor::try_zeros("sliceRange0", x.shape().clone())?;
    dx.data_mut()[start * row..(start + len) * row].copy_from_slice(g.data());
    Ok(dx)
}

/// Elements per axis-0 row of `x` (rank ≥ 1); 0 when `x` holds no element, whatever its other
/// dims (the product of those may overflow: `[1, 2⁶², 8, 0]`).
fn row_len(x: &Shape) -> usize {
    if x.dims().contains(&0) {
        return 0;
    }
    x.dims()[1..].iter().product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_then_slice_round_trips() {
        let a = Tensor::<f64>::from_fn([2, 3], |i| i as f64);
        let b = Tensor::<f64>::from_fn([1, 3], |i| 10.0 + i as f64);
        let c = concat(&a, &b).unwrap();
        assert_eq!(c.shape(), &Shape::new(&[3, 3]));
        assert_eq!(slice(&c, 0, 2).unwrap(), a);
        assert_eq!(slice(&c, 2, 1).unwrap(), b);
        let dx = slice_vjp(&c, 1, 2, &Tensor::ones([2, 3])).unwrap();
        assert_eq!(dx.data()[..3], [0.0; 3]);
        assert!(slice_shape(&Shape::new(&[3]), 2, 2).is_err());
        assert!(slice_shape(&Shape::new(&[3]), usize::MAX, 2).is_err());
        assert!(concat_shape(&Shape::new(&[2, 3]), &Shape::new(&[2, 4])).is_err());
    }
}
