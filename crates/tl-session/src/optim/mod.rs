//! Optimizers with PyTorch's formulas and defaults: SGD, momentum SGD (`torch.optim.SGD` with
//! `momentum`, `dampening`, `nesterov`), Adam (`torch.optim.Adam`, L2 weight decay added to the
//! gradient), AdamW (`torch.optim.AdamW`, decoupled decay), RMSprop (`torch.optim.RMSprop`, with
//! momentum and centered) and Adagrad (`torch.optim.Adagrad`). Each update is written once
//! against [`VecOps`], so the host path (CPU and linked sessions) and the device path (CUDA
//! sessions: `scale`/`axpy`/`mul`/`div`/`sqrt`/`clamp` on the device) run the same formula.
//!
//! Training controls travel with the optimizer and act inside every session step: gradient
//! clipping by value and by global norm ([`Optimizer::clip_grad_value`],
//! [`Optimizer::clip_grad_norm`]), a learning-rate [`Schedule`] ([`Optimizer::schedule`]) and
//! [`Optimizer::stop_on_non_finite_loss`]; [`Optimizer::last_step`] reports the step's
//! learning rate, gradient norm and loss.
//!
//! State (momentum buffers, Adam moments, the step count) is kept per parameter, keyed by the
//! parameter's session and index, as PyTorch keys it by the parameter object, and stored in the
//! parameter's type as PyTorch stores it ([`StateBuf`]): the host update of an f32 parameter
//! runs its formula in f64 and rounds the new state, like the new parameter, once to f32.
//!
//! Hyper-parameters are validated when the optimizer is built (and again at every step, as the
//! fields are public): a non-finite or negative learning rate, a negative or non-finite weight
//! decay, momentum or betas outside `[0, 1)`, dampening outside `[0, 1]`, Nesterov without
//! momentum, or `eps ≤ 0` is an [`Error::Hyperparameter`](crate::Error). With
//! [`Optimizer::check_finite`] on, a step that would write a non-finite value into a parameter
//! is refused with [`Error::NonFinite`](crate::Error) and leaves the parameter and the
//! optimizer's state as they were.

mod clip;
mod fused_list;
mod rules;
mod schedule;
mod state;
mod vec_ops;

use std::collections::HashMap;

pub use clip::StepStats;
pub use schedule::Schedule;
pub use state::{STATE_BOUND, StateDict};
pub(crate) use state::{export as export_state, import as import_state};
pub use vec_ops::{DeviceOps, HostOps, StateBuf, VecOps};

use tl_spec::{Scalar, Tensor};
use tl_tape_cuda::Device;

use crate::{Error, Result};

/// Which update rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// SGD, with optional momentum. PyTorch: `torch.optim.SGD`.
    Sgd {
        /// Momentum factor μ (0: plain SGD).
        momentum: f64,
        /// Dampening τ applied to the gradient after the first step (PyTorch default 0).
        dampening: f64,
        /// Nesterov momentum (PyTorch default false).
        nesterov: bool,
    },
    /// Adam; `decoupled` makes it AdamW. PyTorch: `torch.optim.Adam` / `torch.optim.AdamW`.
    Adam {
        /// β₁ (default 0.9).
        beta1: f64,
        /// β₂ (default 0.999).
        beta2: f64,
        /// ε (default 1e-8).
        eps: f64,
        /// AdamW's decoupled weight decay (`w ← w·(1 − lr·λ)`) instead of L2 on the gradient.
        decoupled: bool,
    },
    /// RMSprop. PyTorch: `torch.optim.RMSprop`.
    RmsProp {
        /// Smoothing constant α (default 0.99).
        alpha: f64,
        /// ε (default 1e-8).
        eps: f64,
        /// Momentum μ (default 0).
        momentum: f64,
        /// Normalize by the centered second moment (an estimate of the variance; default
        /// false).
        centered: bool,
    },
    /// Adagrad. PyTorch: `torch.optim.Adagrad`.
    Adagrad {
        /// Learning-rate decay: step t uses `lr / (1 + (t − 1)·lr_decay)` (default 0).
        lr_decay: f64,
        /// ε (default 1e-10).
        eps: f64,
        /// The sum of squared gradients' starting value (default 0).
        initial_accumulator_value: f64,
    },
}

/// Per-parameter state: step count and buffers.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParamState {
    pub(crate) step: u64,
    pub(crate) bufs: Vec<StateBuf>,
}

/// An optimizer: a rule, its hyperparameters, and per-parameter state.
#[derive(Debug, Clone)]
pub struct Optimizer {
    /// Learning rate.
    pub lr: f64,
    /// Weight decay λ (L2 for SGD and Adam, decoupled for AdamW).
    pub weight_decay: f64,
    /// The rule.
    pub kind: Kind,
    /// Whether a step that would write a non-finite value is refused ([`Optimizer::check_finite`]).
    finite_check: bool,
    /// Clipping by global norm: `(max_norm, norm_type)`.
    clip_norm: Option<(f64, f64)>,
    /// Clipping by value.
    clip_value: Option<f64>,
    /// The learning-rate schedule.
    schedule: Option<Schedule>,
    /// Whether a non-finite loss stops the step.
    stop_non_finite_loss: bool,
    /// Session steps completed (the schedule's index of the next step).
    steps: u64,
    /// The clipping of the session step in progress.
    pending: Option<clip::Pending>,
    /// The loss of the session step in progress.
    pending_loss: Option<f64>,
    /// What the last session step did.
    last: Option<StepStats>,
    pub(crate) state: HashMap<(u64, usize), ParamState>,
}

/// A hyper-parameter error naming the optimizer, the parameter, its value and the valid range.
fn bad(optimizer: &'static str, name: &'static str, value: f64, expected: &'static str) -> Error {
    Error::Hyperparameter {
        optimizer,
        name,
        value,
        expected,
    }
}

impl Optimizer {
    fn with(lr: f64, weight_decay: f64, kind: Kind) -> Result<Self> {
        let o = Optimizer {
            lr,
            weight_decay,
            kind,
            finite_check: false,
            clip_norm: None,
            clip_value: None,
            schedule: None,
            stop_non_finite_loss: false,
            steps: 0,
            pending: None,
            pending_loss: None,
            last: None,
            state: HashMap::new(),
        };
        o.validate()?;
        Ok(o)
    }

