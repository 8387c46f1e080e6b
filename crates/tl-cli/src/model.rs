//! The models `tl` trains, written once against [`Ops`] so each runs eager or linked on any
//! backend, their default hyperparameters, and the task each is trained on.

use tl_ir::Op;
use tl_session::models::{
    Activation, Cnn, CnnConfig, Fno1d, FnoConfig, LmConfig, Mlp, TransformerLm,
};
use tl_session::{Ops, Param, TensorRef};
use tl_spec::{Shape, Tensor};

use crate::cli::{ModelName, OptimizerName};
use crate::data::{CLASSES, PIXELS};
use crate::dataset::{Batch, CONTEXT};
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

/// What a model is trained to do, which decides its loss and its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Classification (cross-entropy; accuracy).
    Classify,
    /// Regression of fields (mean squared error; relative L2 error).
    Regress,
    /// Next-token prediction (cross-entropy in nats per token, against the unigram baseline).
    LanguageModel,
}

/// The task of `model`.
pub fn task(model: ModelName) -> Task {
    match model {
        ModelName::Mlp | ModelName::Cnn => Task::Classify,
        ModelName::Fno => Task::Regress,
        ModelName::Transformer => Task::LanguageModel,
    }
}

/// The CNN on the digits: (conv 3×3 → relu → maxPool 2) with 16 then 32 channels → linear.
pub fn cnn_config() -> CnnConfig {
    CnnConfig {
        in_channels: 1,
        height: 8,
        width: 8,
        channels: vec![16, 32],
        classes: CLASSES,
    }
}

/// The FNO on Burgers' pairs: inputs (u0, x/2π), width 32, 16 modes, 4 Fourier layers.
pub fn fno_config() -> FnoConfig {
    FnoConfig {
        in_channels: 2,
        out_channels: 1,
        width: 32,
        modes: 16,
        layers: 4,
        proj_hidden: 64,
    }
}

/// The language model on the KJV text: width 64, 4 heads, 2 blocks, context [`CONTEXT`].
pub fn lm_config(vocab: usize) -> LmConfig {
    LmConfig {
        vocab,
        context: CONTEXT,
        d_model: 64,
        heads: 4,
        d_ff: 256,
        blocks: 2,
    }
}

/// A built model: its parameters live in the session that built it.
#[derive(Debug, Clone)]
pub enum Model {
    /// 64 → 128 → 10 ReLU MLP on the digits (PyTorch: `nn.Sequential(Linear, ReLU, Linear)`).
    Mlp(Mlp),
    /// Small CNN on the digits ([`cnn_config`]).
    Cnn(Cnn),
    /// FNO1d on Burgers' equation ([`fno_config`]).
    Fno(Fno1d),
    /// Char-level transformer language model ([`lm_config`]).
    Transformer(TransformerLm),
}

/// A recorded forward pass: the model's output and, with targets, the loss.
#[derive(Debug, Clone)]
pub struct Output {
    /// Logits (B, classes), fields (B, grid, 1) or logits (B·context, vocab).
    pub out: TensorRef,
    /// The mean loss, when the batch has targets.
    pub loss: Option<TensorRef>,
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
    /// The default hyperparameters of `model` (measured in the README).
    pub fn defaults(model: ModelName) -> Defaults {
        let (epochs, batch_size, lr, optimizer) = match model {
            ModelName::Mlp => (20, 32, 3e-3, OptimizerName::Adam),
            ModelName::Cnn => (25, 32, 3e-3, OptimizerName::Adam),
            ModelName::Fno => (10, 20, 3e-3, OptimizerName::Adam),
            ModelName::Transformer => (1, 16, 3e-3, OptimizerName::Adamw),
        };
        Defaults {
            epochs,
            batch_size,
            lr,
            optimizer,
        }
    }

    /// Build `model`'s parameters in `s` (initialised from `seed`).
    pub fn new<S: Ops<T = f32> + ?Sized>(model: ModelName, s: &mut S, seed: u64) -> Result<Self> {
        Ok(match model {
            ModelName::Mlp => Model::Mlp(Mlp::new(
                s,
                &[PIXELS, MLP_HIDDEN, CLASSES],
                Activation::Relu,
                seed,
            )?),
            ModelName::Cnn => Model::Cnn(Cnn::new(s, &cnn_config(), seed)?),
            ModelName::Fno => Model::Fno(Fno1d::new(s, &fno_config(), seed)?),
            ModelName::Transformer => {
                let vocab = crate::text::corpus().vocab.len();
                Model::Transformer(TransformerLm::new(s, &lm_config(vocab), seed)?)
            }
        })
    }

