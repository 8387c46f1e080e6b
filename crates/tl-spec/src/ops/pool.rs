//! N-D pooling over channels-first operands `(C, s..)` or `(N, C, s..)`, spatial rank 1..=8:
//! max, average and smooth max (log-sum-exp), with the conventions of `docs/semantics.md`:
//! - maxPool ignores padded cells (−∞); a tie goes to the first cell in row-major window order;
//!   a window with no real cell gives 0 and no gradient;
//! - avgPool counts padded cells as 0 and always divides by the kernel volume;
//! - smoothMaxPool: `y = p + log(Σ exp(β(v − p)))/β` over the window values `v` (padded cells
//!   are the value 0), pivot `p` = window max (β > 0) or min (β < 0); its VJP is the
//!   softmax(β·v)-weighted cotangent (padded cells receive nothing).
//!
//! Padding must satisfy `2·p ≤ k` per axis (PyTorch's rule).

use super::window::{Window, check_params, forward_out, split_operand};
use crate::{Error, Result, Scalar, Shape, Tensor};

/// Kernel, stride and padding of a pool, one entry per spatial axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolParams<'a> {
    /// Window extent per spatial axis (≥ 1).
    pub kernel: &'a [usize],
    /// Stride per spatial axis (≥ 1).
    pub stride: &'a [usize],
    /// Padding per spatial axis, both sides, at most half the kernel.
    pub padding: &'a [usize],
}

/// A pool's parameters on their own, before any operand: 1 to 8 spatial axes, one kernel size
/// (≥ 1), stride (≥ 1) and padding per axis, the padding at most half the kernel (PyTorch's
/// rule: a window always holds a real cell). The one check of the ops and of tl-nn's layers.
pub fn pool_params(op: &'static str, p: PoolParams<'_>) -> Result<()> {
    let d = p.kernel.len();
    check_params(op, d, Some(p.kernel), p.stride, p.padding)?;
    if let Some(i) = (0..d).find(|&i| {
        p.padding[i]
            .checked_mul(2)
            .is_none_or(|p2| p2 > p.kernel[i])
    }) {
        return Err(Error::param(
            op,
            format!(
                "padding {:?} exceeds half the kernel {:?} along spatial axis {i} (PyTorch's rule: 2·padding ≤ kernel)",
                p.padding, p.kernel
            ),
        ));
    }
    Ok(())
}

fn geometry(op: &'static str, x: &Shape, p: PoolParams<'_>) -> Result<(Window, usize)> {
    let d = p.kernel.len();
    pool_params(op, p)?;
    let (batch, c, xs) = split_operand(op, "input", x, d)?;
    let small = forward_out(op, x, xs, p.kernel, p.stride, p.padding)?;
    let win = Window {
        batch,
        big: xs.to_vec(),
        small,
        kernel: p.kernel.to_vec(),
        stride: p.stride.to_vec(),
        padding: p.padding.to_vec(),
    };
    Ok((win, c))
}

/// Shape rule of `maxPool` / `avgPool` / `smoothMaxPool` (`op` names the op in errors).
pub fn pool_shape(op: &'static str, x: &Shape, p: PoolParams<'_>) -> Result<Shape> {
    let (win, c) = geometry(op, x, p)?;
    Ok(win.shape(c, &win.small))
}

/// Parameter check of `smoothMaxPool`: β finite and non-zero.
pub fn smooth_max_params(beta: f64) -> Result<()> {
    if beta.is_finite() && beta != 0.0 {
        Ok(())
    } else {
        Err(Error::param(
            "smoothMaxPool",
            format!("beta must be finite and non-zero, got {beta}"),
        ))
    }
}

