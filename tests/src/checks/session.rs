//! Check 5: the sessions agree. A random program (a DAG case) is replayed op by op through the
//! sessions' `Ops::apply` — the eager session on the CPU tape (f64) and on the CUDA tape
//! (simulation device, f32), and the linked session (f64) — and every id's value and gradient
//! must match the f64 IR reference (`GraphData::eval` / `backprop_all`) on the same inputs.
//!
//! The coverage table has two check-5 columns ([`check_session`], [`check_session_dag`] and
//! their `_sim` twins): "5 sess cpu" compares the eager CPU session (f64) with the linked
//! session (f64), "5 sess sim" the eager CUDA-sim session (f32) with the linked session on the
//! same f32-rounded inputs; an op with no CUDA formula yet makes the sim cell pending, as in
//! checks 1 and 2. Each case runs whole sessions, so these columns run at most
//! [`SESSION_CASES`] cases per cell.

use tl_session::{Backend, LinkedSession, Ops, Options, Session, TensorRef};
use tl_spec::{Scalar, Tensor};

use crate::checks::sim::{sim_dag_cases, sim_pending_ops};
use crate::checks::{backend_inputs, backend_tol, compare_ids, op_graph_cases};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::{
    CaseError, CaseResult, GraphCase, Measured, OnPending, OpInfo, Report, RunConfig, Tol,
    run_check, run_check_pending,
};

/// The most cases a check-5 cell runs (each case builds two sessions and runs them whole).
pub const SESSION_CASES: u32 = 16;

/// `cfg` with its case count capped at [`SESSION_CASES`].
pub fn session_cfg(cfg: &RunConfig) -> RunConfig {
    RunConfig {
        cases: cfg.cases.min(SESSION_CASES),
        ..*cfg
    }
}

/// Every id's value and gradient, as a session computed them.
type Results<T> = (Vec<Tensor<T>>, Vec<Tensor<T>>);

/// Record `case.graph` through `s.apply`: one input per leaf (with its `requires_grad`), then
/// every node in order. Returns one handle per graph id.
pub fn replay_ops<S: Ops>(
    s: &mut S,
    case: &GraphCase,
    leaves: &[Tensor<S::T>],
) -> Result<Vec<TensorRef>, String> {
    replay_ops_typed(s, case, leaves).map_err(|(what, e)| format!("{what}: {e}"))
}

/// [`replay_ops`] keeping the session's error (with what failed), so callers can tell an op
/// with no CUDA formula yet from a real failure.
fn replay_ops_typed<S: Ops>(
    s: &mut S,
    case: &GraphCase,
    leaves: &[Tensor<S::T>],
) -> Result<Vec<TensorRef>, (String, tl_session::Error)> {
    let mut refs = Vec::with_capacity(case.graph.len());
    for (leaf, v) in case.graph.leaves().iter().zip(leaves) {
        refs.push(
            s.input(v.clone(), leaf.requires_grad)
                .map_err(|e| ("input".to_string(), e))?,
        );
    }
    for node in case.graph.nodes() {
        let args: Vec<&TensorRef> = node.args().iter().map(|&a| &refs[a]).collect();
        let r = s
            .apply(node.op().clone(), &args)
            .map_err(|e| (format!("session apply {:?}", node.op()), e))?;
        refs.push(r);
    }
    Ok(refs)
}

/// The op `e` says has no CUDA formula yet (issue 4), if it says so: such cases skip the
/// CUDA-sim leg of check 5 (the CPU and linked legs still run).
fn pending_on_cuda(e: &tl_session::Error) -> Option<&'static str> {
    match e {
        tl_session::Error::Cuda(c) => match **c {
            tl_tape_cuda::Error::Unsupported { op } => Some(op),
            _ => None,
        },
        _ => None,
    }
}

fn pending_on_cuda_any(e: &tl_session::Error) -> bool {
    pending_on_cuda(e).is_some()
}

/// The eager session's values and gradients, or `None` when the program uses an op that has
/// no formula on `backend` yet.
fn eager<T: Scalar>(case: &GraphCase, backend: Backend) -> Result<Option<Results<T>>, String> {
    eager_pending(case, backend).map(Result::ok)
}

