//! Case generators for the attention family: `maskedSoftmax` and `multiHeadAttention` (masked
//! or not, fused or not), at small sizes (n ≤ 4, dModel ≤ 6, heads ∈ {1, 2}).

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};

use crate::generate::{Size, tensor, tensors};
use crate::{Domain, OpCase};

/// A random (n, n) mask (rows with nothing allowed included).
fn mask(n: usize) -> BoxedStrategy<Mask> {
    prop::collection::vec(any::<bool>(), n * n)
        .prop_map(move |v| Mask::new(n, v).expect("n·n entries"))
        .boxed()
}

/// `maskedSoftmax` on (…, n, n) with 0–1 leading axes, n 1–4 (large: up to 12).
pub fn masked_softmax(z: Size) -> BoxedStrategy<OpCase> {
    (1..=z.pick(4, 12), prop::collection::vec(1usize..=3, 0..=1))
        .prop_flat_map(|(n, lead)| {
            let dims: Vec<usize> = lead.into_iter().chain([n, n]).collect();
            (mask(n), tensor(Shape::from(dims), Domain::Any(3.0)))
        })
        .prop_map(|(mask, x)| OpCase::new(Op::MaskedSoftmax { mask }, vec![x]))
        .boxed()
}

/// `multiHeadAttention(wq, wk, wv, wo, x)`: n 1–4, dModel 1–6, heads 1–2, head width 1–3
/// (large: n ≤ 16, dModel ≤ 16, head width ≤ 4), x unbatched or batched (B ≤ 2), with or without a mask, fused or
/// not. One case in five has n 15–18 (large: 15–34): past the CUDA flash kernels' tile of 16
/// query rows and keys, so its last tile is partial.
pub fn multi_head_attention(z: Size) -> BoxedStrategy<OpCase> {
    let sizes = (
        prop_oneof![4 => 1..=z.pick(4, 16), 1 => 15..=z.pick(18, 34)],
        1..=z.pick(6, 16),
        1usize..=2,
        1..=z.pick(3, 4),
        prop::option::of(1usize..=2),
    );
    (sizes, any::<bool>(), any::<bool>())
        .prop_flat_map(|((n, dm, heads, d, batch), masked, fused)| {
            let p = heads * d;
            let x = match batch {
                None => Shape::new(&[n, dm]),
                Some(b) => Shape::new(&[b, n, dm]),
            };
            let w = Shape::new(&[dm, p]);
            let ws = vec![w.clone(), w.clone(), w, Shape::new(&[p, dm])];
            let m = if masked {
                mask(n).prop_map(Some).boxed()
            } else {
                Just(None).boxed()
            };
            (
                Just((heads, fused)),
                m,
                tensors(ws, Domain::Any(1.0)),
                tensor(x, crate::ANY),
            )
        })
        .prop_map(
            |((heads, fused), mask, mut w, x): (_, _, Vec<Tensor<f64>>, _)| {
                w.push(x);
                let op = Op::MultiHeadAttention { heads, mask, fused };
                OpCase::new(op, w)
            },
        )
        .boxed()
}
