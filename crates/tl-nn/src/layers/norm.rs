//! [`LayerNorm`], [`BatchNorm`], [`RmsNorm`] and [`GroupNorm`]. PyTorch: `nn.LayerNorm`,
//! `nn.BatchNorm1d/2d/3d`, `nn.RMSNorm`, `nn.GroupNorm`.

use tl_session::{Param, Train};
use tl_spec::{Scalar, Shape, Typed};

use super::{At, inv_std};
use crate::display::{py_float, py_tuple};
use crate::error::{dims_product, usage};
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// Normalisation over the last axis, or the last few ([`LayerNorm::over`]), (biased variance,
/// two-pass) with a learned scale `weight` (ones) and shift `bias` (zeros), one entry per
/// normalised element. PyTorch: `nn.LayerNorm(dim, eps=1e-5)`, `nn.LayerNorm([C, H, W])`.
///
/// The catalogue's `layerNorm` op on x's trailing axes as one row (x and the affine reshaped
/// there and back where there are several).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale (the normalised shape), named `weight`.
    pub weight: Param,
    /// Shift (the normalised shape), named `bias`.
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
        Self::over(vars, &[dim], eps)
    }

    /// A layer norm over x's trailing axes `normalized_shape` (each ≥ 1), ε = `eps` (> 0):
    /// each of x's `(lead…, normalized_shape…)` rows normalised as one, `weight` and `bias`
    /// shaped `normalized_shape`. PyTorch: `nn.LayerNorm(normalized_shape, eps)`.
    pub fn over<O: Train>(
        vars: &Vars<'_, O>,
        normalized_shape: &[usize],
        eps: f64,
    ) -> Result<Self> {
        check_layer_norm("LayerNorm::new", normalized_shape, eps)?;
        Ok(LayerNorm {
            weight: vars.param("weight", normalized_shape, Init::Ones)?,
            bias: vars.param("bias", normalized_shape, Init::Zeros)?,
            eps,
        })
    }
}

/// An error naming `what` unless the normalised shape has at least one axis, each of size ≥ 1,
/// and ε is finite and > 0: [`LayerNorm`]'s constructor, and its forward on the public fields.
fn check_layer_norm(what: &'static str, normalized_shape: &[usize], eps: f64) -> Result<()> {
    if normalized_shape.is_empty()
        || normalized_shape.contains(&0)
        || !(eps > 0.0 && eps.is_finite())
    {
        return Err(usage(
            what,
            format!(
                "need a normalised shape of sizes ≥ 1 and a finite ε > 0, got normalized_shape {normalized_shape:?}, ε {eps}"
            ),
        ));
    }
    Ok(())
}

impl Parameters for LayerNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={}, elementwise_affine=True",
            py_tuple(self.weight.shape().dims()),
            py_float(self.eps)
        )
    }
}

impl<O: Train> Module<O> for LayerNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let at = At::new(g.rt, self, &self.weight);
        let shape = self.weight.shape().dims();
        let eps = self.eps;
        // The fields are public: checked as the constructor checks them.
        check_layer_norm("LayerNorm::forward", shape, eps).map_err(|e| at.op_error(e))?;
        let norm = |x: &Var<'g, O>, w: &Var<'g, O>, b: &Var<'g, O>| {
            x.op("LayerNorm::forward", &[w, b], |s| {
                s.layer_norm(x.tensor_ref(), w.tensor_ref(), b.tensor_ref(), eps)
            })
        };
        if let [dim] = *shape {
            last_axis(x, dim, &at)?;
            return norm(x, &w, &b).map_err(|e| at.op_error(e));
        }
        // Several trailing axes: one row of their product, and back.
        let dims = x.dims();
        let lead = dims.len().checked_sub(shape.len());
        let Some(lead) = lead.filter(|&l| dims[l..] == *shape) else {
            return Err(at.input(format!(
                "input {} does not end in the normalised shape {shape:?}",
                x.shape()
            )));
        };
        let row: usize = shape.iter().product();
        let rows: Vec<usize> = dims[..lead].iter().copied().chain([row]).collect();
        let y = || -> Result<Var<'g, O>> {
            let (w, b) = (w.reshape(&[row])?, b.reshape(&[row])?);
            norm(&x.reshape(&rows)?, &w, &b)?.reshape(dims)
        };
        y().map_err(|e| at.op_error(e))
    }
}

