//! The benchmarks' models, built from tl-nn's layers ([`tl_nn::models`]) and trained with
//! [`Runtime::step`], the code a user writes: one training step is `reset`, record the
//! parameters, the batch, the forward pass and the cross-entropy, `backward_step` with SGD 0.01.
//! Parameters get PyTorch's default initialisers from the session's seed (0, the same for the
//! eager and the linked session); the batch is uniform in ±1 and the labels fixed. The peer
//! comparison (`benches/peers`) includes this file too, and gives candle these parameter values
//! ([`Run::param_values`]), batch and labels.
//!
//! - mlp: 784-256-256-10, relu, batch 64.
//! - cnn: (64, 1, 28, 28) → conv 1→8 k3 p1 → relu → maxPool 2 → conv 8→16 k3 p1 → relu →
//!   maxPool 2 → flatten (64, 784) → linear 784→10.
//! - transformer block: x (128, 64) → x + mha(layerNorm x) (4 heads, no mask) → h +
//!   ffn(layerNorm h) (64→256 gelu →64) → linear 64→10, per token.
//!
//! Realistic sizes (issue 39; `models::*` as a user builds them, each with its own optimizer):
//! - wide mlp: 784-4096-4096-10, relu, batch 256, SGD 0.01.
//! - resnet: `models::ResNet` on (32, 3, 32, 32): stem conv 3→64 + BN + ReLU, 4 basic blocks of
//!   64 channels (conv-BN-ReLU-conv-BN + skip, ReLU), mean over the image, linear 64→10; SGD
//!   0.01 with momentum 0.9.
//! - lm: `models::TransformerLm`, vocabulary 72, context 128, width 256, 4 causal pre-norm blocks
//!   (4 heads, MLP 1024), batch 16, next-token cross-entropy, AdamW 1e-3.

#![allow(dead_code)]

use tl_nn::models::{
    self, BlockConfig, CnnConfig, LmConfig, ResNet, ResNetConfig, TransformerBlock, TransformerLm,
};
use tl_nn::{Activation, Labels, Linear, Module, Parameters, Runtime, Sequential};
use tl_session::Param;
use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
use tl_spec::Tensor;

/// Deterministic values uniform in [-scale, scale) (the project's counter RNG keyed by `seed`).
pub fn filled(dims: &[usize], seed: u64, scale: f32) -> Tensor<f32> {
    let key = tl_spec::rng::key(seed, 0);
    Tensor::from_fn(dims, |i| {
        (2.0 * tl_spec::rng::unit(key, i as u64) - 1.0) as f32 * scale
    })
}

/// Which architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 784-256-256-10 relu MLP.
    Mlp,
    /// Two conv + maxPool stages and a linear head.
    Cnn,
    /// One pre-norm transformer block and a linear head.
    Transformer,
    /// 784-4096-4096-10 relu MLP.
    WideMlp,
    /// A ResNet of 4 basic blocks of 64 channels on 3×32×32 images.
    ResNet,
    /// A character transformer LM (width 256, 4 blocks, context 128).
    Lm,
}

/// The LM's shape.
pub const LM: LmConfig = LmConfig {
    vocab: 72,
    context: 128,
    d_model: 256,
    heads: 4,
    d_ff: 1024,
    blocks: 4,
};

/// The ResNet's shape.
pub const RESNET: ResNetConfig = ResNetConfig {
    in_channels: 3,
    channels: 64,
    blocks: 4,
    classes: CLASSES,
};

/// Classes of every model.
pub const CLASSES: usize = 10;

/// A model: its architecture, one input batch and its labels.
pub struct BenchModel {
    /// The architecture.
    pub kind: Kind,
    /// The input batch.
    pub x: Tensor<f32>,
    /// One class label per row (per token for the transformer; the next token for the LM).
    pub labels: Labels,
    /// The LM's input token ids (batch × context; empty for the other models).
    pub tokens: Vec<usize>,
}

/// A built model: a layer stack, or one of `tl_nn::models`' structs.
pub enum Net<O: Train> {
    /// mlp, cnn, transformer, wide mlp.
    Seq(Sequential<O>),
    /// The ResNet.
    Res(ResNet),
    /// The LM.
    Lm(TransformerLm),
}

impl<O: Train> Parameters for Net<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Net::Seq(m) => m.visit_params(f),
            Net::Res(m) => m.visit_params(f),
            Net::Lm(m) => m.visit_params(f),
        }
    }
}

fn labels(n: usize) -> Labels {
    Labels::new((0..n).map(|i| (i * 7 + 3) % CLASSES).collect(), CLASSES)
        .expect("labels below CLASSES")
}

