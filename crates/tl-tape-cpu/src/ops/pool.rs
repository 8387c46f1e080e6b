//! Pooling kernels: `maxPool`, `avgPool` and `smoothMaxPool`, N-D (spatial rank 1..=8), on
//! `(C, s..)` or `(N, C, s..)` operands.
//!
//! One pass per channel plane over the window index table (`super::window`), kernel offsets
//! outer and output cells inner, with per-output accumulators allocated once per block of
//! planes (planes are independent and split across threads, [`crate::par`]):
//! - maxPool keeps the running max and its cell (the spec's [`takes_max`]: strict `>`, so a tie
//!   keeps the first cell in row-major window order, and a NaN takes it and holds it, so the max
//!   is NaN wherever a NaN is; padded cells are skipped; a window with no real cell gives 0).
//!   The backward recomputes the argmax and scatters `g` to it. Without padding both run on
//!   branch-free selects (the comparison is a coin flip on activations); windows whose last
//!   axis is two cells at stride two (every 2×2/2 pool) read whole rows of cells through
//!   `Pairs` instead of the index table. The fast scans compare with a plain `>` (which is
//!   `takes_max` without NaN); a plane holding a NaN takes the exact scan. Every path picks the
//!   same cells.
//! - avgPool sums the real cells and divides by the kernel volume; the backward scatters
//!   `g / volume`.
//! - smoothMaxPool takes the pivot (max for β > 0, min for β < 0) over the window values with
//!   padded cells as 0, then `y = p + ln Σ exp(β(v − p)) / β`; the backward scatters
//!   `g · exp(β(v − p)) / Σ` to the real cells.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::ops::pool::takes_max;
use tl_spec::{Scalar, Shape, Tensor};

