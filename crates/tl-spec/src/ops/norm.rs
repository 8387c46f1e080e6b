//! Layer normalization, channel-first batch normalization and RMS normalization.
//!
//! The first two normalize groups of elements to zero mean and unit variance and then apply a
//! per-feature affine map `y = x̂·γ + β`, with `x̂ = (x − μ)/sqrt(var + ε)`, the biased
//! (population) variance computed in two passes (mean first, then squared deviations) and
//! clamped at ≥ 0. They differ only in which elements form a group and which γ/β entry an
//! element uses:
//!
//! - `layerNorm`: x of any rank ≥ 1; a group is one row of the last axis (length D), γ and β
//!   are (D) and indexed by the column.
//! - `batchnormChannelFirst`: x (C, H, W) or batched (N, C, H, W); a group is one channel over
//!   H·W (times N when batched), γ and β are (C) and indexed by the channel.
//!
//! `rmsNorm` groups as `layerNorm` does but does not centre: `x̂ = x/sqrt(mean(x²) + ε)`, the
//! map `y = x̂·γ` (no β). It is the same rules with μ = 0 and no β term.
//!
//! So the reference value, VJP and JVP are written once over a [`Groups`] description.

use super::same_shape;
use crate::alloc::try_collect;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Check ε: finite and > 0.
pub fn norm_params(op: &'static str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(Error::param(
            op,
            format!("eps must be finite and > 0, got {eps}"),
        ))
    }
}

fn check_affine(op: &'static str, what: &str, len: usize, g: &Shape, b: &Shape) -> Result<()> {
    if g.dims() == [len] && b.dims() == [len] {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("gamma and beta must be ({len}) for {what}, got {g} and {b}"),
        ))
    }
}

/// Shape rule of `layerNorm(x, gamma, beta)`: x of rank ≥ 1 with a non-empty last axis D,
/// gamma and beta (D); output shaped like x.
pub fn layer_norm_shape(x: &Shape, gamma: &Shape, beta: &Shape) -> Result<Shape> {
    let op = "layerNorm";
    let d = normalized_axis(op, x)?;
    check_affine(op, &format!("x {x}"), d, gamma, beta)?;
    Ok(x.clone())
}

/// The length D of x's last axis, the one `layerNorm` and `rmsNorm` normalize: x must have
/// rank ≥ 1 and D > 0.
fn normalized_axis(op: &'static str, x: &Shape) -> Result<usize> {
    match x.dims().last() {
        None => Err(Error::shape(op, format!("x must have rank ≥ 1, got {x}"))),
        Some(0) => Err(Error::shape(
            op,
            format!("the normalized (last) axis must be non-empty, got x {x}"),
        )),
        Some(&d) => Ok(d),
    }
}

/// Shape rule of `rmsNorm(x, gamma)`: x of rank ≥ 1 with a non-empty last axis D, gamma (D);
/// output shaped like x.
pub fn rms_norm_shape(x: &Shape, gamma: &Shape) -> Result<Shape> {
    let op = "rmsNorm";
    let d = normalized_axis(op, x)?;
    if gamma.dims() != [d] {
        return Err(Error::shape(
            op,
            format!("gamma must be ({d}) for x {x}, got {gamma}"),
        ));
    }
    Ok(x.clone())
}

/// Shape rule of `batchnormChannelFirst(x, gamma, beta)`: x (C, H, W) or (N, C, H, W) with
/// N·H·W > 0, gamma and beta (C); output shaped like x.
pub fn batch_norm_shape(x: &Shape, gamma: &Shape, beta: &Shape) -> Result<Shape> {
    let op = "batchnormChannelFirst";
    let c = channel_dims(op, x)?;
    check_affine(op, &format!("{c} channels of x {x}"), c, gamma, beta)?;
    Ok(x.clone())
}

/// Shape rule of `batchMoments(x)`: x (C, H, W) or (N, C, H, W) with N·H·W > 0; output (2, C)
/// (row 0 the means, row 1 the biased variances).
pub fn batch_moments_shape(x: &Shape) -> Result<Shape> {
    let c = channel_dims("batchMoments", x)?;
    Ok(Shape::new(&[2, c]))
}