/// Batch normalisation over channels (axis 1 of (N, C, …); an unbatched (C, …) is one
/// sample). Training passes normalise with the batch's statistics (biased variance) and
/// update the running statistics with PyTorch's rule `running ← (1 − momentum)·running +
/// momentum·batch` (the running variance takes the unbiased batch variance); eval passes
/// normalise with the running statistics. PyTorch: `nn.BatchNorm2d(C, eps=1e-5,
/// momentum=0.1)` (and 1d/3d: any number of trailing axes, so it prints as `BatchNorm(C, …)`
/// with PyTorch's settings after the name).
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
        check_batch_norm("BatchNorm::new", channels, eps, momentum)?;
        Ok(BatchNorm {
            weight: vars.param("weight", &[channels], Init::Ones)?,
            bias: vars.param("bias", &[channels], Init::Zeros)?,
            running_mean: vars.buffer("running_mean", &[channels], Init::Zeros)?,
            running_var: vars.buffer("running_var", &[channels], Init::Ones)?,
            eps,
            momentum,
        })
    }

    /// C (0 for a weight of another rank, a public field: refused at use).
    fn channels(&self) -> usize {
        match self.weight.shape().dims() {
            &[c] => c,
            _ => 0,
        }
    }

    /// x as (N, C, R, 1) (the op's batched layout), with C, N and R, after the constructor's
    /// checks on the public fields (the weight's shape, ε, the momentum).
    fn as_4d<'g, O: Train>(&self, x: &Var<'g, O>) -> Result<(Var<'g, O>, [usize; 3])> {
        const WHAT: &str = "BatchNorm::forward";
        let at = At::new(x.scope().rt, self, &self.weight);
        let c = at.param_dims(WHAT, "weight", &self.weight, 1..=1, "(C)")?[0];
        check_batch_norm(WHAT, c, self.eps, self.momentum).map_err(|e| at.op_error(e))?;
        let (n, rest) = channels_first(WHAT, x, c, &at)?;
        Ok((x.reshape(&[n, c, rest, 1])?, [c, n, rest]))
    }

    /// Update the running statistics from the batch moments of x4 (N, C, R, 1): the op
    /// `batchMoments` ((2, C): the means, then the biased variances) and the update of both
    /// buffers from it (`Train::update_running`, PyTorch's rule in f64; one kernel on a CUDA
    /// backend) run where x and the statistics live, so on a CUDA backend nothing is read back
    /// or uploaded.
    fn update_running<O: Train>(
        &self,
        x4: &Var<'_, O>,
        c: usize,
        rt: &crate::Runtime<O>,
    ) -> Result<()> {
        let at = || At::new(rt, self, &self.weight);
        let count = x4.shape().numel() / c;
        let moments = (x4.detach()?.batch_moments()).map_err(|e| at().op_error(e))?;
        let buffers = [&self.running_mean, &self.running_var];
        let (layer, moments) = (at().label(), moments.tensor_ref());
        rt.update_running(layer, buffers, moments, self.momentum, count)
    }
}