use super::window::{Geometry, PAD, Table, bad, split};
use super::{Grads, approx, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

#[derive(Clone, Copy)]
enum Kind {
    Max,
    Avg,
    Smooth(f64),
}

struct Pool {
    kind: Kind,
    out: Shape,
    table: std::sync::Arc<Table>,
    /// No window has a padded cell.
    unpadded: bool,
    /// Output cells per row (the last spatial axis) when the windows are [`Pairs`] (unpadded,
    /// the last axis two cells at stride two: every 2×2/2 pool), else `None`.
    pairs: Option<usize>,
    /// No two windows share a cell (stride ≥ kernel on every axis).
    disjoint: bool,
}

impl Pool {
    fn of<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Pool> {
        let (kind, kernel, stride, padding) = match op {
            Op::MaxPool {
                kernel,
                stride,
                padding,
            } => (Kind::Max, kernel, stride, padding),
            Op::AvgPool {
                kernel,
                stride,
                padding,
            } => (Kind::Avg, kernel, stride, padding),
            Op::SmoothMaxPool {
                kernel,
                stride,
                padding,
                beta,
            } => (Kind::Smooth(*beta), kernel, stride, padding),
            _ => return Err(wrong_family(op, "pool")),
        };
        check_arity(op, x)?;
        if let Kind::Smooth(beta) = kind
            && (!beta.is_finite() || beta == 0.0)
        {
            return Err(bad(
                op,
                format!("beta must be finite and non-zero, got {beta}"),
            ));
        }
        if kernel
            .iter()
            .zip(padding)
            .any(|(&k, &p)| p.checked_mul(2).is_none_or(|p2| p2 > k))
        {
            return Err(bad(
                op,
                format!("padding {padding:?} exceeds half the kernel {kernel:?}"),
            ));
        }
        let dims = x[0].shape().dims();
        let (_, _, spatial) = split(op, "input", dims, kernel.len())?;
        let geo = Geometry::forward(op, &spatial, kernel, stride, padding)?;
        let mut out: Vec<usize> = dims[..dims.len() - spatial.len()].to_vec();
        out.extend_from_slice(&geo.small);
        let table = geo.table(op)?;
        let unpadded = table.kernel_len > 0 && !table.idx.contains(&PAD);
        let last = |d: &[usize]| d.last().copied().unwrap_or(0);
        let pairs = (unpadded && last(&geo.kernel) == 2 && last(&geo.stride) == 2)
            .then(|| last(&geo.small))
            .filter(|&ow| ow > 0);
        let disjoint = geo.stride.iter().zip(&geo.kernel).all(|(s, k)| s >= k);
        Ok(Pool {
            kind,
            out: Shape::from(out),
            table,
            unpadded,
            pairs,
            disjoint,
        })
    }
}

/// What one window-cell visit of the argmax costs, in the element visits that
/// [`crate::par::rows`] weighs against its threshold: a load, a compare and a data-dependent
/// branch that mispredicts about half the time on activations, against one streamed element.
/// Measured on the cnn step's second pool (64×16×14×14, 2×2): its backward (50 176 windows of 4
/// cells) stayed on one thread at weight 1 and is split at 4 (docs/performance.md).
const ARGMAX_COST: usize = 4;

/// The same for the branch-free argmax over windows without padded cells
/// ([`Scratch::argmax_unpadded`]): a load, a compare and two selects.
const ARGMAX_UNPADDED_COST: usize = 2;

/// Per-output scratch of one call (reused across planes).
struct Scratch<T> {
    best: Vec<T>,
    arg: Vec<usize>,
    sum: Vec<T>,
}

impl<T: Scalar> Scratch<T> {
    /// Scratch for `n` output cells, checked against the allocation cap ([`tl_spec::alloc`]).
    fn new(op: &Op, n: usize) -> Result<Self> {
        let name = op.name();
        Ok(Scratch {
            best: tl_spec::alloc::try_vec(name, "pool scratch (best)", n, T::zero())?,
            arg: tl_spec::alloc::try_vec(name, "pool scratch (argmax)", n, PAD)?,
            sum: tl_spec::alloc::try_vec(name, "pool scratch (sum)", n, T::zero())?,
        })
    }

    /// Fill `arg` with each window's first argmax cell (PAD if none) and `best` with its value.
    fn argmax(&mut self, t: &Table, plane: &[T]) {
        let ol = t.small_len;
        self.arg.fill(PAD);
        for k in 0..t.kernel_len {
            let row = &t.idx[k * ol..(k + 1) * ol];
            for ((&i, b), a) in row.iter().zip(&mut self.best).zip(&mut self.arg) {
                if i != PAD && (*a == PAD || takes_max(*b, plane[i])) {
                    *b = plane[i];
                    *a = i;
                }
            }
        }
    }

    /// [`argmax`](Self::argmax) when no window has a padded cell, without branches on the data:
    /// the first cell, then each later cell taken on a strict `v > best` through
    /// [`std::hint::select_unpredictable`] (the comparison goes either way about half the time
    /// on activations, so a branch mispredicts; the selects do not). A plane with a NaN is left
    /// to [`argmax`](Self::argmax) (on cells without NaN, `v > best` is [`takes_max`]). Same
    /// cells, same values.
    fn argmax_unpadded(&mut self, t: &Table, plane: &[T]) {
        if any_nan(plane) {
            return self.argmax(t, plane);
        }
        let ol = t.small_len;
        let first = t.idx[..ol].iter();
        for ((&i, b), a) in first.zip(&mut self.best).zip(&mut self.arg) {
            *b = plane[i];
            *a = i;
        }
        for k in 1..t.kernel_len {
            let row = t.idx[k * ol..(k + 1) * ol].iter();
            for ((&i, b), a) in row.zip(&mut self.best).zip(&mut self.arg) {
                let v = plane[i];
                let take = v > *b;
                *b = std::hint::select_unpredictable(take, v, *b);
                *a = std::hint::select_unpredictable(take, i, *a);
            }
        }
    }

    /// Fill `best` with each window's max when no window has a padded cell: the first cell's
    /// value, then `if v > best { v } else { best }` per later cell (a plane with a NaN is left
    /// to [`argmax`](Self::argmax)). That is the value at the [`argmax`](Self::argmax) cell
    /// without tracking the cell, so it compiles to branch-free `max` instructions (the
    /// argmax's data-dependent branch mispredicts about half the time on activations).
    fn max_unpadded(&mut self, t: &Table, plane: &[T]) {
        if any_nan(plane) {
            return self.argmax(t, plane);
        }
        let ol = t.small_len;
        for (&i, b) in t.idx[..ol].iter().zip(&mut self.best) {
            *b = plane[i];
        }
        for k in 1..t.kernel_len {
            for (&i, b) in t.idx[k * ol..(k + 1) * ol].iter().zip(&mut self.best) {
                let v = plane[i];
                *b = if v > *b { v } else { *b };
            }
        }
    }

    /// Fill `best` with each window's pivot and `sum` with `Σ exp(β(v − pivot))` (padded cells
    /// are the value 0).
    fn smooth(&mut self, t: &Table, plane: &[T], beta: T) {
        let ol = t.small_len;
        let up = beta > T::zero();
        self.best
            .fill(if up { T::neg_infinity() } else { T::infinity() });
        self.sum.fill(T::zero());
        for k in 0..t.kernel_len {
            let row = &t.idx[k * ol..(k + 1) * ol];
            for (&i, b) in row.iter().zip(&mut self.best) {
                let v = if i == PAD { T::zero() } else { plane[i] };
                *b = if up { b.max(v) } else { b.min(v) };
            }
        }
        for k in 0..t.kernel_len {
            let row = &t.idx[k * ol..(k + 1) * ol];
            for ((&i, &p), s) in row.iter().zip(&self.best).zip(&mut self.sum) {
                let v = if i == PAD { T::zero() } else { plane[i] };
                *s += (beta * (v - p)).exp(); // a running sum: libm (scalar either way)
            }
        }
    }
}

/// The smooth max-pool's backward scatter, `dx[i] += g·exp(β(x[i] − best))/sum` over every
/// window's cells, as a [`crate::simd::vectorize`] kernel: the scatter stays one element at a
/// time, but its exponential's fused multiply-adds are instructions (at the baseline they are
/// libm calls).
struct SmoothScatter<'a, T> {
    table: &'a Table,
    plane: &'a [T],
    g: &'a [T],
    best: &'a [T],
    sum: &'a [T],
    beta: T,
    out: &'a mut [T],
}

