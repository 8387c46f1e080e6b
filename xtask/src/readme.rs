//! `cargo xtask readme [--features F] [--list]`: run every command of the README's tour, so a
//! stale command fails CI.
//!
//! The tour is the first ` ```sh ` block after the heading `## A short tour` of README.md: one
//! command a line, `VAR=value` prefixes allowed, comment lines between them. A comment
//! `# ci: skip, <reason>` right above a command skips it (a GPU, a release build of the
//! benchmarks, hours); it is printed as skipped with its reason.
//!
//! The commands run on CI's dev-profile test build instead of building again: `cargo run
//! [--release] -p P [--features F] [--example E] [-- ARGS]` runs P's binary or example E as
//! `cargo build --workspace` built it, and `cargo test -p P [--features F] [--test T]
//! [FILTER] [-- ARGS]` runs P's test executables as `cargo test --workspace --no-run` built
//! them (`--release` is dropped: the commands are the same, the build is the one CI already
//! made). Building with `--workspace` matters: a `-p` selection resolves the dependencies'
//! features differently and compiles them and every crate of ours again (.ci/run). `cargo
//! xtask ...` runs as it stands. Any other command must carry a skip marker.
//!
//! A command whose features (package-qualified: `-p tl-cli --features cuda-emu` is
//! `tl-cli/cuda-emu`) are not all in `--features` is left to the run that names them (CI runs
//! the tour twice: plainly, and in the emulator block with its features); a command without
//! features runs only in the plain run. Commands run in `target/readme-tour/` (the files they
//! write land there), in order; the first non-zero exit fails the run, naming the command.

use std::collections::BTreeSet;
use std::process::{Command, ExitCode};
use std::time::Instant;

use crate::util;

/// The heading the tour's block follows.
const HEADING: &str = "## A short tour";
/// The marker of a command CI does not run.
const SKIP: &str = "# ci: skip";

/// One line of the tour.
#[derive(Debug, PartialEq)]
struct Entry {
    /// The command as written.
    line: String,
    /// `Some(reason)` where a skip marker precedes it.
    skip: Option<String>,
}

/// How a command runs.
#[derive(Debug, PartialEq)]
enum Plan {
    /// `cargo run`: package, example (`None`: the package's binary), arguments.
    Run {
        pkg: String,
        example: Option<String>,
        args: Vec<String>,
    },
    /// `cargo test`: package, test target (`None`: all of the package's), arguments.
    Test {
        pkg: String,
        test: Option<String>,
        args: Vec<String>,
    },
    /// `cargo xtask ...`, as it stands.
    Xtask(Vec<String>),
}

/// A parsed command: its environment, package-qualified features and plan.
#[derive(Debug, PartialEq)]
struct Cmd {
    env: Vec<(String, String)>,
    features: BTreeSet<String>,
    plan: Plan,
}

/// The tour's entries, from the README's text.
fn tour(readme: &str) -> Result<Vec<Entry>, String> {
    let after = readme
        .find(HEADING)
        .map(|i| &readme[i..])
        .ok_or(format!("README.md has no heading {HEADING:?}"))?;
    let start = after
        .find("```sh\n")
        .ok_or(format!("no ```sh block after {HEADING:?}"))?;
    let block = &after[start + "```sh\n".len()..];
    let block = &block[..block
        .find("```")
        .ok_or("the tour's ```sh block is not closed")?];
    let mut entries = Vec::new();
    let mut skip = None;
    for line in block.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix(SKIP) {
            let reason = rest.trim_start_matches([',', ':', ' ']).trim();
            if reason.is_empty() {
                return Err(format!("{line:?}: a skip marker says why"));
            }
            skip = Some(reason.to_owned());
        } else if !line.is_empty() && !line.starts_with('#') {
            entries.push(Entry {
                line: line.to_owned(),
                skip: skip.take(),
            });
        }
    }
    if let Some(reason) = skip {
        return Err(format!(
            "the skip marker {reason:?} ends the tour: no command follows it"
        ));
    }
    if entries.is_empty() {
        return Err("the tour has no commands".into());
    }
    Ok(entries)
}