    /// The rule's name, as errors print it (`sgd`, `momentum`, `adam`, `adamw`, `rmsprop`,
    /// `adagrad`).
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Sgd { momentum: 0.0, .. } => "sgd",
            Kind::Sgd { .. } => "momentum",
            Kind::Adam {
                decoupled: false, ..
            } => "adam",
            Kind::Adam { .. } => "adamw",
            Kind::RmsProp { .. } => "rmsprop",
            Kind::Adagrad { .. } => "adagrad",
        }
    }

    /// Check every hyper-parameter: `lr` finite and ≥ 0; weight decay finite and ≥ 0; momentum
    /// in `[0, 1)`; dampening in `[0, 1]`; Nesterov only with momentum > 0; betas and RMSprop's
    /// α in `[0, 1)`; `eps` finite and > 0; Adagrad's `lr_decay` and initial accumulator finite
    /// and ≥ 0; a clipping norm or value finite and ≥ 0, `norm_type` 1, 2 or ∞; the schedule's
    /// own parameters ([`Schedule::validate`]). Run when the optimizer is built and before
    /// every step (the fields are public).
    pub fn validate(&self) -> Result<()> {
        let name = self.name();
        let unit = |v: f64| (0.0..1.0).contains(&v);
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(bad(name, "lr", self.lr, "a finite value ≥ 0"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(bad(
                name,
                "weight_decay",
                self.weight_decay,
                "a finite value ≥ 0",
            ));
        }
        match self.kind {
            Kind::Sgd {
                momentum,
                dampening,
                nesterov,
            } => {
                if !unit(momentum) {
                    return Err(bad(name, "momentum", momentum, "a value in [0, 1)"));
                }
                if !(0.0..=1.0).contains(&dampening) {
                    return Err(bad(name, "dampening", dampening, "a value in [0, 1]"));
                }
                if nesterov && momentum == 0.0 {
                    return Err(bad(
                        name,
                        "momentum",
                        momentum,
                        "a value > 0 (Nesterov momentum requires it)",
                    ));
                }
            }
            Kind::Adam {
                beta1, beta2, eps, ..
            } => {
                if !unit(beta1) {
                    return Err(bad(name, "beta1", beta1, "a value in [0, 1)"));
                }
                if !unit(beta2) {
                    return Err(bad(name, "beta2", beta2, "a value in [0, 1)"));
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(bad(name, "eps", eps, "a finite value > 0"));
                }
            }
            Kind::RmsProp {
                alpha,
                eps,
                momentum,
                ..
            } => {
                if !unit(alpha) {
                    return Err(bad(name, "alpha", alpha, "a value in [0, 1)"));
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(bad(name, "eps", eps, "a finite value > 0"));
                }
                if !unit(momentum) {
                    return Err(bad(name, "momentum", momentum, "a value in [0, 1)"));
                }
            }
            Kind::Adagrad {
                lr_decay,
                eps,
                initial_accumulator_value,
            } => {
                if !(lr_decay.is_finite() && lr_decay >= 0.0) {
                    return Err(bad(name, "lr_decay", lr_decay, "a finite value ≥ 0"));
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(bad(name, "eps", eps, "a finite value > 0"));
                }
                let init = initial_accumulator_value;
                if !(init.is_finite() && (0.0..=STATE_BOUND).contains(&init)) {
                    return Err(bad(
                        name,
                        "initial_accumulator_value",
                        init,
                        "a finite value ≥ 0 (at most f32::MAX)",
                    ));
                }
            }
        }
        if let Some((max_norm, norm_type)) = self.clip_norm {
            if !(max_norm.is_finite() && max_norm >= 0.0) {
                return Err(bad(name, "max_norm", max_norm, "a finite value ≥ 0"));
            }
            if !clip::norm_type_ok(norm_type) {
                return Err(bad(name, "norm_type", norm_type, "1, 2 or infinity"));
            }
        }
        if let Some(v) = self.clip_value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(bad(name, "clip_value", v, "a finite value ≥ 0"));
        }
        if let Some(s) = &self.schedule {
            s.validate()?;
        }
        Ok(())
    }

    /// RMSprop with PyTorch's defaults: α 0.99, eps 1e-8, no momentum, not centered, weight
    /// decay 0 (`lr` has no default here; PyTorch's is 0.01). An error when `lr` is negative
    /// or not finite.
    pub fn rmsprop(lr: f64) -> Result<Self> {
        Self::with(
            lr,
            0.0,
            Kind::RmsProp {
                alpha: 0.99,
                eps: 1e-8,
                momentum: 0.0,
                centered: false,
            },
        )
    }

    /// Set RMSprop's α, eps, momentum and centering (no effect on other rules); an error when
    /// α or momentum lies outside `[0, 1)` or eps is not a finite value > 0.
    pub fn rmsprop_options(
        mut self,
        alpha: f64,
        eps: f64,
        momentum: f64,
        centered: bool,
    ) -> Result<Self> {
        if let Kind::RmsProp { .. } = self.kind {
            self.kind = Kind::RmsProp {
                alpha,
                eps,
                momentum,
                centered,
            };
        }
        self.validate()?;
        Ok(self)
    }

    /// Adagrad with PyTorch's defaults: lr_decay 0, eps 1e-10, initial accumulator 0, weight
    /// decay 0. An error when `lr` is negative or not finite.
    pub fn adagrad(lr: f64) -> Result<Self> {
        Self::with(
            lr,
            0.0,
            Kind::Adagrad {
                lr_decay: 0.0,
                eps: 1e-10,
                initial_accumulator_value: 0.0,
            },
        )
    }

    /// Set Adagrad's lr_decay, eps and initial accumulator value (no effect on other rules);
    /// an error when one is out of range.
    pub fn adagrad_options(
        mut self,
        lr_decay: f64,
        eps: f64,
        initial_accumulator_value: f64,
    ) -> Result<Self> {
        if let Kind::Adagrad { .. } = self.kind {
            self.kind = Kind::Adagrad {
                lr_decay,
                eps,
                initial_accumulator_value,
            };
        }
        self.validate()?;
        Ok(self)
    }

    /// Set the learning-rate schedule the steps consult (PyTorch: a
    /// `torch.optim.lr_scheduler` stepped after every `optimizer.step()`); step `k` of this
    /// optimizer (from 0, [`Optimizer::steps_done`]) runs with `schedule.lr_at(lr, k)`.
    pub fn schedule(mut self, schedule: Schedule) -> Result<Self> {
        self.schedule = Some(schedule);
        self.validate()?;
        Ok(self)
    }

    /// The schedule, if any.
    pub fn lr_schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// The learning rate the next step uses: `lr`, or the schedule's rate at
    /// [`Optimizer::steps_done`]; an error past a one-cycle schedule's end.
    pub fn lr_now(&self) -> Result<f64> {
        match &self.schedule {
            None => Ok(self.lr),
            Some(s) => s.lr_at(self.lr, self.steps),
        }
    }

    /// Plain SGD: `w ← w − lr·g`. PyTorch: `SGD(params, lr)`. An error when `lr` is negative or
    /// not finite.
    pub fn sgd(lr: f64) -> Result<Self> {
        Self::momentum(lr, 0.0)
    }

    /// Momentum SGD with PyTorch's defaults (dampening 0, no Nesterov): `b ← μ·b + g` (b = g at
    /// the first step), `w ← w − lr·b`. PyTorch: `SGD(params, lr, momentum=μ)`. An error when
    /// `lr` is negative or not finite, or μ lies outside `[0, 1)`.
    pub fn momentum(lr: f64, momentum: f64) -> Result<Self> {
        Self::with(
            lr,
            0.0,
            Kind::Sgd {
                momentum,
                dampening: 0.0,
                nesterov: false,
            },
        )
    }

    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0. An error
    /// when `lr` is negative or not finite.
    pub fn adam(lr: f64) -> Result<Self> {
        Self::with(lr, 0.0, Self::adam_kind(false))
    }

    /// AdamW with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01. An error
    /// when `lr` is negative or not finite.
    pub fn adamw(lr: f64) -> Result<Self> {
        Self::with(lr, 0.01, Self::adam_kind(true))
    }

    fn adam_kind(decoupled: bool) -> Kind {
        Kind::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            decoupled,
        }
    }

    /// Set the weight decay; an error when it is negative or not finite.
    pub fn weight_decay(mut self, wd: f64) -> Result<Self> {
        self.weight_decay = wd;
        self.validate()?;
        Ok(self)
    }

    /// Set SGD's dampening and Nesterov flag (no effect on Adam); an error when dampening lies
    /// outside `[0, 1]`, or Nesterov is asked for without momentum.
    pub fn dampening_nesterov(mut self, dampening: f64, nesterov: bool) -> Result<Self> {
        if let Kind::Sgd { momentum, .. } = self.kind {
            self.kind = Kind::Sgd {
                momentum,
                dampening,
                nesterov,
            };
        }
        self.validate()?;
        Ok(self)
    }

    /// Set Adam's betas and eps (no effect on SGD); an error when a beta lies outside `[0, 1)`
    /// or eps is not a finite value > 0.
    pub fn betas_eps(mut self, beta1: f64, beta2: f64, eps: f64) -> Result<Self> {
        if let Kind::Adam { decoupled, .. } = self.kind {
            self.kind = Kind::Adam {
                beta1,
                beta2,
                eps,
                decoupled,
            };
        }
        self.validate()?;
        Ok(self)
    }

    /// Refuse (`true`) or allow (`false`, the default) steps that would write a non-finite value
    /// (NaN, ±∞) into a parameter. When refused, the step returns [`Error::NonFinite`] naming the
    /// parameter, and that parameter and its optimizer state are left as they were. The check
    /// costs a copy of the parameter and its state per step (and, on CUDA, a read-back).
    /// PyTorch has no equivalent (its `GradScaler` skips steps on non-finite gradients).
    pub fn check_finite(mut self, on: bool) -> Self {
        self.finite_check = on;
        self
    }

    /// Whether [`Optimizer::check_finite`] is on.
    pub fn checks_finite(&self) -> bool {
        self.finite_check
    }

    /// Forget all state (step counts and buffers); device buffers must be released first with
    /// [`Optimizer::release_device_state`].
    pub fn clear_state(&mut self) {
        self.state.clear();
    }

    /// Release the device buffers this optimizer holds on `dev` and forget that state.
    pub fn release_device_state<D: Device>(&mut self, dev: &mut D) -> usize {
        let mut freed = 0;
        self.state.retain(|_, st| {
            let on_device = st.bufs.iter().any(|b| matches!(b, StateBuf::Device(_)));
            for b in &st.bufs {
                if let StateBuf::Device(b) = b
                    && dev.release(*b)
                {
                    freed += 1;
                }
            }
            !on_device
        });
        freed
    }

    /// Update a host tensor `w` from the sum of `grads` (one per use of the parameter, each of
    /// `w`'s shape), element for element in f64 exactly as [`Optimizer::update`] with
    /// [`HostOps`] computes it, from the state stored in `T` (widened exactly) to the new state
    /// rounded to `T` ([`StateBuf`]). Plain SGD (no momentum, no weight decay) runs as one pass that
    /// writes the new values, without the f64 copies of `w` and the gradient that the stateful
    /// rules need (the training-step hot path, docs/performance.md).
    pub fn update_host<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
    ) -> Result<()> {
        for g in grads {
            if g.shape() != w.shape() {
                return Err(crate::Error::Shape {
                    what: "optimizer step: gradient of a parameter",
                    expected: w.shape().clone(),
                    got: g.shape().clone(),
                });
            }
        }
        self.validate()?;
        if self.finite_check {
            // Transactional: run the step on a copy; commit only finite values.
            let saved = self.state.get(&key).cloned();
            let mut candidate = w.clone();
            let r =
                self.update_host_inner(key, &mut candidate, grads)
                    .and_then(|()| {
                        match candidate
                            .data()
                            .iter()
                            .position(|v| !v.as_f64().is_finite())
                        {
                            None => Ok(()),
                            Some(i) => Err(non_finite(
                                self.name(),
                                key,
                                i,
                                candidate.data()[i].as_f64(),
                            )),
                        }
                    });
            if r.is_err() {
                match saved {
                    Some(st) => self.state.insert(key, st),
                    None => self.state.remove(&key),
                };
                return r;
            }
            *w = candidate;
            return Ok(());
        }
        self.update_host_inner(key, w, grads)
    }

    fn update_host_inner<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
    ) -> Result<()> {
        let plain = matches!(self.kind, Kind::Sgd { momentum, .. } if momentum == 0.0)
            && self.weight_decay == 0.0
            && self.clip_value.is_none();
        if plain {
            // Norm clipping scales the gradient: folded into the coefficient.
            let c = -self.lr_now()? * self.grad_coef();
            self.state.entry(key).or_default().step += 1;
            let sum = |i: usize| grads.iter().fold(0.0, |s, g| s + g.data()[i].as_f64());
            // In place when nothing else holds w's values (a step that ends its pass:
            // `Train::backward_step_and_reset`), else into a new buffer. The loop runs at the
            // CPU's widest instruction set (the mlp step's largest loop).
            match (grads, w.unique_data_mut()) {
                ([g], Some(d)) => tl_tape_cpu::simd::zip_assign(d, g.data(), Axpy(c)),
                (_, Some(d)) => d
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = T::lit(v.as_f64() + c * sum(i))),
                ([g], None) => {
                    let new = tl_tape_cpu::simd::zip("sgd", w.data(), g.data(), Axpy(c))?;
                    *w = Tensor::new(w.shape().clone(), new)?;
                }
                (_, None) => {
                    let new = (w.data().iter().enumerate())
                        .map(|(i, &v)| T::lit(v.as_f64() + c * sum(i)))
                        .collect();
                    *w = Tensor::new(w.shape().clone(), new)?;
                }
            }
            return Ok(());
        }
        self.update_host_blocks(key, w, grads, HOST_BLOCK)
    }

    /// The stateful rules on the host, [`HOST_BLOCK`] elements (`block` here) at a time: each
    /// block's parameter values, gradient sum and state widened to f64, [`HostOps`]' formula
    /// run on them, the new values and state written back in the parameter's type (`w` in
    /// place when nothing else holds it). Every rule is element-wise, so the bits are those of
    /// one whole-vector update; the f64 copies are a block's, not the parameter's. A first step
    /// makes the state for every block (each block sees no state, as a whole-vector first step
    /// does). An error leaves `w` and the state as they were: with [`HostOps`] every error
    /// (the learning rate, state of a device) does not depend on the values, so it comes from
    /// the first block, before anything is written.
    fn update_host_blocks<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
        block: usize,
    ) -> Result<()> {
        let (n, block) = (w.numel(), block.max(1));
        let had = self.state.contains_key(&key);
        let mut st = self.state.remove(&key).unwrap_or_default();
        // On an error: the state as it was (none if there was none).
        let restore = |state: &mut HashMap<(u64, usize), ParamState>, st: ParamState| {
            if had {
                state.insert(key, st);
            }
        };
        let fresh = st.bufs.is_empty();
        // What a first step makes, whole (the blocks' parts copied in).
        let mut made: Vec<StateBuf> = Vec::new();
        let mut step;
        // The new values over the old ones when nothing else holds them, else into a new buffer
        // (not into a copy of the old values).
        let mut out = if w.unique_data_mut().is_some() {
            NewValues::InPlace(w.data_mut())
        } else {
            let new = tl_spec::alloc::try_with_capacity("optimizer step", "parameter", n)?;
            NewValues::Fresh {
                old: w.clone(),
                new,
            }
        };
        let mut lo = 0;
        loop {
            let hi = n.min(lo + block);
            let bufs = match fresh {
                true => Ok(Vec::new()),
                false => st.bufs.iter().map(|b| widened(b, lo..hi)).collect(),
            };
            let bufs = match bufs {
                Ok(b) => b,
                Err(e) => {
                    restore(&mut self.state, st);
                    return Err(e);
                }
            };
            self.state.insert(
                key,
                ParamState {
                    step: st.step,
                    bufs,
                },
            );
            let gv: Vec<f64> = (lo..hi)
                .map(|i| grads.iter().fold(0.0, |s, g| s + g.data()[i].as_f64()))
                .collect();
            let old = match &out {
                NewValues::InPlace(d) => &d[lo..hi],
                NewValues::Fresh { old, .. } => &old.data()[lo..hi],
            };
            let mut wv: Vec<f64> = old.iter().map(|v| v.as_f64()).collect();
            let r = self.update_inner(&mut HostOps, key, &mut wv, &gv);
            let mut done = self.state.remove(&key).unwrap_or_default();
            // The new state in the parameter's type, into the whole state.
            vec_ops::store_as::<T>(&mut done.bufs);
            let r = r.and_then(|()| {
                if fresh && lo == 0 {
                    made = done
                        .bufs
                        .iter()
                        .map(|b| zeros_as(b, n))
                        .collect::<Result<_>>()?;
                }
                let whole = if fresh { &mut made } else { &mut st.bufs };
                whole
                    .iter_mut()
                    .zip(&done.bufs)
                    .try_for_each(|(whole, part)| put_block(whole, lo, part))
            });
            if let Err(e) = r {
                restore(&mut self.state, st);
                return Err(e);
            }
            step = done.step;
            match &mut out {
                NewValues::InPlace(d) => (d[lo..hi].iter_mut())
                    .zip(wv)
                    .for_each(|(o, v)| *o = T::lit(v)),
                NewValues::Fresh { new, .. } => new.extend(wv.into_iter().map(T::lit)),
            }
            lo = hi;
            if lo >= n {
                break;
            }
        }
        if let NewValues::Fresh { new, .. } = out {
            *w = Tensor::new(w.shape().clone(), new)?;
        }
        if fresh {
            st.bufs = made;
        }
        st.step = step;
        self.state.insert(key, st);
        Ok(())
    }

    /// Update one parameter `w` in place from its gradient `g`. `key` identifies the parameter
    /// (session id, parameter index) for the state. With [`Optimizer::check_finite`] on, the
    /// step runs on copies of `w` and the state and is committed only when every new value of
    /// `w` is finite.
    pub fn update<O: VecOps>(
        &mut self,
        ops: &mut O,
        key: (u64, usize),
        w: &mut O::V,
        g: &O::V,
    ) -> Result<()> {
        self.validate()?;
        if !self.finite_check {
            return self.update_inner(ops, key, w, g);
        }
        // Trial state and parameter: copies; the originals are untouched until the commit.
        let had_state = self.state.contains_key(&key);
        let mut saved = self.state.remove(&key).unwrap_or_default();
        let mut trial = ParamState {
            step: saved.step,
            bufs: Vec::with_capacity(saved.bufs.len()),
        };
        let mut r = Ok(());
        for b in &mut saved.bufs {
            match O::state_mut(b).and_then(|v| ops.copy(v)) {
                Ok(c) => trial.bufs.push(O::into_state(c)),
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        let mut w_new = match r.and_then(|()| ops.copy(w)) {
            Ok(v) => v,
            Err(e) => {
                trial.bufs.into_iter().for_each(|b| ops.release_state(b));
                if had_state {
                    self.state.insert(key, saved);
                }
                return Err(e);
            }
        };
        self.state.insert(key, trial);
        let r = self.update_inner(ops, key, &mut w_new, g).and_then(|()| {
            match ops.first_non_finite(&w_new)? {
                None => Ok(()),
                Some((i, v)) => Err(non_finite(self.name(), key, i, v)),
            }
        });
        // The trial state now sits under `key`: keep it on success, swap the saved one back.
        let trial = self.state.remove(&key).unwrap_or_default();
        let (keep, discard) = match r {
            Ok(()) => (trial, saved),
            Err(_) => (saved, trial),
        };
        if r.is_ok() || had_state {
            self.state.insert(key, keep);
        }
        discard.bufs.into_iter().for_each(|b| ops.release_state(b));
        // Commit: w ← 0·w + w_new, exact for a finite w (a non-finite w gives a non-finite
        // w_new, which was refused above).
        let r = r
            .and_then(|()| ops.scale_assign(w, 0.0))
            .and_then(|()| ops.axpy_assign(w, 1.0, &w_new));
        ops.release(w_new);
        r
    }

    /// The learning rate when this optimizer's step is exactly `w ← w − lr·g` (plain SGD: no
    /// momentum, no weight decay, no finite check), which a device can run for many parameters
    /// in one launch ([`Optimizer::count_plain_steps`] then keeps the state); `None` otherwise.
    pub(crate) fn plain_sgd_lr(&self) -> Option<f64> {
        let plain = matches!(self.kind, Kind::Sgd { momentum, .. } if momentum == 0.0);
        let lr = self.lr_now().ok()? * self.grad_coef();
        (plain
            && self.weight_decay == 0.0
            && self.clip_value.is_none()
            && !self.finite_check
            && self.validate().is_ok())
        .then_some(lr)
    }

    /// The state a plain SGD step keeps for each of `keys` (its step count), for updates that
    /// ran outside [`Optimizer::update`] on [`Optimizer::plain_sgd_lr`]'s word.
    pub(crate) fn count_plain_steps(&mut self, keys: impl IntoIterator<Item = (u64, usize)>) {
        for key in keys {
            self.state.entry(key).or_default().step += 1;
        }
    }

    /// The step of `update_inner` from the gradient `g` (clipped where clipping applies) as one
    /// [`VecOps::adam_step`] or [`VecOps::momentum_step`] call (on a device, one launch): Adam
    /// and AdamW, and momentum SGD once its buffer exists; `None` for the rules and steps that
    /// run primitive by primitive. The same values, state and step count as the composed rule.
    #[allow(clippy::too_many_arguments)]
    fn fused_step<O: VecOps>(
        &mut self,
        ops: &mut O,
        key: (u64, usize),
        w: &mut O::V,
        g: &O::V,
        lr: f64,
        wd: f64,
        kind: Kind,
    ) -> Option<Result<()>> {
        let c = match self.fused_coefs(ops, key, g, lr, wd, kind)? {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let st = self.state.entry(key).or_default();
        Some(match c {
            Fused::Adam(c) => {
                let (m, v) = st.bufs.split_at_mut(1);
                O::state_mut(&mut m[0])
                    .and_then(|m| Ok((m, O::state_mut(&mut v[0])?)))
                    .and_then(|(m, v)| ops.adam_step(w, m, v, g, &c))
            }
            Fused::Momentum(c) => {
                O::state_mut(&mut st.bufs[0]).and_then(|b| ops.momentum_step(w, b, g, &c))
            }
        })
    }

    /// The coefficients of parameter `key`'s fused step ([`Optimizer::fused_step`], and the
    /// list steps of [`Optimizer::fused_list_step`]) with its state made ready: Adam's moments
    /// made at its first step, the step counted. `None` (nothing changed but an empty state
    /// made) for the rules and steps that run primitive by primitive.
    fn fused_coefs<O: VecOps>(
        &mut self,
        ops: &mut O,
        key: (u64, usize),
        g: &O::V,
        lr: f64,
        wd: f64,
        kind: Kind,
    ) -> Option<Result<Fused>> {
        let st = self.state.entry(key).or_default();
        match kind {
            Kind::Adam {
                beta1,
                beta2,
                eps,
                decoupled,
            } => {
                if st.bufs.is_empty()
                    && let Err(e) = adam_state(ops, st, g)
                {
                    return Some(Err(e));
                }
                st.step += 1;
                let mut c = AdamStep::new(lr, beta1, beta2, eps, st.step);
                // The composed step's weight decay: `w ← (1 − lr·λ)·w` (AdamW) or `g + λ·w`.
                if wd != 0.0 {
                    if decoupled {
                        c.decay = Some(1.0 - lr * wd);
                    } else {
                        c.l2 = Some(wd);
                    }
                }
                Some(Ok(Fused::Adam(c)))
            }
            Kind::Sgd {
                momentum,
                dampening,
                nesterov,
            } if momentum != 0.0 && !st.bufs.is_empty() => {
                st.step += 1;
                Some(Ok(Fused::Momentum(MomentumStep {
                    l2: (wd != 0.0).then_some(wd),
                    momentum,
                    dampening,
                    nesterov,
                    lr,
                })))
            }
            _ => None,
        }
    }

    fn update_inner<O: VecOps>(
        &mut self,
        ops: &mut O,
        key: (u64, usize),
        w: &mut O::V,
        g: &O::V,
    ) -> Result<()> {
        let (lr, wd, kind) = (self.lr_now()?, self.weight_decay, self.kind);
        let clipping = self.clip_value.is_some() || self.grad_coef() != 1.0;
        // Effective gradient: clipped, then g + λ·w (L2), except AdamW, which decays w directly.
        // Plain SGD without clipping reads the gradient as it is (no copy: one kernel and
        // buffer fewer per parameter and step on a device).
        let plain = wd == 0.0 && matches!(kind, Kind::Sgd { momentum, .. } if momentum == 0.0);
        if plain && !clipping {
            self.state.entry(key).or_default().step += 1;
            return ops.axpy_assign(w, -lr, g);
        }
        // The clipped gradient: a copy, which clipping writes.
        let clipped = if clipping {
            let mut ge = ops.copy(g)?;
            if let Err(e) = self.clip_in_place(ops, &mut ge) {
                ops.release(ge);
                return Err(e);
            }
            Some(ge)
        } else {
            None
        };
        if ops.fused_steps()
            && let Some(r) =
                self.fused_step(ops, key, w, clipped.as_ref().unwrap_or(g), lr, wd, kind)
        {
            if let Some(ge) = clipped {
                ops.release(ge);
            }
            return r;
        }
        let mut ge = match clipped {
            Some(ge) => ge,
            None => ops.copy(g)?,
        };
        let st = self.state.entry(key).or_default();
        st.step += 1;
        let decoupled = matches!(
            kind,
            Kind::Adam {
                decoupled: true,
                ..
            }
        );
        let r = if wd == 0.0 {
            Ok(())
        } else if decoupled {
            ops.scale_assign(w, 1.0 - lr * wd)
        } else {
            ops.axpy_assign(&mut ge, wd, w)
        };
        let r = r.and_then(|()| match kind {
            Kind::Sgd {
                momentum,
                dampening,
                nesterov,
            } => sgd(ops, st, w, &mut ge, lr, momentum, dampening, nesterov),
            Kind::Adam {
                beta1, beta2, eps, ..
            } => adam(
                ops,
                st,
                w,
                &ge,
                &AdamStep::new(lr, beta1, beta2, eps, st.step),
            ),
            Kind::RmsProp {
                alpha,
                eps,
                momentum,
                centered,
            } => rules::rmsprop(
                ops,
                st,
                w,
                &ge,
                lr,
                rules::RmsProp {
                    alpha,
                    eps,
                    momentum,
                    centered,
                },
            ),
            Kind::Adagrad {
                lr_decay,
                eps,
                initial_accumulator_value,
            } => rules::adagrad(
                ops,
                st,
                w,
                &ge,
                lr,
                lr_decay,
                eps,
                initial_accumulator_value,
            ),
        });
        ops.release(ge);
        r
    }
}

/// The error of a refused non-finite step; the session replaces `#index` by the parameter's name.
fn non_finite(optimizer: &'static str, key: (u64, usize), index: usize, value: f64) -> Error {
    Error::NonFinite {
        optimizer,
        param: format!("#{}", key.1),
        index,
        value,
    }
}

#[allow(clippy::too_many_arguments)]
fn sgd<O: VecOps>(
    ops: &mut O,
    st: &mut ParamState,
    w: &mut O::V,
    ge: &mut O::V,
    lr: f64,
    momentum: f64,
    dampening: f64,
    nesterov: bool,
) -> Result<()> {
    if momentum == 0.0 {
        return ops.axpy_assign(w, -lr, ge);
    }
    if st.bufs.is_empty() {
        let b = ops.copy(ge)?;
        st.bufs.push(O::into_state(b));
    } else {
        let b = O::state_mut(&mut st.bufs[0])?;
        ops.scale_assign(b, momentum)?;
        ops.axpy_assign(b, 1.0 - dampening, ge)?;
    }
    let b = O::state_mut(&mut st.bufs[0])?;
    if nesterov {
        ops.axpy_assign(ge, momentum, b)?;
        ops.axpy_assign(w, -lr, ge)
    } else {
        ops.axpy_assign(w, -lr, b)
    }
}

/// A fused step's coefficients ([`Optimizer::fused_coefs`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fused {
    /// An Adam(W) step.
    Adam(AdamStep),
    /// A momentum SGD step after the first.
    Momentum(MomentumStep),
}

/// One Adam(W) step's coefficients in `f64`, as the rule's operations read them (both the
/// composed rule and [`VecOps::adam_step`]). PyTorch's formula at step `t`: `m ← β₁m + (1−β₁)g`,
/// `v ← β₂v + (1−β₂)g²`, `w ← w − (lr/(1−β₁ᵗ))·m/(sqrt(v)/sqrt(1−β₂ᵗ) + ε)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// AdamW's decoupled decay, the scale `1 − lr·λ` applied to `w` first (`None`: none).
    pub decay: Option<f64>,
    /// Adam's L2 weight decay λ, the gradient read as `g + λ·w` (`None`: none).
    pub l2: Option<f64>,
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// `1/sqrt(1 − β₂ᵗ)`.
    pub inv_sqrt_bc2: f64,
    /// `−lr/(1 − β₁ᵗ)`.
    pub step: f64,
}

