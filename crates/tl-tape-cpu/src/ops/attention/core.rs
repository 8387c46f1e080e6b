//! The per-head core of `multiHeadAttention` over blocks of query rows: scores by GEMM, the
//! masked softmax (or the one pass from kept row statistics), `A·V`, and the backward's products
//! (see the parent module's docs for the formulas).

use super::*;

/// At most this many scores (query rows × keys) exist at once on the fused path (64 KiB in
/// f32: an L2-sized block). Sequences up to 128 keys take every row in one block either way.
pub const FUSED_SCORES: usize = 1 << 14;

/// The most probabilities (`B·heads·n²`: 1 MiB in f32) a `fused` op keeps for its backward as
/// the unfused one does; past it, it runs memory-lean ([`lean`]). Below it the memory bound
/// buys nothing worth the recomputation: keeping A instead of recomputing it block by block
/// took the transformer step (n = 128, 4 heads) from 401–408 to 385–387 µs on one core
/// (docs/performance.md).
pub const FUSED_KEEP_MAX: usize = 1 << 18;

/// Whether a `fused` op runs memory-lean: query rows in blocks of at most [`FUSED_SCORES`]
/// scores and each row's softmax statistics kept instead of A. Only when its probabilities
/// would exceed [`FUSED_KEEP_MAX`] (or the [`crate::gates`] override); below, it runs as the
/// unfused op. The bits are the same either way.
pub fn lean(dm: &Dims, fused: bool) -> bool {
    let max = crate::gates::get(|g| g.fused_keep_max, FUSED_KEEP_MAX);
    let probabilities = [dm.heads, dm.n, dm.nk]
        .into_iter()
        .fold(dm.batch, usize::saturating_mul);
    fused && probabilities > max
}

/// Query rows per block: every row unless `lean` ([`lean`]), else at most [`FUSED_SCORES`]
/// scores (rows of nk keys; at least one row).
pub fn block_rows(dm: &Dims, lean: bool) -> usize {
    let n = dm.n.max(1);
    if lean {
        let scores = crate::gates::get(|g| g.fused_scores, FUSED_SCORES);
        (scores / dm.nk.max(1)).clamp(1, n)
    } else {
        n
    }
}

/// The length of the probabilities A of every sample and head, (B, heads, n, nk); an error
/// naming `op` if it overflows.
pub fn probabilities_len(op: &Op, dm: &Dims) -> Result<usize> {
    let shape = tl_spec::Shape::new(&[dm.batch, dm.heads, dm.n, dm.nk]);
    Ok(shape.check_size(op.name())?)
}

/// The length of every query row's softmax statistics (max, 1/sum), (B, heads, n, 2); an
/// error naming `op` if it overflows.
pub fn stats_len(op: &Op, dm: &Dims) -> Result<usize> {
    let shape = tl_spec::Shape::new(&[dm.batch, dm.heads, dm.n, 2]);
    Ok(shape.check_size(op.name())?)
}

/// What the forward keeps besides Q, K, V and C: the probabilities ([`probabilities_len`]),
/// or the row statistics ([`stats_len`]) when `lean` ([`lean`]).
pub fn kept_len(op: &Op, dm: &Dims, lean: bool) -> Result<usize> {
    match lean {
        true => stats_len(op, dm),
        false => probabilities_len(op, dm),
    }
}

/// What [`kept_len`] counts, in words (for an allocation error).
pub fn kept_what(lean: bool) -> &'static str {
    match lean {
        true => "the kept attention row statistics",
        false => "the kept attention probabilities",
    }
}

