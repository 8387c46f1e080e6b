//! The margin and embedding losses: [`margin_ranking_loss`], [`hinge_embedding_loss`],
//! [`soft_margin_loss`], [`multi_margin_loss`], [`cosine_embedding_loss`],
//! [`triplet_margin_loss`].
//!
//! The targets of the hinge and cosine embedding losses are 1 or −1; such a loss is written
//! `a·(the y = 1 branch) + b·(the y = −1 branch)` with `a = (1 + y)/2`, `b = (1 − y)/2`, which
//! is PyTorch's value and gradient for y = ±1 (another target value gives the blend, where
//! PyTorch's hinge loss adds both branches and its cosine loss neither).

use tl_session::Train;

use super::classification::ClassRows;
use super::{Reduction, finite, same_shape};
use crate::error::usage;
use crate::{Labels, Result, Var};

/// `((1 + y)/2, (1 − y)/2)`: 1 and 0 for y = 1, 0 and 1 for y = −1.
fn branches<'g, O: Train>(y: &Var<'g, O>) -> Result<(Var<'g, O>, Var<'g, O>)> {
    Ok((
        y.add_scalar(1.0)?.scale(0.5)?,
        y.scale(-1.0)?.add_scalar(1.0)?.scale(0.5)?,
    ))
}

/// The ranking loss of two inputs and a target y (1: `input1` should rank higher, −1: lower),
/// all one shape: `ℓ = max(0, −y·(x₁ − x₂) + margin)`. PyTorch:
/// `F.margin_ranking_loss(x1, x2, y, margin=…, reduction=…)` (`nn.MarginRankingLoss`;
/// default margin 0).
pub fn margin_ranking_loss<'g, O: Train>(
    input1: &Var<'g, O>,
    input2: &Var<'g, O>,
    target: &Var<'g, O>,
    margin: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "margin_ranking_loss";
    finite(what, "margin", margin)?;
    same_shape(what, input1, input2)?;
    same_shape(what, input1, target)?;
    let z = (target * &(input1 - input2)?)?
        .scale(-1.0)?
        .add_scalar(margin)?;
    reduction.apply(z.relu()?)
}

/// The hinge loss of distances `input` against targets ±1 (the same shape): `ℓ = x` where
/// y = 1, `max(0, margin − x)` where y = −1. PyTorch: `F.hinge_embedding_loss(x, y,
/// margin=…, reduction=…)` (`nn.HingeEmbeddingLoss`; default margin 1).
pub fn hinge_embedding_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    margin: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "hinge_embedding_loss";
    finite(what, "margin", margin)?;
    same_shape(what, input, target)?;
    let (a, b) = branches(target)?;
    let hinge = input.scale(-1.0)?.add_scalar(margin)?.relu()?;
    reduction.apply((&(&a * input)? + &(&b * &hinge)?)?)
}

/// The two-class logistic loss of `input` against targets ±1 (the same shape):
/// `ℓ = ln(1 + e^{−y·x})` (a softplus). PyTorch: `F.soft_margin_loss(x, y, reduction=…)`
/// (`nn.SoftMarginLoss`).
pub fn soft_margin_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    same_shape("soft_margin_loss", input, target)?;
    reduction.apply((input * target)?.scale(-1.0)?.softplus()?)
}

/// The multi-class hinge loss of `input` ((rows, classes), or (classes) for one row) at the
/// class `labels`: per row `ℓ = (1/C)·Σ_{c ≠ y} w_y·max(0, margin − x_y + x_c)^p`, with `p` 1
/// or 2 and `weight` one value per class (1 when `None`); one value per row, which
/// `reduction` reduces over the rows (the plain mean: PyTorch does not divide by the
/// weights). The gradient is 0 where `margin − x_y + x_c = 0` (PyTorch's kernel). PyTorch:
/// `F.multi_margin_loss(x, y, p=…, margin=…, weight=…, reduction=…)` (`nn.MultiMarginLoss`;
/// defaults p 1, margin 1).
pub fn multi_margin_loss<'g, O: Train>(
    input: &Var<'g, O>,
    labels: &Labels,
    p: u32,
    margin: f64,
    weight: Option<&[f64]>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "multi_margin_loss";
    if !(p == 1 || p == 2) {
        return Err(usage(what, format!("p must be 1 or 2, got {p}")));
    }
    finite(what, "margin", margin)?;
    let rows = ClassRows::new(what, input, labels, weight, None)?;
    let values = labels.values();
    let one_hot = rows.cells(input, |r, c| if values[r] == c { 1.0 } else { 0.0 })?;
    // x_y per row, as a column against the row's classes.
    let column: Vec<usize> = match rows.batched {
        true => vec![values.len(), 1],
        false => vec![1],
    };
    let picked = (input * &one_hot)?;
    let picked = match rows.batched {
        true => picked.sum_axis(1)?,
        false => picked.sum()?,
    }
    .reshape(&column)?;
    let z = (input - &picked)?.add_scalar(margin)?.relu()?;
    let h = if p == 2 { (&z * &z)? } else { z };
    // w_y off the label's own class, 0 on it.
    let keep = rows.cells(input, |r, c| {
        if values[r] == c {
            0.0
        } else {
            rows.row_weight[r]
        }
    })?;
    let h = (&h * &keep)?;
    let per_row = match rows.batched {
        true => h.sum_axis(1)?,
        false => h.sum()?,
    };
    reduction.apply(per_row.scale(1.0 / rows.classes as f64)?)
}

