//! Small helpers shared by the subcommands: the workspace root, running commands, reading
//! cargo's JSON messages.

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

/// The `"executable"` path of one of cargo's JSON messages (`--message-format=json`), if it
/// names one (cargo escapes `"` and `\` in it).
pub fn executable(line: &str) -> Option<String> {
    let key = r#""executable":""#;
    let start = line.find(key)? + key.len();
    let mut path = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(path),
            '\\' => path.push(chars.next()?),
            c => path.push(c),
        }
    }
    None
}

/// Whether an artifact message was built as a test harness (`"profile":{…,"test":true}`): its
/// target's own `"test":true` only says the target can be tested, and a binary an integration
/// test needs (`tl-verify`) has it too.
pub fn test_profile(line: &str) -> bool {
    let key = "\"profile\":{";
    line.find(key).is_some_and(|i| {
        let rest = &line[i + key.len()..];
        rest[..rest.find('}').unwrap_or(rest.len())].contains("\"test\":true")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_and_the_profile_are_read_from_a_cargo_message() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"tl-verify","test":true},"profile":{"opt_level":"1","test":false},"executable":"/t/debug/tl-verify","fresh":true}"#;
        assert_eq!(executable(line).as_deref(), Some("/t/debug/tl-verify"));
        assert!(!test_profile(line));
        assert!(test_profile(
            &line.replace(r#""test":false"#, r#""test":true"#)
        ));
        let escaped = r#"{"executable":"/a \"b\"\\c","fresh":true}"#;
        assert_eq!(executable(escaped).as_deref(), Some(r#"/a "b"\c"#));
        assert_eq!(executable(r#"{"executable":null}"#), None);
    }
}
