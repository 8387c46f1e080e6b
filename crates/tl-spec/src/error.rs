//! The error type of the reference semantics: every message names the op and the shapes.

use crate::Shape;

/// Result alias used throughout `tl-spec`.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong when evaluating the reference semantics of an op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The operands' shapes do not satisfy the op's shape rule.
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The op whose rule failed (e.g. `matmul`).
        op: &'static str,
        /// What was expected and what was given, with the shapes.
        detail: String,
    },
    /// A value lies outside the op's domain (e.g. `log` of a non-positive number).
    #[error("{op}: domain error: {detail}")]
    Domain {
        /// The op that rejected the value.
        op: &'static str,
        /// Which value, where, and why.
        detail: String,
    },
    /// A static parameter of the op is invalid (e.g. an axis out of range).
    #[error("{op}: invalid parameter: {detail}")]
    Param {
        /// The op whose parameter is invalid.
        op: &'static str,
        /// Which parameter and why.
        detail: String,
    },
    /// The op was given the wrong number of operands.
    #[error("{op}: expected {expected} operand(s), got {got}")]
    Arity {
        /// The op.
        op: &'static str,
        /// How many operands the op takes.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A shape's element count or a buffer's byte size overflows, or a buffer would exceed the
    /// allocation cap ([`crate::alloc`]); nothing was allocated.
    #[error("{op}: too large: {detail}")]
    TooLarge {
        /// The op (or constructor) that would have allocated.
        op: &'static str,
        /// The shape or element count, the bytes, and the limit.
        detail: String,
    },
    /// Element data and shape disagree on the element count.
    #[error("tensor: {len} element(s) cannot have shape {shape}")]
    Data {
        /// The number of elements supplied.
        len: usize,
        /// The requested shape.
        shape: Shape,
    },
}

impl Error {
    /// A shape error for `op` with a free-form description.
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Shape {
            op,
            detail: detail.into(),
        }
    }

    /// A domain error for `op`.
    pub fn domain(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Domain {
            op,
            detail: detail.into(),
        }
    }

    /// A parameter error for `op`.
    pub fn param(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Param {
            op,
            detail: detail.into(),
        }
    }
}
