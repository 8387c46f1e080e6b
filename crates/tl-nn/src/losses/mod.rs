//! PyTorch's losses (`torch.nn.functional`), with its names, arguments, formulas and
//! reductions, beyond the catalogue's fused `mse_loss` and `cross_entropy`:
//!
//! - classification ([`classification`]): [`binary_cross_entropy_with_logits`],
//!   [`binary_cross_entropy`], [`nll_loss`], [`cross_entropy`] (class weights, `ignore_index`,
//!   label smoothing), [`multilabel_soft_margin_loss`];
//! - regression ([`regression`]): [`mse_loss`], [`l1_loss`], [`huber_loss`],
//!   [`smooth_l1_loss`], and the relative L2 error of operator learning, [`relative_l2_loss`];
//! - likelihoods and divergences ([`likelihood`]): [`kl_div`], [`poisson_nll_loss`],
//!   [`gaussian_nll_loss`];
//! - margins and embeddings ([`margin`]): [`margin_ranking_loss`], [`hinge_embedding_loss`],
//!   [`soft_margin_loss`], [`multi_margin_loss`], [`cosine_embedding_loss`],
//!   [`triplet_margin_loss`].
//!
//! Each is composed from catalogue ops (`softplus`, `abs`, `clamp`, `relu`, `log`, `mul`,
//! sums), so it runs on every backend and in the linked session, and its gradient is the
//! composition's, checked against PyTorch's autograd in `tests/nn/losses.rs` (values and
//! gradients of every reduction, on the eager CPU, linked and CUDA-simulation sessions). Where
//! a loss has a kink the composition is chosen so the gradient there is PyTorch's: `l1_loss`
//! and the Huber losses give 0 where input = target and `huber_loss` gives `±delta` where
//! |input − target| = delta; the hinges (`max(0, z)` in the margin ranking, hinge embedding,
//! cosine embedding, triplet and multi-margin losses) are `relu`s, whose gradient at z = 0 is
//! 0 as that of PyTorch's `clamp_min(z, 0)` and of its multi-margin kernel (`z > 0`).
//!
//! What PyTorch checks in the values (a probability outside [0, 1] for
//! [`binary_cross_entropy`], a negative variance for [`gaussian_nll_loss`], a target other than
//! ±1) is not checked here: a loss is recorded before its values exist (the linked session
//! compiles it), so each function says what such a value gives.

pub mod classification;
pub mod likelihood;
pub mod margin;
pub mod regression;

pub use classification::{
    binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
    multilabel_soft_margin_loss, nll_loss,
};
pub use likelihood::{KlReduction, gaussian_nll_loss, kl_div, poisson_nll_loss};
pub use margin::{
    cosine_embedding_loss, hinge_embedding_loss, margin_ranking_loss, multi_margin_loss,
    soft_margin_loss, triplet_margin_loss,
};
pub use regression::{huber_loss, l1_loss, mse_loss, relative_l2_loss, smooth_l1_loss};

use tl_session::Train;

use crate::error::usage;
use crate::{Result, Var};

/// How a loss reduces its per-element values. PyTorch: the `reduction` argument
/// (`"mean"`, `"sum"`, `"none"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over elements (PyTorch's default); for [`nll_loss`] and [`cross_entropy`]
    /// the weighted mean over the rows that are not ignored; for the losses with one value
    /// per row (their docs say so), the mean over rows.
    #[default]
    Mean,
    /// The sum over elements (over rows for the per-row losses).
    Sum,
    /// No reduction: one value per element (per row for the per-row losses).
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

/// A loss parameter that must be finite (an error naming the loss, the parameter and the
/// value otherwise).
fn finite(what: &'static str, name: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(usage(what, format!("{name} must be finite, got {v}")))
    }
}

/// A small positive value every element type holds as a normal number (f32's least normal is
/// 1.2e-38): the lower clamp before a `log` of a value that may be 0.
const TINY: f64 = 1e-30;

/// The largest f64, the upper bound of a one-sided clamp (the op needs finite bounds; in f32
/// it rounds to +∞, still no bound).
const HUGE: f64 = f64::MAX;
