//! The harness as a library: your own op ([`check_user_op`]) and your own backend
//! ([`check_backend`]) through the checks every catalogue op and backend passes.
//!
//! **A user op** ([`tl_ir::UserOp`]) is described by a [`UserEntry`]: how to draw its operand
//! shapes, the domain of each operand (kept off its kinks and poles, as the registry does for
//! the catalogue), its tolerances, the ulps its device may differ from the CPU by, which checks
//! do not apply and why. [`check_user_op`] then runs, on the generated cases:
//!
//! - **0 finite** — the reference value, VJP and JVP are finite on the declared domain (unless
//!   the entry allows non-finite values);
//! - **1 fwd, 2 bwd** — the CPU tape (f64, f32; the op's CPU kernel) and the CUDA tape on the
//!   simulation device (its device implementation, or its reference in f32) against the f64
//!   IR's eval and backprop (the op's reference value and VJP);
//! - **3 fd** — the reference VJP against central finite differences of the reference value;
//! - **4 jvp** — the adjoint identity between the reference JVP and VJP;
//! - **5 sess** — the eager session (CPU, CUDA sim) against the linked session (recorded,
//!   compiled, replayed);
//! - **6 ≈cpu, 6 det** — the sim against the CPU f32 tape (within the entry's ulps, or its f32
//!   tolerance for an op that reduces), and bit-identical reruns in deterministic mode;
//! - **7 bad input** ([`crate::checks::bad_input`], on an eighth of the cases) — the CPU tape
//!   (f64, f32) and the sim, and the emulated or real device where the build has one, given the
//!   op's cases with leaves of the wrong shape or count, bad seeds and ids (each an `Err`, never a
//!   panic) and with NaN, +∞ and −∞ in every operand: the op's kernels must compute those (of
//!   the IR's shapes) wherever its reference does, and never panic (a panic is caught and
//!   quoted);
//! - with feature `cuda-emu`, **≈ sim cuda-emu**: the op on the kernel emulator's `CudaDevice`
//!   (its kernels from the user's `.cu`, compiled for the host) against the sim, in the
//!   emulator's thread order and again with each block's threads reversed (a kernel missing a
//!   barrier fails the second); with feature `cuda`, the same on a real GPU when there is one
//!   (skipped, and said so, when not). Without either, an op that brings a device
//!   implementation gets a skip line saying so.
//!
//! The result is a [`UserReport`]: one [`Report`] per check and backend, each failure naming the
//! check, the backend, the shrunk case (op, parameters, shapes, every value) and the error;
//! [`UserReport::summary`] ends in `N passed, N failed` (and `, N skipped` where checks were
//! skipped). One call in a `#[test]`:
//!
//! ```
//! # use tl_conformance::user::{UserEntry, check_user_op};
//! # use tl_conformance::{Domain, RunConfig};
//! # use tl_ir::{UserOp, UserOpRef};
//! # use tl_spec::{Scalar, Shape, Tensor};
//! # struct Cube;
//! # impl UserOp for Cube {
//! #     fn name(&self) -> &'static str { "cube" }
//! #     fn arity(&self) -> usize { 1 }
//! #     fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> { Ok(s[0].clone()) }
//! #     fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
//! #         Ok(x[0].map(|v| v * v * v))
//! #     }
//! #     fn vjp<T: Scalar>(&self, x: &[&Tensor<T>], g: &Tensor<T>)
//! #         -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
//! #         Ok(vec![Some(x[0].zip_map("cube", g, |v, g| T::lit(3.0) * v * v * g)?)])
//! #     }
//! #     fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
//! #         x[0].zip_map("cube", dx[0], |v, d| T::lit(3.0) * v * v * d)
//! #     }
//! # }
//! let entry = UserEntry::elementwise(UserOpRef::new(Cube)).domains(Domain::Any(2.0));
//! let report = check_user_op(&entry, &RunConfig { cases: 8, ..RunConfig::default() });
//! assert!(report.passed(), "{report}");
//! println!("{}", report.summary()); // "cube: 16 passed, 0 failed" (19 with cuda-emu)
//! ```
//!
//! **A backend** (a [`Backend`]: record a graph, read its values, dense backward) goes through
//! [`check_backend`]: checks 1 and 2 for every registry op and on random DAGs, the conventions
//! at kinks, ties and bounds, and the hard inputs, the suite the CPU tape and the CUDA sim pass;
//! the grid cases, a few graphs of 3·10⁵ elements and more where GPU kernels loop over their
//! grid ([`crate::checks::grid::check_grid_backend`]); and **7 bad input** ([`crate::checks::bad_input`]) for every registry op and on random DAGs:
//! leaf values of the wrong shape, too few or too many leaves, a seed of the wrong shape and an
//! output id past the graph's are each an `Err` naming the shapes, counts or id, never a panic
//! (caught, and quoted in the report) and never an `Ok`; the backend still gives the IR's
//! values and gradients after refusing; a short or out-of-range Nat environment (total reads)
//! and non-finite leaf values are not refused. A backend that implements part of the
//! catalogue says which ops in [`Backend::supports`], and is checked on those
//! ([`crate::backend::partial`]); one that computes in less than its element type on purpose
//! (TF32 products) states the precision it means in [`Backend::tolerance`], and the report
//! marks every check where that was wider than the suite's ([`SuiteReport::widened`]).
//!
//! **A model** of your own: [`crate::model::check_model`].
//!
//! **A hang** (an op or a backend in an infinite loop or a deadlock) cannot be failed like a
//! panic, since a thread cannot be stopped: a case that runs past the case timeout
//! (`TL_CASE_TIMEOUT` seconds, 600 by default; [`crate::set_case_timeout`] in code) ends the
//! process with exit status [`crate::watchdog::EXIT_STATUS`] (124) and one message on stderr
//! naming the check's label, the case, how long it ran and the seed and case count that
//! reproduce it ([`crate::watchdog`]), instead of hanging the run.