/// Run `f(window cells, out index)` over every output cell; window cells are flat indices into
/// `x` (`None` for padding).
fn each_window(
    op: &'static str,
    x: &Shape,
    p: PoolParams<'_>,
    mut f: impl FnMut(&[Option<usize>], usize),
) -> Result<Shape> {
    let (win, c) = geometry(op, x, p)?;
    // The output's size first: an empty input's other dims may be huge, and the loop below
    // runs once per output element.
    if win.checked_len(op, c, &win.small)? == 0 {
        return Ok(win.shape(c, &win.small));
    }
    let (bl, sl) = (win.big_len(), win.small_len());
    let windows = win.windows(op)?;
    let mut cells = Vec::new();
    for plane in 0..win.batches() * c {
        for (o, w) in windows.iter().enumerate() {
            cells.clear();
            cells.extend(w.iter().map(|q| q.map(|q| plane * bl + q)));
            f(&cells, plane * sl + o);
        }
    }
    Ok(win.shape(c, &win.small))
}

/// Whether a window scan's next cell `v` replaces the running max `best`: `v` is greater, or
/// `v` is NaN while `best` is not (so the max is NaN wherever a NaN is, as PyTorch's, and the
/// first NaN holds it). The one rule of every maxPool argmax, on every backend.
pub fn takes_max<T: Scalar>(best: T, v: T) -> bool {
    !best.is_nan() && (v > best || v.is_nan())
}

/// The window's argmax cell (row-major window order), if any real cell: the first NaN, else the
/// first cell holding the max ([`takes_max`]).
fn argmax<T: Scalar>(x: &[T], cells: &[Option<usize>]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &q in cells.iter().flatten() {
        if best.is_none_or(|b| takes_max(x[b], x[q])) {
            best = Some(q);
        }
    }
    best
}

fn check_same<T: Scalar>(op: &'static str, x: &Tensor<T>, t: &Tensor<T>, what: &str) -> Result<()> {
    if x.shape() == t.shape() {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("{what} has shape {}, expected {}", t.shape(), x.shape()),
        ))
    }
}

fn gather<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    p: PoolParams<'_>,
    f: impl Fn(&[Option<usize>]) -> T,
) -> Result<Tensor<T>> {
    let out_shape = pool_shape(op, x.shape(), p)?;
    let mut out = crate::alloc::try_with_capacity(op, "output", out_shape.numel())?;
    let shape = each_window(op, x.shape(), p, |cells, _| out.push(f(cells)))?;
    Tensor::new(shape, out)
}

fn scatter<T: Scalar>(
    op: &'static str,
    x: &Tensor<T>,
    p: PoolParams<'_>,
    g: &Tensor<T>,
    f: impl Fn(&[Option<usize>], T, &mut [T]),
) -> Result<Tensor<T>> {
    let out_shape = pool_shape(op, x.shape(), p)?;
    if g.shape() != &out_shape {
        return Err(Error::shape(
            op,
            format!("cotangent has shape {}, expected {out_shape}", g.shape()),
        ));
    }
    let mut dx = crate::alloc::try_zeroed(op, "gradient", x.numel())?;
    each_window(op, x.shape(), p, |cells, o| f(cells, g.data()[o], &mut dx))?;
    Tensor::new(x.shape().clone(), dx)
}

/// Max over each window, padded cells ignored; NaN where the window holds one ([`takes_max`]).
/// PyTorch: `F.max_pool{1,2,3}d`.
pub fn max_pool<T: Scalar>(x: &Tensor<T>, p: PoolParams<'_>) -> Result<Tensor<T>> {
    let d = x.data();
    gather("maxPool", x, p, |c| {
        argmax(d, c).map_or(T::zero(), |q| d[q])
    })
}
/// VJP of `maxPool`: each window's cotangent goes to its argmax cell (its first NaN, else the
/// first cell holding the max).
pub fn max_pool_vjp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    let d = x.data();
    scatter("maxPool", x, p, g, |c, g, dx| {
        if let Some(q) = argmax(d, c) {
            dx[q] += g;
        }
    })
}
/// JVP of `maxPool`: the tangent at each window's argmax cell (0 for an all-padding window).
pub fn max_pool_jvp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    check_same("maxPool", x, dx, "tangent")?;
    let (d, t) = (x.data(), dx.data());
    gather("maxPool", x, p, |c| {
        argmax(d, c).map_or(T::zero(), |q| t[q])
    })
}

