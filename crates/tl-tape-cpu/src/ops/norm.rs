//! `layerNorm`, `rmsNorm` and `batchnormChannelFirst`, forward and backward, two passes per
//! group (one for `rmsNorm`).
//!
//! Per group (a row of the last axis for layer norm; a channel over N·H·W for batch norm), the
//! statistics of the group shifted by its first element x₀ (`Centre`): pass 1 the mean
//! `d̄ = Σ(x−x₀)/m`, pass 2 the biased variance `Σ((x−x₀)−d̄)²/m` (clamped ≥ 0); then
//! `y = x̃·rstd·γ + β` with the centred value `x̃ = (x−x₀)−d̄` and `rstd = 1/sqrt(var + ε)`.
//! The shift keeps `x̃` exact to f32's rounding of the group's spread however far its mean is
//! from 0 (an f32 mean μ of a group near 1e3 is off by up to half an ulp of 1e3, an error every
//! `x − μ` carries). The backward applies, with `x̂ = x̃·rstd` and `ĝ = g·γ`:
//! `dβ = Σ g`, `dγ = Σ g·x̂`, `dx = rstd/m · (m·ĝ − Σ ĝ − x̂·Σ ĝ·x̂)`; it reads each group's
//! (d̄, rstd) from what [`forward_saving`] kept (PyTorch keeps its mean and rstd), or computes
//! them again (same bits). Each runs as one kernel each way inside [`crate::simd::vectorize`]
//! (layer norm's `rows`, batch norm's `channels`), every sum in eight lanes per segment
//! (`lanes`), the segments added in order.
//!
//! `rmsNorm` is layer norm's kernel without centring (`Layout::centred` false): x₀ = d̄ = 0, so
//! pass 1 is skipped and `x̃ = x`, the "variance" is `Σ x²/m`; no β (`y = x·rstd·γ`), and the
//! backward drops the `Σ ĝ` term: `dx = rstd/m · (m·ĝ − x̂·Σ ĝ·x̂)`, `dγ = Σ g·x̂`. Its kept
//! statistics have layer norm's form (`[0, rstd₀, 0, rstd₁, …]`).
//!
//! `batchMoments` is the statistics alone: per channel the mean `x₀ + d̄` and the biased
//! variance of the same two passes (`[μ…, var…]`, shaped (2, C)), and the backward
//! `dx = (gμ + 2·gv·(x − μ))/m`.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Tensor};

use super::{Grads, check_arity, check_saved, check_shape, tensor, wrong_family};
use crate::Result;

/// How x is laid out into groups: `outer` blocks of `c` groups of `seg` contiguous elements;
/// group k's elements are the k-th segment of every block.
#[derive(Debug, Clone, Copy)]
struct Layout {
    outer: usize,
    c: usize,
    seg: usize,
    /// Layer and RMS norm (one group per row, γ/β indexed by column: [`rows`]); batch norm:
    /// one group per channel, γ/β indexed by group ([`channels`]).
    per_column: bool,
    /// Whether each group is centred on its mean and a β is added (not for `rmsNorm`).
    centred: bool,
}

impl Layout {
    fn of<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(Layout, T)> {
        check_arity(op, x)?;
        // x, γ (and β): no heap allocation on the norms' every call.
        let shapes: smallvec::SmallVec<[&tl_spec::Shape; 3]> =
            x.iter().map(|t| t.shape()).collect();
        op.infer_shape(&shapes).map_err(|e| match e {
            tl_ir::Error::Spec(s) => crate::Error::from(s),
            other => SpecError::shape(op.name(), other.to_string()).into(),
        })?;
        let d = x[0].shape().dims();
        match *op {
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
                let (rows, cols) = x[0].shape().rows_cols();
                let l = Layout {
                    outer: 1,
                    c: rows,
                    seg: cols,
                    per_column: true,
                    centred: matches!(op, Op::LayerNorm { .. }),
                };
                Ok((l, T::lit(eps)))
            }
            Op::BatchNorm { eps } => {
                let r = d.len();
                let outer = if r == 4 { d[0] } else { 1 };
                let l = Layout {
                    outer,
                    c: d[r - 3],
                    seg: d[r - 2] * d[r - 1],
                    per_column: false,
                    centred: true,
                };
                Ok((l, T::lit(eps)))
            }
            _ => Err(wrong_family(op, "norm")),
        }
    }

    /// The segments of group k, as ranges into the data.
    #[inline(always)]
    fn segs(&self, k: usize) -> impl Iterator<Item = std::ops::Range<usize>> + Clone + '_ {
        (0..self.outer).map(move |o| {
            let start = (o * self.c + k) * self.seg;
            start..start + self.seg
        })
    }

    /// Group k's shift x₀ ([`Centre`]): its first element, 0 for an empty group or where not
    /// centred.
    #[inline(always)]
    fn shift<T: Scalar>(&self, k: usize, x: &[T]) -> T {
        if self.centred && self.outer > 0 && self.seg > 0 {
            x[k * self.seg]
        } else {
            T::zero()
        }
    }

    #[inline(always)]
    fn count<T: Scalar>(&self) -> T {
        T::lit((self.outer * self.seg).max(1) as f64)
    }
}

