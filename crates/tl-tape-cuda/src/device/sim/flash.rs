//! Kernel bodies of the fused attention (kernels/attention.cu): `tl_flash_fwd`,
//! `tl_flash_bwd_q`, `tl_flash_bwd_kv`, each the twin of its kernel — nq query rows against nk
//! keys ([`FlashDims`]), the same tiles of [`FLASH_TILE`](crate::device::FLASH_TILE) query
//! rows and keys, the same tiles skipped under a causal mask
//! ([`FlashMask::key_end`](crate::device::FlashMask::key_end),
//! [`FlashMask::query_start`](crate::device::FlashMask::query_start)), each head (b, h) under
//! batch element b's mask ([`FlashMask::allowed`](crate::device::FlashMask::allowed)), every
//! sum in the kernel's order (the order is written in the
//! kernel file's header and in docs/semantics.md, "Attention"):
//!
//! - a score is `dot(q_i, k_j)·scale`, the dot a fused multiply-add chain over the head's
//!   columns from +0; masked keys are −∞;
//! - forward, per query row over the key tiles in order: the tile's max, `m' = max(m, mt)`,
//!   `α = exp(m − m')`, `p = exp(s − m')`, `l = l·α + Σ p` (keys in order from +0), each
//!   output column `o·α` then one fused multiply-add per key; at the end `o / l` and
//!   `lse = m + ln l` (0 and −∞ for a row with nothing allowed);
//! - backward: `delta_i = dot(dO_i, O_i)`, `p = exp(s − lse)`, `dS = p·(dP − delta)·scale`;
//!   dQ sums over keys, dK and dV over query rows, each an FMA chain from +0 in increasing
//!   order; under grouped-query attention a key head's chain runs over its group's query heads
//!   in increasing order, each head's query rows in order.
//!
//! Query head h reads key head [`FlashDims::kv_head`]`(h)` (K and V rows of
//! [`FlashDims::kv_heads`] heads).
//!
//! Autocast (`round` bf16 or TF32; the kernels' `TL_FA_BF16`, `TL_FA_TF32`): the operands come
//! rounded, [`forward_out`] (`TL_FA_OUT`) is the forward's second pass,
//! `o = Σ_j round(exp(s − lse))·v_j` in key order from +0 with no rescaling, and the backward
//! rounds `p` and `dS` (dS from the unrounded p) before the sums read them. [`forward_lse`]
//! (`TL_FA_STATS`) is the first pass when nothing reads its output: lse alone.
//!
//! With [`FlashProducts::Tf32x3`] ([`Flash::products`]) each function is the twin of the
//! tensor-core kernel (`tl_flash_fwd_tc`, `tl_flash_bwd_q_tc`, `tl_flash_bwd_kv_tc`): the
//! products as three TF32 products each, in steps of [`TC_STEP`] keys, in the order the
//! emulator's `mma_sync` sums (kernels/attention.cu writes it down); under autocast the
//! operands rounded as they are read (the kernels round as they stage) and only the products of
//! their big parts (a rounded operand's small part is zero).

use std::borrow::Cow;

use crate::device::{FLASH_TILE as T, Flash, FlashDims, FlashProducts};
use crate::precision::Precision;

/// The index of (b, i, h, c) in a head-merged (B, nq, H, d) buffer: Q, O, dO, dQ.
fn at_q(f: &FlashDims, b: usize, i: usize, h: usize, c: usize) -> usize {
    ((b * f.nq + i) * f.heads + h) * f.d + c
}

/// The index of (b, j, g, c) in a head-merged (B, nk, Hk, d) buffer, g a key head: K, V, dK,
/// dV.
fn at_kv(f: &FlashDims, b: usize, j: usize, g: usize, c: usize) -> usize {
    ((b * f.nk + j) * f.kv_heads + g) * f.d + c
}

/// Query row i of head h of sample b: `d` contiguous values.
fn q_row<'a>(x: &'a [f32], f: &FlashDims, b: usize, i: usize, h: usize) -> &'a [f32] {
    &x[at_q(f, b, i, h, 0)..][..f.d]
}

/// Key (value) row j of key head g of sample b: `d` contiguous values.
fn kv_row<'a>(x: &'a [f32], f: &FlashDims, b: usize, j: usize, g: usize) -> &'a [f32] {
    &x[at_kv(f, b, j, g, 0)..][..f.d]
}

/// Keys a step of `tl_flash_fwd_tc` (`TL_FA_TC_BN`).
pub const TC_STEP: usize = 64;

/// Columns (keys) a tensor-core product takes at once (m16n16k8's k).
const TC_K: usize = 8;

