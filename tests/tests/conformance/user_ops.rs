//! The harness as a library (`tl_conformance::user`): user ops through checks 0–7, with teeth
//! (a wrong VJP, a wrong CPU kernel, a wrong fast path past a size, a wrong device
//! implementation and non-finite values each fail the public call, naming the check and the
//! op), and the catalogue's suite against a third-party backend, with teeth too (a skewed `exp`
//! fails check 1; a backend that panics on too few leaves, accepts a leaf or a seed of the
//! wrong shape, is not the same after a refused backward or refuses non-finite leaves fails
//! check 7, bad input).

use proptest::prelude::*;
use tl_conformance::checks::SESSION_CASES;
use tl_conformance::checks::bad_input::{bad_input_case, bad_input_cfg};
use tl_conformance::generate::Size;
use tl_conformance::user::{UserEntry, check_backend, check_user_op};
use tl_conformance::{
    Backend, CpuTape, Domain, GraphCase, OpCase, Report, RunConfig, TapeProgram, Tol,
};
use tl_ir::{GraphData, Id, UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::user::{DeviceImpl, with_device};

/// What a test variant of an op gets wrong (also planted in models: `model::`).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Bug {
    None,
    /// The VJP forgets a factor: `2x²·g` instead of `3x²·g`.
    Vjp,
    /// The CPU kernel's value is off by one part in 10⁴.
    CpuKernel,
    /// The CPU kernel's VJP is off by one part in 10⁴ (the reference VJP is right).
    CpuVjp,
    /// The CPU kernel has a "fast path" for operands of 64 elements or more, which is wrong.
    FastPath,
    /// The value is not finite for negative operands.
    NonFinite,
    /// The CPU kernel panics on a NaN operand (an `expect` on a comparison), where IEEE
    /// arithmetic and the reference compute NaN.
    PanicsOnNan,
    /// The reference value panics on every operand.
    Panics,
    /// The CPU kernel never returns (`case_timeout::`).
    Hangs,
}

/// `x³` elementwise, with an optional planted bug.
pub(crate) struct Cube(pub(crate) Bug);

impl UserOp for Cube {
    fn name(&self) -> &'static str {
        "cube"
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        match self.0 {
            Bug::NonFinite => return Ok(x[0].map(|v| v * v * v * v.sqrt() / v.sqrt())),
            Bug::Panics => panic!("cube: a planted panic"),
            _ => {}
        }
        Ok(x[0].map(|v| v * v * v))
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let c = T::lit(if self.0 == Bug::Vjp { 2.0 } else { 3.0 });
        Ok(vec![Some(x[0].zip_map("cube", g, |v, g| c * v * v * g)?)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("cube", dx[0], |v, d| T::lit(3.0) * v * v * d)
    }
    fn cpu_value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let y = self.value(x)?;
        Ok(match self.0 {
            Bug::CpuKernel => y.map(|v| v * T::lit(1.0001)),
            Bug::FastPath if y.numel() >= 64 => y.map(|v| v * T::lit(1.0001)),
            Bug::Hangs => crate::case_timeout::hang(),
            Bug::PanicsOnNan => y.map(|v| {
                v.partial_cmp(&T::zero()).expect("cube: an ordered operand");
                v
            }),
            _ => y,
        })
    }
    fn cpu_vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        _y: &Tensor<T>,
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let d = self.vjp(x, g)?;
        if self.0 != Bug::CpuVjp {
            return Ok(d);
        }
        Ok(d.into_iter()
            .map(|d| d.map(|d| d.map(|v| v * T::lit(1.0001))))
            .collect())
    }
}

/// `sqrt(a² + b²)`: a binary op with a pole at the origin (operands drawn away from zero).
struct Hypot;