/// The rows of an embedding loss: (rows, features) or (features), the target one value per
/// row ((rows) or a scalar); an error naming the loss and the shapes otherwise.
fn embedding_rows<O: Train>(
    what: &'static str,
    inputs: &[&Var<'_, O>],
    target: Option<&Var<'_, O>>,
) -> Result<()> {
    let first = inputs[0];
    for x in &inputs[1..] {
        same_shape(what, first, x)?;
    }
    let rows = match first.dims() {
        [_] => &[][..],
        [n, _] => std::slice::from_ref(n),
        _ => {
            return Err(usage(
                what,
                format!(
                    "inputs must be (rows, features) or (features), got {}",
                    first.shape()
                ),
            ));
        }
    };
    match target {
        Some(y) if y.dims() != rows => Err(usage(
            what,
            format!(
                "target {} must hold one value per row of input {}",
                y.shape(),
                first.shape()
            ),
        )),
        _ => Ok(()),
    }
}

/// Sum over the last axis (the features): (rows, features) → (rows), (features) → ().
fn sum_features<'g, O: Train>(v: &Var<'g, O>) -> Result<Var<'g, O>> {
    match v.dims().len() {
        1 => v.sum(),
        n => v.sum_axis(n - 1),
    }
}

/// The cosine embedding loss of two inputs ((rows, features) or (features)) against targets
/// ±1 (one per row): `ℓ = 1 − cos(x₁, x₂)` where y = 1, `max(0, cos(x₁, x₂) − margin)` where
/// y = −1, with PyTorch's cosine `Σx₁x₂ / √((Σx₁² + 1e-12)·(Σx₂² + 1e-12))`. PyTorch:
/// `F.cosine_embedding_loss(x1, x2, y, margin=…, reduction=…)` (`nn.CosineEmbeddingLoss`;
/// default margin 0).
pub fn cosine_embedding_loss<'g, O: Train>(
    input1: &Var<'g, O>,
    input2: &Var<'g, O>,
    target: &Var<'g, O>,
    margin: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "cosine_embedding_loss";
    finite(what, "margin", margin)?;
    embedding_rows(what, &[input1, input2], Some(target))?;
    const EPSILON: f64 = 1e-12;
    let dot = sum_features(&(input1 * input2)?)?;
    let m1 = sum_features(&(input1 * input1)?)?.add_scalar(EPSILON)?;
    let m2 = sum_features(&(input2 * input2)?)?.add_scalar(EPSILON)?;
    let cos = (&dot / &(&m1 * &m2)?.sqrt()?)?;
    let (a, b) = branches(target)?;
    let pos = cos.scale(-1.0)?.add_scalar(1.0)?;
    let neg = cos.add_scalar(-margin)?.relu()?;
    reduction.apply((&(&a * &pos)? + &(&b * &neg)?)?)
}

/// `‖x₁ − x₂ + eps‖_p` along the last axis, p 1 or 2 (PyTorch's `pairwise_distance`); the
/// gradient at a zero distance is 0, as PyTorch's norm's.
fn pairwise_distance<'g, O: Train>(
    x1: &Var<'g, O>,
    x2: &Var<'g, O>,
    p: u32,
    eps: f64,
) -> Result<Var<'g, O>> {
    let d = (x1 - x2)?.add_scalar(eps)?;
    match p {
        1 => sum_features(&d.abs()?),
        _ => sum_features(&(&d * &d)?)?.sqrt(),
    }
}

/// The triplet loss of `anchor`, `positive` and `negative` ((rows, features) or (features),
/// one shape): `ℓ = max(0, d(a, p) − d(a, n) + margin)` with `d(x₁, x₂) = ‖x₁ − x₂ + eps‖_p`
/// (p 1 or 2) along the features; with `swap`, `d(a, n)` is `min(d(a, n), d(p, n))` (ties
/// split the gradient, as PyTorch's `min`). One value per row. PyTorch:
/// `F.triplet_margin_loss(a, p, n, margin=…, p=…, eps=…, swap=…, reduction=…)`
/// (`nn.TripletMarginLoss`; defaults margin 1, p 2, eps 1e-6).
#[allow(clippy::too_many_arguments)]
pub fn triplet_margin_loss<'g, O: Train>(
    anchor: &Var<'g, O>,
    positive: &Var<'g, O>,
    negative: &Var<'g, O>,
    margin: f64,
    p: u32,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "triplet_margin_loss";
    if !(p == 1 || p == 2) {
        return Err(usage(what, format!("p must be 1 or 2, got {p}")));
    }
    finite(what, "margin", margin)?;
    finite(what, "eps", eps)?;
    embedding_rows(what, &[anchor, positive, negative], None)?;
    let pos = pairwise_distance(anchor, positive, p, eps)?;
    let mut neg = pairwise_distance(anchor, negative, p, eps)?;
    if swap {
        neg = neg.minimum(&pairwise_distance(positive, negative, p, eps)?)?;
    }
    let z = (&pos - &neg)?.add_scalar(margin)?;
    reduction.apply(z.relu()?)
}
