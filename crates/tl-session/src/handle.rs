//! Handles: opaque references into a session. Each carries the id of the session that made it
//! and, for tape-scoped handles, the epoch (reset count) it was made in, so a handle from another
//! session or from before a reset is a clear error instead of a silently wrong id.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tl_spec::Shape;

use crate::liveness::Watch;
use crate::{Error, Result};

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A fresh process-unique session id.
pub(crate) fn next_session_id() -> u64 {
    NEXT_SESSION.fetch_add(1, Ordering::Relaxed)
}

/// Which session and which epoch (reset count) a handle belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The session's process-unique id.
    pub session: u64,
    /// The number of resets the session had seen when the handle was made.
    pub epoch: u64,
}

impl Stamp {
    /// Check that a handle stamped `self` may be used in `current` (same session, same epoch).
    pub(crate) fn check(self, what: &'static str, current: Stamp) -> Result<()> {
        self.check_session(what, current.session)?;
        if self.epoch != current.epoch {
            return Err(Error::StaleHandle {
                what,
                handle_epoch: self.epoch,
                epoch: current.epoch,
            });
        }
        Ok(())
    }

    /// Check only the session (for handles that outlive resets, such as parameters).
    pub(crate) fn check_session(self, what: &'static str, session: u64) -> Result<()> {
        if self.session != session {
            return Err(Error::ForeignHandle {
                what,
                handle_session: self.session,
                session,
            });
        }
        Ok(())
    }
}

/// A tensor recorded in a session: an id on its tape (or graph) and the shape it has.
/// PyTorch comparison: a `torch.Tensor` that is part of the autograd graph.
///
/// Copies of a handle are one reference: once the last copy of an op node's handle is
/// dropped, the session may let the node's value go unless a backward can read it (a node
/// that does not require grad and that nothing requiring grad reads: an evaluation pass frees
/// its intermediate values as it goes). Equality and hashing compare the session, epoch, id
/// and shape.
#[derive(Clone)]
pub struct TensorRef {
    pub(crate) stamp: Stamp,
    pub(crate) id: usize,
    pub(crate) shape: Shape,
    /// Reports the node to its session when the last copy is dropped (`None`: a leaf, or a
    /// node that keeps its value anyway).
    pub(crate) watch: Option<Arc<Watch>>,
}

impl PartialEq for TensorRef {
    fn eq(&self, other: &Self) -> bool {
        (self.stamp, self.id, &self.shape) == (other.stamp, other.id, &other.shape)
    }
}

impl Eq for TensorRef {}

impl std::hash::Hash for TensorRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.stamp, self.id, &self.shape).hash(state);
    }
}

impl std::fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("stamp", &self.stamp)
            .field("id", &self.id)
            .field("shape", &self.shape)
            .finish()
    }
}

impl TensorRef {
    /// The id on the session's tape (eager) or graph (linked).
    pub fn id(&self) -> usize {
        self.id
    }
    /// The tensor's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The session and epoch the handle belongs to.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }
}

/// A trainable parameter owned by a session; survives resets. Use it in a forward pass with
/// `use_param`. PyTorch comparison: `torch.nn.Parameter`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Param {
    pub(crate) session: u64,
    pub(crate) index: usize,
    pub(crate) shape: Shape,
}

impl Param {
    /// The parameter's index in its session (creation order).
    pub fn index(&self) -> usize {
        self.index
    }
    /// The parameter's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// One non-differentiable Nat input in the session's Nat environment (a label, an index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NatRef {
    pub(crate) stamp: Stamp,
    pub(crate) pos: usize,
}

impl NatRef {
    /// The position in the Nat environment.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// A block of `len` Nat inputs in the session's Nat environment (gather indices, labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NatVecRef {
    pub(crate) stamp: Stamp,
    pub(crate) pos: usize,
    pub(crate) len: usize,
}

impl NatVecRef {
    /// The position of the first entry in the Nat environment.
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// The number of entries.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The Nat environment shared by both sessions: record, read and write, with handle checks.
#[derive(Debug, Clone, Default)]
pub(crate) struct NatEnv {
    pub(crate) values: Vec<usize>,
}

impl NatEnv {
    pub(crate) fn record(&mut self, stamp: Stamp, v: usize) -> NatRef {
        self.values.push(v);
        NatRef {
            stamp,
            pos: self.values.len() - 1,
        }
    }

    pub(crate) fn record_vec(&mut self, stamp: Stamp, vs: &[usize]) -> NatVecRef {
        let pos = self.values.len();
        self.values.extend_from_slice(vs);
        NatVecRef {
            stamp,
            pos,
            len: vs.len(),
        }
    }

    pub(crate) fn read(&self, r: NatRef, now: Stamp) -> Result<usize> {
        r.stamp.check("read_nat", now)?;
        Ok(self.values[r.pos])
    }

    pub(crate) fn write(&mut self, r: NatRef, v: usize, now: Stamp) -> Result<()> {
        r.stamp.check("write_nat", now)?;
        self.values[r.pos] = v;
        Ok(())
    }

    pub(crate) fn read_vec(&self, r: NatVecRef, now: Stamp) -> Result<Vec<usize>> {
        r.stamp.check("read_nat_vec", now)?;
        Ok(self.values[r.pos..r.pos + r.len].to_vec())
    }

    pub(crate) fn write_vec(&mut self, r: NatVecRef, vs: &[usize], now: Stamp) -> Result<()> {
        r.stamp.check("write_nat_vec", now)?;
        if vs.len() != r.len {
            return Err(Error::Count {
                what: "write_nat_vec: length of a NatVecRef",
                expected: r.len,
                got: vs.len(),
            });
        }
        self.values[r.pos..r.pos + r.len].copy_from_slice(vs);
        Ok(())
    }
}
