//! [`Conv`] and [`ConvTranspose`]: N-D convolutions, channels first, optional leading batch
//! axis. PyTorch: `nn.Conv1d/2d/3d`, `nn.ConvTranspose1d/2d/3d` (groups 1, dilation 1).

use tl_session::{Param, Train};
use tl_spec::Shape;

use super::At;
use crate::display::py_tuple;
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// Stride and zero padding of a convolution, the same on every spatial axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvConfig {
    /// Stride (≥ 1).
    pub stride: usize,
    /// Zero padding on both sides.
    pub padding: usize,
}

impl ConvConfig {
    /// Stride 1 and zero padding `padding` (`padded(k / 2)` keeps the size for an odd kernel
    /// `k`). PyTorch: `padding=p`.
    pub const fn padded(padding: usize) -> Self {
        ConvConfig { stride: 1, padding }
    }

    /// Stride `stride` and zero padding `padding`.
    pub const fn new(stride: usize, padding: usize) -> Self {
        ConvConfig { stride, padding }
    }
}

impl Default for ConvConfig {
    fn default() -> Self {
        ConvConfig {
            stride: 1,
            padding: 0,
        }
    }
}

fn check(
    what: &'static str,
    inputs: usize,
    outputs: usize,
    kernel: &[usize],
    cfg: ConvConfig,
) -> Result<()> {
    if inputs == 0
        || outputs == 0
        || kernel.is_empty()
        || kernel.len() > 8
        || kernel.contains(&0)
        || cfg.stride == 0
    {
        return Err(usage(
            what,
            format!(
                "need ≥ 1 input and output channel, 1 to 8 spatial axes with kernel sizes ≥ 1 and stride ≥ 1, got {inputs} → {outputs}, kernel {kernel:?}, stride {}",
                cfg.stride
            ),
        ));
    }
    Ok(())
}

/// PyTorch's `extra_repr()` of a convolution: `1, 16, kernel_size=(3, 3), stride=(1, 1),
/// padding=(1, 1)` (padding left out when it is 0, as PyTorch does).
fn conv_repr(inputs: usize, outputs: usize, weight: &Param, cfg: ConvConfig) -> String {
    let kernel = weight.shape().dims().get(2..).unwrap_or_default();
    let k = kernel.len();
    let mut s = format!(
        "{inputs}, {outputs}, kernel_size={}, stride={}",
        py_tuple(kernel),
        py_tuple(&vec![cfg.stride; k])
    );
    if cfg.padding != 0 {
        s.push_str(&format!(", padding={}", py_tuple(&vec![cfg.padding; k])));
    }
    s
}

