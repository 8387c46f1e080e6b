//! Case generators for the registry entries: valid static parameters, operand shapes and operand
//! values for each op, with values drawn from the domain each entry asks for, at either
//! [`Size`].

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Shape;

use crate::generate::{Size, any_shape, capped, elements, regroup, shape, tensor, tensors};
use crate::{Domain, OpCase};

mod concat;
mod index;
pub use concat::*;
pub use index::*;

/// Margin kept between a clamp operand and either bound.
pub const CLAMP_MARGIN: f64 = 0.05;
/// Smallest `|a − b|` generated for `max`/`min` outside the dedicated tie tests.
pub const TIE_MARGIN: f64 = 0.1;

/// `op(x)` for `x` of any shape with elements from `dom`.
pub fn unary(z: Size, op: Op, dom: Domain) -> BoxedStrategy<OpCase> {
    on_shapes(op, any_shape(z), dom)
}

/// `op(x)` for `x` of a shape drawn from `shapes`.
pub fn on_shapes(op: Op, shapes: BoxedStrategy<Shape>, dom: Domain) -> BoxedStrategy<OpCase> {
    shapes
        .prop_flat_map(move |s| tensor(s, dom))
        .prop_map(move |x| OpCase::new(op.clone(), vec![x]))
        .boxed()
}

/// `mk(p)(x)` for a parameter `p` from `params` and `x` of any shape from `dom`.
pub fn unary_param<P: Clone + std::fmt::Debug + 'static>(
    z: Size,
    params: impl Strategy<Value = P> + 'static,
    mk: fn(P) -> Op,
    dom: Domain,
) -> BoxedStrategy<OpCase> {
    params.prop_flat_map(move |p| unary(z, mk(p), dom)).boxed()
}

/// `op(a, b)` for same-shaped operands drawn from `da` and `db`.
pub fn binary(z: Size, op: Op, da: Domain, db: Domain) -> BoxedStrategy<OpCase> {
    any_shape(z)
        .prop_flat_map(move |s| (tensor(s.clone(), da), tensor(s, db)))
        .prop_map(move |(a, b)| OpCase::new(op.clone(), vec![a, b]))
        .boxed()
}

/// `max`/`min` operands with `|a − b| ≥ TIE_MARGIN` everywhere (ties are tested on purpose
/// elsewhere): `b = a + d` with `|d|` in `[TIE_MARGIN, 1]`.
pub fn tie_free(z: Size, op: Op) -> BoxedStrategy<OpCase> {
    any_shape(z)
        .prop_flat_map(|s| {
            (
                tensor(s.clone(), crate::ANY),
                tensor(s, Domain::AwayFromZero(TIE_MARGIN, 1.0)),
            )
        })
        .prop_map(move |(a, d)| {
            let b = a.add(&d).expect("same shapes");
            OpCase::new(op.clone(), vec![a, b])
        })
        .boxed()
}

/// `clamp(lo, hi)` with every operand at least [`CLAMP_MARGIN`] from both bounds, spread over
/// the three regions (below, inside, above).
pub fn clamp(z: Size) -> BoxedStrategy<OpCase> {
    (-1.0f64..=0.5, 0.2f64..=1.5, any_shape(z))
        .prop_flat_map(|(lo, width, s)| {
            let hi = lo + width;
            let place = move |region: u64, t: f64| match region % 3 {
                0 => lo - CLAMP_MARGIN - t,
                1 => lo + CLAMP_MARGIN + t * (hi - lo - 2.0 * CLAMP_MARGIN),
                _ => hi + CLAMP_MARGIN + t,
            };
            let per_element = (0u64..3, 0.0f64..=1.0)
                .prop_map(move |(r, t)| place(r, t))
                .boxed();
            let from_bits = move |bits: u64| place(bits & 3, crate::domain::unit(bits));
            elements(s, per_element, from_bits)
                .prop_map(move |x| OpCase::new(Op::Clamp { lo, hi }, vec![x]))
        })
        .boxed()
}