/// Where a group is centred: the shift x₀ (its first element; 0 for an empty group) and the
/// mean d̄ of `x − x₀`; the centred value of x is `(x − x₀) − d̄`.
#[derive(Debug, Clone, Copy)]
struct Centre<T> {
    shift: T,
    shifted_mean: T,
}

impl<T: Scalar> Centre<T> {
    /// `x − μ` as `(x − x₀) − d̄`.
    #[inline(always)]
    fn of(self, x: T) -> T {
        (x - self.shift) - self.shifted_mean
    }

    /// Group k's centre from its kept d̄ (the shift read from x).
    #[inline(always)]
    fn kept(l: &Layout, k: usize, x: &[T], shifted_mean: T) -> Self {
        Centre {
            shift: l.shift(k, x),
            shifted_mean,
        }
    }

    /// The group's mean `x₀ + d̄`, rounded once.
    fn mean(self) -> T {
        self.shift + self.shifted_mean
    }
}

/// The centre and 1/sqrt(var + ε) of group k, in two passes.
#[inline(always)]
fn stats<T: Scalar>(l: &Layout, k: usize, x: &[T], eps: T) -> (Centre<T>, T) {
    let (c, var) = moments(l, k, x);
    (c, rstd(var, eps))
}

/// [`stats`] of group k with its centred values x̃ written into `y`'s elements of the group
/// on the way (the forward's output, which the affine map then reads): the same bits, the
/// squares summed from `y`.
#[inline(always)]
fn stats_into<T: Scalar>(l: &Layout, k: usize, x: &[T], y: &mut [T], eps: T) -> (Centre<T>, T) {
    let c = centre(l, k, x);
    let mut sq = T::zero();
    for r in l.segs(k) {
        for (o, &v) in y[r.clone()].iter_mut().zip(&x[r.clone()]) {
            *o = c.of(v);
        }
        let t = &y[r];
        sq += lanes(t, t, t, |t, _, _| t * t);
    }
    (c, rstd(variance(sq, l.count()), eps))
}

/// `1/sqrt(var + ε)`.
#[inline(always)]
fn rstd<T: Scalar>(var: T, eps: T) -> T {
    T::one() / (var + eps).sqrt()
}

/// Group k's centre ([`Centre`]): pass 1, `Σ (x − x₀)` of each segment in eight lanes, the
/// segments added in order; x₀ = d̄ = 0 without pass 1 where not centred.
#[inline(always)]
fn centre<T: Scalar>(l: &Layout, k: usize, x: &[T]) -> Centre<T> {
    if !l.centred {
        return Centre {
            shift: T::zero(),
            shifted_mean: T::zero(),
        };
    }
    let shift = l.shift(k, x);
    let mut sum = T::zero();
    for r in l.segs(k) {
        let seg = &x[r];
        sum += lanes(seg, seg, seg, |v, _, _| v - shift);
    }
    Centre {
        shift,
        shifted_mean: sum / l.count::<T>(),
    }
}

/// The centre ([`Centre`]) of group k and its biased variance, in two passes: pass 2,
/// `Σ x̃²` as pass 1 sums.
#[inline(always)]
fn moments<T: Scalar>(l: &Layout, k: usize, x: &[T]) -> (Centre<T>, T) {
    let c = centre(l, k, x);
    let mut sq = T::zero();
    for r in l.segs(k) {
        let seg = &x[r];
        sq += lanes(seg, seg, seg, |v, _, _| c.of(v) * c.of(v));
    }
    (c, variance(sq, l.count()))
}