impl<T: Scalar> crate::simd::Kernel for SmoothScatter<'_, T> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let (t, ol) = (self.table, self.table.small_len);
        for k in 0..t.kernel_len {
            let row = t.idx[k * ol..(k + 1) * ol].iter();
            for (((&i, &gv), &pv), &z) in row.zip(self.g).zip(self.best).zip(self.sum) {
                if i != PAD {
                    self.out[i] += gv * approx::exp(self.beta * (self.plane[i] - pv)) / z;
                }
            }
        }
    }
}

/// Max pooling over windows whose last axis is two cells at stride two, unpadded: table row
/// `k` (even) at output row `r` reads cells `base + 2c` and `base + 2c + 1` for the row's `ow`
/// outputs `c` (row `k + 1` is the second of the pair), so a row of outputs reads `2·ow`
/// consecutive cells and the loops are plain slices (no index loads, branch-free `>` selects,
/// vectorised inside [`crate::simd::vectorize`]). The cells are visited in the table's order
/// with the same strict `>`, so the values and cells are those of
/// [`Scratch::max_unpadded`] / [`Scratch::argmax_unpadded`].
struct Pairs<'a, T> {
    table: &'a Table,
    ow: usize,
    plane: &'a [T],
    /// The windows' maxima (no scatter), or scratch for the cells still to find (scatter).
    out: &'a mut [T],
    /// For the backward of disjoint windows: each window's max (none NaN), its cotangent, and
    /// the plane's cotangent, into which the cotangent is written at the argmax cell (each cell
    /// belongs to at most one window; cells of no window keep their zero).
    scatter: Option<(&'a [T], &'a [T], &'a mut [T])>,
}

impl<'a, T: Scalar> Pairs<'a, T> {
    fn max(table: &'a Table, ow: usize, plane: &'a [T], out: &'a mut [T]) -> Self {
        Pairs {
            table,
            ow,
            plane,
            out,
            scatter: None,
        }
    }
}

/// Whether any of `cells` is NaN: a branch-free pass (compares and ors, vectorised).
#[inline(always)]
fn any_nan<T: Scalar>(cells: &[T]) -> bool {
    cells.iter().fold(false, |a, v| a | v.is_nan())
}

/// `v` if `v > b` else `b`: the running max of the fast scans ([`takes_max`] on cells without
/// NaN; a plane with a NaN is scanned again by [`Scratch::argmax`]).
#[inline(always)]
fn take<T: Scalar>(b: T, v: T) -> T {
    std::hint::select_unpredictable(v > b, v, b)
}

