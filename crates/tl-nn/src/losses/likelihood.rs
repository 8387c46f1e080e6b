//! The likelihood losses and the KL divergence: [`kl_div`], [`poisson_nll_loss`],
//! [`gaussian_nll_loss`].

use tl_session::Train;

use super::{HUGE, Reduction, TINY, finite, same_shape};
use crate::error::usage;
use crate::{Result, Var};

/// How [`kl_div`] reduces its per-element values: [`Reduction`]'s three and PyTorch's
/// `"batchmean"`, the one that gives the KL divergence of each example averaged over the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KlReduction {
    /// The mean over every element (PyTorch's default, which warns that it is not the KL
    /// divergence's mean: use [`KlReduction::BatchMean`]).
    #[default]
    Mean,
    /// The sum divided by the length of axis 0 (the sum for a scalar input).
    BatchMean,
    /// The sum over elements.
    Sum,
    /// One value per element.
    None,
}

/// The Kullback–Leibler divergence's terms of `target` (probabilities q, or their logs with
/// `log_target`) from `input` (the log-probabilities log p, the same shape):
/// `ℓ = q·(ln q − log p)`, with `0·ln 0 = 0` (PyTorch's `xlogy`), or with `log_target`
/// `ℓ = e^t·(t − log p)`; reduced by `reduction`. A target of exactly 0 adds 0 to the loss
/// and to the input's gradient (`−q`); the target's own gradient there is `ln(1e-30) − log p`
/// where PyTorch gives `−log p` (`ln q` is taken of q clamped to 1e-30, so that 0 is no
/// error). A negative target is not checked (PyTorch gives NaN): its log is clamped as for 0.
/// PyTorch:
/// `F.kl_div(input, target, reduction=…, log_target=…)` (`nn.KLDivLoss`).
pub fn kl_div<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    reduction: KlReduction,
    log_target: bool,
) -> Result<Var<'g, O>> {
    same_shape("kl_div", input, target)?;
    let terms = if log_target {
        (&target.exp()? * &(target - input)?)?
    } else {
        (target * &(&target.clamp(TINY, HUGE)?.log()? - input)?)?
    };
    match reduction {
        KlReduction::Mean => terms.mean(),
        KlReduction::Sum => terms.sum(),
        KlReduction::None => Ok(terms),
        KlReduction::BatchMean => match input.dims().first() {
            Some(&n) => terms.sum()?.scale(1.0 / n as f64),
            None => terms.sum(),
        },
    }
}

/// The negative log-likelihood of `target` counts under a Poisson distribution of rate
/// `input` (the same shape): with `log_input` (the input is the log-rate, PyTorch's default)
/// `ℓ = eˣ − y·x`, else `ℓ = x − y·ln(x + eps)` (`eps` ≥ 0 keeps the log finite at a rate of
/// 0; a rate with `x + eps ≤ 0` is the `log` op's error on the CPU). With `full` the Stirling
/// term `y·ln y − y + ½·ln(2πy)` is added where y > 1 (PyTorch's; 0 where y ≤ 1). PyTorch:
/// `F.poisson_nll_loss(input, target, log_input=…, full=…, eps=…, reduction=…)`
/// (`nn.PoissonNLLLoss`).
pub fn poisson_nll_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    log_input: bool,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "poisson_nll_loss";
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(usage(
            what,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    same_shape(what, input, target)?;
    let mut loss = if log_input {
        (&input.exp()? - &(target * input)?)?
    } else {
        (input - &(target * &input.add_scalar(eps)?.log()?)?)?
    };
    if full {
        loss = (&loss + &stirling_above_one(target)?)?;
    }
    reduction.apply(loss)
}

/// `y·ln y − y + ½·ln(2πy)` where y > 1, 0 elsewhere: the term computed at `max(y, 1)` (so
/// that its log is of a value ≥ 1) times the mask `[y > 1]`, which no catalogue op gives
/// directly: `r / (r + 1e-30)` with `r = relu(y − 1)`, 0 for y ≤ 1 and 1 (in f32 exactly;
/// in f64 within 5e-15, for y within 1e-14 of 1) above, detached as PyTorch's `masked_fill`.
fn stirling_above_one<'g, O: Train>(y: &Var<'g, O>) -> Result<Var<'g, O>> {
    let r = y.add_scalar(-1.0)?.relu()?;
    let mask = (&r / &r.add_scalar(TINY)?)?.detach()?;
    let y1 = y.clamp(1.0, HUGE)?;
    let log_y1 = y1.log()?;
    let half_log = y1.scale(2.0 * std::f64::consts::PI)?.log()?.scale(0.5)?;
    let term = (&(&(&y1 * &log_y1)? - &y1)? + &half_log)?;
    &mask * &term
}

/// The negative log-likelihood of `target` under Gaussians of mean `input` and variance `var`:
/// `ℓ = ½·(ln v + (x − y)²/v)` (+ `½·ln 2π` with `full`), where v is `var` clamped below at
/// `eps` (finite, > 0) without changing its gradient (PyTorch clamps under `no_grad`: a
/// variance under `eps` still receives the gradient at `eps`). `input` and `target` have one
/// shape; `var` has it too, or lacks its last axis (one variance per row, homoscedastic), or
/// has the same rank with one axis of length 1 where the input's differs (anything else is an
/// error naming the shapes). A negative variance is not checked (PyTorch raises): it is
/// clamped as one under `eps`. PyTorch: `F.gaussian_nll_loss(input, target, var, full=…,
/// eps=…, reduction=…)` (`nn.GaussianNLLLoss`).
pub fn gaussian_nll_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    var: &Var<'g, O>,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "gaussian_nll_loss";
    finite(what, "eps", eps)?;
    if eps <= 0.0 {
        return Err(usage(what, format!("eps must be > 0, got {eps}")));
    }
    same_shape(what, input, target)?;
    let (x, v) = (input.dims(), var.dims());
    let var = if v == x {
        var.clone()
    } else if x.split_last().is_some_and(|(_, rows)| rows == v) {
        let mut dims = v.to_vec();
        dims.push(1);
        var.reshape(&dims)?
    } else if x.len() == v.len()
        && x.iter()
            .zip(v)
            .filter(|(a, b)| a != b)
            .map(|(_, b)| b)
            .sum::<usize>()
            == 1
    {
        var.clone()
    } else {
        return Err(usage(
            what,
            format!(
                "var {} must have the input's shape {}, lack its last axis, or have one axis of length 1 where the input's differs",
                var.shape(),
                input.shape()
            ),
        ));
    };
    // v + detach(max(v, eps) − v): the clamped value, the unclamped gradient.
    let lift = (&var.clamp(eps, HUGE)? - &var)?.detach()?;
    let v = (&var + &lift)?;
    let d = (input - target)?;
    let mut loss = (&v.log()? + &(&(&d * &d)? / &v)?)?.scale(0.5)?;
    if full {
        loss = loss.add_scalar(0.5 * (2.0 * std::f64::consts::PI).ln())?;
    }
    reduction.apply(loss)
}
