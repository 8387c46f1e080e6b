//! The parameter store both sessions share: each parameter's host value and, on the CUDA
//! backend, its device mirror (parameters stay resident on the device during training;
//! reading syncs back explicitly; a host write invalidates the mirror).

use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, Buffer, Device};

use crate::optim::DeviceOps;
use crate::{Error, Optimizer, Param, Result};

/// One parameter.
#[derive(Debug, Clone)]
pub(crate) struct Slot<T: Scalar> {
    pub(crate) name: Option<String>,
    pub(crate) host: Tensor<T>,
    pub(crate) requires_grad: bool,
    /// The device mirror, when the parameter has been used on a CUDA tape.
    pub(crate) device: Option<AnyBuffer>,
    /// Whether the device mirror is newer than `host` (after an optimizer step on the device).
    pub(crate) host_stale: bool,
}

/// Every parameter of a session, by index.
#[derive(Debug, Clone)]
pub(crate) struct ParamStore<T: Scalar> {
    pub(crate) session: u64,
    pub(crate) slots: Vec<Slot<T>>,
    /// Mirrors invalidated by a host write while a tape may still borrow them; released at reset.
    pub(crate) retired: Vec<Buffer>,
}

impl<T: Scalar> ParamStore<T> {
    pub(crate) fn new(session: u64) -> Self {
        ParamStore {
            session,
            slots: Vec::new(),
            retired: Vec::new(),
        }
    }

    pub(crate) fn create(&mut self, init: Tensor<T>, name: Option<&str>, rg: bool) -> Param {
        let shape = init.shape().clone();
        self.slots.push(Slot {
            name: name.map(str::to_owned),
            host: init,
            requires_grad: rg,
            device: None,
            host_stale: false,
        });
        Param {
            session: self.session,
            index: self.slots.len() - 1,
            shape,
        }
    }

    /// The slot behind `p`, after checking it belongs to this session.
    pub(crate) fn slot(&self, what: &'static str, p: &Param) -> Result<&Slot<T>> {
        crate::handle::Stamp {
            session: p.session,
            epoch: 0,
        }
        .check_session(what, self.session)?;
        self.slots.get(p.index).ok_or_else(|| Error::Usage {
            what,
            detail: format!("no parameter #{}", p.index),
        })
    }

    /// The host value, synced from the device mirror first if that is newer.
    pub(crate) fn read<D: Device>(&mut self, p: &Param, dev: Option<&D>) -> Result<Tensor<T>> {
        self.slot("param_value", p)?;
        self.sync(p.index, dev)?;
        Ok(self.slots[p.index].host.clone())
    }

