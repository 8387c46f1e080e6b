//! [`Upsample`]: upsampling by whole factors, nearest or linear. PyTorch: `nn.Upsample(
//! scale_factor=s, mode=…)`, `F.interpolate(x, scale_factor=s, mode=…)`.

use tl_session::{Param, Train};
use tl_spec::Shape;

use super::resample::{along_axis, linear_weights};
use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// How [`Upsample`] fills the new cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Each cell repeated.
    Nearest,
    /// Linear interpolation along each of `axes` spatial axes (PyTorch's `linear`, `bilinear`,
    /// `trilinear` for 1, 2, 3).
    Linear {
        /// The spatial axes the mode is for.
        axes: usize,
        /// PyTorch's `align_corners`.
        align_corners: bool,
    },
}

/// Upsampling of x (N, C, spatial…) with 1 to 3 spatial axes by whole factors. PyTorch:
/// `nn.Upsample(scale_factor=s, mode=…)`.
///
/// - [`Upsample::new`], [`Upsample::per_axis`]: `mode='nearest'`, each cell repeated `s` times
///   along each axis (PyTorch's output cell `i` reads input cell `⌊i/s⌋`: the same thing). A
///   reshape, a broadcast and a reshape, (…, d, …) → (…, d, 1, …) → (…, d, s, …) → (…, d·s,
///   …): the values are copied exactly, and each input cell's gradient is the sum over its
///   copies (the broadcast's backward).
/// - [`Upsample::linear`], [`Upsample::bilinear`], [`Upsample::trilinear`]: PyTorch's
///   interpolating modes for 1, 2 and 3 spatial axes, with `align_corners`: along each axis one
///   `matmul` by the constant (d, d·s) matrix of interpolation weights (each output cell two
///   neighbours, weights computed in f64 and rounded once to the session's type), so each cell
///   takes PyTorch's value up to the rounding of the sums, and the gradient is the matmul's.
///
/// Checked by tl-conformance's `nn_layers::upsample` against 0/1 matrices (nearest) and
/// interpolation written out per output cell (linear modes), along each axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upsample {
    /// The factor per spatial axis (one entry: every axis).
    scale: Vec<usize>,
    mode: Mode,
}

impl Upsample {
    /// Nearest upsampling by `scale` on every spatial axis (≥ 1).
    pub fn new(scale: usize) -> Result<Self> {
        Self::per_axis(&[scale])
    }

    /// Nearest upsampling by `scale[k]` along spatial axis k (1 to 3 factors, each ≥ 1).
    pub fn per_axis(scale: &[usize]) -> Result<Self> {
        Self::make(scale, Mode::Nearest)
    }

    /// Linear interpolation by `scale` of x (N, C, L). PyTorch: `mode='linear'`.
    pub fn linear(scale: usize, align_corners: bool) -> Result<Self> {
        Self::interpolating(scale, 1, align_corners)
    }

    /// Bilinear interpolation by `scale` of x (N, C, H, W). PyTorch: `mode='bilinear'`.
    pub fn bilinear(scale: usize, align_corners: bool) -> Result<Self> {
        Self::interpolating(scale, 2, align_corners)
    }

    /// Trilinear interpolation by `scale` of x (N, C, D, H, W). PyTorch: `mode='trilinear'`.
    pub fn trilinear(scale: usize, align_corners: bool) -> Result<Self> {
        Self::interpolating(scale, 3, align_corners)
    }

    fn interpolating(scale: usize, axes: usize, align_corners: bool) -> Result<Self> {
        Self::make(
            &[scale],
            Mode::Linear {
                axes,
                align_corners,
            },
        )
    }

    fn make(scale: &[usize], mode: Mode) -> Result<Self> {
        if scale.is_empty() || scale.len() > 3 || scale.contains(&0) {
            return Err(usage(
                "Upsample::new",
                format!("need 1 to 3 scale factors, each ≥ 1, got {scale:?}"),
            ));
        }
        Ok(Upsample {
            scale: scale.to_vec(),
            mode,
        })
    }

    /// The factor of each spatial axis of x (`dims`), or an error naming its shape.
    fn factors(&self, dims: &[usize]) -> Result<Vec<usize>> {
        let spatial = dims.len().saturating_sub(2);
        let bad = |why: String| usage("Upsample::forward", why);
        if !(1..=3).contains(&spatial) {
            return Err(bad(format!(
                "x must be (N, C, spatial…) with 1 to 3 spatial axes, got {dims:?}"
            )));
        }
        if let Mode::Linear { axes, .. } = self.mode
            && axes != spatial
        {
            return Err(bad(format!(
                "mode '{}' takes x with {axes} spatial axes, got {dims:?}",
                self.mode_name()
            )));
        }
        match self.scale.len() {
            1 => Ok(vec![self.scale[0]; spatial]),
            n if n == spatial => Ok(self.scale.clone()),
            n => Err(bad(format!(
                "{n} scale factors for x {dims:?} with {spatial} spatial axes"
            ))),
        }
    }

    /// PyTorch's name of the mode.
    fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Nearest => "nearest",
            Mode::Linear { axes: 1, .. } => "linear",
            Mode::Linear { axes: 2, .. } => "bilinear",
            Mode::Linear { .. } => "trilinear",
        }
    }

    /// Nearest: reshape, broadcast, reshape.
    fn repeat<'g, O: Train>(x: &Var<'g, O>, factors: &[usize]) -> Result<Var<'g, O>> {
        let dims = x.dims().to_vec();
        let (lead, spatial) = dims.split_at(2);
        let mut split: Vec<usize> = lead.to_vec();
        let mut spread: Vec<usize> = lead.to_vec();
        let mut out: Vec<usize> = lead.to_vec();
        for (&d, &s) in spatial.iter().zip(factors) {
            split.extend([d, 1]);
            spread.extend([d, s]);
            out.push(d.checked_mul(s).ok_or_else(|| {
                usage(
                    "Upsample::forward",
                    format!("x {dims:?} scaled by {factors:?} overflows"),
                )
            })?);
        }
        x.reshape(&split)?
            .broadcast_to(&Shape::new(&spread))?
            .reshape(&out)
    }
}

impl Parameters for Upsample {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn extra_repr(&self) -> String {
        let f = |s: usize| format!("{s}.0");
        let scale = match self.scale.as_slice() {
            [s] => f(*s),
            v => format!(
                "({})",
                v.iter().map(|&s| f(s)).collect::<Vec<_>>().join(", ")
            ),
        };
        format!("scale_factor={scale}, mode='{}'", self.mode_name())
    }
}

impl<O: Train> Module<O> for Upsample {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let dims = x.dims().to_vec();
        let factors = self.factors(&dims)?;
        let Mode::Linear { align_corners, .. } = self.mode else {
            return Self::repeat(x, &factors);
        };
        let mut y = x.clone();
        for (axis, &s) in (2..).zip(&factors) {
            if s > 1 {
                let m = linear_weights(dims[axis], s, align_corners)?;
                y = along_axis("Upsample::forward", &y, axis, m)?;
            }
        }
        Ok(y)
    }
}