impl AdamStep {
    /// The coefficients of step `t` (counted from 1), without weight decay.
    fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, t: u64) -> AdamStep {
        // Past i32::MAX steps β^t is 0 in f64 either way (a loaded step count may be that large).
        let t = t.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - beta1.powi(t);
        let bc2 = 1.0 - beta2.powi(t);
        AdamStep {
            decay: None,
            l2: None,
            beta1,
            beta2,
            eps,
            inv_sqrt_bc2: 1.0 / bc2.sqrt(),
            step: -lr / bc1,
        }
    }
}

/// One momentum SGD step's coefficients in `f64` (a step after the first), as
/// [`VecOps::momentum_step`] reads them: PyTorch's `b ← μb + (1 − dampening)g`, then `w ← w −
/// lr·b` (Nesterov: `w ← w − lr·(g + μb)`), with `g + λ·w` for the gradient under L2 decay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumStep {
    /// L2 weight decay λ (`None`: none).
    pub l2: Option<f64>,
    /// μ.
    pub momentum: f64,
    /// The dampening.
    pub dampening: f64,
    /// Whether the step takes the Nesterov form.
    pub nesterov: bool,
    /// The learning rate.
    pub lr: f64,
}

/// Adam's two moments, zeros of `g`'s length, as `st`'s state.
fn adam_state<O: VecOps>(ops: &mut O, st: &mut ParamState, g: &O::V) -> Result<()> {
    let m = ops.zeros_like(g)?;
    let v = match ops.zeros_like(g) {
        Ok(v) => v,
        Err(e) => {
            ops.release(m);
            return Err(e);
        }
    };
    st.bufs.push(O::into_state(m));
    st.bufs.push(O::into_state(v));
    Ok(())
}