/// The eager session's values and gradients, or `Err(op)` when the program uses `op`, which
/// has no formula on `backend` yet.
fn eager_pending<T: Scalar>(
    case: &GraphCase,
    backend: Backend,
) -> Result<Result<Results<T>, &'static str>, String> {
    let (leaves, _) = backend_inputs::<T>(case);
    let mut s = Session::<T>::new(Options::backend(backend)).map_err(|e| e.to_string())?;
    s.record_nat_vec(&case.nats);
    let refs = match replay_ops_typed(&mut s, case, &leaves) {
        Ok(refs) => refs,
        Err((_, e)) if pending_on_cuda_any(&e) => {
            return Ok(Err(pending_on_cuda(&e).unwrap_or("?")));
        }
        Err((what, e)) => return Err(format!("{what}: {e}")),
    };
    let values = refs
        .iter()
        .map(|r| s.value(r))
        .collect::<Result<Vec<_>, _>>();
    let values = values.map_err(|e| format!("value: {e}"))?;
    s.backward_with_seed(&refs[case.out], case.seed.cast())
        .map_err(|e| format!("backward: {e}"))?;
    let grads = refs
        .iter()
        .map(|r| s.grad_of(r))
        .collect::<Result<Vec<_>, _>>();
    Ok(Ok((values, grads.map_err(|e| format!("grad: {e}"))?)))
}

fn linked(case: &GraphCase) -> Result<Results<f64>, String> {
    linked_on(case, &case.leaves)
}

/// The linked session's values and gradients with `leaves` as the leaf values.
fn linked_on(case: &GraphCase, leaves: &[Tensor<f64>]) -> Result<Results<f64>, String> {
    let mut s = LinkedSession::<f64>::new();
    s.record_nat_vec(&case.nats);
    let refs = replay_ops(&mut s, case, leaves)?;
    let values = refs
        .iter()
        .map(|r| s.value(r))
        .collect::<Result<Vec<_>, _>>();
    let values = values.map_err(|e| format!("value: {e}"))?;
    let dense = s
        .backward_dense_all(&refs[case.out], &case.seed)
        .map_err(|e| format!("backward_dense_all: {e}"))?;
    let grads = refs
        .iter()
        .map(|r| s.grad_of(&dense, r))
        .collect::<Result<Vec<_>, _>>();
    Ok((values, grads.map_err(|e| format!("grad_of: {e}"))?))
}

/// Compare one session's values and gradients with the f64 reference on its own inputs.
fn compare<T: Scalar>(case: &GraphCase, name: &str, got: Results<T>) -> CaseResult {
    let (_, reference) = backend_inputs::<T>(case);
    let seed: Tensor<T> = case.seed.cast();
    let want_v = case
        .graph
        .eval(&reference, &case.nats)
        .map_err(|e| format!("IR eval rejected a generated case: {e}"))?;
    let want_g = case
        .graph
        .backprop_all(&reference, &case.nats, case.out, &seed.cast())
        .map_err(|e| format!("IR backprop_all rejected a generated case: {e}"))?;
    let tol = backend_tol::<T>(&DAG_TOL, &case.graph);
    let prefix = |e: String| format!("{name}: {e}");
    let v = compare_ids(&case.graph, &got.0, &want_v, tol, "value").map_err(prefix)?;
    let g = compare_ids(&case.graph, &got.1, &want_g, tol, "gradient").map_err(prefix)?;
    Ok(v.max(g))
}

/// One case of check 5: eager CPU (f64), eager CUDA-sim (f32) and linked (f64) all match the
/// reference in values and gradients.
///
/// A program using an op with no CUDA formula yet skips the CUDA-sim leg (issue 4).
pub fn session_case(case: &GraphCase) -> CaseResult {
    let cpu = eager::<f64>(case, Backend::Cpu)?
        .ok_or("the CPU session rejected an op as pending, which only CUDA may do")?;
    let cpu = compare(case, "eager cpu-f64", cpu)?;
    let sim = match eager::<f32>(case, Backend::CudaSim)? {
        Some(r) => compare(case, "eager cuda-sim-f32", r)?,
        None => crate::report::Measured::ZERO,
    };
    let lnk = compare(case, "linked f64", linked(case)?)?;
    Ok(cpu.max(sim).max(lnk))
}

/// Compare an eager session's results with the linked session's (both per id).
fn compare_with_linked<T: Scalar>(
    case: &GraphCase,
    eager: Results<T>,
    linked: &Results<f64>,
    tol: f64,
) -> CaseResult {
    let v = compare_ids(
        &case.graph,
        &eager.0,
        &linked.0,
        tol,
        "eager vs linked value",
    )?;
    let g = compare_ids(
        &case.graph,
        &eager.1,
        &linked.1,
        tol,
        "eager vs linked gradient",
    )?;
    Ok(v.max(g))
}

