//! Check 2 (the core claim): the tape's `backward_dense` equals the IR's `backprop_all`.

use crate::checks::{backend_inputs, backend_tol, compare_ids, op_graph_cases};
use crate::dag::{DagOptions, dag_cases};
use crate::{Backend, CaseResult, GraphCase, OpInfo, Report, RunConfig, Tol, run_check};

/// One case of check 2: dense gradients of `case.out` with cotangent `case.seed` for every id,
/// from the backend and from `GraphData::backprop_all` in f64 on the same inputs.
pub fn backward_case<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let seed: tl_spec::Tensor<B::T> = case.seed.cast();
    let want = case
        .graph
        .backprop_all(&reference, &case.nats, case.out, &seed.cast())
        .map_err(|e| format!("IR backprop_all rejected a generated case: {e}"))?;
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.backward_dense(&program, case.out, &seed)?;
    compare_ids(
        &case.graph,
        &got,
        &want,
        backend_tol::<B::T>(tol, &case.graph),
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
    let tol = crate::dag::DAG_TOL;
    run_check(label, cfg, dag_cases(DagOptions::default()), |c| {
        backward_case(backend, c, &tol)
    })
}