fn adam<O: VecOps>(
    ops: &mut O,
    st: &mut ParamState,
    w: &mut O::V,
    ge: &O::V,
    c: &AdamStep,
) -> Result<()> {
    if st.bufs.is_empty() {
        adam_state(ops, st, ge)?;
    }
    let (m_slot, v_slot) = st.bufs.split_at_mut(1);
    let m = O::state_mut(&mut m_slot[0])?;
    let v = O::state_mut(&mut v_slot[0])?;
    // m ← β₁m + (1−β₁)g ; v ← β₂v + (1−β₂)g²
    ops.scale_assign(m, c.beta1)?;
    ops.axpy_assign(m, 1.0 - c.beta1, ge)?;
    let g2 = ops.mul(ge, ge)?;
    ops.scale_assign(v, c.beta2)?;
    let r = ops.axpy_assign(v, 1.0 - c.beta2, &g2);
    ops.release(g2);
    r?;
    // w ← w − (lr / (1−β₁ᵗ)) · m / (sqrt(v)/sqrt(1−β₂ᵗ) + ε)   (PyTorch's formula)
    let denom = ops.sqrt_scale_add(v, c.inv_sqrt_bc2, c.eps)?;
    let u = ops.div(m, &denom);
    ops.release(denom);
    let u = u?;
    let r = ops.axpy_assign(w, c.step, &u);
    ops.release(u);
    r
}