/// One case of the "5 sess cpu" column: the eager CPU session (f64) and the linked session
/// (f64) give the same values and gradients for every id, within `tol.f64`.
pub fn session_cpu_case(case: &GraphCase, tol: &Tol) -> CaseResult {
    let eager = eager::<f64>(case, Backend::Cpu)?
        .ok_or("the CPU session rejected an op as pending, which only CUDA may do")?;
    let linked = linked(case)?;
    compare_with_linked(case, eager, &linked, backend_tol::<f64>(tol, &case.graph))
}

/// One case of the "5 sess sim" column: the eager CUDA-sim session (f32) and the linked
/// session (f64, on the same f32-rounded inputs and seed) agree within the f32 tolerance; a
/// program using an op with no CUDA formula is [`CaseError::Pending`].
pub fn session_sim_case(case: &GraphCase, tol: &Tol) -> Result<Measured, CaseError> {
    session_device_case(case, tol, Backend::CudaSim)
}

/// [`session_sim_case`] with the eager session on `backend` (`Backend::Cuda`: a real GPU, or
/// the kernel emulator).
pub fn session_device_case(
    case: &GraphCase,
    tol: &Tol,
    backend: Backend,
) -> Result<Measured, CaseError> {
    let eager = match eager_pending::<f32>(case, backend).map_err(CaseError::Fail)? {
        Ok(r) => r,
        Err(op) => return Err(CaseError::Pending(op)),
    };
    let (_, rounded) = backend_inputs::<f32>(case);
    let mut rounded_case = case.clone();
    rounded_case.seed = case.seed.cast::<f32>().cast();
    let linked = linked_on(&rounded_case, &rounded).map_err(CaseError::Fail)?;
    compare_with_linked(case, eager, &linked, backend_tol::<f32>(tol, &case.graph))
        .map_err(CaseError::Fail)
}

/// Check 5 ("5 sess cpu") for a registry entry: eager CPU vs linked on the entry's one-op
/// programs, at most [`SESSION_CASES`] cases.
pub fn check_session(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let tol = entry.tol;
    run_check(
        format!("5 sess {} cpu-f64 vs linked", entry.name),
        &session_cfg(cfg),
        op_graph_cases(entry),
        |c| session_cpu_case(c, &tol),
    )
}

/// Check 5 ("5 sess sim") for a registry entry: eager CUDA-sim vs linked; pending where the op
/// has no CUDA formula.
pub fn check_session_sim(entry: &OpInfo, cfg: &RunConfig) -> Report {
    check_session_on(entry, cfg, Backend::CudaSim, "cuda-sim")
}

/// Check 5 for a registry entry with the eager session on `backend` (reported as `name`)
/// against the linked session, as [`check_session_sim`].
pub fn check_session_on(entry: &OpInfo, cfg: &RunConfig, backend: Backend, name: &str) -> Report {
    let tol = entry.tol;
    run_check_pending(
        format!("5 sess {} {name}-f32 vs linked", entry.name),
        &session_cfg(cfg),
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| session_device_case(c, &tol, backend),
    )
}

/// Check 5 ("5 sess cpu") on random DAGs.
pub fn check_session_cpu_dag(cfg: &RunConfig) -> Report {
    run_check(
        "5 sess dag cpu-f64 vs linked".into(),
        &session_cfg(cfg),
        dag_cases(DagOptions::default()),
        |c| session_cpu_case(c, &DAG_TOL),
    )
}

/// Check 5 ("5 sess sim") on random DAGs: programs needing an op with no CUDA formula are
/// skipped and listed.
pub fn check_session_sim_dag(cfg: &RunConfig) -> Report {
    check_session_dag_on(cfg, Backend::CudaSim, "cuda-sim")
}

/// Check 5 on random DAGs with the eager session on `backend` (reported as `name`).
pub fn check_session_dag_on(cfg: &RunConfig, backend: Backend, name: &str) -> Report {
    let known: Vec<&'static str> = sim_pending_ops().iter().copied().collect();
    run_check_pending(
        format!("5 sess dag {name}-f32 vs linked"),
        &session_cfg(cfg),
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known,
        |c| session_device_case(c, &DAG_TOL, backend),
    )
}

/// Check 5 on random DAGs, every session against the f64 reference (the test-suite form).
pub fn check_session_dag(cfg: &RunConfig) -> Report {
    run_check(
        "5 session dag".into(),
        cfg,
        dag_cases(DagOptions::default()),
        session_case,
    )
}
