//! The models `tl` trains, built from tl-nn layers and written once, generic over the session
//! (`O: Train`), so each runs eager (CPU, CUDA sim, CUDA) or linked; their default
//! hyperparameters, and the task each is trained on. Parameter names are PyTorch
//! `state_dict()` names (`0.weight`, `blocks.1.attn.wq`, …).

use tl_nn::{
    Activation, Conv, ConvConfig, Embedding, Flatten, Labels, LayerNorm, Linear, MaxPool, Module,
    MultiHeadAttention, Parameters, Runtime, Scope, Sequential, SpectralConv1d, Var, Vars,
};
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

/// The FNO's sizes: inputs (u0, x/2π), width 32, 16 modes, 4 Fourier layers, projection 64.
pub const FNO_IN: usize = 2;
/// FNO channel width.
pub const FNO_WIDTH: usize = 32;
/// FNO kept Fourier modes.
pub const FNO_MODES: usize = 16;
/// FNO Fourier layers.
pub const FNO_LAYERS: usize = 4;
/// FNO projection width.
pub const FNO_PROJ: usize = 64;

/// The language model's sizes: width 64, 4 heads, MLP width 256, 2 blocks, context [`CONTEXT`].
pub const LM_WIDTH: usize = 64;
/// Attention heads of the language model.
pub const LM_HEADS: usize = 4;
/// MLP width of each block.
pub const LM_FF: usize = 256;
/// Blocks of the language model.
pub const LM_BLOCKS: usize = 2;

/// The 1-D Fourier neural operator (Li et al. 2021, "FNO1d"), channels last: `lift`, then
/// `FNO_LAYERS` of `gelu(spectral(h) + pointwise(h))` (no gelu after the last), then
/// `proj.0 → gelu → proj.2`. Fields are (B, grid, channels).
pub struct Fno {
    lift: Linear,
    spectral: Vec<SpectralConv1d>,
    pointwise: Vec<Linear>,
    proj: (Linear, Linear),
}

impl Fno {
    fn new<O: Train>(v: &Vars<'_, O>) -> Result<Self> {
        let mut spectral = Vec::new();
        let mut pointwise = Vec::new();
        for k in 0..FNO_LAYERS {
            spectral.push(SpectralConv1d::new(
                &v.pp("spectral").pp(k),
                FNO_WIDTH,
                FNO_MODES,
            )?);
            pointwise.push(Linear::new(&v.pp("pointwise").pp(k), FNO_WIDTH, FNO_WIDTH)?);
        }
        Ok(Fno {
            lift: Linear::new(&v.pp("lift"), FNO_IN, FNO_WIDTH)?,
            spectral,
            pointwise,
            proj: (
                Linear::new(&v.pp("proj").pp(0), FNO_WIDTH, FNO_PROJ)?,
                Linear::new(&v.pp("proj").pp(2), FNO_PROJ, 1)?,
            ),
        })
    }
}

impl Parameters for Fno {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.lift.visit_params(f);
        for (s, p) in self.spectral.iter().zip(&self.pointwise) {
            s.visit_params(f);
            p.visit_params(f);
        }
        self.proj.0.visit_params(f);
        self.proj.1.visit_params(f);
    }
}

impl<O: Train> Module<O> for Fno {
    fn forward<'g>(&self, x: &Var<'g, O>) -> tl_nn::Result<Var<'g, O>> {
        let mut h = self.lift.forward(x)?;
        let last = self.spectral.len().saturating_sub(1);
        for (k, (s, p)) in self.spectral.iter().zip(&self.pointwise).enumerate() {
            h = (s.forward(&h)? + p.forward(&h)?)?;
            if k < last {
                h = h.gelu()?;
            }
        }
        self.proj.1.forward(&self.proj.0.forward(&h)?.gelu()?)
    }
}

/// A pre-norm transformer block: `x + attn(ln1(x))`, then `h + fc2(gelu(fc1(ln2(h))))`, with a
/// causal mask. PyTorch: `nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
/// dropout=0)` with attention without biases.
pub struct Block {
    ln1: LayerNorm,
    attn: MultiHeadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn new<O: Train>(v: &Vars<'_, O>) -> Result<Self> {
        Ok(Block {
            ln1: LayerNorm::new(&v.pp("ln1"), LM_WIDTH)?,
            attn: MultiHeadAttention::new(&v.pp("attn"), LM_WIDTH, LM_HEADS, true)?,
            ln2: LayerNorm::new(&v.pp("ln2"), LM_WIDTH)?,
            fc1: Linear::new(&v.pp("fc1"), LM_WIDTH, LM_FF)?,
            fc2: Linear::new(&v.pp("fc2"), LM_FF, LM_WIDTH)?,
        })
    }
}

impl Parameters for Block {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.ln1.visit_params(f);
        self.attn.visit_params(f);
        self.ln2.visit_params(f);
        self.fc1.visit_params(f);
        self.fc2.visit_params(f);
    }
}