/// Elements a stateful host update widens to f64 at a time ([`Optimizer::update_host`]): for
/// Adam the parameter, the gradient sum, the two moments and a temporary, 16 Ki elements each,
/// about 640 KiB, an L2-sized working set, where whole vectors of a large parameter would
/// stream through memory once per operation of the rule and be the step's largest allocation.
pub const HOST_BLOCK: usize = 1 << 14;

/// Where a host update writes a parameter's new values: over the old ones (nothing else holds
/// them), or into a new buffer beside them.
enum NewValues<'a, T> {
    /// The parameter's own elements.
    InPlace(&'a mut [T]),
    /// A share of the old values, read block by block, and the new buffer.
    Fresh { old: Tensor<T>, new: Vec<T> },
}

/// Elements `r` of a host state buffer, widened to f64 (exact); device state is the error
/// [`HostOps`] gives it.
fn widened(b: &StateBuf, r: std::ops::Range<usize>) -> Result<StateBuf> {
    match b {
        StateBuf::Host(v) => Ok(StateBuf::Host(v[r].to_vec())),
        StateBuf::HostF32(v) => Ok(StateBuf::Host(v[r].iter().map(|&x| f64::from(x)).collect())),
        StateBuf::Device(_) => {
            let mut b = b.clone();
            HostOps::state_mut(&mut b)?;
            Ok(b)
        }
    }
}