/// C of a channel-first x (C, H, W) or (N, C, H, W) whose per-channel groups are non-empty.
fn channel_dims(op: &'static str, x: &Shape) -> Result<usize> {
    x.check_size(op)?;
    // Saturating: with C = 0, H·W may overflow ([1, 0, 2⁶², 2⁶²] holds no element).
    let hw = |h: usize, w: usize| Shape::saturating_product(&[h, w]);
    let (n, c, hw) = match *x.dims() {
        [c, h, w] => (1, c, hw(h, w)),
        [n, c, h, w] => (n, c, hw(h, w)),
        _ => {
            return Err(Error::shape(
                op,
                format!("x must be (C, H, W) or (N, C, H, W), got {x}"),
            ));
        }
    };
    if n == 0 || hw == 0 {
        return Err(Error::shape(
            op,
            format!("statistics are taken over N·H·W elements, which is 0 for x {x}"),
        ));
    }
    Ok(c)
}

/// Which elements are normalized together: element `i` lies in group `group(i)` and uses
/// γ/β entry `group`'s feature `feature(i)`; and whether each group is centred on its mean
/// (`layerNorm`, `batchnormChannelFirst`) or not (`rmsNorm`: μ = 0).
#[derive(Debug, Clone, Copy)]
pub struct Groups {
    /// Rows of the last axis (layer and RMS norm) or channels (batch norm).
    kind: Kind,
    /// Whether μ is the group's mean (else 0).
    centred: bool,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Rows { d: usize },
    Channels { c: usize, hw: usize },
}

impl Groups {
    /// The groups of `layerNorm` on x (rank ≥ 1).
    pub fn layer(x: &Shape) -> Groups {
        Groups {
            kind: Kind::Rows {
                d: x.rows_cols().1.max(1),
            },
            centred: true,
        }
    }

    /// The groups of `rmsNorm` on x (rank ≥ 1): the rows of [`Groups::layer`], not centred.
    pub fn rms(x: &Shape) -> Groups {
        Groups {
            centred: false,
            ..Groups::layer(x)
        }
    }

    /// The groups of `batchnormChannelFirst` on x (C, H, W) or (N, C, H, W).
    pub fn channels(x: &Shape) -> Groups {
        let d = x.dims();
        let r = d.len();
        let (c, hw) = if r >= 3 {
            // Saturating: with C = 0 the product may overflow (no element is read then).
            (d[r - 3], Shape::saturating_product(&d[r - 2..]))
        } else {
            (1, x.numel())
        };
        Groups {
            kind: Kind::Channels {
                c: c.max(1),
                hw: hw.max(1),
            },
            centred: true,
        }
    }

    fn count(&self, numel: usize) -> usize {
        match self.kind {
            Kind::Rows { d } => numel / d,
            Kind::Channels { c, .. } => c,
        }
    }

    /// (group, feature) of element `i`.
    fn of(&self, i: usize) -> (usize, usize) {
        match self.kind {
            Kind::Rows { d } => (i / d, i % d),
            Kind::Channels { c, hw } => {
                let ch = (i / hw) % c;
                (ch, ch)
            }
        }
    }
}

/// Per-group mean (0 where not centred) and 1/sqrt(var + ε), and x̂ per element; `var` is
/// `mean((x − μ)²)`.
struct Stats<T> {
    mean: Vec<T>,
    rstd: Vec<T>,
    xhat: Vec<T>,
    count: Vec<T>,
}

fn stats<T: Scalar>(x: &Tensor<T>, gr: Groups, eps: T) -> Result<Stats<T>> {
    let ng = gr.count(x.numel());
    let mut sum = vec![T::zero(); ng];
    let mut cnt = vec![0usize; ng];
    for (i, &v) in x.data().iter().enumerate() {
        let (g, _) = gr.of(i);
        sum[g] += v;
        cnt[g] += 1;
    }
    let count: Vec<T> = cnt.iter().map(|&c| T::lit(c.max(1) as f64)).collect();
    let mean: Vec<T> = match gr.centred {
        true => sum.iter().zip(&count).map(|(&s, &c)| s / c).collect(),
        false => vec![T::zero(); ng],
    };
    let mut sq = vec![T::zero(); ng];
    for (i, &v) in x.data().iter().enumerate() {
        let (g, _) = gr.of(i);
        sq[g] += (v - mean[g]) * (v - mean[g]);
    }
    let rstd: Vec<T> = sq
        .iter()
        .zip(&count)
        .map(|(&s, &c)| T::one() / ((s / c).max(T::zero()) + eps).sqrt())
        .collect();
    let xhat = (x.data().iter().enumerate()).map(|(i, &v)| {
        let (g, _) = gr.of(i);
        (v - mean[g]) * rstd[g]
    });
    let xhat = try_collect("normalize", "normalized input", x.numel(), xhat)?;
    Ok(Stats {
        mean,
        rstd,
        xhat,
        count,
    })
}

