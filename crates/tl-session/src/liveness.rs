//! Which recorded nodes a caller can still reach: a [`TensorRef`](crate::TensorRef) that may
//! let its node's value go carries a shared [`Watch`]; when the last copy of the handle is
//! dropped, the node's id goes into its session's [`Dropped`] queue. The eager session hands
//! those values back to the tape before its next op or read; the linked session's compiled pass
//! frees them once their last reader has run. The tapes keep every value a backward may read
//! (`tl_tape_cpu::Tape::release`, `tl_tape_cuda::CudaTape::release`), so what goes is what
//! nothing can read any more: an evaluation pass frees its intermediate values as it goes,
//! as PyTorch does under `torch.no_grad()`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The ids of a session's nodes whose last handle was dropped, with the epoch (reset count)
/// they were recorded in; shared by the session and its handles' watches.
#[derive(Clone, Default)]
pub(crate) struct Dropped(Arc<Queue>);

#[derive(Default)]
struct Queue {
    ids: Mutex<Vec<(u64, usize)>>,
    /// How many ids `ids` holds, read without the lock: a session checks it before every op.
    len: AtomicUsize,
}

impl Dropped {
    /// A watch for node `id` of `epoch`: put it in a handle, and the id comes back here when
    /// the handle's last copy is dropped.
    pub(crate) fn watch(&self, epoch: u64, id: usize) -> Arc<Watch> {
        Arc::new(Watch {
            epoch,
            id,
            dropped: self.clone(),
        })
    }

    /// Whether no id was reported since the last [`take_into`](Self::take_into) (read without
    /// the lock: a session asks before every op).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.len.load(Ordering::Acquire) == 0
    }

    /// Append to `out` the ids of `epoch` dropped since the last call (older epochs' are
    /// discarded: their tape is gone).
    pub(crate) fn take_into(&self, epoch: u64, out: &mut Vec<usize>) {
        if self.0.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut q = self.0.ids.lock().unwrap_or_else(|e| e.into_inner());
        self.0.len.store(0, Ordering::Release);
        let ids = q.drain(..).filter(|&(e, _)| e == epoch).map(|(_, id)| id);
        out.extend(ids);
    }

    /// Forget every id reported so far (a reset: their tape is gone).
    pub(crate) fn clear(&self) {
        let mut q = self.0.ids.lock().unwrap_or_else(|e| e.into_inner());
        self.0.len.store(0, Ordering::Release);
        q.clear();
    }
}

/// Held (shared) by every copy of one node's handle; dropping the last copy reports the node.
pub(crate) struct Watch {
    epoch: u64,
    id: usize,
    dropped: Dropped,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let queue = &self.dropped.0;
        let mut q = queue.ids.lock().unwrap_or_else(|e| e.into_inner());
        q.push((self.epoch, self.id));
        queue.len.store(q.len(), Ordering::Release);
    }
}