/// Zeros of `n` elements of `like`'s host kind (fallible: a first step's whole state).
fn zeros_as(like: &StateBuf, n: usize) -> Result<StateBuf> {
    const WHAT: &str = "optimizer state";
    Ok(match like {
        StateBuf::HostF32(_) => {
            StateBuf::HostF32(tl_spec::alloc::try_zeroed("optimizer step", WHAT, n)?)
        }
        _ => StateBuf::Host(tl_spec::alloc::try_zeroed("optimizer step", WHAT, n)?),
    })
}

/// Copy the block `part` into `whole` from element `lo` (the same host kind: the block was
/// stored as the whole is).
fn put_block(whole: &mut StateBuf, lo: usize, part: &StateBuf) -> Result<()> {
    match (whole, part) {
        (StateBuf::Host(w), StateBuf::Host(p)) => w[lo..lo + p.len()].copy_from_slice(p),
        (StateBuf::HostF32(w), StateBuf::HostF32(p)) => w[lo..lo + p.len()].copy_from_slice(p),
        _ => {
            return Err(Error::Usage {
                what: "optimizer step",
                detail: "a state block of another kind than the parameter's state".into(),
            });
        }
    }
    Ok(())
}

/// `w + c·g` in f64, rounded once to `T`: plain SGD's update of one element (`c = −lr`).
#[derive(Clone, Copy)]
struct Axpy(f64);