/// `(x − μ)/sqrt(var + ε)·γ + β` over the groups `gr` (β absent for `rmsNorm`).
pub fn normalize<T: Scalar>(
    gr: Groups,
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    beta: Option<&Tensor<T>>,
    eps: T,
) -> Result<Tensor<T>> {
    let st = stats(x, gr, eps)?;
    let y = (st.xhat.iter().enumerate()).map(|(i, &h)| {
        let (_, f) = gr.of(i);
        let y = h * gamma.data()[f];
        beta.map_or(y, |b| y + b.data()[f])
    });
    Tensor::new(
        x.shape().clone(),
        try_collect("normalize", "output", x.numel(), y)?,
    )
}

/// The cotangents `(dx, dγ, dβ)` of a normalization, dβ absent where it has no β.
pub type NormGrads<T> = (Tensor<T>, Tensor<T>, Option<Tensor<T>>);

/// VJP of [`normalize`]: `(dx, dγ, dβ)` with `dβ = Σ g`, `dγ = Σ g·x̂` (per feature) and, per
/// group of m elements, `dx = rstd/m · (m·ĝ − Σ ĝ − x̂ Σ ĝ·x̂)` where `ĝ = g·γ`. Not centred
/// (`rmsNorm`): `dx = rstd/m · (m·ĝ − x̂ Σ ĝ·x̂)` (μ = 0 takes no gradient), and no dβ
/// (`has_beta` false).
pub fn normalize_vjp<T: Scalar>(
    gr: Groups,
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    has_beta: bool,
    eps: T,
    g: &Tensor<T>,
) -> Result<NormGrads<T>> {
    same_shape("normalize", x, g)?;
    let st = stats(x, gr, eps)?;
    let ng = st.mean.len();
    let mut dgamma = vec![T::zero(); gamma.numel()];
    let mut dbeta = vec![T::zero(); gamma.numel()];
    let (mut s1, mut s2) = (vec![T::zero(); ng], vec![T::zero(); ng]);
    for (i, (&gi, &h)) in g.data().iter().zip(&st.xhat).enumerate() {
        let (grp, f) = gr.of(i);
        dbeta[f] += gi;
        dgamma[f] += gi * h;
        let gh = gi * gamma.data()[f];
        s1[grp] += gh;
        s2[grp] += gh * h;
    }
    let dx = (g.data().iter().zip(&st.xhat).enumerate()).map(|(i, (&gi, &h))| {
        let (grp, f) = gr.of(i);
        let m = st.count[grp];
        let mean_term = if gr.centred { s1[grp] } else { T::zero() };
        st.rstd[grp] / m * (m * gi * gamma.data()[f] - mean_term - h * s2[grp])
    });
    let dx = try_collect("normalize", "gradient", x.numel(), dx)?;
    let dbeta = match has_beta {
        true => Some(Tensor::new(gamma.shape().clone(), dbeta)?),
        false => None,
    };
    Ok((
        Tensor::new(x.shape().clone(), dx)?,
        Tensor::new(gamma.shape().clone(), dgamma)?,
        dbeta,
    ))
}