/// `x` as the sum of two TF32 values: `(big, small)`, `big = tf32(x)`, `small = tf32(x − big)`
/// (`tl_fa_tc::split`).
fn split3(x: f32) -> (f32, f32) {
    let big = tl_spec::tf32::round(x);
    (big, tl_spec::tf32::round(x - big))
}

/// Which operands of a product hold TF32 values already (`tl_fa_tc::mma3`'s `exact`: the left,
/// the right): autocast's rounded operands, whose small parts are zero, so the tensor cores
/// skip their products.
type Exact = (bool, bool);

/// `acc + Σ a_i·b_i` over one chunk of up to [`TC_K`] pairs as the `mma_sync` of
/// `tl_fa_tc::mma3` sum it: the chain of `small_a·big_b` (unless a is `exact`), then
/// `big_a·small_b` (unless b is), then `big_a·big_b`, each in increasing i (a chunk's missing
/// pairs are zeros: `fma(0, 0, acc)` adds +0 to a sum that is never −0).
fn chunk3(acc: f32, pairs: impl Iterator<Item = (f32, f32)> + Clone, (ea, eb): Exact) -> f32 {
    let split = pairs.map(|(a, b)| (split3(a), split3(b)));
    let mut acc = acc;
    if !ea {
        acc = (split.clone()).fold(acc, |t, ((_, a_s), (b_b, _))| a_s.mul_add(b_b, t));
    }
    if !eb {
        acc = (split.clone()).fold(acc, |t, ((a_b, _), (_, b_s))| a_b.mul_add(b_s, t));
    }
    split.fold(acc, |t, ((a_b, _), (b_b, _))| a_b.mul_add(b_b, t))
}

/// `Σ a_c·b_c` on the tensor cores (`tl_flash_fwd_tc`'s scores): [`chunk3`] over chunks of
/// [`TC_K`] columns in order, from +0.
fn dot3(a: &[f32], b: &[f32], exact: Exact) -> f32 {
    a.chunks(TC_K).zip(b.chunks(TC_K)).fold(0.0, |t, (x, y)| {
        chunk3(t, x.iter().copied().zip(y.iter().copied()), exact)
    })
}

/// `Σ a_c·b_c` as a fused multiply-add chain from +0 in increasing c (`tl_fa_dot`).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |s, (&x, &y)| x.mul_add(y, s))
}

/// The tiles of `n`: `(start, len)` from `from` (a multiple of [`T`], or past `end`: none)
/// while `start < end`.
fn tiles(from: usize, end: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    steps(T, from, end, n)
}

/// [`tiles`] of `step` rows (keys).
fn steps(step: usize, from: usize, end: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    (from..end).step_by(step).map(move |s| (s, step.min(n - s)))
}

/// The operands of one core.
pub struct Qkv<'a> {
    /// Q, head-merged (B, nq, H, d).
    pub q: &'a [f32],
    /// K, head-merged (B, nk, Hk, d).
    pub k: &'a [f32],
    /// V, as K.
    pub v: &'a [f32],
}

/// `(p, dS)` of query row `i` and key `j` of head (b, h) (`tl_fa_p_ds`): 0 where masked or
/// the row has nothing allowed (`lse = −∞`); each rounded as `round` says (dS from the
/// unrounded p).
#[allow(clippy::too_many_arguments)]
fn p_ds(
    x: &Qkv<'_>,
    go: &[f32],
    f: &FlashDims,
    (b, h): (usize, usize),
    (i, j): (usize, usize),
    (lse, delta): (f32, f32),
    ok: bool,
    arith: &Arith,
) -> (f32, f32) {
    if !ok || lse == f32::NEG_INFINITY {
        return (0.0, 0.0);
    }
    let (scale, g) = (f.scale(), f.kv_head(h));
    let s = arith.dot(q_row(x.q, f, b, i, h), kv_row(x.k, f, b, j, g)) * scale;
    let p = (s - lse).exp();
    let dp = arith.dot(q_row(go, f, b, i, h), kv_row(x.v, f, b, j, g));
    let round = arith.round;
    (round.round(p), round.round(p * (dp - delta) * scale))
}

