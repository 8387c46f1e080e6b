//! The checks 1–7 (check 5, the sessions agree: [`check_session_dag`]; check 7, bad input is
//! refused with a clear error: [`bad_input`]). Each takes a case strategy (from a registry entry
//! or the random-DAG generator), runs it through [`crate::run_check`] and returns a
//! [`crate::Report`].
//!
//! Checks 1 and 2 are generic over [`crate::Backend`] and its scalar type: an f64 backend is held
//! to `Tol::f64`, any other to `Tol::f32` scaled by the graph's longest reduction ([`backend_tol`],
//! unless the backend states its own precision: [`crate::Backend::tolerance`]). The reference is
//! always the f64 IR evaluated on the backend's own inputs (the f32-rounded leaves and seed, cast
//! back to f64), so only the backend's arithmetic is measured, not the rounding of the inputs.

mod adjoint;
pub mod autocast;
mod backward;
pub mod bad_input;
pub mod conventions;
mod finite_diff;
mod floors;
mod forward;
pub mod gates;
pub mod grid;
pub mod hard;
mod session;
pub mod session_state;
pub mod sim;
pub mod split_k;
pub mod tape_api;

pub use adjoint::{adjoint_case, adjoint_dag_case, check_adjoint, check_adjoint_dag};
pub use backward::{backward_case, backward_dag_case, check_backward, check_backward_dag};
pub use finite_diff::{FD_STEP, check_finite_diff, check_finite_diff_dag, fd_case, fd_dag_case};
pub use floors::{Perturbed, REFERENCE_ERROR_FACTOR, floor_of, reference_floors};
pub use forward::{check_forward, check_forward_dag, forward_case, forward_dag_case};
pub use session::{
    SESSION_CASES, check_session, check_session_cpu_dag, check_session_dag, check_session_dag_on,
    check_session_on, check_session_sim, check_session_sim_dag, replay_ops, session_case,
    session_cfg, session_cpu_case, session_device_case, session_sim_case,
};

use proptest::prelude::*;
use tl_ir::{GraphData, Op};
use tl_spec::{Scalar, Tensor};

use crate::generate::direction;
use crate::metric::{tensor_err, worst_index};
use crate::{CaseResult, GraphCase, Measured, OpInfo, Tol};

/// Cases for checks 1 and 2 from a registry entry: the one-node graph of a generated op case,
/// leaves requiring grad with probability 0.8 each, and a random cotangent in `[-1, 1]`.
pub fn op_graph_cases(entry: &OpInfo) -> BoxedStrategy<GraphCase> {
    graph_cases(entry.mixed_cases())
}

/// Cases for checks 1 and 2 from any op-case strategy, as [`op_graph_cases`] builds them.
pub fn graph_cases(cases: BoxedStrategy<crate::OpCase>) -> BoxedStrategy<GraphCase> {
    cases
        .prop_flat_map(|case| {
            let n = case.inputs.len();
            (
                Just(case.clone()),
                prop::collection::vec(prop::bool::weighted(0.8), n),
                direction(case.out_shape()),
            )
        })
        .prop_map(|(case, rg, seed)| GraphCase::from_op(&case, &rg, seed))
        .boxed()
}

/// The length of the longest reduction in `graph` (forward or backward): summed elements for
/// `sum`/`mseLoss`, the axis for `reduceSum`/`reduceMean`, the largest dim of either operand for
/// matrix products (forward over the inner dim, backward over the outer ones), the row for
/// softmax, masked softmax and cross-entropy, the expansion factor for `broadcastTo` (its
/// backward sums), the normalized row and the rows for layerNorm and rmsNorm (γ's gradient sums
/// over rows),
/// every element for batchNorm and spectral conv (an upper bound), the largest dim of any
/// operand for attention, the kernel volume for pools, and for conv/convTranspose the weight's
/// fan-in either way and the input's size (the weight gradient sums over batch and positions).
pub fn reduction_len(graph: &GraphData) -> usize {
    let mut worst = 1;
    for node in graph.nodes() {
        let dims = |k: usize| graph.shape(node.args()[k]).expect("valid graph").dims();
        let max_dim = |k: usize| dims(k).iter().copied().max().unwrap_or(1);
        let numel = |k: usize| dims(k).iter().product::<usize>();
        let last = |k: usize| dims(k).last().copied().unwrap_or(1);
        let largest = || (0..node.args().len()).map(max_dim).max().unwrap_or(1);
        let len = match node.op() {
            Op::Sum | Op::MseLoss => numel(0),
            Op::ReduceSum(a) | Op::ReduceMean(a) => dims(0)[*a],
            // Forward reduces over the inner dim, backward over the outer ones.
            Op::Matmul | Op::Bmm => max_dim(0).max(max_dim(1)),
            Op::Linear => max_dim(0).max(max_dim(2)),
            Op::Softmax | Op::LogSoftmax => dims(0).last().copied().unwrap_or(1),
            Op::BroadcastTo(to) => to.numel() / numel(0).max(1),
            Op::MaskedSoftmax { .. } | Op::CrossEntropy { .. } => last(0),
            Op::LayerNorm { .. } | Op::RmsNorm { .. } => last(0).max(numel(0) / last(0).max(1)),
            Op::BatchNorm { .. } | Op::BatchMoments => numel(0),
            Op::SpectralConv1dRfft { .. } => (0..node.args().len()).map(numel).max().unwrap_or(1),
            Op::MultiHeadAttention { .. } | Op::ScaledDotProductAttention { .. } => largest(),
            Op::MaxPool { kernel, .. }
            | Op::AvgPool { kernel, .. }
            | Op::SmoothMaxPool { kernel, .. } => kernel.iter().product(),
            Op::Conv { .. } | Op::ConvTranspose { .. } => {
                let w = dims(0);
                let fan = |d: usize| numel(0) / w.get(d).copied().unwrap_or(1).max(1);
                fan(0).max(fan(1)).max(numel(2))
            }
            _ => 1,
        };
        worst = worst.max(len);
    }
    worst
}

