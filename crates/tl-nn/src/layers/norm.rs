//! [`LayerNorm`] and [`BatchNorm`]. PyTorch: `nn.LayerNorm`, `nn.BatchNorm1d/2d/3d`.

use tl_session::{Param, Train};
use tl_spec::Shape;

use super::{At, inv_std};
use crate::display::py_float;
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// Normalisation over the last axis (biased variance, two-pass) with a learned scale `weight`
/// (ones) and shift `bias` (zeros). PyTorch: `nn.LayerNorm(dim, eps=1e-5)`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale (dim), named `weight`.
    pub weight: Param,
    /// Shift (dim), named `bias`.
    pub bias: Param,
    /// ε added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm over `dim` features with PyTorch's ε = 1e-5.
    pub fn new<O: Train>(vars: &Vars<'_, O>, dim: usize) -> Result<Self> {
        Self::with_eps(vars, dim, 1e-5)
    }

    /// A layer norm with ε = `eps` (> 0).
    pub fn with_eps<O: Train>(vars: &Vars<'_, O>, dim: usize, eps: f64) -> Result<Self> {
        if dim == 0 || !(eps > 0.0 && eps.is_finite()) {
            return Err(usage(
                "LayerNorm::new",
                format!("need dim ≥ 1 and a finite ε > 0, got dim {dim}, ε {eps}"),
            ));
        }
        Ok(LayerNorm {
            weight: vars.param("weight", &[dim], Init::Ones)?,
            bias: vars.param("bias", &[dim], Init::Zeros)?,
            eps,
        })
    }
}

impl Parameters for LayerNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine=True",
            self.weight.shape().dims()[0],
            py_float(self.eps)
        )
    }
}

impl<O: Train> Module<O> for LayerNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let at = At::new(g.rt, self, &self.weight);
        let dim = self.weight.shape().dims()[0];
        if x.dims().last() != Some(&dim) {
            return Err(at.input(format!(
                "input {} has {} features in its last axis, expected {dim}",
                x.shape(),
                x.dims().last().map_or("no".into(), usize::to_string)
            )));
        }
        let eps = self.eps;
        x.op("LayerNorm::forward", &[&w, &b], |s| {
            s.layer_norm(x.tensor_ref(), w.tensor_ref(), b.tensor_ref(), eps)
        })
        .map_err(|e| at.op_error(e))
    }
}

/// Batch normalisation over channels (axis 1 of (N, C, …); an unbatched (C, …) is one
/// sample). Training passes normalise with the batch's statistics (biased variance) and
/// update the running statistics with PyTorch's rule `running ← (1 − momentum)·running +
/// momentum·batch` (the running variance takes the unbiased batch variance); eval passes
/// normalise with the running statistics. PyTorch: `nn.BatchNorm2d(C, eps=1e-5,
/// momentum=0.1)` (and 1d/3d: any number of trailing axes).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    /// Scale (C), named `weight` (ones).
    pub weight: Param,
    /// Shift (C), named `bias` (zeros).
    pub bias: Param,
    /// Running mean (C), a buffer named `running_mean` (zeros).
    pub running_mean: Param,
    /// Running variance (C), a buffer named `running_var` (ones).
    pub running_var: Param,
    /// ε added to the variance.
    pub eps: f64,
    /// The weight of the newest batch in the running statistics.
    pub momentum: f64,
}

impl BatchNorm {
    /// Batch norm over `channels` with PyTorch's ε = 1e-5 and momentum 0.1.
    pub fn new<O: Train>(vars: &Vars<'_, O>, channels: usize) -> Result<Self> {
        Self::with(vars, channels, 1e-5, 0.1)
    }