/// The biased variance from `Σ x̃²` over m elements: `Σ x̃²/m`, clamped at ≥ 0.
#[inline(always)]
fn variance<T: Scalar>(sq: T, m: T) -> T {
    (sq / m).max(T::zero())
}

/// Σ f(aᵢ, bᵢ, cᵢ) over the common length in eight lanes (element i into lane i mod 8, then
/// the tail in order), combined as [`super::sum_slice`] combines them. Written over eight-element
/// chunks, so the compiler keeps the eight lanes in one vector register (an index closure
/// `f(i + l)` compiled to one element at a time).
#[inline(always)]
fn lanes<T: Scalar>(a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T) -> T {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (
        a[..n].chunks_exact(8),
        b[..n].chunks_exact(8),
        c[..n].chunks_exact(8),
    );
    let tail = a.remainder().iter().zip(b.remainder()).zip(c.remainder());
    let mut acc = [T::zero(); 8];
    for ((xa, xb), xc) in a.zip(b).zip(c) {
        for (l, s) in acc.iter_mut().enumerate() {
            *s += f(xa[l], xb[l], xc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for ((&u, &v), &w) in tail {
        s += f(u, v, w);
    }
    s
}

/// The channel layout of `batchMoments`' operand (checked by the shape rule).
fn moments_layout<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Layout> {
    check_arity(op, x)?;
    op.infer_shape(&[x[0].shape()]).map_err(|e| match e {
        tl_ir::Error::Spec(s) => crate::Error::from(s),
        other => SpecError::shape(op.name(), other.to_string()).into(),
    })?;
    let d = x[0].shape().dims();
    let r = d.len();
    Ok(Layout {
        outer: if r == 4 { d[0] } else { 1 },
        c: d[r - 3],
        seg: d[r - 2] * d[r - 1],
        per_column: false,
        centred: true,
    })
}

/// `batchMoments`: `[μ₀…μ_{C−1}, var₀…var_{C−1}]` shaped (2, C), each μ the centre's
/// [`Centre::mean`].
fn moments_forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let l = moments_layout(op, x)?;
    let mut out = tl_spec::alloc::try_zeroed(op.name(), "output", 2 * l.c)?;
    for k in 0..l.c {
        let (c, var) = moments(&l, k, x[0].data());
        (out[k], out[l.c + k]) = (c.mean(), var);
    }
    tensor(tl_spec::Shape::new(&[2, l.c]), out)
}

/// `batchMoments`' cotangent `dx = (gμ + 2·gv·(x − μ))/m`, μ read from the output y.
fn moments_backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    let l = moments_layout(op, x)?;
    let out = tl_spec::Shape::new(&[2, l.c]);
    check_shape(op, "output", y, &out)?;
    check_shape(op, "cotangent", g, &out)?;
    let (xs, ys, gs) = (x[0].data(), y.data(), g.data());
    let mut dx = tl_spec::alloc::try_zeroed(op.name(), "cotangent", xs.len())?;
    let (m, two) = (l.count::<T>(), T::lit(2.0));
    for k in 0..l.c {
        let (mean, gm, gv) = (ys[k], gs[k], gs[l.c + k]);
        for r in l.segs(k) {
            for (d, &v) in dx[r.clone()].iter_mut().zip(&xs[r]) {
                *d = (gm + two * gv * (v - mean)) / m;
            }
        }
    }
    Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
}

/// Forward value of a normalization op.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let (y, stats) = forward_saving(op, x)?;
    stats.into_iter().for_each(tl_spec::pool::give);
    Ok(y)
}

