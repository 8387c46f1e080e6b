//! Strategy building blocks: shapes and tensors over a [`Domain`].

use proptest::prelude::*;
use tl_spec::{Shape, Tensor};

use crate::Domain;

/// Shapes of rank in `ranks` with each dim in `dims`.
pub fn shape(
    ranks: std::ops::RangeInclusive<usize>,
    dims: std::ops::RangeInclusive<usize>,
) -> BoxedStrategy<Shape> {
    prop::collection::vec(dims, ranks)
        .prop_map(Shape::from)
        .boxed()
}

/// The default operand shapes: rank 0 to 3, dims 1 to 4 (scalars included).
pub fn any_shape() -> BoxedStrategy<Shape> {
    shape(0..=3, 1..=4)
}

/// A tensor of `shape` whose elements are drawn from `dom`.
pub fn tensor(shape: Shape, dom: Domain) -> BoxedStrategy<Tensor<f64>> {
    prop::collection::vec(dom.element(), shape.numel())
        .prop_map(move |v| Tensor::new(shape.clone(), v).expect("length matches the shape"))
        .boxed()
}

/// One tensor per shape, all drawn from `dom`.
pub fn tensors(shapes: Vec<Shape>, dom: Domain) -> BoxedStrategy<Vec<Tensor<f64>>> {
    shapes
        .into_iter()
        .map(|s| tensor(s, dom))
        .collect::<Vec<_>>()
        .boxed()
}

/// Elements of a cotangent or tangent: uniform in `[-1, 1]`.
pub fn direction(shape: Shape) -> BoxedStrategy<Tensor<f64>> {
    tensor(shape, Domain::Any(1.0))
}

/// The prime factors of `n` (with multiplicity), smallest first.
pub fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// A shape with `numel` elements and rank `rank` (rank 0 only when `numel == 1`), obtained by
/// dealing the prime factors of `numel` into `rank` dims in an order picked by `key`.
pub fn regroup(numel: usize, rank: usize, key: u64) -> Shape {
    let rank = if numel == 1 { rank } else { rank.max(1) };
    let mut dims = vec![1usize; rank];
    let mut k = key;
    for p in prime_factors(numel) {
        let slot = (k % rank as u64) as usize;
        k = (k / rank as u64) ^ k.rotate_left(17);
        dims[slot] *= p;
    }
    Shape::from(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regroup_preserves_the_element_count() {
        for numel in 1..=64 {
            for rank in 0..=4 {
                for key in [0, 1, 7, u64::MAX] {
                    let s = regroup(numel, rank, key);
                    assert_eq!(s.numel(), numel, "{numel} {rank} {key} -> {s}");
                    assert!(s.rank() == rank || (rank == 0 && numel > 1 && s.rank() == 1));
                }
            }
        }
        assert_eq!(prime_factors(12), vec![2, 2, 3]);
    }
}
