//! Optimizer steps in one launch per parameter ([`Device::adam_update`],
//! [`Device::momentum_update`]) or per list of up to [`OPTIM_LIST_MAX`] parameters
//! ([`Device::adam_update_list`], [`Device::momentum_update_list`]), both by the kernels
//! `tl_adam_update_list`, `tl_momentum_update_list` in `kernels/optim.cu` (one parameter: a
//! list of one): the coefficients as the kernels receive
//! them, the per-element rule that the kernels and the simulation device's twins compute, and
//! the list forms' operand checks and launch grouping.
//!
//! Each element is computed as the composed step computes it, one primitive per operation
//! ([`Device::axpy_assign`], [`Device::mul`], [`Device::sqrt`], [`Device::axpy`],
//! [`Device::div`]), in the same order: the functions below are written with the simulation
//! device's per-element bodies of those primitives ([`super::sim::pointwise`]), so a fused
//! step has the composed step's bits. PyTorch comparison: `torch.optim.Adam(…, fused=True)`,
//! `torch.optim.SGD(…, momentum=…, foreach=True)`.

use std::collections::HashSet;

use super::Buffer;
#[cfg(doc)]
use super::Device;
use super::check;
use super::sim::pointwise::{axpy, sqrt};
use crate::{Error, Result};

/// The parameters one list launch takes ([`Device::adam_update_list`],
/// [`Device::momentum_update_list`]): the kernels' slots, eight as `tl_axpy_assign_list`'s
/// (48 bytes of kernel parameters a slot for Adam, far inside the 4 KiB parameter space).
pub const OPTIM_LIST_MAX: usize = 8;

/// One Adam(W) step's coefficients, `f32` as the kernel receives them. Per element, with `g`
/// the gradient:
///
/// ```text
/// decay: w ← w + decay·w            l2: g ← g + l2·w
/// m ← m + b1m1·m ; m ← m + omb1·g
/// v ← v + b2m1·v ; v ← v + omb2·(g·g)
/// w ← w + step·(m / (eps + inv_sqrt_bc2·sqrt(max(v, 0))))
/// ```
///
/// each operation rounded to `f32` once (no fused multiply-add). For PyTorch's Adam at step
/// `t`: `b1m1 = β₁ − 1`, `omb1 = 1 − β₁` (likewise β₂), `inv_sqrt_bc2 = 1/sqrt(1 − β₂ᵗ)`,
/// `step = −lr/(1 − β₁ᵗ)`; AdamW's `decay = −lr·λ`, Adam's `l2 = λ`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamUpdate {
    /// Decoupled weight decay's coefficient (`None`: none).
    pub decay: Option<f32>,
    /// L2 weight decay's coefficient (`None`: none).
    pub l2: Option<f32>,
    /// `β₁ − 1`.
    pub b1m1: f32,
    /// `1 − β₁`.
    pub omb1: f32,
    /// `β₂ − 1`.
    pub b2m1: f32,
    /// `1 − β₂`.
    pub omb2: f32,
    /// `1/sqrt(1 − β₂ᵗ)`.
    pub inv_sqrt_bc2: f32,
    /// ε.
    pub eps: f32,
    /// `−lr/(1 − β₁ᵗ)`.
    pub step: f32,
}

impl AdamUpdate {
    /// One element: `(w, m, v)` after the step, from their values and the gradient `g`.
    pub fn element(&self, w: f32, m: f32, v: f32, g: f32) -> (f32, f32, f32) {
        let w = self.decay.map_or(w, |c| axpy(w, w, c));
        let g = self.l2.map_or(g, |c| axpy(g, w, c));
        let m = axpy(axpy(m, m, self.b1m1), g, self.omb1);
        let v = axpy(axpy(v, v, self.b2m1), g * g, self.omb2);
        let denom = axpy(self.eps, sqrt(v), self.inv_sqrt_bc2);
        (axpy(w, m / denom, self.step), m, v)
    }

    /// Whether a step with `other`'s coefficients can share one list launch with this one:
    /// every coefficient the kernel takes for the whole list (all but the bias corrections
    /// `inv_sqrt_bc2` and `step`, which come per slot) has the same bits.
    pub fn shares_launch_with(&self, other: &AdamUpdate) -> bool {
        let list = |c: &AdamUpdate| {
            [
                c.decay.map(f32::to_bits),
                c.l2.map(f32::to_bits),
                Some(c.b1m1.to_bits()),
                Some(c.omb1.to_bits()),
                Some(c.b2m1.to_bits()),
                Some(c.omb2.to_bits()),
                Some(c.eps.to_bits()),
            ]
        };
        list(self) == list(other)
    }
}

