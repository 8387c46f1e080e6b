//! Per-id tolerance floors for checks 1 and 2 (and the tape-API check) on random DAGs in f32:
//! what f32 cannot hold whoever computes it.
//!
//! A DAG can make a result the small difference of large terms (an attention whose scores
//! barely move with the query: terms near ±30 that sum to 1e-4), where f32 loses those digits
//! whoever computes it, and a failing case's shrinking searches for exactly such cases
//! (`TL_SEED=1103`'s `teeth_sim` found one that the correct sim, the CPU tape and the IR all
//! computed 3e-5 to 1e-4 off in f32). So each id's tolerance is at least
//! [`REFERENCE_ERROR_FACTOR`] times the reference's own error in f32 there, measured twice:
//!
//! - the IR run in f32 on the same inputs, against its f64 run;
//! - the IR run in f32 on the graph with every op's value moved by about an ulp, element by
//!   element ([`Perturbed`]): another rounding of the same ops, as another order of the same
//!   sums gives. One run alone can be exact by luck where the terms cancel exactly in f32 too:
//!   under `TL_SEED=6161 TL_CASES=256` the tape-API check walked to an attention whose keys
//!   are all one broadcast scalar, so every score is equal and the query weights' gradient is
//!   exactly 0; the IR's own f32 run gave 0 and the correct CPU tape −1.9e-4 (its terms near
//!   ±10), past the tolerance of 1e-4. Moving each key by an ulp breaks that exactness, and
//!   the IR's f32 error there shows the 1e-4 that f32 cannot hold.
//!
//! Where a case keeps f32's digits, as drawn cases do, the floor stays under the tolerance
//! (`dag::the_reference_error_floor_stays_below_the_tolerance_on_drawn_cases`), so it widens
//! nothing a check draws and only answers for the cases a shrinking search walks into.

use tl_ir::{GraphBuilder, GraphData, Id, Op};
use tl_spec::{Scalar, Tensor};

use crate::metric::tensor_err;

/// How many times the reference's own error in the backend's precision a value or gradient of
/// a random DAG may be off ([`reference_floors`]).
pub const REFERENCE_ERROR_FACTOR: f64 = 16.0;

/// A case's graph with every op node's value multiplied, element by element, by a factor of
/// `1 + 2⁻²³` or `1 − 2⁻²⁴` (the f32 neighbours of 1, each element's drawn from its node's id
/// and index): the factors are leaves after the graph's own (no gradient), each node is
/// followed by its `mul`, and the nodes read it through that. A node read as an index tensor
/// (`gather`'s second operand) keeps its value, which must stay integral.
#[derive(Debug, Clone)]
pub struct Perturbed<T: Scalar> {
    /// The graph with the factors.
    pub graph: GraphData,
    /// The case's leaves, then the factors.
    pub leaves: Vec<Tensor<T>>,
    /// Each id of the case's graph → its id here (an op node's: its `mul`).
    pub map: Vec<Id>,
}

impl<T: Scalar> Perturbed<T> {
    /// `graph` with its factors, its leaves `leaves` then the factors' values; `None` where a
    /// node does not rebuild (no op of a drawn case fails to).
    pub fn new(graph: &GraphData, leaves: &[Tensor<T>]) -> Option<Self> {
        let n_leaves = graph.num_leaves();
        let mut index = vec![false; graph.len()];
        for node in graph.nodes() {
            if matches!(node.op(), Op::GatherIndexTensor) {
                index[node.args()[1]] = true;
            }
        }
        let mut b = GraphBuilder::new();
        for leaf in graph.leaves() {
            b.leaf_with(leaf.shape.clone(), leaf.name.as_deref(), leaf.requires_grad)
                .ok()?;
        }
        let mut values = leaves.to_vec();
        let mut factors = Vec::with_capacity(graph.nodes().len());
        for (j, node) in graph.nodes().iter().enumerate() {
            let id = n_leaves + j;
            if index[id] {
                factors.push(None);
                continue;
            }
            factors.push(Some(b.leaf_with(node.shape().clone(), None, false).ok()?));
            values.push(Tensor::from_fn(node.shape().clone(), |i| {
                let up = tl_spec::rng::unit(id as u64, i as u64) < 0.5;
                T::lit(if up {
                    1.0 + 2f64.powi(-23)
                } else {
                    1.0 - 2f64.powi(-24)
                })
            }));
        }
        let mut map: Vec<Id> = (0..n_leaves).collect();
        for (node, factor) in graph.nodes().iter().zip(factors) {
            let args: Vec<Id> = node.args().iter().map(|&a| map[a]).collect();
            let y = b.apply(node.op().clone(), &args).ok()?;
            map.push(match factor {
                Some(f) => b.apply(Op::Mul, &[y, f]).ok()?,
                None => y,
            });
        }
        Some(Perturbed {
            graph: b.finish(),
            leaves: values,
            map,
        })
    }
}

/// [`REFERENCE_ERROR_FACTOR`] times the error of `own`, the reference's f32 result, against
/// `want`, its f64 one; `None` where that error is not finite (NaN where the f64 run is
/// finite), which widens nothing.
pub fn floor_of<T: Scalar>(own: &Tensor<T>, want: &Tensor<f64>) -> Option<f64> {
    Some(REFERENCE_ERROR_FACTOR * tensor_err(own, want)).filter(|f| f.is_finite())
}

/// Per-id tolerance floors for the f32 checks on random DAGs (see the module docs):
/// [`REFERENCE_ERROR_FACTOR`] times the larger of the reference's two f32 errors at each id.
/// `run(graph, leaves, id)` is the IR's computation (an `eval`, a `backprop_all` from `id(out)`)
/// on a graph and its leaves, `id` mapping the case's ids to that graph's, `None` where it
/// failed; `want` is its f64 run on the case. None for an f64 backend (`run` is not called).
pub fn reference_floors<T: Scalar>(
    graph: &GraphData,
    leaves: &[Tensor<T>],
    run: impl Fn(&GraphData, &[Tensor<T>], &dyn Fn(Id) -> Id) -> Option<Vec<Tensor<T>>>,
    want: &[Tensor<f64>],
) -> Vec<f64> {
    if T::NAME == "f64" {
        return Vec::new();
    }
    let mut floors = vec![0.0f64; want.len()];
    let mut widen = |own: &[Tensor<T>], at: &dyn Fn(Id) -> Id| {
        for (id, (floor, w)) in floors.iter_mut().zip(want).enumerate() {
            if let Some(f) = own.get(at(id)).and_then(|g| floor_of(g, w)) {
                *floor = floor.max(f);
            }
        }
    };
    let same = |id: Id| id;
    if let Some(own) = run(graph, leaves, &same) {
        widen(&own, &same);
    }
    if let Some(p) = Perturbed::new(graph, leaves) {
        let at = |id: Id| p.map[id];
        if let Some(own) = run(&p.graph, &p.leaves, &at) {
            widen(&own, &at);
        }
    }
    floors
}
