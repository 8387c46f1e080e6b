//! The CPU tape's error type: every message names the op (or API call) and the shapes.

use tl_spec::Shape;

/// Result alias of the CPU tape.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong on the CPU tape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op's shape rule or a kernel rejected its operands (names the op and shapes).
    #[error(transparent)]
    Ir(#[from] tl_ir::Error),
    /// An id that does not name a node of the tape.
    #[error("{what}: unknown id {id} (the tape has {len} nodes)")]
    UnknownId {
        /// The API call or op that referenced the id.
        what: String,
        /// The bad id.
        id: usize,
        /// How many nodes exist.
        len: usize,
    },
    /// A node whose value was released ([`crate::Tape::release`]) was read or used as an
    /// operand.
    #[error(
        "{what}: the value of node {id} ({op}) was released: no handle to it was left and no backward reads it"
    )]
    ReleasedValue {
        /// The API call or op that read it.
        what: String,
        /// The node.
        id: usize,
        /// The op that produced it.
        op: String,
    },
    /// A tensor given or expected for an id has the wrong shape (value reads, seeds, gradients).
    #[error("{what}: id {id} has shape {expected}, got {got}")]
    Shape {
        /// The API call or op.
        what: String,
        /// The id concerned.
        id: usize,
        /// The id's shape on the tape.
        expected: Shape,
        /// The shape given or produced.
        got: Shape,
    },
    /// A count (of gradients, of operands) does not match.
    #[error("{what}: expected {expected}, got {got}")]
    Count {
        /// The API call or op.
        what: String,
        /// The expected count.
        expected: usize,
        /// The count given.
        got: usize,
    },
}

impl From<tl_spec::Error> for Error {
    fn from(e: tl_spec::Error) -> Self {
        Error::Ir(tl_ir::Error::Spec(e))
    }
}
