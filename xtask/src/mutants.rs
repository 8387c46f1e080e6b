//! `cargo xtask mutants`: does the harness catch planted bugs?
//!
//! Each mutant of [`catalogue::MUTANTS`] is one single-point change to a source file. For each,
//! in turn: the file is rewritten with the change, the harness (`tl-conformance`'s `conformance`
//! test binary; with `--features cuda-emu` for the kernels and the sim's reduction order) is
//! built and run, and the file is put back. A harness that fails is a *caught* mutant; one that
//! passes, *missed*; one that does not build, *unviable* (the catalogue needs fixing). The
//! unmutated harness runs first and must pass. A table goes to standard output and to
//! `target/mutants/report.md`; every run's log to `target/mutants/logs/`.
//!
//! The original of the file being mutated is also saved under `target/mutants/in-flight/`
//! before it is touched, so a run that is killed (Ctrl-C) is undone by the next run, which
//! restores the file first and says so.

mod catalogue;

pub use catalogue::MUTANTS;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::util;

/// The part of the project a mutant lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// tl-spec: reference values, VJPs, JVPs.
    Spec,
    /// tl-ir: backprop, JVP, the rule tables.
    Ir,
    /// tl-tape-cpu's kernels.
    Cpu,
    /// tl-tape-cuda's simulation device.
    Sim,
    /// kernels/*.cu (run on the kernel emulator).
    Kernel,
    /// tl-session's optimizers.
    Optim,
    /// tl-nn: layers, labels, the runtime.
    Nn,
    /// tl-session's state between reads: value caches, Nat writes, parameter mirrors.
    Session,
}

impl Area {
    /// Every area, in report order.
    pub const ALL: [Area; 8] = [
        Area::Spec,
        Area::Ir,
        Area::Cpu,
        Area::Sim,
        Area::Kernel,
        Area::Optim,
        Area::Nn,
        Area::Session,
    ];

    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Area::Spec => "spec",
            Area::Ir => "ir",
            Area::Cpu => "cpu",
            Area::Sim => "sim",
            Area::Kernel => "kernel",
            Area::Optim => "optim",
            Area::Nn => "nn",
            Area::Session => "session",
        }
    }
}

/// Which build of the harness judges a mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    /// `cargo test --workspace --test conformance` (what `cargo test --workspace` runs).
    Default,
    /// The same with `--features cuda-emu`: adds the emulated kernels (both reduction modes)
    /// and the device = sim bitwise checks. Needs a C++ compiler.
    Emu,
    /// The checks of tl-nn and of the sessions' state: the conformance modules `nn_layers`
    /// and `session_state` and tl-nn's `activations`, `losses`, `boundaries` and `accumulate`
    /// tests and its data-parallel accumulation test (`cargo test --workspace --test
    /// conformance --test nn -- nn_layers:: activations:: losses:: session_state::
    /// boundaries:: accumulate:: dist::accumulated`).
    Layers,
    /// tl-nn's tests with the emulator's features, where a model steps on the CUDA device's
    /// own code: gradient accumulation and BatchNorm's running statistics there (`cargo test
    /// --workspace --features <.ci/run's emulator list> --test nn -- accumulate::
    /// running_stats::`). Needs a C++ compiler.
    NnEmu,
}

impl Harness {
    /// `--workspace` with a target filter, and the emulator's features as `.ci/run` names them:
    /// cargo unifies dependency features over the selected packages, so this selection reuses
    /// the builds of `cargo test --workspace` and of CI's emulator step instead of compiling
    /// the dependencies again.
    fn cargo_args(self) -> Vec<&'static str> {
        let mut a = vec!["test", "--workspace"];
        match self {
            Harness::Emu => a.extend([
                "--features",
                "tl-tape-cuda/cuda-emu,tl-conformance/cuda-emu,tl-session/cuda-emu,tl-cli/cuda-emu",
            ]),
            Harness::NnEmu => {
                a.extend([
                    "--features",
                    "tl-tape-cuda/cuda-emu,tl-conformance/cuda-emu,tl-session/cuda-emu,tl-cli/cuda-emu,tl-nn/cuda-emu",
                    "--test",
                    "nn",
                ]);
                return a;
            }
            Harness::Default | Harness::Layers => {}
        }
        a.extend(["--test", "conformance"]);
        if self == Harness::Layers {
            a.extend(["--test", "nn"]);
        }
        a
    }

    /// The test binaries' arguments (after `--`): the filters of [`Harness::Layers`] and
    /// [`Harness::NnEmu`].
    fn test_args(self) -> Vec<&'static str> {
        match self {
            Harness::Layers => vec![
                "--",
                // tl-nn's own layers:: tests and the harness's nn_layers::.
                "layers::",
                "cross_attention",
                "rotary",
                "grouped_query",
                "llama",
                "cached_chunks",
                "activations::",
                "losses::",
                "session_state::",
                "boundaries::",
                "accumulate::",
                "dist::accumulated",
            ],
            Harness::NnEmu => vec!["--", "accumulate::", "running_stats::"],
            Harness::Default | Harness::Emu => Vec::new(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Harness::Default => "conformance",
            Harness::Emu => "conformance + cuda-emu",
            Harness::Layers => "nn layers + session state",
            Harness::NnEmu => "nn + cuda-emu",
        }
    }
}

