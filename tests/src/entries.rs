//! Case generators for the registry entries: valid static parameters, operand shapes and operand
//! values for each op, with values drawn from the domain each entry asks for.

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::{Shape, Tensor};

use crate::generate::{any_shape, regroup, shape, tensor, tensors};
use crate::{Domain, OpCase};

/// Margin kept between a clamp operand and either bound.
pub const CLAMP_MARGIN: f64 = 0.05;
/// Smallest `|a − b|` generated for `max`/`min` outside the dedicated tie tests.
pub const TIE_MARGIN: f64 = 0.1;

/// `op(x)` for `x` of any shape (rank 0–3) with elements from `dom`.
pub fn unary(op: Op, dom: Domain) -> BoxedStrategy<OpCase> {
    on_shapes(op, any_shape(), dom)
}

/// `op(x)` for `x` of a shape drawn from `shapes`.
pub fn on_shapes(op: Op, shapes: BoxedStrategy<Shape>, dom: Domain) -> BoxedStrategy<OpCase> {
    shapes
        .prop_flat_map(move |s| tensor(s, dom))
        .prop_map(move |x| OpCase {
            op: op.clone(),
            inputs: vec![x],
        })
        .boxed()
}

/// `mk(p)(x)` for a parameter `p` from `params` and `x` of any shape from `dom`.
pub fn unary_param<P: Clone + std::fmt::Debug + 'static>(
    params: impl Strategy<Value = P> + 'static,
    mk: fn(P) -> Op,
    dom: Domain,
) -> BoxedStrategy<OpCase> {
    params.prop_flat_map(move |p| unary(mk(p), dom)).boxed()
}

/// `op(a, b)` for same-shaped operands drawn from `da` and `db`.
pub fn binary(op: Op, da: Domain, db: Domain) -> BoxedStrategy<OpCase> {
    any_shape()
        .prop_flat_map(move |s| (tensor(s.clone(), da), tensor(s, db)))
        .prop_map(move |(a, b)| OpCase {
            op: op.clone(),
            inputs: vec![a, b],
        })
        .boxed()
}

/// `max`/`min` operands with `|a − b| ≥ TIE_MARGIN` everywhere (ties are tested on purpose
/// elsewhere): `b = a + d` with `|d|` in `[TIE_MARGIN, 1]`.
pub fn tie_free(op: Op) -> BoxedStrategy<OpCase> {
    any_shape()
        .prop_flat_map(|s| {
            (
                tensor(s.clone(), crate::ANY),
                tensor(s, Domain::AwayFromZero(TIE_MARGIN, 1.0)),
            )
        })
        .prop_map(move |(a, d)| {
            let b = a.add(&d).expect("same shapes");
            OpCase {
                op: op.clone(),
                inputs: vec![a, b],
            }
        })
        .boxed()
}

/// `clamp(lo, hi)` with every operand at least [`CLAMP_MARGIN`] from both bounds, spread over
/// the three regions (below, inside, above).
pub fn clamp() -> BoxedStrategy<OpCase> {
    (-1.0f64..=0.5, 0.2f64..=1.5, any_shape())
        .prop_flat_map(|(lo, width, s)| {
            let hi = lo + width;
            let elem = (0u8..3, 0.0f64..=1.0).prop_map(move |(region, t)| match region {
                0 => lo - CLAMP_MARGIN - t,
                1 => lo + CLAMP_MARGIN + t * (hi - lo - 2.0 * CLAMP_MARGIN),
                _ => hi + CLAMP_MARGIN + t,
            });
            let n = s.numel();
            prop::collection::vec(elem, n).prop_map(move |v| OpCase {
                op: Op::Clamp { lo, hi },
                inputs: vec![Tensor::new(s.clone(), v).expect("length matches")],
            })
        })
        .boxed()
}

/// `reshape(to)` to a regrouping of the operand's element count (rank 0–4).
pub fn reshape() -> BoxedStrategy<OpCase> {
    (any_shape(), 0usize..=4, any::<u64>())
        .prop_flat_map(|(s, rank, key)| {
            let to = regroup(s.numel(), rank, key);
            on_shapes(Op::Reshape(to), Just(s).boxed(), crate::ANY)
        })
        .boxed()
}