impl UserOp for Hypot {
    fn name(&self) -> &'static str {
        "hypot"
    }
    fn arity(&self) -> usize {
        2
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        if s[0] != s[1] {
            return Err(tl_spec::Error::shape(
                "hypot",
                format!("operands {} and {} differ", s[0], s[1]),
            ));
        }
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("hypot", x[1], |a, b| (a * a + b * b).sqrt())
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let h = self.value(x)?;
        let over = |t: &Tensor<T>| -> tl_spec::Result<Tensor<T>> {
            t.zip_map("hypot", &h, |a, h| a / h)?
                .zip_map("hypot", g, |r, g| r * g)
        };
        Ok(vec![Some(over(x[0])?), Some(over(x[1])?)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let h = self.value(x)?;
        let a = x[0].zip_map("hypot", dx[0], |a, d| a * d)?;
        let b = x[1].zip_map("hypot", dx[1], |b, d| b * d)?;
        a.add(&b)?.zip_map("hypot", &h, |n, h| n / h)
    }
}

/// Log-sum-exp over the last axis (which is removed): a user op that reduces.
struct RowLogSumExp;

impl UserOp for RowLogSumExp {
    fn name(&self) -> &'static str {
        "rowLogSumExp"
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        match s[0].dims().split_last() {
            Some((_, lead)) => Ok(Shape::new(lead)),
            None => Err(tl_spec::Error::shape(
                "rowLogSumExp",
                "a scalar has no last axis",
            )),
        }
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let n = *x[0].shape().dims().last().unwrap_or(&1);
        let out = self.infer_shape(&[x[0].shape()])?;
        let rows: Vec<T> = x[0]
            .data()
            .chunks(n.max(1))
            .map(|r| {
                let m = r.iter().copied().fold(T::neg_infinity(), T::max);
                m + r.iter().map(|&v| (v - m).exp()).sum::<T>().ln()
            })
            .collect();
        Tensor::new(out, rows)
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let n = *x[0].shape().dims().last().unwrap_or(&1);
        let y = self.value(x)?;
        let d: Vec<T> = x[0]
            .data()
            .iter()
            .enumerate()
            .map(|(i, &v)| (v - y.data()[i / n]).exp() * g.data()[i / n])
            .collect();
        Ok(vec![Some(Tensor::new(x[0].shape().clone(), d)?)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let n = *x[0].shape().dims().last().unwrap_or(&1);
        let y = self.value(x)?;
        let mut t = vec![T::zero(); y.numel()];
        for (i, (&v, &d)) in x[0].data().iter().zip(dx[0].data()).enumerate() {
            t[i / n] += (v - y.data()[i / n]).exp() * d;
        }
        Tensor::new(y.shape().clone(), t)
    }
}

/// Shapes of rank 1 to 3 (the last axis is reduced).
fn rows(z: Size) -> BoxedStrategy<Vec<Shape>> {
    tl_conformance::generate::any_shape(z)
        .prop_filter("rank >= 1", |s| s.rank() >= 1)
        .prop_map(|s| vec![s])
        .boxed()
}

/// `cube` with a device implementation composed of the device's primitives: `x·x·x` forward,
/// `3·x·x·g` backward; `wrong` computes `x·x` forward instead.
fn cube_on_device(wrong: bool) -> UserOpRef {
    let imp = DeviceImpl::new(
        move |dev, x, _| {
            let b = x[0].buffer();
            let sq = dev.mul(b, b)?;
            if wrong {
                return Ok(sq);
            }
            let y = dev.mul(sq, b);
            dev.release(sq);
            y
        },
        |dev, x, _, g, needs| {
            if !needs[0] {
                return Ok(vec![None]);
            }
            let b = x[0].buffer();
            let sq = dev.mul(b, b)?;
            let t = dev.mul(sq, g.buffer());
            dev.release(sq);
            let t = t?;
            let d = dev.scale(t, 3.0);
            dev.release(t);
            Ok(vec![Some(d?)])
        },
    );
    with_device(UserOpRef::new(Cube(Bug::None)), imp)
}

fn cfg() -> RunConfig {
    RunConfig::from_env_or(32)
}

/// Whether check 7 also runs on a CUDA device: always on the emulator, with `cuda` where a GPU
/// opens (the GPU bundle's run found the fourth row there), never in a build without CUDA.
fn device_present() -> bool {
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    return tl_tape_cuda::CudaDevice::new().is_ok();
    #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
    false
}

#[test]
fn correct_user_ops_pass_every_check() {
    let cfg = cfg();
    let entries = [
        UserEntry::elementwise(UserOpRef::new(Cube(Bug::None))).ulps(8),
        UserEntry::elementwise(UserOpRef::new(Hypot))
            .domains(Domain::AwayFromZero(0.2, 2.0))
            .ulps(8),
        UserEntry::new(UserOpRef::new(RowLogSumExp), rows),
        UserEntry::elementwise(cube_on_device(false)).ulps(8),
    ];
    for entry in &entries {
        let report = check_user_op(entry, &cfg);
        println!("{report}");
        assert!(report.passed(), "{report}");
        // Checks 0, 1 (f64, f32, sim), 2 (f64, f32, sim), 3, 4, 5 (cpu, sim), 6 (≈cpu, det),
        // 7 (f64, f32, sim).
        assert!(report.reports.len() >= 16, "{report}");
        assert_eq!(
            report
                .reports
                .iter()
                .filter(|r| r.label.starts_with("7 bad input"))
                .count(),
            3 + usize::from(device_present()),
            "{report}"
        );
        // Most cases were valid (check 5 runs at most SESSION_CASES of them; the GPU bundle's
        // TL_CASES=128 found this assertion holding it to 128).
        let planned = |label: &str| {
            if label.starts_with("5 sess") {
                cfg.cases.min(SESSION_CASES)
            } else if label.starts_with("7 bad input") {
                bad_input_cfg(&cfg).cases
            } else {
                cfg.cases
            }
        };
        assert!(
            report
                .reports
                .iter()
                .all(|r| r.cases >= planned(&r.label) / 2),
            "{report}"
        );
        // A build without CUDA says it could not run the op's device implementation.
        let unrun =
            entry.op().has_extensions() && !cfg!(any(feature = "cuda", feature = "cuda-emu"));
        assert_eq!(report.skipped.len(), usize::from(unrun), "{report}");
        if unrun {
            assert!(report.skipped[0].contains("`cuda-emu` feature"), "{report}");
            assert!(
                report.summary().ends_with(" passed, 0 failed, 1 skipped"),
                "{report}"
            );
        } else {
            assert!(report.summary().ends_with(" passed, 0 failed"), "{report}");
        }
        // On the kernel emulator, the op runs on the emulated device against the sim too.
        #[cfg(feature = "cuda-emu")]
        assert!(
            report.reports.iter().any(|r| r.label.contains("cuda-emu")),
            "{report}"
        );
    }
}

/// The labels of the failed checks of `report`.
fn failed(report: &tl_conformance::user::UserReport) -> Vec<String> {
    report.failures().iter().map(|r| r.label.clone()).collect()
}

#[test]
fn a_wrong_reference_vjp_fails_finite_differences_and_the_adjoint_check() {
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::Vjp)));
    let report = check_user_op(&entry, &cfg());
    let bad = failed(&report);
    for check in ["3 fd", "4 jvp"] {
        assert!(
            bad.iter()
                .any(|l| l.starts_with(check) && l.contains("cube")),
            "{check} should fail: {report}"
        );
    }
    // The forward is right: check 1 passes on every backend.
    assert!(!bad.iter().any(|l| l.starts_with("1 fwd")), "{report}");
    // The failure is readable: the check, the op and the shrunk case with its values.
    let text = report.to_string();
    assert!(
        text.contains("minimal failing input") && text.contains("op: cube"),
        "{text}"
    );
    assert!(report.summary().contains(" failed") && !report.passed());
}

