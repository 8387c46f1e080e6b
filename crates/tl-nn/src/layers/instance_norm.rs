//! [`InstanceNorm`]: each sample's channels normalised over their own trailing axes. PyTorch:
//! `nn.InstanceNorm1d/2d/3d`.

use tl_session::{Param, Train};

use super::At;
use super::norm::{channels_first, normalise_groups};
use crate::display::{py_bool, py_float};
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// Instance normalisation: each (sample, channel) of (N, C, …) normalised over its trailing
/// axes (biased variance, `eps` inside the root), then, with `affine`, a per-channel scale
/// `weight` (ones) and shift `bias` (zeros). PyTorch: `nn.InstanceNorm2d(C, eps=1e-5,
/// affine=False)` (and `1d`, `3d`: any number of trailing axes here), without running
/// statistics (`track_running_stats=False`, PyTorch's default: every pass normalises by its
/// own statistics). The input needs its batch axis (PyTorch also takes an unbatched (C, …):
/// unsqueeze it).
///
/// The same computation as [`GroupNorm`](super::GroupNorm) with one group per channel (the
/// catalogue's `layerNorm` on the (N·C, rest) rows), so its values and gradients are
/// GroupNorm's bit for bit (`tests/nn/layers.rs`), and the harness's `nn_layers::group_norm`
/// checks that computation against `reduceMean`/`sub`/`div`.
#[derive(Debug, Clone)]
pub struct InstanceNorm {
    /// Scale (C), named `weight`, with `affine`; `None` without (PyTorch's default).
    pub weight: Option<Param>,
    /// Shift (C), named `bias`, with `affine`.
    pub bias: Option<Param>,
    /// The channel count C (≥ 1; checked at every pass, as the constructor checks it).
    pub channels: usize,
    /// ε added to the variance.
    pub eps: f64,
}

impl InstanceNorm {
    /// Instance norm of `channels` with PyTorch's defaults: ε = 1e-5, no affine.
    pub fn new<O: Train>(vars: &Vars<'_, O>, channels: usize) -> Result<Self> {
        Self::with(vars, channels, 1e-5, false)
    }

    /// Instance norm with ε = `eps` (finite, > 0) and, with `affine`, the per-channel
    /// `weight` and `bias`; `channels` ≥ 1.
    pub fn with<O: Train>(
        vars: &Vars<'_, O>,
        channels: usize,
        eps: f64,
        affine: bool,
    ) -> Result<Self> {
        check("InstanceNorm::new", channels, eps)?;
        let (weight, bias) = if affine {
            (
                Some(vars.param("weight", &[channels], Init::Ones)?),
                Some(vars.param("bias", &[channels], Init::Zeros)?),
            )
        } else {
            (None, None)
        };
        Ok(InstanceNorm {
            weight,
            bias,
            channels,
            eps,
        })
    }
}

/// An error naming `what` unless `channels` ≥ 1 and ε is finite and > 0: the constructor's
/// check, and the forward's on the public fields.
fn check(what: &'static str, channels: usize, eps: f64) -> Result<()> {
    if channels == 0 || !(eps > 0.0 && eps.is_finite()) {
        return Err(usage(
            what,
            format!("need channels ≥ 1 and a finite ε > 0, got {channels} channel(s), ε {eps}"),
        ));
    }
    Ok(())
}

impl Parameters for InstanceNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.weight.iter().chain(&self.bias).for_each(f);
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={}, affine={}, track_running_stats=False",
            self.channels,
            py_float(self.eps),
            py_bool(self.weight.is_some())
        )
    }
}

impl<O: Train> Module<O> for InstanceNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let at = match &self.weight {
            Some(w) => At::new(g.rt, self, w),
            None => At::unnamed(g.rt, self),
        };
        let (c, what) = (self.channels, "InstanceNorm::forward");
        // The fields are public: checked as the constructor checks them.
        check(what, c, self.eps).map_err(|e| at.op_error(e))?;
        let (n, rest) = channels_first(what, x, c, &at)?;
        let y = || -> Result<Var<'g, O>> {
            let xhat = normalise_groups(what, x, (n, c, rest), c, self.eps)?;
            match (&self.weight, &self.bias) {
                (Some(w), Some(b)) => {
                    let gamma = g.param(w)?.reshape(&[c, 1])?;
                    let beta = g.param(b)?.reshape(&[c, 1])?;
                    ((&xhat * &gamma)? + beta)?.reshape(x.dims())
                }
                _ => xhat.reshape(x.dims()),
            }
        };
        y().map_err(|e| at.op_error(e))
    }
}
