//! Optimizer steps in one launch per parameter ([`Device::adam_update`],
//! [`Device::momentum_update`]; kernels `tl_adam_update`, `tl_momentum_update` in
//! `kernels/optim.cu`): the coefficients as the kernels receive them, and the per-element rule
//! that the kernels and the simulation device's twins compute.
//!
//! Each element is computed as the composed step computes it, one primitive per operation
//! ([`Device::axpy_assign`], [`Device::mul`], [`Device::sqrt`], [`Device::axpy`],
//! [`Device::div`]), in the same order: the functions below are written with the simulation
//! device's per-element bodies of those primitives ([`super::sim::pointwise`]), so a fused
//! step has the composed step's bits. PyTorch comparison: `torch.optim.Adam(…, fused=True)`,
//! `torch.optim.SGD(…, momentum=…, foreach=True)`.

use super::sim::pointwise::{axpy, sqrt};
#[cfg(doc)]
use super::{Buffer, Device};

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
