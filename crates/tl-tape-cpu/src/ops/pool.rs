//! Pooling kernels: `maxPool`, `avgPool` and `smoothMaxPool`, N-D (spatial rank 1..=8), on
//! `(C, s..)` or `(N, C, s..)` operands.
//!
//! One pass per channel plane over the window index table ([`super::window`]), kernel offsets
//! outer and output cells inner, with per-output accumulators allocated once per block of
//! planes (planes are independent and split across threads, [`crate::par`]):
//! - maxPool keeps the running max and its cell (strict `>`, so a tie keeps the first cell in
//!   row-major window order; padded cells are skipped; a window with no real cell gives 0). The
//!   backward recomputes the argmax and scatters `g` to it.
//! - avgPool sums the real cells and divides by the kernel volume; the backward scatters
//!   `g / volume`.
//! - smoothMaxPool takes the pivot (max for β > 0, min for β < 0) over the window values with
//!   padded cells as 0, then `y = p + ln Σ exp(β(v − p)) / β`; the backward scatters
//!   `g · exp(β(v − p)) / Σ` to the real cells.

use smallvec::smallvec;
use tl_ir::Op;
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
        Ok(Pool {
            kind,
            out: Shape::from(out),
            table: geo.table(op)?,
        })
    }
}

/// What one window-cell visit of the argmax costs, in the element visits that
/// [`crate::par::rows`] weighs against its threshold: a load, a compare and a data-dependent
/// branch that mispredicts about half the time on activations, against one streamed element.
/// Measured on the cnn step's second pool (64×16×14×14, 2×2): its backward (50 176 windows of 4
/// cells) stayed on one thread at weight 1 and is split at 4 (docs/performance.md).
const ARGMAX_COST: usize = 4;

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
                if i != PAD && (*a == PAD || plane[i] > *b) {
                    *b = plane[i];
                    *a = i;
                }
            }
        }
    }

    /// Fill `best` with each window's max when no window has a padded cell: the first cell's
    /// value, then `if v > best { v } else { best }` per later cell. That is the value at the
    /// [`argmax`](Self::argmax) cell (strict `>`: NaN never displaces, a first-cell NaN stays),
    /// without tracking the cell, so it compiles to branch-free `max` instructions (the
    /// argmax's data-dependent branch mispredicts about half the time on activations).
    fn max_unpadded(&mut self, t: &Table, plane: &[T]) {
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

/// Forward value of a pool.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let p = Pool::of(op, x)?;
    let t = &p.table;
    let (ol, bl) = (t.small_len, t.big_len);
    // Every plane's cells are written below.
    let n = p.out.check_size(op.name())?;
    let mut y = tl_spec::alloc::try_for_overwrite(op.name(), "output", n)?;
    let unpadded = t.kernel_len > 0 && !t.idx.contains(&PAD);
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
            match p.kind {
                Kind::Max if unpadded => {
                    s.max_unpadded(t, plane);
                    yp.copy_from_slice(&s.best);
                }
                Kind::Max => {
                    s.argmax(t, plane);
                    for ((o, &a), &b) in yp.iter_mut().zip(&s.arg).zip(&s.best) {
                        *o = if a == PAD { T::zero() } else { b };
                    }
                }
                Kind::Avg => {
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
                Kind::Smooth(beta) => {
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
    let per_visit = if matches!(p.kind, Kind::Max) {
        ARGMAX_COST
    } else {
        1
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
            match p.kind {
                Kind::Max => {
                    s.argmax(t, plane);
                    for (&a, &gv) in s.arg.iter().zip(gp) {
                        if a != PAD {
                            dp[a] += gv;
                        }
                    }
                }
                Kind::Avg => {
                    let inv = T::one() / T::lit(t.kernel_len as f64);
                    for k in 0..t.kernel_len {
                        for (&i, &gv) in t.idx[k * ol..(k + 1) * ol].iter().zip(gp) {
                            if i != PAD {
                                dp[i] += gv * inv;
                            }
                        }
                    }
                }
                Kind::Smooth(beta) => {
                    let beta = T::lit(beta);
                    s.smooth(t, plane, beta);
                    for k in 0..t.kernel_len {
                        let row = t.idx[k * ol..(k + 1) * ol].iter();
                        for (((&i, &gv), &pv), &z) in row.zip(gp).zip(&s.best).zip(&s.sum) {
                            if i != PAD {
                                dp[i] += gv * approx::exp(beta * (plane[i] - pv)) / z;
                            }
                        }
                    }
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

    #[test]
    fn unpadded_max_is_the_value_at_the_argmax_nan_and_signed_zero_included() {
        // Overlapping and tiling windows over data with NaNs (first cell and later cells), ties
        // and ±0: the branch-free forward equals the argmax cell's value bit for bit.
        let vals = [
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
        ];
        let x = Tensor::<f64>::from_fn([2, 4, 6], |i| vals[(i * 7) % vals.len()]);
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
