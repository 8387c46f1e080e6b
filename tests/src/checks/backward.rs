//! Check 2 (the core claim): the tape's `backward_dense` equals the IR's `backprop_all`.

use crate::checks::{backend_inputs, backend_tol, compare_ids_floored, op_graph_cases};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::metric::tensor_err;
use crate::{Backend, CaseResult, GraphCase, OpInfo, Report, RunConfig, Tol, run_check};

/// One case of check 2: dense gradients of `case.out` with cotangent `case.seed` for every id,
/// from the backend and from `GraphData::backprop_all` in f64 on the same inputs.
pub fn backward_case<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    gradients_within(backend, case, tol, None)
}

/// How many times the reference's own error in the backend's precision a gradient of a random
/// DAG may be off ([`backward_dag_case`]).
pub const REFERENCE_ERROR_FACTOR: f64 = 16.0;

/// One case of check 2 on a random DAG: [`backward_case`] with [`DAG_TOL`], except that each
/// id's tolerance is at least [`REFERENCE_ERROR_FACTOR`] times the reference's own error in the
/// backend's precision (the IR's `backprop_all` run in `B::T` on the same inputs, against its
/// f64 run; nothing for an f64 backend). A DAG can make a gradient the small difference of
/// large terms (an attention whose scores barely move with the query: terms near ±30 that sum
/// to 1e-4), where f32 loses those digits whoever computes it; a failing case's shrinking
/// searches for exactly such cases (`TL_SEED=1103`'s `teeth_sim` found one that the correct
/// sim, the CPU tape and the IR all computed 3e-5 to 1e-4 off in f32). Where a case keeps
/// f32's digits, as drawn cases do, the floor stays under the tolerance (at most 0.067 of it
/// on 200 drawn cases: `dag::the_reference_error_floor_stays_below_the_tolerance_on_drawn_cases`).
pub fn backward_dag_case<B: Backend>(backend: &B, case: &GraphCase) -> CaseResult {
    gradients_within(backend, case, &DAG_TOL, Some(REFERENCE_ERROR_FACTOR))
}

/// Check 2's comparison: with `floor_factor`, an id's tolerance is at least that many times
/// the reference's own error in `B::T` there.
fn gradients_within<B: Backend>(
    backend: &B,
    case: &GraphCase,
    tol: &Tol,
    floor_factor: Option<f64>,
) -> CaseResult {
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let seed: tl_spec::Tensor<B::T> = case.seed.cast();
    let want = case
        .graph
        .backprop_all(&reference, &case.nats, case.out, &seed.cast())
        .map_err(|e| format!("IR backprop_all rejected a generated case: {e}"))?;
    let floors = match floor_factor {
        Some(k) if <B::T as tl_spec::Scalar>::NAME != "f64" => {
            // The reference in the backend's precision; where it fails (an overflow the f64
            // run did not hit) the plain tolerance stands.
            let own = case
                .graph
                .backprop_all(&leaves, &case.nats, case.out, &seed)
                .unwrap_or_default();
            own.iter()
                .zip(&want)
                // A non-finite error (NaN where the f64 run is finite) widens nothing.
                .map(|(g, w)| {
                    Some(k * tensor_err(g, w))
                        .filter(|f| f.is_finite())
                        .unwrap_or(0.0)
                })
                .collect()
        }
        _ => Vec::new(),
    };
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.backward_dense(&program, case.out, &seed)?;
    compare_ids_floored(
        &case.graph,
        &got,
        &want,
        backend_tol::<B::T>(tol, &case.graph),
        &floors,
        "gradient",
    )
}

/// Check 2 on a registry entry.
pub fn check_backward<B: Backend>(backend: &B, entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("2 bwd {} {}", entry.name, backend.name());
    let tol = entry.tol;
    run_check(label, cfg, op_graph_cases(entry), |c| {
        backward_case(backend, c, &tol)
    })
}

/// Check 2 on random DAGs (with fan-out, so gradients accumulate).
pub fn check_backward_dag<B: Backend>(backend: &B, cfg: &RunConfig) -> Report {
    let label = format!("2 bwd dag {}", backend.name());
    run_check(label, cfg, dag_cases(DagOptions::default()), |c| {
        backward_dag_case(backend, c)
    })
}