/// An error naming `what` unless `channels` ≥ 1, ε is finite and > 0 and the momentum is in
/// [0, 1]: [`BatchNorm`]'s constructor, and its forward on the public fields.
fn check_batch_norm(what: &'static str, channels: usize, eps: f64, momentum: f64) -> Result<()> {
    if channels == 0 || !(eps > 0.0 && eps.is_finite()) || !(0.0..=1.0).contains(&momentum) {
        return Err(usage(
            what,
            format!(
                "need channels ≥ 1, a finite ε > 0 and momentum in [0, 1], got {channels}, ε {eps}, momentum {momentum}"
            ),
        ));
    }
    Ok(())
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
            "{}, eps={}, momentum={}, affine=True, track_running_stats=True",
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
        let (x4, [c, n, r]) = self.as_4d(x)?;
        let y = if g.training() {
            let eps = self.eps;
            let y = x4
                .op("BatchNorm::forward", &[&w, &b], |s| {
                    s.batchnorm_channel_first(x4.tensor_ref(), w.tensor_ref(), b.tensor_ref(), eps)
                })
                .map_err(|e| At::new(g.rt, self, &self.weight).op_error(e))?;
            self.update_running(&x4, c, g.rt)?;
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

/// An error naming the layer (`at`) unless x's last axis has `dim` features.
fn last_axis<O: Train>(x: &Var<'_, O>, dim: usize, at: &At<'_, O>) -> Result<()> {
    match x.dims().last() {
        Some(&d) if d == dim => Ok(()),
        last => Err(at.input(format!(
            "input {} has {} features in its last axis, expected {dim}",
            x.shape(),
            last.map_or("no".into(), usize::to_string)
        ))),
    }
}

/// x's batch size N and the product R of its trailing axes, for a layer over the `c` channels
/// of an (N, c, …) input; any other shape is an error naming the layer (`at`) and saying what
/// it expected and what axis 1 held, and so is an empty input whose R overflows (naming
/// `what`).
pub(super) fn channels_first<O: Train>(
    what: &'static str,
    x: &Var<'_, O>,
    c: usize,
    at: &At<'_, O>,
) -> Result<(usize, usize)> {
    match x.dims() {
        [n, ch, rest @ ..] if *ch == c => {
            let rest = dims_product(what, x.shape(), rest).map_err(|e| at.op_error(e))?;
            Ok((*n, rest))
        }
        dims => {
            let has = match dims {
                [_, ch, ..] => format!(" (it has {ch} at axis 1)"),
                _ => String::new(),
            };
            Err(at.input(format!(
                "input {} must be (N, {c}, …): batch, then {c} channels{has}",
                x.shape()
            )))
        }
    }
}

/// Root-mean-square normalisation over the last axis with a learned scale `weight` (ones), no
/// shift: `y = x / √(mean(x²) + ε) · weight`, the mean over the last axis. PyTorch:
/// `nn.RMSNorm(dim, eps=None)`: with no ε given, the machine epsilon of the session's element
/// type (`f32::EPSILON` for f32, as PyTorch's `torch.finfo(x.dtype).eps`).
///
/// The catalogue's `rmsNorm` op (one fused kernel each way on the CPU and CUDA tapes, the
/// per-row 1/√(mean(x²) + ε) kept for the backward), checked by the harness as every op is;
/// the layer as a whole is checked against an independent formulation from `reduceSum`,
/// `scale` and `div` (tl-conformance's `nn_layers::`).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// Scale (dim), named `weight`.
    pub weight: Param,
    /// ε added to the mean square; `None`: the element type's machine epsilon.
    pub eps: Option<f64>,
}

impl RmsNorm {
    /// An RMS norm over `dim` features, ε the element type's machine epsilon (PyTorch's
    /// default).
    pub fn new<O: Train>(vars: &Vars<'_, O>, dim: usize) -> Result<Self> {
        Self::make(vars, dim, None)
    }

    /// An RMS norm with ε = `eps` (finite, > 0; LLaMA uses 1e-5 or 1e-6).
    pub fn with_eps<O: Train>(vars: &Vars<'_, O>, dim: usize, eps: f64) -> Result<Self> {
        Self::make(vars, dim, Some(eps))
    }

    fn make<O: Train>(vars: &Vars<'_, O>, dim: usize, eps: Option<f64>) -> Result<Self> {
        check_rms_norm("RmsNorm::new", dim, eps)?;
        Ok(RmsNorm {
            weight: vars.param("weight", &[dim], Init::Ones)?,
            eps,
        })
    }
}

/// The machine epsilon of the element type `T` (`f32::EPSILON` or `f64::EPSILON`; another
/// type: the gap above 1 in it, found by halving).
fn machine_eps<T: Scalar>() -> f64 {
    match T::typed(&[]) {
        Typed::F32(_) => f32::EPSILON.into(),
        Typed::F64(_) => f64::EPSILON,
        Typed::Other => {
            let (one, mut eps) = (T::one(), 1.0f64);
            while one + T::lit(eps / 2.0) != one {
                eps /= 2.0;
            }
            eps
        }
    }
}

/// An error naming `what` unless `dim` ≥ 1 and ε, where given, is finite and > 0:
/// [`RmsNorm`]'s constructor, and its forward on the public fields.
fn check_rms_norm(what: &'static str, dim: usize, eps: Option<f64>) -> Result<()> {
    if dim == 0 || eps.is_some_and(|e| !(e > 0.0 && e.is_finite())) {
        return Err(usage(
            what,
            format!(
                "need dim ≥ 1 and a finite ε > 0, got dim {dim}, ε {}",
                eps.map_or("None".into(), |e| e.to_string())
            ),
        ));
    }
    Ok(())
}

impl Parameters for RmsNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
    }
    fn module_name(&self) -> String {
        "RMSNorm".into()
    }
    fn extra_repr(&self) -> String {
        format!(
            "({},), eps={}, elementwise_affine=True",
            self.weight.shape().dims().first().copied().unwrap_or(0),
            self.eps.map_or("None".into(), py_float)
        )
    }
}