/// The value and each group's (d̄, rstd) as `[d̄₀, rstd₀, d̄₁, …]` (one list; d̄ the mean of
/// `x − x₀`, x₀ the group's first element), what [`backward_saved`] reads instead of computing them again.
pub fn forward_saving<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    if let Op::BatchMoments = op {
        return Ok((moments_forward(op, x)?, Vec::new()));
    }
    let (l, eps) = Layout::of(op, x)?;
    let (xs, gamma) = (x[0].data(), x[1].data());
    let beta = l.centred.then(|| x[2].data());
    let mut st = tl_spec::alloc::try_for_overwrite(op.name(), "workspace", 2 * l.c)?;
    let y = tl_spec::alloc::try_for_overwrite(op.name(), "output", xs.len())?;
    let k = Forward {
        l,
        x: xs,
        gamma,
        beta,
        eps,
        stats: &mut st,
        y,
    };
    let y = match l.per_column {
        true => crate::simd::vectorize(Rows(k)),
        false => crate::simd::vectorize(Channels(k)),
    };
    Ok((tensor(x[0].shape().clone(), y)?, vec![st]))
}

/// Operand cotangents `(dx, dγ, dβ)` of a normalization op (`(dx, dγ)` for `rmsNorm`), reading each group's (d̄, rstd) from
/// `saved` ([`forward_saving`]); with `saved` empty it computes them again. The same bits either way; a list that does not fit is an
/// error naming the op.
pub fn backward_saved<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    if let Op::BatchMoments = op {
        check_saved(op, saved, &[])?;
        return moments_backward(op, x, y, g);
    }
    let (l, eps) = Layout::of(op, x)?;
    check_shape(op, "output", y, x[0].shape())?;
    check_shape(op, "cotangent", g, x[0].shape())?;
    let (xs, gamma, gs) = (x[0].data(), x[1].data(), g.data());
    let kept = match saved {
        [] => None,
        _ => {
            check_saved(op, saved, &[2 * l.c])?;
            Some(&saved[0][..])
        }
    };
    let out = [
        tl_spec::alloc::try_for_overwrite(op.name(), "cotangent", xs.len())?,
        tl_spec::alloc::try_zeroed(op.name(), "cotangent", gamma.len())?,
        // rmsNorm has no β and so no dβ.
        tl_spec::alloc::try_zeroed(
            op.name(),
            "cotangent",
            if l.centred { gamma.len() } else { 0 },
        )?,
    ];
    let k = Backward {
        l,
        x: xs,
        gamma,
        g: gs,
        eps,
        stats: kept,
        out,
    };
    let [dx, dgamma, dbeta] = match l.per_column {
        true => crate::simd::vectorize(Rows(k)),
        false => crate::simd::vectorize(Channels(k)),
    };
    let mut grads = smallvec![
        Some(tensor(x[0].shape().clone(), dx)?),
        Some(tensor(x[1].shape().clone(), dgamma)?),
    ];
    if l.centred {
        grads.push(Some(tensor(x[2].shape().clone(), dbeta)?));
    }
    Ok(grads)
}

/// A normalization's forward: the operands, the statistics it writes and its output, run as
/// layer norm's [`Rows`] or batch norm's [`Channels`].
struct Forward<'a, T> {
    l: Layout,
    x: &'a [T],
    gamma: &'a [T],
    /// β, absent for `rmsNorm` (not centred).
    beta: Option<&'a [T]>,
    eps: T,
    /// Each group's (d̄, rstd), written.
    stats: &'a mut [T],
    /// The output (every value overwritten).
    y: Vec<T>,
}

/// A normalization's backward: the operands, the kept statistics and its outputs, run as
/// layer norm's [`Rows`] or batch norm's [`Channels`].
struct Backward<'a, T> {
    l: Layout,
    x: &'a [T],
    gamma: &'a [T],
    g: &'a [T],
    eps: T,
    /// Each group's (d̄, rstd) as the forward kept them, or `None` (computed again).
    stats: Option<&'a [T]>,
    /// `dx` (every value overwritten), then `dγ` and `dβ` (zeros; `rmsNorm`'s `dβ` is empty).
    out: [Vec<T>; 3],
}

/// A [`Forward`] or [`Backward`] as a kernel for [`crate::simd::vectorize`] with layer norm's
/// body ([`rows`]): one body per compiled kernel (one kernel holding both bodies ran batch
/// norm's backward about 15% slower).
struct Rows<K>(K);

/// The same with batch norm's body ([`channels`]).
struct Channels<K>(K);

impl<T: Scalar> crate::simd::Kernel for Rows<Forward<'_, T>> {
    type Output = Vec<T>;
    #[inline(always)]
    fn call(self) -> Vec<T> {
        rows::forward(self.0)
    }
}