use std::fmt;
use std::sync::Arc;

use proptest::prelude::*;
use tl_ir::{Op, UserOpRef};
use tl_spec::{Shape, Tensor};

use crate::backend::partial::Partial;
use crate::checks::bad_input::{
    bad_input_cfg, check_bad_input, check_bad_input_dag, check_oversized,
};
use crate::checks::grid::check_grid_backend;
use crate::checks::{
    check_backward, check_backward_dag, check_forward, check_forward_dag, conventions, hard,
};
use crate::generate::{Size, any_shape, direction, tensor};
use crate::registry::{Applies, Generate, OpInfo, Tol};
use crate::{
    ANY, Backend, CpuTape, CudaSim, Domain, OpCase, Report, RunConfig, registry, run_check, verify,
};

/// Draws the operand shapes of a user op's cases, by size.
pub type Shapes = Arc<dyn Fn(Size) -> BoxedStrategy<Vec<Shape>> + Send + Sync>;

/// What the harness needs to know of a user op: how to draw valid cases, and what to hold it
/// to. PyTorch: an `OpInfo` entry with its `sample_inputs_func`.
#[derive(Clone)]
pub struct UserEntry {
    op: UserOpRef,
    shapes: Shapes,
    domains: Vec<Domain>,
    tol: Tol,
    ulps: Option<u64>,
    applies: Applies,
    note: &'static str,
    index_operands: Vec<usize>,
    kinks: Option<Generate>,
    finite: bool,
    /// What is wrong with the entry as built (an operand index past the op's, a domain that
    /// is not one): [`check_user_op`] reports them and checks nothing else.
    problems: Vec<String>,
}

impl UserEntry {
    /// `op` with operand shapes drawn by `shapes` (one shape per operand, satisfying the op's
    /// shape rule), operands from [`ANY`] (`[-2, 2]`), the default tolerances, every check.
    pub fn new(
        op: UserOpRef,
        shapes: impl Fn(Size) -> BoxedStrategy<Vec<Shape>> + Send + Sync + 'static,
    ) -> Self {
        let arity = op.arity();
        UserEntry {
            op,
            shapes: Arc::new(shapes),
            domains: vec![ANY; arity],
            tol: Tol::DEFAULT,
            ulps: None,
            applies: Applies::ALL,
            note: "",
            index_operands: Vec::new(),
            kinks: None,
            finite: true,
            problems: Vec::new(),
        }
    }