#[test]
fn a_wrong_cpu_vjp_kernel_fails_backprop() {
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::CpuVjp))).ulps(8);
    let report = check_user_op(&entry, &cfg());
    let bad = failed(&report);
    assert!(
        bad.iter()
            .any(|l| l.starts_with("2 bwd") && l.contains("cpu-f64")),
        "{report}"
    );
    // The reference is right: checks 3 and 4 pass.
    assert!(
        !bad.iter()
            .any(|l| l.starts_with("3 fd") || l.starts_with("4 jvp")),
        "{report}"
    );
}

#[test]
fn a_wrong_cpu_kernel_fails_the_cpu_forward_and_the_sim_comparison() {
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::CpuKernel))).ulps(8);
    let bad = failed(&check_user_op(&entry, &cfg()));
    assert!(
        bad.iter()
            .any(|l| l.starts_with("1 fwd") && l.contains("cpu-f64")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|l| l.starts_with("6 ≈cpu")), "{bad:?}");
}

#[test]
fn a_cpu_kernel_that_panics_on_nan_fails_check_7_only() {
    // Finite operands everywhere else: only check 7's NaN, +inf and -inf operands reach it.
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::PanicsOnNan))).ulps(8);
    let report = check_user_op(&entry, &cfg());
    let bad = failed(&report);
    assert!(
        !bad.is_empty() && bad.iter().all(|l| l.starts_with("7 bad input cube cpu-")),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("panicked") && text.contains("an ordered operand"),
        "{text}"
    );
}

/// An op that panics fails every check that reaches it with the panic's message and its
/// location (the harness catches it, quietly: `tl_conformance`'s guard), and a check whose
/// first case failed says that no case passed, not an error of 0.
#[test]
fn an_op_that_panics_fails_every_check_naming_the_panic_and_where() {
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::Panics)));
    let report = check_user_op(&entry, &cfg());
    // Every check but the adjoint identity's (4 jvp: the JVP against the VJP, never the value).
    let passed: Vec<&str> = report
        .reports
        .iter()
        .filter(|r| r.passed())
        .map(|r| r.label.as_str())
        .collect();
    assert!(
        report.reports.len() >= 16 && passed == ["4 jvp cube"],
        "{report}"
    );
    for r in report.failures() {
        let text = r.to_string();
        assert!(
            text.contains("cube: a planted panic") && text.contains("user_ops.rs:"),
            "{text}"
        );
        assert!(text.contains("no case passed"), "{text}");
    }
}

