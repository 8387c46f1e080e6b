//! The models `tl` trains, written once against [`Ops`] so each runs eager or linked on any
//! backend, and their default hyperparameters.
//!
//! Only the MLP exists yet: cnn needs conv2d/maxPool, transformer needs layerNorm,
//! multiHeadAttention and crossEntropy, fno needs spectralConv1dRfft, none of which are in
//! `tl_ir::Op` in this build. Asking for them is a clear error ([`Model::new`]).

use tl_ir::Op;
use tl_session::models::{Activation, Mlp};
use tl_session::{Ops, Param, TensorRef};
use tl_spec::Tensor;

use crate::cli::{ModelName, OptimizerName};
use crate::data::{CLASSES, PIXELS};
use crate::runner::Runner;
use crate::{CliError, Result};

/// Hidden width of the digits MLP.
pub const MLP_HIDDEN: usize = 128;

/// A model's default hyperparameters (what `tl train --model M` uses when a flag is unset).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// Epochs.
    pub epochs: usize,
    /// Minibatch size.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Optimizer.
    pub optimizer: OptimizerName,
}

/// A built model: its parameters live in the session that built it.
#[derive(Debug, Clone)]
pub enum Model {
    /// 64 → 128 → 10 ReLU MLP on the digits (PyTorch: `nn.Sequential(Linear, ReLU, Linear)`).
    Mlp(Mlp),
}

/// What is still missing before `model` can be trained (issue 6), or `None` if it can.
/// The ops of every model exist in `tl_ir::Op` and the `Ops` surface; the models are not written.
pub fn missing(model: ModelName) -> Option<&'static str> {
    match model {
        ModelName::Mlp => None,
        ModelName::Cnn => Some("the conv2d/maxPool2d model and its defaults"),
        ModelName::Transformer => {
            Some("the char-level layerNorm/multiHeadAttention model and the text pipeline")
        }
        ModelName::Fno => {
            Some("the spectralConv1dRfft model and the Burgers' solver that makes its data")
        }
    }
}

/// The dataset `model` trains on.
pub fn dataset(model: ModelName) -> &'static str {
    match model {
        ModelName::Mlp | ModelName::Cnn => "digits",
        ModelName::Transformer => "kjv-genesis-exodus",
        ModelName::Fno => "burgers",
    }
}

impl Model {
    /// The default hyperparameters of `model`.
    pub fn defaults(model: ModelName) -> Defaults {
        match model {
            // One set for now; per-model defaults come with the models.
            ModelName::Mlp | ModelName::Cnn | ModelName::Transformer | ModelName::Fno => Defaults {
                epochs: 20,
                batch_size: 32,
                lr: 3e-3,
                optimizer: OptimizerName::Adam,
            },
        }
    }

    /// Build `model`'s parameters in `s` (initialised from `seed`).
    pub fn new<S: Ops<T = f32> + ?Sized>(model: ModelName, s: &mut S, seed: u64) -> Result<Self> {
        if let Some(what) = missing(model) {
            return Err(CliError::new(format!(
                "model {} is not written yet: {what} (available: mlp)",
                model.as_str()
            )));
        }
        Ok(Model::Mlp(Mlp::new(
            s,
            &[PIXELS, MLP_HIDDEN, CLASSES],
            Activation::Relu,
            seed,
        )?))
    }

    /// The model's name.
    pub fn name(&self) -> ModelName {
        match self {
            Model::Mlp(_) => ModelName::Mlp,
        }
    }

    /// Every parameter, in a fixed order.
    pub fn params(&self) -> Vec<Param> {
        match self {
            Model::Mlp(m) => m.params(),
        }
    }

