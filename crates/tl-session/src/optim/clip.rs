//! Gradient clipping inside the step: by value (PyTorch's `clip_grad_value_`: every gradient
//! element clamped to `[−v, v]`) and by global norm (PyTorch's `clip_grad_norm_`: the norm of
//! all the step's gradients together, `total`; every gradient scaled by
//! `min(max_norm / (total + 1e-6), 1)`; `total` reported). When both are set the value clamp
//! comes first and the norm is taken of the clamped gradients, as the two PyTorch calls in that
//! order give. Clipping acts on the gradient before weight decay is added, as it does in a
//! PyTorch loop that clips between `backward()` and `step()`.
//!
//! The norm is computed by a pass over every gradient before any parameter changes, written
//! once against [`VecOps`] (so on a device it runs on the device: one scalar read back per
//! parameter; the ∞-norm reads the gradients back).

use tl_spec::{Scalar, Tensor};

use super::{HostOps, Optimizer, VecOps};
use crate::{Error, Result};

/// The norms a gradient can be clipped by: PyTorch's `norm_type` 1, 2 and `inf`.
pub(crate) fn norm_type_ok(p: f64) -> bool {
    p == 1.0 || p == 2.0 || p == f64::INFINITY
}

/// The learning-rate and clipping of one session step, fixed before its first update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pending {
    /// The gradient scale of norm clipping (`None`: no norm clipping).
    pub(crate) coef: Option<f64>,
    /// The total gradient norm before clipping.
    pub(crate) norm: Option<f64>,
}

/// What one session step did (PyTorch: the value `clip_grad_norm_` returns and the
/// scheduler's `get_last_lr()`). Read with [`Optimizer::last_step`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// The step's index, from 0 (the schedule's `k`).
    pub step: u64,
    /// The learning rate the step used.
    pub lr: f64,
    /// The total gradient norm before clipping, when clipping by norm is on.
    pub grad_norm: Option<f64>,
    /// The loss, when the step came from a `backward_step`.
    pub loss: Option<f64>,
}

impl Optimizer {
    /// Clip the gradients of every step to a total norm of `max_norm` (PyTorch:
    /// `clip_grad_norm_(params, max_norm, norm_type)` between `backward()` and `step()`).
    /// `norm_type` is 1, 2 or `f64::INFINITY`. An error when `max_norm` is negative or not
    /// finite, or `norm_type` is another value.
    pub fn clip_grad_norm(mut self, max_norm: f64, norm_type: f64) -> Result<Self> {
        self.clip_norm = Some((max_norm, norm_type));
        self.validate()?;
        Ok(self)
    }

    /// Clamp every gradient element to `[−clip_value, clip_value]` at every step (PyTorch:
    /// `clip_grad_value_(params, clip_value)`). An error when `clip_value` is negative or not
    /// finite.
    pub fn clip_grad_value(mut self, clip_value: f64) -> Result<Self> {
        self.clip_value = Some(clip_value);
        self.validate()?;
        Ok(self)
    }

    /// Refuse (`true`) a `backward_step` whose loss is NaN or ±∞, before anything changes,
    /// with [`Error::NonFiniteLoss`] naming the step; the default (`false`) steps anyway, as
    /// PyTorch does.
    pub fn stop_on_non_finite_loss(mut self, on: bool) -> Self {
        self.stop_non_finite_loss = on;
        self
    }

    /// Whether a `backward_step` with a non-finite loss is refused
    /// ([`Optimizer::stop_on_non_finite_loss`]).
    pub fn stops_on_non_finite_loss(&self) -> bool {
        self.stop_non_finite_loss
    }

    /// What the last completed session step did: its index, learning rate, gradient norm (with
    /// norm clipping) and loss. `None` before the first step.
    pub fn last_step(&self) -> Option<StepStats> {
        self.last
    }

    /// The clipping set: by global norm `(max_norm, norm_type)`
    /// ([`Optimizer::clip_grad_norm`]) and by value ([`Optimizer::clip_grad_value`]).
    pub fn clipping(&self) -> (Option<(f64, f64)>, Option<f64>) {
        (self.clip_norm, self.clip_value)
    }

    /// The number of session steps completed (the index of the next one).
    pub fn steps_done(&self) -> u64 {
        self.steps
    }

    /// Check the loss of the step about to run (sessions call this between the forward pass
    /// and the backward): with [`Optimizer::stop_on_non_finite_loss`] on, a non-finite loss
    /// is an error and nothing is stepped.
    pub(crate) fn observe_loss(&mut self, loss: f64) -> Result<()> {
        self.pending_loss = None;
        if self.stop_non_finite_loss && !loss.is_finite() {
            return Err(Error::NonFiniteLoss {
                step: self.steps,
                value: loss,
            });
        }
        self.pending_loss = Some(loss);
        Ok(())
    }

