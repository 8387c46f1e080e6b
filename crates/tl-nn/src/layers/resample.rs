//! What [`Upsample`](super::Upsample)'s interpolation and
//! [`AdaptiveAvgPool`](super::AdaptiveAvgPool) share: a constant matrix applied along one axis,
//! and linear interpolation's weights.

use tl_session::Train;
use tl_spec::{Scalar, Tensor};

use crate::error::dims_product;
use crate::{Result, Var};

/// `m` (d, o) applied along axis `axis` of x: (pre, d, post) → (pre, o, post), one `matmul`
/// (the axis moved last and back with `swapLastTwo` where it is not last already). An empty x
/// whose pre or post overflows is an error naming `what`.
pub(super) fn along_axis<'g, O: Train>(
    what: &'static str,
    x: &Var<'g, O>,
    axis: usize,
    m: Tensor<O::T>,
) -> Result<Var<'g, O>> {
    let dims = x.dims().to_vec();
    let (d, o) = (dims[axis], m.shape().dims()[1]);
    let pre = dims_product(what, x.shape(), &dims[..axis])?;
    let post = dims_product(what, x.shape(), &dims[axis + 1..])?;
    let m = x.scope().constant(m)?;
    let mut out = dims.clone();
    out[axis] = o;
    if post == 1 {
        return x.reshape(&[pre, d])?.matmul(&m)?.reshape(&out);
    }
    let last = x.reshape(&[pre, d, post])?.swap_last_two()?;
    let y = last
        .reshape(&[dims_product(what, x.shape(), &[pre, post])?, d])?
        .matmul(&m)?;
    y.reshape(&[pre, post, o])?.swap_last_two()?.reshape(&out)
}

/// A (d, o) matrix of zeros, its size checked against the allocation cap first.
pub(super) fn zero_matrix<T: Scalar>(what: &'static str, d: usize, o: usize) -> Result<Vec<T>> {
    Ok(tl_spec::alloc::try_zeroed(
        what,
        "resampling weights",
        d.saturating_mul(o),
    )?)
}

/// The (d, d·s) matrix of linear interpolation by the whole factor `s` along an axis of d
/// cells, PyTorch's (`upsample_linear1d`, `upsample_bilinear2d`, …): output cell j reads the
/// source position `src = (j + ½)/s − ½` clamped at 0 (`align_corners` false) or
/// `src = j·(d − 1)/(d·s − 1)` (true; 0 for one output cell), and weighs cells `i = ⌊src⌋`
/// and `min(i + 1, d − 1)` by `1 − λ` and `λ = src − i`. The weights are computed in f64 and
/// rounded once to `T`.
pub(super) fn linear_weights<T: Scalar>(
    d: usize,
    s: usize,
    align_corners: bool,
) -> Result<Tensor<T>> {
    let o = d.saturating_mul(s);
    let mut m: Vec<T> = zero_matrix("Upsample::forward", d, o)?;
    for j in 0..o {
        let src = if align_corners {
            if o > 1 {
                j as f64 * (d - 1) as f64 / (o - 1) as f64
            } else {
                0.0
            }
        } else {
            ((j as f64 + 0.5) / s as f64 - 0.5).max(0.0)
        };
        let i = (src as usize).min(d - 1);
        let next = (i + 1).min(d - 1);
        let lambda = src - i as f64;
        m[i * o + j] += T::lit(1.0 - lambda);
        m[next * o + j] += T::lit(lambda);
    }
    Ok(Tensor::new([d, o], m)?)
}
