//! numpy/PyTorch broadcasting: right-aligned dims, size-1 dims expand, missing leading dims are
//! added. The reduction back (`reduce_to`) is the VJP of `broadcast_to`.

use crate::{Error, Result, Scalar, Shape, Tensor};

/// Whether `from` broadcasts to `to` under numpy rules (right-aligned; a dim of `from` must
/// equal the matching dim of `to` or be 1; `to` may have extra leading dims).
pub fn can_broadcast_to(from: &Shape, to: &Shape) -> bool {
    if from.rank() > to.rank() {
        return false;
    }
    let offset = to.rank() - from.rank();
    from.dims()
        .iter()
        .zip(&to.dims()[offset..])
        .all(|(&f, &t)| f == t || f == 1)
}

/// The shape rule of `broadcastTo`: `to` when `from` broadcasts to it, else an error.
pub fn broadcast_shape(from: &Shape, to: &Shape) -> Result<Shape> {
    to.check_size("broadcastTo")?;
    if can_broadcast_to(from, to) {
        Ok(to.clone())
    } else {
        Err(Error::shape(
            "broadcastTo",
            format!(
                "cannot broadcast {from} to {to} (dims are matched from the right; each must be equal or 1)"
            ),
        ))
    }
}

/// For each element of `to` (row-major), the row-major index of the element of `from` it reads.
/// Computed with a mixed-radix counter: no division per element.
pub fn source_indices(from: &Shape, to: &Shape) -> Result<Vec<usize>> {
    broadcast_shape(from, to)?;
    let rank = to.rank();
    let offset = rank - from.rank();
    // Stride into `from` for each axis of `to` (0 where broadcast).
    let from_strides = from.strides();
    let mut stride = vec![0usize; rank];
    for (k, s) in stride.iter_mut().enumerate().skip(offset) {
        let fd = from.dims()[k - offset];
        *s = if fd == 1 { 0 } else { from_strides[k - offset] };
    }
    let n = to.numel();
    let mut out = crate::alloc::try_with_capacity("broadcastTo", "source indices", n)?;
    let mut counter = vec![0usize; rank];
    let mut src = 0usize;
    for _ in 0..n {
        out.push(src);
        // Increment the counter from the innermost axis.
        for k in (0..rank).rev() {
            counter[k] += 1;
            src += stride[k];
            if counter[k] < to.dims()[k] {
                break;
            }
            src -= stride[k] * counter[k];
            counter[k] = 0;
        }
    }
    Ok(out)
}

/// Broadcast `x` to `to`. PyTorch: `x.expand(to).contiguous()`.
pub fn broadcast_to<T: Scalar>(x: &Tensor<T>, to: &Shape) -> Result<Tensor<T>> {
    let idx = source_indices(x.shape(), to)?;
    let src = x.data();
    let n = idx.len();
    let values = idx.into_iter().map(|i| src[i]);
    Tensor::new(
        to.clone(),
        crate::alloc::try_collect("broadcastTo", "output", n, values)?,
    )
}

/// Sum `g` (shaped like a broadcast result) back to `from`: the VJP of `broadcast_to`.
/// PyTorch: `g.sum_to_size(from)`.
pub fn reduce_to<T: Scalar>(g: &Tensor<T>, from: &Shape) -> Result<Tensor<T>> {
    let idx = source_indices(from, g.shape())?;
    let mut out = crate::alloc::try_vec("broadcastTo", "gradient", from.numel(), T::zero())?;
    for (&i, &v) in idx.iter().zip(g.data()) {
        out[i] += v;
    }
    Tensor::new(from.clone(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_aligned_rules() {
        let s = |d: &[usize]| Shape::new(d);
        assert!(can_broadcast_to(&s(&[3]), &s(&[2, 3])));
        assert!(can_broadcast_to(&s(&[1, 3]), &s(&[4, 3])));
        assert!(can_broadcast_to(&s(&[]), &s(&[2, 2])));
        assert!(can_broadcast_to(&s(&[2, 1]), &s(&[2, 5])));
        // TorchLean's left-greedy match would accept this; numpy does not.
        assert!(!can_broadcast_to(&s(&[2]), &s(&[2, 3])));
        assert!(!can_broadcast_to(&s(&[2, 3]), &s(&[3])));
    }

    #[test]
    fn broadcast_then_reduce() {
        let x = Tensor::<f64>::new([2, 1], vec![1.0, 2.0]).unwrap();
        let y = broadcast_to(&x, &Shape::new(&[3, 2, 2])).unwrap();
        assert_eq!(
            y.data(),
            &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
        );
        let g = Tensor::<f64>::from_fn([3, 2, 2], |i| i as f64);
        let r = reduce_to(&g, x.shape()).unwrap();
        // rows of g with i/2 even go to x[0]: 0+1+4+5+8+9 = 27; the rest to x[1]: 2+3+6+7+10+11 = 39
        assert_eq!(r.data(), &[27.0, 39.0]);
    }

    #[test]
    fn bad_broadcast_names_op_and_shapes() {
        let x = Tensor::<f32>::zeros([2]);
        let msg = broadcast_to(&x, &Shape::new(&[2, 3]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("broadcastTo") && msg.contains("[2]") && msg.contains("[2, 3]"),
            "{msg}"
        );
    }
}