/// What is wrong with an entry or the run's configuration fails one `entry` report, naming it,
/// before any check runs: a case count of 0 (which would check nothing and pass), an operand
/// index the op does not have (which would leave the operand on the default domain), a domain
/// that is not one (an empty or non-finite range), a shape generator that draws the wrong
/// number of shapes or shapes the op's rule refuses. And every check refuses a count of 0.
#[test]
fn a_wrong_entry_fails_before_any_check_naming_what_is_wrong() {
    let cube = || UserEntry::elementwise(UserOpRef::new(Cube(Bug::None)));
    let entry_failure = |entry: &UserEntry, cfg: &RunConfig| -> String {
        let report = check_user_op(entry, cfg);
        assert_eq!(report.reports.len(), 1, "{report}");
        assert_eq!(failed(&report), ["entry cube"], "{report}");
        report.reports[0].failure.clone().expect("failed")
    };
    let zero = RunConfig { cases: 0, ..cfg() };
    let e = entry_failure(&cube(), &zero);
    assert!(e.contains("case count is 0"), "{e}");
    let e = entry_failure(&cube().domain(3, Domain::Positive(0.5, 2.0)), &cfg());
    assert!(
        e.contains("domain(3, ") && e.contains("cube has 1 operand(s)"),
        "{e}"
    );
    for d in [
        Domain::Positive(2.0, 1.0),
        Domain::Positive(-1.0, 1.0),
        Domain::AwayFromZero(0.0, 1.0),
        Domain::Any(f64::NAN),
        Domain::Any(-1.0),
    ] {
        for entry in [cube().domains(d), cube().domain(0, d)] {
            let e = entry_failure(&entry, &cfg());
            assert!(e.contains(&format!("{d:?} is not a domain")), "{e}");
        }
    }
    let two = UserEntry::new(UserOpRef::new(Cube(Bug::None)), |_| {
        Just(vec![Shape::new(&[2]); 2]).boxed()
    });
    let e = entry_failure(&two, &cfg());
    assert!(e.contains("2 operand shape(s), where cube takes 1"), "{e}");
    // The rule's own refusal, quoted: rowLogSumExp takes no scalar.
    let scalars = UserEntry::new(UserOpRef::new(RowLogSumExp), |_| {
        Just(vec![Shape::scalar()]).boxed()
    });
    let report = check_user_op(&scalars, &cfg());
    let text = report.to_string();
    assert!(
        failed(&report) == ["entry rowLogSumExp"] && text.contains("a scalar has no last axis"),
        "{text}"
    );
    // Any check with a count of 0.
    let r = tl_conformance::run_check("any".into(), &zero, Just(1), |_| {
        Ok(tl_conformance::Measured::ZERO)
    });
    assert!(
        !r.passed() && r.to_string().contains("case count is 0"),
        "{r}"
    );
}

#[test]
fn a_wrong_fast_path_past_a_size_fails_the_harness() {
    // Only operands of 64 elements or more take the broken path: the entry's large cases
    // (dims up to 40) reach it.
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::FastPath))).ulps(8);
    let report = check_user_op(&entry, &cfg());
    let bad = failed(&report);
    assert!(bad.iter().any(|l| l.starts_with("1 fwd")), "{report}");
}

#[test]
fn a_wrong_device_implementation_fails_the_sim_checks() {
    let entry = UserEntry::elementwise(cube_on_device(true)).ulps(8);
    let bad = failed(&check_user_op(&entry, &cfg()));
    assert!(
        bad.iter()
            .any(|l| l.starts_with("1 fwd") && l.contains("sim")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|l| l.starts_with("6 ≈cpu")), "{bad:?}");
    // The CPU tape runs the op's own kernel, which is right.
    assert!(!bad.iter().any(|l| l.contains("cpu-f64")), "{bad:?}");
}

#[test]
fn non_finite_values_on_the_declared_domain_fail_check_0() {
    let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::NonFinite)));
    let report = check_user_op(&entry, &cfg());
    let zero = report
        .reports
        .iter()
        .find(|r| r.label.starts_with("0 finite"))
        .expect("check 0 runs");
    let msg = zero.failure.as_deref().unwrap_or_default();
    assert!(msg.contains("cube") && msg.contains("NaN"), "{report}");
    // Allowed, check 0 does not run.
    let allowed = check_user_op(
        &UserEntry::elementwise(UserOpRef::new(Cube(Bug::None))).allow_non_finite(),
        &RunConfig { cases: 2, ..cfg() },
    );
    assert!(
        !allowed
            .reports
            .iter()
            .any(|r| r.label.starts_with("0 finite"))
    );
}

/// The CPU f32 tape as a "third-party" backend: every call delegated, and, when `skew`, every
/// value of `exp` nodes off by one part in 10⁴. A graph holding one of `lacks` is an error
/// naming the op, as a backend under construction's would be; `declares` says whether it lists
/// them in `Backend::supports`.
struct ThirdParty {
    inner: CpuTape<f32>,
    skew: bool,
    lacks: &'static [&'static str],
    declares: bool,
}

impl ThirdParty {
    /// Every op implemented; `exp` off when `skew`.
    fn new(skew: bool) -> Self {
        ThirdParty {
            inner: CpuTape::new(),
            skew,
            lacks: &[],
            declares: false,
        }
    }

    /// Right where it computes, lacking `lacks`, declared (or not) in `supports`.
    fn unfinished(lacks: &'static [&'static str], declares: bool) -> Self {
        ThirdParty {
            lacks,
            declares,
            ..ThirdParty::new(false)
        }
    }
}

impl Backend for ThirdParty {
    type T = f32;
    type Program = (TapeProgram<f32>, GraphData);

