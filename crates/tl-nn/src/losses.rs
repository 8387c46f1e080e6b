//! Losses beyond the catalogue's `mse_loss` and `cross_entropy`, with PyTorch's names,
//! formulas and reductions: [`binary_cross_entropy_with_logits`], [`nll_loss`],
//! [`cross_entropy`] (with class weights, `ignore_index` and label smoothing), [`l1_loss`],
//! [`huber_loss`] and [`smooth_l1_loss`]; and the relative L2 error of operator learning,
//! [`relative_l2_loss`].
//!
//! Each is composed from catalogue ops (`softplus`, `abs`, `clamp`, `mul`, sums), so it runs
//! on every backend and in the linked session, and its gradient is the composition's (checked
//! against PyTorch in `tests/nn/losses.rs`). At the kinks the composition gives what PyTorch's
//! autograd gives: `l1_loss` and the Huber losses have gradient 0 where input = target, and
//! `huber_loss` has gradient `±delta` where |input − target| = delta exactly.

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use crate::error::usage;
use crate::{Labels, Result, Var};

/// How a loss reduces its per-element values. PyTorch: the `reduction` argument
/// (`"mean"`, `"sum"`, `"none"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over elements (PyTorch's default); for [`nll_loss`] the weighted mean over
    /// the rows that are not ignored.
    #[default]
    Mean,
    /// The sum over elements.
    Sum,
    /// No reduction: one value per element (per row for [`nll_loss`]).
    None,
}

impl Reduction {
    fn apply<'g, O: Train>(self, v: Var<'g, O>) -> Result<Var<'g, O>> {
        match self {
            Reduction::Mean => v.mean(),
            Reduction::Sum => v.sum(),
            Reduction::None => Ok(v),
        }
    }
}

/// `input` and `target` must have the same shape (PyTorch broadcasts them with a warning; a
/// mismatch here is an error naming the loss and both shapes).
fn same_shape<O: Train>(what: &'static str, input: &Var<'_, O>, target: &Var<'_, O>) -> Result<()> {
    if input.shape() == target.shape() {
        Ok(())
    } else {
        Err(usage(
            what,
            format!(
                "input {} and target {} must have the same shape",
                input.shape(),
                target.shape()
            ),
        ))
    }
}

/// Binary cross-entropy of `logits` against `target` (probabilities in [0, 1], the same
/// shape), computed stably as PyTorch does:
/// `ℓ = (1 − y)·x + (1 + (p − 1)·y)·softplus(−x)`, then `·weight`, with `p` = `pos_weight`
/// (1 when `None`; broadcast against the target, e.g. one per class on the last axis) and
/// `weight` (broadcast against the loss). Without weights this is
/// `max(x, 0) − x·y + log(1 + e^{−|x|})`. PyTorch:
/// `F.binary_cross_entropy_with_logits(x, y, weight, pos_weight=pos_weight, reduction=…)`.
pub fn binary_cross_entropy_with_logits<'g, O: Train>(
    logits: &Var<'g, O>,
    target: &Var<'g, O>,
    weight: Option<&Var<'g, O>>,
    pos_weight: Option<&Var<'g, O>>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "binary_cross_entropy_with_logits";
    same_shape(what, logits, target)?;
    // (1 − y)·x as x − x·y: exactly 0 where y = 1, so a large x costs softplus(−x) only.
    let linear = (logits - &(logits * target)?)?;
    let soft = logits.scale(-1.0)?.softplus()?;
    let soft = match pos_weight {
        // 1 + (p − 1)·y = 1 + p·y − y.
        Some(p) => {
            let log_weight = (&(&(p * target)? - target)? + &logits.scope().full(&[], 1.0)?)?;
            (&soft * &log_weight)?
        }
        None => soft,
    };
    let mut loss = (&linear + &soft)?;
    if let Some(w) = weight {
        loss = (&loss * w)?;
    }
    if loss.shape() != logits.shape() {
        return Err(usage(
            what,
            format!(
                "the weights broadcast the loss of input {} to {}",
                logits.shape(),
                loss.shape()
            ),
        ));
    }
    reduction.apply(loss)
}

/// Negative log-likelihood of `log_probs` ((rows, classes), or (classes) for one row) at the
/// class `labels`: `ℓᵢ = −wᵧᵢ·log_probs[i, yᵢ]`, with `weight` one value per class (1 when
/// `None`), and rows whose label equals `ignore_index` contributing 0 (and nothing to the
/// mean's denominator). [`Reduction::Mean`] divides by the sum of the kept rows' weights
/// (PyTorch's weighted mean); when every row is ignored that is 0/0, an error here (PyTorch
/// returns NaN). PyTorch: `F.nll_loss(log_probs, labels, weight, ignore_index=…, reduction=…)`.
pub fn nll_loss<'g, O: Train>(
    log_probs: &Var<'g, O>,
    labels: &Labels,
    weight: Option<&[f64]>,
    ignore_index: Option<usize>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let rows = ClassRows::new("nll_loss", log_probs, labels, weight, ignore_index)?;
    rows.nll(log_probs, labels, reduction)
}