    /// `op` on operands that all share one shape, of any rank from 0 to 3 (small cases: dims up
    /// to 4; large: up to 40), as for the catalogue's pointwise ops.
    pub fn elementwise(op: UserOpRef) -> Self {
        let arity = op.arity();
        UserEntry::new(op, move |z| {
            any_shape(z).prop_map(move |s| vec![s; arity]).boxed()
        })
    }

    /// Draw operand `k` from `domain` (keep it off the op's kinks and poles where checks 1–3
    /// need smoothness, as the registry does for `abs`, `log`, `div`, ...). An operand the op
    /// does not have, or a domain that fails [`Domain::check`], fails [`check_user_op`]'s
    /// report before anything runs.
    pub fn domain(mut self, k: usize, domain: Domain) -> Self {
        self.note_domain(&format!("domain({k}, {domain:?})"), domain);
        match self.domains.get_mut(k) {
            Some(d) => *d = domain,
            None => self.problems.push(format!(
                "domain({k}, {domain:?}): {} has {} operand(s), numbered from 0",
                self.op.name(),
                self.op.arity()
            )),
        }
        self
    }

    /// Draw every operand from `domain` (one that fails [`Domain::check`] fails
    /// [`check_user_op`]'s report before anything runs).
    pub fn domains(mut self, domain: Domain) -> Self {
        self.note_domain(&format!("domains({domain:?})"), domain);
        self.domains.iter_mut().for_each(|d| *d = domain);
        self
    }

    /// Keep `domain`'s problem, if it has one, for [`check_user_op`]'s report.
    fn note_domain(&mut self, call: &str, domain: Domain) {
        if let Err(e) = domain.check() {
            self.problems.push(format!("{call}: {e}"));
        }
    }

    /// Hold the op to `tol` instead of [`Tol::DEFAULT`].
    pub fn tol(mut self, tol: Tol) -> Self {
        self.tol = tol;
        self
    }

    /// The op is pointwise (or only moves data): its values and gradients on the sim (and the
    /// emulated or real device) may differ from the CPU f32 tape by at most `ulps` units in the
    /// last place. Without it, the f32 tolerance scaled by reduction length applies.
    pub fn ulps(mut self, ulps: u64) -> Self {
        self.ulps = Some(ulps);
        self
    }

    /// Skip check 3 (finite differences), saying why (e.g. the op is piecewise constant).
    pub fn no_fd(mut self, why: &'static str) -> Self {
        self.applies = Applies::NO_FD;
        self.note = why;
        self
    }

    /// Operands that are indices: never perturbed by finite differences, and the VJP must give
    /// them no gradient.
    pub fn indices(mut self, operands: &[usize]) -> Self {
        self.index_operands = operands.to_vec();
        self
    }

    /// Cases placed on the op's kinks, ties or bounds, for the checks that compare backends at
    /// them (a quarter of check 6's cases).
    pub fn kinks(
        mut self,
        kinks: impl Fn(Size) -> BoxedStrategy<OpCase> + Send + Sync + 'static,
    ) -> Self {
        self.kinks = Some(Arc::new(kinks));
        self
    }

    /// The op may return non-finite values on its domain (check 0 is skipped).
    pub fn allow_non_finite(mut self) -> Self {
        self.finite = false;
        self
    }

    /// The op.
    pub fn op(&self) -> &UserOpRef {
        &self.op
    }

    /// Generated cases of size `z`: shapes from the entry's generator, operands from its
    /// domains.
    pub fn cases(&self, z: Size) -> BoxedStrategy<OpCase> {
        let op = Op::User(self.op.clone());
        let domains = self.domains.clone();
        (self.shapes)(z)
            .prop_flat_map(move |shapes| {
                let operands: Vec<BoxedStrategy<Tensor<f64>>> = shapes
                    .into_iter()
                    .enumerate()
                    .map(|(k, s)| tensor(s, domains.get(k).copied().unwrap_or(ANY)))
                    .collect();
                let op = op.clone();
                operands.prop_map(move |inputs| OpCase::new(op.clone(), inputs))
            })
            .boxed()
    }

