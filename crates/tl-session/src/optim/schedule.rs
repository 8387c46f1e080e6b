//! Learning-rate schedules: the learning rate of step `k` (counted from 0) as a closed form of
//! `k` and the optimizer's base `lr`, with the formulas of PyTorch's `torch.optim.lr_scheduler`
//! (`StepLR`, `MultiStepLR`, `ExponentialLR`, `LinearLR`, `CosineAnnealingLR` after a
//! `LinearLR` warm-up as `SequentialLR` chains them, `OneCycleLR`).
//!
//! An optimizer with a schedule ([`Optimizer::schedule`](crate::Optimizer::schedule)) consults
//! it at every session step: step `k` runs with `lr_at(k)`, as a PyTorch loop that calls
//! `scheduler.step()` after each `optimizer.step()` does. Being a function of the step index
//! alone, the schedule resumes from a checkpoint by its index (`lr_scheduler.last_epoch` in
//! the optimizer state).

use crate::{Error, Result};

/// A learning-rate schedule (PyTorch: `torch.optim.lr_scheduler`). Build one with the
/// constructors, which refuse values outside each schedule's domain with an
/// [`Error::Hyperparameter`] naming the value.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// `StepLR`: `lr · γ^⌊k / step_size⌋`.
    Step {
        /// Steps between decays (≥ 1).
        step_size: u64,
        /// Decay factor γ (> 0).
        gamma: f64,
    },
    /// `MultiStepLR`: `lr · γ^(number of milestones ≤ k)`.
    MultiStep {
        /// The steps at which the rate is multiplied by γ, sorted.
        milestones: Vec<u64>,
        /// Decay factor γ (> 0).
        gamma: f64,
    },
    /// `ExponentialLR`: `lr · γ^k`.
    Exponential {
        /// Decay factor γ (> 0).
        gamma: f64,
    },
    /// `LinearLR` (a linear warm-up): `lr · (s + (e − s) · min(k, n) / n)`.
    Linear {
        /// The factor s at step 0 (in (0, 1]; PyTorch's default 1/3).
        start_factor: f64,
        /// The factor e from step n on (in [0, 1]; PyTorch's default 1).
        end_factor: f64,
        /// n, the steps of the ramp (≥ 1; PyTorch's default 5).
        total_iters: u64,
    },
    /// A linear warm-up from `lr · s` over `warmup` steps, then cosine annealing from `lr` to
    /// `eta_min` over `t_max` steps (PyTorch: `SequentialLR([LinearLR(s, 1, warmup),
    /// CosineAnnealingLR(t_max, eta_min)], milestones=[warmup])`). Past `t_max` the cosine
    /// continues as PyTorch's does (rising again with period `2·t_max`).
    CosineWarmup {
        /// Warm-up steps (0: none).
        warmup: u64,
        /// The warm-up's start factor s (in (0, 1]).
        start_factor: f64,
        /// Steps from `lr` down to `eta_min` (≥ 1).
        t_max: u64,
        /// The lowest rate (finite, ≥ 0).
        eta_min: f64,
    },
    /// `OneCycleLR` with cosine annealing, two phases: from `max_lr / div_factor` up to
    /// `max_lr` over the first `pct_start` of `total_steps`, then down to
    /// `max_lr / div_factor / final_div_factor`. The optimizer's own `lr` is not used
    /// (PyTorch sets it from `max_lr`); momentum is not cycled (PyTorch's
    /// `cycle_momentum=False`). Step `total_steps + 1` and later are an error, as in PyTorch.
    OneCycle {
        /// The peak rate (finite, > 0).
        max_lr: f64,
        /// The cycle's length in steps.
        total_steps: u64,
        /// The share of the cycle spent rising (PyTorch's default 0.3).
        pct_start: f64,
        /// `initial_lr = max_lr / div_factor` (PyTorch's default 25).
        div_factor: f64,
        /// `min_lr = initial_lr / final_div_factor` (PyTorch's default 1e4).
        final_div_factor: f64,
    },
}

fn bad(schedule: &'static str, name: &'static str, value: f64, expected: &'static str) -> Error {
    Error::Hyperparameter {
        optimizer: schedule,
        name,
        value,
        expected,
    }
}

fn positive(schedule: &'static str, name: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(schedule, name, v, "a finite value > 0"))
    }
}

fn period(schedule: &'static str, name: &'static str, v: u64) -> Result<()> {
    if v >= 1 {
        Ok(())
    } else {
        Err(bad(schedule, name, v as f64, "a step count ≥ 1"))
    }
}

