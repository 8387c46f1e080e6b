//! A multi-layer perceptron: `linear → act → … → linear`. PyTorch: `nn.Sequential` of
//! `nn.Linear` and an activation.

use tl_spec::{Scalar, Tensor};

use super::SplitMix;
use crate::{Ops, Param, Result, TensorRef};

/// The hidden-layer activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `tanh`.
    Tanh,
    /// `relu`.
    Relu,
    /// `sigmoid`.
    Sigmoid,
}

/// An MLP's parameters: one (weight (out, in), bias (out)) pair per layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `(w, b)` per layer, input to output.
    pub layers: Vec<(Param, Param)>,
    /// The activation between layers (none after the last).
    pub act: Activation,
}

impl Mlp {
    /// Parameters for layer sizes `sizes` (`[in, hidden…, out]`), initialised like PyTorch's
    /// `nn.Linear` (uniform in ±1/√fan_in) from `seed`.
    pub fn new<S: Ops + ?Sized>(
        s: &mut S,
        sizes: &[usize],
        act: Activation,
        seed: u64,
    ) -> Result<Self> {
        let mut rng = SplitMix::new(seed);
        let mut layers = Vec::with_capacity(sizes.len().saturating_sub(1));
        for (k, pair) in sizes.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
            let mut init = |shape: &[usize]| {
                Tensor::<S::T>::from_fn(shape, |_| S::T::lit(rng.uniform(-bound, bound)))
            };
            let w = init(&[fan_out, fan_in]);
            let b = init(&[fan_out]);
            let w = s.param(w, Some(&format!("layer{k}.weight")), true)?;
            let b = s.param(b, Some(&format!("layer{k}.bias")), true)?;
            layers.push((w, b));
        }
        Ok(Mlp { layers, act })
    }

    /// Every parameter, layer by layer (weight, then bias).
    pub fn params(&self) -> Vec<Param> {
        self.layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    /// Record every parameter as a leaf (linked sessions need all leaves before the first op).
    pub fn use_params<S: Ops + ?Sized>(&self, s: &mut S) -> Result<Vec<(TensorRef, TensorRef)>> {
        self.layers
            .iter()
            .map(|(w, b)| Ok((s.use_param(w)?, s.use_param(b)?)))
            .collect()
    }

    /// The forward pass on `x` ((in) or (B, in)) with parameter leaves from
    /// [`use_params`](Self::use_params).
    pub fn forward<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        leaves: &[(TensorRef, TensorRef)],
        x: &TensorRef,
    ) -> Result<TensorRef> {
        let mut h = x.clone();
        for (k, (w, b)) in leaves.iter().enumerate() {
            h = s.linear(w, b, &h)?;
            if k + 1 < leaves.len() {
                h = match self.act {
                    Activation::Tanh => s.tanh(&h)?,
                    Activation::Relu => s.relu(&h)?,
                    Activation::Sigmoid => s.sigmoid(&h)?,
                };
            }
        }
        Ok(h)
    }

    /// `mse_loss(forward(x), y)`, recording the parameters and inputs first (so it works on both
    /// session kinds after a reset).
    pub fn loss<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        x: Tensor<S::T>,
        y: Tensor<S::T>,
    ) -> Result<TensorRef> {
        let leaves = self.use_params(s)?;
        let x = s.input(x, false)?;
        let y = s.input(y, false)?;
        let pred = self.forward(s, &leaves, &x)?;
        s.mse_loss(&pred, &y)
    }
}