/// The suite's tolerance for a backend in `T` on `graph`, from a check's tolerances `tol`:
/// `tol.f64` for f64, else `tol.f32` scaled by [`reduction_len`] ([`Tol::f32_for`]). What
/// [`crate::Backend::tolerance`] returns unless a backend says otherwise.
pub fn backend_tol<T: Scalar>(tol: &Tol, graph: &GraphData) -> f64 {
    if T::NAME == "f64" {
        tol.f64
    } else {
        tol.f32_for(reduction_len(graph))
    }
}

/// Leaves and seed as the backend sees them (`T`), and the same values back in f64 for the
/// reference.
pub(crate) fn backend_inputs<T: Scalar>(case: &GraphCase) -> (Vec<Tensor<T>>, Vec<Tensor<f64>>) {
    let leaves: Vec<Tensor<T>> = case.leaves.iter().map(Tensor::cast).collect();
    let reference = leaves.iter().map(Tensor::cast).collect();
    (leaves, reference)
}

/// Compare per-id results of a backend with the f64 reference: counts, shapes and values.
/// `what` names the quantity ("value", "gradient") in messages, which also name the id's op.
pub(crate) fn compare_ids<T: Scalar>(
    graph: &GraphData,
    got: &[Tensor<T>],
    want: &[Tensor<f64>],
    tol: f64,
    what: &str,
) -> CaseResult {
    compare_ids_floored(graph, got, want, tol, &[], what)
}

/// [`compare_ids`] with a tolerance of at least `floors[id]` for each id that has one.
pub(crate) fn compare_ids_floored<T: Scalar>(
    graph: &GraphData,
    got: &[Tensor<T>],
    want: &[Tensor<f64>],
    tol: f64,
    floors: &[f64],
    what: &str,
) -> CaseResult {
    if got.len() != want.len() {
        return Err(format!(
            "backend returned {} {what}s, the graph has {} ids",
            got.len(),
            want.len()
        ));
    }
    let mut worst = Measured { err: 0.0, tol };
    for (id, (g, w)) in got.iter().zip(want).enumerate() {
        let origin = match graph.node(id) {
            Some(n) => format!("{:?}", n.op()),
            None => "leaf".to_owned(),
        };
        if g.shape() != w.shape() {
            return Err(format!(
                "{what} of %{id} ({origin}): backend shape {}, reference shape {}",
                g.shape(),
                w.shape()
            ));
        }
        let err = tensor_err(g, w);
        let tol = floors.get(id).map_or(tol, |&f| tol.max(f));
        let m = Measured::check(err, tol, || {
            let i = worst_index(g, w).unwrap_or(0);
            format!(
                "{what} of %{id} ({origin}) differs: at flat index {i} backend {} vs reference {}",
                g.data()[i],
                w.data()[i]
            )
        })?;
        worst = worst.max(m);
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use tl_ir::{GraphBuilder, Op};

    use super::reduction_len;

    #[test]
    fn reduction_len_counts_conv_pool_norm_and_cross_entropy() {
        // conv 8→4 k3×3 on (2, 8, 10, 10): fan-in 8·9 = 72, input 1600 (the weight gradient
        // sums over batch and positions) → 1600.
        let mut b = GraphBuilder::new();
        let w = b.leaf([4, 8, 3, 3], None).unwrap();
        let bias = b.leaf([4], None).unwrap();
        let x = b.leaf([2, 8, 10, 10], None).unwrap();
        b.apply(Op::conv2d(1, 1), &[w, bias, x]).unwrap();
        assert_eq!(reduction_len(&b.finish()), 1600);
        let mut b = GraphBuilder::new();
        let x = b.leaf([1, 4, 4], None).unwrap();
        b.apply(Op::max_pool2d([2, 3], 1), &[x]).unwrap();
        assert_eq!(reduction_len(&b.finish()), 6);
        // layerNorm over rows of 5, 12 rows: γ's gradient sums 12 rows.
        let mut b = GraphBuilder::new();
        let x = b.leaf([12, 5], None).unwrap();
        let g = b.leaf([5], None).unwrap();
        let be = b.leaf([5], None).unwrap();
        b.apply(Op::LayerNorm { eps: 1e-5 }, &[x, g, be]).unwrap();
        assert_eq!(reduction_len(&b.finish()), 12);
    }
}
