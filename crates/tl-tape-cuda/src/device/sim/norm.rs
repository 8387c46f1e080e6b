//! Kernel bodies of the norm family (kernels/norm.cu): layer/batch norm statistics, the affine
//! map, the closed-form backward, and the masked row softmax.
//!
//! Orders (the CUDA kernels' in every mode; none of these kernels uses atomics):
//! - statistics and `norm_bwd_x`: one block of [`BLOCK`](super::reduce::BLOCK) threads per
//!   group; the group's sums (`Σ (x − x₀)`, `Σ x̃²`, `Σ ĝ`, `Σ ĝ·x̂`) over its elements in
//!   [`NormLayout::index`] order, folded per thread and then by the block tree
//!   ([`block_sum`]); or, where [`NormLayout::split_parts`] > 1, each sum in that many
//!   chunks of consecutive elements, each chunk as a group is, the chunks' sums added from +0
//!   in increasing order ([`group_sum`]; the `tl_norm_split_*` kernels);
//! - `norm_bwd_affine`: one thread per γ/β entry, accumulating from `0.0` over its elements in
//!   increasing index order (or by one block an entry, [`NormLayout::affine_by_block`], or in
//!   chunks as above, [`NormLayout::affine_split`]);
//! - `masked_softmax_rows`: one block per row, the max over allowed entries with `fmaxf` from
//!   −∞ and the sum of `exp(x − m)` over allowed entries (0 for the others) by the block tree.
//!
//! A group is centred on its first element x₀ (`Centre`): the statistics `[d̄…, rstd…]` hold
//! the mean d̄ of `x − x₀`, and every kernel that normalizes computes `x̃ = (x − x₀) − d̄`, x₀
//! read from x (exact to the rounding of the group's spread, however far its mean is from 0).
//! Where the layout is not [`centred`](NormLayout::centred) (RMS norm) x₀ = d̄ = 0, so
//! `x̃ = (x − 0) − 0 = x` exactly: the mean pass is skipped (the statistics' d̄s are 0), no β
//! is read or added, and `norm_bwd_x` has no `Σ ĝ` term.

use super::reduce::{block_max, block_sum};
use crate::device::{MaskedRows, NormLayout};
use tl_spec::ops::norm::RunningStat;

/// Where group k is centred (`tl_norm_centre`): the shift x₀, its first element (0 for an
/// empty group), and the mean d̄ of `x − x₀`; both 0 where the layout is not centred.
#[derive(Debug, Clone, Copy)]
struct Centre {
    shift: f32,
    shifted_mean: f32,
}

impl Centre {
    /// Group k's centre from the statistics `st` (the shift read from x, d̄ = `st[k]`); x₀ = 0
    /// and d̄ = 0, `st[k]` not read, where `l` is not centred (`tl_norm_kept_shift`,
    /// `tl_norm_kept_mean`).
    fn kept(x: &[f32], l: NormLayout, k: usize, st: &[f32]) -> Centre {
        Centre {
            shift: shift(x, l, k),
            shifted_mean: if l.centred { st[k] } else { 0.0 },
        }
    }

    /// `x̃ = (x − x₀) − d̄`.
    fn of(self, x: f32) -> f32 {
        (x - self.shift) - self.shifted_mean
    }
}

/// Group k's first element, or 0 for an empty group or a layout that is not centred
/// (`tl_norm_shift`).
fn shift(x: &[f32], l: NormLayout, k: usize) -> f32 {
    if l.group_len() == 0 || !l.centred {
        0.0
    } else {
        x[l.index(k, 0)]
    }
}

/// The sum of `f(e)` over a group's `m` elements `e` taken in `parts` chunks of `⌈m/parts⌉`
/// consecutive elements (the last ones short or empty): each chunk by [`block_sum`], the
/// chunks' sums added from +0 in increasing order (`tl_norm_fold` over the `tl_norm_split_*`
/// kernels' parts). With one part, `block_sum(m, f)` (its bits: `+0 + s = s`, and a block
/// tree that starts from +0 never gives −0).
pub fn group_sum(m: usize, parts: usize, f: impl Fn(usize) -> f32) -> f32 {
    if parts <= 1 {
        return block_sum(m, f);
    }
    let chunk = m.div_ceil(parts);
    (0..parts).fold(0.0f32, |acc, p| {
        let lo = (p * chunk).min(m);
        let hi = (lo + chunk).min(m);
        acc + block_sum(hi - lo, |j| f(lo + j))
    })
}