/// One parameter of [`Device::adam_update_list`]: its value `w`, its moments `m`, `v`, its
/// gradient `g` and its step's coefficients (the bias corrections follow the parameter's own
/// step count).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamSlot {
    /// The parameter, updated in place.
    pub w: Buffer,
    /// The first moment, updated in place.
    pub m: Buffer,
    /// The second moment, updated in place.
    pub v: Buffer,
    /// The gradient, read.
    pub g: Buffer,
    /// The step's coefficients.
    pub c: AdamUpdate,
}

/// One parameter of [`Device::momentum_update_list`]: its value `w`, its momentum buffer `b`
/// and its gradient `g` (the coefficients are the list's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumSlot {
    /// The parameter, updated in place.
    pub w: Buffer,
    /// The momentum buffer, updated in place.
    pub b: Buffer,
    /// The gradient, read.
    pub g: Buffer,
}

/// `e` (an operand error of one slot) with the slot's index in its detail.
fn in_slot(k: usize, e: Error) -> Error {
    match e {
        Error::Kernel { op, detail } => Error::kernel(op, format!("slot {k}: {detail}")),
        e => e,
    }
}

/// The checks of a list step whose slots hold the buffers `slots` (named as `names` say, the
/// written ones first, the gradient last): within each slot the lengths agree and the buffers
/// are distinct, as the one-parameter step requires (an error naming `op` and the slot).
/// Returns whether a buffer occurs in two slots: such a list runs one parameter at a time, in
/// order.
pub(crate) fn check_list<const N: usize>(
    op: &'static str,
    names: [&str; N],
    slots: impl ExactSizeIterator<Item = [Buffer; N]> + Clone,
) -> Result<bool> {
    let mut seen = HashSet::with_capacity(N * slots.len());
    let mut shared = false;
    for (k, bufs) in slots.enumerate() {
        let r = bufs[1..]
            .iter()
            .try_for_each(|&b| check::same_len(op, bufs[0], b).map(drop))
            .and_then(|()| {
                let named: [(&str, Buffer); N] = std::array::from_fn(|i| (names[i], bufs[i]));
                check::distinct(op, &named)
            });
        r.map_err(|e| in_slot(k, e))?;
        // Distinct within the slot: a repeat is another slot's buffer.
        shared |= !bufs.iter().all(|b| seen.insert(b.id()));
    }
    Ok(shared)
}

/// The launches of an Adam list whose buffers are all distinct: the slots grouped by the
/// coefficients they share ([`AdamUpdate::shares_launch_with`]; in a step every parameter
/// usually has the same step count, so one group), in the order each group first occurs,
/// each group cut into runs of [`OPTIM_LIST_MAX`].
pub(crate) fn adam_launches(slots: &[AdamSlot]) -> Vec<Vec<AdamSlot>> {
    let mut groups: Vec<Vec<AdamSlot>> = Vec::new();
    for s in slots {
        match groups.iter_mut().find(|g| g[0].c.shares_launch_with(&s.c)) {
            Some(g) => g.push(*s),
            None => groups.push(vec![*s]),
        }
    }
    groups
        .iter()
        .flat_map(|g| g.chunks(OPTIM_LIST_MAX).map(<[AdamSlot]>::to_vec))
        .collect()
}

/// One momentum SGD step's coefficients (a step after the first, whose momentum buffer is
/// the gradient itself), `f32` as the kernel receives them. Per element, with `g` the
/// gradient:
///
/// ```text
/// l2: g ← g + l2·w
/// b ← b + mom_m1·b ; b ← b + omd·g
/// nesterov: w ← w + step·(g + momentum·b)      else: w ← w + step·b
/// ```
///
/// each operation rounded to `f32` once. For PyTorch's SGD: `mom_m1 = μ − 1`, `omd = 1 −
/// dampening`, `momentum = μ`, `step = −lr`, `l2 = λ`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumUpdate {
    /// L2 weight decay's coefficient (`None`: none).
    pub l2: Option<f32>,
    /// `μ − 1`.
    pub mom_m1: f32,
    /// `1 − dampening`.
    pub omd: f32,
    /// μ, read by the Nesterov form.
    pub momentum: f32,
    /// Whether the step takes the Nesterov form.
    pub nesterov: bool,
    /// `−lr`.
    pub step: f32,
}

impl MomentumUpdate {
    /// One element: `(w, b)` after the step, from their values and the gradient `g`.
    pub fn element(&self, w: f32, b: f32, g: f32) -> (f32, f32) {
        let g = self.l2.map_or(g, |c| axpy(g, w, c));
        let b = axpy(axpy(b, b, self.mom_m1), g, self.omd);
        let dir = if self.nesterov {
            axpy(g, b, self.momentum)
        } else {
            b
        };
        (axpy(w, dir, self.step), b)
    }
}