impl<O: Train> Module<O> for Block {
    fn forward<'g>(&self, x: &Var<'g, O>) -> tl_nn::Result<Var<'g, O>> {
        let h = (x + &self.attn.forward(&self.ln1.forward(x)?)?)?;
        let m = self
            .fc2
            .forward(&self.fc1.forward(&self.ln2.forward(&h)?)?.gelu()?)?;
        &h + &m
    }
}

/// A GPT-style char-level language model: token embedding `tok_emb` plus a learned positional
/// embedding `pos_emb` (context, d), [`LM_BLOCKS`] blocks, a final layer norm `ln_f` and a
/// linear `head` to vocabulary logits.
pub struct Lm {
    tok: Embedding,
    pos: Param,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
    vocab: usize,
}

impl Lm {
    fn new<O: Train>(v: &Vars<'_, O>, vocab: usize) -> Result<Self> {
        let blocks = (0..LM_BLOCKS)
            .map(|k| Block::new(&v.pp("blocks").pp(k)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Lm {
            tok: Embedding::new(&v.pp("tok_emb"), vocab, LM_WIDTH)?,
            // GPT-2's positional embedding init: N(0, 0.02²).
            pos: v.param(
                "pos_emb",
                &[CONTEXT, LM_WIDTH],
                tl_nn::Init::Normal {
                    mean: 0.0,
                    std: 0.02,
                },
            )?,
            blocks,
            ln_f: LayerNorm::new(&v.pp("ln_f"), LM_WIDTH)?,
            head: Linear::new(&v.pp("head"), LM_WIDTH, vocab)?,
            vocab,
        })
    }

    /// Logits (batch, context, vocab) of `batch` windows of token ids (row-major).
    fn logits<'g, O: Train>(
        &self,
        g: &Scope<'g, O>,
        tokens: &[usize],
        batch: usize,
    ) -> tl_nn::Result<Var<'g, O>> {
        let x = self
            .tok
            .forward(g, tokens)?
            .reshape(&[batch, CONTEXT, LM_WIDTH])?;
        let mut h = (&x + &g.param(&self.pos)?)?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        self.head.forward(&self.ln_f.forward(&h)?)
    }
}

impl Parameters for Lm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.tok.visit_params(f);
        f(&self.pos);
        self.blocks.visit_params(f);
        self.ln_f.visit_params(f);
        self.head.visit_params(f);
    }
}

/// A built model; its parameters live in the runtime that built it.
pub enum Model<O: Train> {
    /// 64 → 128 → 10 ReLU MLP on the digits. PyTorch: `nn.Sequential(Linear, ReLU, Linear)`.
    Mlp(Sequential<O>),
    /// `(Conv2d 3×3 pad 1 → ReLU → MaxPool2d 2) × 2 → Flatten → Linear` on the digits, with
    /// 16 then 32 channels. PyTorch: the same `nn.Sequential` (names `0.*`, `3.*`, `7.*`).
    Cnn(Sequential<O>),
    /// FNO1d on Burgers' equation ([`Fno`]).
    Fno(Fno),
    /// Char-level transformer language model ([`Lm`]).
    Transformer(Lm),
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
            ModelName::Mlp => Model::Mlp(
                Sequential::new()
                    .add(Linear::new(&v.pp(0), PIXELS, MLP_HIDDEN)?)
                    .add(Activation::Relu)
                    .add(Linear::new(&v.pp(2), MLP_HIDDEN, CLASSES)?),
            ),
            ModelName::Cnn => {
                let cfg = ConvConfig {
                    stride: 1,
                    padding: 1,
                };
                let [c1, c2] = CNN_CHANNELS;
                let side = 8 / 2 / 2;
                Model::Cnn(
                    Sequential::new()
                        .add(Conv::conv2d(&v.pp(0), 1, c1, 3, cfg)?)
                        .add(Activation::Relu)
                        .add(MaxPool::new(&[2, 2])?)
                        .add(Conv::conv2d(&v.pp(3), c1, c2, 3, cfg)?)
                        .add(Activation::Relu)
                        .add(MaxPool::new(&[2, 2])?)
                        .add(Flatten)
                        .add(Linear::new(&v.pp(7), c2 * side * side, CLASSES)?),
                )
            }
            ModelName::Fno => Model::Fno(Fno::new(&v)?),
            ModelName::Transformer => {
                let vocab = crate::text::corpus().vocab.len();
                Model::Transformer(Lm::new(&v, vocab)?)
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
            (
                Model::Transformer(m),
                Batch::Tokens {
                    tokens,
                    next,
                    batch,
                },
            ) => {
                let out = m.logits(g, tokens, *batch)?;
                let loss = out.cross_entropy(&Labels::new(next.clone(), m.vocab)?)?;
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
            Model::Fno(m) => m.visit_params(f),
            Model::Transformer(m) => m.visit_params(f),
        }
    }
}