    /// The entry as the registry's checks take it.
    pub fn info(&self) -> OpInfo {
        let me = self.clone();
        OpInfo {
            name: self.op.name(),
            applies: self.applies,
            note: self.note,
            tol: self.tol,
            generate: Arc::new(move |z| me.cases(z)),
            index_operands: self.index_operands.clone(),
            kinks: self.kinks.clone(),
            ulps: self.ulps,
        }
    }
}

/// The reports of one suite run: a user op's checks ([`check_user_op`]) or the catalogue's
/// suite on a backend ([`check_backend`]).
#[derive(Debug, Clone)]
pub struct SuiteReport {
    /// What was checked: the op's or the backend's name.
    pub name: String,
    /// One report per check and backend (or op).
    pub reports: Vec<Report>,
    /// Checks that could not run here, with why (a GPU check without a GPU).
    pub skipped: Vec<String>,
    /// The labels of the checks in which the backend held itself to a wider tolerance than
    /// the suite's ([`Backend::tolerance`]); empty where it did not, and for a user op's or a
    /// model's suite.
    pub widened: Vec<String>,
}

/// A user op's reports ([`check_user_op`]).
pub type UserReport = SuiteReport;

/// A backend's reports ([`check_backend`]).
pub type BackendReport = SuiteReport;

impl SuiteReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.reports.iter().all(Report::passed)
    }

    /// The reports that failed.
    pub fn failures(&self) -> Vec<&Report> {
        self.reports.iter().filter(|r| !r.passed()).collect()
    }

    /// One line: the name, and `N passed, N failed` over its checks, then how many were
    /// skipped and in how many the backend held itself to a wider tolerance than the suite's,
    /// where any: `mybackend: 220 passed, 0 failed, 1 skipped, 12 at the backend's wider
    /// tolerance`.
    pub fn summary(&self) -> String {
        let failed = self.failures().len();
        let skipped = match self.skipped.len() {
            0 => String::new(),
            n => format!(", {n} skipped"),
        };
        let widened = match self.widened.len() {
            0 => String::new(),
            n => format!(", {n} at the backend's wider tolerance"),
        };
        format!(
            "{}: {} passed, {} failed{skipped}{widened}",
            self.name,
            self.reports.len() - failed,
            failed
        )
    }
}

/// One line per check (`ok` or `FAIL`, cases, largest error, and the tolerance where the
/// backend widened it), the skipped checks, every failure in full (the check, the backend, the
/// shrunk case, the error), a line saying so where the backend widened any tolerance, then
/// the summary.
impl fmt::Display for SuiteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The labels in one column, as wide as the longest (46 at least).
        let w = (self.reports.iter())
            .map(|r| r.label.chars().count())
            .fold(46, usize::max);
        for r in &self.reports {
            match (r.passed(), r.cases) {
                (false, 0) => write!(f, "FAIL {:<w$} no case passed", r.label)?,
                (passed, cases) => write!(
                    f,
                    "{} {:<w$} {cases:>5} case(s)  max err {:.2e}",
                    if passed { "ok  " } else { "FAIL" },
                    r.label,
                    r.max_err
                )?,
            }
            match (self.widened.contains(&r.label), r.cases) {
                (false, _) => {}
                // No case passed: no tolerance was recorded.
                (true, 0) => write!(f, "  (tolerance: Backend::tolerance)")?,
                (true, _) => write!(f, "  tol {:.1e} (Backend::tolerance)", r.tol)?,
            }
            match r.pending.as_slice() {
                [] => writeln!(f)?,
                ops => writeln!(
                    f,
                    "  (cases holding {} drawn again: not implemented)",
                    ops.join(", ")
                )?,
            }
        }
        for s in &self.skipped {
            writeln!(f, "skip {s}")?;
        }
        for r in self.failures() {
            writeln!(f, "\n{r}")?;
        }
        if !self.widened.is_empty() {
            let (n, of) = (self.widened.len(), self.reports.len());
            writeln!(
                f,
                "tolerances: the backend's own (Backend::tolerance), wider than the suite's in \
                 {n} of {of} checks"
            )?;
        }
        write!(f, "{}", self.summary())
    }
}

