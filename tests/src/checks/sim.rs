//! Checks 1, 2 and 6 on the CUDA tape over the simulation device ([`CudaSim`]).
//!
//! - 1 and 2: as on the CPU ([`forward_case`], [`backward_case`]: f32 against the f64 IR with
//!   the f32 tolerances), except that an op without a CUDA formula yet makes the cell
//!   [`PENDING`](crate::PENDING) instead of failing (per op) or keeps it out of the random DAGs
//!   (listed in the report).
//! - 6 (≈cpu): the sim and the CPU f32 tape on the same inputs give the same values and
//!   gradients within the f32 tolerance.
//! - 6 (det): with deterministic mode on ([`tl_tape_cuda::determinism`]), three runs of the
//!   same case — a fresh device, then one device twice (its allocator's cached blocks then hold
//!   stale data) — give bit-identical values and gradients.
//! - device = sim ([`check_device_vs_sim`]): another device (the kernel emulator's
//!   `CudaDevice`, feature `cuda-emu`) gives the sim's values and gradients bit for bit, in
//!   deterministic mode, for every case of an entry or of the random DAGs.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use tl_spec::Tensor;
use tl_tape_cuda::determinism::set_deterministic_reductions;
use tl_tape_cuda::{CudaTape, Device, SimDevice};

use crate::backend::{CudaProgram, SimError};
use crate::checks::{
    backend_inputs, backend_tol, backward_case, compare_ids, forward_case, op_graph_cases,
};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::{
    Backend, CaseError, CaseResult, CpuTape, CudaSim, GraphCase, Measured, OnPending, OpInfo,
    Report, RunConfig, Tol, registry, run_check_pending,
};

/// Turn a case result on `sim` into a pending-aware one: a failure caused by an op without a
/// CUDA formula is [`CaseError::Pending`].
pub fn pending_aware(sim: &CudaSim, r: CaseResult) -> Result<Measured, CaseError> {
    let pending = sim.take_pending();
    match (r, pending) {
        (Ok(m), _) => Ok(m),
        (Err(_), Some(op)) => Err(CaseError::Pending(op)),
        (Err(msg), None) => Err(CaseError::Fail(msg)),
    }
}

fn sim_err(e: SimError) -> CaseError {
    match e {
        SimError::Pending(op) => CaseError::Pending(op),
        SimError::Failed(msg) => CaseError::Fail(msg),
    }
}

/// Ops whose CUDA formula is missing, found once per process by running one small case of
/// every registry entry (forward and dense backward) on the sim. Random DAGs on the sim are
/// drawn without them.
pub fn sim_pending_ops() -> &'static BTreeSet<&'static str> {
    static PENDING_OPS: OnceLock<BTreeSet<&'static str>> = OnceLock::new();
    PENDING_OPS.get_or_init(|| {
        let sim = CudaSim::new();
        let mut out = BTreeSet::new();
        for entry in registry::all() {
            let mut runner = RunConfig::default().runner(&format!("sim probe {}", entry.name));
            let Ok(tree) = op_graph_cases(&entry).new_tree(&mut runner) else {
                continue;
            };
            let case = tree.current();
            let (leaves, _) = backend_inputs::<f32>(&case);
            let seed: Tensor<f32> = case.seed.cast();
            let run = sim
                .try_record(&case.graph, &leaves, &case.nats)
                .and_then(|p| p.backward_dense(case.out, &seed));
            if let Err(SimError::Pending(op)) = run {
                out.insert(op);
            }
        }
        out
    })
}

/// Random DAGs (with `opts`) that avoid the ops in [`sim_pending_ops`].
pub fn sim_dag_cases(opts: DagOptions) -> BoxedStrategy<GraphCase> {
    let pending = sim_pending_ops();
    if pending.is_empty() {
        return dag_cases(opts);
    }
    dag_cases(opts)
        .prop_filter("the DAG needs an op without a CUDA formula", move |c| {
            c.graph
                .nodes()
                .iter()
                .all(|n| !pending.contains(n.op().name()))
        })
        .boxed()
}

fn known() -> Vec<&'static str> {
    sim_pending_ops().iter().copied().collect()
}

/// Check 1 on the sim for a registry entry.
pub fn check_forward_sim(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let sim = CudaSim::new();
    let label = format!("1 fwd {} {}", entry.name, sim.name());
    let tol = entry.tol;
    run_check_pending(
        label,
        cfg,
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| pending_aware(&sim, forward_case(&sim, c, &tol)),
    )
}