/// One planted bug.
#[derive(Debug, Clone, Copy)]
pub struct Mutant {
    /// A short unique name, `<area>-<what>`.
    pub id: &'static str,
    /// Where it lives.
    pub area: Area,
    /// The file, relative to the workspace root.
    pub file: &'static str,
    /// The exact text replaced; must occur exactly once in `file`.
    pub from: &'static str,
    /// Its replacement.
    pub to: &'static str,
    /// The bug in words.
    pub bug: &'static str,
    /// The harness build that must catch it.
    pub harness: Harness,
}

impl Mutant {
    /// `source` with the mutation applied; an error unless `from` occurs exactly once.
    pub fn apply(&self, source: &str) -> Result<String, String> {
        match source.matches(self.from).count() {
            1 => Ok(source.replacen(self.from, self.to, 1)),
            n => Err(format!(
                "mutant {}: the text to replace occurs {n} times in {} (must be once); update the catalogue (xtask/src/mutants/catalogue.rs)",
                self.id, self.file
            )),
        }
    }
}

/// What became of one mutant.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// The harness failed; the failing tests (first few).
    Caught(Vec<String>),
    /// The harness ran past the time limit (counted as caught, as cargo-mutants does).
    Timeout,
    /// The harness passed.
    Missed,
    /// The mutated source did not build.
    Unviable,
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Caught(_) => "caught",
            Outcome::Timeout => "caught (timeout)",
            Outcome::Missed => "**MISSED**",
            Outcome::Unviable => "unviable",
        }
    }
}

struct Options {
    list: bool,
    check: bool,
    only: Vec<String>,
    cases: Option<String>,
    timeout: Duration,
}

const HELP: &str = "\
usage: cargo xtask mutants [--list] [--check] [--only ID|AREA]... [--cases N] [--timeout S]

  --list        print the planted bugs and exit
  --check       check that every mutant applies to the tree (its text occurs once); no build
  --only X      run the mutants whose id starts with X, or of area X
                (spec, ir, cpu, sim, kernel, optim, nn, session); repeatable
  --cases N     TL_CASES for the harness runs (default: the harness's own)
  --timeout S   seconds one harness run may take before it counts as caught (default 1800)";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        list: false,
        check: false,
        only: Vec::new(),
        cases: None,
        timeout: Duration::from_secs(1800),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n\n{HELP}"))
        };
        match a.as_str() {
            "--list" => o.list = true,
            "--check" => o.check = true,
            "--only" => o.only.push(value("--only")?),
            "--cases" => {
                let v = value("--cases")?;
                v.parse::<u32>()
                    .map_err(|_| format!("--cases: not a count: {v:?}"))?;
                o.cases = Some(v);
            }
            "--timeout" => {
                let v = value("--timeout")?;
                let s = v
                    .parse::<u64>()
                    .map_err(|_| format!("--timeout: not a number of seconds: {v:?}"))?;
                o.timeout = Duration::from_secs(s);
            }
            "-h" | "--help" => return Err(HELP.to_owned()),
            other => return Err(format!("unexpected argument {other:?}\n\n{HELP}")),
        }
    }
    Ok(o)
}

/// The mutants `only` selects (all when empty); an error names a selector that matches none.
fn select(only: &[String]) -> Result<Vec<&'static Mutant>, String> {
    if only.is_empty() {
        return Ok(MUTANTS.iter().collect());
    }
    let picks = |s: &str, m: &Mutant| m.area.name() == s || m.id.starts_with(s);
    if let Some(bad) = only.iter().find(|s| !MUTANTS.iter().any(|m| picks(s, m))) {
        return Err(format!(
            "--only {bad:?} matches no mutant (see cargo xtask mutants --list)"
        ));
    }
    Ok(MUTANTS
        .iter()
        .filter(|m| only.iter().any(|s| picks(s, m)))
        .collect())
}