    fn name(&self) -> String {
        match (self.skew, self.lacks.is_empty()) {
            (true, _) => "third-party-skewed",
            (false, true) => "third-party",
            (false, false) => "unfinished",
        }
        .into()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        for node in graph.nodes() {
            let op = node.op().name();
            if self.lacks.contains(&op) {
                return Err(format!("{op}: not implemented on this backend yet"));
            }
        }
        Ok((self.inner.record(graph, leaves, nats)?, graph.clone()))
    }
    fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f32>>, String> {
        let mut v = self.inner.values(&p.0)?;
        if self.skew {
            let first = p.1.leaves().len();
            for (k, node) in p.1.nodes().iter().enumerate() {
                if *node.op() == tl_ir::Op::Exp {
                    v[first + k] = v[first + k].map(|x| x * 1.0001);
                }
            }
        }
        Ok(v)
    }
    fn backward_dense(
        &self,
        p: &Self::Program,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.inner.backward_dense(&p.0, out, seed)
    }
    fn supports(&self, op: &str) -> bool {
        !(self.declares && self.lacks.contains(&op))
    }
}

/// A case count of 0 checks nothing: every drawn cell of the suite fails naming it, check 7's
/// included (its eighth of the cases was rounded up to 1); the fixed oversized graphs still run.
#[test]
fn the_catalogue_suite_refuses_zero_cases_in_every_drawn_cell() {
    let cfg = RunConfig {
        cases: 0,
        ..RunConfig::default()
    };
    assert_eq!(bad_input_cfg(&cfg).cases, 0);
    let report = check_backend(&CpuTape::<f64>::new(), &cfg);
    assert!(report.reports.len() > 100, "{}", report.reports.len());
    for r in &report.reports {
        let fixed = r.label.contains("oversized") || r.label.starts_with("grid ");
        assert_eq!(r.passed(), fixed, "{r}");
    }
}

#[test]
fn the_catalogue_suite_runs_against_a_third_party_backend() {
    let cfg = RunConfig::from_env_or(4);
    let good = check_backend(&ThirdParty::new(false), &cfg);
    assert!(good.passed(), "{good}");
    assert!(good.reports.len() > 100, "{}", good.reports.len());
    assert!(good.summary().ends_with(" passed, 0 failed"), "{good}");

    let bad = check_backend(&ThirdParty::new(true), &cfg);
    let labels: Vec<&str> = bad.failures().iter().map(|r| r.label.as_str()).collect();
    assert!(
        labels
            .iter()
            .any(|l| l.contains("exp") && l.contains("third-party-skewed")),
        "{labels:?}"
    );
}

/// A backend that implements part of the catalogue and says so (`Backend::supports`) passes
/// the suite on what it has: the ops it lacks are listed as skipped (no cells), the random
/// DAGs and other mixed checks draw again every case holding one and list the ops, and a check
/// none of whose cases it can run (the oversized graphs, every one of whose ops it lacks) is
/// skipped, not passed. The same backend that does not say so fails those cells, and an op it
/// does list stays held to every check.
#[test]
fn a_backend_that_implements_part_of_the_catalogue_is_checked_on_that_part() {
    let cfg = RunConfig::from_env_or(4);
    const LACKS: &[&str] = &[
        "tanh",
        "conv",
        "randUniform",
        "bernoulliMask",
        "broadcastTo",
        "matmul",
        "reduceSum",
        "gatherRowsNatVec",
        "maxPool",
        "avgPool",
    ];
    let partial = |declares| ThirdParty::unfinished(LACKS, declares);
    let report = check_backend(&partial(true), &cfg);
    assert!(report.passed(), "{report}");
    for op in LACKS {
        let line = format!("{op}: checks 1, 2 and 7 (backend unfinished does not implement it");
        assert!(
            report.skipped.iter().any(|s| s.starts_with(&line)),
            "{report}"
        );
        assert!(
            !report
                .reports
                .iter()
                .any(|r| r.label.ends_with(&format!(" {op} unfinished"))),
            "{report}"
        );
    }
    let dag = report
        .reports
        .iter()
        .find(|r| r.label == "1 fwd dag unfinished")
        .expect("the DAG check runs");
    // Which lacked ops the DAGs drew depends on the seed; that some were, and only those, not.
    assert!(
        dag.cases > 0 && !dag.pending.is_empty() && dag.pending.iter().all(|op| LACKS.contains(op)),
        "{dag:?}"
    );
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.starts_with("7 bad input oversized unfinished: every case held an op")),
        "{report}"
    );
    assert!(!report.reports.iter().any(|r| r.label.contains("oversized")));
    let text = report.to_string();
    assert!(text.contains("skip tanh: checks 1, 2 and 7"), "{text}");
    assert!(report.summary().contains(" skipped"), "{text}");

    // Not declared: the cells of what it lacks fail, naming the op.
    let undeclared = check_backend(&partial(false), &cfg);
    let failed: Vec<&str> = undeclared
        .failures()
        .iter()
        .map(|r| r.label.as_str())
        .collect();
    for label in ["1 fwd tanh unfinished", "1 fwd dag unfinished"] {
        assert!(failed.contains(&label), "{failed:?}");
    }
}