/// JVP of [`normalize`]: `dy = dx̂·γ + x̂·dγ + dβ` with, per group,
/// `dx̂ = rstd·(dx − mean(dx) − x̂·rstd·mean((x−μ)·dx))`; not centred (`rmsNorm`, no dβ):
/// `dx̂ = rstd·(dx − x̂·rstd·mean(x·dx))`.
#[allow(clippy::too_many_arguments)]
pub fn normalize_jvp<T: Scalar>(
    gr: Groups,
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    eps: T,
    dx: &Tensor<T>,
    dgamma: &Tensor<T>,
    dbeta: Option<&Tensor<T>>,
) -> Result<Tensor<T>> {
    same_shape("normalize", x, dx)?;
    let st = stats(x, gr, eps)?;
    let ng = st.mean.len();
    let (mut dmean, mut cov) = (vec![T::zero(); ng], vec![T::zero(); ng]);
    for (i, (&v, &d)) in x.data().iter().zip(dx.data()).enumerate() {
        let (grp, _) = gr.of(i);
        if gr.centred {
            dmean[grp] += d / st.count[grp];
        }
        cov[grp] += (v - st.mean[grp]) * d / st.count[grp];
    }
    let dy = (dx.data().iter().zip(&st.xhat).enumerate()).map(|(i, (&d, &h))| {
        let (grp, f) = gr.of(i);
        let r = st.rstd[grp];
        let dh = r * (d - dmean[grp] - h * r * cov[grp]);
        let dy = dh * gamma.data()[f] + h * dgamma.data()[f];
        dbeta.map_or(dy, |b| dy + b.data()[f])
    });
    Tensor::new(
        x.shape().clone(),
        try_collect("normalize", "tangent", x.numel(), dy)?,
    )
}

/// `layerNorm` over the last axis. PyTorch: `F.layer_norm(x, (D,), gamma, beta, eps)` (whose
/// default ε is 1e-5; ours is 1e-6).
pub fn layer_norm<T: Scalar>(
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    beta: &Tensor<T>,
    eps: T,
) -> Result<Tensor<T>> {
    layer_norm_shape(x.shape(), gamma.shape(), beta.shape())?;
    normalize(Groups::layer(x.shape()), x, gamma, Some(beta), eps)
}

/// `rmsNorm` over the last axis: `x/sqrt(mean(x²) + ε)·γ`. PyTorch: `F.rms_norm(x, (D,),
/// gamma, eps)` (whose default ε, `None`, is the dtype's machine epsilon).
pub fn rms_norm<T: Scalar>(x: &Tensor<T>, gamma: &Tensor<T>, eps: T) -> Result<Tensor<T>> {
    rms_norm_shape(x.shape(), gamma.shape())?;
    normalize(Groups::rms(x.shape()), x, gamma, None, eps)
}

/// `batchnormChannelFirst` with batch statistics. PyTorch: `F.batch_norm(x, None, None, gamma,
/// beta, training=True, eps=eps)` on (N, C, H, W) (an unbatched x is one sample).
pub fn batch_norm<T: Scalar>(
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    beta: &Tensor<T>,
    eps: T,
) -> Result<Tensor<T>> {
    batch_norm_shape(x.shape(), gamma.shape(), beta.shape())?;
    normalize(Groups::channels(x.shape()), x, gamma, Some(beta), eps)
}

/// `batchMoments`: the per-channel batch mean and biased (population) variance of x (C, H, W)
/// or (N, C, H, W), as (2, C): row 0 the means, row 1 the variances, over each channel's
/// m = N·H·W elements, two passes, the variance clamped at ≥ 0 (the statistics
/// `batchnormChannelFirst` normalizes with). PyTorch: `torch.var_mean(x, dim=(0, 2, 3),
/// unbiased=False)` stacked as (mean, var); `nn.BatchNorm2d` updates its running
/// statistics from these (the variance scaled by m/(m − 1)).
pub fn batch_moments<T: Scalar>(x: &Tensor<T>) -> Result<Tensor<T>> {
    let out = batch_moments_shape(x.shape())?;
    let (mean, var) = moments(x, out.dims()[1]);
    Tensor::new(out, mean.into_iter().chain(var).collect())
}

/// Per-channel means and biased variances (two passes, clamped at ≥ 0) of x (…, C, H, W).
fn moments<T: Scalar>(x: &Tensor<T>, c: usize) -> (Vec<T>, Vec<T>) {
    let gr = Groups::channels(x.shape());
    let (mut sum, mut cnt) = (vec![T::zero(); c], vec![0usize; c]);
    for (i, &v) in x.data().iter().enumerate() {
        let (g, _) = gr.of(i);
        sum[g] += v;
        cnt[g] += 1;
    }
    let count: Vec<T> = cnt.iter().map(|&n| T::lit(n.max(1) as f64)).collect();
    let mean: Vec<T> = sum.iter().zip(&count).map(|(&s, &n)| s / n).collect();
    let mut sq = vec![T::zero(); c];
    for (i, &v) in x.data().iter().enumerate() {
        let (g, _) = gr.of(i);
        sq[g] += (v - mean[g]) * (v - mean[g]);
    }
    let var = (sq.iter().zip(&count))
        .map(|(&s, &n)| (s / n).max(T::zero()))
        .collect();
    (mean, var)
}

