//! Graphs of the attention ops and the runs on the CUDA tape that the tape, autocast and
//! sdpa modules share.

use super::*;

/// `multiHeadAttention` over leaves `[wq, wk, wv, wo, x]` (x (B, n, dModel)), then a weighted
/// sum, as one graph.
pub(super) fn mha_graph(
    op: Op,
    batch: usize,
    n: usize,
    dm: usize,
    p: usize,
) -> (tl_ir::GraphData, usize) {
    let mut b = GraphBuilder::new();
    let w = [[dm, p], [dm, p], [dm, p], [p, dm]].map(|s| b.leaf(s, None).unwrap());
    let x = b.leaf([batch, n, dm], None).unwrap();
    let r = b.leaf([batch, n, dm], None).unwrap();
    let y = b.apply(op, &[w[0], w[1], w[2], w[3], x]).unwrap();
    let yr = b.apply(Op::Mul, &[y, r]).unwrap();
    let out = b.apply(Op::Sum, &[yr]).unwrap();
    (b.finish(), out)
}

pub(super) fn mha(heads: usize, mask: Option<Mask>, fused: bool) -> Op {
    Op::MultiHeadAttention { heads, mask, fused }
}

/// The bits of graph id `id`'s value, `graph` replayed on `tape` with `leaves`.
pub(super) fn node_bits(
    mut tape: CudaTape<SimDevice>,
    graph: &tl_ir::GraphData,
    leaves: &[Tensor<f64>],
    id: usize,
) -> Vec<u32> {
    let ids = graph.replay(&mut tape, leaves, &[]).unwrap();
    bits_of(&tape.read::<f32>(ids[id]).unwrap().into_vec())
}

/// Values and gradients of `multiHeadAttention` on a fresh sim tape, as f64.
pub(super) fn tape_run(op: &Op, leaves: &[Tensor<f64>]) -> Vec<Tensor<f64>> {
    let (graph, out) = mha_graph(op.clone(), 2, 21, 6, 8);
    value_and_first_grads(&graph, out, leaves, 5)
}

/// The value of `out` and the gradients of the first `n` leaves on a fresh sim tape, as f64.
pub(super) fn value_and_first_grads(
    graph: &tl_ir::GraphData,
    out: usize,
    leaves: &[Tensor<f64>],
    n: usize,
) -> Vec<Tensor<f64>> {
    let mut tape = CudaTape::new(SimDevice::new());
    let ids = graph.replay(&mut tape, leaves, &[]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let grads = tape.backward_dense(ids[out], &seed).unwrap();
    let mut res = vec![tape.read(ids[out]).unwrap()];
    for &id in &ids[..n] {
        res.push(grads[id].download(tape.device()).unwrap());
    }
    tape.release_grads(grads);
    res
}

/// [`crate::common::backward_from_workspace_then_recomputed`] of `sum(y)`.
pub(super) fn backward_from_workspace_then_recomputed(
    tape: &mut CudaTape<SimDevice>,
    y: usize,
    leaves: &[usize],
    kept: &[tl_tape_cuda::device::Buffer],
) -> (u64, u64) {
    let loss = tape.apply(&Op::Sum, &[y]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    crate::common::backward_from_workspace_then_recomputed(tape, (loss, &seed), leaves, kept)
}

/// `scaledDotProductAttention` over leaves `[q, k, v, r]` (q and r (B, nq, P), k and v
/// (B, nk, Pk)), then `sum(y·r)`, as one graph.
pub(super) fn sdpa_graph(
    op: Op,
    batch: usize,
    (nq, nk): (usize, usize),
    (p, pk): (usize, usize),
) -> (tl_ir::GraphData, usize) {
    let mut b = GraphBuilder::new();
    let q = b.leaf([batch, nq, p], None).unwrap();
    let k = b.leaf([batch, nk, pk], None).unwrap();
    let v = b.leaf([batch, nk, pk], None).unwrap();
    let r = b.leaf([batch, nq, p], None).unwrap();
    let y = b.apply(op, &[q, k, v]).unwrap();
    let yr = b.apply(Op::Mul, &[y, r]).unwrap();
    let out = b.apply(Op::Sum, &[yr]).unwrap();
    (b.finish(), out)
}

/// The value of `out` and the gradients of q, k and v on a fresh sim tape, as f64.
pub(super) fn sdpa_tape_run(
    graph: &tl_ir::GraphData,
    out: usize,
    leaves: &[Tensor<f64>],
) -> Vec<Tensor<f64>> {
    value_and_first_grads(graph, out, leaves, 3)
}
