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

/// How big generated operands are.
///
/// `Small` keeps every check cheap (finite differences evaluate the op twice per element) and
/// makes shrunk failures readable. `Large` reaches the code paths fast kernels take only on
/// bigger inputs: tiles and blocks (e.g. 32 × 32 transposes), GEMM micro-kernel edges, long
/// reductions; checks 1, 2 and 4 draw a quarter of their cases from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Size {
    /// Dims 1–4 (matrix dims up to 5), ranks 0–3: at most 64 elements per operand.
    Small,
    /// Dims up to 40–80 depending on the op, at most [`LARGE_NUMEL`] elements per operand.
    Large,
}

/// Largest element count of a `Large` operand.
pub const LARGE_NUMEL: usize = 4096;

impl Size {
    /// The largest "ordinary" dim: 4 when small, 40 when large.
    pub fn dim(self) -> usize {
        match self {
            Size::Small => 4,
            Size::Large => 40,
        }
    }

    /// Scale a small-case bound up for large cases (`small` when small, `large` otherwise).
    pub fn pick(self, small: usize, large: usize) -> usize {
        match self {
            Size::Small => small,
            Size::Large => large,
        }
    }
}

/// The default operand shapes: small ranks 0–3 with dims 1–4 (scalars included); large ranks
/// 1–3 with dims 1–40 and at most [`LARGE_NUMEL`] elements.
pub fn any_shape(size: Size) -> BoxedStrategy<Shape> {
    match size {
        Size::Small => shape(0..=3, 1..=4),
        Size::Large => capped(shape(1..=3, 1..=40)),
    }
}

/// Keep shapes of at most [`LARGE_NUMEL`] elements (a rejected shape is redrawn).
pub fn capped(shapes: BoxedStrategy<Shape>) -> BoxedStrategy<Shape> {
    shapes
        .prop_filter("too many elements", |s| s.numel() <= LARGE_NUMEL)
        .boxed()
}

/// Tensors with more elements than this are generated from one seed rather than element by
/// element, so that shrinking a failure spends its budget on the shape, not on thousands of
/// values.
pub const SEEDED_ABOVE: usize = 64;

/// A tensor of `shape` whose elements are drawn from `dom`.
pub fn tensor(shape: Shape, dom: Domain) -> BoxedStrategy<Tensor<f64>> {
    elements(shape, dom.element(), move |bits| dom.from_bits(bits))
}

/// A tensor of `shape`: element by element from `per_element` when it has at most
/// [`SEEDED_ABOVE`] elements (each value shrinks on its own), otherwise element `i` is
/// `from_bits(splitmix64(seed + i·φ))` for one generated `seed` (the same distribution).
pub fn elements(
    shape: Shape,
    per_element: BoxedStrategy<f64>,
    from_bits: impl Fn(u64) -> f64 + Clone + 'static,
) -> BoxedStrategy<Tensor<f64>> {
    let n = shape.numel();
    if n <= SEEDED_ABOVE {
        prop::collection::vec(per_element, n)
            .prop_map(move |v| Tensor::new(shape.clone(), v).expect("length matches the shape"))
            .boxed()
    } else {
        // The seed does not shrink: shrinking works on the shape instead.
        any::<u64>()
            .no_shrink()
            .prop_map(move |seed| {
                Tensor::from_fn(shape.clone(), |i| {
                    let key = seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    from_bits(crate::config::splitmix64(key))
                })
            })
            .boxed()
    }
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
