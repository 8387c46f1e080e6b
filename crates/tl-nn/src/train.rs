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
//!
//! Gradient accumulation ([`Runtime::step_accumulated`]): one step from the mean gradient of
//! several micro-batches, each a pass of its own, so a batch larger than memory allows
//! trains as one (optax's `MultiSteps`; PyTorch: several `(loss / k).backward()` before one
//! `optimizer.step()`).

use tl_session::{GradReducer, Optimizer, Train};

use crate::error::usage;
use crate::{Parameters, Result, Runtime, Scope, Var};

pub use tl_session::optim::{Schedule, StepStats};

/// The name [`Runtime::step_accumulated`]'s errors give.
const CALL: &str = "Runtime::step_accumulated";

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

impl<O: Train> Runtime<O> {
    /// One optimizer step from `micro_batches` passes: `loss_fn(scope, i)` records micro-batch
    /// i's scalar loss in a training pass of its own (its values go when the pass ends), and
    /// the step (clipping, schedule, update: as in [`Runtime::step`]) reads the mean of their
    /// gradients, `(g₀ + g₁ + … + g_{k−1}) / k`, summed in the parameters' type in micro-batch
    /// order and divided once. Returns the mean of the micro-batches' losses. With equal
    /// micro-batches and a loss that is a mean over its batch, this is the step on their union
    /// (to f32's rounding of the sum); one micro-batch is [`Runtime::step`] bit for bit. The
    /// optimizer counts one step; BatchNorm's running statistics move once per micro-batch
    /// (as in PyTorch); [`Optimizer::last_step`]'s loss is the last micro-batch's.
    ///
    /// Each pass records the model's parameters (the same gradient layout every time). An
    /// error in any pass (a forward error, a non-finite loss with
    /// [`Optimizer::stop_on_non_finite_loss`]) stops here and leaves the trainable parameters
    /// and the optimizer as they were (BatchNorm's running statistics keep the moves of the
    /// passes that ran, as a failed [`Runtime::step`] keeps its pass's). On the CUDA device
    /// (`Backend::Cuda`) the sum stays in device memory: each pass adds its gradients to it
    /// there (eight parameters a launch) and the last divides on the device, so no gradient
    /// is copied to the host (the same bits as the host's sum). On the simulation device, and
    /// in a data-parallel group, the gradients are summed on the host (downloaded after each
    /// pass).
    ///
    /// In a data-parallel group ([`Runtime::data_parallel`]) each rank accumulates its own
    /// micro-batches without communicating, and the last pass is the group's step: this rank's
    /// mean, then the exchange and the mean over the ranks (the host path, whatever the
    /// engine), so the update reads the mean over every rank's micro-batches (PyTorch: DDP's
    /// `no_sync()` for all but the last micro-batch). A rank's failure in any pass is every
    /// rank's error, and no rank updates; a `model` with a parameter outside the one the group
    /// was set up with is such a failure.
    ///
    /// PyTorch: `for i in range(k): (loss_fn(i) / k).backward()`, then `optimizer.step();
    /// optimizer.zero_grad()`.
    pub fn step_accumulated<M, F>(
        &mut self,
        model: &M,
        opt: &mut Optimizer,
        micro_batches: usize,
        mut loss_fn: F,
    ) -> Result<f64>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnMut(&Scope<'g, O>, usize) -> Result<Var<'g, O>>,
    {
        if micro_batches == 0 {
            return Err(usage(CALL, "need at least one micro-batch, got 0"));
        }
        let grouped = self.group.is_some();
        // A group's last pass reduces through the host (`StepReducer`): its sum stays there.
        let mut sum = Summed::<O::T>::new(!grouped);
        let r = self.accumulate(model, opt, micro_batches, &mut sum, &mut loss_fn);
        // A pass that failed leaves the sum where it was: give its device buffers back.
        let kept = sum.take_device();
        if !kept.is_empty() {
            self.borrow_mut().release_device_buffers(&kept);
        }
        if r.is_ok() {
            self.steps_taken += 1;
        }
        r
    }

    /// The passes of [`Runtime::step_accumulated`], `sum` the running sum of their gradients.
    fn accumulate<M, F>(
        &mut self,
        model: &M,
        opt: &mut Optimizer,
        micro_batches: usize,
        sum: &mut Summed<O::T>,
        loss_fn: &mut F,
    ) -> Result<f64>
    where
        M: Parameters + ?Sized,
        F: for<'g> FnMut(&Scope<'g, O>, usize) -> Result<Var<'g, O>>,
    {
        let grouped = self.group.is_some();
        let mut losses = 0.0;
        for i in 0..micro_batches {
            let last = i + 1 == micro_batches;
            let begun = self
                .check_group_model(CALL, model)
                .and_then(|()| self.begin(model, true, true));
            let forward = begun.and_then(|()| self.training_loss(CALL, opt, |s| loss_fn(s, i)));
            let r = if last {
                let mut mean = Mean {
                    sum: &mut *sum,
                    count: micro_batches,
                };
                // One micro-batch: the last pass is `Runtime::step`'s, with no hook of its own.
                let pre = (micro_batches > 1).then_some(&mut mean as &mut dyn GradReducer<O::T>);
                match grouped {
                    // In a group the last pass is the group's step: this rank's mean over its
                    // micro-batches, then the exchange and the mean over the ranks.
                    true => self.dist_backward_step(forward, opt, pre),
                    false => forward.and_then(|loss| {
                        let mut s = self.borrow_mut();
                        Ok(s.backward_step_reduced_then_reset(&loss, opt, pre)?)
                    }),
                }
            } else {
                let local = forward.and_then(|loss| {
                    let mut s = self.borrow_mut();
                    Ok(s.backward_grads_then_reset(&loss, opt, &mut *sum)?)
                });
                match local {
                    // A failure in a group is told to every rank: their step fails too.
                    Err(e) if grouped => self.dist_backward_step(Err(e), opt, None),
                    local => local,
                }
            };
            self.end();
            losses += r?;
        }
        Ok(losses / micro_batches as f64)
    }
}

