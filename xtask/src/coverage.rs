//! `cargo xtask coverage`: run `tl-verify --coverage` as `cargo test --workspace` built it.
//!
//! `cargo test --workspace` builds `tl-verify` (tl-conformance's binary, for its integration
//! tests) with the dependency features that tests resolve, dev-dependencies included. A
//! `cargo run`/`cargo build` of it resolves them without the dev-dependencies (either's
//! `use_std`, zerocopy's `simd`, ...), so it compiled the gemm crates, faer and our crates
//! above them a second time: 110–150 s on the 2-core box for a table that runs in 2 s. So this builds
//! with `cargo test --workspace --no-run` (nothing to do after the README's test command) and
//! runs the binary that build names. `--release` does the same with `cargo test --release`.

use std::process::{Command, ExitCode};

use crate::util;

/// Build as `cargo test --workspace [--release]` does, then run `tl-verify --coverage <args>`
/// (output inherited), exit status passed through.
pub fn run(args: &[String]) -> ExitCode {
    let release = args.iter().any(|a| a == "--release");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--release").collect();
    let exe = match built_exe(release) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtask coverage: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = Command::new(&exe);
    cmd.arg("--coverage").args(rest);
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

/// `cargo test --workspace --no-run [--release]`, and the path of the `tl-verify` executable
/// it reports (cargo's JSON messages: the `compiler-artifact` of the bin target `tl-verify`
/// built as a program, not as its own unit-test harness, `"test":true`).
fn built_exe(release: bool) -> Result<String, String> {
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(util::root()).args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    if release {
        cmd.arg("--release");
    }
    let out = util::output(&mut cmd)?;
    out.lines()
        .filter(|l| l.contains(r#""reason":"compiler-artifact""#))
        .filter(|l| l.contains(r#""name":"tl-verify""#) && l.contains(r#""kind":["bin"]"#))
        .filter(|l| !util::test_profile(l))
        .find_map(util::executable)
        .ok_or_else(|| format!("{cmd:?} built no `tl-verify` executable"))
}
