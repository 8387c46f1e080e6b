//! The classification losses: binary cross-entropy on logits and on probabilities, the
//! negative log-likelihood and cross-entropy of class labels, and the multi-label soft margin.

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use super::{HUGE, Reduction, same_shape};
use crate::error::{dims_product, usage};
use crate::{Labels, Result, Var};

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
        Some(p) => (&soft * &(&(p * target)? - target)?.add_scalar(1.0)?)?,
        None => soft,
    };
    let loss = weighted(what, (&linear + &soft)?, weight, logits)?;
    reduction.apply(loss)
}

/// `loss · weight` (none: `loss`), where the weight broadcasts against the loss but must not
/// widen it beyond `input`'s shape (an error naming the loss and both shapes).
fn weighted<'g, O: Train>(
    what: &'static str,
    loss: Var<'g, O>,
    weight: Option<&Var<'g, O>>,
    input: &Var<'g, O>,
) -> Result<Var<'g, O>> {
    let Some(w) = weight else {
        return Ok(loss);
    };
    let loss = (&loss * w)?;
    if loss.shape() != input.shape() {
        return Err(usage(
            what,
            format!(
                "the weight {} broadcasts the loss of input {} to {}",
                w.shape(),
                input.shape(),
                loss.shape()
            ),
        ));
    }
    Ok(loss)
}

/// The lower clamp of [`binary_cross_entropy`]'s logs: below e⁻¹⁰⁰ (3.7e-44; in f32 a
/// subnormal, which the CPU's and CUDA's logs take), so that the log falls under −100 and
/// the outer clamp gives PyTorch's −100 exactly.
const BCE_LOG_FLOOR: f64 = 1e-44;

/// `max(ln v, −100)` as PyTorch's `binary_cross_entropy` clamps its logs; `ln 0` is −100
/// (its gradient 0), never an error or an infinity.
fn clamped_log<'g, O: Train>(v: &Var<'g, O>) -> Result<Var<'g, O>> {
    v.clamp(BCE_LOG_FLOOR, HUGE)?.log()?.clamp(-100.0, HUGE)
}

/// Binary cross-entropy of probabilities `input` (in [0, 1]) against `target` (the same
/// shape): `ℓ = −w·(y·max(ln x, −100) + (1 − y)·max(ln(1 − x), −100))` with `weight` `w`
/// broadcast against the loss (1 when `None`). The clamp at −100 is PyTorch's: an input of
/// exactly 0 or 1 gives a finite loss (100 where it is wrong, 0 where right). The gradient
/// is `w·(x − y)/(x·(1 − x))` inside (0, 1), PyTorch's within rounding; at 0 and 1 it is the
/// composition's, 0 through a clamped log plus the other log's `1/(1 − x)` or `−1/x`: 0 at
/// a wrong 0 or 1 and ∓1 at a right one, where PyTorch's backward (that formula with
/// `x·(1 − x)` floored at 1e-12) gives ±10¹² and 0. An input outside [0, 1] is not checked
/// (PyTorch raises): its side's log is clamped as for 0. [`binary_cross_entropy_with_logits`] on the logits is the
/// stabler form. PyTorch: `F.binary_cross_entropy(x, y, weight, reduction=…)`
/// (`nn.BCELoss`).
pub fn binary_cross_entropy<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    weight: Option<&Var<'g, O>>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "binary_cross_entropy";
    same_shape(what, input, target)?;
    let log_p = clamped_log(input)?;
    let log_q = clamped_log(&input.scale(-1.0)?.add_scalar(1.0)?)?;
    let ll = mix(target, &log_p, &log_q)?;
    let loss = weighted(what, ll.scale(-1.0)?, weight, input)?;
    reduction.apply(loss)
}

/// `y·a + (1 − y)·b` of the binary losses, as `y·(a − b) + b` (one product).
fn mix<'g, O: Train>(y: &Var<'g, O>, a: &Var<'g, O>, b: &Var<'g, O>) -> Result<Var<'g, O>> {
    &(y * &(a - b)?)? + b
}

/// The multi-label one-versus-all loss of `input` ((rows, classes), or (classes) for one row)
/// against `target` (the same shape, 1 for a class present, 0 absent): per row
/// `ℓ = −(1/C)·Σ_c w_c·(y_c·log σ(x_c) + (1 − y_c)·log σ(−x_c))`, with `weight` `w` broadcast
/// against the input (one per class; 1 when `None`); one value per row, which `reduction`
/// reduces over the rows. Computed as `y·softplus(−x) + (1 − y)·softplus(x)`. PyTorch:
/// `F.multilabel_soft_margin_loss(x, y, weight, reduction=…)`.
pub fn multilabel_soft_margin_loss<'g, O: Train>(
    input: &Var<'g, O>,
    target: &Var<'g, O>,
    weight: Option<&Var<'g, O>>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    let what = "multilabel_soft_margin_loss";
    same_shape(what, input, target)?;
    let classes = match input.dims() {
        [c] | [_, c] => *c,
        _ => {
            return Err(usage(
                what,
                format!(
                    "input must be (rows, classes) or (classes), got {}",
                    input.shape()
                ),
            ));
        }
    };
    let on = input.scale(-1.0)?.softplus()?;
    let off = input.softplus()?;
    let terms = mix(target, &on, &off)?;
    let terms = weighted(what, terms, weight, input)?;
    let rows = match input.dims().len() {
        1 => terms.sum()?,
        _ => terms.sum_axis(1)?,
    };
    reduction.apply(rows.scale(1.0 / classes as f64)?)
}

