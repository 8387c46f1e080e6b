//! Whole models built from the layers: the ones the `tl` command trains and the benchmarks time
//! (`crates/tl-session/benches`, `benches/peers`), written as a user writes them. Each is generic
//! over the session (`O: Train`), so it runs eager (CPU, CUDA sim, CUDA) and linked, and names
//! its parameters as the PyTorch module would (`0.weight`, `blocks.1.attn.wq`, …), from the
//! [`Vars`] it is given.
//!
//! - [`mlp`]: `Linear → act → … → Linear`. PyTorch: `nn.Sequential(nn.Linear, nn.ReLU, …)`.
//! - [`cnn`]: `(Conv2d 3×3 pad 1 → ReLU → MaxPool2d 2) × L → Flatten → Linear`.
//! - [`Fno1d`]: the 1-D Fourier neural operator (Li et al. 2021).
//! - [`TransformerBlock`]: a pre-norm block; [`TransformerLm`]: a GPT-style char-level language
//!   model built from it.
//! - [`ResNet`]: basic residual blocks ([`BasicBlock`]: conv-BN-ReLU-conv-BN + skip) at one width.
//! - [`LlamaBlock`]: a LLaMA-style decoder block (RMSNorm, rotary grouped-query attention,
//!   SwiGLU).

mod llama;
mod resnet;

pub use llama::{LlamaBlock, LlamaConfig};
pub use resnet::{BasicBlock, ResNet, ResNetConfig};
use tl_session::{Param, Train};

use crate::error::usage;
use crate::{
    Activation, Conv, ConvConfig, Embedding, Flatten, Init, LayerNorm, Linear, MaxPool, Module,
    MultiHeadAttention, Parameters, Result, Scope, Sequential, SpectralConv1d, Var, Vars,
};

/// A multi-layer perceptron through the layer sizes `sizes` (`[in, hidden…, out]`), `act`
/// between the linear layers (none after the last). The linear layers sit at the positions
/// `nn.Sequential` gives them (0, 2, 4, …), so the names are `0.weight`, `0.bias`, `2.weight`, ….
/// PyTorch: `nn.Sequential(nn.Linear(in, h), nn.ReLU(), …, nn.Linear(h, out))`.
pub fn mlp<O: Train>(
    vars: &Vars<'_, O>,
    sizes: &[usize],
    act: Activation,
) -> Result<Sequential<O>> {
    if sizes.len() < 2 {
        return Err(usage(
            "models::mlp",
            format!("need at least an input and an output size, got {sizes:?}"),
        ));
    }
    let mut net = Sequential::new();
    let last = sizes.len() - 2;
    for (k, pair) in sizes.windows(2).enumerate() {
        net = net.add(Linear::new(&vars.pp(2 * k), pair[0], pair[1])?);
        if k < last {
            net = net.add(act);
        }
    }
    Ok(net)
}

/// A model's size checked before any of its parameters is made (as the RNN stack checks its
/// layers): `parts` lists each kind of parameter as (how many, the dims of one); a total past
/// `usize` is an error naming `what` and the `config`, and so is one whose values exceed the
/// allocation cap ([`tl_spec::alloc::check_len`]): a huge count of small blocks is an error,
/// not a long loop that ends in an abort.
pub(crate) fn check_params<O: Train>(
    what: &'static str,
    config: &dyn std::fmt::Debug,
    parts: &[(usize, &[usize])],
) -> Result<()> {
    let total = parts.iter().try_fold(0usize, |total, &(count, dims)| {
        let each = tl_spec::Shape::new(dims).checked_numel()?;
        total.checked_add(each.checked_mul(count)?)
    });
    let Some(total) = total else {
        return Err(usage(
            what,
            format!("{config:?} has more parameters than usize holds"),
        ));
    };
    let detail = format!("the {total} parameters of {config:?}");
    Ok(tl_spec::alloc::check_len::<O::T>(what, &detail, total)?)
}

/// The shape of a [`cnn`]: input images, the output channels of each conv stage, the classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CnnConfig {
    /// Channels of the input images.
    pub in_channels: usize,
    /// Image height (each stage halves it, rounding down).
    pub height: usize,
    /// Image width (each stage halves it, rounding down).
    pub width: usize,
    /// Output channels of each conv stage.
    pub channels: Vec<usize>,
    /// Number of classes (logits per image).
    pub classes: usize,
}

