//! A device step over many parameters in list launches (PyTorch's multi-tensor `foreach`
//! Adam and SGD): [`Optimizer::fused_list_step`] runs the fused steps of
//! [`Optimizer::fused_step`] for up to eight parameters per launch
//! ([`Device::adam_update_list`], [`Device::momentum_update_list`]), with each parameter's
//! state, step count and values exactly as its own fused step keeps them.

use tl_tape_cuda::device::{AdamSlot, MomentumSlot};
use tl_tape_cuda::{Buffer, Device};

use super::vec_ops::{adam_update, momentum_update};
use super::{DeviceOps, Fused, Kind, Optimizer, VecOps};
use crate::Result;

impl Optimizer {
    /// Whether this step's parameters can step in list launches: the conditions of
    /// [`Optimizer::fused_step`] (Adam, AdamW or momentum SGD; no clipping; the gate
    /// `tl_tape_cuda::gates::fused_optimizer` on), no finite check (that step runs on copies,
    /// one parameter at a time), and valid hyper-parameters and learning rate (otherwise the
    /// per-parameter path reports the error, naming the parameter).
    pub(crate) fn fused_list_ok(&self) -> bool {
        let rule = match self.kind {
            Kind::Adam { .. } => true,
            Kind::Sgd { momentum, .. } => momentum != 0.0,
            Kind::RmsProp { .. } | Kind::Adagrad { .. } => false,
        };
        rule && !self.finite_check
            && self.clip_value.is_none()
            && self.grad_coef() == 1.0
            && tl_tape_cuda::gates::fused_optimizer()
            && self.validate().is_ok()
            && self.lr_now().is_ok()
    }

    /// One step of every parameter of `params` (`(key, w, g)`: the parameter's state key, its
    /// device value, updated in place, and its gradient), on [`Optimizer::fused_list_ok`]'s
    /// word: the Adam(W) steps in one [`Device::adam_update_list`] call, the momentum steps
    /// after the first in one [`Device::momentum_update_list`] call, the first momentum steps
    /// (which make the buffer) one parameter at a time as the composed rule runs them. Each
    /// parameter's values, state and step count are those of its own step
    /// ([`Optimizer::update`]).
    pub(crate) fn fused_list_step<D: Device>(
        &mut self,
        dev: &mut D,
        params: &[((u64, usize), Buffer, Buffer)],
    ) -> Result<()> {
        let (lr, wd, kind) = (self.lr_now()?, self.weight_decay, self.kind);
        let mut ops = DeviceOps(&mut *dev);
        let (mut adam, mut momentum, mut coefs) = (Vec::new(), Vec::new(), None);
        let mut collect = || -> Result<()> {
            for &(key, mut w, g) in params {
                let Some(c) = self.fused_coefs(&mut ops, key, &g, lr, wd, kind) else {
                    self.update_inner(&mut ops, key, &mut w, &g)?;
                    continue;
                };
                let bufs = &mut self.state.entry(key).or_default().bufs;
                let mut state = |k: usize| -> Result<Buffer> {
                    Ok(*<DeviceOps<D> as VecOps>::state_mut(&mut bufs[k])?)
                };
                match c? {
                    Fused::Adam(c) => adam.push(AdamSlot {
                        w,
                        m: state(0)?,
                        v: state(1)?,
                        g,
                        c: adam_update(&c),
                    }),
                    Fused::Momentum(c) => {
                        momentum.push(MomentumSlot { w, b: state(0)?, g });
                        coefs = Some(momentum_update(&c));
                    }
                }
            }
            Ok(())
        };
        // After an error (an allocation of a first step's state), the parameters before it
        // still take the steps they have counted, as one step per parameter would have run
        // them; the error is returned.
        let r = collect();
        let mut launch = || -> tl_tape_cuda::Result<()> {
            if !adam.is_empty() {
                dev.adam_update_list(&adam)?;
            }
            if let Some(c) = coefs {
                dev.momentum_update_list(&c, &momentum)?;
            }
            Ok(())
        };
        let launched = launch();
        r.and(launched.map_err(Into::into))
    }
}
