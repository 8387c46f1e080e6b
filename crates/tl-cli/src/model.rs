//! The models `tl` trains (tl-nn's [`tl_nn::models`], generic over the session, so each runs
//! eager (CPU, CUDA sim, CUDA) or linked) at the sizes `tl` uses, their default
//! hyperparameters, and the task each is trained on. Parameter names are PyTorch
//! `state_dict()` names (`0.weight`, `blocks.1.attn.wq`, …).

use tl_nn::losses::{Reduction, relative_l2_loss};
use tl_nn::models::{self, CnnConfig, Fno1d, FnoConfig, LmConfig, TransformerLm};
use tl_nn::{Activation, Labels, Module, Parameters, Runtime, Scope, Sequential, Var};
use tl_nn::{CLASSES, PIXELS};
use tl_session::{Param, Train};
use tl_spec::Shape;

use crate::Result;
use crate::cli::{ModelName, OptimizerName};
use crate::dataset::{Batch, CONTEXT};

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

/// The dataset `model` trains on.
pub fn dataset(model: ModelName) -> &'static str {
    match model {
        ModelName::Mlp | ModelName::Cnn => "digits",
        ModelName::Transformer => "kjv-genesis-exodus",
        ModelName::Fno => "burgers",
    }
}

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

/// Channels of the CNN's two conv stages.
pub const CNN_CHANNELS: [usize; 2] = [16, 32];

/// The FNO's sizes: inputs (u0, x/2π), one output (u(T)), width 32, 16 modes, 4 Fourier
/// layers, projection 64.
pub const FNO: FnoConfig = FnoConfig {
    in_channels: 2,
    out_channels: 1,
    width: 32,
    modes: 16,
    layers: 4,
    proj_hidden: 64,
    exact_gelu: false,
};

/// The language model's sizes: context [`CONTEXT`], width 64, 4 heads, MLP width 256, 2
/// blocks; the vocabulary (`vocab: 0` here) is the corpus's.
pub const LM: LmConfig = LmConfig {
    vocab: 0,
    context: CONTEXT,
    d_model: 64,
    heads: 4,
    d_ff: 256,
    blocks: 2,
};

/// A built model; its parameters live in the runtime that built it.
pub enum Model<O: Train> {
    /// 64 → 128 → 10 ReLU MLP on the digits. PyTorch: `nn.Sequential(Linear, ReLU, Linear)`.
    Mlp(Sequential<O>),
    /// `(Conv2d 3×3 pad 1 → ReLU → MaxPool2d 2) × 2 → Flatten → Linear` on the digits, with
    /// 16 then 32 channels. PyTorch: the same `nn.Sequential` (names `0.*`, `3.*`, `7.*`).
    Cnn(Sequential<O>),
    /// FNO1d on Burgers' equation ([`FNO`] sizes), mean squared error.
    Fno(Fno1d),
    /// FNO1d of `--preset fno-paper` (`PaperRun::fno_config`), relative L2 loss (the mean of
    /// the batch's).
    FnoPaper(Fno1d),
    /// Char-level transformer language model ([`LM`] sizes).
    Transformer(TransformerLm),
}

/// A forward pass of one batch: the model's output and the mean loss.
pub struct Output<'g, O: Train> {
    /// Logits (B, classes), fields (B, grid, 1) or logits (B, context, vocab).
    pub out: Var<'g, O>,
    /// The mean loss over the batch.
    pub loss: Var<'g, O>,
}

impl<O: Train<T = f32>> Model<O> {
    /// Build `model`'s parameters in `rt` (initialised from the session's seed with
    /// PyTorch's default initialisers).
    pub fn new(model: ModelName, rt: &Runtime<O>) -> Result<Self> {
        let v = rt.vars();
        Ok(match model {
            ModelName::Mlp => Model::Mlp(models::mlp(
                &v,
                &[PIXELS, MLP_HIDDEN, CLASSES],
                Activation::Relu,
            )?),
            ModelName::Cnn => Model::Cnn(models::cnn(
                &v,
                &CnnConfig {
                    in_channels: 1,
                    height: 8,
                    width: 8,
                    channels: CNN_CHANNELS.to_vec(),
                    classes: CLASSES,
                },
            )?),
            ModelName::Fno => Model::Fno(Fno1d::new(&v, &FNO)?),
            ModelName::Transformer => {
                let vocab = crate::text::corpus()?.vocab.len();
                Model::Transformer(TransformerLm::new(&v, &LmConfig { vocab, ..LM })?)
            }
        })
    }

    /// The FNO of `--preset fno-paper` with sizes `config`, its output multiplied by
    /// `output_scale`.
    pub fn fno_paper(rt: &Runtime<O>, config: &FnoConfig, output_scale: f64) -> Result<Self> {
        let fno = Fno1d::new(&rt.vars(), config)?.with_output_scale(output_scale)?;
        Ok(Model::FnoPaper(fno))
    }

    /// The model's name.
    pub fn name(&self) -> ModelName {
        match self {
            Model::Mlp(_) => ModelName::Mlp,
            Model::Cnn(_) => ModelName::Cnn,
            Model::Fno(_) | Model::FnoPaper(_) => ModelName::Fno,
            Model::Transformer(_) => ModelName::Transformer,
        }
    }

    /// Record the forward pass of `batch` and its mean loss in the pass `g`.
    pub fn forward<'g>(&self, g: &Scope<'g, O>, batch: &Batch) -> tl_nn::Result<Output<'g, O>> {
        let out = match (self, batch) {
            (Model::Mlp(m), Batch::Classes { x, labels }) => {
                let out = m.forward(&g.input(x.clone())?)?;
                let loss = out.cross_entropy(&Labels::new(labels.clone(), CLASSES)?)?;
                Output { out, loss }
            }
            (Model::Cnn(m), Batch::Classes { x, labels }) => {
                let b = x.shape().dims()[0];
                let img = x.clone().reshape(Shape::new(&[b, 1, 8, 8]))?;
                let out = m.forward(&g.input(img)?)?;
                let loss = out.cross_entropy(&Labels::new(labels.clone(), CLASSES)?)?;
                Output { out, loss }
            }
            (Model::Fno(m), Batch::Fields { x, y }) => {
                let out = m.forward(&g.input(x.clone())?)?;
                let loss = out.mse_loss(&g.input(y.clone())?)?;
                Output { out, loss }
            }
            (Model::FnoPaper(m), Batch::Fields { x, y }) => {
                let out = m.forward(&g.input(x.clone())?)?;
                let loss = relative_l2_loss(&out, &g.input(y.clone())?, Reduction::Mean)?;
                Output { out, loss }
            }
            (Model::Transformer(m), Batch::Tokens(b)) => {
                let out = m.logits(g, &b.inputs, b.batch)?;
                let loss = out.cross_entropy(&b.targets)?;
                Output { out, loss }
            }
            _ => {
                return Err(tl_nn::Error::Usage {
                    what: "Model::forward",
                    detail: format!(
                        "internal: a {} model got a batch of another task",
                        self.name().as_str()
                    ),
                });
            }
        };
        Ok(out)
    }
}

impl<O: Train> Parameters for Model<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Model::Mlp(m) | Model::Cnn(m) => m.visit_params(f),
            Model::Fno(m) | Model::FnoPaper(m) => m.visit_params(f),
            Model::Transformer(m) => m.visit_params(f),
        }
    }
}