/// Every mutant's text occurs exactly once in its file under `root`; the errors otherwise.
pub fn check_catalogue(root: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    for m in MUTANTS {
        match fs::read_to_string(root.join(m.file)) {
            Ok(src) => {
                if let Err(e) = m.apply(&src) {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(format!("mutant {}: {}: {e}", m.id, m.file)),
        }
        if m.from == m.to {
            errors.push(format!("mutant {}: `to` equals `from`", m.id));
        }
    }
    errors
}

/// `cargo xtask mutants …`.
pub fn run(args: &[String]) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask mutants: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &[String]) -> Result<ExitCode, String> {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) if e == HELP => {
            println!("{HELP}");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let root = util::root();
    let state = root.join("target/mutants");
    recover(&root, &state)?;
    let picked = select(&o.only)?;
    if o.list {
        for m in &picked {
            println!("{:<36} {:<6} {:<48} {}", m.id, m.area.name(), m.file, m.bug);
        }
        println!("{} mutants", picked.len());
        return Ok(ExitCode::SUCCESS);
    }
    let errors = check_catalogue(&root);
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    if o.check {
        println!(
            "all {} mutants apply to the tree (each text occurs once)",
            MUTANTS.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let logs = state.join("logs");
    fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;

    // The unmutated harness must pass, or nothing below means anything.
    let mut harnesses: Vec<Harness> = picked.iter().map(|m| m.harness).collect();
    // The emulator's build last; equal harnesses adjacent, so each baseline runs once.
    harnesses.sort_by_key(|h| match h {
        Harness::Default => 0,
        Harness::Layers => 1,
        Harness::Emu => 2,
        Harness::NnEmu => 3,
    });
    harnesses.dedup();
    for h in harnesses {
        eprintln!("==> baseline: {} (unmutated)", h.name());
        let log = logs.join(format!("baseline-{}.log", h.name().replace([' ', '+'], "")));
        match harness(h, &o, &log)? {
            Outcome::Missed => {}
            other => {
                return Err(format!(
                    "the unmutated harness ({}) did not pass ({}); see {}",
                    h.name(),
                    other.word(),
                    log.display()
                ));
            }
        }
    }

    let mut rows = Vec::new();
    for (k, m) in picked.iter().enumerate() {
        eprintln!(
            "==> [{}/{}] {} ({}): {}",
            k + 1,
            picked.len(),
            m.id,
            m.file,
            m.bug
        );
        let start = Instant::now();
        let outcome = with_mutant(&root, &state, m, || {
            harness(m.harness, &o, &logs.join(format!("{}.log", m.id)))
        })?;
        let secs = start.elapsed().as_secs();
        eprintln!("    {} in {secs} s", outcome.word());
        rows.push((**m, outcome, secs));
    }
    let report = report(&rows, &o);
    print!("{report}");
    let path = state.join("report.md");
    fs::write(&path, &report).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("report written to {}", path.display());
    let all_caught = rows
        .iter()
        .all(|(_, r, _)| matches!(r, Outcome::Caught(_) | Outcome::Timeout));
    Ok(if all_caught {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Apply `m`, run `f`, and put the file back whatever happens (the saved original under
/// `state/in-flight` goes once the file is restored).
fn with_mutant<R>(
    root: &Path,
    state: &Path,
    m: &Mutant,
    f: impl FnOnce() -> Result<R, String>,
) -> Result<R, String> {
    let path = root.join(m.file);
    let original = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mutated = m.apply(&original)?;
    let flight = state.join("in-flight");
    fs::create_dir_all(&flight).map_err(|e| format!("{}: {e}", flight.display()))?;
    fs::write(flight.join("path"), m.file).map_err(|e| format!("{}: {e}", flight.display()))?;
    fs::write(flight.join("original"), &original)
        .map_err(|e| format!("{}: {e}", flight.display()))?;
    struct Restore<'a> {
        path: &'a Path,
        original: &'a str,
        flight: &'a Path,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            match fs::write(self.path, self.original) {
                Ok(()) => {
                    let _ = fs::remove_dir_all(self.flight);
                }
                Err(e) => eprintln!(
                    "xtask mutants: could not restore {}: {e}; its original is in {}",
                    self.path.display(),
                    self.flight.display()
                ),
            }
        }
    }
    let _restore = Restore {
        path: &path,
        original: &original,
        flight: &flight,
    };
    fs::write(&path, mutated).map_err(|e| format!("{}: {e}", path.display()))?;
    f()
}

/// Put back a file that a killed run left mutated.
fn recover(root: &Path, state: &Path) -> Result<(), String> {
    let flight = state.join("in-flight");
    let (Ok(rel), Ok(original)) = (
        fs::read_to_string(flight.join("path")),
        fs::read_to_string(flight.join("original")),
    ) else {
        return Ok(());
    };
    let path = root.join(rel.trim());
    fs::write(&path, original).map_err(|e| format!("{}: {e}", path.display()))?;
    fs::remove_dir_all(&flight).map_err(|e| format!("{}: {e}", flight.display()))?;
    eprintln!(
        "xtask mutants: restored {} (left mutated by an interrupted run)",
        path.display()
    );
    Ok(())
}

/// Build the harness (a build failure is [`Outcome::Unviable`]), then run it under the time
/// limit: [`Outcome::Missed`] when it passes. Output goes to `log`.
fn harness(h: Harness, o: &Options, log: &Path) -> Result<Outcome, String> {
    let mut build: Vec<&str> = h.cargo_args();
    build.push("--no-run");
    if !cargo(&build, o, log, None)?.0 {
        return Ok(Outcome::Unviable);
    }
    let mut run = h.cargo_args();
    run.extend(h.test_args());
    match cargo(&run, o, log, Some(o.timeout))? {
        (true, _) => Ok(Outcome::Missed),
        (false, true) => Ok(Outcome::Timeout),
        (false, false) => {
            let text = fs::read_to_string(log).unwrap_or_default();
            Ok(Outcome::Caught(failed_tests(&text)))
        }
    }
}

/// Run cargo with `args`, appending its output to `log`; (success, timed out).
fn cargo(
    args: &[&str],
    o: &Options,
    log: &Path,
    limit: Option<Duration>,
) -> Result<(bool, bool), String> {
    use std::os::unix::process::CommandExt as _;
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cmd = Command::new(util::cargo());
    cmd.args(args)
        .current_dir(util::root())
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        // Its own process group, so a timeout kills the test binary too, not only cargo.
        .process_group(0);
    if let Some(c) = &o.cases {
        cmd.env("TL_CASES", c);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not run cargo {args:?}: {e}"))?;
    let start = Instant::now();
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("cargo {args:?}: {e}"))?
        {
            return Ok((status.success(), false));
        }
        if limit.is_some_and(|l| start.elapsed() > l) {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            return Ok((false, true));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The failing tests named in a libtest log (the indented lines after the last `failures:`),
/// at most five.
fn failed_tests(log: &str) -> Vec<String> {
    let Some(at) = log.rfind("\nfailures:\n") else {
        return Vec::new();
    };
    log[at + "\nfailures:\n".len()..]
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.trim().to_owned())
        .take(5)
        .collect()
}

fn report(rows: &[(Mutant, Outcome, u64)], o: &Options) -> String {
    let mut s = String::new();
    let count = |f: fn(&Outcome) -> bool| rows.iter().filter(|(_, r, _)| f(r)).count();
    let caught = count(|r| matches!(r, Outcome::Caught(_) | Outcome::Timeout));
    let missed = count(|r| *r == Outcome::Missed);
    let unviable = count(|r| *r == Outcome::Unviable);
    let _ = writeln!(
        s,
        "| mutant | area | planted bug | harness | result | failing tests (first five) | s |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | ---: |");
    for (m, r, secs) in rows {
        let tests = match r {
            Outcome::Caught(t) if !t.is_empty() => t
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            m.id,
            m.area.name(),
            m.bug,
            m.harness.name(),
            r.word(),
            tests,
            secs
        );
    }
    let _ = writeln!(s);
    for a in Area::ALL {
        let of: Vec<_> = rows.iter().filter(|(m, _, _)| m.area == a).collect();
        if !of.is_empty() {
            let c = of
                .iter()
                .filter(|(_, r, _)| matches!(r, Outcome::Caught(_) | Outcome::Timeout))
                .count();
            let _ = writeln!(s, "- {}: {c} of {} caught", a.name(), of.len());
        }
    }
    let _ = writeln!(
        s,
        "\n{caught} caught, {missed} missed, {unviable} unviable, of {} mutants (TL_CASES = {})",
        rows.len(),
        o.cases.as_deref().unwrap_or("the harness default")
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mutant still applies to the tree: its text occurs exactly once, it changes
    /// something, ids are unique, and the catalogue spans every area with at least 30 bugs.
    #[test]
    fn catalogue_applies_to_the_tree() {
        let errors = check_catalogue(&util::root());
        assert!(errors.is_empty(), "{}", errors.join("\n"));
        let mut ids: Vec<&str> = MUTANTS.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate mutant ids");
        assert!(n >= 30, "only {n} mutants");
        for a in Area::ALL {
            assert!(
                MUTANTS.iter().filter(|m| m.area == a).count() >= 2,
                "area {} has fewer than two mutants",
                a.name()
            );
            assert!(MUTANTS.iter().all(|m| m.id.starts_with(m.area.name())));
        }
    }

    /// The README's tour and docs/verification.md give the catalogue's size: they say what
    /// `cargo xtask mutants --list` lists.
    #[test]
    fn the_docs_give_the_catalogues_size() {
        let root = util::root();
        let n = MUTANTS.len();
        for (file, says) in [
            ("README.md", format!("{n} single-point bugs")),
            ("docs/verification.md", format!("# the {n} bugs")),
        ] {
            let text = fs::read_to_string(root.join(file)).unwrap();
            assert!(text.contains(&says), "{file} should say \"{says}\"");
        }
    }

    #[test]
    fn apply_replaces_exactly_one_occurrence() {
        let m = Mutant {
            id: "t",
            area: Area::Cpu,
            file: "f",
            from: "a + b",
            to: "a - b",
            bug: "",
            harness: Harness::Default,
        };
        assert_eq!(m.apply("x = a + b;").unwrap(), "x = a - b;");
        let twice = m.apply("a + b; a + b").unwrap_err();
        assert!(twice.contains("2 times"), "{twice}");
        assert!(m.apply("nothing").unwrap_err().contains("0 times"));
    }

    #[test]
    fn failing_tests_are_read_from_the_last_failures_list() {
        let log = "running 3 tests\n\nfailures:\n\n---- a::b stdout ----\npanic\n\nfailures:\n    a::b\n    c::d\n\ntest result: FAILED. 1 passed; 2 failed\n";
        assert_eq!(failed_tests(log), vec!["a::b", "c::d"]);
        assert!(failed_tests("test result: ok").is_empty());
    }

    #[test]
    fn selectors_pick_by_area_or_id_prefix_and_unknown_ones_are_errors() {
        let sim = select(&["sim".to_owned()]).unwrap();
        assert!(!sim.is_empty() && sim.iter().all(|m| m.area == Area::Sim));
        let one = select(&["optim-dampening".to_owned()]).unwrap();
        assert_eq!(one.len(), 1);
        assert!(select(&["nope".to_owned()]).is_err());
        assert_eq!(select(&[]).unwrap().len(), MUTANTS.len());
    }

    #[test]
    fn a_mutant_is_undone_even_when_the_run_fails() {
        let dir = std::env::temp_dir().join(format!("tl-mutants-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src")).unwrap();
        fs::write(dir.join("src/a.rs"), "let y = a + b;\n").unwrap();
        let m = Mutant {
            id: "t",
            area: Area::Cpu,
            file: "src/a.rs",
            from: "a + b",
            to: "a - b",
            bug: "",
            harness: Harness::Default,
        };
        let state = dir.join("state");
        let seen = with_mutant(&dir, &state, &m, || {
            let during = fs::read_to_string(dir.join("src/a.rs")).unwrap();
            // A killed run leaves the original saved for the next run to restore.
            assert!(state.join("in-flight/original").exists());
            Err::<(), _>(during)
        })
        .unwrap_err();
        assert_eq!(seen, "let y = a - b;\n");
        assert_eq!(
            fs::read_to_string(dir.join("src/a.rs")).unwrap(),
            "let y = a + b;\n"
        );
        assert!(!state.join("in-flight").exists());
        // An interrupted run: the file is mutated and the original saved; recover puts it back.
        fs::create_dir_all(state.join("in-flight")).unwrap();
        fs::write(state.join("in-flight/path"), "src/a.rs").unwrap();
        fs::write(state.join("in-flight/original"), "let y = a + b;\n").unwrap();
        fs::write(dir.join("src/a.rs"), "let y = a - b;\n").unwrap();
        recover(&dir, &state).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("src/a.rs")).unwrap(),
            "let y = a + b;\n"
        );
        assert!(!state.join("in-flight").exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
