//! Checks 1, 2 and 6 on the CUDA tape over the simulation device ([`CudaSim`]).
//!
//! - 1 and 2: as on the CPU ([`forward_case`], [`backward_case`]: f32 against the f64 IR with
//!   the f32 tolerances), except that an op without a CUDA formula yet makes the cell
//!   [`PENDING`](crate::PENDING) instead of failing (per op) or keeps it out of the random DAGs
//!   (listed in the report).
//! - 6 (≈cpu): the sim and the CPU f32 tape on the same inputs give the same values and
//!   gradients: within `OpInfo::ulps` ulps for pointwise and shape ops (both evaluate the
//!   same f32 formulas with the host's libm), within the f32 tolerance scaled by reduction
//!   length for the others and for random DAGs.
//! - Kinks: for ops with conventions at kinks, ties and bounds (`OpInfo::kinks`), a quarter
//!   of the cases of every per-op sim check sit on them ([`sim_graph_cases`]).
//! - 6 (det): with deterministic mode on ([`tl_tape_cuda::determinism`]), three runs of the
//!   same case — a fresh device, then one device twice (its allocator's cached blocks then hold
//!   stale data) — give bit-identical values and gradients.
//! - device = sim ([`check_device_vs_sim`]): another device (the kernel emulator's
//!   `CudaDevice`, feature `cuda-emu`) gives the sim's values and gradients bit for bit, in
//!   deterministic mode, for every case of an entry or of the random DAGs; and, with
//!   deterministic reductions off (the atomic kernels), within the f32 tolerance
//!   ([`check_device_vs_sim_within`]). A real GPU, whose `expf`, `tanhf`, ... are CUDA's own,
//!   is held to that tolerance in both modes, and to check 6 (det) on itself
//!   ([`check_deterministic_on`]).
//!
//! The deterministic-reductions flag is process-wide: every check here that sets it holds
//! [`flag_lock`] while it runs, so a check running with the flag off never overlaps one that
//! needs it on.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, OnceLock};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tl_spec::Tensor;
use tl_tape_cuda::determinism::set_deterministic_reductions;
use tl_tape_cuda::{CudaTape, Device, Precision, SimDevice};

use crate::backend::{CudaProgram, SimError};
use crate::checks::{
    backend_inputs, backend_tol, backward_case, backward_dag_case, compare_ids, forward_case,
    forward_dag_case, graph_cases, op_graph_cases,
};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::generate::Size;
use crate::metric::tensor_ulps;
use crate::{
    Backend, CaseError, CaseResult, CpuTape, CudaSim, GraphCase, Measured, OnPending, OpInfo,
    Report, RunConfig, Tol, registry, run_check_pending,
};

/// Run `check` on `cfg.cases` cases of `entry` on the sim's shapes ([`sim_graph_cases`]); an
/// op without a CUDA formula makes the whole cell pending.
fn run_on_entry(
    label: String,
    cfg: &RunConfig,
    entry: &OpInfo,
    check: impl Fn(&GraphCase) -> Result<Measured, CaseError>,
) -> Report {
    run_check_pending(
        label,
        cfg,
        sim_graph_cases(entry),
        OnPending::PendCell,
        &[],
        check,
    )
}

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

/// The lock every check holds while it depends on the process-wide deterministic-reductions
/// flag (a panic while holding it does not poison it for the others).
pub fn flag_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The per-op cases of the sim checks: [`op_graph_cases`], and for an entry with
/// `OpInfo::kinks` one case in four from those (small three times in four).
pub fn sim_graph_cases(entry: &OpInfo) -> BoxedStrategy<GraphCase> {
    match &entry.kinks {
        None => op_graph_cases(entry),
        Some(kinks) => {
            let on_kinks = prop_oneof![3 => kinks(Size::Small), 1 => kinks(Size::Large)].boxed();
            prop_oneof![3 => op_graph_cases(entry), 1 => graph_cases(on_kinks)].boxed()
        }
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
    run_on_entry(label, cfg, entry, |c| {
        pending_aware(&sim, forward_case(&sim, c, &tol))
    })
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
    run_on_entry(label, cfg, entry, |c| {
        pending_aware(backend.as_ref(), backward_case(backend, c, &tol))
    })
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
        |c| pending_aware(&sim, forward_dag_case(&sim, c)),
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
        |c| pending_aware(backend.as_ref(), backward_dag_case(backend, c)),
    )
}

