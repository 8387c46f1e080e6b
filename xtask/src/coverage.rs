//! `cargo xtask coverage`: build `tl-verify` in release and run it with `--coverage`.

use std::process::{Command, ExitCode};

use crate::util;

/// `cargo run --release -p tl-conformance --bin tl-verify -- --coverage <args>`, output streamed
/// (inherited stdio), exit status passed through.
pub fn run(args: &[String]) -> ExitCode {
    let mut cmd = Command::new(util::cargo());
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "tl-conformance",
        "--bin",
        "tl-verify",
        "--",
    ])
    .arg("--coverage")
    .args(args);
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
