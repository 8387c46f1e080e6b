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

#![allow(dead_code)]

use tl_nn::models::{self, BlockConfig, CnnConfig, TransformerBlock};
use tl_nn::{Activation, Labels, Linear, Module, Runtime, Sequential};
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
}

/// Classes of every model.
pub const CLASSES: usize = 10;

/// A model: its architecture, one input batch and its labels.
pub struct BenchModel {
    /// The architecture.
    pub kind: Kind,
    /// The input batch.
    pub x: Tensor<f32>,
    /// One class label per row (per token for the transformer).
    pub labels: Labels,
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
        }
    }

    /// The small cnn on 28×28 images at batch `batch`.
    pub fn cnn(batch: usize) -> Self {
        BenchModel {
            kind: Kind::Cnn,
            x: filled(&[batch, 1, 28, 28], 2, 1.0),
            labels: labels(batch),
        }
    }

    /// One transformer block on an (n, 64) sequence, 4 heads, ffn width 256, 10 classes.
    pub fn transformer(n: usize) -> Self {
        BenchModel {
            kind: Kind::Transformer,
            x: filled(&[n, 64], 3, 1.0),
            labels: labels(n),
        }
    }

    /// The model's parameters in `rt`, as a user builds them.
    pub fn build<O: Train<T = f32>>(&self, rt: &Runtime<O>) -> tl_nn::Result<Sequential<O>> {
        let v = rt.vars();
        match self.kind {
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
        }
    }

    /// One training step of `net` (built by [`BenchModel::build`] in `rt`) with `opt`: the
    /// user's `Runtime::step`. Returns the loss.
    pub fn train_step<O: Train<T = f32>>(
        &self,
        rt: &mut Runtime<O>,
        net: &Sequential<O>,
        opt: &mut Optimizer,
    ) -> tl_nn::Result<f64> {
        rt.step(net, opt, |g| {
            net.forward(&g.input(self.x.clone())?)?
                .cross_entropy(&self.labels)
        })
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
    pub net: Sequential<O>,
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
            opt: Optimizer::sgd(0.01)?,
        })
    }

    /// One training step ([`BenchModel::train_step`]). Returns the loss.
    pub fn step(&mut self) -> f32 {
        let loss = self
            .model
            .train_step(&mut self.rt, &self.net, &mut self.opt);
        loss.expect("a bench training step") as f32
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
