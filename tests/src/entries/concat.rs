//! Generators for `concat0` and `sliceRange0` (Shape family); `gelu`/`silu` use [`super::unary`].

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Shape;

use crate::OpCase;
use crate::generate::{Size, capped, shape, tensors};

/// `concat0(a, b)`: ranks 1–3 with equal trailing dims and leading dims 1–4 (large: 1–40).
pub fn concat(z: Size) -> BoxedStrategy<OpCase> {
    let lead = 1..=z.dim();
    (capped(shape(0..=2, 1..=z.pick(4, 16))), lead.clone(), lead)
        .prop_flat_map(|(rest, n, m)| {
            let with = |d: usize| {
                Shape::from(
                    std::iter::once(d)
                        .chain(rest.dims().iter().copied())
                        .collect::<Vec<_>>(),
                )
            };
            tensors(vec![with(n), with(m)], crate::ANY)
        })
        .prop_map(|inputs| OpCase::new(Op::Concat, inputs))
        .boxed()
}

/// `sliceRange0(start, len)` on ranks 1–3 with `1 ≤ len` and `start + len ≤ x₀`.
pub fn slice(z: Size) -> BoxedStrategy<OpCase> {
    capped(shape(1..=3, 1..=z.pick(5, 40)))
        .prop_flat_map(|s| {
            let n = s.dims()[0];
            (Just(s), 0..n).prop_flat_map(move |(s, start)| (Just(s), Just(start), 1..=n - start))
        })
        .prop_flat_map(|(s, start, len)| {
            tensors(vec![s], crate::ANY)
                .prop_map(move |inputs| OpCase::new(Op::Slice { start, len }, inputs))
        })
        .boxed()
}
