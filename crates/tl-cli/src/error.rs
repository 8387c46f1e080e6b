//! The one error type of the command: a message that fits on one line, printed by `main` as
//! `error: <message>` before a non-zero exit, and its [`Kind`], which decides that exit status:
//! 2 for a usage error, 1 for a failure while running (the convention of clap, which exits 2 on
//! the errors it finds itself).

use std::fmt;

/// What kind of failure an error is: it decides the exit status ([`Kind::exit_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The command line is wrong by itself, whatever the files and the machine: a flag value out
    /// of its range (`--batch-size 0`, `--lr -1`, `--plot loss.svg`), or flags that contradict
    /// each other or the preset. Exit status 2, as for the errors clap finds while parsing.
    Usage,
    /// The command line is fine but running it failed: a file that cannot be read or written, a
    /// checkpoint that does not hold what the flags ask for, a backend this build or machine
    /// lacks, a training run that diverged. Exit status 1.
    Runtime,
}

impl Kind {
    /// The process exit status of an error of this kind: 2 for usage, 1 for runtime.
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::Usage => 2,
            Kind::Runtime => 1,
        }
    }
}

/// A user-facing error: one line, saying what failed and, where it helps, what to do; a usage
/// error names the flag and the value it refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    kind: Kind,
    message: String,
}

/// Result alias of the command.
pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    /// A runtime error ([`Kind::Runtime`]) with message `msg`.
    pub fn new(msg: impl Into<String>) -> Self {
        CliError {
            kind: Kind::Runtime,
            message: msg.into(),
        }
    }

    /// A usage error ([`Kind::Usage`]) with message `msg`, which names the flag and its value.
    pub fn usage(msg: impl Into<String>) -> Self {
        CliError {
            kind: Kind::Usage,
            message: msg.into(),
        }
    }

    /// The same message as a runtime error: for a check that refuses values read from a file
    /// (a checkpoint's) rather than typed on the command line.
    #[must_use]
    pub fn into_runtime(self) -> Self {
        CliError {
            kind: Kind::Runtime,
            ..self
        }
    }

    /// The kind of the error.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether it is a usage error.
    pub fn is_usage(&self) -> bool {
        self.kind == Kind::Usage
    }

    /// The process exit status: [`Kind::exit_code`] of its kind.
    pub fn exit_code(&self) -> u8 {
        self.kind.exit_code()
    }

    /// The message as given (the [`Display`](fmt::Display) form joins its lines).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keep it to one line whatever the source said.
        let one_line: Vec<&str> = self
            .message
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
        CliError::new(e.to_string())
    }
}

impl From<tl_spec::Error> for CliError {
    fn from(e: tl_spec::Error) -> Self {
        CliError::new(e.to_string())
    }
}

impl From<tl_nn::Error> for CliError {
    fn from(e: tl_nn::Error) -> Self {
        CliError::new(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_and_runtime_errors_1() {
        let u = CliError::usage("--batch-size 0: must be at least 1");
        assert!(u.is_usage());
        assert_eq!(u.exit_code(), 2);
        let r = u.clone().into_runtime();
        assert_eq!((r.kind(), r.exit_code()), (Kind::Runtime, 1));
        assert_eq!(r.message(), u.message());
        assert_eq!(CliError::new("cannot read").exit_code(), 1);
        assert_eq!(CliError::new("a\n  b\n").to_string(), "a b");
    }
}