/// Run checks 0–7 on the user op of `entry` (see the module documentation) with `cfg`'s case
/// count and seed (check 7 with an eighth of it: [`bad_input_cfg`]). First the entry itself
/// ([`check_entry`]): where it is wrong, that one failed report is the result. A panic in the
/// op fails the check it happens in; a case that does not return ends the process after the
/// case timeout, naming the check ([`crate::watchdog`]).
pub fn check_user_op(entry: &UserEntry, cfg: &RunConfig) -> UserReport {
    let name = entry.op.name().to_owned();
    let entry_report = check_entry(entry, cfg);
    if !entry_report.passed() {
        return SuiteReport {
            name,
            reports: vec![entry_report],
            skipped: Vec::new(),
            widened: Vec::new(),
        };
    }
    let info = entry.info();
    let mut reports = Vec::new();
    if entry.finite {
        reports.push(check_finite(entry, cfg));
    }
    reports.extend(verify::op_row(&info, cfg).cells.into_iter().flatten());
    let bad_cfg = bad_input_cfg(cfg);
    reports.push(check_bad_input(&CpuTape::<f64>::new(), &info, &bad_cfg));
    reports.push(check_bad_input(&CpuTape::<f32>::new(), &info, &bad_cfg));
    reports.push(check_bad_input(&CudaSim::new(), &info, &bad_cfg));
    let (device, skipped) = device_checks(entry, &info, cfg);
    reports.extend(device);
    SuiteReport {
        name: entry.op.name().to_owned(),
        reports,
        skipped,
        widened: Vec::new(),
    }
}

/// The entry before its checks (label `entry <op>`): a positive case count, the problems it
/// was built with (an operand index past the op's, a domain that is not one), and shape sets
/// drawn by its generator at both sizes (`cfg`'s seed, up to 16 of each) that have one shape per
/// operand and satisfy the op's shape rule. A failure names what is wrong.
pub fn check_entry(entry: &UserEntry, cfg: &RunConfig) -> Report {
    use proptest::strategy::ValueTree;
    let label = format!("entry {}", entry.op.name());
    let mut problems = entry.problems.clone();
    if cfg.cases == 0 {
        problems.push(
            "the run's case count is 0 (RunConfig::cases, TL_CASES): no case would be checked"
                .into(),
        );
    }
    let op = Op::User(entry.op.clone());
    let mut runner = cfg.runner(&label);
    let _check = crate::watchdog::checking(&label, Some(cfg));
    'draws: for z in [Size::Small, Size::Large] {
        for _ in 0..cfg.cases.min(16) {
            let shapes = match crate::guard::catch(|| (entry.shapes)(z).new_tree(&mut runner)) {
                Ok(Ok(tree)) => tree.current(),
                Ok(Err(e)) => {
                    problems.push(format!("the shape generator found no shapes at {z:?}: {e}"));
                    break 'draws;
                }
                Err(p) => {
                    problems.push(format!("the shape generator panicked at {z:?}: {p}"));
                    break 'draws;
                }
            };
            let refs: Vec<&Shape> = shapes.iter().collect();
            let refused = match op.arity() == shapes.len() {
                false => Some(format!(
                    "{} operand shape(s), where {} takes {}",
                    shapes.len(),
                    op.name(),
                    op.arity()
                )),
                true => op.infer_shape(&refs).err().map(|e| e.to_string()),
            };
            if let Some(why) = refused {
                let drawn: Vec<String> = shapes.iter().map(ToString::to_string).collect();
                problems.push(format!(
                    "the shape generator drew [{}] at {z:?}, which the op refuses: {why}",
                    drawn.join(", ")
                ));
                break 'draws;
            }
        }
    }
    Report {
        label,
        cases: 0,
        max_err: 0.0,
        tol: 0.0,
        failure: (!problems.is_empty()).then(|| problems.join("\n")),
        pending: Vec::new(),
    }
}