impl CnnConfig {
    /// The number of features the head sees: channels × height × width after the last stage.
    pub fn features(&self) -> usize {
        let stages = self.channels.len();
        let c = self.channels.last().copied().unwrap_or(self.in_channels);
        let (h, w) = (
            self.height.checked_shr(stages as u32).unwrap_or(0),
            self.width.checked_shr(stages as u32).unwrap_or(0),
        );
        c.saturating_mul(h).saturating_mul(w)
    }
}

/// A small convolutional classifier on images (B, in_channels, height, width) → logits
/// (B, classes): per stage `Conv2d 3×3, stride 1, padding 1 → ReLU → MaxPool2d 2`, then
/// `Flatten → Linear`. Layers sit at their `nn.Sequential` positions: stage `k`'s conv at `3k`,
/// the head at `3L + 1` (two stages: `0.*`, `3.*`, `7.*`). An empty stage list, a zero size, or
/// an image the stages shrink to nothing is an error.
pub fn cnn<O: Train>(vars: &Vars<'_, O>, config: &CnnConfig) -> Result<Sequential<O>> {
    let c = config;
    if c.channels.is_empty()
        || c.in_channels == 0
        || c.classes == 0
        || c.channels.contains(&0)
        || c.features() == 0
    {
        return Err(usage(
            "models::cnn",
            format!("{c:?} leaves no features for the classifier (each stage halves the image)"),
        ));
    }
    let same = ConvConfig {
        stride: 1,
        padding: 1,
    };
    let mut net = Sequential::new();
    let mut cin = c.in_channels;
    for (k, &cout) in c.channels.iter().enumerate() {
        net = net
            .add(Conv::conv2d(&vars.pp(3 * k), cin, cout, 3, same)?)
            .add(Activation::Relu)
            .add(MaxPool::new(&[2, 2])?);
        cin = cout;
    }
    let head = 3 * c.channels.len() + 1;
    Ok(net
        .add(Flatten)
        .add(Linear::new(&vars.pp(head), c.features(), c.classes)?))
}

/// The shape of an [`Fno1d`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnoConfig {
    /// Input channels per grid point.
    pub in_channels: usize,
    /// Output channels per grid point.
    pub out_channels: usize,
    /// Channel width of the Fourier layers.
    pub width: usize,
    /// Kept real-FFT bins (`≤ grid/2 + 1`, checked when the ops are recorded).
    pub modes: usize,
    /// Number of Fourier layers.
    pub layers: usize,
    /// Hidden width of the projection.
    pub proj_hidden: usize,
    /// The exact GELU (`½x(1 + erf(x/√2))`, PyTorch's `F.gelu` default, which the paper's code
    /// uses) instead of the tanh form.
    pub exact_gelu: bool,
}

/// The 1-D Fourier neural operator (Li et al. 2021, "FNO1d"), channels last: fields are
/// (B, grid, channels). `lift` (a linear map to `width`), then `layers` of
/// `gelu(spectral(h) + pointwise(h))` (no gelu after the last), then `proj.0 → gelu → proj.2`
/// (GELU in the tanh form, or exact with [`FnoConfig::exact_gelu`]). The pointwise maps are the
/// paper's 1×1 convolutions `w_k` (a `Linear` on the channel axis, channels last).
/// Names: `lift.*`, `spectral.{k}.*`, `pointwise.{k}.*`, `proj.0.*`, `proj.2.*`. PyTorch: the
/// reference `FNO1d` with channels last.
///
/// [`with_output_scale`](Self::with_output_scale) multiplies the output by a fixed constant:
/// training such a model is training the plain one on targets divided by the constant (a
/// scalar output normaliser), for targets much smaller than 1, where Adam's steps of about
/// the learning rate per parameter would otherwise be large against the targets.
pub struct Fno1d {
    lift: Linear,
    spectral: Vec<SpectralConv1d>,
    pointwise: Vec<Linear>,
    proj: (Linear, Linear),
    exact_gelu: bool,
    output_scale: f64,
}