/// Parse one command of the tour (see the module docs for the forms that run).
fn parse(line: &str) -> Result<Cmd, String> {
    if line.contains(['\'', '"', '|', ';', '&', '$', '`', '\\', '<', '>']) {
        return Err("quotes and shell operators are not run: one plain command a line".into());
    }
    let mut words = line.split_whitespace().peekable();
    let mut env = Vec::new();
    while let Some((k, v)) = words.peek().and_then(|w| w.split_once('=')) {
        env.push((k.to_owned(), v.to_owned()));
        words.next();
    }
    let words: Vec<&str> = words.collect();
    let (sub, rest) = match words.as_slice() {
        ["cargo", "xtask", rest @ ..] => {
            let args = rest.iter().map(|w| w.to_string()).collect();
            return Ok(Cmd {
                env,
                features: BTreeSet::new(),
                plan: Plan::Xtask(args),
            });
        }
        ["cargo", sub @ ("run" | "test"), rest @ ..] => (*sub, rest),
        _ => return Err("not a `cargo run`, `cargo test` or `cargo xtask` command".into()),
    };
    let (mut pkg, mut target, mut feats, mut args) = (None, None, Vec::new(), Vec::new());
    let mut it = rest.iter();
    while let Some(&w) = it.next() {
        let mut value = || {
            it.next()
                .map(|v| v.to_string())
                .ok_or(format!("{w} takes a value"))
        };
        match w {
            "--release" => {}
            "-p" | "--package" => pkg = Some(value()?),
            "-F" | "--features" => feats.push(value()?),
            "--example" if sub == "run" => target = Some(value()?),
            "--test" if sub == "test" => target = Some(value()?),
            "--" => args.extend(it.by_ref().map(|a| a.to_string())),
            w if sub == "test" && !w.starts_with('-') => args.push(w.to_owned()),
            w => return Err(format!("cargo {sub}: option {w} is not understood here")),
        }
    }
    let pkg = pkg.ok_or(format!("cargo {sub} without -p: name the package"))?;
    let features = (feats.iter().flat_map(|f| f.split(',')))
        .filter(|f| !f.is_empty())
        .map(|f| {
            if f.contains('/') {
                f.to_owned()
            } else {
                format!("{pkg}/{f}")
            }
        })
        .collect();
    let plan = match sub {
        "run" => Plan::Run {
            pkg,
            example: target,
            args,
        },
        _ => Plan::Test {
            pkg,
            test: target,
            args,
        },
    };
    Ok(Cmd {
        env,
        features,
        plan,
    })
}

/// The package name of a cargo JSON message's `package_id` (`path+file:///…/tl-cli#0.1.0`,
/// or `…/tests#tl-conformance@0.1.0` where the name is not the directory's).
fn package_name(line: &str) -> Option<String> {
    let id = string_field(line, "package_id")?;
    let (path, frag) = id.rsplit_once('#')?;
    Some(match frag.split_once('@') {
        Some((name, _)) => name.to_owned(),
        None => path.rsplit('/').next()?.to_owned(),
    })
}

/// The first string value of `"key":"…"` in a JSON line (no escapes in the values we read).
fn string_field(line: &str, key: &str) -> Option<String> {
    field(line, &format!("\"{key}\":\""))
}

/// The first string of the array `"key":["…",…]` in a JSON line.
fn first_of(line: &str, key: &str) -> Option<String> {
    field(line, &format!("\"{key}\":[\""))
}

/// The string that follows `pat` in `line`, up to the next `"`.
fn field(line: &str, pat: &str) -> Option<String> {
    let start = line.find(pat)? + pat.len();
    Some(line[start..start + line[start..].find('"')?].to_owned())
}

/// One executable cargo built: package, target name and kind, test harness or not, path.
#[derive(Debug)]
struct Artifact {
    pkg: String,
    name: String,
    kind: String,
    test: bool,
    path: String,
}

/// Build with cargo (`args` after `cargo`, plus `--message-format=json`); the executables.
fn build(args: &[String]) -> Result<Vec<Artifact>, String> {
    println!("==> cargo {}", args.join(" "));
    let out = util::output(
        Command::new(util::cargo())
            .args(args)
            .arg("--message-format=json-render-diagnostics")
            .current_dir(util::root()),
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let path = util::executable(l)?;
            let target = &l[l.find("\"target\":{")?..];
            Some(Artifact {
                pkg: package_name(l)?,
                name: string_field(target, "name")?,
                kind: first_of(target, "kind")?,
                test: util::test_profile(l),
                path,
            })
        })
        .collect())
}

