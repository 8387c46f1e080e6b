//! Check 1: the compiled tape's values equal the IR's pure evaluation, at every id.

use crate::checks::{backend_inputs, compare_ids_floored, op_graph_cases, reference_floors};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::{Backend, CaseResult, GraphCase, OpInfo, Report, RunConfig, Tol, run_check};

/// One case of check 1: record `case.graph` on `backend`, read every id, and compare with
/// `GraphData::eval` in f64 on the same (backend-precision) leaves.
pub fn forward_case<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    values_within(backend, case, tol, false)
}

/// One case of check 1 on a random DAG: [`forward_case`] with [`DAG_TOL`], each id's
/// tolerance at least [`reference_floors`]' (the IR's own error in the backend's precision,
/// times [`crate::checks::REFERENCE_ERROR_FACTOR`]).
pub fn forward_dag_case<B: Backend>(backend: &B, case: &GraphCase) -> CaseResult {
    values_within(backend, case, &DAG_TOL, true)
}

/// Check 1's comparison; with `floored`, [`reference_floors`] for each id.
fn values_within<B: Backend>(
    backend: &B,
    case: &GraphCase,
    tol: &Tol,
    floored: bool,
) -> CaseResult {
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let want = case
        .graph
        .eval(&reference, &case.nats)
        .map_err(|e| format!("IR eval rejected a generated case: {e}"))?;
    let floors = match floored {
        true => reference_floors(
            &case.graph,
            &leaves,
            |g, l, _| g.eval(l, &case.nats).ok(),
            &want,
        ),
        false => Vec::new(),
    };
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.values(&program)?;
    compare_ids_floored(
        &case.graph,
        &got,
        &want,
        backend.tolerance(tol, &case.graph),
        &floors,
        "value",
    )
}

/// Check 1 on a registry entry.
pub fn check_forward<B: Backend>(backend: &B, entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("1 fwd {} {}", entry.name, backend.name());
    let tol = entry.tol;
    run_check(label, cfg, op_graph_cases(entry), |c| {
        forward_case(backend, c, &tol)
    })
}

/// Check 1 on random DAGs.
pub fn check_forward_dag<B: Backend>(backend: &B, cfg: &RunConfig) -> Report {
    let label = format!("1 fwd dag {}", backend.name());
    run_check(label, cfg, dag_cases(DagOptions::default()), |c| {
        forward_dag_case(backend, c)
    })
}