/// The axes' names of a `k`-D input after batch and channels: `L`; `H, W`; `D, H, W`.
fn axes(k: usize) -> String {
    match k {
        1 => "L".into(),
        2 => "H, W".into(),
        3 => "D, H, W".into(),
        _ => (1..=k)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The input check of a `k`-D convolution with `channels` input channels: x must be
/// (N, channels, …k) or (channels, …k). The error says how to shape a flat input (the usual
/// mistake: images as rows of pixels) or a batch without its channel axis.
fn check_input<O: Train>(at: &At<'_, O>, x: &Var<'_, O>, k: usize, channels: usize) -> Result<()> {
    let dims = x.dims();
    let layouts = format!(
        "a {k}-D convolution takes (N, {channels}, {a}) or ({channels}, {a})",
        a = axes(k)
    );
    // `m` values per sample as `channels` × s^k, when s is a whole number.
    let side = |m: usize| -> Option<usize> {
        if m == 0 || channels == 0 || !m.is_multiple_of(channels) {
            return None;
        }
        let per = m / channels;
        let s = (per as f64).powf(1.0 / k as f64).round() as usize;
        (s.checked_pow(k as u32) == Some(per)).then_some(s)
    };
    let reshape = |n: usize, s: usize| {
        let mut to = vec![n, channels];
        to.extend(std::iter::repeat_n(s, k));
        format!("x.reshape(&{to:?})")
    };
    if dims.len() < k + 1 {
        let (n, m) = match dims {
            [n, m] => (*n, *m),
            [m] => (1, *m),
            _ => (1, 0),
        };
        let fix = match side(m) {
            Some(s) => format!(
                "; reshape it: {}{}",
                reshape(n, s),
                if k == 2 && channels == 1 && s == 8 {
                    " (the digits: Split::shaped(&[1, 8, 8]))"
                } else {
                    ""
                }
            ),
            None => format!(
                "; reshape each sample of {m} values to ({channels}, {})",
                axes(k)
            ),
        };
        return Err(at.input(format!("input {} is flat: {layouts}{fix}", x.shape())));
    }
    if dims.len() > k + 2 {
        return Err(at.input(format!("input {} has too many axes: {layouts}", x.shape())));
    }
    let axis = dims.len() - k - 1;
    if dims[axis] != channels {
        let mut detail = format!(
            "input {} has {} channels at axis {axis}, expected {channels}: {layouts}",
            x.shape(),
            dims[axis]
        );
        // A batch of one-channel samples given without the channel axis: (N, H, W).
        if axis == 0 && channels == 1 {
            let mut to = vec![dims[0], 1];
            to.extend_from_slice(&dims[1..]);
            detail.push_str(&format!(
                "; for a batch of {} one-channel samples add the channel axis: x.reshape(&{to:?})",
                dims[0]
            ));
        }
        return Err(at.input(detail));
    }
    Ok(())
}

/// The weight `(lead[0], lead[1], k…)` and bias `(outputs)` of a convolution, initialised as
/// PyTorch does with the fan-in `lead[1]·∏k` (PyTorch takes `weight.size(1)`: the inputs of a
/// convolution, the outputs of a transposed one). A weight too large to hold is an error naming
/// `what` and the shape, before any size is multiplied.
fn weight_and_bias<O: Train>(
    what: &'static str,
    vars: &Vars<'_, O>,
    lead: [usize; 2],
    outputs: usize,
    kernel: &[usize],
) -> Result<(Param, Param)> {
    let dims: Vec<usize> = lead.iter().chain(kernel).copied().collect();
    tl_spec::alloc::check_shape::<O::T>(what, &Shape::new(&dims))?;
    // The fan-in divides the weight's element count, checked above.
    let fan_in = lead[1] * kernel.iter().product::<usize>();
    Ok((
        vars.param("weight", &dims, Init::default_weight(fan_in))?,
        vars.param("bias", &[outputs], Init::default_bias(fan_in))?,
    ))
}

/// A convolution (cross-correlation): weight (out, in, k…), bias (out); x (in, …) or
/// (N, in, …) → (out, …) / (N, out, …). PyTorch: `nn.ConvNd(in, out, kernel, stride,
/// padding)`, initialised as PyTorch does (`kaiming_uniform(a=√5)`, bias ±1/√(in·∏k)).
#[derive(Debug, Clone)]
pub struct Conv {
    /// Weight (out, in, k…), named `weight`.
    pub weight: Param,
    /// Bias (out), named `bias`.
    pub bias: Param,
    /// Stride and padding.
    pub config: ConvConfig,
}

impl Conv {
    /// An N-D convolution with kernel sizes `kernel` (one per spatial axis).
    pub fn new<O: Train>(
        vars: &Vars<'_, O>,
        inputs: usize,
        outputs: usize,
        kernel: &[usize],
        config: ConvConfig,
    ) -> Result<Self> {
        check("Conv::new", inputs, outputs, kernel, config)?;
        let (weight, bias) =
            weight_and_bias("Conv::new", vars, [outputs, inputs], outputs, kernel)?;
        Ok(Conv {
            weight,
            bias,
            config,
        })
    }

    /// A 1-D convolution. PyTorch: `nn.Conv1d`.
    pub fn conv1d<O: Train>(
        vars: &Vars<'_, O>,
        inputs: usize,
        outputs: usize,
        kernel: usize,
        config: ConvConfig,
    ) -> Result<Self> {
        Self::new(vars, inputs, outputs, &[kernel], config)
    }

    /// A 2-D convolution with a square kernel. PyTorch: `nn.Conv2d`.
    pub fn conv2d<O: Train>(
        vars: &Vars<'_, O>,
        inputs: usize,
        outputs: usize,
        kernel: usize,
        config: ConvConfig,
    ) -> Result<Self> {
        Self::new(vars, inputs, outputs, &[kernel, kernel], config)
    }
}

/// The spatial axes of a convolution's weight (a public field: 0 for one of rank < 2, which
/// [`checked_weight`] refuses at use).
fn spatial(weight: &Param) -> usize {
    weight.shape().rank().saturating_sub(2)
}

/// `Conv2d`, `ConvTranspose1d`: the family and the weight's spatial axes (the family alone for
/// a weight without any, a public field refused at use).
fn module_name(family: &str, weight: &Param) -> String {
    match spatial(weight) {
        0 => family.into(),
        k => format!("{family}{k}d"),
    }
}

/// The weight's dims, (out, in, k…), or (in, out, k…) when `transposed`, checked at use as
/// the constructor checks its sizes and the config (both public fields): an error naming the
/// layer and `what` for a weight without 1 to 8 kernel axes, a zero size or a stride of 0.
fn checked_weight<'p, O: Train>(
    at: &At<'_, O>,
    what: &'static str,
    weight: &'p Param,
    config: ConvConfig,
    transposed: bool,
) -> Result<&'p [usize]> {
    let layout = match transposed {
        true => "(in, out, k…) with 1 to 8 kernel axes",
        false => "(out, in, k…) with 1 to 8 kernel axes",
    };
    let d = at.param_dims(what, "weight", weight, 3..=10, layout)?;
    let (inputs, outputs) = if transposed {
        (d[0], d[1])
    } else {
        (d[1], d[0])
    };
    check(what, inputs, outputs, &d[2..], config).map_err(|e| at.op_error(e))?;
    Ok(d)
}