/// Group k's centre and biased variance `max(Σ x̃²/m, 0)`, two passes
/// (`tl_norm_group_moments`, or split: `tl_norm_split_mean`, `tl_norm_split_sq`,
/// `tl_norm_split_finish`); one, `max(Σ x²/m, 0)`, where `l` is not centred (x₀ = d̄ = 0).
fn group_moments(x: &[f32], l: NormLayout, k: usize, parts: usize) -> (Centre, f32) {
    let m = l.group_len();
    let mf = m as f32;
    let x0 = shift(x, l, k);
    let shifted_mean = if l.centred {
        group_sum(m, parts, |e| x[l.index(k, e)] - x0) / mf
    } else {
        0.0
    };
    let c = Centre {
        shift: x0,
        shifted_mean,
    };
    let sq = group_sum(m, parts, |e| {
        let d = c.of(x[l.index(k, e)]);
        d * d
    });
    (c, (sq / mf).max(0.0))
}

/// `out = [d̄…, rstds…]` of the groups of `l`.
pub fn stats(x: &[f32], l: NormLayout, eps: f32, out: &mut [f32]) {
    let (g, parts) = (l.groups, l.split_parts());
    for k in 0..g {
        let (c, var) = group_moments(x, l, k, parts);
        out[k] = c.shifted_mean;
        out[g + k] = 1.0 / (var + eps).sqrt();
    }
}

/// `out = [means…, variances…]` of the groups of `l` (`tl_norm_moments`, `batchMoments`),
/// each mean `x₀ + d̄`; always centred, as the kernel is.
pub fn moments(x: &[f32], l: NormLayout, out: &mut [f32]) {
    let (g, parts) = (l.groups, l.split_parts());
    let l = NormLayout { centred: true, ..l };
    for k in 0..g {
        let (c, var) = group_moments(x, l, k, parts);
        (out[k], out[g + k]) = (c.shift + c.shifted_mean, var);
    }
}

/// `tl_running_update_moments`: per element the rule of
/// [`running_update`](tl_spec::ops::norm::running_update) on the widened operands, rounded once
/// to f32, the running mean from `mo`'s first half ([`RunningStat::Mean`]) and the running
/// variance from its second ([`RunningStat::Variance`] of `count`).
pub fn running_update_moments(
    mean: &[f32],
    var: &[f32],
    mo: &[f32],
    momentum: f64,
    count: usize,
    out_mean: &mut [f32],
    out_var: &mut [f32],
) {
    let rule = |running: f32, stat: f32, kind| {
        tl_spec::ops::norm::running_update(f64::from(running), f64::from(stat), momentum, kind)
            as f32
    };
    let (mu, v) = mo.split_at(mean.len());
    for (i, (om, ov)) in out_mean.iter_mut().zip(out_var.iter_mut()).enumerate() {
        *om = rule(mean[i], mu[i], RunningStat::Mean);
        *ov = rule(var[i], v[i], RunningStat::Variance { count });
    }
}

/// One element of `tl_running_inv_std`: the rule of
/// [`running_inv_std`](tl_spec::ops::norm::running_inv_std) on the widened variance, rounded
/// once to f32.
pub fn running_inv_std(var: f32, eps: f64) -> f32 {
    tl_spec::ops::norm::running_inv_std(f64::from(var), eps) as f32
}

/// `dx = (gμ + 2·gv·(x − μ))/m` per element (`tl_norm_moments_bwd`), μ from `mo`
/// ([`moments`]' output) and `g = [gμ…, gv…]`.
pub fn moments_bwd(x: &[f32], mo: &[f32], g: &[f32], l: NormLayout, dx: &mut [f32]) {
    let mf = l.group_len() as f32;
    for (i, (d, &v)) in dx.iter_mut().zip(x).enumerate() {
        let k = (i / l.seg) % l.groups;
        *d = (g[k] + 2.0 * g[l.groups + k] * (v - mo[k])) / mf;
    }
}

/// `y = x̃·rstd·γ + β` (`tl_norm_affine`); `y = x̃·rstd·γ`, β not read, where `l` is not
/// centred (`tl_norm_scale`).
pub fn apply(x: &[f32], st: &[f32], gamma: &[f32], beta: &[f32], l: NormLayout, y: &mut [f32]) {
    for (i, (o, &v)) in y.iter_mut().zip(x).enumerate() {
        let k = (i / l.seg) % l.groups;
        let f = l.feature_of(i);
        let c = Centre::kept(x, l, k, st);
        let scaled = c.of(v) * st[l.groups + k] * gamma[f];
        *o = if l.centred { scaled + beta[f] } else { scaled };
    }
}

