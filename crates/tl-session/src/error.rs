//! The session error type: the tapes' and the IR's errors, plus handle misuse (a handle from
//! another session, a stale handle after reset, a wrong-length Nat vector) and backend setup.

use tl_spec::Shape;

/// Result alias of the sessions.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong in a session.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The IR rejected an op or a graph (names the op and the shapes).
    #[error(transparent)]
    Ir(Box<tl_ir::Error>),
    /// The CPU tape rejected an op or a call.
    #[error(transparent)]
    Cpu(Box<tl_tape_cpu::Error>),
    /// The CUDA tape or its device rejected an op or a call.
    #[error(transparent)]
    Cuda(Box<tl_tape_cuda::Error>),
    /// A handle (`TensorRef`, `Param`, `NatRef`) made by another session.
    #[error(
        "{what}: the handle belongs to session #{handle_session}, not to this session #{session}"
    )]
    ForeignHandle {
        /// The API call.
        what: &'static str,
        /// The session that made the handle.
        handle_session: u64,
        /// This session.
        session: u64,
    },
    /// A handle made before the last `reset` (its tape is gone). A pass is the span between two
    /// resets, counted from 0.
    #[error(
        "{what}: the handle was made before the session's last reset (it is from pass {handle_epoch}, the session is in pass {epoch}); record the tensor again after reset"
    )]
    StaleHandle {
        /// The API call.
        what: &'static str,
        /// The pass (number of resets before it) the handle was made in.
        handle_epoch: u64,
        /// The session's current pass.
        epoch: u64,
    },
    /// A tensor of the wrong shape (a value read back, a seed, a parameter write, a tangent).
    #[error("{what}: expected shape {expected}, got {got}")]
    Shape {
        /// The API call.
        what: &'static str,
        /// The shape required.
        expected: Shape,
        /// The shape given.
        got: Shape,
    },
    /// A count (Nat vector length, number of tangents or gradients) does not match.
    #[error("{what}: expected {expected}, got {got}")]
    Count {
        /// The API call.
        what: &'static str,
        /// The count required.
        expected: usize,
        /// The count given.
        got: usize,
    },
    /// A call that needs a prior step (e.g. `grad` before `backward`).
    #[error("{what}: {detail}")]
    Usage {
        /// The API call.
        what: &'static str,
        /// What is missing.
        detail: String,
    },
    /// An op method ([`Ops::broadcast_to`](crate::Ops::broadcast_to), ...) failed: names the
    /// Rust method before the op's own message (which uses the op's IR name, `broadcastTo`).
    #[error("{method}: {source}")]
    Method {
        /// The [`Ops`](crate::Ops) method called.
        method: &'static str,
        /// The shape rule's error.
        source: Box<Error>,
    },
    /// An optimizer hyper-parameter is out of range (checked when the optimizer is built and
    /// before each step).
    #[error("optimizer {optimizer}: invalid hyper-parameter {name} = {value}: expected {expected}")]
    Hyperparameter {
        /// The optimizer (`sgd`, `momentum`, `adam`, `adamw`).
        optimizer: &'static str,
        /// The hyper-parameter (`lr`, `weight_decay`, `momentum`, `dampening`, `beta1`, …).
        name: &'static str,
        /// The value given.
        value: f64,
        /// The valid range.
        expected: &'static str,
    },
    /// With `Optimizer::check_finite(true)`, a step would have written a non-finite value into
    /// a parameter; the parameter and the optimizer state were left unchanged.
    #[error(
        "optimizer {optimizer} step: parameter {param} would get a non-finite value ({value} at element {index}); the step was not applied"
    )]
    NonFinite {
        /// The optimizer.
        optimizer: &'static str,
        /// The parameter: its name where it has one, else `#index`.
        param: String,
        /// The first offending element (row-major).
        index: usize,
        /// Its value.
        value: f64,
    },
    /// With `Optimizer::stop_on_non_finite_loss(true)`, the loss of a training step was NaN
    /// or ±∞; nothing was stepped.
    #[error(
        "training step {step} (counted from 0): the loss is {value}; nothing was stepped (lower the learning rate, clip the gradients, or check the data)"
    )]
    NonFiniteLoss {
        /// The step's index (the optimizer's steps done before it).
        step: u64,
        /// The loss.
        value: f64,
    },
    /// The requested backend is not available in this build or on this machine.
    #[error("backend {backend}: {detail}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: &'static str,
        /// What is missing.
        detail: String,
    },
}

impl Error {
    /// Name the parameter of a [`Error::NonFinite`] (other errors are returned as they are).
    pub(crate) fn with_param_name(self, name: Option<&str>) -> Self {
        match (self, name) {
            (
                Error::NonFinite {
                    optimizer,
                    param,
                    index,
                    value,
                },
                Some(n),
            ) => Error::NonFinite {
                optimizer,
                param: format!("{n:?} ({param})"),
                index,
                value,
            },
            (e, _) => e,
        }
    }
}

impl From<tl_ir::Error> for Error {
    fn from(e: tl_ir::Error) -> Self {
        Error::Ir(Box::new(e))
    }
}

impl From<tl_spec::Error> for Error {
    fn from(e: tl_spec::Error) -> Self {
        Error::Ir(Box::new(tl_ir::Error::Spec(e)))
    }
}

impl From<tl_tape_cpu::Error> for Error {
    fn from(e: tl_tape_cpu::Error) -> Self {
        Error::Cpu(Box::new(e))
    }
}

impl From<tl_tape_cuda::Error> for Error {
    fn from(e: tl_tape_cuda::Error) -> Self {
        Error::Cuda(Box::new(e))
    }
}

impl Error {
    /// Name the Rust method `method` that recorded the failing op, before the op's own
    /// message (which names the op as the IR spells it), unless that message starts with the
    /// method's name already. Handle errors keep their variant, with the method as the call
    /// they name.
    pub(crate) fn in_method(self, method: &'static str) -> Error {
        match self {
            Error::ForeignHandle {
                handle_session,
                session,
                ..
            } => Error::ForeignHandle {
                what: method,
                handle_session,
                session,
            },
            Error::StaleHandle {
                handle_epoch,
                epoch,
                ..
            } => Error::StaleHandle {
                what: method,
                handle_epoch,
                epoch,
            },
            // The op's message names it already when the method has the op's name (`conv`):
            // not `conv: conv: …`.
            other if other.to_string().starts_with(&format!("{method}:")) => other,
            other => Error::Method {
                method,
                source: Box::new(other),
            },
        }
    }
}
