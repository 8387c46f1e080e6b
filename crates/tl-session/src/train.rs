//! [`Train`]: what one training loop needs beyond [`Ops`], implemented by both sessions, so the
//! same loop (tl-nn's `Runtime::step`) drives the eager session and the linked one.
//!
//! The eager session steps from its tape's gradients (on a device, the sparse backward's
//! parameter gradients); the linked session compiles its recorded graph into the tape of its
//! [`Backend`] (`LinkedSession::set_backend`) and steps from the compiled tape's gradients.

use tl_spec::Tensor;
use tl_tape_cuda::{MemoryUsage, Traffic};

use crate::linked::{on_compiled, step_on_tape};
use crate::optim::StateDict;
use crate::{LinkedSession, NatVecRef, Ops, Optimizer, Param, Result, Session, Stamp, TensorRef};

/// The calls a training loop makes besides recording ops. PyTorch comparison: the parts of
/// `loss.backward(); optimizer.step(); optimizer.zero_grad()` and `model.state_dict()` that
/// live in the session here.
pub trait Train: Ops {
    /// Drop the recorded forward pass: every tensor handle and Nat input becomes invalid (a
    /// clear error if used); parameters keep their values. On CUDA, releases the pass's buffers.
    fn reset(&mut self);

    /// The value of the scalar `loss`, then backward from it and one step of `opt` on every
    /// trainable parameter the pass used. PyTorch: `loss.item(); loss.backward();
    /// optimizer.step()`. A loss that does not require grad (nothing trainable behind it: a
    /// pass without gradients, or every parameter frozen) is an error, as in PyTorch. Afterwards the parameters' gradients can be read (`Session::grad`);
    /// the eager session on a device keeps only those (its tape's sparse backward, which frees
    /// every other gradient as it goes: PyTorch's `.grad` of leaves), so reading another
    /// tensor's gradient needs `Session::backward` instead.
    fn backward_step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> Result<f64> {
        self.backward_step_reduced(loss, opt, None)
    }

    /// [`Train::backward_step`] with `reduce` called between the backward and the update, on
    /// the gradients the update will read: one buffer per trainable parameter leaf of the pass
    /// (a parameter used twice has two), parameters in creation order, each one's leaves in
    /// recording order. What `reduce` leaves in them is what the optimizer's clipping and
    /// update see; an error from it stops the step before any parameter or optimizer state
    /// changes. Data-parallel training averages the gradients across processes here
    /// (tl-nn's `Runtime::data_parallel`). PyTorch: DistributedDataParallel's all-reduce
    /// between `loss.backward()` and `optimizer.step()`.
    ///
    /// `reduce` is called on every backend of both sessions. On a device the gradients stay in
    /// device memory when `reduce` takes them there (`GradReducer::reduce_on_device`, features
    /// `cuda`, `cuda-emu`: NCCL, on the CUDA device); otherwise they go through the host
    /// (downloaded, reduced, uploaded back).
    fn backward_step_reduced(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        reduce: Option<&mut dyn GradReducer<Self::T>>,
    ) -> Result<f64> {
        self.backward_step_pass(loss, opt, reduce, StepPass::KeepOpen)
    }

    /// [`Train::backward_step_reduced`], then [`Train::reset`] (also on error): the step is the
    /// pass's last act, so nothing can read the pass's values after the update, and on the CPU
    /// each parameter's new values are written over its old ones, where a step that leaves the
    /// pass open writes them into a new buffer beside the old values the pass holds (one
    /// parameter-sized set less at a training step's peak: docs/performance.md, "AVX-512 VM",
    /// the memory per step). The same loss, parameters and optimizer state, bit for bit. tl-nn's
    /// `Runtime::step` steps this way. PyTorch: `optimizer.step()` updating `p` in place.
    fn backward_step_reduced_then_reset(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        reduce: Option<&mut dyn GradReducer<Self::T>>,
    ) -> Result<f64> {
        self.backward_step_pass(loss, opt, reduce, StepPass::End)
    }

