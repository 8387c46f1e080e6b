//! The linked session's running-statistics update ([`Train::update_running`]): the statistic
//! is read from the pass's compiled tape; on a CUDA backend the update runs there, on the
//! buffer's resident mirror, and nothing crosses to the host.
//!
//! [`Train::update_running`]: crate::Train::update_running

use tl_spec::Scalar;
use tl_spec::ops::norm::RunningStat;
use tl_tape_cuda::{Buffer, Device};

use super::{CompiledTape, LinkedSession};
use crate::running::{WHAT, check, on_host};
use crate::{Param, Result, TensorRef};

impl<T: Scalar> LinkedSession<T> {
    /// Fold `stat`, a tensor of the current graph with the buffer's shape, into the buffer
    /// parameter `buffer`: [`Train::update_running`](crate::Train::update_running). The
    /// statistic comes from the pass's compiled tape (the graph is compiled, or extended, onto
    /// the session's backend as a [`Train::read`](crate::Train::read) does). On a CUDA backend
    /// the update runs on that device, on the buffer's resident mirror; leaves of the buffer in
    /// this graph keep the value they were recorded with (the old mirror, kept for this graph's
    /// compiles until [`reset`](Self::reset)). On the CPU it is a host write
    /// ([`set_param`](Self::set_param)) of the new value.
    pub fn update_running(
        &mut self,
        buffer: &Param,
        stat: &TensorRef,
        momentum: f64,
        kind: RunningStat,
    ) -> Result<()> {
        self.check_handle(WHAT, stat)?;
        check(&self.params, buffer, &stat.shape, momentum)?;
        let mut compiled = self.compile_pass(self.backend)?;
        let index = buffer.index;
        // The pass's tape holds every node of the graph, `stat` among them.
        let to = compiled.map.get(stat.id).copied().unwrap_or(usize::MAX);
        let host =
            match &mut compiled.tape {
                CompiledTape::Cpu(t) => t.get(to).map_err(Into::into).and_then(|s| {
                    on_host(&self.params.slots[index].host, s, momentum, kind).map(Some)
                }),
                CompiledTape::CudaSim(t) => match t.get(to).map(|s| s.buffer()) {
                    Ok(s) => (self.update_resident(index, t.device_mut(), s, momentum, kind))
                        .map(|()| None),
                    Err(e) => Err(e.into()),
                },
                #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
                CompiledTape::Cuda(t) => match t.get(to).map(|s| s.buffer()) {
                    Ok(s) => (self.update_resident(index, t.device_mut(), s, momentum, kind))
                        .map(|()| None),
                    Err(e) => Err(e.into()),
                },
            };
        // Kept for the pass, as after a read.
        self.keep_pass(compiled);
        match host? {
            Some(value) => self.set_param(buffer, value),
            None => Ok(()),
        }
    }

    /// The update of parameter `index` on `dev`, the pass's device. The old mirror is kept
    /// (`pinned`) when this graph's leaves of the parameter were compiled from it: the first
    /// update of the pass, of a parameter with leaves not written from the host since.
    /// Otherwise nothing of this graph reads it, and it is retired (released when the pass
    /// ends).
    fn update_resident<D: Device>(
        &mut self,
        index: usize,
        dev: &mut D,
        stat: Buffer,
        momentum: f64,
        kind: RunningStat,
    ) -> Result<()> {
        let old = (self.params).update_running_on_device(index, dev, stat, momentum, kind)?;
        let recorded = self.leaf_param.values().any(|&i| i == index);
        if recorded && !self.written.contains(&index) && !self.pinned.contains_key(&index) {
            self.pinned.insert(index, old);
        } else {
            self.params.retired.push(old.buffer());
        }
        Ok(())
    }
}