impl<T: Scalar> crate::simd::Kernel for Channels<Forward<'_, T>> {
    type Output = Vec<T>;
    #[inline(always)]
    fn call(self) -> Vec<T> {
        channels::forward(self.0)
    }
}

impl<T: Scalar> crate::simd::Kernel for Rows<Backward<'_, T>> {
    type Output = [Vec<T>; 3];
    #[inline(always)]
    fn call(self) -> [Vec<T>; 3] {
        rows::backward(self.0)
    }
}

impl<T: Scalar> crate::simd::Kernel for Channels<Backward<'_, T>> {
    type Output = [Vec<T>; 3];
    #[inline(always)]
    fn call(self) -> [Vec<T>; 3] {
        channels::backward(self.0)
    }
}

/// Layer norm (one group per row, γ/β per column): the statistics of [`stats`] (a row is one
/// segment), with x̃ (forward) or x̂ (backward) written into the output row once and read back;
/// Σ ĝ and Σ ĝ·x̂ in eight lanes ([`lanes`]); dγ and dβ add the rows in order.
mod rows {
    use super::{Centre, lanes, stats, stats_into};
    use tl_spec::Scalar;

    /// [`super::Forward`] of layer norm.
    #[inline(always)]
    pub(super) fn forward<T: Scalar>(k: super::Forward<'_, T>) -> Vec<T> {
        let mut y = k.y;
        let cols = k.l.seg;
        for (r, st) in k.stats.chunks_exact_mut(2).enumerate() {
            let (c, rstd) = stats_into(&k.l, r, k.x, &mut y, k.eps);
            st.copy_from_slice(&[c.shifted_mean, rstd]);
            let yr = &mut y[r * cols..(r + 1) * cols];
            match k.beta {
                Some(beta) => {
                    for ((o, &ga), &be) in yr.iter_mut().zip(k.gamma).zip(beta) {
                        *o = *o * rstd * ga + be;
                    }
                }
                None => {
                    for (o, &ga) in yr.iter_mut().zip(k.gamma) {
                        *o = *o * rstd * ga;
                    }
                }
            }
        }
        y
    }

    /// [`super::Backward`] of layer norm: dγ and dβ add the rows in order.
    #[inline(always)]
    pub(super) fn backward<T: Scalar>(k: super::Backward<'_, T>) -> [Vec<T>; 3] {
        let [mut dx, mut dgamma, mut dbeta] = k.out;
        let c = k.l.seg.max(1);
        let m = T::lit(c as f64);
        let rows = dx
            .chunks_exact_mut(c)
            .zip(k.x.chunks_exact(c))
            .zip(k.g.chunks_exact(c));
        for (r, ((dr, xr), gr)) in rows.enumerate() {
            let (c, rstd) = match k.stats {
                Some(st) => (Centre::kept(&k.l, r, k.x, st[2 * r]), st[2 * r + 1]),
                None => stats(&k.l, r, k.x, k.eps),
            };
            // x̂ = x̃·rstd written into the dx row once, read by the three uses.
            for (d, &v) in dr.iter_mut().zip(xr) {
                *d = c.of(v) * rstd;
            }
            let gamma = k.gamma;
            let (dga, dbe) = (&mut dgamma[..], &mut dbeta[..]);
            if dbe.is_empty() {
                // rmsNorm: dγ alone (no β).
                for ((dg, &h), &gi) in dga.iter_mut().zip(&*dr).zip(gr) {
                    *dg += gi * h;
                }
            } else {
                for (((dg, db), &h), &gi) in dga.iter_mut().zip(dbe).zip(&*dr).zip(gr) {
                    *db += gi;
                    *dg += gi * h;
                }
            }
            let s2 = lanes(gr, gamma, dr, |g, ga, h| g * ga * h);
            let scale = rstd / m;
            if k.l.centred {
                let s1 = lanes(gr, gamma, gr, |g, ga, _| g * ga);
                for ((d, &gi), &ga) in dr.iter_mut().zip(gr).zip(gamma) {
                    *d = scale * (m * gi * ga - s1 - *d * s2);
                }
            } else {
                for ((d, &gi), &ga) in dr.iter_mut().zip(gr).zip(gamma) {
                    *d = scale * (m * gi * ga - *d * s2);
                }
            }
        }
        [dx, dgamma, dbeta]
    }
}