/// Which pass of the forward runs.
enum Pass<'a> {
    /// The online softmax: O and lse written.
    Softmax(&'a mut [f32]),
    /// `TL_FA_STATS`: the online softmax's lse alone, no O.
    Stats(&'a mut [f32]),
    /// `TL_FA_OUT`: O from the given lse, each probability rounded as the core's precision says.
    Out(&'a [f32]),
}

/// `tl_flash_fwd` (`tl_flash_fwd_tc` with [`FlashProducts::Tf32x3`]): O (B·nq·H·d) and lse
/// (B·H·nq). On the tensor cores: per tile of [`T`] query rows (a warp's), the steps of
/// [`TC_STEP`] keys it meets; per row and step the online softmax of the step's scores
/// (`dot3`·scale; the sum of p as two halves of the step, each in key order, added), then
/// `o·α` and the step's `P·V` in chunks of 8 keys (`chunk3`; the kernel's chunks past nk, of
/// zeros, add +0 to sums that are never −0).
pub fn forward(x: &Qkv<'_>, f: &Flash, o: &mut [f32], lse: &mut [f32]) {
    run_forward(x, f, o, Pass::Softmax(lse));
}

/// `tl_flash_fwd` with `TL_FA_STATS`: lse (B·H·nq) as [`forward`] writes it, without O.
pub fn forward_lse(x: &Qkv<'_>, f: &Flash, lse: &mut [f32]) {
    run_forward(x, f, &mut [], Pass::Stats(lse));
}

/// `tl_flash_fwd` with `TL_FA_OUT` (autocast's second pass): O = `Σ_j round(exp(s − lse))·v_j`
/// from the lse a [`forward`] on the same operands wrote; lse is read only.
pub fn forward_out(x: &Qkv<'_>, f: &Flash, lse: &[f32], o: &mut [f32]) {
    run_forward(x, f, o, Pass::Out(lse));
}

/// How a core multiplies and sums: the forward's keys a step (a tile of [`T`] for the FMA
/// kernels, [`TC_STEP`] on the tensor cores), a dot over the head's columns (a score, dP), the
/// forward's sum of p, and a sum of products over a tile's keys or rows (`P·V`, `dS·K`,
/// `dSᵀ·Q`, `Pᵀ·dO`) into an accumulator; and how the probabilities and dS are rounded.
struct Arith {
    products: FlashProducts,
    /// The core's autocast rounding (p and dS; the operands come rounded).
    round: Precision,
    /// Which operands of a dot and of a `pv` sum are TF32 values ([`Exact`]).
    exact: (Exact, Exact),
}

impl Arith {
    /// The arithmetic of `f`, its `pv` sums reading rounded probabilities (or dS) where
    /// `p_rounded`: under autocast every operand comes rounded but the forward's first pass's
    /// probabilities.
    fn of(f: &Flash, p_rounded: bool) -> Arith {
        let r = f.round.is_autocast();
        Arith {
            products: f.products,
            round: f.round,
            exact: ((r, r), (r && p_rounded, r)),
        }
    }

    fn step(&self) -> usize {
        match self.products {
            FlashProducts::Fma => T,
            FlashProducts::Tf32x3 => TC_STEP,
        }
    }

    fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        match self.products {
            FlashProducts::Fma => dot(a, b),
            FlashProducts::Tf32x3 => dot3(a, b, self.exact.0),
        }
    }

    /// Σ p: in key order from +0 (FMA); the two halves of the step so, added (tensor cores:
    /// two lanes a row).
    fn sum(&self, p: &[f32]) -> f32 {
        let ordered = |p: &[f32]| p.iter().fold(0.0f32, |t, &x| t + x);
        match self.products {
            FlashProducts::Fma => ordered(p),
            FlashProducts::Tf32x3 => p.chunks(TC_STEP / 2).map(ordered).fold(0.0, |t, h| t + h),
        }
    }

    /// `acc + Σ_j p_j·v(j)` over the keys (rows) j of `p`: one FMA chain in increasing j
    /// (FMA); [`chunk3`] over chunks of [`TC_K`] in order (tensor cores).
    fn pv(&self, acc: f32, p: &[f32], v: impl Fn(usize) -> f32) -> f32 {
        match self.products {
            FlashProducts::Fma => p
                .iter()
                .enumerate()
                .fold(acc, |t, (j, &pj)| pj.mul_add(v(j), t)),
            FlashProducts::Tf32x3 => (0..p.len()).step_by(TC_K).fold(acc, |t, k0| {
                let end = p.len().min(k0 + TC_K);
                chunk3(t, (k0..end).map(|j| (p[j], v(j))), self.exact.1)
            }),
        }
    }
}

/// The operands `xs` as `f`'s kernels read them: rounded where they round as they stage them
/// (autocast on the tensor cores, [`Flash::rounds_on_read`]), else as handed (the FMA kernels'
/// operands come rounded under autocast).
fn staged<'a, const N: usize>(xs: [&'a [f32]; N], f: &Flash) -> [Cow<'a, [f32]>; N] {
    xs.map(|x| match f.round.is_autocast() && f.rounds_on_read() {
        true => Cow::Owned(x.iter().map(|&v| f.round.round(v)).collect()),
        false => Cow::Borrowed(x),
    })
}

