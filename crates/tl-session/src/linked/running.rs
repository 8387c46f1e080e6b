//! The linked session's running-statistics update ([`Train::update_running`]): the moments
//! are read from the pass's compiled tape; on a CUDA backend the update runs there, one launch
//! for both buffers' resident mirrors, and nothing crosses to the host.
//!
//! [`Train::update_running`]: crate::Train::update_running

use tl_spec::Scalar;
use tl_tape_cuda::{Buffer, Device};

use super::{CompiledTape, LinkedSession};
use crate::running::{WHAT, check, on_host};
use crate::{Param, Result, TensorRef};

impl<T: Scalar> LinkedSession<T> {
    /// Fold `moments`, a (2, C…) tensor of the current graph, into the buffer parameters
    /// `mean` and `var`: [`Train::update_running`](crate::Train::update_running). The moments
    /// come from the pass's compiled tape (the graph is compiled, or extended, onto the
    /// session's backend as a [`Train::read`](crate::Train::read) does). On a CUDA backend the
    /// update runs on that device, one launch on the buffers' resident mirrors; leaves of the
    /// buffers in this graph keep the value they were recorded with (the old mirror, kept for
    /// this graph's compiles until [`reset`](Self::reset)). On the CPU it is a host write
    /// ([`set_param`](Self::set_param)) of each new value.
    pub fn update_running(
        &mut self,
        mean: &Param,
        var: &Param,
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        self.check_handle(WHAT, moments)?;
        check(&self.params, [mean, var], &moments.shape, momentum)?;
        let mut compiled = self.compile_pass(self.backend)?;
        let indices = [mean.index, var.index];
        // The pass's tape holds every node of the graph, `moments` among them.
        let to = compiled.map.get(moments.id).copied().unwrap_or(usize::MAX);
        let host = match &mut compiled.tape {
            CompiledTape::Cpu(t) => t.get(to).map_err(Into::into).and_then(|mo| {
                let slots = &self.params.slots;
                let running = indices.map(|i| &slots[i].host);
                on_host(running, mo, momentum, count).map(Some)
            }),
            CompiledTape::CudaSim(t) => match t.get(to).map(|s| s.buffer()) {
                Ok(mo) => (self.update_resident(indices, t.device_mut(), mo, momentum, count))
                    .map(|()| None),
                Err(e) => Err(e.into()),
            },
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            CompiledTape::Cuda(t) => match t.get(to).map(|s| s.buffer()) {
                Ok(mo) => (self.update_resident(indices, t.device_mut(), mo, momentum, count))
                    .map(|()| None),
                Err(e) => Err(e.into()),
            },
        };
        // Kept for the pass, as after a read.
        self.keep_pass(compiled);
        match host? {
            Some([m, v]) => {
                self.set_param(mean, m)?;
                self.set_param(var, v)
            }
            None => Ok(()),
        }
    }

    /// The update of parameters `indices` (the running mean and variance) on `dev`, the
    /// pass's device. Each old mirror is kept (`pinned`) when this graph's leaves of the
    /// parameter were compiled from it: the first update of the pass, of a parameter with
    /// leaves not written from the host since. Otherwise nothing of this graph reads it, and it
    /// is retired (released when the pass ends).
    fn update_resident<D: Device>(
        &mut self,
        indices: [usize; 2],
        dev: &mut D,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        let old = (self.params).update_running_on_device(indices, dev, moments, momentum, count)?;
        for (index, old) in indices.into_iter().zip(old) {
            let recorded = self.leaf_param.values().any(|&i| i == index);
            if recorded && !self.written.contains(&index) && !self.pinned.contains_key(&index) {
                self.pinned.insert(index, old);
            } else {
                self.params.retired.push(old.buffer());
            }
        }
        Ok(())
    }
}