/// The running sum of the micro-batches' gradients, one buffer per trainable parameter leaf
/// (every pass records the model's parameters in the same order: `Runtime::begin`, so the
/// layout is the same in each): on the host, or on the CUDA device where the gradients are
/// (features `cuda`, `cuda-emu`) when `on_device` allows it. The device buffers outlive the
/// passes: the last pass's [`Mean`] releases them, [`Runtime::step_accumulated`] after a
/// failed pass.
struct Summed<T> {
    host: Vec<Vec<T>>,
    /// Whether the sum may live on the CUDA device.
    #[cfg_attr(not(any(feature = "cuda", feature = "cuda-emu")), allow(dead_code))]
    on_device: bool,
    device: Vec<tl_tape_cuda::Buffer>,
}

impl<T> Summed<T> {
    fn new(on_device: bool) -> Self {
        Summed {
            host: Vec::new(),
            on_device,
            device: Vec::new(),
        }
    }

    /// The device buffers of the sum, which the caller now releases.
    fn take_device(&mut self) -> Vec<tl_tape_cuda::Buffer> {
        std::mem::take(&mut self.device)
    }
}

impl<T: tl_spec::Scalar> GradReducer<T> for Summed<T> {
    /// Add this pass's gradients to the sum (the first pass's are the sum).
    fn reduce(&mut self, grads: &mut [&mut [T]]) -> tl_session::Result<()> {
        if self.host.is_empty() {
            self.host = grads.iter().map(|g| g.to_vec()).collect();
            return Ok(());
        }
        for (s, g) in self.host.iter_mut().zip(grads.iter()) {
            for (a, &b) in s.iter_mut().zip(g.iter()) {
                *a += b;
            }
        }
        Ok(())
    }

    /// The same sum on the device: the first pass's gradients copied, then `sum ← sum + g`
    /// (`axpy_assign_list` with c = 1: `s + 1·g` rounds as the host's `s + g`).
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn reduce_on_device(
        &mut self,
        dev: &mut tl_tape_cuda::CudaDevice,
        grads: &mut [tl_tape_cuda::Buffer],
    ) -> Option<tl_session::Result<()>> {
        use tl_tape_cuda::Device;
        if !self.on_device || !self.host.is_empty() || T::NAME != "f32" {
            return None;
        }
        if self.device.is_empty() {
            for &g in grads.iter() {
                match dev.copy(g) {
                    Ok(c) => self.device.push(c),
                    Err(e) => return Some(Err(e.into())),
                }
            }
            return Some(Ok(()));
        }
        if self.device.len() != grads.len() {
            return Some(Err(layout_changed(self.device.len(), grads.len())));
        }
        let pairs: Vec<_> = self
            .device
            .iter()
            .copied()
            .zip(grads.iter().copied())
            .collect();
        Some(dev.axpy_assign_list(1.0, &pairs).map_err(Into::into))
    }
}

/// The error for a pass whose gradients are not laid out as the first pass's.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
fn layout_changed(sum: usize, pass: usize) -> tl_session::Error {
    tl_session::Error::Usage {
        what: CALL,
        detail: format!(
            "a micro-batch's pass has {pass} gradient buffer(s) where the first had {sum} (every pass must use the same trainable parameters)"
        ),
    }
}

/// The last pass's hook (two or more micro-batches): its gradients become `(sum + g) / count`,
/// what the update reads; `sum` has their layout (every pass records the same parameters).
struct Mean<'a, T> {
    sum: &'a mut Summed<T>,
    count: usize,
}

impl<T: tl_spec::Scalar> GradReducer<T> for Mean<'_, T> {
    fn reduce(&mut self, grads: &mut [&mut [T]]) -> tl_session::Result<()> {
        let k = T::lit(self.count as f64);
        for (g, sum) in grads.iter_mut().zip(&self.sum.host) {
            g.iter_mut().zip(sum).for_each(|(v, &s)| *v = (s + *v) / k);
        }
        Ok(())
    }

    /// `(g + sum) / count` on the device where the sum is there: `g ← g + 1·sum` in place
    /// (`axpy_assign_list`), then the division (`dist::reduce::divide_on_device`); the host's
    /// f32 operations, the same bits. The sum's buffers released.
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn reduce_on_device(
        &mut self,
        dev: &mut tl_tape_cuda::CudaDevice,
        grads: &mut [tl_tape_cuda::Buffer],
    ) -> Option<tl_session::Result<()>> {
        use tl_tape_cuda::Device;
        if self.sum.device.is_empty() {
            return None;
        }
        let sums = self.sum.take_device();
        let r = match sums.len() == grads.len() {
            true => {
                let pairs: Vec<_> = grads.iter().copied().zip(sums.iter().copied()).collect();
                dev.axpy_assign_list(1.0, &pairs)
                    .and_then(|()| crate::dist::reduce::divide_on_device(dev, grads, self.count))
                    .map_err(Into::into)
            }
            false => Err(layout_changed(sums.len(), grads.len())),
        };
        for s in sums {
            dev.release(s);
        }
        Some(r)
    }
}