impl<'a> Qkv<'a> {
    /// Q, K and V of [`staged`] operands (the first three).
    fn of(ops: &'a [Cow<'_, [f32]>]) -> Qkv<'a> {
        Qkv {
            q: &ops[0],
            k: &ops[1],
            v: &ops[2],
        }
    }
}

/// The forward of `pass` with `f`'s arithmetic ([`Arith`]).
fn run_forward(x: &Qkv<'_>, fl: &Flash, o: &mut [f32], mut pass: Pass<'_>) {
    let ops = staged([x.q, x.k, x.v], fl);
    let x = &Qkv::of(&ops);
    let arith = Arith::of(fl, matches!(pass, Pass::Out(..)));
    let (f, mask) = (&fl.dims, &fl.mask);
    let (nq, nk, d, scale) = (f.nq, f.nk, f.d, f.scale());
    for bh in 0..f.batch * f.heads {
        let (b, h) = (bh / f.heads, bh % f.heads);
        let g = f.kv_head(h);
        for (i0, rows) in tiles(0, nq, nq) {
            let mut m = [f32::NEG_INFINITY; T];
            let mut l = [0.0f32; T];
            let mut acc = vec![0.0f32; T * d];
            for (j0, cols) in steps(arith.step(), 0, mask.key_end(i0 + rows, nk), nk) {
                for r in 0..rows {
                    let i = i0 + r;
                    let mut p = [f32::NEG_INFINITY; TC_STEP];
                    for (jj, s) in p.iter_mut().enumerate().take(cols) {
                        if mask.allowed(b, i, j0 + jj) {
                            let k = kv_row(x.k, f, b, j0 + jj, g);
                            *s = arith.dot(q_row(x.q, f, b, i, h), k) * scale;
                        }
                    }
                    let mt = p[..cols].iter().fold(f32::NEG_INFINITY, |a, &s| a.max(s));
                    let mn = m[r].max(mt);
                    let mut alpha = 1.0f32;
                    if mn == f32::NEG_INFINITY {
                        p[..cols].fill(0.0);
                    } else if let Pass::Out(lse) = &pass {
                        let lr = lse[bh * nq + i];
                        for s in &mut p[..cols] {
                            *s = arith.round.round((*s - lr).exp());
                        }
                        m[r] = mn;
                    } else {
                        alpha = (m[r] - mn).exp();
                        p[..cols].iter_mut().for_each(|s| *s = (*s - mn).exp());
                        l[r] = l[r] * alpha + arith.sum(&p[..cols]);
                        m[r] = mn;
                    }
                    if matches!(pass, Pass::Stats(_)) {
                        continue;
                    }
                    for (c, a) in acc[r * d..(r + 1) * d].iter_mut().enumerate() {
                        let v = |jj: usize| x.v[at_kv(f, b, j0 + jj, g, c)];
                        *a = arith.pv(*a * alpha, &p[..cols], v);
                    }
                }
            }
            for r in 0..rows {
                let i = i0 + r;
                let none = m[r] == f32::NEG_INFINITY;
                let out = matches!(pass, Pass::Out(..));
                for c in (0..d).filter(|_| !matches!(pass, Pass::Stats(_))) {
                    o[at_q(f, b, i, h, c)] = match (none, out) {
                        (true, _) => 0.0,
                        (false, true) => acc[r * d + c],
                        (false, false) => acc[r * d + c] / l[r],
                    };
                }
                if let Pass::Softmax(lse) | Pass::Stats(lse) = &mut pass {
                    lse[bh * nq + i] = if none {
                        f32::NEG_INFINITY
                    } else {
                        m[r] + l[r].ln()
                    };
                }
            }
        }
    }
}

