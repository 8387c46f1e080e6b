//! The regression losses: squared and absolute errors, the Huber and smooth L1 losses, and the
//! relative L2 error of operator learning.

use tl_session::Train;

use super::{Reduction, same_shape};
use crate::error::usage;
use crate::{Result, Var};

/// The squared error `ℓ = (input − target)²` (same shapes), reduced. With
/// [`Reduction::Mean`] this is the catalogue's fused [`Var::mse_loss`] within rounding.
/// PyTorch: `F.mse_loss(input, target, reduction=…)` (`nn.MSELoss`).
pub fn mse_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    same_shape("mse_loss", input, target)?;
    let d = (input - target)?;
    reduction.apply((&d * &d)?)
}

/// Mean absolute error: `ℓ = |input − target|` (same shapes), gradient `sign(input − target)`
/// with sign(0) = 0. PyTorch: `F.l1_loss(input, target, reduction=…)`.
pub fn l1_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    same_shape("l1_loss", input, target)?;
    reduction.apply((input - target)?.abs()?)
}

/// The Huber loss of `d = input − target` (same shapes): `½d²` where |d| < delta, else
/// `delta·(|d| − ½delta)`; `delta` must be finite and > 0. Composed as
/// `½c² + delta·(|d| − c)` with `c = clamp(|d|, 0, delta)`. PyTorch:
/// `F.huber_loss(input, target, reduction=…, delta=…)` (default delta 1.0).
pub fn huber_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    delta: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "huber_loss";
    if !(delta.is_finite() && delta > 0.0) {
        return Err(usage(
            what,
            format!("delta must be finite and > 0, got {delta}"),
        ));
    }
    same_shape(what, input, target)?;
    reduction.apply(huber_terms(input, target, delta)?)
}

/// `½c² + delta·(|d| − c)`, `c = clamp(|d|, 0, delta)`, `d = input − target`.
fn huber_terms<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    delta: f64,
) -> Result<Var<'g, O>> {
    let a = (input - target)?.abs()?;
    let c = a.clamp(0.0, delta)?;
    &(&c * &c)?.scale(0.5)? + &(&a - &c)?.scale(delta)?
}

/// The smooth L1 loss of `d = input − target` (same shapes): `½d²/beta` where |d| < beta,
/// else `|d| − ½beta`; `beta` must be finite and ≥ 0, and `beta = 0` is [`l1_loss`] (as in
/// PyTorch). Equal to `huber_loss(delta = beta) / beta`. PyTorch:
/// `F.smooth_l1_loss(input, target, reduction=…, beta=…)` (default beta 1.0).
pub fn smooth_l1_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    beta: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "smooth_l1_loss";
    if !(beta.is_finite() && beta >= 0.0) {
        return Err(usage(
            what,
            format!("beta must be finite and >= 0, got {beta}"),
        ));
    }
    same_shape(what, input, target)?;
    if beta == 0.0 {
        return l1_loss(input, target, reduction);
    }
    reduction.apply(huber_terms(input, target, beta)?.scale(1.0 / beta)?)
}

/// The relative L2 error of each example (axis 0 is the batch; the rest are one example's
/// elements): `ℓ_b = ‖input_b − target_b‖₂ / ‖target_b‖₂`, reduced over the batch (`None`: one
/// value per example). The FNO paper's training loss (its `LpLoss(p=2)`, whose
/// `size_average=False` is [`Reduction::Sum`]). The gradient is
/// `(input_b − target_b) / (‖input_b − target_b‖·‖target_b‖)`; an example whose target is all
/// zero gives an infinite loss, and one predicted exactly a NaN gradient (as in PyTorch).
pub fn relative_l2_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "relative_l2_loss";
    same_shape(what, input, target)?;
    if input.dims().is_empty() {
        return Err(usage(
            what,
            format!("input {} needs a batch axis (B, …)", input.shape()),
        ));
    }
    let d = (input - target)?.flatten_batch()?;
    let y = target.flatten_batch()?;
    let num = (&d * &d)?.sum_axis(1)?;
    let den = (&y * &y)?.sum_axis(1)?;
    reduction.apply((&num / &den)?.sqrt()?)
}
