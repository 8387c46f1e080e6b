//! Bench-local models written against the [`Ops`] methods (so they run eager and linked), with
//! deterministic parameters and a fixed batch, and one training step per session kind (forward,
//! backward, optimizer update). The peer comparison (`benches/peers`) includes this file too, so
//! candle gets exactly these shapes and values. Once `tl_session::models::{Cnn, TransformerLm}`
//! land these can be swapped for the builders.
//!
//! - mlp: 784-256-256-10, relu, batch 64, cross-entropy.
//! - cnn: (64, 1, 28, 28) → conv 1→8 k3 p1 → relu → maxPool 2 → conv 8→16 k3 p1 → relu →
//!   maxPool 2 → flatten (64, 784) → linear 784→10 → cross-entropy.
//! - transformer block: x (128, 64) → x + mha(layerNorm x) (4 heads) → h + ffn(layerNorm h)
//!   (64→256 gelu →64) → linear 64→10 → cross-entropy per token.

#![allow(dead_code)]

use tl_session::{
    Backend, LinkedSession, Ops, Optimizer, Param, Result, Session, TensorRef, Train,
};
use tl_spec::{Shape, Tensor};

/// Deterministic pseudo-random values in [-scale, scale).
pub fn filled(dims: &[usize], seed: u64, scale: f32) -> Tensor<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Tensor::from_fn(dims, |_| {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
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

/// A model: its architecture, initial parameter values, one input batch and its labels.
pub struct BenchModel {
    /// The architecture.
    pub kind: Kind,
    /// Initial parameter values, in the order [`BenchModel::loss`] uses them.
    pub inits: Vec<Tensor<f32>>,
    /// The input batch.
    pub x: Tensor<f32>,
    /// One class label per row (per token for the transformer).
    pub labels: Vec<usize>,
}

/// PyTorch-like fan-in scaling for a weight of `dims` (fan-in is the product past the first).
fn weight(dims: &[usize], seed: u64) -> Tensor<f32> {
    let fan_in: usize = dims[1..].iter().product();
    filled(dims, seed, 1.0 / (fan_in as f32).sqrt())
}

fn labels(n: usize, classes: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 7 + 3) % classes).collect()
}

impl BenchModel {
    /// The mlp 784-256-256-10 at batch `batch`.
    pub fn mlp(batch: usize) -> Self {
        let mut inits = Vec::new();
        for (k, (i, o)) in [(784, 256), (256, 256), (256, 10)].into_iter().enumerate() {
            inits.push(weight(&[o, i], 10 + k as u64));
            inits.push(filled(&[o], 20 + k as u64, 1.0 / (i as f32).sqrt()));
        }
        BenchModel {
            kind: Kind::Mlp,
            inits,
            x: filled(&[batch, 784], 1, 1.0),
            labels: labels(batch, 10),
        }
    }

    /// The small cnn at batch `batch`.
    pub fn cnn(batch: usize) -> Self {
        BenchModel {
            kind: Kind::Cnn,
            inits: vec![
                weight(&[8, 1, 3, 3], 30),
                filled(&[8], 31, 0.1),
                weight(&[16, 8, 3, 3], 32),
                filled(&[16], 33, 0.1),
                weight(&[10, 784], 34),
                filled(&[10], 35, 0.05),
            ],
            x: filled(&[batch, 1, 28, 28], 2, 1.0),
            labels: labels(batch, 10),
        }
    }

    /// One transformer block on a (n, 64) sequence, 4 heads, ffn width 256, 10 classes.
    pub fn transformer(n: usize) -> Self {
        let dm = 64;
        BenchModel {
            kind: Kind::Transformer,
            inits: vec![
                Tensor::ones([dm]),          // ln1 γ
                Tensor::zeros([dm]),         // ln1 β
                weight(&[dm, dm], 40),       // wq
                weight(&[dm, dm], 41),       // wk
                weight(&[dm, dm], 42),       // wv
                weight(&[dm, dm], 43),       // wo
                Tensor::ones([dm]),          // ln2 γ
                Tensor::zeros([dm]),         // ln2 β
                weight(&[4 * dm, dm], 44),   // ffn up
                filled(&[4 * dm], 45, 0.05), // ffn up bias
                weight(&[dm, 4 * dm], 46),   // ffn down
                filled(&[dm], 47, 0.05),     // ffn down bias
                weight(&[10, dm], 48),       // head
                filled(&[10], 49, 0.05),     // head bias
            ],
            x: filled(&[n, dm], 3, 1.0),
            labels: labels(n, 10),
        }
    }

    /// Create the parameters in session `s`.
    pub fn params<S: Ops<T = f32>>(&self, s: &mut S) -> Result<Vec<Param>> {
        self.inits
            .iter()
            .map(|t| s.param(t.clone(), None, true))
            .collect()
    }

    /// One training step through the training loop's calls ([`Train`]): reset, record the
    /// labels and the loss, `backward_step` with `opt`. Returns the loss.
    pub fn train_step<S: Train<T = f32>>(
        &self,
        s: &mut S,
        params: &[Param],
        opt: &mut Optimizer,
    ) -> Result<f64> {
        s.reset();
        let at = s.record_nat_vec(&self.labels).pos();
        let loss = self.loss(s, params, at)?;
        s.backward_step(&loss, opt)
    }

