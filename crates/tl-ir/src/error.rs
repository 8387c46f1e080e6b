//! The IR's error type: spec errors plus graph-level ones (unknown ids, ordering, seeds).

use tl_spec::Shape;

/// Result alias of the IR.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong while building or running a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op's shape rule or reference semantics rejected its operands.
    #[error(transparent)]
    Spec(#[from] tl_spec::Error),
    /// An operand id does not name a tensor of the graph.
    #[error("{op}: unknown id {id} (the graph has {len} ids)")]
    UnknownId {
        /// The op (or API call) that referenced the id.
        op: &'static str,
        /// The bad id.
        id: usize,
        /// How many ids exist.
        len: usize,
    },
    /// A leaf was added after an op node; leaves must come first (reset is the boundary).
    #[error(
        "leaf {name:?} added after the first op node: all leaves must be created before any op (reset starts a new graph)"
    )]
    LeafAfterNode {
        /// The leaf's name, if any.
        name: Option<String>,
    },
    /// The number of leaf values (or tangents) does not match the graph's leaves.
    #[error("{what}: expected {expected} tensor(s), got {got}")]
    Count {
        /// Which API call.
        what: &'static str,
        /// How many the graph needs.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A tensor given for an id (a leaf value, a tangent, a seed) has the wrong shape.
    #[error("{what}: id {id} has shape {expected}, got a tensor of shape {got}")]
    ShapeMismatch {
        /// Which API call.
        what: &'static str,
        /// The id.
        id: usize,
        /// The shape recorded for the id.
        expected: Shape,
        /// The shape given.
        got: Shape,
    },
}
