//! `cargo xtask <subcommand>`: project automation, std only so it builds in a second.
//!
//! Subcommands:
//! - `coverage [--cases N] [--seed S] ...`: build `tl-verify` in release and run it with
//!   `--coverage`, streaming its op × check table; exits with its status.
//!
//! Planned (see docs/DESIGN): `kernels`, `kernels --check`, `cuda-stub`, `gpu-bundle`.

use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <subcommand> [args]

subcommands:
  coverage [--cases N] [--seed S] [--only OP]...
      run every harness check for every op (cargo run --release -p tl-conformance
      --bin tl-verify -- --coverage ...); fails if any cell fails or an applicable
      cell ran zero cases";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(sub) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<String> = args.collect();
    match sub.as_str() {
        "coverage" => coverage(&rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("xtask: unknown subcommand {other:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `cargo run --release -p tl-conformance --bin tl-verify -- --coverage <args>`, output streamed
/// (inherited stdio), exit status passed through.
fn coverage(args: &[String]) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
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
    run(cmd)
}

/// Run `cmd` with inherited stdio and turn its exit status into ours.
fn run(mut cmd: Command) -> ExitCode {
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
