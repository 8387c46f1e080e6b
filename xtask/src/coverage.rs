//! `cargo xtask coverage`: build `tl-verify` and run it with `--coverage`.
//!
//! In the dev profile by default (workspace at `opt-level = 1`, dependencies at 3), the build
//! `cargo test --workspace` has already made: on the 2-core box the whole table then runs in
//! about 3 minutes, where a release build first costs a second compile of every crate and its
//! dependencies (about 10 minutes there). `--release` asks for the release build.

use std::process::{Command, ExitCode};

use crate::util;

/// `cargo run [--release] -p tl-conformance --bin tl-verify -- --coverage <args>`, output
/// streamed (inherited stdio), exit status passed through.
pub fn run(args: &[String]) -> ExitCode {
    let release = args.iter().any(|a| a == "--release");
    let rest = args.iter().filter(|a| *a != "--release");
    let mut cmd = Command::new(util::cargo());
    cmd.arg("run");
    if release {
        cmd.arg("--release");
    }
    cmd.args([
        "--quiet",
        "-p",
        "tl-conformance",
        "--bin",
        "tl-verify",
        "--",
    ])
    .arg("--coverage")
    .args(rest);
    match cmd.status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            let code = status.code().unwrap_or(1);
            ExitCode::from(u8::try_from(code).unwrap_or(1).max(1))
        }
        Err(e) => {
            eprintln!("xtask: could not run {cmd:?}: {e}");
            ExitCode::FAILURE
        }
    }
}