/// What [`forward`] writes besides C.
pub enum Keep<'a, T> {
    /// Nothing.
    Nothing,
    /// Every head's probabilities, [`probabilities_len`] long (the block must be `n`).
    Probabilities(&'a mut [T]),
    /// Every query row's softmax statistics, [`stats_len`] long.
    Stats(&'a mut [T]),
}

/// What the backward reads of the forward's intermediates: Q, K, V always; C and A (or
/// the statistics A is made again from) where the forward kept them (`None`: computed
/// again).
pub struct Kept<'a, T> {
    /// Q (B·n, P), K and V (B·nk, Pk).
    pub qkv: [&'a [T]; 3],
    /// C (B·n, P), the heads' outputs before `wo`.
    pub c: Option<&'a [T]>,
    /// The probabilities, (B, heads, n, nk).
    pub a: Option<&'a [T]>,
    /// Each query row's softmax max and 1/sum, (B, heads, n, 2).
    pub stats: Option<&'a [T]>,
}

impl<'a, T: Scalar> Kept<'a, T> {
    /// The list [`super::forward_saving`] returns, checked against the dims: Q, K, V, C,
    /// then A, or the row statistics when `lean` ([`lean`]).
    pub fn from_saved(op: &Op, dm: &Dims, lean: bool, saved: &'a [Vec<T>]) -> Result<Self> {
        let (len, klen) = (dm.batch * dm.n * dm.p, dm.batch * dm.nk * dm.pk());
        let expected = [len, klen, klen, len, kept_len(op, dm, lean)?];
        check_saved(op, saved, &expected)?;
        let last = Some(saved[4].as_slice());
        Ok(Kept {
            qkv: [&saved[0], &saved[1], &saved[2]],
            c: Some(&saved[3]),
            a: last.filter(|_| !lean),
            stats: last.filter(|_| lean),
        })
    }
}

/// A zeroed (r, n) block of scores (n: the keys), checked against the allocation cap first
/// (an unfused op's block is (n, nk) however small its value is).
fn scores<T: Scalar>(op: &Op, r: usize, n: usize) -> Result<Vec<T>> {
    let len = tl_spec::Shape::new(&[r, n]).check_size(op.name())?;
    Ok(tl_spec::alloc::try_vec(
        op.name(),
        "attention scores",
        len,
        T::zero(),
    )?)
}

/// A probabilities buffer of `a_len` (if any) must hold every head's (n, nk) scores, one
/// block per head (`block ≥ n`).
fn check_whole_rows(op: &Op, dm: &Dims, a_len: Option<usize>, block: usize) -> Result<()> {
    match a_len {
        Some(len) if len != probabilities_len(op, dm)? || block < dm.n => Err(SpecError::shape(
            op.name(),
            format!("a probabilities buffer of {len} for blocks of {block} rows"),
        )
        .into()),
        _ => Ok(()),
    }
}

/// A statistics buffer of `len` (if any) must be [`stats_len`] long.
fn check_stats(op: &Op, dm: &Dims, len: Option<usize>) -> Result<()> {
    match len {
        Some(len) if len != stats_len(op, dm)? => Err(SpecError::shape(
            op.name(),
            format!("a row statistics buffer of {len}, not (batch, heads, n, 2)"),
        )
        .into()),
        _ => Ok(()),
    }
}

/// One sample's Q (n, P), K and V (nk, Pk), and the (·, d) column blocks a query head reads.
struct Sample<'a, T> {
    qkv: [Mat<'a, T>; 3],
}

impl<'a, T: Scalar> Sample<'a, T> {
    fn new(op: &Op, dm: &Dims, b: usize, qkv: [&'a [T]; 3]) -> Result<Self> {
        let m = |x: &'a [T], n: usize, p: usize| rows(op, &x[b * n * p..(b + 1) * n * p], n, p);
        let (nk, pk) = (dm.nk, dm.pk());
        Ok(Sample {
            qkv: [
                m(qkv[0], dm.n, dm.p)?,
                m(qkv[1], nk, pk)?,
                m(qkv[2], nk, pk)?,
            ],
        })
    }

    /// Query head `h`'s columns of Q, and those of the key head it reads of K and V.
    fn head(&self, dm: &Dims, h: usize) -> [Mat<'a, T>; 3] {
        let [q, k, v] = self.qkv;
        let g = dm.kv_head(h) * dm.d;
        [
            q.col_block(h * dm.d, dm.d),
            k.col_block(g, dm.d),
            v.col_block(g, dm.d),
        ]
    }
}

/// Where the softmax statistics of query rows `i0..i0 + r` of one head go or come from.
enum Stats<'a, T> {
    /// Neither kept nor known.
    None,
    /// Written here, 2 per row.
    Keep(&'a mut [T]),
    /// Read from here, 2 per row: the rows are made from them.
    From(&'a [T]),
}

/// The probabilities of query rows `i0..i0 + r` of one head of sample `b` into `s` (r, nk):
/// scores by GEMM, then the masked softmax of each row under the sample's mask matrix (or,
/// from known statistics, the one pass that makes the same rows).
#[allow(clippy::too_many_arguments)]
fn probabilities<T: Scalar>(
    op: &Op,
    dm: &Dims,
    qh: Mat<'_, T>,
    kh: Mat<'_, T>,
    (mask, b): (Option<&Mask>, usize),
    i0: usize,
    r: usize,
    s: &mut [T],
    stats: Stats<'_, T>,
) -> Result<()> {
    let scale = T::one() / T::lit(dm.d as f64).sqrt();
    let sv = rows_mut(op, s, r, dm.nk)?;
    matmul(op, sv, false, qh.row_block(i0, r), kh.t(), scale)?;
    let allowed = |i: usize| mask.map(|m| m.row_in(b, i0 + i));
    match stats {
        Stats::None => softmax_rows(s, dm.nk, allowed, None),
        Stats::Keep(st) => softmax_rows(s, dm.nk, allowed, Some(st)),
        Stats::From(st) => softmax_rows_from(s, dm.nk, allowed, st),
    }
    Ok(())
}

/// The statistics of query rows `i0..i0 + r` of sample `b`'s head `h` in a (B, heads, n, 2)
/// buffer.
fn stats_rows(dm: &Dims, b: usize, h: usize, i0: usize, r: usize) -> std::ops::Range<usize> {
    let start = ((b * dm.heads + h) * dm.n + i0) * 2;
    start..start + 2 * r
}

/// C (B·n, P) from Q, K, V, `block` query rows at a time, writing what `keep` asks for too
/// (the probabilities need `block` = `n`: each head's scores are one block).
pub fn forward<T: Scalar>(
    op: &Op,
    dm: &Dims,
    qkv: [&[T]; 3],
    mask: Option<&Mask>,
    block: usize,
    keep: Keep<'_, T>,
) -> Result<Vec<T>> {
    let Dims {
        n, nk, p, d, heads, ..
    } = *dm;
    let (mut keep_a, mut keep_stats) = match keep {
        Keep::Nothing => (None, None),
        Keep::Probabilities(a) => (Some(a), None),
        Keep::Stats(st) => (None, Some(st)),
    };
    check_whole_rows(op, dm, keep_a.as_deref().map(<[T]>::len), block)?;
    check_stats(op, dm, keep_stats.as_deref().map(<[T]>::len))?;
    let mut c = tl_spec::alloc::try_zeroed(op.name(), "output", dm.batch * n * p)?;
    let mut scratch = match keep_a {
        Some(_) => Vec::new(),
        None => scores(op, block, nk)?,
    };
    for (b, cb) in c.chunks_exact_mut((n * p).max(1)).enumerate() {
        let sample = Sample::new(op, dm, b, qkv)?;
        let mut cb = rows_mut(op, cb, n, p)?;
        for h in 0..heads {
            let [qh, kh, vh] = sample.head(dm, h);
            for i0 in (0..n).step_by(block) {
                let r = block.min(n - i0);
                let s = match keep_a.as_deref_mut() {
                    Some(a) => &mut a[(b * heads + h) * n * nk..][..r * nk],
                    None => &mut scratch[..r * nk],
                };
                let stats = match keep_stats.as_deref_mut() {
                    Some(st) => Stats::Keep(&mut st[stats_rows(dm, b, h, i0, r)]),
                    None => Stats::None,
                };
                probabilities(op, dm, qh, kh, (mask, b), i0, r, s, stats)?;
                let out = cb.as_mut().block(i0, h * d, r, d);
                matmul(op, out, false, rows(op, s, r, nk)?, vh, T::one())?;
            }
        }
    }
    tl_spec::pool::give(scratch);
    Ok(c)
}

/// `(C, [dQ, dK, dV])` from what the forward kept and dC, `block` query rows at a time: C
/// is computed (and returned) only when `kept` has none, A only when `kept` has none (the
/// same GEMMs and softmax as the forward, or the one pass from the kept statistics: the
/// same bits either way). A key head's dK and dV add its query heads' products in increasing
/// head order.
#[allow(clippy::type_complexity)]
pub fn backward<T: Scalar>(
    op: &Op,
    dm: &Dims,
    kept: &Kept<'_, T>,
    dc: &[T],
    mask: Option<&Mask>,
    block: usize,
) -> Result<(Option<Vec<T>>, [Vec<T>; 3])> {
    let Dims {
        n, nk, p, d, heads, ..
    } = *dm;
    let scale = T::one() / T::lit(d as f64).sqrt();
    let pk = dm.pk();
    let (len, klen) = (dm.batch * n * p, dm.batch * nk * pk);
    check_whole_rows(op, dm, kept.a.map(<[T]>::len), block)?;
    check_stats(op, dm, kept.stats.map(<[T]>::len))?;
    let zeros = |len| tl_spec::alloc::try_zeroed(op.name(), "output or cotangent", len);
    let mut c = match kept.c {
        None => Some(zeros(len)?),
        Some(_) => None,
    };
    let mut out = [zeros(len)?, zeros(klen)?, zeros(klen)?];
    let mut s = match kept.a {
        Some(_) => Vec::new(),
        None => scores(op, block, nk)?,
    };
    let mut ds = scores(op, block, nk)?;
    let (sample_len, keys_len) = ((n * p).max(1), (nk * pk).max(1));
    let [dq, dk, dv] = &mut out;
    let samples = dq
        .chunks_exact_mut(sample_len)
        .zip(dk.chunks_exact_mut(keys_len))
        .zip(dv.chunks_exact_mut(keys_len));
    for (b, ((dqb, dkb), dvb)) in samples.enumerate() {
        let sample = Sample::new(op, dm, b, kept.qkv)?;
        let dcb = rows(op, &dc[b * n * p..(b + 1) * n * p], n, p)?;
        let mut cb = match &mut c {
            Some(c) => Some(rows_mut(op, &mut c[b * n * p..(b + 1) * n * p], n, p)?),
            None => None,
        };
        let mut dqb = rows_mut(op, dqb, n, p)?;
        let mut dkb = rows_mut(op, dkb, nk, pk)?;
        let mut dvb = rows_mut(op, dvb, nk, pk)?;
        for h in 0..heads {
            let [qh, kh, vh] = sample.head(dm, h);
            let g = dm.kv_head(h) * d;
            let doh = dcb.col_block(h * d, d);
            for i0 in (0..n).step_by(block) {
                let r = block.min(n - i0);
                let ds = &mut ds[..r * nk];
                let s: &[T] = match kept.a {
                    Some(a) => &a[(b * heads + h) * n * nk..][..r * nk],
                    None => {
                        let s = &mut s[..r * nk];
                        let stats = match kept.stats {
                            Some(st) => Stats::From(&st[stats_rows(dm, b, h, i0, r)]),
                            None => Stats::None,
                        };
                        probabilities(op, dm, qh, kh, (mask, b), i0, r, s, stats)?;
                        s
                    }
                };
                let a = rows(op, s, r, nk)?;
                let do_blk = doh.row_block(i0, r);
                // O_blk = A·V_h (C is returned for dwo), unless the forward kept C.
                if let Some(cb) = &mut cb {
                    let c_blk = cb.as_mut().block(i0, h * d, r, d);
                    matmul(op, c_blk, false, a, vh, T::one())?;
                }
                // dA = dO_blk·V_hᵀ; dV_h += Aᵀ·dO_blk.
                let dav = rows_mut(op, ds, r, nk)?;
                matmul(op, dav, false, do_blk, vh.t(), T::one())?;
                let dv_h = dvb.as_mut().block(0, g, nk, d);
                matmul(op, dv_h, true, a.t(), do_blk, T::one())?;
                // dS = A⊙(dA − Σ dA⊙A)·scale, in place.
                softmax_vjp_rows(s, ds, nk, Some(scale));
                let dsv = rows(op, ds, r, nk)?;
                // dQ_blk = dS·K_h; dK_h += dSᵀ·Q_blk.
                let dq_blk = dqb.as_mut().block(i0, h * d, r, d);
                matmul(op, dq_blk, false, dsv, kh, T::one())?;
                let dk_h = dkb.as_mut().block(0, g, nk, d);
                matmul(op, dk_h, true, dsv.t(), qh.row_block(i0, r), T::one())?;
            }
        }
    }
    tl_spec::pool::give(s);
    tl_spec::pool::give(ds);
    Ok((c, out))
}