    /// Backward from `loss` without an update, then [`Train::reset`] (also on error): `sink`
    /// gets the gradients a step would read ([`Train::backward_step_reduced`]'s layout: one
    /// buffer per trainable parameter leaf of the pass, on the host), and nothing else
    /// happens to the parameters or to `opt`, which only checks the loss
    /// ([`Optimizer::stop_on_non_finite_loss`]). Returns the loss. An error from `sink` is
    /// returned as it is. On the CUDA device (features `cuda`, `cuda-emu`) a sink that works
    /// there (`GradReducer::reduce_on_device`) gets the gradient buffers where they are,
    /// and nothing is downloaded. PyTorch: `loss.backward()` without `optimizer.step()` (the
    /// inner steps of gradient accumulation: tl-nn's `Runtime::step_accumulated`).
    fn backward_grads_then_reset(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        sink: &mut dyn GradReducer<Self::T>,
    ) -> Result<f64> {
        /// Hands the gradients to `sink`, then stops the step before its update with an error
        /// the caller recognises by `handed`.
        struct Stop<'a, T> {
            sink: &'a mut dyn GradReducer<T>,
            handed: Option<Result<()>>,
        }
        impl<T> Stop<'_, T> {
            /// Keep the sink's outcome `r`; the step stops here either way.
            fn stop(&mut self, r: Result<()>) -> Result<()> {
                let out = match &r {
                    Ok(()) => Err(crate::Error::Usage {
                        what: "backward_grads_then_reset",
                        detail: "the gradients were handed over; no update follows".into(),
                    }),
                    Err(e) => Err(e.clone()),
                };
                self.handed = Some(r);
                out
            }
        }
        impl<T> GradReducer<T> for Stop<'_, T> {
            fn reduce(&mut self, grads: &mut [&mut [T]]) -> Result<()> {
                let r = self.sink.reduce(grads);
                self.stop(r)
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            fn reduce_on_device(
                &mut self,
                dev: &mut tl_tape_cuda::CudaDevice,
                grads: &mut [tl_tape_cuda::Buffer],
            ) -> Option<Result<()>> {
                let r = self.sink.reduce_on_device(dev, grads)?;
                Some(self.stop(r))
            }
        }
        let mut stop = Stop { sink, handed: None };
        // The step reads the loss once, before the backward (and resets the pass either way).
        let r = self.backward_step_pass(loss, opt, Some(&mut stop), StepPass::End);
        match (r, stop.handed) {
            // The step stopped where it was told to: after the gradients, before the update,
            // with the loss it read.
            (Err(_), Some(handed)) => handed.and_then(|()| {
                opt.take_observed_loss().ok_or_else(|| crate::Error::Usage {
                    what: "backward_grads_then_reset",
                    detail: "the session handed over the gradients without reading the loss".into(),
                })
            }),
            (Err(e), None) => Err(e),
            (Ok(_), _) => Err(crate::Error::Usage {
                what: "backward_grads_then_reset",
                detail: "the session stepped without handing over the gradients".into(),
            }),
        }
    }

    /// The step behind [`Train::backward_step_reduced`] (`pass`: [`StepPass::KeepOpen`]) and
    /// [`Train::backward_step_reduced_then_reset`] ([`StepPass::End`]).
    fn backward_step_pass(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        reduce: Option<&mut dyn GradReducer<Self::T>>,
        pass: StepPass,
    ) -> Result<f64>;

    /// The value of `r`, computed the fast way (the eager tape's value; for the linked session,
    /// read from the graph compiled into its backend). PyTorch: `t.detach().cpu()`.
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<Self::T>>;

    /// A parameter's current value (synced back from the device when a device step changed it).
    fn param_value(&mut self, p: &Param) -> Result<Tensor<Self::T>>;

    /// Overwrite a parameter's value (same shape). PyTorch: `p.data.copy_(value)`.
    fn set_param(&mut self, p: &Param, value: Tensor<Self::T>) -> Result<()>;

    /// BatchNorm's running statistics: fold `moments`, a (2, C…) tensor of the current pass
    /// (the batch means, then the biased batch variances of `count` elements each: the op
    /// `batchMoments`), into the buffer parameters `mean` and `var` (two parameters of shape
    /// (C…) that do not require grad), per element `buffer ← (1 − momentum)·buffer +
    /// momentum·s`: for `mean` s is the batch mean, for `var` the batch variance made unbiased
    /// (`·count/(count − 1)`; where that is NaN, `count` ≤ 1 or a NaN variance, the buffer keeps
    /// its value), computed in f64 and rounded once to the buffer's type
    /// ([`running_update`](tl_spec::ops::norm::running_update) with
    /// [`RunningStat::Mean`](tl_spec::ops::norm::RunningStat::Mean) and
    /// [`RunningStat::Variance`](tl_spec::ops::norm::RunningStat::Variance); on a CUDA backend
    /// the device's f32). On a CUDA backend the update runs on the device, where the moments
    /// and the buffers' resident mirrors live, one kernel launch for both buffers: nothing is
    /// downloaded or uploaded. Leaves of the buffers already recorded in this pass keep the
    /// value they were recorded with. Errors: a parameter that requires grad, the same
    /// parameter twice, buffers of two shapes, moments not (2, C…), a momentum outside [0, 1].
    /// PyTorch: `running_mean.mul_(1 − m).add_(μ, alpha=m)` and `running_var.mul_(1 −
    /// m).add_(var·count/(count − 1), alpha=m)` under `torch.no_grad()` (`nn.BatchNorm2d`'s
    /// training forward; two kernels on CUDA).
    fn update_running(
        &mut self,
        mean: &Param,
        var: &Param,
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()>;

    /// The name a parameter was created with.
    fn param_name(&self, p: &Param) -> Result<Option<String>>;

    /// Whether optimizer steps update the parameter. PyTorch: `p.requires_grad`.
    fn requires_grad(&self, p: &Param) -> Result<bool>;

    /// Freeze (`false`) or unfreeze (`true`) a parameter from the next recorded pass on.
    /// PyTorch: `p.requires_grad_(flag)`.
    fn set_requires_grad(&mut self, p: &Param, requires_grad: bool) -> Result<()>;

    /// Record a block of Nat inputs (class labels, token ids) for the ops that read them.
    fn record_nat_vec(&mut self, values: &[usize]) -> NatVecRef;

    /// `opt`'s state for this session's parameters (PyTorch: `optimizer.state_dict()`).
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict>;

    /// Load `state` into `opt` for this session's parameters (PyTorch:
    /// `optimizer.load_state_dict(state)`).
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()>;

    /// The device allocator's counters, on a CUDA backend (`None` on the CPU). For the linked
    /// session: the device its steps compile onto, once a step or read has run.
    fn memory_usage(&self) -> Option<MemoryUsage>;

    /// The device's kernel launches and host↔device copies so far, on a CUDA backend (`None`
    /// on the CPU); subtract two readings for a step's work. For the linked session: the device
    /// its steps compile onto, once a step or read has run.
    fn traffic(&self) -> Option<Traffic>;

    /// Release buffers of this session's device that outlived the pass they were made in: a
    /// gradient hook's own buffers (`GradReducer::reduce_on_device`, features `cuda`,
    /// `cuda-emu`: tl-nn's gradient accumulation keeps its running sum on the device between
    /// passes), when nothing else will. Buffers the device does not hold are skipped; nothing
    /// happens on the CPU backend.
    fn release_device_buffers(&mut self, bufs: &[tl_tape_cuda::Buffer]);

    /// This session's id and its current pass (the number of resets so far); handles made
    /// in an earlier pass are stale.
    fn stamp(&self) -> Stamp;

    /// The counter the next random op (dropout's mask) will use with the session's seed; it
    /// survives `reset`. A checkpoint keeps it so a resumed run draws the masks it would
    /// have drawn (tl-nn's `Runtime::save_with` and `load_with`).
    fn random_counter(&self) -> u64;

    /// Set the random counter (to resume a run).
    fn set_random_counter(&mut self, counter: u64);
}

