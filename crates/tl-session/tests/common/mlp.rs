//! A plain MLP written on [`Ops`]: the session mechanics under test, without tl-nn's runtime in
//! between.

use tl_session::{Ops, Param, Result, TensorRef};
use tl_spec::{Scalar, Tensor};

pub use super::grid::regression_grid;

/// `linear → tanh → … → linear` through the layer sizes `[in, hidden…, out]`; each weight
/// (out, in) and bias (out) uniform in ±1/√in (PyTorch's `nn.Linear` distribution), drawn
/// from the project's counter RNG keyed by `seed`.
pub struct Mlp {
    /// `(weight, bias)` per layer, input to output.
    pub layers: Vec<(Param, Param)>,
}

impl Mlp {
    pub fn new<S: Ops + ?Sized>(s: &mut S, sizes: &[usize], seed: u64) -> Result<Self> {
        let mut layers = Vec::new();
        for (k, pair) in sizes.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let bound = 1.0 / (fan_in as f64).sqrt();
            let init = |dims: &[usize], draw: u64| {
                let key = tl_spec::rng::key(seed, draw);
                Tensor::<S::T>::from_fn(dims, |i| {
                    S::T::lit(bound * (2.0 * tl_spec::rng::unit(key, i as u64) - 1.0))
                })
            };
            let w = s.param(init(&[fan_out, fan_in], 2 * k as u64), None, true)?;
            let b = s.param(init(&[fan_out], 2 * k as u64 + 1), None, true)?;
            layers.push((w, b));
        }
        Ok(Mlp { layers })
    }

    /// Every parameter, layer by layer (weight, then bias).
    pub fn params(&self) -> Vec<Param> {
        self.layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    /// `mse_loss(mlp(x), y)`, recording the parameters first, then the inputs (so it works on
    /// both session kinds after a reset).
    pub fn loss<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        x: Tensor<S::T>,
        y: Tensor<S::T>,
    ) -> Result<TensorRef> {
        let leaves = self
            .layers
            .iter()
            .map(|(w, b)| Ok((s.use_param(w)?, s.use_param(b)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut h = s.input(x, false)?;
        let y = s.input(y, false)?;
        for (k, (w, b)) in leaves.iter().enumerate() {
            h = s.linear(w, b, &h)?;
            if k + 1 < leaves.len() {
                h = s.tanh(&h)?;
            }
        }
        s.mse_loss(&h, &y)
    }
}
