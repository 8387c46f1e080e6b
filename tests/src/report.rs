//! What a check returns: how many cases ran, the worst error seen, and the shrunk failure if any.

use std::fmt;

use proptest::strategy::Strategy;
use proptest::test_runner::{TestCaseError, TestError};

use crate::RunConfig;
use crate::backend::partial;

/// The checks of the harness (see the crate docs); check 6 has two columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// 1: compiled tape values == IR eval.
    Forward,
    /// 2: tape `backward_dense` == IR `backprop_all`.
    Backward,
    /// 3: spec VJP == central finite differences of the spec value (f64).
    FiniteDiff,
    /// 4: JVP/VJP adjoint identity ⟨J v, w⟩ = ⟨v, Jᵀ w⟩ (f64).
    Adjoint,
    /// 5: the eager session (CPU, CUDA-sim) agrees with the linked session on the same program.
    Session,
    /// 6: the CUDA tape (sim) agrees with the CPU f32 tape, values and gradients.
    CudaVsCpu,
    /// 6: deterministic mode gives bit-identical values and gradients across runs.
    Deterministic,
}

impl Check {
    /// All checks, in table order.
    pub const ALL: [Check; 7] = [
        Check::Forward,
        Check::Backward,
        Check::FiniteDiff,
        Check::Adjoint,
        Check::Session,
        Check::CudaVsCpu,
        Check::Deterministic,
    ];

    /// Short column label (`"1 fwd"`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Check::Forward => "1 fwd",
            Check::Backward => "2 bwd",
            Check::FiniteDiff => "3 fd",
            Check::Adjoint => "4 jvp",
            Check::Session => "5 sess",
            Check::CudaVsCpu => "6 ≈cpu",
            Check::Deterministic => "6 det",
        }
    }
}

/// The outcome of one check over many generated cases.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// What was checked (e.g. `"2 bwd mul cpu-f32"`).
    pub label: String,
    /// Number of cases that passed (equals the configured count when the check passes).
    pub cases: u32,
    /// The largest error (see [`crate::metric`]) over the passing cases.
    pub max_err: f64,
    /// The tolerance the errors were held to (the largest one, if it varies by case).
    pub tol: f64,
    /// The failure, with the shrunk minimal input, if any case failed.
    pub failure: Option<String>,
    /// Ops the backend cannot run: on the CUDA tape, ops with no formula yet ([`PENDING`]); on
    /// a third-party backend, ops it does not support ([`crate::Backend::supports`]). Cases
    /// needing them were not run. Empty for the CPU and spec checks.
    pub pending: Vec<&'static str>,
}

/// How a cell (or a skipped op) whose backend formula does not exist yet is described.
pub const PENDING: &str = "pending (CUDA formula missing)";

impl Report {
    /// Whether no case failed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }

    /// Whether the whole cell is pending: nothing failed, nothing ran, and the backend cannot
    /// run an op the cases need ([`Report::pending`]). Such a cell is listed, never counted as
    /// a pass.
    pub fn is_pending(&self) -> bool {
        self.failure.is_none() && self.cases == 0 && !self.pending.is_empty()
    }

    /// The table cell: `"cases/maxerr"`, `"FAIL"` or `"pending"`; a `*` marks a cell that
    /// passed but skipped the cases needing a pending op (random DAGs).
    pub fn cell(&self) -> String {
        if !self.passed() {
            "FAIL".to_owned()
        } else if self.is_pending() {
            "pending".to_owned()
        } else if self.pending.is_empty() {
            format!("{}/{:.1e}", self.cases, self.max_err)
        } else {
            format!("{}/{:.1e}*", self.cases, self.max_err)
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.cases, &self.failure) {
            // The first case failed: no error or tolerance was measured.
            (0, Some(_)) => write!(f, "{}: no case passed", self.label)?,
            _ => write!(
                f,
                "{}: {} case(s), max err {:.3e} (tol {:.1e})",
                self.label, self.cases, self.max_err, self.tol
            )?,
        }
        if !self.pending.is_empty() {
            write!(f, "; {PENDING}: {}", self.pending.join(", "))?;
        }
        if let Some(fail) = &self.failure {
            write!(f, "\nFAILED: {fail}")?;
        }
        Ok(())
    }
}