    /// The model's name.
    pub fn name(&self) -> ModelName {
        match self {
            Model::Mlp(_) => ModelName::Mlp,
            Model::Cnn(_) => ModelName::Cnn,
            Model::Fno(_) => ModelName::Fno,
            Model::Transformer(_) => ModelName::Transformer,
        }
    }

    /// Every parameter, in a fixed order.
    pub fn params(&self) -> Vec<Param> {
        match self {
            Model::Mlp(m) => m.params(),
            Model::Cnn(m) => m.params(),
            Model::Fno(m) => m.params(),
            Model::Transformer(m) => m.params(),
        }
    }

    /// The parameter names (as stored in checkpoints), in [`params`](Self::params) order.
    pub fn param_names(&self) -> Vec<String> {
        match self {
            Model::Mlp(m) => (0..m.layers.len())
                .flat_map(|k| [format!("layer{k}.weight"), format!("layer{k}.bias")])
                .collect(),
            Model::Cnn(m) => m.param_names(),
            Model::Fno(m) => m.param_names(),
            Model::Transformer(m) => m.param_names(),
        }
    }

    /// Record the parameters, the batch's inputs and targets (all leaves first, as linked
    /// sessions require), then the forward pass and the loss.
    pub fn forward<S: Runner + ?Sized>(&self, s: &mut S, batch: Batch) -> Result<Output> {
        let mismatch = || {
            CliError::new(format!(
                "internal: a {} model got a batch of another task",
                self.name().as_str()
            ))
        };
        match (self, batch) {
            (Model::Mlp(_) | Model::Cnn(_), Batch::Classes { x, labels }) => {
                self.classify(s, x, &labels)
            }
            (Model::Fno(m), Batch::Fields { x, y }) => {
                let leaves = m.use_params(s)?;
                let x = s.input(x, false)?;
                let y = s.input(y, false)?;
                let out = m.forward(s, &leaves, &x)?;
                let loss = s.mse_loss(&out, &y)?;
                Ok(Output {
                    out,
                    loss: Some(loss),
                })
            }
            (
                Model::Transformer(m),
                Batch::Tokens {
                    tokens,
                    next,
                    batch,
                },
            ) => {
                let at = s.record_labels(&tokens);
                let labels_at = s.record_labels(&next);
                let leaves = m.use_params(s)?;
                let out = m.forward(s, &leaves, at, batch)?;
                let loss = s.apply(Op::CrossEntropy { labels_at }, &[&out])?;
                Ok(Output {
                    out,
                    loss: Some(loss),
                })
            }
            _ => Err(mismatch()),
        }
    }

    /// Classification on the digits (x (B, 64) pixels): logits and mean cross-entropy.
    fn classify<S: Runner + ?Sized>(
        &self,
        s: &mut S,
        x: Tensor<f32>,
        labels: &[usize],
    ) -> Result<Output> {
        let batch = x.shape().dims()[0];
        // The labels go into the Nat environment for the `crossEntropy` op (both tapes have it).
        let labels_at = s.record_labels(labels);
        let out = match self {
            Model::Mlp(m) => {
                let leaves = m.use_params(s)?;
                let x = s.input(x, false)?;
                m.forward(s, &leaves, &x)?
            }
            Model::Cnn(m) => {
                let leaves = m.use_params(s)?;
                let x = s.input(x.reshape(Shape::new(&[batch, 1, 8, 8]))?, false)?;
                m.forward(s, &leaves, &x)?
            }
            _ => return Err(CliError::new("internal: not a classifier")),
        };
        let loss = s.apply(Op::CrossEntropy { labels_at }, &[&out])?;
        Ok(Output {
            out,
            loss: Some(loss),
        })
    }
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

    #[test]
    fn argmax_picks_the_first_largest_entry() {
        let t = Tensor::new([2, 3], vec![0.1, 0.7, 0.2, 5.0, -1.0, 4.0]).unwrap();
        assert_eq!(argmax_rows(&t), vec![1, 0]);
        // A tie goes to the first index.
        let t = Tensor::new([1, 3], vec![2.0, 2.0, 1.0]).unwrap();
        assert_eq!(argmax_rows(&t), vec![0]);
    }
}