/// `reshape(to)` to a regrouping of the operand's element count (rank 0–4).
pub fn reshape(z: Size) -> BoxedStrategy<OpCase> {
    (any_shape(z), 0usize..=4, any::<u64>())
        .prop_flat_map(|(s, rank, key)| {
            let to = regroup(s.numel(), rank, key);
            on_shapes(Op::Reshape(to), Just(s).boxed(), crate::ANY)
        })
        .boxed()
}

/// `broadcastTo(to)`: a target of rank 0–4 and a source that is a suffix of it with some dims
/// set to 1 (numpy rules: right-aligned, size-1 dims expand, missing leading dims added).
pub fn broadcast_to(z: Size) -> BoxedStrategy<OpCase> {
    (
        capped(shape(0..=4, 1..=z.pick(3, 16))),
        any::<u8>(),
        any::<u8>(),
    )
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
pub fn swap_adjacent(z: Size) -> BoxedStrategy<OpCase> {
    (0usize..=4)
        .prop_flat_map(move |d| {
            let shapes = capped(shape(0..=4, 1..=z.pick(3, 12)));
            on_shapes(Op::SwapAdjacent(d), shapes, crate::ANY)
        })
        .boxed()
}

/// `op` on rank-`rank` operands (dims up to 4, or up to `large` for large cases).
pub fn of_rank(z: Size, op: Op, rank: usize, large: usize) -> BoxedStrategy<OpCase> {
    let dims = 1..=z.pick(if rank == 2 { 5 } else { 4 }, large);
    on_shapes(op, capped(shape(rank..=rank, dims)), crate::ANY)
}

/// An axis reduction `mk(axis)` on ranks 1–3 with a valid axis.
pub fn reduce_axis(z: Size, mk: fn(usize) -> Op) -> BoxedStrategy<OpCase> {
    capped(shape(1..=3, 1..=z.dim()))
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
        .prop_map(move |inputs| OpCase::new(op.clone(), inputs))
        .boxed()
}

/// `matmul` on (m, n) · (n, p), dims 1–5 (large: 1–48).
pub fn matmul(z: Size) -> BoxedStrategy<OpCase> {
    let d = 1..=z.pick(5, 48);
    let shapes = (d.clone(), d.clone(), d)
        .prop_map(|(m, n, p)| (Shape::new(&[m, n]), Shape::new(&[n, p])))
        .boxed();
    pair(Op::Matmul, shapes)
}

/// `bmm` on (B, m, n) · (B, n, p), B 1–3, dims 1–4 (large: 1–24).
pub fn bmm(z: Size) -> BoxedStrategy<OpCase> {
    let d = 1..=z.pick(4, 24);
    let shapes = (1usize..=3, d.clone(), d.clone(), d)
        .prop_map(|(b, m, n, p)| (Shape::new(&[b, m, n]), Shape::new(&[b, n, p])))
        .boxed();
    pair(Op::Bmm, shapes)
}

/// `mseLoss` on two operands of the same shape.
pub fn mse_loss(z: Size) -> BoxedStrategy<OpCase> {
    pair(
        Op::MseLoss,
        any_shape(z).prop_map(|s| (s.clone(), s)).boxed(),
    )
}

/// `linear(w, b, x)`: w (out, in), b (out), x (in) or batched (B, in).
pub fn linear(z: Size) -> BoxedStrategy<OpCase> {
    let d = 1..=z.pick(4, 48);
    (d.clone(), d, prop::option::of(1..=z.pick(3, 16)))
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
        .prop_map(|inputs| OpCase::new(Op::Linear, inputs))
        .boxed()
}

/// A `constant` node (no operands) holding a tensor of any shape.
pub fn constant(z: Size) -> BoxedStrategy<OpCase> {
    any_shape(z)
        .prop_flat_map(|s| tensor(s, crate::ANY))
        .prop_map(|c| OpCase::new(Op::Constant(c), vec![]))
        .boxed()
}