    /// Record the parameters, the inputs `x` (B, features) and, if given, the one-hot targets
    /// of `labels` (all leaves first, as linked sessions require), then the forward pass.
    /// Returns the logits (B, classes) and, with labels, the mean cross-entropy loss.
    pub fn forward<S: Runner + ?Sized>(
        &self,
        s: &mut S,
        x: Tensor<f32>,
        labels: Option<&[usize]>,
    ) -> Result<(TensorRef, Option<TensorRef>)> {
        match self {
            Model::Mlp(m) => {
                let leaves = m.use_params(s)?;
                let batch = x.shape().dims()[0];
                let x = s.input(x, false)?;
                let target = match labels {
                    Some(l) if s.has_cross_entropy() => Some(Target::Labels(s.record_labels(l))),
                    Some(l) => Some(Target::OneHot(s.constant(one_hot(l, CLASSES))?)),
                    None => None,
                };
                let logits = m.forward(s, &leaves, &x)?;
                let loss = match target {
                    Some(Target::Labels(at)) => {
                        Some(s.apply(Op::CrossEntropy { labels_at: at }, &[&logits])?)
                    }
                    Some(Target::OneHot(t)) => Some(cross_entropy(s, &logits, &t, batch)?),
                    None => None,
                };
                Ok((logits, loss))
            }
        }
    }
}

/// How the loss gets its targets: labels in the Nat environment (for the `crossEntropy` op) or
/// a one-hot constant (for the composed form).
enum Target {
    Labels(usize),
    OneHot(TensorRef),
}

/// Mean cross-entropy of `logits` (B, C) against one-hot targets (B, C), composed:
/// `−(1/B) Σ onehot ⊙ log_softmax(logits)`. PyTorch: `F.cross_entropy(logits, labels)`. Used
/// where the tape lacks the `crossEntropy` op (the CUDA tape, for now).
/// (log_softmax is computed stably, so no NaN for large logits.)
pub fn cross_entropy<S: Ops<T = f32> + ?Sized>(
    s: &mut S,
    logits: &TensorRef,
    onehot: &TensorRef,
    batch: usize,
) -> Result<TensorRef> {
    let lp = s.log_softmax(logits)?;
    let picked = s.mul(&lp, onehot)?;
    let total = s.sum(&picked)?;
    Ok(s.scale(&total, -1.0 / batch.max(1) as f64)?)
}

/// One-hot rows (B, classes) of `labels`.
pub fn one_hot(labels: &[usize], classes: usize) -> Tensor<f32> {
    Tensor::from_fn([labels.len(), classes], |k| {
        if labels[k / classes] == k % classes {
            1.0
        } else {
            0.0
        }
    })
}

/// The index of the largest entry of each row of a (B, C) tensor.
pub fn argmax_rows(t: &Tensor<f32>) -> Vec<usize> {
    let c = t.shape().dims().last().copied().unwrap_or(1).max(1);
    t.data()
        .chunks(c)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                    if v > bv { (i, v) } else { (bi, bv) }
                })
                .0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tl_session::{Backend, Options, Session};

    #[test]
    fn cross_entropy_matches_hand_values() {
        // logits [0, ln 3] → log_softmax = [ln(1/4), ln(3/4)]; label 1 → loss = −ln(3/4).
        let mut s = Session::<f32>::new(Options::backend(Backend::Cpu)).unwrap();
        let l = s
            .input(Tensor::new([1, 2], vec![0.0, 3f32.ln()]).unwrap(), false)
            .unwrap();
        let t = s.constant(one_hot(&[1], 2)).unwrap();
        let loss = cross_entropy(&mut s, &l, &t, 1).unwrap();
        let v = s.value(&loss).unwrap().item().unwrap();
        assert!((v - (-(0.75f32).ln())).abs() < 1e-6, "{v}");
        // Huge logits stay finite.
        let l = s
            .input(Tensor::new([1, 2], vec![1e4, -1e4]).unwrap(), false)
            .unwrap();
        let loss = cross_entropy(&mut s, &l, &t, 1).unwrap();
        let v = s.value(&loss).unwrap().item().unwrap();
        assert!((v - 2e4).abs() < 1.0, "{v}");
    }

    #[test]
    fn argmax_and_one_hot() {
        let t = Tensor::new([2, 3], vec![0.1, 0.7, 0.2, 5.0, -1.0, 4.0]).unwrap();
        assert_eq!(argmax_rows(&t), vec![1, 0]);
        assert_eq!(one_hot(&[2, 0], 3).data(), &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    }
}