/// What becomes of a training step's pass ([`Train::backward_step_pass`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPass {
    /// The pass stays open: its values read as before the step (on the CPU the update writes
    /// the new parameter values beside the old ones the pass holds).
    KeepOpen,
    /// The step is the pass's last act: the pass is reset afterwards, also on error, and the
    /// CPU update writes the parameters in place.
    End,
}

/// What [`Train::backward_step_reduced`] calls on a step's gradients before the update (any
/// `FnMut(&mut [&mut [T]]) -> Result<()>` is one, on the host).
pub trait GradReducer<T> {
    /// Reduce the step's gradients on the host: one slice per trainable parameter leaf, in
    /// [`Train::backward_step_reduced`]'s order.
    fn reduce(&mut self, grads: &mut [&mut [T]]) -> Result<()>;

    /// Reduce the step's gradients where they are, on the CUDA device `dev` (features `cuda`,
    /// `cuda-emu`): one buffer of `f32` words per leaf, in the same order, each of which the
    /// reducer may replace by another buffer of `dev` of the same length (releasing the one it
    /// replaces). `None`, the default, when this reducer works on the host only: the session
    /// then downloads the gradients, calls [`GradReducer::reduce`] and uploads them back.
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn reduce_on_device(
        &mut self,
        dev: &mut tl_tape_cuda::CudaDevice,
        grads: &mut [tl_tape_cuda::Buffer],
    ) -> Option<Result<()>> {
        let _ = (dev, grads);
        None
    }
}