    /// Record the parameters, the batch and the forward pass; returns the mean cross-entropy
    /// against the labels at Nat position `labels_at`.
    pub fn loss<S: Ops<T = f32>>(
        &self,
        s: &mut S,
        params: &[Param],
        labels_at: usize,
    ) -> Result<TensorRef> {
        let p: Vec<TensorRef> = params
            .iter()
            .map(|p| s.use_param(p))
            .collect::<Result<_>>()?;
        let x = s.input(self.x.clone(), false)?;
        let logits = match self.kind {
            Kind::Mlp => {
                let h = s.linear(&p[0], &p[1], &x)?;
                let h = s.relu(&h)?;
                let h = s.linear(&p[2], &p[3], &h)?;
                let h = s.relu(&h)?;
                s.linear(&p[4], &p[5], &h)?
            }
            Kind::Cnn => {
                let batch = self.x.shape().dims()[0];
                let same = (vec![1, 1], vec![1, 1]);
                let pool =
                    |s: &mut S, h: &TensorRef| s.max_pool(h, vec![2, 2], vec![2, 2], vec![0, 0]);
                let h = s.conv(&p[0], &p[1], &x, same.0.clone(), same.1.clone())?;
                let h = s.relu(&h)?;
                let h = pool(s, &h)?;
                let h = s.conv(&p[2], &p[3], &h, same.0, same.1)?;
                let h = s.relu(&h)?;
                let h = pool(s, &h)?;
                let h = s.reshape(&h, Shape::new(&[batch, 784]))?;
                s.linear(&p[4], &p[5], &h)?
            }
            Kind::Transformer => {
                let eps = 1e-5;
                let h = s.layer_norm(&x, &p[0], &p[1], eps)?;
                let a = s.multi_head_attention(&p[2], &p[3], &p[4], &p[5], &h, 4, None, true)?;
                let x1 = s.add(&x, &a)?;
                let h = s.layer_norm(&x1, &p[6], &p[7], eps)?;
                let h = s.linear(&p[8], &p[9], &h)?;
                let h = s.gelu(&h)?;
                let h = s.linear(&p[10], &p[11], &h)?;
                let x2 = s.add(&x1, &h)?;
                s.linear(&p[12], &p[13], &x2)?
            }
        };
        s.cross_entropy(&logits, labels_at)
    }
}

/// An eager session (CPU unless made with [`EagerRun::on`]) with the model's parameters and an
/// SGD optimizer.
pub struct EagerRun<'m> {
    /// The model.
    pub model: &'m BenchModel,
    /// The session.
    pub s: Session<f32>,
    /// The parameters.
    pub params: Vec<Param>,
    /// The optimizer.
    pub opt: Optimizer,
}

impl<'m> EagerRun<'m> {
    /// A fresh CPU session for `model`.
    pub fn new(model: &'m BenchModel) -> Self {
        Self::on(model, Backend::Cpu).unwrap()
    }

    /// A fresh session on `backend` for `model` (an error when the backend is unavailable).
    pub fn on(model: &'m BenchModel, backend: Backend) -> Result<Self> {
        let mut s = Session::new(tl_session::Options::backend(backend))?;
        let params = model.params(&mut s)?;
        Ok(EagerRun {
            model,
            s,
            params,
            opt: Optimizer::sgd(0.01).expect("a valid learning rate"),
        })
    }

    /// One training step: reset, forward, backward, SGD update. Returns the loss.
    pub fn step(&mut self) -> f32 {
        let s = &mut self.s;
        s.reset();
        let at = s.record_nat_vec(&self.model.labels).pos();
        let loss = self.model.loss(s, &self.params, at).unwrap();
        s.backward(&loss).unwrap();
        s.step(&mut self.opt).unwrap();
        s.value(&loss).unwrap().item().unwrap()
    }
}

/// A linked session with the model's parameters and an SGD optimizer, compiled to the CPU tape
/// unless made with [`LinkedRun::on`].
pub struct LinkedRun<'m> {
    /// The model.
    pub model: &'m BenchModel,
    /// The session.
    pub s: LinkedSession<f32>,
    /// The parameters.
    pub params: Vec<Param>,
    /// The optimizer.
    pub opt: Optimizer,
    /// The backend the graph is compiled to.
    pub backend: Backend,
}

impl<'m> LinkedRun<'m> {
    /// A fresh session for `model`, compiled to the CPU tape.
    pub fn new(model: &'m BenchModel) -> Self {
        Self::on(model, Backend::Cpu)
    }

    /// A fresh session for `model`, compiled to `backend`'s tape at every step.
    pub fn on(model: &'m BenchModel, backend: Backend) -> Self {
        let mut s = LinkedSession::new();
        s.set_backend(backend).expect("the backend is available");
        let params = model.params(&mut s).unwrap();
        LinkedRun {
            model,
            s,
            params,
            opt: Optimizer::sgd(0.01).expect("a valid learning rate"),
            backend,
        }
    }

    /// One training step as the training loop takes it ([`Train::backward_step`], through
    /// [`BenchModel::train_step`]): reset, record the graph, compile it to the backend's tape,
    /// backward to the trainable parameters only, SGD update (on a CUDA backend on the device,
    /// parameters resident there). Returns the loss.
    pub fn step(&mut self) -> f32 {
        let loss = self
            .model
            .train_step(&mut self.s, &self.params, &mut self.opt);
        loss.unwrap() as f32
    }
}