    /// The loss [`observe_loss`](Self::observe_loss) last accepted, taken (a step stopped after
    /// its gradients reports it from here: `Train::backward_grads_then_reset`).
    pub(crate) fn take_observed_loss(&mut self) -> Option<f64> {
        self.pending_loss.take()
    }

    /// Begin a session step whose gradients (per parameter, one entry per use) are on the
    /// host: check the hyper-parameters and the schedule, and take the gradient norm when
    /// clipping by norm.
    pub(crate) fn begin_step_host<T: Scalar>(&mut self, grads: &[Vec<&Tensor<T>>]) -> Result<()> {
        if self.clip_norm.is_none() {
            return self.begin_step(&mut HostOps, &[]);
        }
        let sums: Vec<Vec<f64>> = grads
            .iter()
            .map(|gs| {
                let n = gs.first().map_or(0, |g| g.numel());
                let mut s = vec![0.0f64; n];
                for g in gs {
                    s.iter_mut()
                        .zip(g.data())
                        .for_each(|(a, b)| *a += b.as_f64());
                }
                s
            })
            .collect();
        let refs: Vec<Vec<&Vec<f64>>> = sums.iter().map(|s| vec![s]).collect();
        self.begin_step(&mut HostOps, &refs)
    }

    /// Begin a session step (see [`Optimizer::begin_step_host`]) with the gradients as `ops`
    /// vectors; several uses of a parameter are summed first.
    pub(crate) fn begin_step<O: VecOps>(
        &mut self,
        ops: &mut O,
        grads: &[Vec<&O::V>],
    ) -> Result<()> {
        self.pending = None;
        self.validate()?;
        self.lr_now()?;
        let Some((max_norm, p)) = self.clip_norm else {
            self.pending = Some(Pending {
                coef: None,
                norm: None,
            });
            return Ok(());
        };
        let mut acc = 0.0f64;
        for gs in grads {
            let Some((&first, rest)) = gs.split_first() else {
                continue;
            };
            let part = self.norm_part(ops, first, rest, p)?;
            acc = if p == f64::INFINITY {
                if acc.is_nan() || part.is_nan() {
                    f64::NAN
                } else {
                    acc.max(part)
                }
            } else {
                acc + part
            };
        }
        let total = if p == 2.0 { acc.sqrt() } else { acc };
        let coef = max_norm / (total + 1e-6);
        // PyTorch's clamp(max=1): a NaN stays NaN (f64::min would drop it).
        let coef = if coef > 1.0 { 1.0 } else { coef };
        self.pending = Some(Pending {
            coef: Some(coef),
            norm: Some(total),
        });
        Ok(())
    }

    /// `Σ|g|^p` (p = 1, 2) or `max|g|` (p = ∞) of one parameter's gradient `first + Σ rest`,
    /// after the value clamp.
    fn norm_part<O: VecOps>(
        &self,
        ops: &mut O,
        first: &O::V,
        rest: &[&O::V],
        p: f64,
    ) -> Result<f64> {
        let mut temps = Vec::new();
        let r = (|| {
            let mut g = first;
            if !rest.is_empty() {
                let mut s = ops.copy(first)?;
                for x in rest {
                    if let Err(e) = ops.axpy_assign(&mut s, 1.0, x) {
                        ops.release(s);
                        return Err(e);
                    }
                }
                temps.push(s);
                g = temps.last().expect("pushed");
            }
            if let Some(v) = self.clip_value {
                let c = ops.clamp(g, -v, v)?;
                temps.push(c);
                g = temps.last().expect("pushed");
            }
            ops.norm_part(g, p)
        })();
        temps.into_iter().for_each(|t| ops.release(t));
        r
    }

    /// End a session step: on success count it and keep its [`StepStats`]; either way forget
    /// the step's clipping.
    pub(crate) fn end_step(&mut self, ok: bool) {
        let pending = self.pending.take();
        let loss = self.pending_loss.take();
        if ok {
            self.last = Some(StepStats {
                step: self.steps,
                lr: self.lr_now().unwrap_or(f64::NAN),
                grad_norm: pending.and_then(|p| p.norm),
                loss,
            });
            self.steps += 1;
        }
    }

    /// The gradient scale of the step in progress (1 without norm clipping).
    pub(crate) fn grad_coef(&self) -> f64 {
        self.pending.and_then(|p| p.coef).unwrap_or(1.0)
    }

    /// Apply the step's clipping to the effective gradient `ge` (a fresh copy).
    pub(crate) fn clip_in_place<O: VecOps>(&self, ops: &mut O, ge: &mut O::V) -> Result<()> {
        if let Some(v) = self.clip_value {
            let c = ops.clamp(ge, -v, v)?;
            let old = std::mem::replace(ge, c);
            ops.release(old);
        }
        let coef = self.grad_coef();
        if coef != 1.0 {
            ops.scale_assign(ge, coef)?;
        }
        Ok(())
    }
}