/// PyTorch's `_annealing_cos(start, end, pct)`, in its order of operations.
fn annealing_cos(start: f64, end: f64, pct: f64) -> f64 {
    let cos_out = (std::f64::consts::PI * pct).cos() + 1.0;
    end + (start - end) / 2.0 * cos_out
}

impl Schedule {
    /// `StepLR(step_size, gamma)`; an error when `step_size` is 0 or γ is not a finite value
    /// > 0.
    pub fn step(step_size: u64, gamma: f64) -> Result<Schedule> {
        Schedule::Step { step_size, gamma }.checked()
    }

    /// `MultiStepLR(milestones, gamma)` (milestones in any order; a repeated one counts
    /// twice, as in PyTorch); an error when γ is not a finite value > 0.
    pub fn multi_step(milestones: &[u64], gamma: f64) -> Result<Schedule> {
        let mut milestones = milestones.to_vec();
        milestones.sort_unstable();
        Schedule::MultiStep { milestones, gamma }.checked()
    }

    /// `ExponentialLR(gamma)`; an error when γ is not a finite value > 0.
    pub fn exponential(gamma: f64) -> Result<Schedule> {
        Schedule::Exponential { gamma }.checked()
    }

    /// `LinearLR(start_factor, end_factor, total_iters)`; an error when `start_factor` lies
    /// outside (0, 1], `end_factor` outside [0, 1], or `total_iters` is 0.
    pub fn linear(start_factor: f64, end_factor: f64, total_iters: u64) -> Result<Schedule> {
        Schedule::Linear {
            start_factor,
            end_factor,
            total_iters,
        }
        .checked()
    }

    /// A linear warm-up over `warmup` steps from `lr · start_factor`, then cosine annealing to
    /// `eta_min` over `t_max` steps (see [`Schedule::CosineWarmup`]); an error when `t_max` is
    /// 0, `start_factor` lies outside (0, 1] or `eta_min` is negative or not finite.
    pub fn cosine_warmup(
        warmup: u64,
        start_factor: f64,
        t_max: u64,
        eta_min: f64,
    ) -> Result<Schedule> {
        Schedule::CosineWarmup {
            warmup,
            start_factor,
            t_max,
            eta_min,
        }
        .checked()
    }

    /// `OneCycleLR(max_lr, total_steps)` with PyTorch's defaults (`pct_start` 0.3,
    /// `div_factor` 25, `final_div_factor` 1e4, cosine annealing); see
    /// [`Schedule::one_cycle_with`].
    pub fn one_cycle(max_lr: f64, total_steps: u64) -> Result<Schedule> {
        Self::one_cycle_with(max_lr, total_steps, 0.3, 25.0, 1e4)
    }

    /// `OneCycleLR` with every parameter; an error when `max_lr`, `div_factor` or
    /// `final_div_factor` is not a finite value > 0, or `pct_start` does not leave both
    /// phases at least one step (`1 < pct_start · total_steps < total_steps`; PyTorch divides
    /// by zero there).
    pub fn one_cycle_with(
        max_lr: f64,
        total_steps: u64,
        pct_start: f64,
        div_factor: f64,
        final_div_factor: f64,
    ) -> Result<Schedule> {
        Schedule::OneCycle {
            max_lr,
            total_steps,
            pct_start,
            div_factor,
            final_div_factor,
        }
        .checked()
    }

    /// `self` if its values lie in the schedule's domain, else the error naming the first that
    /// does not.
    fn checked(self) -> Result<Schedule> {
        self.validate()?;
        Ok(self)
    }