/// The smallest gap, over all windows, between the window max and the next largest real value
/// (infinite where a window has one real cell): how far `x` is from a maxPool tie.
pub fn max_pool_tie_gap(x: &Tensor<f64>, p: PoolParams<'_>) -> Result<f64> {
    let d = x.data();
    let mut gap = f64::INFINITY;
    each_window("maxPool", x.shape(), p, |cells, _| {
        if let Some(m) = argmax(d, cells) {
            for &q in cells.iter().flatten() {
                if q != m {
                    gap = gap.min(d[m] - d[q]);
                }
            }
        }
    })?;
    Ok(gap)
}

/// Sum of each window (padded cells 0) over the kernel volume. PyTorch: `F.avg_pool{1,2,3}d`
/// with `count_include_pad=True`.
pub fn avg_pool<T: Scalar>(x: &Tensor<T>, p: PoolParams<'_>) -> Result<Tensor<T>> {
    let d = x.data();
    let vol = kernel_volume(p);
    gather("avgPool", x, p, |c| {
        c.iter().flatten().map(|&q| d[q]).sum::<T>() / vol
    })
}
/// The kernel volume avgPool divides by, as `T` (products in f64: a kernel whose volume
/// overflows `usize` is refused by the window table before any division).
fn kernel_volume<T: Scalar>(p: PoolParams<'_>) -> T {
    T::lit(p.kernel.iter().map(|&k| k as f64).product())
}

/// VJP of `avgPool`: `g / volume` to every real cell of the window.
pub fn avg_pool_vjp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    let vol = kernel_volume(p);
    scatter("avgPool", x, p, g, |c, g, dx| {
        for &q in c.iter().flatten() {
            dx[q] += g / vol;
        }
    })
}
/// JVP of `avgPool` (linear): the average pool of the tangent.
pub fn avg_pool_jvp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    check_same("avgPool", x, dx, "tangent")?;
    avg_pool(dx, p)
}

/// The window values (padded cells as 0) and their softmax(β·v) weights.
fn smooth_window<T: Scalar>(d: &[T], cells: &[Option<usize>], beta: T) -> (T, Vec<T>) {
    let v: Vec<T> = cells
        .iter()
        .map(|q| q.map_or(T::zero(), |q| d[q]))
        .collect();
    let pivot = if beta > T::zero() {
        v.iter().copied().fold(T::neg_infinity(), T::max)
    } else {
        v.iter().copied().fold(T::infinity(), T::min)
    };
    let e: Vec<T> = v.iter().map(|&v| (beta * (v - pivot)).exp()).collect();
    let z: T = e.iter().copied().sum();
    let y = pivot + z.ln() / beta;
    (y, e.into_iter().map(|e| e / z).collect())
}