impl BenchModel {
    /// The mlp 784-256-256-10 at batch `batch`.
    pub fn mlp(batch: usize) -> Self {
        BenchModel {
            kind: Kind::Mlp,
            x: filled(&[batch, 784], 1, 1.0),
            labels: labels(batch),
            tokens: Vec::new(),
        }
    }

    /// The wide mlp 784-4096-4096-10 at batch `batch`.
    pub fn wide_mlp(batch: usize) -> Self {
        BenchModel {
            kind: Kind::WideMlp,
            ..Self::mlp(batch)
        }
    }

    /// The ResNet on (batch, 3, side, side) images (the benchmarks: side 32).
    pub fn resnet(batch: usize, side: usize) -> Self {
        BenchModel {
            kind: Kind::ResNet,
            x: filled(&[batch, 3, side, side], 4, 1.0),
            labels: labels(batch),
            tokens: Vec::new(),
        }
    }

    /// The LM on `batch` windows of its context (`LM.context` tokens each).
    pub fn lm(batch: usize) -> Self {
        let n = batch * LM.context;
        let token = |i: usize| (i * 31 + 7) % LM.vocab;
        BenchModel {
            kind: Kind::Lm,
            x: Tensor::from_fn([0], |_| 0.0),
            labels: Labels::new((0..n).map(|i| token(i + 1)).collect(), LM.vocab)
                .expect("tokens below the vocabulary"),
            tokens: (0..n).map(token).collect(),
        }
    }

    /// The optimizer a user trains this model with: AdamW 1e-3 for the LM, SGD 0.01 with
    /// momentum 0.9 for the ResNet, SGD 0.01 otherwise.
    pub fn optimizer(&self) -> tl_nn::Result<Optimizer> {
        Ok(match self.kind {
            Kind::Lm => Optimizer::adamw(1e-3)?,
            Kind::ResNet => Optimizer::momentum(0.01, 0.9)?,
            _ => Optimizer::sgd(0.01)?,
        })
    }

    /// The small cnn on 28×28 images at batch `batch`.
    pub fn cnn(batch: usize) -> Self {
        BenchModel {
            kind: Kind::Cnn,
            x: filled(&[batch, 1, 28, 28], 2, 1.0),
            labels: labels(batch),
            tokens: Vec::new(),
        }
    }

    /// One transformer block on an (n, 64) sequence, 4 heads, ffn width 256, 10 classes.
    pub fn transformer(n: usize) -> Self {
        BenchModel {
            kind: Kind::Transformer,
            x: filled(&[n, 64], 3, 1.0),
            labels: labels(n),
            tokens: Vec::new(),
        }
    }

    /// The model a benchmark key names, at the step benches' sizes: `mlp` (batch 64), `cnn`
    /// (batch 64), `transformer` (n 128), `wide-mlp` (batch 256), `resnet` (3×32×32, batch
    /// 32), `lm` (batch 16); `None` for another key. `benches/jax/ratio.py --models` takes the
    /// same keys.
    pub fn from_key(key: &str) -> Option<Self> {
        Some(match key {
            "mlp" => Self::mlp(64),
            "cnn" => Self::cnn(64),
            "transformer" => Self::transformer(128),
            "wide-mlp" => Self::wide_mlp(256),
            "resnet" => Self::resnet(32, 32),
            "lm" => Self::lm(16),
            _ => return None,
        })
    }

    /// The model's parameters in `rt`, as a user builds them.
    pub fn build<O: Train<T = f32>>(&self, rt: &Runtime<O>) -> tl_nn::Result<Net<O>> {
        let v = rt.vars();
        let seq = match self.kind {
            Kind::ResNet => return Ok(Net::Res(ResNet::new(&v, &RESNET)?)),
            Kind::Lm => return Ok(Net::Lm(TransformerLm::new(&v, &LM)?)),
            Kind::WideMlp => models::mlp(&v, &[784, 4096, 4096, CLASSES], Activation::Relu),
            Kind::Mlp => models::mlp(&v, &[784, 256, 256, CLASSES], Activation::Relu),
            Kind::Cnn => models::cnn(
                &v,
                &CnnConfig {
                    in_channels: 1,
                    height: 28,
                    width: 28,
                    channels: vec![8, 16],
                    classes: CLASSES,
                },
            ),
            Kind::Transformer => {
                let d = 64;
                let block = BlockConfig {
                    d_model: d,
                    heads: 4,
                    d_ff: 4 * d,
                    causal: false,
                };
                Ok(Sequential::new()
                    .add(TransformerBlock::new(&v.pp(0), &block)?)
                    .add(Linear::new(&v.pp(1), d, CLASSES)?))
            }
        };
        seq.map(Net::Seq)
    }