/// `broadcastTo(to)`: a target of rank 0–4 and a source that is a suffix of it with some dims
/// set to 1 (numpy rules: right-aligned, size-1 dims expand, missing leading dims added).
pub fn broadcast_to() -> BoxedStrategy<OpCase> {
    (shape(0..=4, 1..=3), any::<u8>(), any::<u8>())
        .prop_flat_map(|(to, keep, ones)| {
            let rank = to.rank();
            let src_rank = if rank == 0 {
                0
            } else {
                usize::from(keep) % (rank + 1)
            };
            let dims: Vec<usize> = to.dims()[rank - src_rank..]
                .iter()
                .enumerate()
                .map(|(k, &d)| if ones >> (k % 8) & 1 == 1 { 1 } else { d })
                .collect();
            on_shapes(
                Op::BroadcastTo(to),
                Just(Shape::from(dims)).boxed(),
                crate::ANY,
            )
        })
        .boxed()
}

/// `swapAdjacent(depth)` with depth 0–4 on ranks 0–4 (out-of-range depths are the identity).
pub fn swap_adjacent() -> BoxedStrategy<OpCase> {
    (0usize..=4)
        .prop_flat_map(|d| on_shapes(Op::SwapAdjacent(d), shape(0..=4, 1..=3), crate::ANY))
        .boxed()
}

/// An axis reduction `mk(axis)` on ranks 1–3 with a valid axis.
pub fn reduce_axis(mk: fn(usize) -> Op) -> BoxedStrategy<OpCase> {
    shape(1..=3, 1..=4)
        .prop_flat_map(move |s| {
            (0..s.rank())
                .prop_flat_map(move |axis| on_shapes(mk(axis), Just(s.clone()).boxed(), crate::ANY))
        })
        .boxed()
}

/// Two operands of the given shapes (from a shape-pair strategy) with elements from `ANY`.
fn pair(op: Op, shapes: BoxedStrategy<(Shape, Shape)>) -> BoxedStrategy<OpCase> {
    shapes
        .prop_flat_map(|(a, b)| tensors(vec![a, b], crate::ANY))
        .prop_map(move |inputs| OpCase {
            op: op.clone(),
            inputs,
        })
        .boxed()
}

/// `matmul` on (m, n) · (n, p), dims 1–5.
pub fn matmul() -> BoxedStrategy<OpCase> {
    let shapes = (1usize..=5, 1usize..=5, 1usize..=5)
        .prop_map(|(m, n, p)| (Shape::new(&[m, n]), Shape::new(&[n, p])))
        .boxed();
    pair(Op::Matmul, shapes)
}

/// `bmm` on (B, m, n) · (B, n, p), B 1–3, dims 1–4.
pub fn bmm() -> BoxedStrategy<OpCase> {
    let shapes = (1usize..=3, 1usize..=4, 1usize..=4, 1usize..=4)
        .prop_map(|(b, m, n, p)| (Shape::new(&[b, m, n]), Shape::new(&[b, n, p])))
        .boxed();
    pair(Op::Bmm, shapes)
}

/// `mseLoss` on two operands of the same shape (rank 0–3).
pub fn mse_loss() -> BoxedStrategy<OpCase> {
    pair(
        Op::MseLoss,
        any_shape().prop_map(|s| (s.clone(), s)).boxed(),
    )
}

/// `linear(w, b, x)`: w (out, in), b (out), x (in) or batched (B, in).
pub fn linear() -> BoxedStrategy<OpCase> {
    (1usize..=4, 1usize..=4, prop::option::of(1usize..=3))
        .prop_flat_map(|(out, inp, batch)| {
            let x = match batch {
                None => Shape::new(&[inp]),
                Some(b) => Shape::new(&[b, inp]),
            };
            tensors(
                vec![Shape::new(&[out, inp]), Shape::new(&[out]), x],
                crate::ANY,
            )
        })
        .prop_map(|inputs| OpCase {
            op: Op::Linear,
            inputs,
        })
        .boxed()
}

/// A `constant` node (no operands) holding a tensor of any shape.
pub fn constant() -> BoxedStrategy<OpCase> {
    any_shape()
        .prop_flat_map(|s| tensor(s, crate::ANY))
        .prop_map(|c| OpCase {
            op: Op::Constant(c),
            inputs: vec![],
        })
        .boxed()
}
