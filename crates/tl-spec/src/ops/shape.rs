//! Shape ops: reshape, flatten and axis permutations. Their VJPs are the inverse permutation
//! (applied in `tl_ir::rules`); their JVPs are the op itself, as they are linear.

use crate::{Error, Result, Scalar, Shape, Tensor};

/// Shape rule of `reshape`: same element count (a target whose count overflows is an error).
pub fn reshape_shape(x: &Shape, to: &Shape) -> Result<Shape> {
    if x.checked_numel() == Some(to.check_size("reshape")?) {
        Ok(to.clone())
    } else {
        Err(Error::shape(
            "reshape",
            format!(
                "cannot reshape {x} ({} elements) to {to} ({} elements)",
                x.numel(),
                to.numel()
            ),
        ))
    }
}

/// Shape rule of `flatten`: one axis of all the elements.
pub fn flatten_shape(x: &Shape) -> Shape {
    Shape::new(&[x.numel()])
}

/// `flatten`: the elements as a 1-D tensor (shares storage).
pub fn flatten<T: Scalar>(x: &Tensor<T>) -> Tensor<T> {
    x.reshape(flatten_shape(x.shape()))
        .expect("flatten preserves the element count")
}

fn need_rank(op: &'static str, x: &Shape, rank: usize) -> Result<()> {
    if x.rank() == rank {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("expected a rank-{rank} tensor, got shape {x}"),
        ))
    }
}

/// The shape of `x` with its axes permuted: output axis k is input axis `perm[k]`.
fn permuted_shape(x: &Shape, perm: &[usize]) -> Shape {
    Shape::new(&perm.iter().map(|&p| x.dims()[p]).collect::<Vec<_>>())
}

/// Permute axes: output axis k is input axis `perm[k]` (the naive multi-index loop); the output
/// is allocated fallibly, an error naming `op`.
pub fn permute<T: Scalar>(op: &'static str, x: &Tensor<T>, perm: &[usize]) -> Result<Tensor<T>> {
    let out_shape = permuted_shape(x.shape(), perm);
    let in_strides = x.shape().strides();
    let out_dims = out_shape.dims().to_vec();
    let src = x.data();
    Tensor::try_from_fn(op, out_shape, |mut flat| {
        // Decompose the output flat index into its multi-index, outermost last.
        let mut offset = 0;
        for k in (0..out_dims.len()).rev() {
            let i = flat % out_dims[k];
            flat /= out_dims[k];
            offset += i * in_strides[perm[k]];
        }
        src[offset]
    })
}

/// Shape rule of `transpose2d`: (m, n) → (n, m).
pub fn transpose2d_shape(x: &Shape) -> Result<Shape> {
    need_rank("transpose2d", x, 2)?;
    Ok(permuted_shape(x, &[1, 0]))
}
/// `transpose2d`: (m, n) → (n, m).
pub fn transpose2d<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    transpose2d_shape(x.shape())?;
    permute("transpose2d", x, &[1, 0])
}

/// Shape rule of `permuteBCA`: (a, b, c) → (b, c, a).
pub fn permute_bca_shape(x: &Shape) -> Result<Shape> {
    need_rank("permuteBCA", x, 3)?;
    Ok(permuted_shape(x, &[1, 2, 0]))
}
/// (a, b, c) → (b, c, a). Its inverse is [`permute_cab`].
pub fn permute_bca<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    permute_bca_shape(x.shape())?;
    permute("permuteBCA", x, &[1, 2, 0])
}

/// Shape rule of `permuteCAB`: (a, b, c) → (c, a, b).
pub fn permute_cab_shape(x: &Shape) -> Result<Shape> {
    need_rank("permuteCAB", x, 3)?;
    Ok(permuted_shape(x, &[2, 0, 1]))
}
/// (a, b, c) → (c, a, b). Its inverse is [`permute_bca`].
pub fn permute_cab<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    permute_cab_shape(x.shape())?;
    permute("permuteCAB", x, &[2, 0, 1])
}

/// Shape rule of `swapLastTwo`: (a, b, c) → (a, c, b).
pub fn swap_last_two_shape(x: &Shape) -> Result<Shape> {
    need_rank("swapLastTwo", x, 3)?;
    Ok(permuted_shape(x, &[0, 2, 1]))
}
/// (a, b, c) → (a, c, b); its own inverse.
pub fn swap_last_two<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    swap_last_two_shape(x.shape())?;
    permute("swapLastTwo", x, &[0, 2, 1])
}

fn swap_adjacent_perm(rank: usize, depth: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).collect();
    if depth < rank.saturating_sub(1) {
        perm.swap(depth, depth + 1);
    }
    perm
}

/// Shape rule of `swapAdjacent(depth)`: swap axes depth and depth+1; identity when out of range.
pub fn swap_adjacent_shape(x: &Shape, depth: usize) -> Shape {
    permuted_shape(x, &swap_adjacent_perm(x.rank(), depth))
}
/// Swap axes `depth` and `depth + 1` (identity when `depth + 1 ≥ rank`); its own inverse.
pub fn swap_adjacent<T: Scalar>(x: &Tensor<T>, depth: usize) -> Result<Tensor<T>> {
    permute(
        "swapAdjacent",
        x,
        &swap_adjacent_perm(x.shape().rank(), depth),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_move_elements_as_documented() {
        let x = Tensor::<f64>::from_fn([2, 3, 4], |i| i as f64);
        let y = permute_bca(&x).unwrap();
        assert_eq!(y.shape(), &Shape::new(&[3, 4, 2]));
        // y[b, c, a] = x[a, b, c]
        assert_eq!(y.get(&[1, 2, 1]), x.get(&[1, 1, 2]));
        let z = permute_cab(&y).unwrap();
        assert_eq!(z, x);
        let s = swap_last_two(&x).unwrap();
        assert_eq!(s.get(&[1, 3, 2]), x.get(&[1, 2, 3]));
        assert_eq!(swap_adjacent(&x, 5).unwrap(), x);
        assert_eq!(
            swap_adjacent(&x, usize::MAX).unwrap(),
            x,
            "out of range (even at MAX) = identity"
        );
        assert_eq!(swap_adjacent(&x, 2).unwrap(), x);
        assert_eq!(swap_adjacent_shape(x.shape(), usize::MAX), *x.shape());
        assert_eq!(swap_adjacent(&x, 1).unwrap(), s);
        let t = transpose2d(&Tensor::<f64>::from_fn([2, 3], |i| i as f64)).unwrap();
        assert_eq!(t.data(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn wrong_rank_is_an_error() {
        let e = transpose2d(&Tensor::<f32>::zeros([2, 3, 4]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("transpose2d") && e.contains("[2, 3, 4]"), "{e}");
        assert!(reshape_shape(&Shape::new(&[2, 3]), &Shape::new(&[5])).is_err());
        // Both saturate numel() at usize::MAX; they must still not be "equal sizes".
        let huge = Shape::new(&[1 << 40, 1 << 40]);
        assert!(reshape_shape(&huge, &Shape::new(&[1 << 41, 1 << 41])).is_err());
    }
}