/// The emulated or real device against the sim, where the build has one (within the entry's
/// ulps where it declares them, else its f32 tolerance; on the emulator in both thread
/// orders), and check 7 on it: the reports, and the checks skipped with why (a build without
/// CUDA skips them, and says so when the op brings a device implementation it cannot run).
#[allow(unused_variables, unused_mut)]
fn device_checks(entry: &UserEntry, info: &OpInfo, cfg: &RunConfig) -> (Vec<Report>, Vec<String>) {
    let (mut reports, mut skipped) = (Vec::new(), Vec::new());
    #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
    if entry.op.has_extensions() {
        skipped.push(format!(
            "≈ sim {op} and 7 bad input {op} on the device: {op} brings a device implementation (its own kernels or closures), and this build of tl-conformance has no CUDA: enable its `cuda-emu` feature (the kernel emulator, no GPU needed) or `cuda` (a GPU) to check it",
            op = info.name
        ));
    }
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    {
        use crate::checks::sim::{check_device_vs_sim_ulps, check_device_vs_sim_within};
        use tl_tape_cuda::CudaDevice;
        let name = if cfg!(feature = "cuda-emu") {
            "cuda-emu"
        } else {
            "cuda"
        };
        match CudaDevice::new() {
            Ok(_) => {
                let vs_sim = |name: &'static str| match info.ulps {
                    Some(b) => check_device_vs_sim_ulps(info, cfg, name, b, CudaDevice::new),
                    None => check_device_vs_sim_within(info, cfg, name, true, CudaDevice::new),
                };
                reports.push(vs_sim(name));
                // The emulator runs a block's threads in one order; the other order catches
                // kernels whose threads read each other's writes without a barrier.
                #[cfg(feature = "cuda-emu")]
                reports.push(tl_tape_cuda::in_reverse_schedule(|| {
                    vs_sim("cuda-emu (threads reversed)")
                }));
                let device = crate::backend::OnDevice::new(name, CudaDevice::new);
                reports.push(check_bad_input(&device, info, &bad_input_cfg(cfg)));
            }
            Err(e) => skipped.push(format!(
                "≈ sim {} {name} and 7 bad input {} {name}: no CUDA device: {e}",
                info.name, info.name
            )),
        }
    }
    (reports, skipped)
}

/// Check 0: the reference value, VJP (for a random cotangent) and JVP (for random tangents) are
/// finite on the entry's cases.
pub fn check_finite(entry: &UserEntry, cfg: &RunConfig) -> Report {
    let op = Op::User(entry.op.clone());
    let cases = entry
        .info()
        .mixed_cases()
        .prop_flat_map(|case| {
            let out = case.out_shape();
            let tangents: Vec<BoxedStrategy<Tensor<f64>>> = case
                .inputs
                .iter()
                .map(|t| direction(t.shape().clone()))
                .collect();
            (Just(case), direction(out), tangents)
        })
        .boxed();
    run_check(
        format!("0 finite {}", entry.op.name()),
        cfg,
        cases,
        move |(case, g, dx)| {
            let args = case.args();
            let finite = |what: &str, t: &Tensor<f64>| match t
                .data()
                .iter()
                .position(|v| !v.is_finite())
            {
                Some(i) => Err(format!(
                    "{}: the reference {what} is {} at element {i} (the op declares finite values on this domain)",
                    op.name(),
                    t.data()[i]
                )),
                None => Ok(()),
            };
            let y = tl_ir::rules::value(&op, &args, &case.nats).map_err(|e| e.to_string())?;
            finite("value", &y)?;
            for d in tl_ir::rules::vjp(&op, &args, g, &case.nats)
                .map_err(|e| e.to_string())?
                .iter()
                .flatten()
            {
                finite("VJP", d)?;
            }
            let dx: Vec<&Tensor<f64>> = dx.iter().collect();
            let t = tl_ir::rules::jvp(&op, &args, &dx, &case.nats).map_err(|e| e.to_string())?;
            finite("JVP", &t)?;
            Ok(crate::Measured::ZERO)
        },
    )
}

