//! The case timeout (`tl_conformance::watchdog`): a user op or backend that never returns ends
//! the run with exit status 124 and a message naming the check, instead of hanging it; a check
//! whose cases each finish in time runs on, however long the whole check takes. Each run is a
//! child process (this test binary filtered to [`a_check_in_this_process`], with
//! `TL_CASE_TIMEOUT` set), since the watchdog ends the process it runs in.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tl_conformance::checks::bad_input::check_bad_input;
use tl_conformance::user::{UserEntry, check_backend, check_user_op};
use tl_conformance::watchdog::EXIT_STATUS;
use tl_conformance::{Backend, CpuTape, Measured, RunConfig, TapeProgram, registry, run_check};
use tl_ir::{GraphData, Id, UserOpRef};
use tl_spec::Tensor;

use crate::user_ops::{Bug, Cube};

/// Which check the child runs; unset in the parent.
const CHILD_VAR: &str = "TL_TEST_CASE_TIMEOUT_CHILD";

/// How long the parent waits for a child before it kills it and fails.
const BOUND: Duration = Duration::from_secs(120);

/// Never returning, as an op or backend in an infinite loop or a deadlock does.
pub(crate) fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The CPU f32 tape, but `record` never returns: always (`Always`), or only when given the
/// wrong number of leaves (`OnBadInput`, which only check 7 does).
#[derive(Clone, Copy, PartialEq)]
enum Hanging {
    Always,
    OnBadInput,
}

impl Backend for Hanging {
    type T = f32;
    type Program = TapeProgram<f32>;

    fn name(&self) -> String {
        match self {
            Hanging::Always => "hanging",
            Hanging::OnBadInput => "hanging-on-bad-input",
        }
        .into()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        if *self == Hanging::Always || leaves.len() != graph.leaves().len() {
            hang()
        }
        CpuTape::new().record(graph, leaves, nats)
    }
    fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f32>>, String> {
        CpuTape::new().values(p)
    }
    fn backward_dense(
        &self,
        p: &Self::Program,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        CpuTape::new().backward_dense(p, out, seed)
    }
}

/// The child's body: the check `CHILD_VAR` names (nothing in a plain `--ignored` run).
#[test]
#[ignore = "run by the tests below in a child process, with TL_CASE_TIMEOUT set"]
fn a_check_in_this_process() {
    let cfg = RunConfig {
        cases: 4,
        ..RunConfig::default()
    };
    match std::env::var(CHILD_VAR).as_deref() {
        Ok("op") => {
            let entry = UserEntry::elementwise(UserOpRef::new(Cube(Bug::Hangs)));
            println!("{}", check_user_op(&entry, &cfg));
        }
        Ok("backend") => println!("{}", check_backend(&Hanging::Always, &cfg)),
        Ok("bad-input") => {
            let exp = registry::by_name("exp").expect("the catalogue's exp");
            println!("{}", check_bad_input(&Hanging::OnBadInput, &exp, &cfg));
        }
        Ok("slow") => {
            // Six cases of 0.5 s each: 3 s in all, past the child's 2 s timeout, each in time.
            let cfg = RunConfig { cases: 6, ..cfg };
            let report = run_check("slow".into(), &cfg, 0u32..10, |_| {
                std::thread::sleep(Duration::from_millis(500));
                Ok(Measured::ZERO)
            });
            println!("slow child: {report}");
        }
        _ => {}
    }
}

/// Run the child `which` with `TL_CASE_TIMEOUT=timeout`: its exit status (`None`: killed past
/// [`BOUND`]), how long it ran, and its stdout and stderr.
fn child(which: &str, timeout: &str) -> (Option<ExitStatus>, Duration, String, String) {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::a_check_in_this_process");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name.as_str(), "--exact", "--ignored", "--nocapture"])
        .env(CHILD_VAR, which)
        .env("TL_CASE_TIMEOUT", timeout)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let ran = start.elapsed();
    let stdout = out.join().expect("the stdout reader");
    let stderr = err.join().expect("the stderr reader");
    (status, ran, stdout, stderr)
}

/// The child `which` hangs in the check `label`: the watchdog ends it after the 1 s timeout
/// with [`EXIT_STATUS`] and a message naming the check, the timeout and how to reproduce.
fn assert_ended_by_the_watchdog(which: &str, label: &str) {
    if std::env::var_os(CHILD_VAR).is_some() {
        return; // never recurse
    }
    let (status, ran, stdout, stderr) = child(which, "1");
    let Some(status) = status else {
        panic!(
            "the {which} child still ran after {BOUND:?}: a hang was not caught\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    };
    assert_eq!(
        status.code(),
        Some(EXIT_STATUS),
        "the {which} child exited with {status:?} after {ran:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(ran >= Duration::from_secs(1), "{ran:?}: before the timeout");
    for part in [
        &format!("the check \"{label}\", case 1"),
        "past the case timeout of 1 s (TL_CASE_TIMEOUT)",
        "the op or backend under test did not return",
        "exit status 124",
        "seed: 0x7e570f7ea5",
        "TL_SEED",
    ] {
        assert!(stderr.contains(part), "{part:?} is not in:\n{stderr}");
    }
}

#[test]
fn a_user_op_whose_kernel_never_returns_ends_the_run_naming_the_check() {
    assert_ended_by_the_watchdog("op", "1 fwd cube cpu-f64");
}

#[test]
fn a_backend_that_never_returns_ends_the_run_naming_the_check() {
    // The suite's first check: the forward check of the registry's first op.
    let first = registry::all().into_iter().find(|e| e.applies.forward);
    let label = format!("1 fwd {} hanging", first.expect("a forward entry").name);
    assert_ended_by_the_watchdog("backend", &label);
}

#[test]
fn a_backend_that_hangs_on_bad_input_ends_check_7_naming_it() {
    assert_ended_by_the_watchdog("bad-input", "7 bad input exp hanging-on-bad-input");
}

/// The timeout is per case: a check of six cases of 0.5 s each passes under a 2 s timeout.
#[test]
fn a_check_longer_than_the_timeout_whose_cases_are_not_runs_on() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return; // never recurse
    }
    let (status, ran, stdout, stderr) = child("slow", "2");
    let ok = status.is_some_and(|s| s.success());
    assert!(
        ok && stdout.contains("slow child: slow: 6 case(s)") && ran >= Duration::from_secs(3),
        "the slow child exited with {status:?} after {ran:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
