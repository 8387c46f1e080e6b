//! The one error type of the command: a message that fits on one line, printed by `main` as
//! `error: <message>` before a non-zero exit.

use std::fmt;

/// A user-facing error: one line, saying what failed and, where it helps, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError(pub String);

/// Result alias of the command.
pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    /// An error with message `msg`.
    pub fn new(msg: impl Into<String>) -> Self {
        CliError(msg.into())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keep it to one line whatever the source said.
        let one_line: Vec<&str> = self
            .0
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        f.write_str(&one_line.join(" "))
    }
}

impl std::error::Error for CliError {}

impl From<tl_session::Error> for CliError {
    fn from(e: tl_session::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<tl_spec::Error> for CliError {
    fn from(e: tl_spec::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<tl_nn::Error> for CliError {
    fn from(e: tl_nn::Error) -> Self {
        CliError(e.to_string())
    }
}
