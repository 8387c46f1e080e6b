//! The running-statistics update of a buffer parameter ([`Train::update_running`]): the
//! checks both sessions make, the host computation (the CPU backends), and the eager session's
//! call. The device computation is `Device::running_update` on the parameter's resident mirror
//! ([`ParamStore::update_running_on_device`]); the linked session's call is in
//! `linked/running.rs`.
//!
//! [`Train::update_running`]: crate::Train::update_running

use tl_spec::ops::norm::{RunningStat, running_momentum, running_update};
use tl_spec::{Scalar, Shape, Tensor};

use crate::eager::on_engine;
use crate::params::ParamStore;
use crate::{Error, Param, Result, Session, TensorRef};

/// The API call, in errors.
pub(crate) const WHAT: &str = "update_running";

/// Check that `p` is a buffer of this session (it does not require grad), that the statistic
/// has its shape, and that the momentum is in [0, 1].
pub(crate) fn check<T: Scalar>(
    params: &ParamStore<T>,
    p: &Param,
    stat: &Shape,
    momentum: f64,
) -> Result<()> {
    let slot = params.slot(WHAT, p)?;
    if slot.requires_grad {
        let name = slot
            .name
            .as_deref()
            .map_or(format!("#{}", p.index), |n| format!("'{n}'"));
        return Err(Error::Usage {
            what: WHAT,
            detail: format!(
                "parameter {name} requires grad; only a buffer (a parameter that does not, such as BatchNorm's running_mean) takes a running-statistics update"
            ),
        });
    }
    if stat != slot.host.shape() {
        return Err(Error::Shape {
            what: WHAT,
            expected: slot.host.shape().clone(),
            got: stat.clone(),
        });
    }
    running_momentum(WHAT, momentum)?;
    Ok(())
}

/// The update on the host: [`running_update`] per element, rounded once to `T`.
pub(crate) fn on_host<T: Scalar>(
    running: &Tensor<T>,
    stat: &Tensor<T>,
    momentum: f64,
    kind: RunningStat,
) -> Result<Tensor<T>> {
    let data = (running.data().iter().zip(stat.data()))
        .map(|(r, s)| T::lit(running_update(r.as_f64(), s.as_f64(), momentum, kind)))
        .collect();
    Ok(Tensor::new(running.shape().clone(), data)?)
}

impl<T: Scalar> Session<T> {
    /// Fold `stat`, a tensor of the current pass with the buffer's shape, into the buffer
    /// parameter `buffer`: [`Train::update_running`](crate::Train::update_running). On a CUDA
    /// backend on the device (the buffer's resident mirror is replaced by the result; the pass's
    /// leaves of it keep the old one until [`reset`](Self::reset)); on the CPU on its host
    /// value.
    pub fn update_running(
        &mut self,
        buffer: &Param,
        stat: &TensorRef,
        momentum: f64,
        kind: RunningStat,
    ) -> Result<()> {
        self.check(WHAT, stat)?;
        check(&self.params, buffer, &stat.shape, momentum)?;
        on_engine!(&mut self.engine,
            cpu(t) => {
                let s = t.value(stat.id, &stat.shape)?;
                let new = on_host(&self.params.slots[buffer.index].host, s, momentum, kind)?;
                self.params.write(buffer, new)
            },
            cuda(t) => {
                let s = t.value(stat.id, &stat.shape)?.buffer();
                let old = self.params.update_running_on_device(
                    buffer.index, t.device_mut(), s, momentum, kind,
                )?;
                // The pass's leaves may borrow it: released at reset.
                self.params.retired.push(old.buffer());
                Ok(())
            },
        )
    }
}