/// Check 2 on the sim for a registry entry.
pub fn check_backward_sim(entry: &OpInfo, cfg: &RunConfig) -> Report {
    check_backward_on(&CudaSim::new(), entry, cfg)
}

/// Check 2 on a sim-backed backend for a registry entry (a test can pass a wrapped tape).
pub fn check_backward_on<B: Backend + AsRef<CudaSim>>(
    backend: &B,
    entry: &OpInfo,
    cfg: &RunConfig,
) -> Report {
    let label = format!("2 bwd {} {}", entry.name, backend.name());
    let tol = entry.tol;
    run_check_pending(
        label,
        cfg,
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| pending_aware(backend.as_ref(), backward_case(backend, c, &tol)),
    )
}

impl AsRef<CudaSim> for CudaSim {
    fn as_ref(&self) -> &CudaSim {
        self
    }
}

/// Check 1 on the sim for random DAGs (those needing a pending op are skipped and listed).
pub fn check_forward_sim_dag(cfg: &RunConfig) -> Report {
    let sim = CudaSim::new();
    let label = format!("1 fwd dag {}", sim.name());
    run_check_pending(
        label,
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| pending_aware(&sim, forward_case(&sim, c, &DAG_TOL)),
    )
}

/// Check 2 on the sim for random DAGs.
pub fn check_backward_sim_dag(cfg: &RunConfig) -> Report {
    check_backward_dag_on(&CudaSim::new(), cfg)
}

/// Check 2 on a sim-backed backend for random DAGs.
pub fn check_backward_dag_on<B: Backend + AsRef<CudaSim>>(backend: &B, cfg: &RunConfig) -> Report {
    let label = format!("2 bwd dag {}", backend.name());
    run_check_pending(
        label,
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| pending_aware(backend.as_ref(), backward_case(backend, c, &DAG_TOL)),
    )
}

/// One case of check 6 (≈cpu): values (and, with `grads`, dense gradients of `case.out`) of the
/// sim and the CPU f32 tape on the same f32 inputs agree within the f32 tolerance.
pub fn sim_vs_cpu_case(case: &GraphCase, tol: &Tol, grads: bool) -> Result<Measured, CaseError> {
    let (sim, cpu) = (CudaSim::new(), CpuTape::<f32>::new());
    let (leaves, _) = backend_inputs::<f32>(case);
    let seed: Tensor<f32> = case.seed.cast();
    let tol = backend_tol::<f32>(tol, &case.graph);
    let cpu_prog = cpu
        .record(&case.graph, &leaves, &case.nats)
        .map_err(CaseError::Fail)?;
    let sim_prog = sim
        .try_record(&case.graph, &leaves, &case.nats)
        .map_err(sim_err)?;
    let widen = |v: Vec<Tensor<f32>>| -> Vec<Tensor<f64>> { v.iter().map(Tensor::cast).collect() };
    let want = widen(cpu.values(&cpu_prog).map_err(CaseError::Fail)?);
    let got = sim_prog.values().map_err(sim_err)?;
    let mut m = compare_ids(&case.graph, &got, &want, tol, "sim vs cpu-f32 value")
        .map_err(CaseError::Fail)?;
    if grads {
        let want = widen(
            cpu.backward_dense(&cpu_prog, case.out, &seed)
                .map_err(CaseError::Fail)?,
        );
        let got = sim_prog.backward_dense(case.out, &seed).map_err(sim_err)?;
        m = m.max(
            compare_ids(&case.graph, &got, &want, tol, "sim vs cpu-f32 gradient")
                .map_err(CaseError::Fail)?,
        );
    }
    Ok(m)
}

/// Values and (with `grads`) dense gradients of one run on `tape`; returns the tape reset.
fn tape_run<D: Device>(
    tape: CudaTape<D>,
    case: &GraphCase,
    grads: bool,
) -> Result<(Vec<Tensor<f32>>, CudaTape<D>), SimError> {
    let (leaves, _) = backend_inputs::<f32>(case);
    let prog = CudaProgram::replay(tape, &case.graph, &leaves, &case.nats)?;
    let mut out = prog.values()?;
    if grads {
        out.extend(prog.backward_dense(case.out, &case.seed.cast())?);
    }
    Ok((out, prog.into_tape()))
}