/// The outcome of checking one case: its error and the tolerance it was held to, or a failure
/// message (a mismatch beyond tolerance, a backend error, a shape disagreement).
pub type CaseResult = Result<Measured, String>;

/// The error of one passing case and the tolerance it was held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The case's error.
    pub err: f64,
    /// The tolerance applied.
    pub tol: f64,
}

impl Measured {
    /// `Ok` when `err ≤ tol`, else a failure message built by `what`.
    pub fn check(err: f64, tol: f64, what: impl FnOnce() -> String) -> CaseResult {
        if err <= tol {
            Ok(Measured { err, tol })
        } else {
            Err(format!("{} (err {err:.3e} > tol {tol:.1e})", what()))
        }
    }

    /// The worse of two measurements (largest error, largest tolerance).
    pub fn max(self, other: Measured) -> Measured {
        Measured {
            err: self.err.max(other.err),
            tol: self.tol.max(other.tol),
        }
    }

    /// A measurement of nothing (no elements compared).
    pub const ZERO: Measured = Measured { err: 0.0, tol: 0.0 };
}

/// Run `check` once on each of `cases` (fixed cases, each with a name); the report counts the
/// cases run and keeps the first failure, with the case's name.
pub fn run_fixed(
    label: String,
    cases: &[(&str, crate::GraphCase)],
    check: impl Fn(&crate::GraphCase) -> Result<Measured, CaseError>,
) -> Report {
    let mut report = Report {
        label,
        cases: 0,
        max_err: 0.0,
        tol: 0.0,
        failure: None,
        pending: Vec::new(),
    };
    let _check = crate::watchdog::checking(&report.label, None);
    let mut lacking = std::collections::BTreeSet::new();
    for (n, (name, case)) in (1..).zip(cases) {
        crate::watchdog::case_started(n);
        // A case holding an op the backend does not support is not judged (`partial`); a panic
        // (the op, a kernel, the backend) fails the case with its message and location, and a
        // case past the case timeout ends the process, as in `run_check`.
        let guarded = || {
            crate::guard::catch(|| check(case))
                .unwrap_or_else(|p| Err(CaseError::Fail(format!("the check panicked: {p}"))))
        };
        let outcome = match partial::unless_lacking(guarded) {
            Ok(outcome) => outcome,
            Err(lacks) => {
                lacking.extend(lacks);
                continue;
            }
        };
        match outcome {
            Ok(m) => {
                report.cases += 1;
                report.max_err = report.max_err.max(m.err);
                report.tol = report.tol.max(m.tol);
            }
            Err(CaseError::Fail(msg)) => {
                report.failure = Some(format!("case {name}: {msg}"));
                break;
            }
            Err(CaseError::Pending(op)) => {
                report.failure = Some(format!("case {name}: no CUDA formula for {op}"));
                break;
            }
        }
    }
    report.pending = lacking.into_iter().collect();
    report
}

/// Run `check` on `cfg.cases` values of `strategy` with a deterministic, shrinking proptest
/// runner, and summarise. On failure the report holds proptest's shrunk minimal input
/// (printed with its `Debug`, which for the harness' cases shows op, parameters, shapes and
/// every value) and the failure message of that input.
pub fn run_check<S>(
    label: String,
    cfg: &RunConfig,
    strategy: S,
    check: impl Fn(&S::Value) -> CaseResult,
) -> Report
where
    S: Strategy,
{
    drive(label, cfg, strategy, |v| {
        check(v).map_err(TestCaseError::fail)
    })
}

