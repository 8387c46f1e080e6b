//! Running the built `tl` binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Run `tl args…` and return its output.
pub fn tl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tl"))
        .args(args)
        .output()
        .expect("the tl binary runs")
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert `o` failed with exactly one stderr line, `error: …`, containing every `needle`.
pub fn assert_one_line_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got {lines:?}");
    assert!(lines[0].starts_with("error: "), "{:?}", lines[0]);
    for n in needles {
        assert!(
            lines[0].contains(n),
            "{:?} does not mention {n:?}",
            lines[0]
        );
    }
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tl-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