    /// Make parameter `index`'s host value current: downloaded from its device mirror (on
    /// `dev`) when an optimizer step on the device changed it.
    pub(crate) fn sync<D: Device>(&mut self, index: usize, dev: Option<&D>) -> Result<()> {
        let slot = &mut self.slots[index];
        if slot.host_stale {
            match (dev, &slot.device) {
                (Some(dev), Some(buf)) => {
                    slot.host = buf.download(dev)?;
                    slot.host_stale = false;
                }
                _ => {
                    return Err(Error::Usage {
                        what: "param_value",
                        detail: "the device mirror is newer but no device is attached".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Drop parameter `index`'s device mirror after its host value changed (released at the
    /// next [`release_retired`](Self::release_retired)).
    pub(crate) fn retire_mirror(&mut self, index: usize) {
        if let Some(b) = self.slots[index].device.take() {
            self.retired.push(b.buffer());
        }
    }

    /// Overwrite the host value; the device mirror is invalidated (re-uploaded on next use).
    pub(crate) fn write(&mut self, p: &Param, value: Tensor<T>) -> Result<()> {
        self.slot("set_param", p)?;
        let slot = &mut self.slots[p.index];
        if value.shape() != slot.host.shape() {
            return Err(Error::Shape {
                what: "set_param",
                expected: slot.host.shape().clone(),
                got: value.shape().clone(),
            });
        }
        slot.host = value;
        slot.host_stale = false;
        self.retire_mirror(p.index);
        Ok(())
    }

    /// Freeze or unfreeze a parameter (read by the next `use_param`).
    pub(crate) fn set_requires_grad(&mut self, p: &Param, requires_grad: bool) -> Result<()> {
        self.slot("set_requires_grad", p)?;
        self.slots[p.index].requires_grad = requires_grad;
        Ok(())
    }

    /// The device mirror of parameter `index`, uploaded if missing.
    pub(crate) fn mirror<D: Device>(&mut self, index: usize, dev: &mut D) -> Result<AnyBuffer> {
        let slot = &mut self.slots[index];
        if let Some(b) = &slot.device {
            return Ok(b.clone());
        }
        let b = AnyBuffer::upload(dev, &slot.host)?;
        slot.device = Some(b.clone());
        Ok(b)
    }

    /// BatchNorm's running-statistics update of parameters `[mean, var]` on `dev`
    /// (`Device::running_update_moments`, one launch, from their mirrors, uploaded first if
    /// missing, and `moments`, the (2, C) batch means and biased variances of `count` elements
    /// each): the results become the mirrors, whose host copies are then stale (synced on
    /// read). Returns the old mirrors, which a pass's leaves may still borrow: the caller
    /// retires or keeps them.
    pub(crate) fn update_running_on_device<D: Device>(
        &mut self,
        [mean, var]: [usize; 2],
        dev: &mut D,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<[AnyBuffer; 2]> {
        let old = [self.mirror(mean, dev)?, self.mirror(var, dev)?];
        let (new_mean, new_var) =
            dev.running_update_moments(old[0].buffer(), old[1].buffer(), moments, momentum, count)?;
        for (index, new) in [(mean, new_mean), (var, new_var)] {
            let slot = &mut self.slots[index];
            let shape = slot.host.shape().clone();
            slot.device = Some(AnyBuffer::new("update_running", shape, new)?);
            slot.host_stale = true;
        }
        Ok(old)
    }

    /// Release every device mirror and retired buffer (the session is going away or the host
    /// values were synced).
    pub(crate) fn release_retired<D: Device>(&mut self, dev: &mut D) -> usize {
        dev.release_all(self.retired.drain(..))
    }

    /// One step of `opt` on parameter `index`, on the device: its gradient is the sum of
    /// `grads` (one per use of the parameter, summed on the device), and the update runs on
    /// the resident mirror, whose host copy is then stale (synced on read). PyTorch:
    /// `optimizer.step()` on a CUDA parameter.
    pub(crate) fn step_on_device<D: Device>(
        &mut self,
        dev: &mut D,
        opt: &mut Optimizer,
        index: usize,
        grads: &[Buffer],
    ) -> Result<()> {
        let Some((&first, rest)) = grads.split_first() else {
            return Ok(()); // not used in this pass: nothing to step
        };
        let key = (self.session, index);
        let mut w = self.mirror(index, dev)?.buffer();
        // One use (the common case) steps from the gradient itself; several are summed into a
        // temporary first.
        let sum = match rest.is_empty() {
            true => None,
            false => Some(dev.copy(first)?),
        };
        let mut r = Ok(());
        if let Some(acc) = sum {
            for &g in rest {
                r = r.and_then(|()| Ok(dev.axpy_assign(acc, 1.0, g)?));
            }
        }
        let g = sum.unwrap_or(first);
        let r = r.and_then(|()| opt.update(&mut DeviceOps(dev), key, &mut w, &g));
        if let Some(acc) = sum {
            dev.release(acc);
        }
        let slot = &mut self.slots[index];
        r.map_err(|e| e.with_param_name(slot.name.as_deref()))?;
        slot.host_stale = true;
        Ok(())
    }

    /// One step of `opt` on every parameter of `items` (`(index, gradients)`, as
    /// [`ParamStore::step_on_device`] takes them). In a plain SGD step the parameters with one
    /// gradient are updated by one `axpy_assign_list` launch per eight (PyTorch's `foreach`
    /// SGD); in an Adam, AdamW or momentum SGD step that runs fused (no clipping, no finite
    /// check: `Optimizer::fused_list_ok`) by one `adam_update_list` / `momentum_update_list`
    /// launch per eight (`Optimizer::fused_list_step`; a momentum SGD parameter's first step,
    /// which makes its buffer, on its own) — the same values and state as one step per
    /// parameter either way. Any other step, and parameters used several times (their
    /// gradients are summed first), go parameter by parameter.
    pub(crate) fn step_all_on_device<D: Device>(
        &mut self,
        dev: &mut D,
        opt: &mut Optimizer,
        items: &[(usize, Vec<Buffer>)],
    ) -> Result<()> {
        // The step's learning rate and clipping, from every gradient, before any update.
        let grads: Vec<Vec<&Buffer>> = items.iter().map(|(_, gs)| gs.iter().collect()).collect();
        let r = opt
            .begin_step(&mut DeviceOps(&mut *dev), &grads)
            .and_then(|()| self.step_all_begun(dev, opt, items));
        opt.end_step(r.is_ok());
        r
    }

    /// [`ParamStore::step_all_on_device`] once the optimizer's step has begun.
    fn step_all_begun<D: Device>(
        &mut self,
        dev: &mut D,
        opt: &mut Optimizer,
        items: &[(usize, Vec<Buffer>)],
    ) -> Result<()> {
        let plain = opt.plain_sgd_lr();
        if plain.is_none() && !opt.fused_list_ok() {
            return items
                .iter()
                .try_for_each(|(index, gs)| self.step_on_device(dev, opt, *index, gs));
        }
        let (single, other): (Vec<_>, Vec<_>) = items.iter().partition(|(_, gs)| gs.len() == 1);
        for (index, gs) in other {
            self.step_on_device(dev, opt, *index, gs)?;
        }
        let mut pairs = Vec::with_capacity(single.len());
        for (index, gs) in &single {
            let w = self.mirror(*index, dev).map_err(|e| {
                let name = self.slots[*index].name.as_deref();
                e.with_param_name(name)
            })?;
            pairs.push((w.buffer(), gs[0]));
        }
        let r = match plain {
            Some(lr) => {
                let r = dev.axpy_assign_list(-lr as f32, &pairs);
                if r.is_ok() {
                    opt.count_plain_steps(single.iter().map(|(index, _)| (self.session, *index)));
                }
                r.map_err(Into::into)
            }
            None => {
                let params: Vec<_> = (single.iter().zip(&pairs))
                    .map(|((index, _), &(w, g))| ((self.session, *index), w, g))
                    .collect();
                opt.fused_list_step(dev, &params)
            }
        };
        // The list step may have written every parameter before an error: all are marked.
        for (index, _) in single {
            self.slots[*index].host_stale = true;
        }
        r
    }

    /// Bring every parameter home from `dev`: stale host values are downloaded, then every
    /// mirror and retired buffer is released (e.g. before the session moves to another device).
    pub(crate) fn unload<D: Device>(&mut self, dev: &mut D) -> Result<()> {
        for slot in &mut self.slots {
            if let Some(b) = slot.device.take() {
                if slot.host_stale {
                    match b.download(dev) {
                        Ok(host) => {
                            slot.host = host;
                            slot.host_stale = false;
                        }
                        Err(e) => {
                            slot.device = Some(b); // kept: the newer value is still there
                            return Err(e.into());
                        }
                    }
                }
                dev.release(b.buffer());
            }
        }
        self.release_retired(dev);
        Ok(())
    }

    pub(crate) fn shape(&self, index: usize) -> &Shape {
        self.slots[index].host.shape()
    }
}
