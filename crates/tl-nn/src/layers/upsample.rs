//! [`Upsample`]: nearest-neighbour upsampling by whole factors. PyTorch: `nn.Upsample(
//! scale_factor=s, mode='nearest')`, `F.interpolate(x, scale_factor=s)`.

use tl_session::{Param, Train};
use tl_spec::Shape;

use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// Nearest-neighbour upsampling of x (N, C, spatial…) with 1 to 3 spatial axes: each cell
/// repeated `scale` times along each spatial axis (one factor for every axis, or one per
/// axis). PyTorch: `nn.Upsample(scale_factor=s, mode='nearest')` with whole factors (there,
/// output cell `i` reads input cell `⌊i/s⌋`: the same repetition).
///
/// A reshape, a broadcast and a reshape, (…, d, …) → (…, d, 1, …) → (…, d, s, …) → (…, d·s,
/// …): the output copies the input's values exactly, and the gradient of each input cell is
/// the sum over its s copies (the broadcast's backward). Checked by tl-conformance's
/// `nn_layers::upsample` against 0/1 matrices applied along each axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upsample {
    /// The factor per spatial axis (one entry: every axis).
    scale: Vec<usize>,
}

impl Upsample {
    /// Upsampling by `scale` on every spatial axis (≥ 1).
    pub fn new(scale: usize) -> Result<Self> {
        Self::per_axis(&[scale])
    }

    /// Upsampling by `scale[k]` along spatial axis k (1 to 3 factors, each ≥ 1).
    pub fn per_axis(scale: &[usize]) -> Result<Self> {
        if scale.is_empty() || scale.len() > 3 || scale.contains(&0) {
            return Err(usage(
                "Upsample::new",
                format!("need 1 to 3 scale factors, each ≥ 1, got {scale:?}"),
            ));
        }
        Ok(Upsample {
            scale: scale.to_vec(),
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
        match self.scale.len() {
            1 => Ok(vec![self.scale[0]; spatial]),
            n if n == spatial => Ok(self.scale.clone()),
            n => Err(bad(format!(
                "{n} scale factors for x {dims:?} with {spatial} spatial axes"
            ))),
        }
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
        format!("scale_factor={scale}, mode='nearest'")
    }
}

impl<O: Train> Module<O> for Upsample {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let dims = x.dims().to_vec();
        let factors = self.factors(&dims)?;
        let (lead, spatial) = dims.split_at(2);
        let mut split: Vec<usize> = lead.to_vec();
        let mut spread: Vec<usize> = lead.to_vec();
        let mut out: Vec<usize> = lead.to_vec();
        for (&d, &s) in spatial.iter().zip(&factors) {
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