/// `cargo xtask readme [--features F] [--list]`.
pub fn run(args: &[String]) -> ExitCode {
    match run_tour(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask readme: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_tour(args: &[String]) -> Result<(), String> {
    let (mut features, mut list) = (BTreeSet::new(), false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--list" => list = true,
            "--features" => {
                let f = it.next().ok_or("--features takes a value")?;
                features.extend(f.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let root = util::root();
    let readme =
        std::fs::read_to_string(root.join("README.md")).map_err(|e| format!("README.md: {e}"))?;
    let mut cmds = Vec::new();
    let (mut skipped, mut elsewhere) = (0, 0);
    for e in tour(&readme)? {
        if let Some(reason) = &e.skip {
            println!("skipped: {}   ({reason})", e.line);
            skipped += 1;
            continue;
        }
        let cmd = parse(&e.line).map_err(|m| format!("{:?}: {m}", e.line))?;
        let here = if features.is_empty() {
            cmd.features.is_empty()
        } else {
            !cmd.features.is_empty() && cmd.features.is_subset(&features)
        };
        if here {
            cmds.push((e.line, cmd));
        } else {
            let need: Vec<_> = cmd.features.iter().map(String::as_str).collect();
            println!(
                "not in this run: {}   (features: {})",
                e.line,
                need.join(",")
            );
            elsewhere += 1;
        }
    }
    if list {
        cmds.iter().for_each(|(line, _)| println!("runs: {line}"));
        return Ok(());
    }

    // One build of what the commands need, as CI's own steps built it (the module docs).
    let mut common = vec!["--workspace".to_owned()];
    if !features.is_empty() {
        let f: Vec<_> = features.iter().map(String::as_str).collect();
        common.extend(["--features".to_owned(), f.join(",")]);
    }
    let mut artifacts = Vec::new();
    let (mut runs, mut tests) = (Vec::new(), Vec::new());
    let add = |to: &mut Vec<String>, words: &[&str]| {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        if !to.windows(words.len()).any(|w| w == words.as_slice()) {
            to.extend(words);
        }
    };
    for (_, c) in &cmds {
        match &c.plan {
            Plan::Run { example, .. } => match example {
                Some(e) => add(&mut runs, &["--example", e]),
                None => add(&mut runs, &["--bins"]),
            },
            Plan::Test { test, .. } => match test {
                Some(t) => add(&mut tests, &["--test", t]),
                None => add(&mut tests, &["--tests"]),
            },
            Plan::Xtask(_) => {}
        }
    }
    if !runs.is_empty() {
        // Examples need the dev-dependencies, and only with them do the dependencies' features
        // match the test build's: binaries alone would resolve them otherwise.
        if !runs.iter().any(|r| r == "--example") {
            runs.push("--examples".to_owned());
        }
        artifacts.extend(build(
            &[&["build".to_owned()], &common[..], &runs].concat(),
        )?);
    }
    if !tests.is_empty() {
        let test = ["test".to_owned(), "--no-run".to_owned()];
        artifacts.extend(build(&[&test[..], &common[..], &tests].concat())?);
    }

    let dir = root.join("target").join("readme-tour");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let total = cmds.len();
    for (k, (line, cmd)) in cmds.iter().enumerate() {
        println!("\n==> [{}/{total}] {line}", k + 1);
        let start = Instant::now();
        for (exe, args) in executables(cmd, &artifacts)? {
            let mut c = Command::new(&exe);
            c.args(&args)
                .current_dir(&dir)
                .envs(cmd.env.iter().cloned());
            util::status(&mut c)
                .map_err(|e| format!("the README's command `{line}` failed: {e}"))?;
        }
        println!("    ok, {:.1} s", start.elapsed().as_secs_f64());
    }
    println!(
        "\nREADME tour: {total} command(s) ran, {skipped} skipped by a marker, {elsewhere} \
         left to a run with other features"
    );
    Ok(())
}

/// The programs (and their arguments) that carry out `cmd`.
fn executables(cmd: &Cmd, arts: &[Artifact]) -> Result<Vec<(String, Vec<String>)>, String> {
    let pick = |want: &dyn Fn(&Artifact) -> bool| -> Vec<&Artifact> {
        arts.iter().filter(|a| want(a)).collect()
    };
    Ok(match &cmd.plan {
        Plan::Xtask(args) => {
            let mut a = vec!["xtask".to_owned()];
            a.extend(args.iter().cloned());
            vec![(util::cargo(), a)]
        }
        Plan::Run { pkg, example, args } => {
            let found = pick(&|a| {
                a.pkg == *pkg
                    && !a.test
                    && match example {
                        Some(e) => a.kind == "example" && a.name == *e,
                        None => a.kind == "bin",
                    }
            });
            match found.as_slice() {
                [one] => vec![(one.path.clone(), args.clone())],
                [] => return Err(format!("package {pkg} has no such binary or example")),
                _ => return Err(format!("package {pkg} has several binaries: name one")),
            }
        }
        Plan::Test { pkg, test, args } => {
            let found = pick(&|a| {
                a.pkg == *pkg
                    && a.test
                    && test
                        .as_ref()
                        .is_none_or(|t| a.kind == "test" && a.name == *t)
            });
            if found.is_empty() {
                return Err(format!("package {pkg} has no such test target"));
            }
            found
                .iter()
                .map(|a| (a.path.clone(), args.clone()))
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_into_plans_with_qualified_features() {
        let c = parse("TL_SIMD=scalar cargo run --release -p tl-cli -- train --epochs 1").unwrap();
        assert_eq!(c.env, [("TL_SIMD".to_owned(), "scalar".to_owned())]);
        assert!(c.features.is_empty());
        let args = vec!["train".to_owned(), "--epochs".to_owned(), "1".to_owned()];
        assert_eq!(
            c.plan,
            Plan::Run {
                pkg: "tl-cli".into(),
                example: None,
                args
            }
        );
        let c = parse("cargo test -p tl-conformance --features cuda-emu --test conformance x::")
            .unwrap();
        assert_eq!(
            c.features,
            BTreeSet::from(["tl-conformance/cuda-emu".to_owned()])
        );
        assert_eq!(
            c.plan,
            Plan::Test {
                pkg: "tl-conformance".into(),
                test: Some("conformance".into()),
                args: vec!["x::".into()]
            }
        );
        let c = parse("cargo run -p tl-nn --features tl-nn/cuda-emu,a/b --example e").unwrap();
        assert_eq!(c.features.len(), 2);
        assert!(parse("cargo run --release -p tl-cli --bogus").is_err());
        assert!(parse("cargo run -- train").is_err(), "no package");
        assert!(parse("cargo bench -p tl-tape-cpu").is_err());
        assert!(parse("cargo run -p tl-cli -- graph && dot").is_err());
    }

    #[test]
    fn the_tour_reads_skip_markers_and_rejects_a_dangling_one() {
        let md = "x\n## A short tour\n```sh\n# what\ncargo xtask coverage\n# ci: skip, GPU\n\
                  cargo run -p a\n```\n";
        let t = tour(md).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].skip, None);
        assert_eq!(t[1].skip.as_deref(), Some("GPU"));
        assert!(tour("## A short tour\n```sh\ncargo run -p a\n# ci: skip, x\n```\n").is_err());
        assert!(tour("## A short tour\n```sh\n# ci: skip\ncargo run -p a\n```\n").is_err());
        assert!(tour("no tour").is_err());
    }

    #[test]
    fn every_command_of_the_readme_tour_runs_or_says_why_not() {
        let readme = std::fs::read_to_string(util::root().join("README.md")).unwrap();
        for e in tour(&readme).unwrap() {
            if e.skip.is_none() {
                parse(&e.line).unwrap_or_else(|m| panic!("{:?}: {m}", e.line));
            }
        }
    }

    #[test]
    fn the_package_is_read_from_a_cargo_message() {
        let l = r#"{"package_id":"path+file:///w/crates/tl-cli#0.1.0","target":{"kind":["bin"],"name":"tl"}}"#;
        assert_eq!(package_name(l).as_deref(), Some("tl-cli"));
        let l = r#"{"package_id":"path+file:///w/tests#tl-conformance@0.1.0"}"#;
        assert_eq!(package_name(l).as_deref(), Some("tl-conformance"));
        assert_eq!(first_of(l, "kind").as_deref(), None);
        let l = r#"{"target":{"kind":["example"],"name":"custom_op"}}"#;
        assert_eq!(first_of(l, "kind").as_deref(), Some("example"));
        assert_eq!(string_field(l, "name").as_deref(), Some("custom_op"));
    }
}