/// Batch norm (one group per channel over N·H·W, γ/β per channel): the statistics of
/// [`stats`] (a segment is one sample's H·W), with x̃ (forward) or x̂ (backward) written into
/// the output's segments once and read back; dγ, dβ and the backward's two sums likewise.
mod channels {
    use super::{Centre, lanes, stats, stats_into};
    use tl_spec::Scalar;

    /// [`super::Forward`] of batch norm.
    #[inline(always)]
    pub(super) fn forward<T: Scalar>(k: super::Forward<'_, T>) -> Vec<T> {
        let (l, x, mut y) = (k.l, k.x, k.y);
        let (gamma, beta, eps) = (k.gamma, k.beta.unwrap_or_default(), k.eps);
        for (k, st) in k.stats.chunks_exact_mut(2).enumerate() {
            let (c, rstd) = stats_into(&l, k, x, &mut y, eps);
            st.copy_from_slice(&[c.shifted_mean, rstd]);
            // Batch norm is centred: β is present.
            let (ga, be) = (gamma[k], beta[k]);
            for r in l.segs(k) {
                for o in &mut y[r] {
                    *o = *o * rstd * ga + be;
                }
            }
        }
        y
    }

    /// [`super::Backward`] of batch norm.
    #[inline(always)]
    pub(super) fn backward<T: Scalar>(k: super::Backward<'_, T>) -> [Vec<T>; 3] {
        let [mut dx, mut dgamma, mut dbeta] = k.out;
        let (l, x, g, kept) = (k.l, k.x, k.g, k.stats);
        let (gamma, eps) = (k.gamma, k.eps);
        let m = l.count::<T>();
        for k in 0..l.c {
            let (c, rstd) = match kept {
                Some(st) => (Centre::kept(&l, k, x, st[2 * k]), st[2 * k + 1]),
                None => stats(&l, k, x, eps),
            };
            let ga = gamma[k];
            // x̂ into dx, then Σ g (dβ), Σ g·x̂ (dγ), Σ ĝ and Σ ĝ·x̂ (ĝ = g·γ) from there.
            let [mut db, mut dg, mut s1, mut s2] = [T::zero(); 4];
            for r in l.segs(k) {
                for (d, &v) in dx[r.clone()].iter_mut().zip(&x[r.clone()]) {
                    *d = c.of(v) * rstd;
                }
                let (h, gr) = (&dx[r.clone()], &g[r]);
                db += lanes(gr, gr, gr, |g, _, _| g);
                dg += lanes(gr, h, h, |g, h, _| g * h);
                s1 += lanes(gr, gr, gr, |g, _, _| g * ga);
                s2 += lanes(gr, h, h, |g, h, _| g * ga * h);
            }
            (dgamma[k], dbeta[k]) = (dg, db);
            let scale = rstd / m;
            for r in l.segs(k) {
                for (d, &gi) in dx[r.clone()].iter_mut().zip(&g[r]) {
                    *d = scale * (m * gi * ga - s1 - *d * s2);
                }
            }
        }
        [dx, dgamma, dbeta]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batchnorm_statistics_span_the_batch() {
        // (N=2, C=1, H=1, W=2): channel 0 holds [0, 2] and [4, 6]: μ = 3, var = 5.
        let x = Tensor::<f64>::new([2, 1, 1, 2], vec![0.0, 2.0, 4.0, 6.0]).unwrap();
        let one = Tensor::vector(vec![1.0]);
        let zero = Tensor::vector(vec![0.0]);
        let y = forward(&Op::BatchNorm { eps: 1e-6 }, &[&x, &one, &zero]).unwrap();
        let r = 1.0 / (5.0f64 + 1e-6).sqrt();
        let want = [-3.0 * r, -r, r, 3.0 * r];
        for (a, w) in y.data().iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{a} vs {w}");
        }
        // Errors, not panics, for bad shapes or ε.
        assert!(forward(&Op::BatchNorm { eps: 0.0 }, &[&x, &one, &zero]).is_err());
        assert!(forward(&Op::LayerNorm { eps: 1e-6 }, &[&x, &one, &zero]).is_err());
    }
}
