//! Check 5: the sessions agree. A random program (a DAG case) is replayed op by op through the
//! sessions' `Ops::apply` — the eager session on the CPU tape (f64) and on the CUDA tape
//! (simulation device, f32), and the linked session (f64) — and every id's value and gradient
//! must match the f64 IR reference (`GraphData::eval` / `backprop_all`) on the same inputs.

use tl_session::{Backend, LinkedSession, Ops, Options, Session, TensorRef};
use tl_spec::{Scalar, Tensor};

use crate::checks::{backend_inputs, backend_tol, compare_ids};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::{CaseResult, GraphCase, Report, RunConfig, run_check};

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

/// Whether `e` says the op has no CUDA formula yet (issue 4): such cases skip the CUDA-sim
/// leg of check 5 (the CPU and linked legs still run).
fn pending_on_cuda(e: &tl_session::Error) -> bool {
    matches!(e, tl_session::Error::Cuda(c) if matches!(**c, tl_tape_cuda::Error::Unsupported { .. }))
}

/// The eager session's values and gradients, or `None` when the program uses an op that has
/// no formula on `backend` yet.
fn eager<T: Scalar>(case: &GraphCase, backend: Backend) -> Result<Option<Results<T>>, String> {
    let (leaves, _) = backend_inputs::<T>(case);
    let mut s = Session::<T>::new(Options::backend(backend)).map_err(|e| e.to_string())?;
    s.record_nat_vec(&case.nats);
    let refs = match replay_ops_typed(&mut s, case, &leaves) {
        Ok(refs) => refs,
        Err((_, e)) if pending_on_cuda(&e) => return Ok(None),
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
    Ok(Some((values, grads.map_err(|e| format!("grad: {e}"))?)))
}

fn linked(case: &GraphCase) -> Result<Results<f64>, String> {
    let mut s = LinkedSession::<f64>::new();
    s.record_nat_vec(&case.nats);
    let refs = replay_ops(&mut s, case, &case.leaves)?;
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

/// Check 5 on random DAGs.
pub fn check_session_dag(cfg: &RunConfig) -> Report {
    run_check(
        "5 session dag".into(),
        cfg,
        dag_cases(DagOptions::default()),
        session_case,
    )
}