    /// One training step of `net` (built by [`BenchModel::build`] in `rt`) with `opt`: the
    /// user's `Runtime::step`. Returns the loss.
    pub fn train_step<O: Train<T = f32>>(
        &self,
        rt: &mut Runtime<O>,
        net: &Net<O>,
        opt: &mut Optimizer,
    ) -> tl_nn::Result<f64> {
        rt.step(net, opt, |g| {
            let logits = match net {
                Net::Seq(m) => m.forward(&g.input(self.x.clone())?)?,
                Net::Res(m) => m.forward(&g.input(self.x.clone())?)?,
                Net::Lm(m) => m.logits(g, &self.tokens, self.tokens.len() / LM.context)?,
            };
            logits.cross_entropy(&self.labels)
        })
    }
}

impl BenchModel {
    /// One evaluation pass of `net` on the model's batch (`Runtime::eval`: eval mode, no
    /// gradients): its logits.
    pub fn eval_pass<O: Train<T = f32>>(
        &self,
        rt: &Runtime<O>,
        net: &Net<O>,
    ) -> tl_nn::Result<Tensor<f32>> {
        match net {
            Net::Seq(m) => rt.eval(m, |g| m.forward(&g.input(self.x.clone())?)),
            Net::Res(m) => rt.eval(m, |g| m.forward(&g.input(self.x.clone())?)),
            Net::Lm(m) => rt.eval(m, |g| {
                m.logits(g, &self.tokens, self.tokens.len() / LM.context)
            }),
        }
    }
}

/// A session with a model's parameters and an SGD optimizer: eager ([`EagerRun`]) or linked
/// ([`LinkedRun`], the recorded graph compiled to the backend's tape at every step).
pub struct Run<'m, O: Train<T = f32>> {
    /// The model.
    pub model: &'m BenchModel,
    /// The runtime: the session and the named parameters.
    pub rt: Runtime<O>,
    /// The network.
    pub net: Net<O>,
    /// The optimizer.
    pub opt: Optimizer,
}

/// An eager session's run.
pub type EagerRun<'m> = Run<'m, Session<f32>>;
/// A linked session's run.
pub type LinkedRun<'m> = Run<'m, LinkedSession<f32>>;

impl<'m, O: Train<T = f32>> Run<'m, O> {
    /// `model` built in a runtime over `session`.
    pub fn with_session(model: &'m BenchModel, session: O) -> tl_nn::Result<Self> {
        let rt = Runtime::new(session);
        let net = model.build(&rt)?;
        Ok(Run {
            model,
            rt,
            net,
            opt: model.optimizer()?,
        })
    }

    /// One training step ([`BenchModel::train_step`]). Returns the loss.
    pub fn step(&mut self) -> f32 {
        self.try_step().expect("a bench training step")
    }

    /// One training step; its loss, or the step's error.
    pub fn try_step(&mut self) -> tl_nn::Result<f32> {
        let loss = self
            .model
            .train_step(&mut self.rt, &self.net, &mut self.opt)?;
        Ok(loss as f32)
    }

    /// The parameters' current values, in the model's order (per layer: weight, then bias).
    pub fn param_values(&self) -> tl_nn::Result<Vec<Tensor<f32>>> {
        self.rt
            .named_params_of(&self.net)
            .iter()
            .map(|(_, p)| self.rt.value_of(p))
            .collect()
    }
}

impl<'m> Run<'m, Session<f32>> {
    /// A fresh CPU session for `model`.
    pub fn new(model: &'m BenchModel) -> Self {
        Self::on(model, Backend::Cpu).expect("the CPU backend")
    }

    /// A fresh session on `backend` for `model` (an error when the backend is unavailable).
    pub fn on(model: &'m BenchModel, backend: Backend) -> tl_nn::Result<Self> {
        Self::with_session(model, Session::new(Options::backend(backend))?)
    }
}

impl<'m> Run<'m, LinkedSession<f32>> {
    /// A fresh linked session for `model`, compiled to the CPU tape.
    pub fn new(model: &'m BenchModel) -> Self {
        Self::on(model, Backend::Cpu).expect("the CPU backend")
    }

    /// A fresh linked session for `model`, compiled to `backend`'s tape at every step
    /// (parameters resident on a CUDA backend's device between steps).
    pub fn on(model: &'m BenchModel, backend: Backend) -> tl_nn::Result<Self> {
        let mut s = LinkedSession::new();
        s.set_backend(backend)?;
        Self::with_session(model, s)
    }
}
