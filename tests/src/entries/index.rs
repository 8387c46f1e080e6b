//! Generators for the Index family (gathers, scatter-adds) and `crossEntropy`.
//!
//! Runtime indices (raw, Nat environment, index tensor) deliberately include out-of-range and
//! repeated values, so the totalized zero rows and the accumulating backward are exercised;
//! Nat-environment ops get their indices through [`OpCase::with_nats`], at a random offset and
//! sometimes partly past the end of the environment (which reads 0).

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::{Shape, Tensor};

use crate::generate::{Size, capped, shape, tensor, tensors};
use crate::{Domain, OpCase};

/// x of rank 1 (n) or 2 (rows, cols) with dims 1–5 (large: n up to 1024, rows and cols up to
/// 40).
fn gather_operand(z: Size, rank: usize) -> BoxedStrategy<Shape> {
    let large = if rank == 1 { 1024 } else { 40 };
    capped(shape(rank..=rank, 1..=z.pick(5, large)))
}

/// `k` runtime indices for `rows` rows: values in `0..rows + 2` (so some are out of range), and
/// when `force` is set, index 1 out of range and the last a repeat of the first.
fn runtime_indices(rows: usize, k: usize) -> BoxedStrategy<Vec<usize>> {
    (prop::collection::vec(0..rows + 2, k), any::<bool>())
        .prop_map(move |(mut v, force)| {
            if force && v.len() >= 2 {
                v[1] = rows + 1;
                let last = v.len() - 1;
                if last >= 2 {
                    v[last] = v[0];
                }
            }
            v
        })
        .boxed()
}

/// A static-index gather `mk(index)` on a rank-`rank` operand; `in_range` keeps the index valid
/// (checked ops), otherwise it may exceed the rows by up to 2 (raw ops).
pub fn gather_static(
    z: Size,
    rank: usize,
    in_range: bool,
    mk: fn(usize) -> Op,
) -> BoxedStrategy<OpCase> {
    gather_operand(z, rank)
        .prop_flat_map(move |s| {
            let rows = s.dims()[0];
            let hi = if in_range { rows } else { rows + 2 };
            (tensor(s, crate::ANY), 0..hi)
        })
        .prop_map(move |(x, i)| OpCase::new(mk(i), vec![x]))
        .boxed()
}

/// A Nat-environment gather: `mk(at, k)` with the indices written at `at` into a random
/// environment (k = 1 for the single-index ops, `single`); the environment sometimes stops
/// before the last index (a read past its end gives 0).
pub fn gather_nat(
    z: Size,
    rank: usize,
    single: bool,
    mk: fn(usize, usize) -> Op,
) -> BoxedStrategy<OpCase> {
    let k = if single { 1..=1 } else { 1..=z.pick(5, 24) };
    (gather_operand(z, rank), k, 0usize..=3, any::<bool>())
        .prop_flat_map(|(s, k, at, truncate)| {
            let rows = s.dims()[0];
            (
                tensor(s, crate::ANY),
                Just((k, at, truncate)),
                prop::collection::vec(0..rows + 2, at),
                runtime_indices(rows, k),
            )
        })
        .prop_map(move |(x, (k, at, truncate), mut nats, idx)| {
            nats.extend(idx);
            if truncate {
                nats.pop();
            }
            OpCase::with_nats(mk(at, k), vec![x], nats)
        })
        .boxed()
}

/// One index-tensor element for `rows` rows: mostly valid indices, sometimes out of range,
/// negative or fractional (all of which gather a zero row).
fn index_element(rows: usize) -> BoxedStrategy<f64> {
    prop_oneof![
        6 => (0..rows).prop_map(|i| i as f64),
        1 => Just(rows as f64),
        1 => Just(-1.0),
        1 => Just(0.5),
        1 => Just(rows as f64 + 2.25),
    ]
    .boxed()
}

/// `gather(x, idx)`: x 1-D or 2-D, idx of length 1–6 (large: 1–24), with a forced repeat.
pub fn gather_index_tensor(z: Size) -> BoxedStrategy<OpCase> {
    (1usize..=2, 1..=z.pick(6, 24))
        .prop_flat_map(move |(rank, k)| (gather_operand(z, rank), Just(k)))
        .prop_flat_map(|(s, k)| {
            let rows = s.dims()[0];
            (
                tensor(s, crate::ANY),
                prop::collection::vec(index_element(rows), k),
            )
        })
        .prop_map(|(x, mut idx)| {
            if idx.len() >= 3 {
                idx[2] = idx[0];
            }
            OpCase::new(Op::GatherIndexTensor, vec![x, Tensor::vector(idx)])
        })
        .boxed()
}

/// `scatterAddVec(x, v)` / `scatterAddRow(x, v)` with a valid index (`row` picks the variant).
pub fn scatter_add(z: Size, row: bool) -> BoxedStrategy<OpCase> {
    gather_operand(z, if row { 2 } else { 1 })
        .prop_flat_map(move |s| {
            let v = Shape::new(&s.dims()[1..]);
            let rows = s.dims()[0];
            (tensors(vec![s, v], crate::ANY), 0..rows)
        })
        .prop_map(move |(inputs, index)| {
            let op = if row {
                Op::ScatterAddRow { index }
            } else {
                Op::ScatterAddVec { index }
            };
            OpCase::new(op, inputs)
        })
        .boxed()
}

/// `crossEntropy { labels_at }`: logits (classes) or (rows, classes), labels in
/// `0..=classes` (classes itself is out of range: that row contributes 0) at offset 0–2.
pub fn cross_entropy(z: Size) -> BoxedStrategy<OpCase> {
    (
        prop::option::of(1..=z.pick(4, 32)),
        1..=z.pick(5, 40),
        0usize..=2,
    )
        .prop_flat_map(|(rows, classes, at)| {
            let s = match rows {
                Some(r) => Shape::new(&[r, classes]),
                None => Shape::new(&[classes]),
            };
            let r = rows.unwrap_or(1);
            (
                tensor(s, Domain::Any(3.0)),
                Just(at),
                prop::collection::vec(0..=classes, at + r),
            )
        })
        .prop_map(|(x, at, nats)| {
            OpCase::with_nats(Op::CrossEntropy { labels_at: at }, vec![x], nats)
        })
        .boxed()
}