/// VJP of [`batch_moments`]: with g = (gμ, gv) (2, C), per channel of m elements
/// `dx = (gμ + 2·gv·(x − μ))/m`.
pub fn batch_moments_vjp<T: Scalar>(x: &Tensor<T>, g: &Tensor<T>) -> Result<Tensor<T>> {
    let out = batch_moments_shape(x.shape())?;
    if g.shape() != &out {
        return Err(Error::shape(
            "batchMoments",
            format!(
                "cotangent has shape {}, expected {out} for x {}",
                g.shape(),
                x.shape()
            ),
        ));
    }
    let c = out.dims()[1];
    let (mean, _) = moments(x, c);
    let m = T::lit((x.numel() / c) as f64);
    let gr = Groups::channels(x.shape());
    let two = T::lit(2.0);
    let dx = (x.data().iter().enumerate()).map(|(i, &v)| {
        let (k, _) = gr.of(i);
        (g.data()[k] + two * g.data()[c + k] * (v - mean[k])) / m
    });
    Tensor::new(
        x.shape().clone(),
        try_collect("batchMoments", "gradient", x.numel(), dx)?,
    )
}

/// JVP of [`batch_moments`]: per channel, `dμ = mean(dx)` and `dvar = 2·mean((x − μ)·dx)`.
pub fn batch_moments_jvp<T: Scalar>(x: &Tensor<T>, dx: &Tensor<T>) -> Result<Tensor<T>> {
    same_shape("batchMoments", x, dx)?;
    let out = batch_moments_shape(x.shape())?;
    let c = out.dims()[1];
    let (mean, _) = moments(x, c);
    let m = T::lit((x.numel() / c) as f64);
    let gr = Groups::channels(x.shape());
    let (mut dm, mut dv) = (vec![T::zero(); c], vec![T::zero(); c]);
    for (i, (&v, &d)) in x.data().iter().zip(dx.data()).enumerate() {
        let (k, _) = gr.of(i);
        dm[k] += d;
        dv[k] += (v - mean[k]) * d;
    }
    let two = T::lit(2.0);
    let data = (dm.iter().map(|&s| s / m))
        .chain(dv.iter().map(|&s| two * s / m))
        .collect();
    Tensor::new(out, data)
}

/// Which batch statistic a running-statistics update folds into its buffer
/// ([`running_update`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunningStat {
    /// A batch mean, folded in as it is (a NaN mean makes the running mean NaN).
    Mean,
    /// A biased (population) batch variance of `count` elements per entry, folded in as the
    /// unbiased `var·count/(count − 1)`; where that is NaN (`count` ≤ 1, or a NaN variance)
    /// the running value is kept.
    Variance {
        /// The elements each variance was taken over (N·H·W for a batch norm).
        count: usize,
    },
}

/// Check a running-statistics momentum: finite and in [0, 1].
pub fn running_momentum(op: &'static str, momentum: f64) -> Result<()> {
    if (0.0..=1.0).contains(&momentum) {
        Ok(())
    } else {
        Err(Error::param(
            op,
            format!("momentum must be in [0, 1], got {momentum}"),
        ))
    }
}

/// One element of PyTorch's running-statistics update, in f64: `(1 − momentum)·running +
/// momentum·s`, with `s` the statistic as [`RunningStat`] says (a variance made unbiased, a NaN
/// one keeping `running`). Every backend computes this in f64 and rounds the result once to
/// the buffer's type. PyTorch: `running.mul_(1 − m).add_(s, alpha=m)` in `nn.BatchNorm2d`'s
/// training forward.
pub fn running_update(running: f64, stat: f64, momentum: f64, kind: RunningStat) -> f64 {
    let s = match kind {
        RunningStat::Mean => stat,
        RunningStat::Variance { count } if count > 1 => stat * count as f64 / (count - 1) as f64,
        RunningStat::Variance { .. } => return running,
    };
    if s.is_nan() && kind != RunningStat::Mean {
        running
    } else {
        (1.0 - momentum) * running + momentum * s
    }
}