/// `tl_flash_bwd_q` (`tl_flash_bwd_q_tc` with [`FlashProducts::Tf32x3`]): dQ and delta
/// (`dot(dO_i, O_i)` per query row, B·H·nq), from O, dO and lse, dS rounded as [`Flash::round`]
/// says.
#[allow(clippy::too_many_arguments)]
pub fn backward_q(
    x: &Qkv<'_>,
    o: &[f32],
    go: &[f32],
    lse: &[f32],
    fl: &Flash,
    dq: &mut [f32],
    delta: &mut [f32],
) {
    let ops = staged([x.q, x.k, x.v, go], fl);
    let (x, go) = (&Qkv::of(&ops), &*ops[3]);
    let arith = Arith::of(fl, true);
    let (f, mask) = (&fl.dims, &fl.mask);
    let (nq, nk, d) = (f.nq, f.nk, f.d);
    for bh in 0..f.batch * f.heads {
        let (b, h) = (bh / f.heads, bh % f.heads);
        let g = f.kv_head(h);
        for (i0, rows) in tiles(0, nq, nq) {
            for r in 0..rows {
                let i = i0 + r;
                delta[bh * nq + i] = dot(q_row(go, f, b, i, h), q_row(o, f, b, i, h));
            }
            let mut acc = vec![0.0f32; T * d];
            for (j0, cols) in tiles(0, mask.key_end(i0 + rows, nk), nk) {
                for r in 0..rows {
                    let i = i0 + r;
                    let mut ds = [0.0f32; T];
                    for (jj, v) in ds.iter_mut().enumerate().take(cols) {
                        let ok = mask.allowed(b, i, j0 + jj);
                        let row = (lse[bh * nq + i], delta[bh * nq + i]);
                        let at = (i, j0 + jj);
                        *v = p_ds(x, go, f, (b, h), at, row, ok, &arith).1;
                    }
                    for (c, a) in acc[r * d..(r + 1) * d].iter_mut().enumerate() {
                        let k = |jj: usize| x.k[at_kv(f, b, j0 + jj, g, c)];
                        *a = arith.pv(*a, &ds[..cols], k);
                    }
                }
            }
            for r in 0..rows {
                for c in 0..d {
                    dq[at_q(f, b, i0 + r, h, c)] = acc[r * d + c];
                }
            }
        }
    }
}

/// `tl_flash_bwd_kv` (`tl_flash_bwd_kv_tc` with [`FlashProducts::Tf32x3`]): dK and dV, from
/// dO, lse and [`backward_q`]'s delta, p and dS rounded as [`Flash::round`] says. Per key
/// head g and key tile, each key's chains run over the query heads of g's group in increasing
/// order, each head's query tiles in order (one chain: a key head's cotangent is the sum of
/// its query heads').
#[allow(clippy::too_many_arguments)]
pub fn backward_kv(
    x: &Qkv<'_>,
    go: &[f32],
    lse: &[f32],
    delta: &[f32],
    fl: &Flash,
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let ops = staged([x.q, x.k, x.v, go], fl);
    let (x, go) = (&Qkv::of(&ops), &*ops[3]);
    let arith = Arith::of(fl, true);
    let (f, mask) = (&fl.dims, &fl.mask);
    let (nq, nk, d, group) = (f.nq, f.nk, f.d, f.group());
    for bg in 0..f.batch * f.kv_heads {
        let (b, g) = (bg / f.kv_heads, bg % f.kv_heads);
        for (j0, cols) in tiles(0, nk, nk) {
            let mut acc_k = vec![0.0f32; T * d];
            let mut acc_v = vec![0.0f32; T * d];
            for h in g * group..(g + 1) * group {
                let bh = b * f.heads + h;
                for (i0, rows) in tiles(mask.query_start(j0, nq), nq, nq) {
                    // p and dS by key (pt[jj][r]), each key's column a slice of the tile's rows.
                    let mut pt = [[0.0f32; T]; T];
                    let mut dst = [[0.0f32; T]; T];
                    for r in 0..rows {
                        let i = i0 + r;
                        let row = (lse[bh * nq + i], delta[bh * nq + i]);
                        for jj in 0..cols {
                            let ok = mask.allowed(b, i, j0 + jj);
                            let at = (i, j0 + jj);
                            (pt[jj][r], dst[jj][r]) = p_ds(x, go, f, (b, h), at, row, ok, &arith);
                        }
                    }
                    for jj in 0..cols {
                        for c in 0..d {
                            let q = |r: usize| x.q[at_q(f, b, i0 + r, h, c)];
                            let g_o = |r: usize| go[at_q(f, b, i0 + r, h, c)];
                            let at = jj * d + c;
                            acc_k[at] = arith.pv(acc_k[at], &dst[jj][..rows], q);
                            acc_v[at] = arith.pv(acc_v[at], &pt[jj][..rows], g_o);
                        }
                    }
                }
            }
            for jj in 0..cols {
                for c in 0..d {
                    let k = at_kv(f, b, j0 + jj, g, c);
                    dk[k] = acc_k[jj * d + c];
                    dv[k] = acc_v[jj * d + c];
                }
            }
        }
    }
}
