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
mod host;
mod hyper;
mod rules;
mod schedule;
mod state;
mod update;
mod vec_ops;

use std::collections::HashMap;

pub use clip::StepStats;
pub use host::HOST_BLOCK;
pub use schedule::Schedule;
pub use state::{STATE_BOUND, StateDict};
pub(crate) use state::{export as export_state, import as import_state};
pub use update::{AdamStep, MomentumStep};
use update::{Fused, non_finite};
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
}