/// The proptest loop behind [`run_check`] and [`run_check_pending`]: a case either passes with
/// a measurement, fails (and is shrunk), or is rejected (skipped; another is drawn). A case
/// during which the backend refused an op it does not support ([`crate::Backend::supports`],
/// [`partial`]) is rejected too, whatever the check made of the refusal, and the op is listed
/// in the report's `pending`; if every case was, the report is pending (no case, no failure).
fn drive<S>(
    label: String,
    cfg: &RunConfig,
    strategy: S,
    check: impl Fn(&S::Value) -> Result<Measured, TestCaseError>,
) -> Report
where
    S: Strategy,
{
    use std::cell::Cell;
    let passed = Cell::new(0u32);
    let worst = Cell::new(Measured::ZERO);
    let failed = Cell::new(false);
    if cfg.cases == 0 {
        return Report {
            label,
            cases: 0,
            max_err: 0.0,
            tol: 0.0,
            failure: Some(
                "the run's case count is 0 (RunConfig::cases, TL_CASES): no case would be checked"
                    .into(),
            ),
            pending: Vec::new(),
        };
    }
    let mut runner = cfg.runner(&label);
    // A panic in a case (the op, a kernel, the backend) fails that case with its message and
    // location, quietly (`crate::guard`), and is shrunk as any failure; one while drawing a
    // case (a generator whose shapes the op's rule refuses) ends the check with it. A case that
    // runs past the case timeout ends the process, naming the check and the case
    // (`crate::watchdog`).
    let _check = crate::watchdog::checking(&label, Some(cfg));
    let case = Cell::new(0u32);
    let lacking = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let run = |value: S::Value| {
        case.set(case.get().saturating_add(1));
        crate::watchdog::case_started(case.get());
        let outcome = partial::unless_lacking(|| {
            crate::guard::catch(|| check(&value))
                .unwrap_or_else(|p| Err(TestCaseError::fail(format!("the check panicked: {p}"))))
        });
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(lacks) => {
                lacking.borrow_mut().extend(lacks);
                return Err(TestCaseError::reject(
                    "the case holds an op the backend does not support",
                ));
            }
        };
        match outcome {
            Ok(m) => {
                if !failed.get() {
                    passed.set(passed.get() + 1);
                    worst.set(worst.get().max(m));
                }
                Ok(())
            }
            Err(e @ TestCaseError::Reject(_)) => Err(e),
            Err(e) => {
                failed.set(true);
                Err(e)
            }
        }
    };
    let failure = match crate::guard::catch(|| runner.run(&strategy, run)) {
        Ok(Ok(())) => None,
        Ok(Err(TestError::Fail(reason, value))) => {
            Some(format!("{reason}\nminimal failing input:\n{value:#?}"))
        }
        Ok(Err(TestError::Abort(reason))) => Some(format!("aborted: {reason}")),
        Err(p) => Some(format!("drawing a case panicked: {p}")),
    };
    let pending: Vec<&'static str> = lacking.into_inner().into_iter().collect();
    // Too many cases held an unsupported op to reach the case count: what ran passed.
    let failure = failure.filter(|f| pending.is_empty() || !f.starts_with("aborted: "));
    let m = worst.get();
    Report {
        label,
        cases: passed.get(),
        max_err: m.err,
        tol: m.tol,
        failure,
        pending,
    }
}

/// Why one case did not pass: a failure message, or an op whose backend formula is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseError {
    /// A mismatch beyond tolerance, a backend error, a shape disagreement.
    Fail(String),
    /// The case needs this op, which the backend cannot run yet ([`PENDING`]).
    Pending(&'static str),
}

/// What a pending case does to its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPending {
    /// The whole cell is pending (per-op cells: the op itself has no formula).
    PendCell,
    /// The case is skipped and another drawn (random DAGs: other cases avoid the op).
    SkipCase,
}