/// How many elements of `other` differ in bits from `first` (values then gradients, as
/// [`tape_run`] lists them), as a measurement with tolerance 0 that names the first one.
fn bit_differences(
    case: &GraphCase,
    first: &[Tensor<f32>],
    other: &[Tensor<f32>],
    what_differs: &str,
) -> Result<Measured, CaseError> {
    let mut differ = 0usize;
    let mut where_ = None;
    for (k, (a, b)) in first.iter().zip(other).enumerate() {
        for (i, (x, y)) in a.data().iter().zip(b.data()).enumerate() {
            if x.to_bits() != y.to_bits() {
                differ += 1;
                where_.get_or_insert((k, i, *x, *y));
            }
        }
    }
    let ids = case.graph.len();
    Measured::check(differ as f64, 0.0, || {
        let (k, i, x, y) = where_.unwrap_or_default();
        let what = if k < ids { "value" } else { "gradient" };
        format!(
            "{what_differs} in {differ} element(s); first at the {what} of %{} flat index {i}: \
             {x:e} vs {y:e}",
            k % ids
        )
    })
    .map_err(CaseError::Fail)
}

/// One case of check 6 (det): deterministic mode on, three sim runs (fresh device, then one
/// device twice) give bit-identical values and gradients. The error is the number of elements
/// whose bits differ (tolerance 0).
pub fn determinism_case(case: &GraphCase, grads: bool) -> Result<Measured, CaseError> {
    // Process-wide, like `TL_DETERMINISTIC=1`; no check turns it off again.
    set_deterministic_reductions(true);
    let fresh = || CudaTape::new(SimDevice::new());
    let (first, _) = tape_run(fresh(), case, grads).map_err(sim_err)?;
    let (second, reused) = tape_run(fresh(), case, grads).map_err(sim_err)?;
    let (third, _) = tape_run(reused, case, grads).map_err(sim_err)?;
    let mut worst = Measured { err: 0.0, tol: 0.0 };
    for (run, other) in [
        ("second (fresh device)", &second),
        ("third (reused device)", &third),
    ] {
        let what = format!("deterministic mode: the {run} run differs from the first");
        worst = worst.max(bit_differences(case, &first, other, &what)?);
    }
    Ok(worst)
}

/// One case of the device = sim check: deterministic mode on, the CUDA tape on a fresh `D`
/// (from `device`) gives the sim's values and (with `grads`) dense gradients bit for bit.
pub fn device_vs_sim_case<D: Device>(
    case: &GraphCase,
    grads: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    set_deterministic_reductions(true);
    let d = device().map_err(|e| CaseError::Fail(format!("device: {e}")))?;
    let name = d.name();
    let (want, _) = tape_run(CudaTape::new(SimDevice::new()), case, grads).map_err(sim_err)?;
    let (got, _) = tape_run(CudaTape::new(d), case, grads).map_err(sim_err)?;
    bit_differences(case, &want, &got, &format!("{name} differs from cuda-sim"))
}

/// The device = sim check for a registry entry (gradients too where check 2 applies), on the
/// device `name` made by `device`.
pub fn check_device_vs_sim<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let label = format!("= sim {} {name}", entry.name);
    let grads = entry.applies.backward;
    run_check_pending(
        label,
        cfg,
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| device_vs_sim_case(c, grads, device),
    )
}

/// The device = sim check on random DAGs.
pub fn check_device_vs_sim_dag<D: Device>(
    cfg: &RunConfig,
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    run_check_pending(
        format!("= sim dag {name}"),
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| device_vs_sim_case(c, true, device),
    )
}

/// Check 6 (≈cpu) for a registry entry (gradients too where check 2 applies).
pub fn check_sim_vs_cpu(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("6 ≈cpu {} cuda-sim", entry.name);
    let (tol, grads) = (entry.tol, entry.applies.backward);
    run_check_pending(
        label,
        cfg,
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| sim_vs_cpu_case(c, &tol, grads),
    )
}

/// Check 6 (det) for a registry entry.
pub fn check_deterministic(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("6 det {} cuda-sim", entry.name);
    let grads = entry.applies.backward;
    run_check_pending(
        label,
        cfg,
        op_graph_cases(entry),
        OnPending::PendCell,
        &[],
        |c| determinism_case(c, grads),
    )
}

/// Check 6 (≈cpu) on random DAGs.
pub fn check_sim_vs_cpu_dag(cfg: &RunConfig) -> Report {
    run_check_pending(
        "6 ≈cpu dag cuda-sim".into(),
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| sim_vs_cpu_case(c, &DAG_TOL, true),
    )
}

/// Check 6 (det) on random DAGs.
pub fn check_deterministic_dag(cfg: &RunConfig) -> Report {
    run_check_pending(
        "6 det dag cuda-sim".into(),
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| determinism_case(c, true),
    )
}