/// `dx = rstd/m · (m·ĝ − Σ ĝ − x̂·Σ ĝ·x̂)` per group; `rstd/m · (m·ĝ − x̂·Σ ĝ·x̂)`, no `Σ ĝ`
/// pass, where `l` is not centred. The sums as [`group_sum`] takes them (`tl_norm_bwd_x`, or
/// split: `tl_norm_split_bwd_sums`, `tl_norm_split_bwd_x`).
pub fn bwd_x(x: &[f32], st: &[f32], gamma: &[f32], g: &[f32], l: NormLayout, dx: &mut [f32]) {
    let (ng, m, parts) = (l.groups, l.group_len(), l.split_parts());
    let mf = m as f32;
    for k in 0..ng {
        let (c, rstd) = (Centre::kept(x, l, k, st), st[ng + k]);
        let gh = |i: usize| g[i] * gamma[l.feature_of(i)];
        let s1 = if l.centred {
            group_sum(m, parts, |e| gh(l.index(k, e)))
        } else {
            0.0
        };
        let s2 = group_sum(m, parts, |e| {
            let i = l.index(k, e);
            gh(i) * (c.of(x[i]) * rstd)
        });
        let scale = rstd / mf;
        for e in 0..m {
            let i = l.index(k, e);
            let h = c.of(x[i]) * rstd;
            let t = mf * g[i] * gamma[l.feature_of(i)];
            let t = if l.centred { t - s1 } else { t };
            dx[i] = scale * (t - h * s2);
        }
    }
}

/// `(dγ, dβ)`: per feature, `Σ g·x̂` (x̂ = x·rstd where `l` is not centred) and `Σ g` in
/// increasing index order — or, where [`NormLayout::affine_split`], each in the group's
/// chunks ([`group_sum`]: `tl_norm_split_affine_sums`, `tl_norm_split_affine_finish`), or,
/// where [`NormLayout::affine_by_block`], each by one block in the block order
/// ([`block_sum`]).
pub fn bwd_affine(
    x: &[f32],
    st: &[f32],
    g: &[f32],
    l: NormLayout,
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let parts = if l.affine_split() { l.split_parts() } else { 1 };
    let by_block = parts > 1 || l.affine_by_block();
    for f in 0..l.features() {
        let terms = |e: usize| {
            let i = l.feature_element(f, e);
            let k = (i / l.seg) % l.groups;
            let h = Centre::kept(x, l, k, st).of(x[i]) * st[l.groups + k];
            (g[i] * h, g[i])
        };
        let n = l.feature_len();
        (dgamma[f], dbeta[f]) = if by_block {
            // Each term once: the kernel's one pass feeds both trees.
            let (tg, tb): (Vec<f32>, Vec<f32>) = (0..n).map(terms).unzip();
            (
                group_sum(n, parts, |e| tg[e]),
                group_sum(n, parts, |e| tb[e]),
            )
        } else {
            (0..n).fold((0.0f32, 0.0f32), |(ag, ab), e| {
                let (tg, tb) = terms(e);
                (ag + tg, ab + tb)
            })
        };
    }
}

/// Masked softmax of each row of `x` (`l.rows` rows of `l.n`), row `r` with mask row
/// [`MaskedRows::mask_row`]`(r)` (`mask`: `l.batch` matrices of `l.m` rows of `l.n`).
pub fn masked_softmax(x: &[f32], mask: &[bool], l: MaskedRows, out: &mut [f32]) {
    let n = l.n.max(1);
    for (r, (xr, yr)) in x.chunks(n).zip(out.chunks_mut(n)).enumerate() {
        let ok = &mask[l.mask_row(r) * n..][..n];
        let m = block_max(n, |j| if ok[j] { xr[j] } else { f32::NEG_INFINITY });
        if m == f32::NEG_INFINITY {
            yr.fill(0.0);
            continue;
        }
        let s = block_sum(n, |j| if ok[j] { (xr[j] - m).exp() } else { 0.0 });
        for ((y, &v), &a) in yr.iter_mut().zip(xr).zip(ok) {
            *y = if a { (v - m).exp() / s } else { 0.0 };
        }
    }
}