    /// Batch norm with ε = `eps` (> 0) and `momentum` in [0, 1].
    pub fn with<O: Train>(
        vars: &Vars<'_, O>,
        channels: usize,
        eps: f64,
        momentum: f64,
    ) -> Result<Self> {
        if channels == 0 || !(eps > 0.0 && eps.is_finite()) || !(0.0..=1.0).contains(&momentum) {
            return Err(usage(
                "BatchNorm::new",
                format!(
                    "need channels ≥ 1, a finite ε > 0 and momentum in [0, 1], got {channels}, ε {eps}, momentum {momentum}"
                ),
            ));
        }
        Ok(BatchNorm {
            weight: vars.param("weight", &[channels], Init::Ones)?,
            bias: vars.param("bias", &[channels], Init::Zeros)?,
            running_mean: vars.buffer("running_mean", &[channels], Init::Zeros)?,
            running_var: vars.buffer("running_var", &[channels], Init::Ones)?,
            eps,
            momentum,
        })
    }

    fn channels(&self) -> usize {
        self.weight.shape().dims()[0]
    }

    /// x as (N, C, R, 1) (the op's batched layout), with N and R.
    fn as_4d<'g, O: Train>(&self, x: &Var<'g, O>) -> Result<(Var<'g, O>, usize, usize)> {
        let c = self.channels();
        let dims = x.dims();
        let (n, rest) = match dims {
            [n, ch, rest @ ..] if *ch == c => (*n, rest.iter().product::<usize>()),
            _ => {
                let at = At::new(x.scope().rt, self, &self.weight);
                let has = match dims {
                    [_, ch, ..] => format!(" (it has {ch} at axis 1)"),
                    _ => String::new(),
                };
                return Err(at.input(format!(
                    "input {} must be (N, {c}, …): batch, then {c} channels{has}",
                    x.shape()
                )));
            }
        };
        Ok((x.reshape(&[n, c, rest, 1])?, n, rest))
    }

    /// Update the running statistics from the batch moments of x4 (N, C, R, 1): the op
    /// `batchMoments` ((2, C): the means, then the biased variances) and the update of both
    /// buffers from it (`Train::update_running`, PyTorch's rule in f64; one kernel on a CUDA
    /// backend) run where x and the statistics live, so on a CUDA backend nothing is read back
    /// or uploaded.
    fn update_running<O: Train>(&self, x4: &Var<'_, O>, rt: &crate::Runtime<O>) -> Result<()> {
        let at = || At::new(rt, self, &self.weight);
        let count = x4.shape().numel() / self.channels();
        let moments = (x4.detach()?.batch_moments()).map_err(|e| at().op_error(e))?;
        let r = rt.borrow_mut().update_running(
            &self.running_mean,
            &self.running_var,
            moments.tensor_ref(),
            self.momentum,
            count,
        );
        r.map_err(|e| at().op_error(e.into()))
    }
}

impl Parameters for BatchNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
        f(&self.running_mean);
        f(&self.running_var);
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={}, momentum={}",
            self.channels(),
            py_float(self.eps),
            py_float(self.momentum)
        )
    }
}

impl<O: Train> Module<O> for BatchNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let (x4, n, r) = self.as_4d(x)?;
        let c = self.channels();
        let y = if g.training() {
            let eps = self.eps;
            let y = x4
                .op("BatchNorm::forward", &[&w, &b], |s| {
                    s.batchnorm_channel_first(x4.tensor_ref(), w.tensor_ref(), b.tensor_ref(), eps)
                })
                .map_err(|e| At::new(g.rt, self, &self.weight).op_error(e))?;
            self.update_running(&x4, g.rt)?;
            y
        } else {
            // (x − running_mean)·(1/√(running_var + ε))·γ + β, the statistics read where they
            // live (on a CUDA backend their resident mirrors: nothing downloaded or uploaded),
            // the scale in f64 rounded once (`inv_std`).
            let rm = g.param(&self.running_mean)?;
            let inv = g
                .param(&self.running_var)?
                .user(&inv_std::op(self.eps), &[])?;
            let to = Shape::new(&[n, c, r, 1]);
            let per_channel = |v: &Var<'g, O>| v.reshape(&[c, 1, 1])?.broadcast_to(&to);
            let xhat = ((&x4 - &per_channel(&rm)?)? * per_channel(&inv)?)?;
            let (gamma, beta) = (per_channel(&w)?, per_channel(&b)?);
            ((&xhat * &gamma)? + beta)?
        };
        y.reshape(x.dims())
    }
}