/// One case of check 6 (≈cpu): values (and, with `grads`, dense gradients of `case.out`) of the
/// sim and the CPU f32 tape on the same f32 inputs agree within the f32 tolerance.
pub fn sim_vs_cpu_case(case: &GraphCase, tol: &Tol, grads: bool) -> Result<Measured, CaseError> {
    sim_vs_cpu_within(case, backend_tol::<f32>(tol, &case.graph), grads)
}

/// [`sim_vs_cpu_case`] with the final tolerance `tol` (on [`crate::metric::tensor_err`]).
pub fn sim_vs_cpu_within(case: &GraphCase, tol: f64, grads: bool) -> Result<Measured, CaseError> {
    let (sim, cpu) = (CudaSim::new(), CpuTape::<f32>::new());
    let (leaves, _) = backend_inputs::<f32>(case);
    let seed: Tensor<f32> = case.seed.cast();
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

/// One case of check 6 (≈cpu) for a pointwise or shape op: values (and, with `grads`, dense
/// gradients) of the sim and the CPU f32 tape on the same f32 inputs within `bound` ulps
/// ([`crate::metric::ulp_distance`]) element by element. The error is the largest distance.
pub fn sim_vs_cpu_ulps_case(
    case: &GraphCase,
    bound: u64,
    grads: bool,
) -> Result<Measured, CaseError> {
    let (sim, cpu) = (CudaSim::new(), CpuTape::<f32>::new());
    let (leaves, _) = backend_inputs::<f32>(case);
    let seed: Tensor<f32> = case.seed.cast();
    let cpu_prog = cpu
        .record(&case.graph, &leaves, &case.nats)
        .map_err(CaseError::Fail)?;
    let sim_prog = sim
        .try_record(&case.graph, &leaves, &case.nats)
        .map_err(sim_err)?;
    let mut pairs = vec![(
        "value",
        sim_prog.values().map_err(sim_err)?,
        cpu.values(&cpu_prog).map_err(CaseError::Fail)?,
    )];
    if grads {
        pairs.push((
            "gradient",
            sim_prog.backward_dense(case.out, &seed).map_err(sim_err)?,
            cpu.backward_dense(&cpu_prog, case.out, &seed)
                .map_err(CaseError::Fail)?,
        ));
    }
    let mut worst = Measured::ZERO;
    for (what, got, want) in pairs {
        worst = worst.max(within_ulps(
            case,
            what,
            &got,
            &want,
            bound,
            ("sim", "cpu-f32"),
        )?);
    }
    Ok(worst)
}

/// `got` (from backend `names.0`) against `want` (from `names.1`), one tensor per graph id, in
/// ulps ([`crate::metric::ulp_distance`]) element by element: the largest distance, held to
/// `bound`; a failure names the two backends, `what` (value or gradient), the id, its op, the
/// element and both values.
fn within_ulps(
    case: &GraphCase,
    what: &str,
    got: &[Tensor<f32>],
    want: &[Tensor<f32>],
    bound: u64,
    (a, b): (&str, &str),
) -> Result<Measured, CaseError> {
    let mut worst = Measured {
        err: 0.0,
        tol: bound as f64,
    };
    for (id, (g, w)) in got.iter().zip(want).enumerate() {
        if g.shape() != w.shape() {
            return Err(CaseError::Fail(format!(
                "{a} vs {b} {what} of %{id}: shapes {} and {}",
                g.shape(),
                w.shape()
            )));
        }
        let (ulps, at) = tensor_ulps(g, w);
        let m = Measured::check(ulps as f64, bound as f64, || {
            let origin = case
                .graph
                .node(id)
                .map_or_else(|| "leaf".to_owned(), |n| format!("{:?}", n.op()));
            format!(
                "{a} vs {b} {what} of %{id} ({origin}): {ulps} ulps apart at flat index {at}: \
                 {a} {:e}, {b} {:e}",
                g.data()[at],
                w.data()[at]
            )
        })
        .map_err(CaseError::Fail)?;
        worst = worst.max(m);
    }
    Ok(worst)
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
///
/// With `zero_sign` false, `+0` and `−0` count as the same: SEMANTICS.md does not fix the sign
/// of a zero result, and the kernels' `fmaxf` and Rust's `f32::max` pick different zeros
/// (`sqrt(−0)` is `−0` on the emulated kernels, `+0` on the sim).
fn bit_differences(
    case: &GraphCase,
    first: &[Tensor<f32>],
    other: &[Tensor<f32>],
    what_differs: &str,
    zero_sign: bool,
) -> Result<Measured, CaseError> {
    let mut differ = 0usize;
    let mut where_ = None;
    for (k, (a, b)) in first.iter().zip(other).enumerate() {
        for (i, (x, y)) in a.data().iter().zip(b.data()).enumerate() {
            let zeros = !zero_sign && *x == 0.0 && *y == 0.0;
            if x.to_bits() != y.to_bits() && !zeros {
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
    determinism_on_case(case, grads, || Ok(SimDevice::new()))
}

/// [`determinism_case`] on the devices `device` makes (a real GPU's `CudaDevice`, say): three
/// runs, on a fresh device twice and then on the second one again, bit for bit.
pub fn determinism_on_case<D: Device>(
    case: &GraphCase,
    grads: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    // Process-wide, like `TL_DETERMINISTIC=1`.
    let _flag = flag_lock();
    set_deterministic_reductions(true);
    let fresh = || {
        device()
            .map(CudaTape::new)
            .map_err(|e| CaseError::Fail(format!("device: {e}")))
    };
    let (first, _) = tape_run(fresh()?, case, grads).map_err(sim_err)?;
    let (second, reused) = tape_run(fresh()?, case, grads).map_err(sim_err)?;
    let (third, _) = tape_run(reused, case, grads).map_err(sim_err)?;
    let mut worst = Measured { err: 0.0, tol: 0.0 };
    for (run, other) in [
        ("second (fresh device)", &second),
        ("third (reused device)", &third),
    ] {
        let what = format!("deterministic mode: the {run} run differs from the first");
        worst = worst.max(bit_differences(case, &first, other, &what, true)?);
    }
    Ok(worst)
}

/// One case of the device = sim check: deterministic mode on, the CUDA tape on a fresh `D`
/// (from `device`) gives the sim's values and (with `grads`) dense gradients bit for bit, the
/// sign of a zero aside (see `bit_differences`).
pub fn device_vs_sim_case<D: Device>(
    case: &GraphCase,
    grads: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    let sim = || Ok(SimDevice::new());
    device_vs_twin_case(case, grads, Precision::F32, sim, device)
}

/// [`device_vs_sim_case`] against the sim made by `twin` (a sim set up as the device is: its
/// flash products), both tapes at `precision` (autocast: [`CudaTape::set_precision`]).
pub fn device_vs_twin_case<D: Device>(
    case: &GraphCase,
    grads: bool,
    precision: Precision,
    twin: fn() -> tl_tape_cuda::Result<SimDevice>,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    let _flag = flag_lock();
    set_deterministic_reductions(true);
    let d = device().map_err(|e| CaseError::Fail(format!("device: {e}")))?;
    let name = d.name();
    let sim = twin().map_err(|e| CaseError::Fail(format!("sim: {e}")))?;
    let (mut want_tape, mut got_tape) = (CudaTape::new(sim), CudaTape::new(d));
    want_tape.set_precision(precision);
    got_tape.set_precision(precision);
    let (want, _) = tape_run(want_tape, case, grads).map_err(sim_err)?;
    let (got, _) = tape_run(got_tape, case, grads).map_err(sim_err)?;
    let what = format!("{name} differs from cuda-sim");
    bit_differences(case, &want, &got, &what, false)
}

/// One case of a bit-neutral gate of the CUDA tape: deterministic mode on, the case run on a
/// fresh `D` (from `device`) under each of `settings` (each installs its override and returns
/// the guard that keeps it), every setting's values and (with `grads`) dense gradients bit for
/// bit the first one's.
pub fn same_bits_under_case<D: Device, G>(
    case: &GraphCase,
    grads: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
    settings: &[(&str, &dyn Fn() -> G)],
) -> Result<Measured, CaseError> {
    let _flag = flag_lock();
    set_deterministic_reductions(true);
    let mut runs = Vec::with_capacity(settings.len());
    for (_, install) in settings {
        let _gate = install();
        let d = device().map_err(|e| CaseError::Fail(format!("device: {e}")))?;
        runs.push(tape_run(CudaTape::new(d), case, grads).map_err(sim_err)?.0);
    }
    let mut worst = Measured { err: 0.0, tol: 0.0 };
    for ((label, _), run) in settings.iter().zip(&runs).skip(1) {
        let what = format!("{label} differs from {}", settings[0].0);
        worst = worst.max(bit_differences(case, &runs[0], run, &what, true)?);
    }
    Ok(worst)
}

/// [`same_bits_under_case`] for every case of a registry entry (gradients too where check 2
/// applies) on the device `name` made by `device`; `gate` names the gate in the label.
pub fn check_same_bits_under<D: Device, G>(
    entry: &OpInfo,
    cfg: &RunConfig,
    (name, device): (&str, fn() -> tl_tape_cuda::Result<D>),
    gate: &str,
    settings: &[(&str, &dyn Fn() -> G)],
) -> Report {
    let label = format!("= {gate} {} {name}", entry.name);
    let grads = entry.applies.backward;
    run_on_entry(label, cfg, entry, |c| {
        same_bits_under_case(c, grads, device, settings)
    })
}

/// One case of the device ≈ sim check: the CUDA tape on a fresh `D` gives the sim's values and
/// (with `grads`) dense gradients within `tol` (as [`crate::metric::tensor_err`]), with the
/// device's reductions deterministic or not (`deterministic` false: the atomic kernels, any
/// summation order). The sim always runs deterministically; the flag is back on before the
/// lock is released.
pub fn device_vs_sim_within_case<D: Device>(
    case: &GraphCase,
    tol: f64,
    grads: bool,
    deterministic: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    let want = {
        let _flag = flag_lock();
        set_deterministic_reductions(true);
        tape_run(CudaTape::new(SimDevice::new()), case, grads)
            .map_err(sim_err)?
            .0
    };
    let d = device().map_err(|e| CaseError::Fail(format!("device: {e}")))?;
    let name = d.name();
    let got = {
        let _flag = flag_lock();
        set_deterministic_reductions(deterministic);
        let r = tape_run(CudaTape::new(d), case, grads);
        set_deterministic_reductions(true);
        r.map_err(sim_err)?.0
    };
    let mode = if deterministic {
        "deterministic"
    } else {
        "non-deterministic"
    };
    let ids = case.graph.len();
    let widen: Vec<Tensor<f64>> = want.iter().map(Tensor::cast).collect();
    let (vals, grads_) = got.split_at(ids.min(got.len()));
    let mut m = compare_ids(
        &case.graph,
        vals,
        &widen[..ids.min(widen.len())],
        tol,
        &format!("{name} ({mode}) vs cuda-sim value"),
    )
    .map_err(CaseError::Fail)?;
    if grads {
        m = m.max(
            compare_ids(
                &case.graph,
                grads_,
                &widen[ids.min(widen.len())..],
                tol,
                &format!("{name} ({mode}) vs cuda-sim gradient"),
            )
            .map_err(CaseError::Fail)?,
        );
    }
    Ok(m)
}

/// One case of the device ≈ sim check in ulps, for a pointwise op: deterministic mode on, the
/// CUDA tape on a fresh `D` gives the sim's values and (with `grads`) dense gradients within
/// `bound` ulps element by element ([`crate::metric::ulp_distance`]); the error is the largest
/// distance. A user op's kernels on the emulator or a GPU against its sim twin.
pub fn device_vs_sim_ulps_case<D: Device>(
    case: &GraphCase,
    bound: u64,
    grads: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Result<Measured, CaseError> {
    let _flag = flag_lock();
    set_deterministic_reductions(true);
    let (want, _) = tape_run(CudaTape::new(SimDevice::new()), case, grads).map_err(sim_err)?;
    let d = device().map_err(|e| CaseError::Fail(format!("device: {e}")))?;
    let name = d.name();
    let (got, _) = tape_run(CudaTape::new(d), case, grads).map_err(sim_err)?;
    let ids = case.graph.len().min(got.len()).min(want.len());
    let ((got_values, got_grads), (want_values, want_grads)) =
        (got.split_at(ids), want.split_at(ids));
    let names = (name, "cuda-sim");
    let m = within_ulps(case, "value", got_values, want_values, bound, names)?;
    Ok(m.max(within_ulps(
        case, "gradient", got_grads, want_grads, bound, names,
    )?))
}

/// The device ≈ sim check in ulps ([`device_vs_sim_ulps_case`]) for an entry, on the device
/// `name` made by `device`.
pub fn check_device_vs_sim_ulps<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    bound: u64,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let label = format!("≈ sim ulps {} {name}", entry.name);
    let grads = entry.applies.backward;
    run_on_entry(label, cfg, entry, |c| {
        device_vs_sim_ulps_case(c, bound, grads, device)
    })
}

/// The device ≈ sim check for a registry entry (gradients too where check 2 applies): the f32
/// tolerance of the entry scaled by reduction length, with deterministic reductions or the
/// atomic kernels (`deterministic` false).
pub fn check_device_vs_sim_within<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    deterministic: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let mode = if deterministic { "det" } else { "nondet" };
    let label = format!("≈ sim {mode} {} {name}", entry.name);
    let (tol, grads) = (entry.tol, entry.applies.backward);
    run_on_entry(label, cfg, entry, |c| {
        let t = backend_tol::<f32>(&tol, &c.graph);
        device_vs_sim_within_case(c, t, grads, deterministic, device)
    })
}

/// The device ≈ sim check on random DAGs, as [`check_device_vs_sim_within`].
pub fn check_device_vs_sim_within_dag<D: Device>(
    cfg: &RunConfig,
    name: &str,
    deterministic: bool,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let mode = if deterministic { "det" } else { "nondet" };
    run_check_pending(
        format!("≈ sim {mode} dag {name}"),
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| {
            let t = backend_tol::<f32>(&DAG_TOL, &c.graph);
            device_vs_sim_within_case(c, t, true, deterministic, device)
        },
    )
}

/// The device = sim check for a registry entry (gradients too where check 2 applies), on the
/// device `name` made by `device`.
pub fn check_device_vs_sim<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let sim = || Ok(SimDevice::new());
    check_device_vs_twin(entry, cfg, name, (Precision::F32, sim), device)
}

/// [`check_device_vs_sim`] against the sim made by `twin`, both tapes at `precision`
/// ([`device_vs_twin_case`]).
pub fn check_device_vs_twin<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    (precision, twin): (Precision, fn() -> tl_tape_cuda::Result<SimDevice>),
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let label = format!("= sim {} {name} {precision:?}", entry.name);
    let grads = entry.applies.backward;
    run_on_entry(label, cfg, entry, |c| {
        device_vs_twin_case(c, grads, precision, twin, device)
    })
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

/// Check 6 (≈cpu) for a registry entry (gradients too where check 2 applies): in ulps for
/// pointwise and shape ops (`OpInfo::ulps`), within the scaled f32 tolerance otherwise.
pub fn check_sim_vs_cpu(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("6 ≈cpu {} cuda-sim", entry.name);
    let (tol, grads, ulps) = (entry.tol, entry.applies.backward, entry.ulps);
    run_on_entry(label, cfg, entry, |c| match ulps {
        Some(bound) => sim_vs_cpu_ulps_case(c, bound, grads),
        None => sim_vs_cpu_case(c, &tol, grads),
    })
}

/// Check 6 (det) for a registry entry.
pub fn check_deterministic(entry: &OpInfo, cfg: &RunConfig) -> Report {
    check_deterministic_on(entry, cfg, "cuda-sim", || Ok(SimDevice::new()))
}

/// Check 6 (det) for a registry entry on the devices `device` makes.
pub fn check_deterministic_on<D: Device>(
    entry: &OpInfo,
    cfg: &RunConfig,
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    let label = format!("6 det {} {name}", entry.name);
    let grads = entry.applies.backward;
    run_on_entry(label, cfg, entry, |c| determinism_on_case(c, grads, device))
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
    check_deterministic_dag_on(cfg, "cuda-sim", || Ok(SimDevice::new()))
}

/// Check 6 (det) on random DAGs, on the devices `device` makes.
pub fn check_deterministic_dag_on<D: Device>(
    cfg: &RunConfig,
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    run_check_pending(
        format!("6 det dag {name}"),
        cfg,
        sim_dag_cases(DagOptions::default()),
        OnPending::SkipCase,
        &known(),
        |c| determinism_on_case(c, true, device),
    )
}