/// BatchNorm's eval scale from a running variance, in f64: `1/sqrt(var + eps)`. Every backend
/// computes this in f64 and rounds the result once to its type, so an eval pass normalises
/// with the same scale wherever the running variance lives. PyTorch: `torch.rsqrt(running_var
/// + eps)` in `F.batch_norm`'s eval mode (in the tensor's type).
pub fn running_inv_std(var: f64, eps: f64) -> f64 {
    1.0 / (var + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_by_hand() {
        // Row [1, 2, 3, 6]: μ = 3, var = (4 + 1 + 0 + 9)/4 = 3.5.
        let x = Tensor::<f64>::new([1, 4], vec![1.0, 2.0, 3.0, 6.0]).unwrap();
        let g = Tensor::vector(vec![1.0, 2.0, 1.0, 0.5]);
        let b = Tensor::vector(vec![0.0, 0.0, 1.0, -1.0]);
        let y = layer_norm(&x, &g, &b, 1e-6).unwrap();
        let r = 1.0 / (3.5f64 + 1e-6).sqrt();
        let want = [-2.0 * r, -2.0 * r, 1.0, 1.5 * r - 1.0];
        for (a, w) in y.data().iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{a} vs {w}");
        }
    }

    #[test]
    fn an_rms_row_by_hand() {
        // Row [1, 2, 2, 4]: mean(x²) = (1 + 4 + 4 + 16)/4 = 6.25, r = 1/√(6.25 + ε).
        let x = Tensor::<f64>::new([1, 4], vec![1.0, 2.0, 2.0, 4.0]).unwrap();
        let g = Tensor::vector(vec![1.0, 2.0, -1.0, 0.5]);
        let eps = 1e-6;
        let y = rms_norm(&x, &g, eps).unwrap();
        let r = 1.0 / (6.25f64 + eps).sqrt();
        let want = [r, 4.0 * r, -2.0 * r, 2.0 * r];
        for (a, w) in y.data().iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{a} vs {w}");
        }
        // VJP against central differences of Σ c·y, and no dβ.
        let c = Tensor::<f64>::new([1, 4], vec![0.3, -1.0, 0.7, 2.0]).unwrap();
        let gr = Groups::rms(x.shape());
        let (dx, dg, db) = normalize_vjp(gr, &x, &g, false, eps, &c).unwrap();
        assert!(db.is_none());
        let f = |x: &Tensor<f64>, g: &Tensor<f64>| -> f64 {
            let y = rms_norm(x, g, eps).unwrap();
            y.data().iter().zip(c.data()).map(|(a, b)| a * b).sum()
        };
        let h = 1e-6;
        for i in 0..4 {
            let mut xp = x.data().to_vec();
            let mut xm = xp.clone();
            (xp[i], xm[i]) = (xp[i] + h, xm[i] - h);
            let (xp, xm) = (
                Tensor::new([1, 4], xp).unwrap(),
                Tensor::new([1, 4], xm).unwrap(),
            );
            let fd = (f(&xp, &g) - f(&xm, &g)) / (2.0 * h);
            assert!(
                (dx.data()[i] - fd).abs() < 1e-7,
                "dx[{i}] {} vs {fd}",
                dx.data()[i]
            );
            // dγ_i = c_i·x̂_i.
            assert!((dg.data()[i] - c.data()[i] * x.data()[i] * r).abs() < 1e-12);
        }
        // JVP along dx = c (dγ = 0) equals ⟨VJP, c⟩ paired with the VJP of the same cotangent.
        let zero = Tensor::vector(vec![0.0; 4]);
        let t = normalize_jvp(gr, &x, &g, eps, &c, &zero, None).unwrap();
        let lhs: f64 = t.data().iter().zip(c.data()).map(|(a, b)| a * b).sum();
        let rhs: f64 = dx.data().iter().zip(c.data()).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-12, "{lhs} vs {rhs}");
    }

    #[test]
    fn bad_params_and_shapes_are_errors() {
        assert!(norm_params("layerNorm", 0.0).is_err());
        assert!(norm_params("layerNorm", f64::NAN).is_err());
        let s = |d: &[usize]| Shape::new(d);
        assert!(layer_norm_shape(&s(&[2, 0]), &s(&[0]), &s(&[0])).is_err());
        assert!(layer_norm_shape(&s(&[2, 3]), &s(&[2]), &s(&[3])).is_err());
        assert!(rms_norm_shape(&s(&[2, 3]), &s(&[3])).is_ok());
        let e = rms_norm_shape(&s(&[2, 3]), &s(&[2]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rmsNorm") && e.contains("[2, 3]"), "{e}");
        assert!(rms_norm_shape(&s(&[2, 0]), &s(&[0])).is_err());
        assert!(rms_norm_shape(&s(&[]), &s(&[1])).is_err());
        assert!(batch_norm_shape(&s(&[2, 0, 3]), &s(&[2]), &s(&[2])).is_err());
        assert!(batch_norm_shape(&s(&[2, 3]), &s(&[2]), &s(&[2])).is_err());
        assert!(batch_norm_shape(&s(&[4, 2, 1, 3]), &s(&[2]), &s(&[2])).is_ok());
        assert_eq!(batch_moments_shape(&s(&[4, 2, 1, 3])).unwrap(), s(&[2, 2]));
        assert_eq!(batch_moments_shape(&s(&[3, 1, 1])).unwrap(), s(&[2, 3]));
        let e = batch_moments_shape(&s(&[2, 3])).unwrap_err().to_string();
        assert!(e.contains("batchMoments") && e.contains("[2, 3]"), "{e}");
        assert!(batch_moments_shape(&s(&[0, 2, 1, 1])).is_err());
    }

    #[test]
    fn batch_moments_by_hand() {
        // (N=2, C=2, 1, 2): channel 0 holds 1, 2, 5, 8 (μ = 4, var = (9+4+1+16)/4 = 7.5),
        // channel 1 holds 3, 3, 3, 3 (μ = 3, var = 0).
        let x =
            Tensor::<f64>::new([2, 2, 1, 2], vec![1.0, 2.0, 3.0, 3.0, 5.0, 8.0, 3.0, 3.0]).unwrap();
        let y = batch_moments(&x).unwrap();
        assert_eq!(y.shape().dims(), [2, 2]);
        assert_eq!(y.data(), [4.0, 3.0, 7.5, 0.0]);
        // VJP with gμ = (1, 0), gv = (1, 0): dx = (1 + 2(x − 4))/4 on channel 0, 0 elsewhere.
        let g = Tensor::new([2, 2], vec![1.0, 0.0, 1.0, 0.0]).unwrap();
        let dx = batch_moments_vjp(&x, &g).unwrap();
        assert_eq!(dx.data(), [-1.25, -0.75, 0.0, 0.0, 0.75, 2.25, 0.0, 0.0]);
        assert!(batch_moments_vjp(&x, &x).is_err());
    }

    #[test]
    fn running_inv_std_by_hand() {
        assert_eq!(running_inv_std(3.0, 1.0), 0.5);
        assert_eq!(running_inv_std(0.0, 0.25), 2.0);
    }

    #[test]
    fn running_update_by_hand() {
        let var = |count| RunningStat::Variance { count };
        // 0.9·1 + 0.1·3 and the unbiased 2·4/3.
        assert_eq!(
            running_update(1.0, 3.0, 0.1, RunningStat::Mean),
            0.9 * 1.0 + 0.1 * 3.0
        );
        assert_eq!(
            running_update(1.0, 2.0, 0.1, var(4)),
            0.9 * 1.0 + 0.1 * (2.0 * 4.0 / 3.0)
        );
        // One element, or a NaN variance: kept; a NaN mean propagates.
        assert_eq!(running_update(1.5, 2.0, 0.1, var(1)), 1.5);
        assert_eq!(running_update(1.5, f64::NAN, 0.1, var(8)), 1.5);
        assert!(running_update(1.5, f64::NAN, 0.1, RunningStat::Mean).is_nan());
        assert!(running_momentum("m", 0.0).is_ok() && running_momentum("m", 1.0).is_ok());
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = running_momentum("update_running", bad)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("update_running") && e.contains("momentum"),
                "{e}"
            );
        }
    }
}