impl<T, F: FnMut(&mut [&mut [T]]) -> Result<()>> GradReducer<T> for F {
    fn reduce(&mut self, grads: &mut [&mut [T]]) -> Result<()> {
        self(grads)
    }
}

/// The error for a training step from a loss that does not require grad: nothing it depends
/// on was recorded with gradients (a pass under `Ops::set_grad_enabled(false)`, or every
/// parameter frozen), so the step would change nothing. PyTorch raises at `loss.backward()`
/// too.
pub(crate) fn no_grad_loss(loss: &TensorRef) -> crate::Error {
    crate::Error::Usage {
        what: "backward_step",
        detail: format!(
            "the loss (node {}) does not require grad: no trainable parameter or input it depends on was recorded with gradients on (a pass under set_grad_enabled(false), or every parameter frozen), so the step would change nothing",
            loss.id()
        ),
    }
}

/// The error for a gradient hook called without a training step's gradients (the eager
/// session's hook runs after its own `backward_params`, so this is a bug in the caller).
pub(crate) fn no_step_gradients() -> crate::Error {
    crate::Error::Usage {
        what: "backward_step_reduced",
        detail: "no gradients of a training step's backward to reduce".into(),
    }
}

/// The scalar value of a loss tensor as `f64`.
fn loss_value<T: tl_spec::Scalar>(v: Tensor<T>) -> Result<f64> {
    Ok(tl_spec::Scalar::as_f64(v.item()?))
}

impl<T: tl_spec::Scalar> Train for Session<T> {
    fn reset(&mut self) {
        Session::reset(self);
    }
    fn backward_step_pass(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        reduce: Option<&mut dyn GradReducer<T>>,
        pass: StepPass,
    ) -> Result<f64> {
        let stepped = (|| {
            let l = loss_value(self.value(loss)?)?;
            if !self.requires_grad_of(loss) {
                return Err(no_grad_loss(loss));
            }
            // A non-finite loss stops here when the optimizer asks for it, before any change.
            opt.observe_loss(l)?;
            // On a device the sparse sweep: the parameters' gradients only.
            self.backward_params(loss, pass == StepPass::End)?;
            if let Some(reduce) = reduce {
                self.reduce_grads(reduce)?;
            }
            if pass == StepPass::End {
                self.release_pass_values();
            }
            self.step(opt)?;
            Ok(l)
        })();
        if pass == StepPass::End {
            Session::reset(self);
        }
        stepped
    }
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.value(r)
    }
    fn param_value(&mut self, p: &Param) -> Result<Tensor<T>> {
        Session::param_value(self, p)
    }
    fn set_param(&mut self, p: &Param, value: Tensor<T>) -> Result<()> {
        Session::set_param(self, p, value)
    }
    fn update_running(
        &mut self,
        mean: &Param,
        var: &Param,
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        Session::update_running(self, mean, var, moments, momentum, count)
    }
    fn param_name(&self, p: &Param) -> Result<Option<String>> {
        Session::param_name(self, p)
    }
    fn requires_grad(&self, p: &Param) -> Result<bool> {
        Ok(self.params.slot("requires_grad", p)?.requires_grad)
    }
    fn set_requires_grad(&mut self, p: &Param, requires_grad: bool) -> Result<()> {
        self.params.set_requires_grad(p, requires_grad)
    }
    fn record_nat_vec(&mut self, values: &[usize]) -> NatVecRef {
        Session::record_nat_vec(self, values)
    }
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict> {
        Session::optimizer_state(self, opt)
    }
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()> {
        Session::load_optimizer_state(self, opt, state)
    }
    fn memory_usage(&self) -> Option<MemoryUsage> {
        Session::memory_usage(self)
    }
    fn traffic(&self) -> Option<Traffic> {
        Session::traffic(self)
    }
    fn release_device_buffers(&mut self, bufs: &[tl_tape_cuda::Buffer]) {
        Session::release_device_buffers(self, bufs)
    }
    fn stamp(&self) -> Stamp {
        Session::stamp(self)
    }
    fn random_counter(&self) -> u64 {
        Session::random_counter(self)
    }
    fn set_random_counter(&mut self, counter: u64) {
        Session::set_random_counter(self, counter)
    }
}

