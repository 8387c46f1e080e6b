//! Check 2 (the core claim): the tape's `backward_dense` equals the IR's `backprop_all`.

use crate::checks::{backend_inputs, compare_ids_floored, op_graph_cases, reference_floors};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::{Backend, CaseResult, GraphCase, OpInfo, Report, RunConfig, Tol, run_check};

/// One case of check 2: dense gradients of `case.out` with cotangent `case.seed` for every id,
/// from the backend and from `GraphData::backprop_all` in f64 on the same inputs.
pub fn backward_case<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    gradients_within(backend, case, tol, false)
}

/// One case of check 2 on a random DAG: [`backward_case`] with [`DAG_TOL`], each id's
/// tolerance at least [`reference_floors`]' (the IR's own error in the backend's precision,
/// times [`crate::checks::REFERENCE_ERROR_FACTOR`]).
pub fn backward_dag_case<B: Backend>(backend: &B, case: &GraphCase) -> CaseResult {
    gradients_within(backend, case, &DAG_TOL, true)
}

/// Check 2's comparison; with `floored`, [`reference_floors`] for each id.
fn gradients_within<B: Backend>(
    backend: &B,
    case: &GraphCase,
    tol: &Tol,
    floored: bool,
) -> CaseResult {
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let seed: tl_spec::Tensor<B::T> = case.seed.cast();
    let want = case
        .graph
        .backprop_all(&reference, &case.nats, case.out, &seed.cast())
        .map_err(|e| format!("IR backprop_all rejected a generated case: {e}"))?;
    let floors = match floored {
        true => reference_floors(
            &case.graph,
            &leaves,
            |g, l, id| g.backprop_all(l, &case.nats, id(case.out), &seed).ok(),
            &want,
        ),
        false => Vec::new(),
    };
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.backward_dense(&program, case.out, &seed)?;
    compare_ids_floored(
        &case.graph,
        &got,
        &want,
        backend.tolerance(tol, &case.graph),
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
