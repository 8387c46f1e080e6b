//! Training controls around [`Runtime::step`]: the step's report, and the controls that live
//! on the optimizer and act inside the fused backward + update — gradient clipping by global
//! norm or by value ([`Optimizer::clip_grad_norm`], [`Optimizer::clip_grad_value`]), a
//! learning-rate [`Schedule`] ([`Optimizer::schedule`]) and a stop on a non-finite loss
//! ([`Optimizer::stop_on_non_finite_loss`]). They run on every session and backend (on CUDA,
//! on the device), and the schedule's position is saved with the optimizer's state
//! ([`Runtime::save_with`]).
//!
//! PyTorch comparison: `loss.backward(); n = clip_grad_norm_(params, max_norm);
//! optimizer.step(); scheduler.step()`, in one call.

use tl_session::{Optimizer, Train};

use crate::error::usage;
use crate::{Parameters, Result, Runtime, Scope, Var};

pub use tl_session::optim::{Schedule, StepStats};

/// What one training step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step's index, from 0 (the schedule's index; [`Optimizer::steps_done`] before it).
    pub step: u64,
    /// The loss, before the update.
    pub loss: f64,
    /// The learning rate the update used (the schedule's rate at this step).
    pub lr: f64,
    /// The total gradient norm before clipping (PyTorch: what `clip_grad_norm_` returns),
    /// when the optimizer clips by norm.
    pub grad_norm: Option<f64>,
}

impl<O: Train> Runtime<O> {
    /// [`Runtime::step`] with its report: the step's index, loss, learning rate and gradient
    /// norm. With [`Optimizer::stop_on_non_finite_loss`] on, a NaN or infinite loss is an
    /// error naming the step, and neither the model nor the optimizer changes.
    pub fn train_step<M, F>(
        &mut self,
        model: &M,
        opt: &mut Optimizer,
        loss_fn: F,
    ) -> Result<StepReport>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
    {
        let loss = self.step(model, opt, loss_fn)?;
        let s = opt.last_step().ok_or_else(|| {
            usage(
                "Runtime::train_step",
                "the session's step left no report (a session without the optimizer's step hooks)",
            )
        })?;
        Ok(StepReport {
            step: s.step,
            loss,
            lr: s.lr,
            grad_norm: s.grad_norm,
        })
    }
}