/// `p + log(Σ exp(β(v − p)))/β` per window (padded cells are the value 0). No PyTorch
/// equivalent (a log-sum-exp surrogate of max-pool).
pub fn smooth_max_pool<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    beta: f64,
) -> Result<Tensor<T>> {
    smooth_max_params(beta)?;
    let d = x.data();
    gather("smoothMaxPool", x, p, |c| {
        smooth_window(d, c, T::lit(beta)).0
    })
}
/// VJP of `smoothMaxPool`: the cotangent weighted by softmax(β·v) over each window.
pub fn smooth_max_pool_vjp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    beta: f64,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    smooth_max_params(beta)?;
    let d = x.data();
    scatter("smoothMaxPool", x, p, g, |c, g, dx| {
        let (_, wts) = smooth_window(d, c, T::lit(beta));
        for (q, w) in c.iter().zip(wts) {
            if let Some(q) = q {
                dx[*q] += g * w;
            }
        }
    })
}
/// JVP of `smoothMaxPool`: the softmax(β·v)-weighted tangents of each window.
pub fn smooth_max_pool_jvp<T: Scalar>(
    x: &Tensor<T>,
    p: PoolParams<'_>,
    beta: f64,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    smooth_max_params(beta)?;
    check_same("smoothMaxPool", x, dx, "tangent")?;
    let (d, t) = (x.data(), dx.data());
    gather("smoothMaxPool", x, p, |c| {
        let (_, wts) = smooth_window(d, c, T::lit(beta));
        c.iter()
            .zip(wts)
            .map(|(q, w)| q.map_or(T::zero(), |q| w * t[q]))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_d_pools_by_hand() {
        // x = [-3, -1, -2], kernel 2, stride 1, padding 1: windows [pad,-3], [-3,-1], [-1,-2],
        // [-2,pad].
        let x = Tensor::<f64>::new([1, 3], vec![-3.0, -1.0, -2.0]).unwrap();
        let p = PoolParams {
            kernel: &[2],
            stride: &[1],
            padding: &[1],
        };
        assert_eq!(max_pool(&x, p).unwrap().data(), &[-3.0, -1.0, -1.0, -2.0]);
        assert_eq!(avg_pool(&x, p).unwrap().data(), &[-1.5, -2.0, -1.5, -1.0]);
        let s = smooth_max_pool(&x, p, 50.0).unwrap();
        // The padded 0 takes part: the first window's smooth max is near 0, not −3.
        assert!(s.data()[0].abs() < 0.05, "{:?}", s.data());
    }

    /// NaN wins its window wherever it is, the first NaN taking the gradient (PyTorch's
    /// `max_pool`: NaN wherever it is).
    #[test]
    fn a_nan_anywhere_in_a_window_is_its_max() {
        let nan = f64::NAN;
        // Windows of 2 at stride 1: [1, NaN], [NaN, 3], [3, NaN], [NaN, NaN].
        let x = Tensor::<f64>::new([1, 5], vec![1.0, nan, 3.0, nan, nan]).unwrap();
        let p = PoolParams {
            kernel: &[2],
            stride: &[1],
            padding: &[0],
        };
        let y = max_pool(&x, p).unwrap();
        assert!(y.data().iter().all(|v| v.is_nan()), "{:?}", y.data());
        let g = Tensor::<f64>::new([1, 4], vec![1.0, 2.0, 4.0, 8.0]).unwrap();
        let dx = max_pool_vjp(&x, p, &g).unwrap();
        assert_eq!(dx.data(), &[0.0, 3.0, 0.0, 12.0, 0.0]);
        let t = Tensor::<f64>::new([1, 5], vec![10.0, 20.0, 30.0, 40.0, 50.0]).unwrap();
        assert_eq!(
            max_pool_jvp(&x, p, &t).unwrap().data(),
            &[20.0, 20.0, 40.0, 40.0]
        );
    }

    /// A kernel of 2²¹ × 2²¹ over a 4 × 4 input padded by 2²⁰: 25 small output cells, but a
    /// window table of 25·2⁴² entries. The reference refuses it with the op's name before
    /// building any of it (it used to enumerate the kernel's 2⁴² cells first).
    #[test]
    fn a_window_table_past_the_cap_is_an_error_not_an_abort() {
        let x = Tensor::<f64>::zeros([1, 1, 4, 4]);
        let (k, pad) = (1usize << 21, 1usize << 20);
        let p = PoolParams {
            kernel: &[k, k],
            stride: &[1, 1],
            padding: &[pad, pad],
        };
        assert_eq!(
            pool_shape("maxPool", x.shape(), p).unwrap().dims(),
            [1, 1, 5, 5]
        );
        let e = max_pool(&x, p).unwrap_err();
        assert!(
            matches!(e, crate::Error::TooLarge { op: "maxPool", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("window table"), "{e}");
    }
}
