//! The parameter store both sessions share: each parameter's host value and, on the CUDA
//! backend, its device mirror (parameters stay resident on the device during training;
//! reading syncs back explicitly; a host write invalidates the mirror).

use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, Buffer, Device};

use crate::{Error, Param, Result};

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
        let slot = &mut self.slots[p.index];
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
        Ok(slot.host.clone())
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
        if let Some(b) = slot.device.take() {
            self.retired.push(b.buffer());
        }
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

    /// Release every device mirror and retired buffer (the session is going away or the host
    /// values were synced).
    pub(crate) fn release_retired<D: Device>(&mut self, dev: &mut D) -> usize {
        dev.release_all(self.retired.drain(..))
    }

    pub(crate) fn shape(&self, index: usize) -> &Shape {
        self.slots[index].host.shape()
    }
}
