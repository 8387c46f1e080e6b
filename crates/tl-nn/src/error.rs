//! The error type of tl-nn: the session's errors, plus bad labels, bad layer configurations and
//! checkpoint files that do not fit the model, each naming what is wrong.

use std::path::PathBuf;

/// Result alias of tl-nn.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong building, running, saving or loading a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The session rejected an op or a call (names the op and the shapes).
    #[error(transparent)]
    Session(#[from] tl_session::Error),
    /// A host tensor could not be built (names the op and the shape).
    #[error(transparent)]
    Spec(#[from] tl_spec::Error),
    /// A call with arguments that cannot work: a bad layer size, a label out of range, a
    /// parameter name used twice.
    #[error("{what}: {detail}")]
    Usage {
        /// The call, as a Rust path (`Linear::new`, `Var::cross_entropy`).
        what: &'static str,
        /// What is wrong, with the values involved.
        detail: String,
    },
    /// A checkpoint file that cannot be read, or does not fit the model; nothing was changed.
    #[error("checkpoint {}: {detail}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the tensor).
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// A [`Error::Usage`] error.
pub(crate) fn usage(what: &'static str, detail: impl Into<String>) -> Error {
    Error::Usage {
        what,
        detail: detail.into(),
    }
}