impl<T: tl_spec::Scalar> LinkedSession<T> {
    /// [`Train::backward_step_reduced`]; with `ends_pass` the compiled tape and the recorded
    /// leaves let go of the parameters' values before a CPU update (which then writes them in
    /// place), and the caller follows with a reset.
    fn train_step(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        mut reduce: Option<&mut dyn GradReducer<T>>,
        ends_pass: bool,
    ) -> Result<f64> {
        self.check_loss("backward_step", loss)?;
        if !self.requires_grad_of(loss) {
            return Err(no_grad_loss(loss));
        }
        // On a CUDA backend the parameters are compiled in as their resident mirrors, the
        // update runs on the device and only the loss is read back; the tape's device comes
        // back for the next step (its pools are reused).
        let uses = self.trainable_uses();
        // The pass's tape if a read compiled part of the graph already.
        let mut compiled = self.compile_pass(self.backend())?;
        let (map, id) = (&compiled.map, loss.id());
        let n_leaves = self.graph().leaves().len();
        // On the CPU, the gradients of the trainable parameter leaves step the host values: in
        // place when the step ends the pass, else into the tape's spare buffers. The gradients
        // go there after it.
        let result = on_compiled!(&mut compiled.tape,
            cpu(tape) => {
                let (l, mut grads) = cpu_grads(tape, &uses, map, id, n_leaves, ends_pass)?;
                let stepped = loss_value(l.clone())
                    .and_then(|v| opt.observe_loss(v))
                    .and_then(|()| match reduce.as_mut() {
                        Some(reduce) => {
                            reduce_leaves(&mut grads, uses.values().flatten(), &mut **reduce)
                        }
                        None => Ok(()),
                    })
                    .and_then(|()| {
                        if ends_pass {
                            // Nothing reads the pass after this step: its tape and leaves let
                            // go of the parameters' values, which the update then overwrites.
                            tape.clear();
                            self.leaves.drain(..).for_each(|v| tape.recycle(v));
                        }
                        tape.with_pool(|| self.step(opt, &grads))
                    });
                grads.into_iter().for_each(|g| tape.recycle(g));
                stepped.map(|()| l)
            },
            cuda(t) => {
                let on_tape = uses_on_tape(&uses, map);
                step_on_tape(&mut self.params, &on_tape, t, map[id], opt, reduce, ends_pass)
            },
        );
        // The device (kept for the next step's pools) comes back whatever the outcome.
        self.recycle(compiled);
        loss_value(result?)
    }
}