/// Cross-entropy of `logits` ((rows, classes), or (classes) for one row) against the class
/// `labels`, with PyTorch's options: [`nll_loss`] of `log_softmax(logits)` (`weight`,
/// `ignore_index`, `reduction` as there), and with `label_smoothing` ε in [0, 1] the target
/// mixed with the uniform distribution: `(1 − ε)·nll + ε/C·smooth`, where row i's
/// `smooth = −Σ_c w_c·log_softmax(logits)[i, c]` (0 for an ignored row), reduced as the nll
/// is (its mean divided by the same weight sum). ε = 0 is `nll_loss` exactly. PyTorch:
/// `F.cross_entropy(logits, labels, weight, ignore_index=…, reduction=…,
/// label_smoothing=ε)` (`nn.CrossEntropyLoss`). [`Var::cross_entropy`] is the catalogue's
/// fused op, the mean without options.
pub fn cross_entropy<'g, O: Train>(
    logits: &Var<'g, O>,
    labels: &Labels,
    weight: Option<&[f64]>,
    ignore_index: Option<usize>,
    label_smoothing: f64,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "cross_entropy";
    if !(0.0..=1.0).contains(&label_smoothing) {
        return Err(usage(
            what,
            format!("label_smoothing {label_smoothing} must be between 0 and 1"),
        ));
    }
    let rows = ClassRows::new(what, logits, labels, weight, ignore_index)?;
    let log_probs = logits.log_softmax()?;
    let nll = rows.nll(&log_probs, labels, reduction)?;
    if label_smoothing == 0.0 {
        return Ok(nll);
    }
    // −Σ_c w_c·log p[i, c] for each kept row: the weights of every class, 0 on ignored rows.
    let class_weight = |c: usize| weight.map_or(1.0, |w| w[c]);
    let smooth = rows.weighted_sum(
        &log_probs,
        |r, c| if rows.kept[r] { class_weight(c) } else { 0.0 },
        reduction,
    )?;
    let c = rows.classes as f64;
    &nll.scale(1.0 - label_smoothing)? + &smooth.scale(label_smoothing / c)?
}

/// The rows of a classification loss: the shape checked against the labels and the weights,
/// and each row's weight at its label (0 where ignored).
struct ClassRows {
    what: &'static str,
    /// (rows, classes) rather than (classes).
    batched: bool,
    classes: usize,
    /// `w[yᵢ]` (1 without weights), 0 for an ignored row.
    row_weight: Vec<f64>,
    /// Whether row i is not ignored.
    kept: Vec<bool>,
}

impl ClassRows {
    fn new<O: Train>(
        what: &'static str,
        x: &Var<'_, O>,
        labels: &Labels,
        weight: Option<&[f64]>,
        ignore_index: Option<usize>,
    ) -> Result<ClassRows> {
        let (batched, rows, classes) = match x.dims() {
            [c] => (false, 1, *c),
            [r, c] => (true, *r, *c),
            _ => {
                return Err(usage(
                    what,
                    format!(
                        "input must be (rows, classes) or (classes), got {}",
                        x.shape()
                    ),
                ));
            }
        };
        if classes != labels.classes() || rows != labels.len() {
            return Err(usage(
                what,
                format!(
                    "input {} holds {rows} row(s) of {classes} classes, but the labels are {} value(s) of {} classes",
                    x.shape(),
                    labels.len(),
                    labels.classes()
                ),
            ));
        }
        if let Some(w) = weight {
            if w.len() != classes {
                return Err(usage(
                    what,
                    format!("weight has {} value(s) for {classes} classes", w.len()),
                ));
            }
            if let Some((c, v)) = w.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(usage(
                    what,
                    format!("weight {v} of class {c} is not finite"),
                ));
            }
        }
        let kept: Vec<bool> = labels
            .values()
            .iter()
            .map(|&y| ignore_index != Some(y))
            .collect();
        let row_weight = labels
            .values()
            .iter()
            .zip(&kept)
            .map(|(&y, &k)| match (k, weight) {
                (false, _) => 0.0,
                (true, Some(w)) => w[y],
                (true, None) => 1.0,
            })
            .collect();
        Ok(ClassRows {
            what,
            batched,
            classes,
            row_weight,
            kept,
        })
    }

    /// The mean's denominator: the kept rows' weights; an error when it is 0 (0/0).
    fn mean_weight(&self) -> Result<f64> {
        let total: f64 = self.row_weight.iter().sum();
        if total == 0.0 {
            return Err(usage(
                self.what,
                "every row is ignored (or weighs 0): the mean is 0/0 (PyTorch returns NaN)",
            ));
        }
        Ok(total)
    }

    /// `−Σ wᵧᵢ·log_probs[i, yᵢ]`, reduced.
    fn nll<'g, O: Train>(
        &self,
        log_probs: &Var<'g, O>,
        labels: &Labels,
        reduction: Reduction,
    ) -> Result<Var<'g, O>> {
        let values = labels.values();
        let cell = |r: usize, c: usize| {
            if values[r] == c {
                self.row_weight[r]
            } else {
                0.0
            }
        };
        self.weighted_sum(log_probs, cell, reduction)
    }

    /// `−Σ_c m[i, c]·log_probs[i, c]` with the constant weights `m[i, c] = cell(i, c)`: per
    /// row ([`Reduction::None`]), summed, or summed and divided by the kept rows' weights
    /// ([`Reduction::Mean`], PyTorch's weighted mean).
    fn weighted_sum<'g, O: Train>(
        &self,
        log_probs: &Var<'g, O>,
        cell: impl Fn(usize, usize) -> f64,
        reduction: Reduction,
    ) -> Result<Var<'g, O>> {
        let mask = Tensor::try_from_fn(self.what, log_probs.shape().clone(), |k| {
            O::T::lit(cell(k / self.classes, k % self.classes))
        })?;
        let picked = (log_probs * &log_probs.scope().constant(mask)?)?;
        match reduction {
            Reduction::None if self.batched => picked.sum_axis(1)?.scale(-1.0),
            Reduction::None | Reduction::Sum => picked.sum()?.scale(-1.0),
            Reduction::Mean => picked.sum()?.scale(-1.0 / self.mean_weight()?),
        }
    }
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