/// [`run_check`] for a backend that may lack some ops' formulas. A case returning
/// [`CaseError::Pending`] either makes the cell pending (`cases` 0, no failure) or is skipped,
/// by `on_pending`; either way [`Report::pending`] lists the ops, with `known` (ops the caller
/// already keeps out of the strategy). A real failure wins over pending. If every case is
/// skipped, the cell is pending too.
pub fn run_check_pending<S>(
    label: String,
    cfg: &RunConfig,
    strategy: S,
    on_pending: OnPending,
    known: &[&'static str],
    check: impl Fn(&S::Value) -> Result<Measured, CaseError>,
) -> Report
where
    S: Strategy,
{
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeSet;
    let pending: RefCell<BTreeSet<&'static str>> = RefCell::new(known.iter().copied().collect());
    let pend_cell = Cell::new(false);
    let mut report = drive(label, cfg, strategy, |v| match check(v) {
        Ok(m) => Ok(m),
        Err(CaseError::Fail(msg)) => Err(TestCaseError::fail(msg)),
        Err(CaseError::Pending(op)) => {
            pending.borrow_mut().insert(op);
            match on_pending {
                OnPending::PendCell => {
                    pend_cell.set(true);
                    Err(TestCaseError::fail(format!("{PENDING}: {op}")))
                }
                OnPending::SkipCase => Err(TestCaseError::reject(format!("{PENDING}: {op}"))),
            }
        }
    });
    let mut all = pending.into_inner();
    all.extend(report.pending.iter().copied());
    report.pending = all.into_iter().collect();
    if let Some(msg) = &report.failure
        && !report.pending.is_empty()
    {
        // The shrunk failure is the pending op itself, or every case was skipped (too many
        // rejects): nothing failed.
        if msg.starts_with(PENDING) || msg.starts_with("aborted: ") {
            report.failure = None;
            if pend_cell.get() {
                report.cases = 0;
            }
        }
    }
    report
}

/// Panic with every failed report's message (shrunk inputs included) unless all of `reports`
/// passed with exactly `cases` cases each. For test files.
pub fn assert_all_passed(reports: &[Report], cases: u32) {
    let bad: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed() || r.cases != cases)
        .map(|r| format!("{r}\n(expected {cases} passing cases)"))
        .collect();
    for r in reports {
        eprintln!("{}: {} cases, max err {:.2e}", r.label, r.cases, r.max_err);
    }
    assert!(
        bad.is_empty(),
        "{} of {} checks failed:\n\n{}",
        bad.len(),
        reports.len(),
        bad.join("\n\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A case during which the backend refused an unsupported op is drawn again, whatever the
    /// check returned (here a failure on odd values); where every case is, the report is
    /// pending: no case, no failure, the op listed.
    #[test]
    fn cases_needing_an_unsupported_op_are_drawn_again() {
        let cfg = RunConfig::default();
        let r = run_check("some".into(), &cfg, 0u32..1000, |&v| {
            if v % 2 == 1 {
                partial::note("tanh");
                return Err(format!("{v}: tanh is not implemented"));
            }
            Ok(Measured::ZERO)
        });
        assert!(r.passed(), "{r}");
        assert_eq!((r.cases, r.pending.as_slice()), (cfg.cases, &["tanh"][..]));
        assert!(!r.is_pending() && r.cell().ends_with('*'));
        let r = run_check("none".into(), &cfg, 0u32..1000, |_| {
            partial::note("conv");
            Ok(Measured::ZERO)
        });
        assert!(r.is_pending(), "{r}");
        assert_eq!((r.cases, r.pending.as_slice()), (0, &["conv"][..]));
        assert_eq!(r.cell(), "pending");
    }

    #[test]
    fn failures_are_shrunk_and_panics_are_failures_not_crashes() {
        let cfg = RunConfig::default();
        let r = run_check("big".into(), &cfg, 0u32..1000, |&v| {
            Measured::check(f64::from(v), 500.0, || format!("{v} is too big"))
        });
        assert_eq!(r.cell(), "FAIL");
        let msg = r.failure.expect("values above 500 fail");
        assert!(
            msg.contains("501 is too big"),
            "shrunk to the boundary: {msg}"
        );

        let r = run_check("panics".into(), &cfg, any::<bool>(), |&b| {
            assert!(!b, "backend exploded");
            Ok(Measured::ZERO)
        });
        assert!(
            r.failure
                .expect("a panic is a failure")
                .contains("backend exploded")
        );

        let ok = run_check("ok".into(), &cfg, 0u32..10, |&v| {
            Measured::check(f64::from(v) * 1e-3, 1.0, String::new)
        });
        assert!(ok.passed() && ok.cases == cfg.cases, "{ok}");
        assert!(ok.max_err < 0.01 && ok.max_err > 0.0, "{ok}");
        assert_eq!(ok.tol, 1.0);
    }
}