    /// The name errors print: PyTorch's class name.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Step { .. } => "StepLR",
            Schedule::MultiStep { .. } => "MultiStepLR",
            Schedule::Exponential { .. } => "ExponentialLR",
            Schedule::Linear { .. } => "LinearLR",
            Schedule::CosineWarmup { .. } => "CosineAnnealingLR with warm-up",
            Schedule::OneCycle { .. } => "OneCycleLR",
        }
    }

    /// Check every parameter against its domain (the constructors do; the variants' fields
    /// are public, so the optimizer checks again before each step).
    pub fn validate(&self) -> Result<()> {
        let name = self.name();
        let unit_open_closed = |v: f64| v > 0.0 && v <= 1.0;
        match *self {
            Schedule::Step { step_size, gamma } => {
                period(name, "step_size", step_size)?;
                positive(name, "gamma", gamma)
            }
            Schedule::MultiStep { gamma, .. } | Schedule::Exponential { gamma } => {
                positive(name, "gamma", gamma)
            }
            Schedule::Linear {
                start_factor,
                end_factor,
                total_iters,
            } => {
                if !unit_open_closed(start_factor) {
                    return Err(bad(name, "start_factor", start_factor, "a value in (0, 1]"));
                }
                if !(0.0..=1.0).contains(&end_factor) {
                    return Err(bad(name, "end_factor", end_factor, "a value in [0, 1]"));
                }
                period(name, "total_iters", total_iters)
            }
            Schedule::CosineWarmup {
                start_factor,
                t_max,
                eta_min,
                ..
            } => {
                if !unit_open_closed(start_factor) {
                    return Err(bad(name, "start_factor", start_factor, "a value in (0, 1]"));
                }
                period(name, "t_max", t_max)?;
                if !(eta_min.is_finite() && eta_min >= 0.0) {
                    return Err(bad(name, "eta_min", eta_min, "a finite value ≥ 0"));
                }
                Ok(())
            }
            Schedule::OneCycle {
                max_lr,
                total_steps,
                pct_start,
                div_factor,
                final_div_factor,
            } => {
                positive(name, "max_lr", max_lr)?;
                period(name, "total_steps", total_steps)?;
                positive(name, "div_factor", div_factor)?;
                positive(name, "final_div_factor", final_div_factor)?;
                let rise = pct_start * total_steps as f64;
                if !(pct_start.is_finite() && rise > 1.0 && rise < total_steps as f64) {
                    return Err(bad(
                        name,
                        "pct_start",
                        pct_start,
                        "a value with 1 < pct_start · total_steps < total_steps (both phases at least one step)",
                    ));
                }
                Ok(())
            }
        }
    }

    /// The learning rate of step `k` (from 0) for an optimizer whose own rate is `base`. An
    /// error, naming the schedule, for a schedule [`Schedule::validate`] refuses (its fields
    /// are public), past a one-cycle schedule's end (PyTorch raises there too), and where the
    /// rate is not finite and ≥ 0 (an exponential γ > 1 overflows after enough steps, where
    /// PyTorch steps on with an infinite rate): a session step stops there, before anything
    /// changes.
    pub fn lr_at(&self, base: f64, k: u64) -> Result<f64> {
        self.validate()?;
        let lr = self.rate(base, k)?;
        if lr.is_finite() && lr >= 0.0 {
            return Ok(lr);
        }
        Err(Error::Usage {
            what: self.name(),
            detail: format!(
                "the learning rate of step {k} is {lr} (base rate {base}): not a finite rate ≥ 0"
            ),
        })
    }

    /// [`Schedule::lr_at`]'s formula.
    fn rate(&self, base: f64, k: u64) -> Result<f64> {
        let kf = k as f64;
        Ok(match *self {
            Schedule::Step { step_size, gamma } => base * gamma.powf((k / step_size) as f64),
            Schedule::MultiStep {
                ref milestones,
                gamma,
            } => {
                let passed = milestones.iter().filter(|&&m| m <= k).count();
                base * gamma.powf(passed as f64)
            }
            Schedule::Exponential { gamma } => base * gamma.powf(kf),
            Schedule::Linear {
                start_factor,
                end_factor,
                total_iters,
            } => {
                let ramp = k.min(total_iters) as f64 / total_iters as f64;
                base * (start_factor + (end_factor - start_factor) * ramp)
            }
            Schedule::CosineWarmup {
                warmup,
                start_factor,
                t_max,
                eta_min,
            } => {
                if k < warmup {
                    base * (start_factor + (1.0 - start_factor) * kf / warmup as f64)
                } else {
                    let j = (k - warmup) as f64;
                    let c = (std::f64::consts::PI * j / t_max as f64).cos();
                    eta_min + (base - eta_min) * (1.0 + c) / 2.0
                }
            }
            Schedule::OneCycle {
                max_lr,
                total_steps,
                pct_start,
                div_factor,
                final_div_factor,
            } => {
                if k > total_steps {
                    return Err(Error::Usage {
                        what: "OneCycleLR",
                        detail: format!(
                            "step {k} is past the cycle's total_steps = {total_steps}; build a longer schedule"
                        ),
                    });
                }
                let initial = max_lr / div_factor;
                let min_lr = initial / final_div_factor;
                let end1 = pct_start * total_steps as f64 - 1.0;
                let end2 = total_steps as f64 - 1.0;
                if kf <= end1 {
                    annealing_cos(initial, max_lr, kf / end1)
                } else {
                    annealing_cos(max_lr, min_lr, (kf - end1) / (end2 - end1))
                }
            }
        })
    }
}