impl Fno1d {
    /// The operator's parameters under `vars`, initialised with PyTorch's defaults. A zero
    /// size, or a model too large to hold (checked before any parameter is made: `layers`
    /// too), is an error naming the config.
    pub fn new<O: Train>(vars: &Vars<'_, O>, config: &FnoConfig) -> Result<Self> {
        let c = config;
        if [
            c.in_channels,
            c.out_channels,
            c.width,
            c.modes,
            c.proj_hidden,
        ]
        .contains(&0)
        {
            return Err(usage(
                "Fno1d::new",
                format!("every size must be at least 1, got {c:?}"),
            ));
        }
        let (w, ph) = (c.width, c.proj_hidden);
        check_params::<O>(
            "Fno1d::new",
            c,
            &[
                // lift, spectral (re, im), pointwise, proj.0, proj.2: weights and biases.
                (1, &[c.in_channels, w]),
                (1, &[w]),
                (c.layers, &[2, c.modes, w, w]),
                (c.layers, &[w, w]),
                (c.layers, &[w]),
                (1, &[w, ph]),
                (1, &[ph]),
                (1, &[ph, c.out_channels]),
                (1, &[c.out_channels]),
            ],
        )?;
        // Grown as the layers are made (each fallibly), not reserved from `layers`.
        let (mut spectral, mut pointwise) = (Vec::new(), Vec::new());
        for k in 0..c.layers {
            spectral.push(SpectralConv1d::new(
                &vars.pp("spectral").pp(k),
                c.width,
                c.modes,
            )?);
            pointwise.push(Linear::new(&vars.pp("pointwise").pp(k), c.width, c.width)?);
        }
        Ok(Fno1d {
            lift: Linear::new(&vars.pp("lift"), c.in_channels, c.width)?,
            spectral,
            pointwise,
            proj: (
                Linear::new(&vars.pp("proj").pp(0), c.width, c.proj_hidden)?,
                Linear::new(&vars.pp("proj").pp(2), c.proj_hidden, c.out_channels)?,
            ),
            exact_gelu: c.exact_gelu,
            output_scale: 1.0,
        })
    }

    /// The model with its output multiplied by `scale` (finite and positive; 1, the default,
    /// records no multiplication). PyTorch: `y = scale * fno(x)`, or training on `y / scale`.
    pub fn with_output_scale(mut self, scale: f64) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(usage(
                "Fno1d::with_output_scale",
                format!("the scale must be finite and positive, got {scale}"),
            ));
        }
        self.output_scale = scale;
        Ok(self)
    }

    /// The constant the output is multiplied by (1 unless
    /// [`with_output_scale`](Self::with_output_scale) set it).
    pub fn output_scale(&self) -> f64 {
        self.output_scale
    }
}

impl Parameters for Fno1d {
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

impl<O: Train> Module<O> for Fno1d {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let gelu = |h: &Var<'g, O>| {
            if self.exact_gelu {
                h.gelu_erf()
            } else {
                h.gelu()
            }
        };
        let mut h = self.lift.forward(x)?;
        let last = self.spectral.len().saturating_sub(1);
        for (k, (s, p)) in self.spectral.iter().zip(&self.pointwise).enumerate() {
            h = (s.forward(&h)? + p.forward(&h)?)?;
            if k < last {
                h = gelu(&h)?;
            }
        }
        let out = self.proj.1.forward(&gelu(&self.proj.0.forward(&h)?)?)?;
        if self.output_scale == 1.0 {
            Ok(out)
        } else {
            out.scale(self.output_scale)
        }
    }
}

/// The shape of a [`TransformerBlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads (dividing `d_model`).
    pub heads: usize,
    /// Width of the block's MLP.
    pub d_ff: usize,
    /// Whether attention masks the future (a language model's blocks do).
    pub causal: bool,
}

/// A pre-norm transformer block on x (n, d) or (B, n, d): `h = x + attn(ln1(x))`, then
/// `h + fc2(gelu(fc1(ln2(h))))`. Names: `ln1.*`, `attn.{wq,wk,wv,wo}`, `ln2.*`, `fc1.*`,
/// `fc2.*`. PyTorch: `nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
/// dropout=0)` with attention without biases (and `is_causal` when `causal`).
pub struct TransformerBlock {
    ln1: LayerNorm,
    attn: MultiHeadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl TransformerBlock {
    /// The block's parameters under `vars`, initialised with PyTorch's defaults (layer norms
    /// γ = 1, β = 0; see [`MultiHeadAttention`] and [`Linear`]).
    pub fn new<O: Train>(vars: &Vars<'_, O>, config: &BlockConfig) -> Result<Self> {
        let c = config;
        if c.d_ff == 0 {
            return Err(usage(
                "TransformerBlock::new",
                format!("the MLP width d_ff must be at least 1, got {c:?}"),
            ));
        }
        Ok(TransformerBlock {
            ln1: LayerNorm::new(&vars.pp("ln1"), c.d_model)?,
            attn: MultiHeadAttention::new(&vars.pp("attn"), c.d_model, c.heads, c.causal)?,
            ln2: LayerNorm::new(&vars.pp("ln2"), c.d_model)?,
            fc1: Linear::new(&vars.pp("fc1"), c.d_model, c.d_ff)?,
            fc2: Linear::new(&vars.pp("fc2"), c.d_ff, c.d_model)?,
        })
    }
}

impl Parameters for TransformerBlock {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.ln1.visit_params(f);
        self.attn.visit_params(f);
        self.ln2.visit_params(f);
        self.fc1.visit_params(f);
        self.fc2.visit_params(f);
    }
}