impl<T: Scalar> crate::simd::Kernel for Pairs<'_, T> {
    /// Whether a cell read was NaN (the maxima then are not [`takes_max`]'s; always `false`
    /// for the scatter, whose caller has ruled NaN out).
    type Output = bool;

    #[inline(always)]
    fn call(self) -> bool {
        let Pairs {
            table: t,
            ow,
            plane,
            out,
            scatter,
        } = self;
        let ol = t.small_len;
        let rows = |k: usize| (0..ol / ow).map(move |r| (r, t.idx[k * ol + r * ow]));
        match scatter {
            None => {
                for k in (0..t.kernel_len).step_by(2) {
                    for (r, base) in rows(k) {
                        let src = plane[base..base + 2 * ow].chunks_exact(2);
                        let best = out[r * ow..(r + 1) * ow].iter_mut();
                        if k == 0 {
                            best.zip(src).for_each(|(b, p)| *b = take(p[0], p[1]));
                        } else {
                            best.zip(src)
                                .for_each(|(b, p)| *b = take(take(*b, p[0]), p[1]));
                        }
                    }
                }
                // Cells of no window included: a NaN there costs a rescan, not a wrong answer.
                any_nan(plane)
            }
            Some((best, g, dp)) => {
                // `want`: the max until its first cell is found, then NaN (equal to nothing).
                // No cell is NaN here (the caller's condition), so the argmax is the first cell
                // equal to the max (every earlier cell is below it).
                let want = out;
                want.copy_from_slice(best);
                let (zero, nan) = (T::zero(), T::nan());
                for k in (0..t.kernel_len).step_by(2) {
                    for (r, base) in rows(k) {
                        let cells = base..base + 2 * ow;
                        let src = plane[cells.clone()].chunks_exact(2);
                        let dst = dp[cells].chunks_exact_mut(2);
                        let w = want[r * ow..(r + 1) * ow].iter_mut();
                        let gr = &g[r * ow..(r + 1) * ow];
                        for (((p, d), w), &gv) in src.zip(dst).zip(w).zip(gr) {
                            let hit0 = p[0] == *w;
                            d[0] = std::hint::select_unpredictable(hit0, zero + gv, zero);
                            *w = std::hint::select_unpredictable(hit0, nan, *w);
                            let hit1 = p[1] == *w;
                            d[1] = std::hint::select_unpredictable(hit1, zero + gv, zero);
                            *w = std::hint::select_unpredictable(hit1, nan, *w);
                        }
                    }
                }
                false
            }
        }
    }
}

/// Forward value of a pool.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let p = Pool::of(op, x)?;
    let t = &p.table;
    let (ol, bl) = (t.small_len, t.big_len);
    // Every plane's cells are written below.
    let n = p.out.check_size(op.name())?;
    let mut y = tl_spec::alloc::try_for_overwrite(op.name(), "output", n)?;
    let unpadded = p.unpadded;
    // Planes are independent: split across threads when there is enough of them.
    let per_visit = match p.kind {
        Kind::Max if unpadded => 1,
        Kind::Max => ARGMAX_COST,
        _ => 1,
    };
    let work = x[0].numel() + y.len() * t.kernel_len * per_visit;
    crate::par::rows(&mut y, ol, work, &|first, block: &mut [T]| {
        let mut s = Scratch::new(op, ol)?;
        let planes = x[0].data().get(first * bl..).unwrap_or_default();
        for (plane, yp) in planes
            .chunks_exact(bl.max(1))
            .zip(block.chunks_exact_mut(ol.max(1)))
        {
            match (p.kind, p.pairs) {
                (Kind::Max, Some(ow)) => {
                    if crate::simd::vectorize(Pairs::max(t, ow, plane, yp)) {
                        s.argmax(t, plane);
                        yp.copy_from_slice(&s.best);
                    }
                }
                (Kind::Max, None) if unpadded => {
                    s.max_unpadded(t, plane);
                    yp.copy_from_slice(&s.best);
                }
                (Kind::Max, None) => {
                    s.argmax(t, plane);
                    for ((o, &a), &b) in yp.iter_mut().zip(&s.arg).zip(&s.best) {
                        *o = if a == PAD { T::zero() } else { b };
                    }
                }
                (Kind::Avg, _) => {
                    s.sum.fill(T::zero());
                    for k in 0..t.kernel_len {
                        for (&i, acc) in t.idx[k * ol..(k + 1) * ol].iter().zip(&mut s.sum) {
                            if i != PAD {
                                *acc += plane[i];
                            }
                        }
                    }
                    let inv = T::one() / T::lit(t.kernel_len as f64);
                    for (o, &acc) in yp.iter_mut().zip(&s.sum) {
                        *o = acc * inv;
                    }
                }
                (Kind::Smooth(beta), _) => {
                    let beta = T::lit(beta);
                    s.smooth(t, plane, beta);
                    for ((o, &pv), &z) in yp.iter_mut().zip(&s.best).zip(&s.sum) {
                        *o = pv + z.ln() / beta;
                    }
                }
            }
        }
        Ok(())
    })?;
    tensor(p.out, y)
}

