//! Running-statistics updates inside a training step (BatchNorm's): recorded while the step's
//! forward pass runs and applied once the forward and its loss are through, so a step that
//! stops there (a non-finite loss with [`Optimizer::stop_on_non_finite_loss`], a closure that
//! fails after its forward) leaves them as they were, as it leaves the parameters. Outside a
//! step ([`Runtime::forward_train`], [`Runtime::record`]) they apply at once.

use tl_session::{Optimizer, Param, TensorRef, Train};
use tl_spec::Scalar;

use crate::{Error, Result, Runtime};

/// One update waiting for its step's forward to succeed.
pub(crate) struct Deferred {
    mean: Param,
    var: Param,
    moments: TensorRef,
    momentum: f64,
    count: usize,
    /// The layer, for an error (`BatchNorm "bn1"`).
    layer: String,
}

impl<O: Train> Runtime<O> {
    /// Fold the batch `moments` ((2, C…): `batchMoments`) into the buffers `mean` and `var`
    /// ([`Train::update_running`]) for `layer` (its label, named by an error): inside a
    /// training step once its forward and loss are through, else now.
    pub(crate) fn update_running(
        &self,
        layer: String,
        [mean, var]: [&Param; 2],
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        let update = Deferred {
            mean: mean.clone(),
            var: var.clone(),
            moments: moments.clone(),
            momentum,
            count,
            layer,
        };
        match self.deferred.borrow_mut().as_mut() {
            Some(waiting) => {
                waiting.push(update);
                Ok(())
            }
            None => self.apply_running(update),
        }
    }

    fn apply_running(&self, u: Deferred) -> Result<()> {
        let r = self
            .borrow_mut()
            .update_running(&u.mean, &u.var, &u.moments, u.momentum, u.count);
        r.map_err(|e| Error::Layer {
            layer: u.layer,
            source: Box::new(e.into()),
        })
    }

    /// Run a step's `forward` (returning its scalar loss) with the running-statistics updates
    /// it makes held back, then apply them in order unless the step stops at its loss: `opt`
    /// refuses a non-finite loss ([`Optimizer::stops_on_non_finite_loss`]) and this one is
    /// (the session's step then returns that error). A failed forward drops them.
    pub(crate) fn deferring_running(
        &self,
        opt: &Optimizer,
        forward: impl FnOnce() -> Result<TensorRef>,
    ) -> Result<TensorRef> {
        *self.deferred.borrow_mut() = Some(Vec::new());
        let loss = forward();
        let waiting = self.deferred.borrow_mut().take().unwrap_or_default();
        let loss = loss?;
        if waiting.is_empty() {
            return Ok(loss);
        }
        if opt.stops_on_non_finite_loss() {
            let value = self.borrow_mut().read(&loss)?;
            if !value.item()?.as_f64().is_finite() {
                return Ok(loss);
            }
        }
        for u in waiting {
            self.apply_running(u)?;
        }
        Ok(loss)
    }
}
