//! The error type of tl-nn: the session's errors, plus bad labels, bad layer configurations,
//! layer inputs of the wrong shape, parameters a model does not list and checkpoint files that
//! do not fit the model, each naming what is wrong. It converts from every error a model
//! author meets (the crates below tl-nn, I/O, number parsing, a boxed error of your own), so
//! `?` works in any function returning [`Result`].

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
    /// A layer's input does not fit the layer: names the layer (its type and the path its
    /// parameters were created under, `Linear "blocks.0.mlp.up"`), the input's shape, what the
    /// layer expects, and the usual fix.
    #[error("{layer}: {detail}")]
    Input {
        /// The layer: printed type and path.
        layer: String,
        /// What does not fit, and how to fix it.
        detail: String,
    },
    /// An op inside a layer's forward pass failed (names the layer, then the op's error).
    #[error("{layer}: {source}")]
    Layer {
        /// The layer: printed type and path.
        layer: String,
        /// The op's error.
        source: Box<Error>,
    },
    /// Parameters a forward pass of the model used that its `visit_params` does not list: they
    /// would train without being counted, saved or loaded (`tl_nn::Runtime`, "Listed
    /// parameters"). Raised by `step`, `num_params`, `save`, `load` and `summary`.
    #[error(
        "{call}: the model does not list {} parameter(s) its forward pass uses: {}; list every layer in visit_params, or write it with #[derive(Parameters)]",
        names.len(),
        names.join(", ")
    )]
    Unlisted {
        /// The call that refused (`Runtime::step`, `Runtime::save`, …).
        call: &'static str,
        /// Each missing parameter's full name and dims (`"head.weight" [10, 32]`).
        names: Vec<String>,
    },
    /// Any other error met in a model's code (I/O without a path, a number that does not
    /// parse, your own error boxed), carried as it is.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// `From` impls that go through another variant's own conversion.
macro_rules! via {
    ($($from:ty => $variant:ident),* $(,)?) => {
        $(
            impl From<$from> for Error {
                fn from(e: $from) -> Self {
                    Error::$variant(e.into())
                }
            }
        )*
    };
}

via! {
    // The session wraps the errors of the crates below it.
    tl_ir::Error => Session,
    tl_tape_cpu::Error => Session,
    tl_tape_cuda::Error => Session,
    // Everything else a model's code meets, as it is.
    Box<dyn std::error::Error + Send + Sync + 'static> => Other,
    std::io::Error => Other,
    std::num::ParseIntError => Other,
    std::num::ParseFloatError => Other,
    std::num::TryFromIntError => Other,
    std::str::Utf8Error => Other,
    std::string::FromUtf8Error => Other,
    std::fmt::Error => Other,
    safetensors::SafeTensorError => Other,
}

/// A [`Error::Usage`] error.
pub(crate) fn usage(what: &'static str, detail: impl Into<String>) -> Error {
    Error::Usage {
        what,
        detail: detail.into(),
    }
}

/// The product of `dims`, sizes taken from `shape` (the operand of `what`): a row count or
/// row length. Exact for a tensor that may be empty (a zero among `dims` makes it 0, however
/// large the others), and an [`Error::Usage`] naming `what`, the sizes and the shape where it
/// overflows `usize` (only an empty tensor gets there: its other axes may be of any size),
/// where `iter().product()` would panic (debug) or wrap (release).
pub(crate) fn dims_product(
    what: &'static str,
    shape: &tl_spec::Shape,
    dims: &[usize],
) -> Result<usize> {
    tl_spec::Shape::new(dims).checked_numel().ok_or_else(|| {
        usage(
            what,
            format!(
                "the sizes {dims:?} of {shape} have a product past usize (an empty tensor's other axes may be of any size, but not this large)"
            ),
        )
    })
}
