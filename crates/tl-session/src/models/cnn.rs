//! A small convolutional classifier: `(conv 3×3 pad 1 → relu → maxPool 2×2) × L → flatten →
//! linear`. PyTorch: `nn.Sequential(Conv2d, ReLU, MaxPool2d, …, Flatten, Linear)`.

use tl_spec::{Scalar, Shape, Tensor};

use super::SplitMix;
use crate::{Error, Ops, Param, Result, TensorRef};

/// The shape of a [`Cnn`]: input channels and image size, the channels of each conv stage, the
/// number of classes.
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
    /// Number of classes (logits per example).
    pub classes: usize,
}

impl CnnConfig {
    /// (channels, height, width) after the last stage.
    pub fn features(&self) -> (usize, usize, usize) {
        let mut c = (self.in_channels, self.height, self.width);
        for &ch in &self.channels {
            c = (ch, c.1 / 2, c.2 / 2);
        }
        c
    }
}

/// A CNN's parameters: `(weight (outC, inC, 3, 3), bias (outC))` per stage and the linear head
/// `(weight (classes, features), bias (classes))`.
#[derive(Debug, Clone)]
pub struct Cnn {
    /// The configuration it was built with.
    pub config: CnnConfig,
    /// `(w, b)` per conv stage.
    pub convs: Vec<(Param, Param)>,
    /// `(w, b)` of the classifier head.
    pub head: (Param, Param),
}

/// The parameter leaves of one recorded forward pass ([`Cnn::use_params`]).
#[derive(Debug, Clone)]
pub struct CnnLeaves {
    convs: Vec<(TensorRef, TensorRef)>,
    head: (TensorRef, TensorRef),
}

/// Kernel size of every conv stage.
const K: usize = 3;

/// Uniform in ±1/√fan_in: what PyTorch's default `kaiming_uniform_(a = √5)` init of `Conv2d`
/// and `Linear` weights (and their bias init) amounts to.
fn uniform<T: Scalar>(rng: &mut SplitMix, shape: &[usize], fan_in: usize) -> Tensor<T> {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Tensor::from_fn(shape, |_| T::lit(rng.uniform(-bound, bound)))
}

impl Cnn {
    /// Parameters for `config`, initialised like PyTorch from `seed`; names `conv{k}.weight`,
    /// `conv{k}.bias`, `fc.weight`, `fc.bias`. An empty stage list, a zero size, or an image that
    /// the stages shrink to nothing is an error.
    pub fn new<S: Ops + ?Sized>(s: &mut S, config: &CnnConfig, seed: u64) -> Result<Self> {
        let (fc, fh, fw) = config.features();
        if config.channels.is_empty()
            || config.in_channels == 0
            || config.classes == 0
            || fc * fh * fw == 0
        {
            return Err(Error::Usage {
                what: "Cnn::new",
                detail: format!(
                    "{config:?} leaves no features for the classifier (each stage halves the image)"
                ),
            });
        }
        let mut rng = SplitMix::new(seed);
        let mut convs = Vec::with_capacity(config.channels.len());
        let mut cin = config.in_channels;
        for (k, &cout) in config.channels.iter().enumerate() {
            let fan_in = cin * K * K;
            let w = uniform::<S::T>(&mut rng, &[cout, cin, K, K], fan_in);
            let b = uniform::<S::T>(&mut rng, &[cout], fan_in);
            let w = s.param(w, Some(&format!("conv{k}.weight")), true)?;
            let b = s.param(b, Some(&format!("conv{k}.bias")), true)?;
            convs.push((w, b));
            cin = cout;
        }
        let feats = fc * fh * fw;
        let w = uniform::<S::T>(&mut rng, &[config.classes, feats], feats);
        let b = uniform::<S::T>(&mut rng, &[config.classes], feats);
        let head = (
            s.param(w, Some("fc.weight"), true)?,
            s.param(b, Some("fc.bias"), true)?,
        );
        Ok(Cnn {
            config: config.clone(),
            convs,
            head,
        })
    }

    /// Every parameter: each stage's weight and bias, then the head's.
    pub fn params(&self) -> Vec<Param> {
        self.convs
            .iter()
            .chain(std::iter::once(&self.head))
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    /// The parameter names, in [`params`](Self::params) order.
    pub fn param_names(&self) -> Vec<String> {
        (0..self.convs.len())
            .flat_map(|k| [format!("conv{k}.weight"), format!("conv{k}.bias")])
            .chain(["fc.weight".to_owned(), "fc.bias".to_owned()])
            .collect()
    }

    /// Record every parameter as a leaf (linked sessions need all leaves before the first op).
    pub fn use_params<S: Ops + ?Sized>(&self, s: &mut S) -> Result<CnnLeaves> {
        let convs = self
            .convs
            .iter()
            .map(|(w, b)| Ok((s.use_param(w)?, s.use_param(b)?)))
            .collect::<Result<Vec<_>>>()?;
        let head = (s.use_param(&self.head.0)?, s.use_param(&self.head.1)?);
        Ok(CnnLeaves { convs, head })
    }

    /// Logits (B, classes) of images `x` (B, inC, H, W).
    pub fn forward<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        leaves: &CnnLeaves,
        x: &TensorRef,
    ) -> Result<TensorRef> {
        let batch = x.shape().dims().first().copied().unwrap_or(0);
        let mut h = x.clone();
        for (w, b) in &leaves.convs {
            h = s.conv(w, b, &h, vec![1, 1], vec![1, 1])?;
            h = s.relu(&h)?;
            h = s.max_pool(&h, vec![2, 2], vec![2, 2], vec![0, 0])?;
        }
        let (c, hh, ww) = self.config.features();
        let flat = s.reshape(&h, Shape::new(&[batch, c * hh * ww]))?;
        s.linear(&leaves.head.0, &leaves.head.1, &flat)
    }
}
