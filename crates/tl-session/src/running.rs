//! BatchNorm's running-statistics update of two buffer parameters ([`Train::update_running`]):
//! the checks both sessions make, the host computation (the CPU backends), and the eager
//! session's call. The device computation is `Device::running_update_moments` on the
//! parameters' resident mirrors ([`ParamStore::update_running_on_device`]), one launch for both;
//! the linked session's call is in `linked/running.rs`.
//!
//! [`Train::update_running`]: crate::Train::update_running

use tl_spec::ops::norm::{RunningStat, running_momentum, running_update};
use tl_spec::{Scalar, Shape, Tensor};

use crate::eager::on_engine;
use crate::params::ParamStore;
use crate::{Error, Param, Result, Session, TensorRef};

/// The API call, in errors.
pub(crate) const WHAT: &str = "update_running";

/// Check that `mean` and `var` are two distinct buffers of this session (they do not require
/// grad) of one shape S, that `moments` is (2, S…), and that the momentum is in [0, 1].
pub(crate) fn check<T: Scalar>(
    params: &ParamStore<T>,
    [mean, var]: [&Param; 2],
    moments: &Shape,
    momentum: f64,
) -> Result<()> {
    for p in [mean, var] {
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
    }
    if mean.index == var.index {
        return Err(Error::Usage {
            what: WHAT,
            detail: format!(
                "the running mean and the running variance are the same parameter (#{})",
                mean.index
            ),
        });
    }
    let shape = params.slots[mean.index].host.shape();
    let var_shape = params.slots[var.index].host.shape();
    if var_shape != shape {
        return Err(Error::Shape {
            what: WHAT,
            expected: shape.clone(),
            got: var_shape.clone(),
        });
    }
    let rows = Shape::new(&[&[2], shape.dims()].concat());
    if moments != &rows {
        return Err(Error::Shape {
            what: WHAT,
            expected: rows,
            got: moments.clone(),
        });
    }
    running_momentum(WHAT, momentum)?;
    Ok(())
}

/// The update on the host: [`running_update`] per element, rounded once to `T`, the running
/// mean from `moments`' first row ([`RunningStat::Mean`]), the running variance from its second
/// ([`RunningStat::Variance`] of `count`). Returns the new mean and variance.
pub(crate) fn on_host<T: Scalar>(
    [mean, var]: [&Tensor<T>; 2],
    moments: &Tensor<T>,
    momentum: f64,
    count: usize,
) -> Result<[Tensor<T>; 2]> {
    let (mu, v) = moments.data().split_at(mean.numel());
    let fold = |running: &Tensor<T>, stat: &[T], kind| {
        let data = (running.data().iter().zip(stat))
            .map(|(r, s)| T::lit(running_update(r.as_f64(), s.as_f64(), momentum, kind)))
            .collect();
        Tensor::new(running.shape().clone(), data)
    };
    Ok([
        fold(mean, mu, RunningStat::Mean)?,
        fold(var, v, RunningStat::Variance { count })?,
    ])
}

impl<T: Scalar> Session<T> {
    /// Fold `moments`, a (2, C…) tensor of the current pass, into the buffer parameters `mean`
    /// and `var`: [`Train::update_running`](crate::Train::update_running). On a CUDA backend on
    /// the device, one launch for both (each buffer's resident mirror is replaced by its
    /// result; the pass's leaves of them keep the old ones until [`reset`](Self::reset)); on
    /// the CPU on their host values.
    pub fn update_running(
        &mut self,
        mean: &Param,
        var: &Param,
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        self.check(WHAT, moments)?;
        check(&self.params, [mean, var], &moments.shape, momentum)?;
        on_engine!(&mut self.engine,
            cpu(t) => {
                let mo = t.value(moments.id, &moments.shape)?;
                let slots = &self.params.slots;
                let running = [&slots[mean.index].host, &slots[var.index].host];
                let [m, v] = on_host(running, mo, momentum, count)?;
                self.params.write(mean, m)?;
                self.params.write(var, v)
            },
            cuda(t) => {
                let mo = t.value(moments.id, &moments.shape)?.buffer();
                let old = self.params.update_running_on_device(
                    [mean.index, var.index], t.device_mut(), mo, momentum, count,
                )?;
                // The pass's leaves may borrow them: released at reset.
                self.params.retired.extend(old.map(|b| b.buffer()));
                Ok(())
            },
        )
    }
}
