//! Case generators for the normalization family: `layerNorm`, `rmsNorm`,
//! `batchnormChannelFirst` and `batchMoments`.
//!
//! Normalized values are spread out on purpose: within each group the elements are a
//! permutation of evenly spaced levels (1 apart) plus a perturbation of at most
//! [`NORM_JITTER`], so every group with two or more elements has distinct values and a variance
//! well away from 0, where finite differences and f32 comparisons are well posed.

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::{Shape, Tensor};

use crate::generate::{Size, capped, shape, tensor};
use crate::{Domain, OpCase};

/// Largest perturbation of a normalized element around its level.
pub const NORM_JITTER: f64 = 0.3;

/// ε: the default, PyTorch's, or a larger one.
fn eps() -> BoxedStrategy<f64> {
    prop_oneof![Just(Op::DEFAULT_EPS), Just(1e-5), 1e-3f64..=0.1].boxed()
}

/// `x` with each element moved to level `(pos + group) % count` of its group (centered), where
/// `place(i) = (group, pos, count)`.
fn spread(x: Tensor<f64>, place: impl Fn(usize) -> (usize, usize, usize)) -> Tensor<f64> {
    let data = (x.data().iter().enumerate())
        .map(|(i, &r)| {
            let (g, pos, count) = place(i);
            let level = ((pos + g) % count) as f64 - (count as f64 - 1.0) / 2.0;
            r + level
        })
        .collect();
    Tensor::new(x.shape().clone(), data).expect("same shape")
}

/// `layerNorm(x, γ, β)`: x of rank 1–3 (last axis 1–4; large: up to 16), γ, β of the last axis.
pub fn layer_norm(z: Size) -> BoxedStrategy<OpCase> {
    (eps(), capped(shape(1..=3, 1..=z.pick(4, 16))))
        .prop_flat_map(|(eps, s)| {
            let d = *s.dims().last().expect("rank ≥ 1");
            let affine = Shape::new(&[d]);
            (
                Just(eps),
                tensor(s, Domain::Any(NORM_JITTER)),
                tensor(affine.clone(), crate::ANY),
                tensor(affine, crate::ANY),
            )
        })
        .prop_map(|(eps, x, g, b)| {
            let d = g.numel();
            let x = spread(x, |i| (i / d, i % d, d));
            OpCase::new(Op::LayerNorm { eps }, vec![x, g, b])
        })
        .boxed()
}

/// `rmsNorm(x, γ)`: x as [`layer_norm`]'s (each row a permutation of levels 1 apart, jittered),
/// moved by an offset of magnitude 0.5–2 so that every row's mean square is at least ~0.04 (a
/// row of one element included), where finite differences are well posed.
pub fn rms_norm(z: Size) -> BoxedStrategy<OpCase> {
    (layer_norm(z), prop_oneof![-2.0f64..=-0.5, 0.5f64..=2.0])
        .prop_map(|(case, offset)| {
            let Op::LayerNorm { eps } = case.op else {
                unreachable!("layer_norm draws layerNorm cases")
            };
            let x = case.inputs[0].map(|v| v + offset);
            OpCase::new(Op::RmsNorm { eps }, vec![x, case.inputs[1].clone()])
        })
        .boxed()
}

/// `batchMoments(x)`: x (C, H, W) or (N, C, H, W) with dims 1–3 (large: up to 8), spread per
/// channel as [`batch_norm`]'s x (channels of one element included: variance 0).
pub fn batch_moments(z: Size) -> BoxedStrategy<OpCase> {
    batch_norm(z)
        .prop_map(|case| OpCase::new(Op::BatchMoments, vec![case.inputs[0].clone()]))
        .boxed()
}

/// `batchnormChannelFirst(x, γ, β)`: x (C, H, W) or (N, C, H, W) with dims 1–3 (large: up to
/// 8), γ, β (C).
pub fn batch_norm(z: Size) -> BoxedStrategy<OpCase> {
    (eps(), capped(shape(3..=4, 1..=z.pick(3, 8))))
        .prop_flat_map(|(eps, s)| {
            let r = s.rank();
            let affine = Shape::new(&[s.dims()[r - 3]]);
            (
                Just(eps),
                tensor(s, Domain::Any(NORM_JITTER)),
                tensor(affine.clone(), crate::ANY),
                tensor(affine, crate::ANY),
            )
        })
        .prop_map(|(eps, x, g, b)| {
            let d = x.shape().dims();
            let r = d.len();
            let (c, hw) = (d[r - 3], d[r - 2] * d[r - 1]);
            let count = x.numel() / c;
            let x = spread(x, |i| {
                let (outer, ch, k) = (i / (c * hw), (i / hw) % c, i % hw);
                (ch, outer * hw + k, count)
            });
            OpCase::new(Op::BatchNorm { eps }, vec![x, g, b])
        })
        .boxed()
}
