//! Case generators for the conv family: `conv` and `convTranspose` on tiny channels-first
//! operands, spatial rank 1–3 (a few 4), optional batch, with strides 1–2 and paddings that keep
//! every output non-empty.

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Shape;

use crate::OpCase;
use crate::generate::{Size, tensors};

/// Per-axis `(kernel, stride, padding, spatial)` draws.
type Axis = (usize, usize, usize, usize);

/// Spatial rank 1–3 mostly, 4 sometimes.
pub fn spatial_rank() -> BoxedStrategy<usize> {
    prop_oneof![4 => 1usize..=3, 1 => Just(4)].boxed()
}

/// Per-axis draws for rank `d`: kernel 1–3 (1–2 at rank ≥ 3), stride 1–2, padding 0–1, spatial
/// dims up to 5 (3 at rank 4; 8 for large cases of rank ≤ 2).
pub fn axes(z: Size, d: usize) -> BoxedStrategy<Vec<Axis>> {
    let (kmax, smax): (usize, usize) = match d {
        1 | 2 => (3, z.pick(5, 8)),
        3 => (2, 5),
        _ => (2, 3),
    };
    prop::collection::vec((1..=kmax, 1usize..=2, 0usize..=1, 1..=smax), d).boxed()
}

/// Shrink a case until every operand has at most `limit` elements: drop the batch, then lower
/// the largest spatial dim still above its `floor`, then the largest channel count
/// (`channels[0]` is the operand's; all enter the weight with `kernel_len`).
pub fn fit(
    limit: usize,
    batch: &mut Option<usize>,
    spatial: &mut [usize],
    floor: &[usize],
    channels: &mut [usize],
    kernel_len: usize,
) {
    loop {
        let x = batch.unwrap_or(1) * channels[0] * spatial.iter().product::<usize>();
        let w = channels.iter().product::<usize>() * kernel_len;
        if x <= limit && w <= limit {
            return;
        }
        if x > limit && batch.take().is_some() {
            continue;
        }
        let axis = (0..spatial.len())
            .filter(|&i| spatial[i] > floor[i])
            .max_by_key(|&i| spatial[i]);
        match axis {
            Some(i) if x > limit => spatial[i] -= 1,
            _ => match channels.iter_mut().filter(|c| **c > 1).max_by_key(|c| **c) {
                Some(c) => *c -= 1,
                None => return,
            },
        }
    }
}

/// `conv(w, b, x)` (`transpose = false`) or `convTranspose(w, b, x)`.
pub fn conv_like(z: Size, transpose: bool) -> BoxedStrategy<OpCase> {
    let ch = 1..=z.pick(3, 4);
    (spatial_rank(), ch.clone(), ch, prop::option::of(1usize..=2))
        .prop_flat_map(move |(d, a, c, batch)| (Just((a, c, batch)), axes(z, d)))
        .prop_flat_map(move |((a, c, mut batch), axes)| {
            let (mut kernel, mut stride, mut padding, mut spatial) =
                (vec![], vec![], vec![], vec![]);
            let mut floor = vec![];
            for (k, s, p, n) in axes {
                // conv needs n + 2p ≥ k; convTranspose needs k > 2p (then every output is ≥ 1).
                let p = if transpose { p.min((k - 1) / 2) } else { p };
                let lo = if transpose {
                    1
                } else {
                    k.saturating_sub(2 * p).max(1)
                };
                kernel.push(k);
                stride.push(s);
                padding.push(p);
                spatial.push(n.max(lo));
                floor.push(lo);
            }
            // The operand's channels first: conv reads c, convTranspose a.
            let mut ch = if transpose { [a, c] } else { [c, a] };
            let limit = z.pick(128, crate::generate::LARGE_NUMEL);
            fit(
                limit,
                &mut batch,
                &mut spatial,
                &floor,
                &mut ch,
                kernel.iter().product(),
            );
            let (a, c) = if transpose {
                (ch[0], ch[1])
            } else {
                (ch[1], ch[0])
            };
            // Weight (small channels a, big channels c, kernel): conv x has c channels, convT a.
            let mut w = vec![a, c];
            w.extend_from_slice(&kernel);
            let (in_c, out_c) = if transpose { (a, c) } else { (c, a) };
            let mut x: Vec<usize> = batch.into_iter().collect();
            x.push(in_c);
            x.extend_from_slice(&spatial);
            let op = if transpose {
                Op::ConvTranspose { stride, padding }
            } else {
                Op::Conv { stride, padding }
            };
            let shapes = vec![Shape::from(w), Shape::new(&[out_c]), Shape::from(x)];
            tensors(shapes, crate::ANY).prop_map(move |inputs| OpCase::new(op.clone(), inputs))
        })
        .boxed()
}

/// `conv` cases.
pub fn conv(z: Size) -> BoxedStrategy<OpCase> {
    conv_like(z, false)
}

/// `convTranspose` cases.
pub fn conv_transpose(z: Size) -> BoxedStrategy<OpCase> {
    conv_like(z, true)
}