impl Parameters for Conv {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
    }
    fn module_name(&self) -> String {
        module_name("Conv", &self.weight)
    }
    fn extra_repr(&self) -> String {
        let d = |i: usize| self.weight.shape().dims().get(i).copied().unwrap_or(0);
        conv_repr(d(1), d(0), &self.weight, self.config)
    }
}

impl<O: Train> Module<O> for Conv {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let at = At::new(g.rt, self, &self.weight);
        let d = checked_weight(&at, "Conv::forward", &self.weight, self.config, false)?;
        let k = d.len() - 2;
        let (stride, padding) = (vec![self.config.stride; k], vec![self.config.padding; k]);
        check_input(&at, x, k, d[1])?;
        w.op("Conv::forward", &[&b, x], |s| {
            s.conv(
                w.tensor_ref(),
                b.tensor_ref(),
                x.tensor_ref(),
                stride,
                padding,
            )
        })
        .map_err(|e| at.op_error(e))
    }
}

/// A transposed convolution: weight (in, out, k…) (PyTorch's layout), bias (out); no output
/// padding. PyTorch: `nn.ConvTransposeNd(in, out, kernel, stride, padding)`, initialised as
/// PyTorch does (its fan-in is `out·∏k`).
#[derive(Debug, Clone)]
pub struct ConvTranspose {
    /// Weight (in, out, k…), named `weight`.
    pub weight: Param,
    /// Bias (out), named `bias`.
    pub bias: Param,
    /// Stride and padding.
    pub config: ConvConfig,
}

impl ConvTranspose {
    /// An N-D transposed convolution with kernel sizes `kernel`.
    pub fn new<O: Train>(
        vars: &Vars<'_, O>,
        inputs: usize,
        outputs: usize,
        kernel: &[usize],
        config: ConvConfig,
    ) -> Result<Self> {
        check("ConvTranspose::new", inputs, outputs, kernel, config)?;
        let (weight, bias) = weight_and_bias(
            "ConvTranspose::new",
            vars,
            [inputs, outputs],
            outputs,
            kernel,
        )?;
        Ok(ConvTranspose {
            weight,
            bias,
            config,
        })
    }
}

impl Parameters for ConvTranspose {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        f(&self.bias);
    }
    fn module_name(&self) -> String {
        module_name("ConvTranspose", &self.weight)
    }
    fn extra_repr(&self) -> String {
        let d = |i: usize| self.weight.shape().dims().get(i).copied().unwrap_or(0);
        conv_repr(d(0), d(1), &self.weight, self.config)
    }
}

impl<O: Train> Module<O> for ConvTranspose {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let (w, b) = (g.param(&self.weight)?, g.param(&self.bias)?);
        let at = At::new(g.rt, self, &self.weight);
        const WHAT: &str = "ConvTranspose::forward";
        let d = checked_weight(&at, WHAT, &self.weight, self.config, true)?;
        let k = d.len() - 2;
        let (stride, padding) = (vec![self.config.stride; k], vec![self.config.padding; k]);
        check_input(&at, x, k, d[0])?;
        w.op("ConvTranspose::forward", &[&b, x], |s| {
            s.conv_transpose(
                w.tensor_ref(),
                b.tensor_ref(),
                x.tensor_ref(),
                stride,
                padding,
            )
        })
        .map_err(|e| at.op_error(e))
    }
}