/// The catalogue's suite against a third-party backend: checks 1 (forward) and 2 (backward)
/// for every registry op and on random DAGs, then the conventions (kinks, ties, bounds, signed
/// zeros, NaN) and the hard inputs, values and gradients, then the grid cases (graphs past one
/// grid of a GPU launch, values and gradients: [`check_grid_backend`]), then check 7 (bad input, see
/// [`crate::checks::bad_input`]) for every registry op and on random DAGs, on an eighth of
/// `cfg`'s cases ([`bad_input_cfg`]): the wrong leaf shapes and counts, seed shapes and output
/// ids must be errors that name them, never a panic or an `Ok`, and leave the backend working;
/// a short Nat environment and non-finite leaves must not be refused; and graphs whose outputs
/// no machine holds ([`check_oversized`]) must be errors naming the op. A backend that cannot
/// run an op fails that op's cells with its error, unless it says so in
/// [`Backend::supports`]: then the op's cells are skipped (listed in
/// [`SuiteReport::skipped`]), every other check draws again each case holding it (the report
/// lists the op), and a check none of whose cases it can run is skipped too
/// ([`crate::backend::partial`]); one that panics fails the check, quoting the
/// panic; one that does not return ends the process after the case timeout, naming the check
/// and the case ([`crate::watchdog`]). Every comparison is within [`Backend::tolerance`]
/// (the suite's tolerances unless the backend states its own); a check in which it was wider
/// than the suite's is listed in [`SuiteReport::widened`], and its line in the report shows
/// the tolerance. A backend whose products run under autocast ([`Backend::precision`]: bf16
/// or TF32) has each product op it supports held to the autocast reference too, within the
/// f32 accumulation bound ([`crate::checks::autocast::check_products`]), and attention's core
/// to the spec's autocast reference ([`crate::checks::autocast::check_attention`]). PyTorch has no such
/// entry point; burn runs one test suite against every backend in the same spirit.
pub fn check_backend<B: Backend>(backend: &B, cfg: &RunConfig) -> BackendReport {
    let mut reports = Vec::new();
    let mut skipped = Vec::new();
    let mut widened = Vec::new();
    let bad_cfg = bad_input_cfg(cfg);
    // Only the ops the backend supports: the others' cells are skipped, and a case of any
    // check holding one is drawn again (`crate::backend::partial`).
    let (entries, lacking): (Vec<_>, Vec<_>) = registry::all()
        .into_iter()
        .partition(|e| backend.supports(e.name));
    for entry in &lacking {
        skipped.push(format!(
            "{}: checks 1, 2 and 7 (backend {} does not implement it: Backend::supports)",
            entry.name,
            backend.name()
        ));
    }
    let backend = &Partial::new(backend);
    // Each check's report, and its label where the backend widened a tolerance in it.
    let mut keep = |report: Report| {
        if backend.take_widened() {
            widened.push(report.label.clone());
        }
        reports.push(report);
    };
    for entry in &entries {
        if entry.applies.forward {
            keep(check_forward(backend, entry, cfg));
        }
        if entry.applies.backward {
            keep(check_backward(backend, entry, cfg));
        }
    }
    // A backend whose products run under autocast: each product op it has, exactly, and
    // attention's core (`Backend::precision`).
    let precision = backend.precision();
    if precision.is_autocast() {
        let (mut run, name) = (crate::backend::run_op(backend), backend.name());
        for entry in crate::checks::autocast::product_entries() {
            if backend.supports(entry.name) {
                keep(crate::checks::autocast::check_products(
                    &entry, cfg, precision, &name, &mut *run,
                ));
            }
        }
        if backend.supports("scaledDotProductAttention") {
            keep(crate::checks::autocast::check_attention(
                cfg, precision, &name, &mut *run,
            ));
        }
    }
    keep(check_forward_dag(backend, cfg));
    keep(check_backward_dag(backend, cfg));
    for grads in [false, true] {
        keep(conventions::check_conventions(backend, cfg, grads));
        keep(hard::check_hard(backend, cfg, grads));
    }
    keep(check_grid_backend(backend));
    for entry in &entries {
        keep(check_bad_input(backend, entry, &bad_cfg));
    }
    keep(check_bad_input_dag(backend, &bad_cfg));
    keep(check_oversized(backend));
    // A check none of whose cases the backend could run is skipped, not passed.
    let (reports, none_ran): (Vec<Report>, Vec<Report>) =
        reports.into_iter().partition(|r| !r.is_pending());
    for r in none_ran {
        skipped.push(format!(
            "{}: every case held an op the backend does not implement ({})",
            r.label,
            r.pending.join(", ")
        ));
    }
    widened.retain(|label| reports.iter().any(|r| r.label == *label));
    SuiteReport {
        name: backend.name(),
        reports,
        skipped,
        widened,
    }
}