impl<O: Train> Module<O> for TransformerBlock {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let h = (x + &self.attn.forward(&self.ln1.forward(x)?)?)?;
        let m = self
            .fc2
            .forward(&self.fc1.forward(&self.ln2.forward(&h)?)?.gelu()?)?;
        &h + &m
    }
}

/// The shape of a [`TransformerLm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length (tokens per window).
    pub context: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads of each block.
    pub heads: usize,
    /// MLP width of each block.
    pub d_ff: usize,
    /// Number of blocks.
    pub blocks: usize,
}

/// A GPT-style char-level language model: token embedding `tok_emb` plus a learned positional
/// embedding `pos_emb` (context, d_model), causal [`TransformerBlock`]s `blocks.{k}`, a final
/// layer norm `ln_f` and a linear `head` to vocabulary logits.
pub struct TransformerLm {
    config: LmConfig,
    tok: Embedding,
    pos: Param,
    blocks: Vec<TransformerBlock>,
    ln_f: LayerNorm,
    head: Linear,
}

impl TransformerLm {
    /// The model's parameters under `vars`: PyTorch's defaults, and GPT-2's N(0, 0.02²) for
    /// the positional embedding. A model too large to hold (`blocks` too) is an error naming
    /// the config, before any parameter is made.
    pub fn new<O: Train>(vars: &Vars<'_, O>, config: &LmConfig) -> Result<Self> {
        let c = *config;
        if c.vocab == 0 || c.context == 0 {
            return Err(usage(
                "TransformerLm::new",
                format!("vocab and context must be at least 1, got {c:?}"),
            ));
        }
        let (d, ff) = (c.d_model, c.d_ff);
        check_params::<O>(
            "TransformerLm::new",
            &c,
            &[
                // The embeddings; per block wq…wo, ln1 and ln2, fc1 and fc2; ln_f; the head.
                (1, &[c.vocab, d]),
                (1, &[c.context, d]),
                (c.blocks, &[4, d, d]),
                (c.blocks, &[4, d]),
                (c.blocks, &[2, d, ff]),
                (c.blocks, &[ff]),
                (c.blocks, &[d]),
                (1, &[2, d]),
                (1, &[c.vocab, d]),
                (1, &[c.vocab]),
            ],
        )?;
        let block = BlockConfig {
            d_model: c.d_model,
            heads: c.heads,
            d_ff: c.d_ff,
            causal: true,
        };
        let blocks = (0..c.blocks)
            .map(|k| TransformerBlock::new(&vars.pp("blocks").pp(k), &block))
            .collect::<Result<Vec<_>>>()?;
        Ok(TransformerLm {
            config: c,
            tok: Embedding::new(&vars.pp("tok_emb"), c.vocab, c.d_model)?,
            pos: vars.param(
                "pos_emb",
                &[c.context, c.d_model],
                Init::Normal {
                    mean: 0.0,
                    std: 0.02,
                },
            )?,
            blocks,
            ln_f: LayerNorm::new(&vars.pp("ln_f"), c.d_model)?,
            head: Linear::new(&vars.pp("head"), c.d_model, c.vocab)?,
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &LmConfig {
        &self.config
    }

    /// Next-token logits (batch, context, vocab) of `batch` windows of `context` token ids
    /// (row-major: window, position); position t sees positions ≤ t only.
    pub fn logits<'g, O: Train>(
        &self,
        g: &Scope<'g, O>,
        tokens: &[usize],
        batch: usize,
    ) -> Result<Var<'g, O>> {
        let c = &self.config;
        if Some(tokens.len()) != batch.checked_mul(c.context) {
            return Err(usage(
                "TransformerLm::logits",
                format!(
                    "need batch × context = {batch} × {} token ids, got {}",
                    c.context,
                    tokens.len()
                ),
            ));
        }
        let x = self
            .tok
            .forward(g, tokens)?
            .reshape(&[batch, c.context, c.d_model])?;
        let mut h = (&x + &g.param(&self.pos)?)?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        self.head.forward(&self.ln_f.forward(&h)?)
    }
}

impl Parameters for TransformerLm {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.tok.visit_params(f);
        f(&self.pos);
        self.blocks.visit_params(f);
        self.ln_f.visit_params(f);
        self.head.visit_params(f);
    }
}
