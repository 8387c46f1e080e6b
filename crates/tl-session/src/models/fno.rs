//! A 1-D Fourier neural operator (Li et al. 2021, "FNO1d"): lift each grid point's input channels
//! to `width` with a linear map, then `K` layers of `gelu(spectralConv1dRfft(h) + W·h + b)`
//! (no gelu after the last), then project each point with `linear → gelu → linear` to the output
//! channels. Channels last: fields are (B, grid, channels). PyTorch: the reference `FNO1d`.

use tl_spec::{Scalar, Shape, Tensor};

use super::SplitMix;
use crate::{Error, Ops, Param, Result, TensorRef};

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
    /// Number of Fourier layers `K`.
    pub layers: usize,
    /// Hidden width of the projection.
    pub proj_hidden: usize,
}

/// A linear layer's `(weight (out, in), bias (out))`.
type Lin = (Param, Param);

/// An FNO1d's parameters.
#[derive(Debug, Clone)]
pub struct Fno1d {
    /// The configuration it was built with.
    pub config: FnoConfig,
    /// Lifting linear map (in_channels → width).
    pub lift: Lin,
    /// Per Fourier layer: spectral weights `(wRe, wIm)` (modes, width, width) and the pointwise
    /// linear map (width → width).
    pub layers: Vec<((Param, Param), Lin)>,
    /// Projection: width → proj_hidden → out_channels.
    pub proj: (Lin, Lin),
}

/// The parameter leaves of one recorded forward pass ([`Fno1d::use_params`]).
#[derive(Debug, Clone)]
pub struct FnoLeaves(Vec<TensorRef>);

fn lin<S: Ops + ?Sized>(
    s: &mut S,
    rng: &mut SplitMix,
    name: &str,
    fan_in: usize,
    fan_out: usize,
) -> Result<Lin> {
    // PyTorch's nn.Linear init: uniform in ±1/√fan_in.
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let mut init =
        |shape: &[usize]| Tensor::<S::T>::from_fn(shape, |_| S::T::lit(rng.uniform(-bound, bound)));
    let w = init(&[fan_out, fan_in]);
    let b = init(&[fan_out]);
    Ok((
        s.param(w, Some(&format!("{name}.weight")), true)?,
        s.param(b, Some(&format!("{name}.bias")), true)?,
    ))
}

impl Fno1d {
    /// Parameters for `config` from `seed`. Linear maps get PyTorch's `nn.Linear` init; spectral
    /// weights are uniform in `[0, 1/width²)` as in the reference FNO code. Names: `lift.*`,
    /// `spectral{k}.re`, `spectral{k}.im`, `pointwise{k}.*`, `proj0.*`, `proj1.*`.
    pub fn new<S: Ops + ?Sized>(s: &mut S, config: &FnoConfig, seed: u64) -> Result<Self> {
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
            return Err(Error::Usage {
                what: "Fno1d::new",
                detail: format!("every size must be at least 1, got {c:?}"),
            });
        }
        let mut rng = SplitMix::new(seed);
        let lift = lin(s, &mut rng, "lift", c.in_channels, c.width)?;
        let scale = 1.0 / (c.width * c.width) as f64;
        let mut layers = Vec::with_capacity(c.layers);
        for k in 0..c.layers {
            let mut spec = |part: &str, rng: &mut SplitMix| {
                let t = Tensor::<S::T>::from_fn([c.modes, c.width, c.width], |_| {
                    S::T::lit(scale * rng.uniform(0.0, 1.0))
                });
                s.param(t, Some(&format!("spectral{k}.{part}")), true)
            };
            let re = spec("re", &mut rng)?;
            let im = spec("im", &mut rng)?;
            let pw = lin(s, &mut rng, &format!("pointwise{k}"), c.width, c.width)?;
            layers.push(((re, im), pw));
        }
        let p0 = lin(s, &mut rng, "proj0", c.width, c.proj_hidden)?;
        let p1 = lin(s, &mut rng, "proj1", c.proj_hidden, c.out_channels)?;
        Ok(Fno1d {
            config: c.clone(),
            lift,
            layers,
            proj: (p0, p1),
        })
    }

    /// Every parameter: lift, then per layer (re, im, pointwise weight, bias), then projection.
    pub fn params(&self) -> Vec<Param> {
        let mut v = vec![self.lift.0.clone(), self.lift.1.clone()];
        for ((re, im), (w, b)) in &self.layers {
            v.extend([re.clone(), im.clone(), w.clone(), b.clone()]);
        }
        let ((w0, b0), (w1, b1)) = &self.proj;
        v.extend([w0.clone(), b0.clone(), w1.clone(), b1.clone()]);
        v
    }

    /// The parameter names, in [`params`](Self::params) order.
    pub fn param_names(&self) -> Vec<String> {
        let mut v = vec!["lift.weight".to_owned(), "lift.bias".to_owned()];
        for k in 0..self.layers.len() {
            v.extend([
                format!("spectral{k}.re"),
                format!("spectral{k}.im"),
                format!("pointwise{k}.weight"),
                format!("pointwise{k}.bias"),
            ]);
        }
        v.extend(["proj0.weight", "proj0.bias", "proj1.weight", "proj1.bias"].map(String::from));
        v
    }

    /// Record every parameter as a leaf (linked sessions need all leaves before the first op).
    pub fn use_params<S: Ops + ?Sized>(&self, s: &mut S) -> Result<FnoLeaves> {
        self.params()
            .iter()
            .map(|p| s.use_param(p))
            .collect::<Result<Vec<_>>>()
            .map(FnoLeaves)
    }

    /// The output field (B, grid, out_channels) of `x` (B, grid, in_channels).
    pub fn forward<S: Ops + ?Sized>(
        &self,
        s: &mut S,
        leaves: &FnoLeaves,
        x: &TensorRef,
    ) -> Result<TensorRef> {
        let (b, n) = match *x.shape().dims() {
            [b, n, _] => (b, n),
            _ => {
                return Err(Error::Usage {
                    what: "Fno1d::forward",
                    detail: format!("x must be (B, grid, channels), got {}", x.shape()),
                });
            }
        };
        let c = &self.config;
        let l = &leaves.0;
        // A pointwise linear map on (B, grid, in) via (B·grid, in).
        let pointwise = |s: &mut S, w: &TensorRef, bias: &TensorRef, h: &TensorRef, out: usize| {
            let inp = h.shape().dims()[2];
            let flat = s.reshape(h, Shape::new(&[b * n, inp]))?;
            let y = s.linear(w, bias, &flat)?;
            s.reshape(&y, Shape::new(&[b, n, out]))
        };
        let mut h = pointwise(s, &l[0], &l[1], x, c.width)?;
        for k in 0..self.layers.len() {
            let p = &l[2 + 4 * k..6 + 4 * k];
            let spec = s.spectral_conv1d_rfft(&h, &p[0], &p[1], c.modes)?;
            let local = pointwise(s, &p[2], &p[3], &h, c.width)?;
            h = s.add(&spec, &local)?;
            if k + 1 < self.layers.len() {
                h = s.gelu(&h)?;
            }
        }
        let q = &l[2 + 4 * self.layers.len()..];
        let h = pointwise(s, &q[0], &q[1], &h, c.proj_hidden)?;
        let h = s.gelu(&h)?;
        pointwise(s, &q[2], &q[3], &h, c.out_channels)
    }
}