/// What a careless third-party backend gets wrong on bad input (each delegates to the CPU f32
/// tape otherwise, so checks 1 and 2 pass).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Careless {
    /// Reads the graph's leaf count of values without checking how many it was given: too few
    /// panics (an index out of bounds), extra ones are ignored.
    Count,
    /// Takes any leaf value of the right element count, reshaped to the graph's shape: a
    /// transposed leaf or one of another rank is accepted.
    Numel,
    /// Takes any seed of the output's element count, reshaped.
    Seed,
    /// A refused `backward_dense` leaves its scratch behind (here: the forward values), and the
    /// next one adds it to the gradients.
    Sticky,
    /// Refuses NaN and infinities in leaf values (which are not bad input: IEEE arithmetic).
    NonFinite,
    /// Asserts (panics) where a value is too large to allocate, instead of returning an error.
    Huge,
    /// Panics on any value of the grid cases' size or more (a bug past a size threshold).
    Large,
}

struct CarelessBackend(Careless);

/// The careless backend's program: the tape, and the scratch a refused backward left.
struct CarelessProgram {
    tape: TapeProgram<f32>,
    scratch: std::cell::RefCell<Option<Vec<Tensor<f32>>>>,
}

impl Backend for CarelessBackend {
    type T = f32;
    type Program = CarelessProgram;

    fn name(&self) -> String {
        format!("careless-{:?}", self.0).to_lowercase()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        if self.0 == Careless::Huge {
            for id in 0..graph.len() {
                let n = graph.shape(id).map_or(0, Shape::numel);
                assert!(n < 1 << 30, "{n} elements do not fit in memory");
            }
        }
        if self.0 == Careless::Large {
            for id in 0..graph.len() {
                let n = graph.shape(id).map_or(0, Shape::numel);
                assert!(
                    n < tl_conformance::checks::grid::GRID_N,
                    "{n} elements: a bug past a size"
                );
            }
        }
        let leaves: Vec<Tensor<f32>> = match self.0 {
            Careless::Count => (0..graph.num_leaves()).map(|k| leaves[k].clone()).collect(),
            Careless::Numel => leaves
                .iter()
                .enumerate()
                .map(|(k, v)| match graph.leaves().get(k) {
                    Some(l) if l.shape.numel() == v.shape().numel() => {
                        Tensor::new(l.shape.clone(), v.data().to_vec()).map_err(|e| e.to_string())
                    }
                    _ => Ok(v.clone()),
                })
                .collect::<Result<_, _>>()?,
            Careless::NonFinite
                if leaves
                    .iter()
                    .any(|t| t.data().iter().any(|v| !v.is_finite())) =>
            {
                return Err("a leaf holds a non-finite value".into());
            }
            _ => leaves.to_vec(),
        };
        Ok(CarelessProgram {
            tape: TapeProgram::replay(graph, &leaves, nats)?,
            scratch: Default::default(),
        })
    }
    fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f32>>, String> {
        p.tape.values()
    }
    fn backward_dense(
        &self,
        p: &Self::Program,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        let want = p.tape.values()?.get(out).map(|v| v.shape().clone());
        let seed = match want {
            Some(s) if self.0 == Careless::Seed && s.numel() == seed.shape().numel() => {
                Tensor::new(s, seed.data().to_vec()).map_err(|e| e.to_string())?
            }
            _ => seed.clone(),
        };
        let grads = p.tape.backward_dense(out, &seed);
        if self.0 != Careless::Sticky {
            return grads;
        }
        let Ok(grads) = grads else {
            *p.scratch.borrow_mut() = Some(p.tape.values()?);
            return grads;
        };
        match p.scratch.borrow_mut().take() {
            Some(left) => grads
                .iter()
                .zip(&left)
                .map(|(g, l)| g.add(l).map_err(|e| e.to_string()))
                .collect(),
            None => Ok(grads),
        }
    }
}

/// The failure messages of check 7 for `careless` under `check_backend`; every other check
/// passes, but those whose label contains one of `also`.
fn check_7_failures(careless: Careless, also: &[&str]) -> Vec<String> {
    let report = check_backend(&CarelessBackend(careless), &RunConfig::from_env_or(4));
    let (sevens, others): (Vec<&Report>, Vec<&Report>) = report
        .failures()
        .into_iter()
        .partition(|r| r.label.starts_with("7 bad input "));
    assert!(
        others
            .iter()
            .all(|r| also.iter().any(|a| r.label.contains(a))),
        "only check 7 fails: {report}"
    );
    let ran = report
        .reports
        .iter()
        .filter(|r| r.label.starts_with("7 bad input "))
        .count();
    assert!(ran > 70, "{ran} check-7 reports");
    sevens
        .iter()
        .map(|r| r.failure.clone().unwrap_or_default())
        .collect()
}

