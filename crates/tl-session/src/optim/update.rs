//! One parameter's update written once against [`VecOps`] ([`Optimizer::update`]): the
//! rules' formulas, the fused device steps and the transactional finite check.

use super::*;

impl Optimizer {
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
    pub(super) fn fused_coefs<O: VecOps>(
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

    pub(super) fn update_inner<O: VecOps>(
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
pub(super) fn non_finite(
    optimizer: &'static str,
    key: (u64, usize),
    index: usize,
    value: f64,
) -> Error {
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
pub(super) enum Fused {
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