impl<O: Train> Module<O> for RmsNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let w = g.param(&self.weight)?;
        let at = At::new(g.rt, self, &self.weight);
        // The fields are public: checked as the constructor checks them.
        const WHAT: &str = "RmsNorm::forward";
        let dim = at.param_dims(WHAT, "weight", &self.weight, 1..=1, "(dim)")?[0];
        check_rms_norm(WHAT, dim, self.eps).map_err(|e| at.op_error(e))?;
        last_axis(x, dim, &at)?;
        let eps = self.eps.unwrap_or_else(machine_eps::<O::T>);
        x.op("RmsNorm::forward", &[&w], |s| {
            s.rms_norm(x.tensor_ref(), w.tensor_ref(), eps)
        })
        .map_err(|e| at.op_error(e))
    }
}

/// Group normalisation: the C channels of (N, C, …) in `groups` groups of C/groups channels,
/// each (sample, group) normalised over its channels and trailing axes (biased variance), then
/// a per-channel scale `weight` (ones) and shift `bias` (zeros). PyTorch: `nn.GroupNorm(groups,
/// C, eps=1e-5)`. `groups` = 1 normalises each sample as a whole (layer norm over (C, …) with a
/// per-channel affine); `groups` = C is instance norm with an affine.
///
/// The normalisation is the catalogue's `layerNorm` on the (N·groups, C/groups·…) rows (its
/// scale ones and shift zeros, constants), so the group statistics are layer norm's two-pass,
/// centred ones on every backend; the affine is a broadcast `mul` and `add`.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    /// Scale (C), named `weight`.
    pub weight: Param,
    /// Shift (C), named `bias`.
    pub bias: Param,
    /// Groups the channels are split into (divides C; checked at every pass, as the
    /// constructor checks it).
    pub groups: usize,
    /// ε added to the variance.
    pub eps: f64,
}

impl GroupNorm {
    /// Group norm of `channels` in `groups` groups with PyTorch's ε = 1e-5.
    pub fn new<O: Train>(vars: &Vars<'_, O>, groups: usize, channels: usize) -> Result<Self> {
        Self::with_eps(vars, groups, channels, 1e-5)
    }