impl<T: Scalar> tl_tape_cpu::simd::Map2<T> for Axpy {
    #[inline(always)]
    fn at(self, w: T, g: T) -> T {
        T::lit(w.as_f64() + self.0 * g.as_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass SGD path of `update_host` gives bit for bit what the f64 `HostOps` path
    /// gives, for one gradient and for a parameter used twice; stateful rules still work.
    #[test]
    fn update_host_matches_the_f64_path() {
        let w = Tensor::<f32>::from_fn([5], |i| 0.3 * i as f32 - 0.71);
        let g1 = Tensor::<f32>::from_fn([5], |i| 0.17 - 0.09 * i as f32);
        let g2 = Tensor::<f32>::from_fn([5], |i| 1.0 / (i as f32 + 3.0));
        let reference = |grads: &[&Tensor<f32>], opt: &mut Optimizer| {
            let mut gv = vec![0.0f64; 5];
            for g in grads {
                gv.iter_mut()
                    .zip(g.data())
                    .for_each(|(a, b)| *a += f64::from(*b));
            }
            let mut wv: Vec<f64> = w.data().iter().map(|&v| f64::from(v)).collect();
            opt.update(&mut HostOps, (1, 0), &mut wv, &gv).unwrap();
            wv.into_iter().map(|v| v as f32).collect::<Vec<f32>>()
        };
        for grads in [vec![&g1], vec![&g1, &g2]] {
            for make in [
                || Optimizer::sgd(0.37).unwrap(),
                || Optimizer::momentum(0.1, 0.9).unwrap(),
            ] {
                let mut fast = w.clone();
                make().update_host((1, 0), &mut fast, &grads).unwrap();
                assert_eq!(fast.data(), reference(&grads, &mut make()).as_slice());
                assert_ne!(fast.data(), w.data(), "the step moved nothing");
            }
        }
        let mut bad = w.clone();
        let e = Optimizer::sgd(0.1)
            .unwrap()
            .update_host((1, 0), &mut bad, &[&Tensor::zeros([4])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[5]") && e.contains("[4]"), "{e}");
    }

    /// The stateful rules updated a block at a time give the whole-vector update's bits, in
    /// f32 and f64, over several steps (the first one making the state), with one gradient and
    /// two, with weight decay and clipping; blocks of 1, 3 and 7 of 10 elements (a short last
    /// block) against one block of all.
    #[test]
    fn blocked_host_updates_give_the_whole_updates_bits() {
        type Make = fn() -> Optimizer;
        let rules: [Make; 8] = [
            || Optimizer::momentum(0.1, 0.9).unwrap(),
            || {
                Optimizer::momentum(0.1, 0.9)
                    .unwrap()
                    .dampening_nesterov(0.0, true)
                    .unwrap()
            },
            || {
                Optimizer::momentum(0.1, 0.8)
                    .unwrap()
                    .dampening_nesterov(0.3, false)
                    .unwrap()
                    .weight_decay(0.01)
                    .unwrap()
            },
            || Optimizer::adam(0.05).unwrap().clip_grad_value(0.4).unwrap(),
            || Optimizer::adamw(0.05).unwrap().weight_decay(0.1).unwrap(),
            || {
                Optimizer::rmsprop(0.01)
                    .unwrap()
                    .rmsprop_options(0.9, 1e-6, 0.5, true)
                    .unwrap()
            },
            || {
                Optimizer::adagrad(0.1)
                    .unwrap()
                    .adagrad_options(0.01, 1e-10, 0.1)
                    .unwrap()
            },
            || Optimizer::sgd(0.1).unwrap().weight_decay(0.02).unwrap(),
        ];
        type Run = (Vec<u64>, u64, Vec<StateBuf>);
        // `shared`: a share of w held across each update (as a pass's leaf holds it), so the
        // new values go to a new buffer and the share keeps the old ones.
        fn run<T: Scalar>(make: Make, block: usize, two: bool, shared: bool) -> Run {
            let mut w = Tensor::<T>::from_fn([10], |i| T::lit(0.3 * i as f64 - 1.1));
            let mut opt = make();
            for k in 0..3 {
                let held = shared.then(|| (w.clone(), w.data().to_vec()));
                let g1 = Tensor::<T>::from_fn([10], |i| {
                    T::lit(((i * 7 + k * 3) % 11) as f64 * 0.13 - 0.6)
                });
                let g2 = Tensor::<T>::from_fn([10], |i| T::lit(0.05 * i as f64 - 0.2));
                let grads: Vec<&Tensor<T>> = if two { vec![&g1, &g2] } else { vec![&g1] };
                opt.update_host_blocks((1, 0), &mut w, &grads, block)
                    .unwrap();
                if let Some((share, before)) = held {
                    assert_eq!(share.data(), &before[..], "the held share moved");
                    assert!(!w.shares_storage_with(&share));
                }
            }
            let st = &opt.state[&(1, 0)];
            let w = w.data().iter().map(|v| v.as_f64().to_bits()).collect();
            (w, st.step, st.bufs.clone())
        }
        for make in rules {
            for two in [false, true] {
                let (whole32, whole64) = (
                    run::<f32>(make, 10, two, false),
                    run::<f64>(make, 10, two, false),
                );
                assert_eq!(whole32.1, 3);
                assert!(matches!(whole32.2[..], [StateBuf::HostF32(_), ..] | []));
                assert!(matches!(whole64.2[..], [StateBuf::Host(_), ..] | []));
                for block in [1, 3, 7] {
                    let what = format!("{} block {block} two {two}", make().rule_name());
                    for shared in [false, true] {
                        assert_eq!(run::<f32>(make, block, two, shared), whole32, "{what}");
                        assert_eq!(run::<f64>(make, block, two, shared), whole64, "{what}");
                    }
                }
            }
        }
        // An error (device state on the host) leaves the parameter and the state as they were.
        let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
        let mut sim = tl_tape_cuda::SimDevice::default();
        let dev = StateBuf::Device(tl_tape_cuda::Device::zeros(&mut sim, 10).unwrap());
        opt.state.insert(
            (1, 0),
            ParamState {
                step: 4,
                bufs: vec![dev.clone()],
            },
        );
        let mut w = Tensor::<f32>::from_fn([10], |i| i as f32);
        let g = Tensor::<f32>::zeros([10]);
        assert!(opt.update_host_blocks((1, 0), &mut w, &[&g], 3).is_err());
        assert_eq!(w.data(), Tensor::<f32>::from_fn([10], |i| i as f32).data());
        assert_eq!(opt.state[&(1, 0)].step, 4);
        assert_eq!(opt.state[&(1, 0)].bufs, vec![dev]);
    }

    /// The host state of an f32 parameter is f32 (PyTorch's and the device's type): each step
    /// is the f64 formula from the widened state, the new state rounded once to f32; an f64
    /// parameter keeps f64 state. Several steps, so a state kept in f64 would drift from it.
    #[test]
    fn f32_parameters_keep_f32_state() {
        let w0 = Tensor::<f32>::from_fn([7], |i| 0.3 * i as f32 - 0.71);
        let grad =
            |k: usize| Tensor::<f32>::from_fn([7], |i| ((i * 5 + k * 3) % 11) as f32 * 0.13 - 0.6);
        for make in [
            || Optimizer::adamw(0.05).unwrap(),
            || Optimizer::momentum(0.1, 0.9).unwrap(),
            || Optimizer::rmsprop(0.01).unwrap(),
        ] {
            let (mut opt, mut w) = (make(), w0.clone());
            // The reference: HostOps on f64 vectors, the state rounded to f32 after each step.
            let (mut reference, mut wr) = (make(), w0.clone());
            for k in 0..4 {
                let g = grad(k);
                opt.update_host((1, 0), &mut w, &[&g]).unwrap();
                let mut wv: Vec<f64> = wr.data().iter().map(|&v| f64::from(v)).collect();
                let gv: Vec<f64> = g.data().iter().map(|&v| f64::from(v)).collect();
                reference
                    .update(&mut HostOps, (1, 0), &mut wv, &gv)
                    .unwrap();
                for b in &mut reference.state.get_mut(&(1, 0)).unwrap().bufs {
                    let StateBuf::Host(v) = b else {
                        panic!("f64 state")
                    };
                    v.iter_mut().for_each(|x| *x = f64::from(*x as f32));
                }
                wr = Tensor::new(wr.shape().clone(), wv.iter().map(|&v| v as f32).collect())
                    .unwrap();
                assert_eq!(w.data(), wr.data(), "{} step {k}", opt.rule_name());
            }
            let st = &opt.state[&(1, 0)];
            assert!(!st.bufs.is_empty());
            for (b, r) in st.bufs.iter().zip(&reference.state[&(1, 0)].bufs) {
                let (StateBuf::HostF32(v), StateBuf::Host(r)) = (b, r) else {
                    panic!("{}: an f32 parameter's state is {b:?}", opt.rule_name())
                };
                assert!(v.iter().zip(r).all(|(&a, &b)| f64::from(a) == b));
            }
            // An f64 parameter's state stays f64.
            let mut w64 = Tensor::<f64>::from_fn([7], |i| 0.3 * i as f64 - 0.71);
            let g64 = Tensor::<f64>::from_fn([7], |i| 0.1 * i as f64 - 0.2);
            let mut opt64 = make();
            opt64.update_host((1, 0), &mut w64, &[&g64]).unwrap();
            opt64.update_host((1, 0), &mut w64, &[&g64]).unwrap();
            assert!(
                opt64.state[&(1, 0)]
                    .bufs
                    .iter()
                    .all(|b| matches!(b, StateBuf::Host(_)))
            );
        }
    }
}