impl<T: tl_spec::Scalar> Train for LinkedSession<T> {
    fn reset(&mut self) {
        LinkedSession::reset(self);
    }
    fn backward_step_pass(
        &mut self,
        loss: &TensorRef,
        opt: &mut Optimizer,
        reduce: Option<&mut dyn GradReducer<T>>,
        pass: StepPass,
    ) -> Result<f64> {
        let stepped = self.train_step(loss, opt, reduce, pass == StepPass::End);
        if pass == StepPass::End {
            LinkedSession::reset(self);
        }
        stepped
    }
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.check_handle("read", r)?;
        // Kept for the pass: the next read or the step replays only what is recorded since.
        let compiled = self.compile_pass(self.backend())?;
        let value = compiled.value(r.id());
        self.keep_pass(compiled);
        value
    }
    fn param_value(&mut self, p: &Param) -> Result<Tensor<T>> {
        LinkedSession::param_value(self, p)
    }
    fn set_param(&mut self, p: &Param, value: Tensor<T>) -> Result<()> {
        LinkedSession::set_param(self, p, value)
    }
    fn update_running(
        &mut self,
        mean: &Param,
        var: &Param,
        moments: &TensorRef,
        momentum: f64,
        count: usize,
    ) -> Result<()> {
        LinkedSession::update_running(self, mean, var, moments, momentum, count)
    }
    fn param_name(&self, p: &Param) -> Result<Option<String>> {
        Ok(self.params.slot("param_name", p)?.name.clone())
    }
    fn requires_grad(&self, p: &Param) -> Result<bool> {
        Ok(self.params.slot("requires_grad", p)?.requires_grad)
    }
    fn set_requires_grad(&mut self, p: &Param, requires_grad: bool) -> Result<()> {
        self.params.set_requires_grad(p, requires_grad)
    }
    fn record_nat_vec(&mut self, values: &[usize]) -> NatVecRef {
        LinkedSession::record_nat_vec(self, values)
    }
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict> {
        LinkedSession::optimizer_state(self, opt)
    }
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()> {
        LinkedSession::load_optimizer_state(self, opt, state)
    }
    fn memory_usage(&self) -> Option<MemoryUsage> {
        LinkedSession::memory_usage(self)
    }
    fn traffic(&self) -> Option<Traffic> {
        LinkedSession::traffic(self)
    }
    fn release_device_buffers(&mut self, bufs: &[tl_tape_cuda::Buffer]) {
        LinkedSession::release_device_buffers(self, bufs)
    }
    fn stamp(&self) -> Stamp {
        LinkedSession::stamp(self)
    }
    fn random_counter(&self) -> u64 {
        LinkedSession::random_counter(self)
    }
    fn set_random_counter(&mut self, counter: u64) {
        LinkedSession::set_random_counter(self, counter)
    }
}

/// Each trainable parameter's leaves (`uses`, graph ids) as the compiled tape's ids (`map`).
fn uses_on_tape(
    uses: &std::collections::BTreeMap<usize, Vec<usize>>,
    map: &[usize],
) -> std::collections::BTreeMap<usize, Vec<usize>> {
    uses.iter()
        .map(|(&index, leaves)| (index, leaves.iter().map(|&l| map[l]).collect()))
        .collect()
}

/// The loss (graph id `loss`) and, for a linked step on the CPU tape, one gradient per leaf:
/// the trainable parameter leaves' (`uses`), from sparse reverse accumulation (only they are
/// read out; no zero tensor is made for the other nodes), the other leaves empty. With
/// `ends_pass` the tape's forward values go to its pool as the sweep passes them.
fn cpu_grads<T: tl_spec::Scalar>(
    tape: &mut tl_tape_cpu::Tape<T>,
    uses: &std::collections::BTreeMap<usize, Vec<usize>>,
    map: &[usize],
    loss: usize,
    n_leaves: usize,
    ends_pass: bool,
) -> Result<(Tensor<T>, Vec<Tensor<T>>)> {
    let to = map[loss];
    let value = tape.get(to)?.clone();
    let wanted: Vec<usize> = uses.values().flatten().map(|&l| map[l]).collect();
    let seed = Tensor::scalar(T::one());
    let g = match ends_pass {
        true => tape.backward_params_releasing(to, &seed, &wanted)?,
        false => tape.backward_params(to, &seed, &wanted)?,
    };
    let mut grads = vec![Tensor::vector(Vec::new()); n_leaves];
    for &leaf in uses.values().flatten() {
        if let (Some(slot), Some(gl)) = (grads.get_mut(leaf), g.get(&map[leaf])) {
            *slot = gl.clone();
        }
    }
    Ok((value, grads))
}

/// Hand the gradients of `leaves` (indices into `grads`, in that order) to `reduce`. A leaf
/// listed twice, or out of range, is an error (the hook must see each buffer once).
pub(crate) fn reduce_leaves<'l, T: tl_spec::Scalar>(
    grads: &mut [Tensor<T>],
    leaves: impl IntoIterator<Item = &'l usize>,
    reduce: &mut dyn GradReducer<T>,
) -> Result<()> {
    let mut slots: Vec<Option<&mut Tensor<T>>> = grads.iter_mut().map(Some).collect();
    let mut bufs = Vec::with_capacity(slots.len());
    for &leaf in leaves {
        let t = slots
            .get_mut(leaf)
            .and_then(Option::take)
            .ok_or_else(|| crate::Error::Usage {
                what: "backward_step_reduced",
                detail: format!("gradient leaf {leaf} is missing or listed twice"),
            })?;
        bufs.push(t.data_mut());
    }
    reduce.reduce(&mut bufs)
}