    /// Group norm with ε = `eps` (finite, > 0); `groups` ≥ 1 must divide `channels` (≥ 1).
    pub fn with_eps<O: Train>(
        vars: &Vars<'_, O>,
        groups: usize,
        channels: usize,
        eps: f64,
    ) -> Result<Self> {
        check_groups("GroupNorm::new", groups, channels, eps)?;
        Ok(GroupNorm {
            weight: vars.param("weight", &[channels], Init::Ones)?,
            bias: vars.param("bias", &[channels], Init::Zeros)?,
            groups,
            eps,
        })
    }

    /// C (0 for a weight of another rank, a public field: refused at use).
    fn channels(&self) -> usize {
        match self.weight.shape().dims() {
            &[c] => c,
            _ => 0,
        }
    }
}

/// An error naming `what` unless `channels` ≥ 1, `groups` ≥ 1 divides them and ε is finite
/// and > 0: [`GroupNorm`]'s constructor, and its forward on the public fields.
fn check_groups(what: &'static str, groups: usize, channels: usize, eps: f64) -> Result<()> {
    if channels == 0
        || groups == 0
        || !channels.is_multiple_of(groups)
        || !(eps > 0.0 && eps.is_finite())
    {
        return Err(usage(
            what,
            format!(
                "need channels ≥ 1, groups ≥ 1 dividing them and a finite ε > 0, got {groups} group(s), {channels} channel(s), ε {eps}"
            ),
        ));
    }
    Ok(())
}

impl Parameters for GroupNorm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
    }
    fn extra_repr(&self) -> String {
        format!(
            "{}, {}, eps={}, affine=True",
            self.groups,
            self.channels(),
            py_float(self.eps)
        )
    }
}

impl<O: Train> Module<O> for GroupNorm {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let at = At::new(g.rt, self, &self.weight);
        let what = "GroupNorm::forward";
        // The fields are public: checked as the constructor checks them.
        let c = at.param_dims(what, "weight", &self.weight, 1..=1, "(C)")?[0];
        check_groups(what, self.groups, c, self.eps).map_err(|e| at.op_error(e))?;
        let (n, rest) = channels_first(what, x, c, &at)?;
        let y = || -> Result<Var<'g, O>> {
            let xhat = normalise_groups(what, x, (n, c, rest), self.groups, self.eps)?;
            let (gamma, beta) = (w.reshape(&[c, 1])?, b.reshape(&[c, 1])?);
            ((&xhat * &gamma)? + beta)?.reshape(x.dims())
        };
        y().map_err(|e| at.op_error(e))
    }
}

/// x of (N, C, …) with each sample's C channels in `groups` groups, each (sample, group)
/// normalised over its channels and trailing axes (biased variance, ε inside the root),
/// shaped (N, C, rest): the catalogue's `layerNorm` on the (N·groups, C/groups·rest) rows,
/// its scale and shift one-element constants (1, 0) broadcast to a row. [`GroupNorm`] and
/// [`InstanceNorm`](super::InstanceNorm) (one group per channel).
pub(super) fn normalise_groups<'g, O: Train>(
    what: &'static str,
    x: &Var<'g, O>,
    (n, c, rest): (usize, usize, usize),
    groups: usize,
    eps: f64,
) -> Result<Var<'g, O>> {
    let g = x.scope();
    // Checked: an empty x's other sizes may be of any size.
    let len = dims_product(what, x.shape(), &[c / groups, rest])?;
    let rows = x.reshape(&[dims_product(what, x.shape(), &[n, groups])?, len])?;
    let row = Shape::new(&[len]);
    let ones = g.full(&[1], 1.0)?.broadcast_to(&row)?;
    let zeros = g.full(&[1], 0.0)?.broadcast_to(&row)?;
    let xhat = rows.op(what, &[&ones, &zeros], |s| {
        s.layer_norm(
            rows.tensor_ref(),
            ones.tensor_ref(),
            zeros.tensor_ref(),
            eps,
        )
    })?;
    xhat.reshape(&[n, c, rest])
}