/// Operand cotangent of a pool.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    let p = Pool::of(op, x)?;
    check_shape(op, "output", y, &p.out)?;
    check_shape(op, "cotangent", g, &p.out)?;
    let t = &p.table;
    let (ol, bl) = (t.small_len, t.big_len);
    // Zeroed by each block before its scatter-adds (on its own thread).
    let mut dx = tl_spec::alloc::try_for_overwrite(op.name(), "input cotangent", x[0].numel())?;
    // Planes are independent: split across threads when there is enough of them.
    let unpadded = p.unpadded;
    // The pair kernel's backward needs windows that share no cell.
    let pairs = p.pairs.filter(|_| p.disjoint);
    let per_visit = match (p.kind, pairs) {
        (Kind::Max, Some(_)) => 1,
        (Kind::Max, None) if unpadded => ARGMAX_UNPADDED_COST,
        (Kind::Max, None) => ARGMAX_COST,
        _ => 1,
    };
    let work = dx.len() + g.numel() * t.kernel_len * per_visit;
    crate::par::rows(&mut dx, bl, work, &|first, block: &mut [T]| {
        block.fill(T::zero());
        let mut s = Scratch::new(op, ol)?;
        let xs = x[0].data().get(first * bl..).unwrap_or_default();
        let gs = g.data().get(first * ol..).unwrap_or_default();
        let planes = xs
            .chunks_exact(bl.max(1))
            .zip(gs.chunks_exact(ol.max(1)))
            .zip(block.chunks_exact_mut(bl.max(1)));
        for ((plane, gp), dp) in planes {
            match (p.kind, pairs) {
                (Kind::Max, Some(ow)) => {
                    if crate::simd::vectorize(Pairs::max(t, ow, plane, &mut s.best)) {
                        // A NaN cell: the table's exact scan finds each window's cell.
                        s.argmax(t, plane);
                        for (&a, &gv) in s.arg.iter().zip(gp) {
                            dp[a] += gv;
                        }
                        continue;
                    }
                    let _no_nan = crate::simd::vectorize(Pairs {
                        table: t,
                        ow,
                        plane,
                        out: &mut s.sum,
                        scatter: Some((&s.best, gp, &mut *dp)),
                    });
                }
                (Kind::Max, None) => {
                    if unpadded {
                        s.argmax_unpadded(t, plane);
                    } else {
                        s.argmax(t, plane);
                    }
                    for (&a, &gv) in s.arg.iter().zip(gp) {
                        if a != PAD {
                            dp[a] += gv;
                        }
                    }
                }
                (Kind::Avg, _) => {
                    let inv = T::one() / T::lit(t.kernel_len as f64);
                    for k in 0..t.kernel_len {
                        for (&i, &gv) in t.idx[k * ol..(k + 1) * ol].iter().zip(gp) {
                            if i != PAD {
                                dp[i] += gv * inv;
                            }
                        }
                    }
                }
                (Kind::Smooth(beta), _) => {
                    let beta = T::lit(beta);
                    s.smooth(t, plane, beta);
                    crate::simd::vectorize(SmoothScatter {
                        table: t,
                        plane,
                        g: gp,
                        best: &s.best,
                        sum: &s.sum,
                        beta,
                        out: &mut *dp,
                    });
                }
            }
        }
        Ok(())
    })?;
    Ok(smallvec![Some(tensor(x[0].shape().clone(), dx)?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pool_ignores_padding_and_ties_go_first() {
        let x = Tensor::<f64>::new([1, 3], vec![-3.0, -1.0, -1.0]).unwrap();
        let op = Op::MaxPool {
            kernel: vec![2],
            stride: vec![1],
            padding: vec![1],
        };
        let y = forward(&op, &[&x]).unwrap();
        assert_eq!(y.data(), &[-3.0, -1.0, -1.0, -1.0]);
        let g = Tensor::<f64>::ones([1, 4]);
        let dx = backward(&op, &[&x], &y, &g).unwrap();
        // Window [−1, −1] (cells 1, 2) is a tie: cell 1 gets it.
        assert_eq!(dx[0].as_ref().unwrap().data(), &[1.0, 2.0, 1.0]);
    }

    /// Window values where max pooling's rules bite: NaNs, ties, ±0.
    const EDGY: [f64; 13] = [
        0.5,
        f64::NAN,
        -0.0,
        0.0,
        2.0,
        2.0,
        -1.0,
        f64::NAN,
        3.0,
        -0.0,
        0.0,
        -2.0,
        1.5,
    ];

    #[test]
    fn unpadded_max_and_argmax_agree_with_the_argmax_nan_and_signed_zero_included() {
        // Overlapping and tiling windows over data with NaNs (first cell and later cells), ties
        // and ±0: the branch-free forward equals the argmax cell's value bit for bit, and the
        // branch-free argmax picks the same cells as the general one.
        let x = Tensor::<f64>::from_fn([2, 4, 6], |i| EDGY[(i * 7) % EDGY.len()]);
        for (kernel, stride) in [(vec![2, 2], vec![2, 2]), (vec![3, 2], vec![1, 1])] {
            let op = Op::MaxPool {
                kernel,
                stride,
                padding: vec![0, 0],
            };
            let y = forward(&op, &[&x]).unwrap();
            let p = Pool::of(&op, &[&x]).unwrap();
            assert!(!p.table.idx.contains(&PAD));
            let ol = p.table.small_len;
            let mut s = Scratch::new(&op, ol).unwrap();
            for (plane, yp) in x.data().chunks_exact(24).zip(y.data().chunks_exact(ol)) {
                s.argmax(&p.table, plane);
                for (&a, &v) in s.arg.iter().zip(yp) {
                    assert_eq!(plane[a].to_bits(), v.to_bits(), "{op:?}");
                }
                // The branch-free argmax picks the same cells.
                let cells = s.arg.clone();
                s.argmax_unpadded(&p.table, plane);
                assert_eq!(s.arg, cells, "{op:?}");
            }
        }
    }

    /// The 2-wide fast path ([`Pairs`]) against the general argmax ([`Scratch::argmax`]), bit
    /// for bit, forward and backward: NaNs in first and later cells, ties, ±0, a cotangent of
    /// −0.0, odd sizes (cells in no window), 1-D to 3-D, and windows that overlap along an
    /// earlier axis (the forward takes the fast path, the backward the table).
    #[test]
    fn pair_windows_match_the_general_argmax() {
        let cases: [(&[usize], &[usize], &[usize]); 5] = [
            (&[2, 3, 7, 9], &[2, 2], &[2, 2]),
            (&[2, 3, 8, 8], &[2, 2], &[2, 2]),
            (&[3, 11], &[2], &[2]),
            (&[1, 2, 5, 4, 6], &[2, 1, 2], &[2, 3, 2]),
            (&[2, 2, 7, 8], &[3, 2], &[1, 2]),
        ];
        let spread =
            |dims: &[usize]| Tensor::<f64>::from_fn(dims, |i| EDGY[(i * 7 + i / 5) % EDGY.len()]);
        let mut inputs: Vec<_> = cases.iter().map(|c| (spread(c.0), c.1, c.2)).collect();
        // A second row of cells that ties at ±0 above the first row's max: the order within
        // the pair decides the cell and the sign.
        let (n, z) = (f64::NAN, -0.0);
        let x = Tensor::new(
            [1, 1, 2, 6],
            vec![-1.0, -2.0, -1.0, -2.0, n, 1.0, z, 0.0, n, 2.0, 0.0, z],
        );
        inputs.push((x.unwrap(), &[2, 2], &[2, 2]));
        for (x, kernel, stride) in inputs {
            let op = Op::MaxPool {
                kernel: kernel.to_vec(),
                stride: stride.to_vec(),
                padding: vec![0; kernel.len()],
            };
            let p = Pool::of(&op, &[&x]).unwrap();
            assert!(p.pairs.is_some(), "{op:?}");
            let y = forward(&op, &[&x]).unwrap();
            let g = Tensor::<f64>::from_fn(y.shape().dims(), |i| [1.0, -0.0, -2.5][i % 3]);
            let dx = backward(&op, &[&x], &y, &g).unwrap()[0].clone().unwrap();
            let (t, ol, bl) = (&p.table, p.table.small_len, p.table.big_len);
            let mut s = Scratch::new(&op, ol).unwrap();
            let planes = x.data().chunks_exact(bl).zip(dx.data().chunks_exact(bl));
            let outs = y.data().chunks_exact(ol).zip(g.data().chunks_exact(ol));
            for ((plane, dp), (yp, gp)) in planes.zip(outs) {
                s.argmax(t, plane);
                let mut want = vec![0.0; bl];
                for ((&a, &v), &gv) in s.arg.iter().zip(yp).zip(gp) {
                    assert_eq!(plane[a].to_bits(), v.to_bits(), "{op:?}");
                    want[a] += gv;
                }
                let bits = |v: &[f64]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(dp), bits(&want), "{op:?}");
            }
        }
    }

    /// Every maxPool path (the table with and without padding, the branch-free scans, the pair
    /// kernels forward and backward) against the spec bit for bit, on planes whose NaNs sit in
    /// first and later cells (a NaN anywhere in a window is its max and takes its gradient)
    /// beside planes without NaN (which take the fast scans).
    #[test]
    fn every_max_pool_path_is_the_spec_with_nan_anywhere() {
        /// Dims, kernel, stride, padding.
        type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize]);
        let cases: [Case<'_>; 5] = [
            (&[2, 3, 8, 8], &[2, 2], &[2, 2], &[0, 0]),
            (&[2, 3, 7, 9], &[2, 2], &[2, 2], &[0, 0]),
            (&[2, 3, 7, 9], &[3, 2], &[1, 1], &[0, 0]),
            (&[2, 3, 7, 9], &[3, 3], &[2, 1], &[1, 1]),
            (&[3, 11], &[3], &[2], &[1]),
        ];
        for (dims, kernel, stride, padding) in cases {
            for shift in 0..3 {
                // NaN in the first half's planes only: the second half's take the fast scans.
                let half = dims.iter().product::<usize>() / 2;
                let x = Tensor::<f64>::from_fn(dims, |i| {
                    let v = EDGY[(i * 5 + shift) % EDGY.len()];
                    if i >= half {
                        if v.is_nan() { 1.25 } else { v }
                    } else if (i + shift) % 11 == 4 {
                        f64::NAN
                    } else {
                        v
                    }
                });
                let op = Op::MaxPool {
                    kernel: kernel.to_vec(),
                    stride: stride.to_vec(),
                    padding: padding.to_vec(),
                };
                let p = tl_spec::ops::pool::PoolParams {
                    kernel,
                    stride,
                    padding,
                };
                let y = forward(&op, &[&x]).unwrap();
                let want = tl_spec::ops::pool::max_pool(&x, p).unwrap();
                let bits = |v: &[f64]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(y.data()), bits(want.data()), "{op:?}");
                assert!(y.data().iter().any(|v| v.is_nan()), "{op:?}");
                let g = Tensor::<f64>::from_fn(y.shape().dims(), |i| (i % 7) as f64 + 1.0);
                let dx = backward(&op, &[&x], &y, &g).unwrap()[0].clone().unwrap();
                let want = tl_spec::ops::pool::max_pool_vjp(&x, p, &g).unwrap();
                assert_eq!(bits(dx.data()), bits(want.data()), "{op:?}");
            }
        }
    }

    /// Issue 14: a huge kernel over a padded empty input is a small output and a huge window
    /// table; the table is refused (`TooLarge`, naming the op) before it is allocated.
    #[test]
    fn an_oversized_window_table_is_an_error() {
        let x = Tensor::<f64>::new([1, 1, 0], vec![]).unwrap();
        let op = Op::AvgPool {
            kernel: vec![1 << 40],
            stride: vec![1],
            padding: vec![1 << 39],
        };
        let e = forward(&op, &[&x]).unwrap_err().to_string();
        assert!(e.contains("avgPool") && e.contains("too large"), "{e}");
        // Absurd paddings are errors, not overflows.
        let op = Op::MaxPool {
            kernel: vec![2],
            stride: vec![1],
            padding: vec![usize::MAX],
        };
        assert!(forward(&op, &[&x]).is_err());
    }
}
