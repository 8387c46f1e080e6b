//! Case generators for the pool family: tiny channels-first operands, spatial rank 1–3 (a few
//! 4), optional batch, kernel 1–3, stride 1–2 or, on about one axis in four, an absurd stride
//! the shape rule still accepts ([`absurd_stride`]: past the padded input, past the CUDA
//! kernels' u32 arguments, `usize::MAX`), padding up to half the kernel. maxPool operands
//! are distinct values (a shuffled grid) so no window has a tie; smoothMaxPool draws β in
//! ±[0.5, 4].

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::{Shape, Tensor};

use super::conv::{axes, fit, spatial_rank};
use crate::OpCase;
use crate::generate::{Size, tensor};

/// Smallest gap between two maxPool operand values.
pub const POOL_TIE_MARGIN: f64 = 0.05;

/// Which pool to generate.
#[derive(Debug, Clone, Copy)]
pub enum PoolKind {
    /// `maxPool` (tie-free operands).
    Max,
    /// `avgPool`.
    Avg,
    /// `smoothMaxPool` with β in ±[0.5, 4].
    Smooth,
}

/// Cases of one pool kind.
pub fn pool(z: Size, kind: PoolKind) -> BoxedStrategy<OpCase> {
    let beta = prop_oneof![0.5f64..=4.0, -4.0f64..=-0.5];
    (
        spatial_rank(),
        1..=z.pick(3, 4),
        prop::option::of(1usize..=2),
        beta,
        prop::array::uniform4(0u8..12),
    )
        .prop_flat_map(move |(d, c, batch, beta, absurd)| {
            (Just((c, batch, beta, absurd)), axes(z, d))
        })
        .prop_flat_map(move |((c, mut batch, beta, absurd), axes)| {
            let (mut kernel, mut stride, mut padding, mut spatial) =
                (vec![], vec![], vec![], vec![]);
            let mut floor = vec![];
            for (k, s, p, n) in axes {
                let p = p.min(k / 2);
                let lo = k.saturating_sub(2 * p).max(1);
                kernel.push(k);
                stride.push(s);
                padding.push(p);
                spatial.push(n.max(lo));
                floor.push(lo);
            }
            let mut ch = [c];
            let limit = z.pick(128, crate::generate::LARGE_NUMEL);
            fit(limit, &mut batch, &mut spatial, &floor, &mut ch, 1);
            let c = ch[0];
            for (i, s) in stride.iter_mut().enumerate() {
                let padded = spatial[i] + 2 * padding[i];
                *s = absurd_stride(absurd[i % 4], padded).unwrap_or(*s);
            }
            let mut x: Vec<usize> = batch.into_iter().collect();
            x.push(c);
            x.extend_from_slice(&spatial);
            let shape = Shape::from(x);
            let op = match kind {
                PoolKind::Max => Op::MaxPool {
                    kernel,
                    stride,
                    padding,
                },
                PoolKind::Avg => Op::AvgPool {
                    kernel,
                    stride,
                    padding,
                },
                PoolKind::Smooth => Op::SmoothMaxPool {
                    kernel,
                    stride,
                    padding,
                    beta,
                },
            };
            let x = match kind {
                PoolKind::Max => distinct(shape),
                _ => tensor(shape, crate::ANY),
            };
            x.prop_map(move |x| OpCase::new(op.clone(), vec![x]))
        })
        .boxed()
}

/// The stride of an axis whose padded extent is `padded` for the draw `pick`: one past the
/// padded extent (one window), 2³³ (past the u32 arguments of the CUDA kernels) or
/// `usize::MAX`, each for one pick in twelve; `None` (the drawn stride) otherwise. Any stride
/// ≥ 1 is valid (SEMANTICS.md: out = (in + 2p − k)/s + 1): the backends must agree on these.
pub fn absurd_stride(pick: u8, padded: usize) -> Option<usize> {
    match pick {
        0 => Some(padded + 1),
        1 => Some(1 << 33),
        2 => Some(usize::MAX),
        _ => None,
    }
}

/// A tensor of `shape` whose elements are a shuffled grid `(i − n/2)·Δ` with
/// `Δ = max(4/n, POOL_TIE_MARGIN)`: distinct values at least Δ apart.
pub fn distinct(shape: Shape) -> BoxedStrategy<Tensor<f64>> {
    let n = shape.numel();
    let step = (4.0 / n.max(1) as f64).max(POOL_TIE_MARGIN);
    Just((0..n).collect::<Vec<usize>>())
        .prop_shuffle()
        .prop_map(move |perm| {
            Tensor::from_fn(shape.clone(), |i| (perm[i] as f64 - n as f64 / 2.0) * step)
        })
        .boxed()
}