/// Negative log-likelihood of `log_probs` ((rows, classes), (classes) for one row, or
/// (N, C, d₁, …) with the classes on axis 1, one label per position in row-major order: a
/// segmentation's pixels) at the class `labels`: `ℓᵢ = −wᵧᵢ·log_probs[i, yᵢ]`, with `weight` one value per class (1 when
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
    let what = "nll_loss";
    let (log_probs, positions) = classes_last(what, log_probs, labels)?;
    let rows = ClassRows::new(what, &log_probs, labels, weight, ignore_index)?;
    per_position(
        rows.nll(&log_probs, labels, reduction)?,
        positions,
        reduction,
    )
}

/// An input of (N, C, d₁, …) as (N·d₁·…, C), the classes last and each position a row (in
/// the labels' row-major order), and the shape (N, d₁, …) of [`Reduction::None`]'s output;
/// any other input as it is (with `None`). The label count is checked here, against the
/// input's own shape.
fn classes_last<'g, O: Train>(
    what: &'static str,
    x: &Var<'g, O>,
    labels: &Labels,
) -> Result<(Var<'g, O>, Option<Vec<usize>>)> {
    let dims = x.dims();
    if dims.len() < 3 {
        return Ok((x.clone(), None));
    }
    let (n, c) = (dims[0], dims[1]);
    let mut positions = vec![n];
    positions.extend_from_slice(&dims[2..]);
    // Checked: an empty input's other axes may have a product past usize.
    let spatial = dims_product(what, x.shape(), &dims[2..])?;
    let count = dims_product(what, x.shape(), &positions)?;
    if c != labels.classes() || count != labels.len() {
        return Err(usage(
            what,
            format!(
                "input {} holds {count} position(s) of {c} classes (axis 1), but the labels are {} value(s) of {} classes",
                x.shape(),
                labels.len(),
                labels.classes()
            ),
        ));
    }
    let rows = x
        .reshape(&[n, c, spatial])?
        .swap_last_two()?
        .reshape(&[count, c])?;
    Ok((rows, Some(positions)))
}

/// [`Reduction::None`]'s per-row values of an (N, C, d₁, …) input reshaped to (N, d₁, …);
/// anything else as it is.
fn per_position<'g, O: Train>(
    loss: Var<'g, O>,
    positions: Option<Vec<usize>>,
    reduction: Reduction,
) -> Result<Var<'g, O>> {
    match (reduction, positions) {
        (Reduction::None, Some(dims)) => loss.reshape(&dims),
        _ => Ok(loss),
    }
}

/// Cross-entropy of `logits` ((rows, classes), (classes) for one row, or (N, C, d₁, …) with
/// the classes on axis 1, as [`nll_loss`]) against the class `labels`, with PyTorch's
/// options: [`nll_loss`] of `log_softmax(logits)` (`weight`,
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
    let (logits, positions) = classes_last(what, logits, labels)?;
    let rows = ClassRows::new(what, &logits, labels, weight, ignore_index)?;
    let log_probs = logits.log_softmax()?;
    let nll = rows.nll(&log_probs, labels, reduction)?;
    if label_smoothing == 0.0 {
        return per_position(nll, positions, reduction);
    }
    // −Σ_c w_c·log p[i, c] for each kept row: the weights of every class, 0 on ignored rows.
    let class_weight = |c: usize| weight.map_or(1.0, |w| w[c]);
    let smooth = rows.weighted_sum(
        &log_probs,
        |r, c| if rows.kept[r] { class_weight(c) } else { 0.0 },
        reduction,
    )?;
    let c = rows.classes as f64;
    let loss = (&nll.scale(1.0 - label_smoothing)? + &smooth.scale(label_smoothing / c)?)?;
    per_position(loss, positions, reduction)
}

/// The rows of a classification loss: the shape checked against the labels and the weights,
/// and each row's weight at its label (0 where ignored).
pub(super) struct ClassRows {
    pub(super) what: &'static str,
    /// (rows, classes) rather than (classes).
    pub(super) batched: bool,
    pub(super) classes: usize,
    /// `w[yᵢ]` (1 without weights), 0 for an ignored row.
    pub(super) row_weight: Vec<f64>,
    /// Whether row i is not ignored.
    pub(super) kept: Vec<bool>,
}

impl ClassRows {
    pub(super) fn new<O: Train>(
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
                        "input must be (rows, classes), (classes) or (N, classes, d1, ...), got {}",
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
    pub(super) fn mean_weight(&self) -> Result<f64> {
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

    /// The constant `(rows, classes)` (or `(classes)`) tensor of `cell(i, c)`, shaped as `x`.
    pub(super) fn cells<'g, O: Train>(
        &self,
        x: &Var<'g, O>,
        cell: impl Fn(usize, usize) -> f64,
    ) -> Result<Var<'g, O>> {
        let t = Tensor::try_from_fn(self.what, x.shape().clone(), |k| {
            O::T::lit(cell(k / self.classes, k % self.classes))
        })?;
        x.scope().constant(t)
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
        let picked = (log_probs * &self.cells(log_probs, cell)?)?;
        match reduction {
            Reduction::None if self.batched => picked.sum_axis(1)?.scale(-1.0),
            Reduction::None | Reduction::Sum => picked.sum()?.scale(-1.0),
            Reduction::Mean => picked.sum()?.scale(-1.0 / self.mean_weight()?),
        }
    }
}
