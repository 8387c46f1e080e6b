//! Small helpers shared by the subcommands: the workspace root, running commands.

use std::path::PathBuf;
use std::process::Command;

/// The cargo that invoked us (`$CARGO`), or `cargo`.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// The workspace root (the parent of this crate's directory).
pub fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Run `cmd` with inherited stdio; an error naming the command unless it succeeds.
pub fn status(cmd: &mut Command) -> Result<(), String> {
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} failed ({s})")),
        Err(e) => Err(format!("could not run {cmd:?}: {e}")),
    }
}

/// Run `cmd` and capture its stdout (stderr inherited); an error unless it succeeds.
pub fn output(cmd: &mut Command) -> Result<String, String> {
    match cmd.stderr(std::process::Stdio::inherit()).output() {
        Ok(o) if o.status.success() => {
            String::from_utf8(o.stdout).map_err(|e| format!("{cmd:?}: output is not UTF-8: {e}"))
        }
        Ok(o) => Err(format!("{cmd:?} failed ({})", o.status)),
        Err(e) => Err(format!("could not run {cmd:?}: {e}")),
    }
}
