//! [`ResNet`]: a ResNet-style image classifier of basic residual blocks (He et al. 2016) at one
//! width, the realistic-size CNN of the benchmarks.

use tl_session::Train;

use crate::error::usage;
use crate::{
    Activation, BatchNorm, Conv, ConvConfig, Linear, Module, Parameters, Result, Var, Vars,
};

/// The shape of a [`ResNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Channels of the input images (3 for RGB).
    pub in_channels: usize,
    /// Channels of the stem and of every block.
    pub channels: usize,
    /// Residual blocks after the stem.
    pub blocks: usize,
    /// Classes of the linear head.
    pub classes: usize,
}

/// `x + BN(conv(ReLU(BN(conv x))))` then ReLU: two 3×3 convolutions (padding 1) at one width,
/// each followed by batch norm, with the identity skip. Parameters `conv1.*`, `bn1.*`,
/// `conv2.*`, `bn2.*`. PyTorch: torchvision's `BasicBlock` without downsampling (and with
/// convolution biases).
#[derive(Parameters)]
pub struct BasicBlock {
    conv1: Conv,
    bn1: BatchNorm,
    conv2: Conv,
    bn2: BatchNorm,
}

const SAME: ConvConfig = ConvConfig {
    stride: 1,
    padding: 1,
};

impl BasicBlock {
    /// A block of `channels` under `vars`, PyTorch's default initialisers.
    pub fn new<O: Train>(vars: &Vars<'_, O>, channels: usize) -> Result<Self> {
        Ok(BasicBlock {
            conv1: Conv::conv2d(&vars.pp("conv1"), channels, channels, 3, SAME)?,
            bn1: BatchNorm::new(&vars.pp("bn1"), channels)?,
            conv2: Conv::conv2d(&vars.pp("conv2"), channels, channels, 3, SAME)?,
            bn2: BatchNorm::new(&vars.pp("bn2"), channels)?,
        })
    }
}

impl<O: Train> Module<O> for BasicBlock {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let h = Activation::Relu.apply(&self.bn1.forward(&self.conv1.forward(x)?)?)?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        Activation::Relu.apply(&(x + &h)?)
    }
}

/// Images (B, in_channels, H, W) → logits (B, classes): a stem `conv 3×3 → BN → ReLU` to
/// `channels` (`stem.*`, `bn.*`), `blocks` [`BasicBlock`]s (`blocks.{k}.*`), the mean over
/// the image, and a linear head (`head.*`). PyTorch: a CIFAR-style ResNet at one width, with
/// `nn.AdaptiveAvgPool2d(1)` before the head.
#[derive(Parameters)]
pub struct ResNet {
    #[parameters(skip)]
    config: ResNetConfig,
    stem: Conv,
    bn: BatchNorm,
    blocks: Vec<BasicBlock>,
    head: Linear,
}

impl ResNet {
    /// The model's parameters under `vars`; a zero size is an error naming the config, and so
    /// is a model too large to hold (checked before any parameter is made).
    pub fn new<O: Train>(vars: &Vars<'_, O>, config: &ResNetConfig) -> Result<Self> {
        let c = *config;
        if c.in_channels == 0 || c.channels == 0 || c.classes == 0 {
            return Err(usage(
                "ResNet::new",
                format!("in_channels, channels and classes must be at least 1, got {c:?}"),
            ));
        }
        let ch = c.channels;
        crate::models::check_params::<O>(
            "ResNet::new",
            &c,
            &[
                // The stem conv and its BN (weight, bias, running mean and variance); per
                // block two convs and two BNs; the head.
                (1, &[ch, c.in_channels, 3, 3]),
                (1, &[5, ch]),
                (c.blocks, &[2, ch, ch, 3, 3]),
                (c.blocks, &[10, ch]),
                (1, &[c.classes, ch]),
                (1, &[c.classes]),
            ],
        )?;
        let blocks = (0..c.blocks)
            .map(|k| BasicBlock::new(&vars.pp("blocks").pp(k), c.channels))
            .collect::<Result<Vec<_>>>()?;
        Ok(ResNet {
            config: c,
            stem: Conv::conv2d(&vars.pp("stem"), c.in_channels, c.channels, 3, SAME)?,
            bn: BatchNorm::new(&vars.pp("bn"), c.channels)?,
            blocks,
            head: Linear::new(&vars.pp("head"), c.channels, c.classes)?,
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ResNetConfig {
        &self.config
    }
}

impl<O: Train> Module<O> for ResNet {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let mut h = Activation::Relu.apply(&self.bn.forward(&self.stem.forward(x)?)?)?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        // (B, C, H, W) → (B, C): the mean over the image.
        self.head.forward(&h.mean_axis(3)?.mean_axis(2)?)
    }
}