#[test]
fn check_backend_fails_a_backend_that_panics_on_too_few_leaves() {
    let failures = check_7_failures(Careless::Count, &[]);
    // Every op with an operand panics; the operand-free draws (constant, randUniform,
    // bernoulliMask) accept the extra leaf.
    assert!(failures.len() > 60, "{}", failures.len());
    assert!(
        failures
            .iter()
            .any(|f| f.contains("leaf value(s) for a graph of")
                && f.contains("the backend panicked: \"index out of bounds")
                && f.contains("\" at tests/tests/conformance/user_ops.rs:")),
        "{failures:#?}"
    );
    assert!(
        failures.iter().any(
            |f| f.contains("record with 1 leaf value(s) for a graph of 0 leaves")
                && f.contains("accepted it (returned Ok)")
        ),
        "{failures:#?}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_accepts_a_leaf_of_the_wrong_shape() {
    let failures = check_7_failures(Careless::Numel, &[]);
    assert!(failures.len() > 60, "{}", failures.len());
    // Shrunk to scalars and dims of 1, where a leading 1 is the wrong shape left.
    assert!(
        failures.iter().any(|f| f.contains("(one rank more)")
            && f.contains("the backend accepted it (returned Ok)")),
        "{failures:#?}"
    );
    // A (2, 3) leaf given as (3, 2).
    let x = Tensor::from_fn([2, 3], |i| i as f64);
    let case = OpCase::new(tl_ir::Op::Transpose2d, vec![x]);
    let case = GraphCase::from_op(&case, &[true], Tensor::ones([3, 2]));
    let err = bad_input_case(&CarelessBackend(Careless::Numel), &case, &Tol::DEFAULT)
        .expect_err("the transposed leaf is accepted");
    assert!(
        err.contains("leaf %0 of shape [3, 2] (transposed) where the graph has [2, 3]")
            && err.contains("accepted it"),
        "{err}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_accepts_a_seed_of_the_wrong_shape() {
    let failures = check_7_failures(Careless::Seed, &[]);
    assert!(failures.len() > 60, "{}", failures.len());
    assert!(
        failures.iter().all(|f| f.contains("with a seed of shape")
            && (f.contains("(one rank more)") || f.contains("(transposed)"))
            && f.contains("the backend accepted it (returned Ok)")),
        "{failures:#?}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_is_not_the_same_after_a_refused_backward() {
    let failures = check_7_failures(Careless::Sticky, &[]);
    assert!(failures.len() > 50, "{}", failures.len());
    assert!(
        failures.iter().any(|f| f
            .contains("after the refused backward_dense calls, gradient of %")
            && f.contains("differs")),
        "{failures:#?}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_refuses_non_finite_leaves() {
    // The conventions' NaN cases fail checks 1 and 2 too.
    let failures = check_7_failures(Careless::NonFinite, &["conventions"]);
    assert!(failures.len() > 60, "{}", failures.len());
    assert!(
        failures
            .iter()
            .all(|f| f.contains("NaN, +inf and -inf in every leaf: refused")
                && f.contains("non-finite values are not bad input")),
        "{failures:#?}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_panics_on_an_output_too_large_to_allocate() {
    let failures = check_7_failures(Careless::Huge, &[]);
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert!(
        failures[0].contains("case randUniform [1e14]: record and values")
            && failures[0].contains("the backend panicked: \"100000000000000 elements do not fit")
            && failures[0].contains("bad input must be an error, never a panic"),
        "{failures:#?}"
    );
}

#[test]
fn check_backend_fails_a_backend_that_panics_on_a_fixed_case_and_goes_on() {
    // The grid cases (fixed, run once each) reach the panic: their report fails with the
    // panic's message, and check_backend itself returns with every other check run.
    let report = check_backend(
        &CarelessBackend(Careless::Large),
        &RunConfig::from_env_or(2),
    );
    let failures = report.failures();
    let grid = failures
        .iter()
        .find(|r| r.label == "grid careless-large")
        .unwrap_or_else(|| panic!("the grid report fails: {report}"));
    let msg = grid.failure.clone().unwrap_or_default();
    assert!(
        msg.contains("the check panicked") && msg.contains("a bug past a size"),
        "{msg}"
    );
    assert!(report.reports.len() > 100, "every check ran: {report}");
}

/// An op whose faces return the wrong shapes: the value (`Value`), the VJP's cotangent
/// (`Vjp`), the JVP (`Jvp`), or the CPU kernel's value (`Kernel`).
#[derive(Clone, Copy, PartialEq)]
enum WrongShape {
    Value,
    Vjp,
    Jvp,
    Kernel,
}

struct Misshapen(WrongShape);

impl UserOp for Misshapen {
    fn name(&self) -> &'static str {
        "misshapen"
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        if self.0 == WrongShape::Value {
            return Ok(Tensor::zeros([x[0].numel() + 1]));
        }
        Ok(x[0].clone())
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        if self.0 == WrongShape::Vjp {
            return Ok(vec![Some(Tensor::zeros([x[0].numel() + 1]))]);
        }
        Ok(vec![Some(g.clone())])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        if self.0 == WrongShape::Jvp {
            return Ok(Tensor::zeros([x[0].numel() + 1]));
        }
        Ok(dx[0].clone())
    }
    fn cpu_value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        if self.0 == WrongShape::Kernel {
            return Ok(Tensor::zeros([x[0].numel() + 1]));
        }
        self.value(x)
    }
}

#[test]
fn a_face_of_the_wrong_shape_is_an_error_naming_the_op_and_the_face() {
    use tl_ir::{GraphBuilder, Op};
    let x = Tensor::<f64>::new([2], vec![0.5, -1.0]).unwrap();
    let graph = |w: WrongShape| {
        let mut g = GraphBuilder::new();
        let a = g.leaf([2], Some("x")).unwrap();
        let y = g.apply(Op::user(Misshapen(w)), &[a]).unwrap();
        (g.finish(), y)
    };
    let (g, _) = graph(WrongShape::Value);
    let e = g
        .eval(std::slice::from_ref(&x), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("misshapen") && e.contains("reference value") && e.contains("[3]"),
        "{e}"
    );

    let (g, y) = graph(WrongShape::Vjp);
    let seed = Tensor::<f64>::ones([2]);
    let e = g
        .backprop_all(std::slice::from_ref(&x), &[], y, &seed)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("misshapen") && e.contains("reference VJP") && e.contains("[3]"),
        "{e}"
    );

    let (g, _) = graph(WrongShape::Jvp);
    let e = g
        .jvp(std::slice::from_ref(&x), &[], std::slice::from_ref(&x))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("misshapen") && e.contains("reference JVP"),
        "{e}"
    );

    // The CPU tape checks its kernel against the shape rule; the tape stays usable.
    let mut tape = tl_tape_cpu::Tape::<f64>::new();
    let a = tape.leaf(x.clone(), None, true);
    let e = tape
        .apply(&Op::user(Misshapen(WrongShape::Kernel)), &[a])
        .unwrap_err()
        .to_string();
    assert!(e.contains("misshapen") && e.contains("CPU kernel"), "{e}");
    assert_eq!(tape.len(), 1, "nothing recorded");
    let y = tape.apply(&Op::Exp, &[a]).unwrap();
    assert_eq!(tape.get(y).unwrap().data()[0], 0.5f64.exp());
}

/// `2x` on the kernels of tl-tape-cuda's test module (`tests/user_kernels/*.cu`, built for the
/// emulator by its build.rs as a user's crate builds its own): the public harness compares the
/// kernels on the emulated device with the sim twin (the reference in f32), in ulps.
#[cfg(feature = "cuda-emu")]
mod kernels {
    use super::*;
    use tl_tape_cuda::user::{ElementwiseKernels, KernelModule};

    struct Twice;

    impl UserOp for Twice {
        fn name(&self) -> &'static str {
            "twice"
        }
        fn arity(&self) -> usize {
            1
        }
        fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
            Ok(s[0].clone())
        }
        fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
            Ok(x[0].map(|v| T::lit(2.0) * v))
        }
        fn vjp<T: Scalar>(
            &self,
            _x: &[&Tensor<T>],
            g: &Tensor<T>,
        ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
            Ok(vec![Some(g.map(|v| T::lit(2.0) * v))])
        }
        fn jvp<T: Scalar>(
            &self,
            _x: &[&Tensor<T>],
            dx: &[&Tensor<T>],
        ) -> tl_spec::Result<Tensor<T>> {
            Ok(dx[0].map(|v| T::lit(2.0) * v))
        }
    }

    fn twice(fwd: &'static str, bwd: &'static str) -> UserEntry {
        let module = KernelModule::new("tl_test_user_kernels")
            .emu(tl_tape_cuda::emu_kernels!(tl_test_user_kernels));
        let imp = ElementwiseKernels::new(module, fwd, bwd)
            .param(2.0)
            .device_impl();
        UserEntry::elementwise(with_device(UserOpRef::new(Twice), imp)).ulps(1)
    }

    #[test]
    fn a_users_kernels_pass_the_public_harness_on_the_emulator_and_wrong_ones_fail_it() {
        let good = check_user_op(&twice("tl_test_scale_fwd", "tl_test_scale_bwd"), &cfg());
        assert!(good.passed(), "{good}");
        assert!(
            good.reports
                .iter()
                .any(|r| r.label.contains("ulps") && r.label.contains("cuda-emu")),
            "{good}"
        );
        // A forward that writes only 100 elements (large cases keep NaN past them) and a
        // backward a few ulps off: the emulated device's rows fail, and only they.
        let bad = check_user_op(
            &twice("tl_test_scale_wrong_fwd", "tl_test_scale_wrong_bwd"),
            &cfg(),
        );
        let failed = failed(&bad);
        assert_eq!(failed.len(), 2, "{bad}");
        assert!(failed.iter().all(|f| f.contains("cuda-emu")), "{bad}");
    }

    /// A kernel missing a `__syncthreads()` is right when a block's threads run in order: the
    /// harness runs the emulator in both orders, and the reversed row fails, alone.
    #[test]
    fn a_kernel_missing_a_barrier_fails_the_reversed_schedule() {
        let racy = check_user_op(
            &twice("tl_test_scale_racy_fwd", "tl_test_scale_bwd"),
            &cfg(),
        );
        let failed = failed(&racy);
        assert_eq!(failed.len(), 1, "{racy}");
        assert!(failed[0].contains("threads reversed"), "{racy}");
    }
}
