//! Convolution kernels: `conv` and `convTranspose`, N-D (spatial rank 1..=8), through im2col and
//! the GEMM of [`super::linalg::gemm`].
//!
//! The weight is `(A, C, k..)` with A the channels of the small side (conv output, convT input)
//! and C those of the big side (conv input, convT output). Per batch entry, with
//! `cols = im2col(big)` of shape `(C·K, O)` (K kernel cells, O small cells, padded cells 0):
//! - conv: `y = W·cols + b`; backward `dW += G·colsᵀ`, `dx = col2im(Wᵀ·G)`, `db = Σ G`;
//! - convTranspose: `y = col2im(Wᵀ·x) + b`; backward `dx = W·im2col(G)`,
//!   `dW += x·im2col(G)ᵀ`, `db = Σ G`.
//!
//! The window index table is built once per call (`super::window`); im2col and col2im are
//! flat gathers/scatters through it, with one `cols` buffer reused across the batch entries of
//! a thread. Batch entries are independent in the forward pass and in conv's input cotangent,
//! which split across threads ([`crate::par`]); the weight and bias cotangents sum over the
//! batch in batch order on one thread, so the bits do not depend on the thread count.

use ndarray::{ArrayView2, ShapeBuilder};
use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use super::linalg::gemm;
use super::window::{Geometry, PAD, Table, bad, split};
use super::{Grads, check_arity, check_shape, sum_slice, tensor, wrong_family};
use crate::Result;

/// The dims of one conv application.
struct Conv {
    transpose: bool,
    batches: usize,
    batched: bool,
    /// Small-side channels (weight dim 0).
    a: usize,
    /// Big-side channels (weight dim 1).
    c: usize,
    geo: Geometry,
}

impl Conv {
    fn of<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Conv> {
        let (transpose, stride, padding) = match op {
            Op::Conv { stride, padding } => (false, stride, padding),
            Op::ConvTranspose { stride, padding } => (true, stride, padding),
            _ => return Err(wrong_family(op, "conv")),
        };
        check_arity(op, x)?;
        let (w, b, xs) = (
            x[0].shape().dims(),
            x[1].shape().dims(),
            x[2].shape().dims(),
        );
        if w.len() < 3 {
            return Err(bad(op, format!("weight {w:?} must have rank ≥ 3")));
        }
        let d = w.len() - 2;
        let (batches, xc, spatial) = split(op, "input", xs, d)?;
        let (a, c) = (w[0], w[1]);
        let (in_c, out_c) = if transpose { (a, c) } else { (c, a) };
        if xc != in_c || b != [out_c] {
            return Err(bad(
                op,
                format!("weight {w:?}, bias {b:?} and input {xs:?} disagree"),
            ));
        }
        let geo = if transpose {
            Geometry::transposed(op, &spatial, &w[2..], stride, padding)?
        } else {
            Geometry::forward(op, &spatial, &w[2..], stride, padding)?
        };
        Ok(Conv {
            transpose,
            batches,
            batched: xs.len() == d + 2,
            a,
            c,
            geo,
        })
    }

    fn out_dims(&self) -> Vec<usize> {
        let mut dims = Vec::with_capacity(self.geo.big.len() + 2);
        if self.batched {
            dims.push(self.batches);
        }
        if self.transpose {
            dims.push(self.c);
            dims.extend_from_slice(&self.geo.big);
        } else {
            dims.push(self.a);
            dims.extend_from_slice(&self.geo.small);
        }
        dims
    }
}

/// `cols[(c·K + k)·O + o] = big[c·B + table[k·O + o]]` (0 where padded).
fn im2col<T: Scalar>(t: &Table, channels: usize, big: &[T], cols: &mut [T]) {
    let (kl, ol, bl) = (t.kernel_len, t.small_len, t.big_len);
    for c in 0..channels {
        let plane = &big[c * bl..(c + 1) * bl];
        for k in 0..kl {
            let row = &mut cols[(c * kl + k) * ol..(c * kl + k + 1) * ol];
            // Stride-1 windows: whole runs of cells as slice copies.
            if let Some(runs) = &t.runs {
                if runs.padded[k] {
                    row.fill(T::zero());
                }
                for &(o, i, len) in runs.row(k) {
                    row[o..o + len].copy_from_slice(&plane[i..i + len]);
                }
                continue;
            }
            for (r, &i) in row.iter_mut().zip(&t.idx[k * ol..(k + 1) * ol]) {
                *r = if i == PAD { T::zero() } else { plane[i] };
            }
        }
    }
}

/// `big[c·B + table[k·O + o]] += cols[(c·K + k)·O + o]` (padded cells dropped).
fn col2im<T: Scalar>(t: &Table, channels: usize, cols: &[T], big: &mut [T]) {
    let (kl, ol, bl) = (t.kernel_len, t.small_len, t.big_len);
    for c in 0..channels {
        let plane = &mut big[c * bl..(c + 1) * bl];
        for k in 0..kl {
            let row = &cols[(c * kl + k) * ol..(c * kl + k + 1) * ol];
            // Stride-1 windows: each run is a slice add, runs in increasing `o`, so every big
            // cell receives its contributions in the gather loop's order.
            if let Some(runs) = &t.runs {
                for &(o, i, len) in runs.row(k) {
                    let dst = &mut plane[i..i + len];
                    dst.iter_mut()
                        .zip(&row[o..o + len])
                        .for_each(|(p, &v)| *p += v);
                }
                continue;
            }
            for (&v, &i) in row.iter().zip(&t.idx[k * ol..(k + 1) * ol]) {
                if i != PAD {
                    plane[i] += v;
                }
            }
        }
    }
}

fn view<'a, T: Scalar>(
    op: &Op,
    data: &'a [T],
    rows: usize,
    cols: usize,
) -> Result<ArrayView2<'a, T>> {
    ArrayView2::from_shape((rows, cols).strides((cols, 1)), data)
        .map_err(|e| bad(op, format!("matrix view: {e}")))
}

/// Multiply-adds of one GEMM per batch entry (the work measure of [`crate::par::rows`]).
fn batch_work(cv: &Conv, t: &Table) -> usize {
    cv.batches
        .saturating_mul(cv.a)
        .saturating_mul(cv.c * t.kernel_len)
        .saturating_mul(t.small_len)
}

/// `out_n = col2im(Wᵀ·src_n)` (+ `bias` per big channel) for every batch entry `n`, entries
/// split across threads, each block with its own workspace; `out`'s values are not read (each
/// entry is zeroed on its block's thread before the scatter-adds): convTranspose's forward (`src` =
/// x) and conv's input cotangent (`src` = g). `src_n` is small (A, O), `out_n` big (C, B).
fn col2im_products<T: Scalar>(
    op: &Op,
    cv: &Conv,
    t: &Table,
    wv: &ArrayView2<'_, T>,
    src: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) -> Result<()> {
    let (a, c, kl, ol, bl) = (cv.a, cv.c, t.kernel_len, t.small_len, t.big_len);
    crate::par::rows(out, c * bl, batch_work(cv, t), &|first, block: &mut [T]| {
        let mut cols = workspace(op, "the im2col workspace", &[c, kl, ol])?;
        for (k, on) in block.chunks_exact_mut((c * bl).max(1)).enumerate() {
            let n = first + k;
            let sn = view(op, &src[n * a * ol..(n + 1) * a * ol], a, ol)?;
            gemm(op, &wv.t(), &sn, T::zero(), &mut cols)?;
            on.fill(T::zero());
            col2im(t, c, &cols, on);
            if let Some(b) = bias {
                add_bias(on, b, bl);
            }
        }
        tl_spec::pool::give(cols);
        Ok(())
    })
}

/// Forward value of `conv` / `convTranspose`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let cv = Conv::of(op, x)?;
    let (w, b, input) = (x[0].data(), x[1].data(), x[2].data());
    let t = cv.geo.table(op)?;
    let (a, c, kl, ol, bl) = (cv.a, cv.c, t.kernel_len, t.small_len, t.big_len);
    let wv = view(op, w, a, c * kl)?;
    // The im2col workspace (C·K rows of O cells) is sized by the input: checked (issue 14)
    // before the output is made; each block of batch entries below makes its own.
    let n_cols = tl_spec::Shape::new(&[c, kl, ol]).check_size(op.name())?;
    tl_spec::alloc::check_len::<T>(op.name(), "the im2col workspace", n_cols)?;
    // Batch entries are independent: split across threads when there is enough work.
    let work = batch_work(&cv, &t);
    if cv.transpose {
        let mut y = for_overwrite(op, "output", &[cv.batches, c, bl])?;
        col2im_products(op, &cv, &t, &wv, input, Some(b), &mut y)?;
        tensor(cv.out_dims(), y)
    } else {
        // Each entry's product (β = 0) writes all of its cells.
        let mut y = for_overwrite(op, "output", &[cv.batches, a, ol])?;
        crate::par::rows(&mut y, a * ol, work, &|first, block: &mut [T]| {
            let mut cols = workspace(op, "the im2col workspace", &[c, kl, ol])?;
            for (k, yn) in block.chunks_exact_mut((a * ol).max(1)).enumerate() {
                let n = first + k;
                im2col(&t, c, &input[n * c * bl..(n + 1) * c * bl], &mut cols);
                gemm(op, &wv, &view(op, &cols, c * kl, ol)?, T::zero(), yn)?;
                add_bias(yn, b, ol);
            }
            tl_spec::pool::give(cols);
            Ok(())
        })?;
        tensor(cv.out_dims(), y)
    }
}

/// A zeroed buffer of `∏ dims` values for `op` (`what` names it in errors): the product is
/// checked for overflow and the bytes against the allocation cap ([`tl_spec::alloc`]), so a
/// workspace too large to allocate is `TooLarge`, not an abort.
/// Batch entries per partial sum of conv's weight cotangent (see [`backward_masked`]): the chunks run
/// across threads; the result depends on this constant, never on the thread count.
pub const DW_CHUNK: usize = 8;

fn workspace<T: Scalar>(op: &Op, what: &str, dims: &[usize]) -> Result<Vec<T>> {
    let n = tl_spec::Shape::new(dims).check_size(op.name())?;
    Ok(tl_spec::alloc::try_vec(op.name(), what, n, T::zero())?)
}

/// [`workspace`] for a kernel that writes every value before reading any: a spare pool buffer
/// keeps its old values ([`tl_spec::alloc::try_for_overwrite`]).
fn for_overwrite<T: Scalar>(op: &Op, what: &str, dims: &[usize]) -> Result<Vec<T>> {
    let n = tl_spec::Shape::new(dims).check_size(op.name())?;
    Ok(tl_spec::alloc::try_for_overwrite(op.name(), what, n)?)
}

fn add_bias<T: Scalar>(y: &mut [T], b: &[T], cells: usize) {
    for (row, &bc) in y.chunks_exact_mut(cells.max(1)).zip(b) {
        for v in row {
            *v += bc;
        }
    }
}

/// Operand cotangents `(dw, db, dx)` of `conv` / `convTranspose`, computing only those whose
/// `needed` entry is true (missing entries count as true, so `&[]` computes all three; the
/// others are `None`). A first layer, whose input needs no
/// gradient, skips the `col2im` pass; frozen weights skip the weight GEMM and its `im2col`.
pub fn backward_masked<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    needed: &[bool],
) -> Result<Grads<T>> {
    let cv = Conv::of(op, x)?;
    let out = tl_spec::Shape::from(cv.out_dims());
    check_shape(op, "output", y, &out)?;
    check_shape(op, "cotangent", g, &out)?;
    let need = |i: usize| needed.get(i).copied().unwrap_or(true);
    let (need_w, need_b, need_x) = (need(0), need(1), need(2));
    let (w, input, gd) = (x[0].data(), x[2].data(), g.data());
    let t = cv.geo.table(op)?;
    let (a, c, kl, ol, bl) = (cv.a, cv.c, t.kernel_len, t.small_len, t.big_len);
    let wv = view(op, w, a, c * kl)?;
    // Workspaces and cotangents sized by the input: checked against the allocation cap.
    let mut cols = if cv.transpose && (need_w || need_x) {
        workspace(op, "the im2col workspace", &[c, kl, ol])?
    } else {
        Vec::new()
    };
    let mut dw = workspace(op, "weight cotangent", &[a, c, if need_w { kl } else { 0 }])?;
    let mut dx = for_overwrite(
        op,
        "input cotangent",
        &[if need_x { input.len() } else { 0 }],
    )?;
    let out_c = if cv.transpose { c } else { a };
    let mut db = workspace(op, "bias cotangent", &[if need_b { out_c } else { 0 }])?;
    // conv's input cotangent is per batch entry (dx_n = col2im(Wᵀ·G_n)): split across threads
    // when there is enough work, each block with its own workspace. The bias cotangent sums
    // over the batch in order, the weight cotangent in chunks (below).
    if need_x && !cv.transpose {
        col2im_products(op, &cv, &t, &wv, gd, None, &mut dx)?;
    }
    for n in 0..cv.batches {
        if cv.transpose {
            // g is big (C, B), x small (A, O).
            let gn = &gd[n * c * bl..(n + 1) * c * bl];
            if need_w || need_x {
                im2col(&t, c, gn, &mut cols);
                let colv = view(op, &cols, c * kl, ol)?;
                if need_x {
                    let dxn = &mut dx[n * a * ol..(n + 1) * a * ol];
                    gemm(op, &wv, &colv, T::zero(), dxn)?;
                }
                if need_w {
                    let xn = view(op, &input[n * a * ol..(n + 1) * a * ol], a, ol)?;
                    gemm(op, &xn, &colv.t(), T::one(), &mut dw)?;
                }
            }
            if need_b {
                bias_sums(&mut db, gn, bl);
            }
        }
    }
    if need_b && !cv.transpose {
        // g is small (A, O): each channel's sum over the batch, in batch order (the same bits
        // as one pass per entry), channels split across threads.
        crate::par::rows(&mut db, 1, gd.len(), &|first, block: &mut [T]| {
            for (j, d) in block.iter_mut().enumerate() {
                let ch = first + j;
                for n in 0..cv.batches {
                    *d += sum_slice(&gd[(n * a + ch) * ol..(n * a + ch + 1) * ol]);
                }
            }
            Ok(())
        })?;
    }
    if need_w && !cv.transpose {
        // dw = Σ_n G_n·cols(x_n)ᵀ, in fixed chunks of the batch: each chunk's sum (in batch
        // order) is one row of `partials`, the chunks run across threads, and their sums are
        // added in chunk order, so the bits depend on DW_CHUNK, not on the thread count.
        let row = dw.len();
        let dw_chunk = crate::gates::get(|g| g.dw_chunk, DW_CHUNK).max(1);
        let chunks = cv.batches.div_ceil(dw_chunk);
        let mut partials = workspace(op, "weight cotangent partial sums", &[chunks, row])?;
        let work = batch_work(&cv, &t);
        crate::par::rows(&mut partials, row, work, &|first, block: &mut [T]| {
            let mut cols = workspace(op, "the im2col workspace", &[c, kl, ol])?;
            for (k, part) in block.chunks_exact_mut(row.max(1)).enumerate() {
                let start = (first + k).saturating_mul(dw_chunk);
                for n in start..start.saturating_add(dw_chunk).min(cv.batches) {
                    let gv = view(op, &gd[n * a * ol..(n + 1) * a * ol], a, ol)?;
                    im2col(&t, c, &input[n * c * bl..(n + 1) * c * bl], &mut cols);
                    let colv = view(op, &cols, c * kl, ol)?;
                    gemm(op, &gv, &colv.t(), T::one(), part)?;
                }
            }
            tl_spec::pool::give(cols);
            Ok(())
        })?;
        // The first chunk's sum as it is (one chunk: the plain sum in batch order).
        for (k, part) in partials.chunks_exact(row.max(1)).enumerate() {
            if k == 0 {
                dw.copy_from_slice(part);
            } else {
                dw.iter_mut().zip(part).for_each(|(d, &p)| *d += p);
            }
        }
        tl_spec::pool::give(partials);
    }
    tl_spec::pool::give(cols);
    let keep = |on: bool, shape: &tl_spec::Shape, data: Vec<T>| -> Result<Option<Tensor<T>>> {
        Ok(if on {
            Some(tensor(shape.clone(), data)?)
        } else {
            None
        })
    };
    Ok(smallvec![
        keep(need_w, x[0].shape(), dw)?,
        keep(need_b, x[1].shape(), db)?,
        keep(need_x, x[2].shape(), dx)?,
    ])
}

fn bias_sums<T: Scalar>(db: &mut [T], g: &[T], cells: usize) {
    for (d, row) in db.iter_mut().zip(g.chunks_exact(cells.max(1))) {
        *d += sum_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::window::Geometry;

    #[test]
    fn slice_runs_give_the_gathers_bits() {
        // im2col and col2im through the runs of a stride-1 table equal the per-cell gathers;
        // a strided table has no runs (short on average), so it keeps the gathers.
        let op = Op::conv2d(1, 1);
        for (big, kernel, stride, pad, has_runs) in [
            (vec![7, 9], vec![3, 3], vec![1, 1], vec![1, 1], true),
            (vec![5, 6], vec![2, 3], vec![1, 1], vec![0, 2], true),
            (vec![11], vec![4], vec![1], vec![3], true),
            (vec![9, 9], vec![3, 3], vec![2, 2], vec![1, 1], false),
        ] {
            let g = Geometry::forward(&op, &big, &kernel, &stride, &pad).unwrap();
            let fast = g.table(&op).unwrap();
            assert_eq!(fast.runs.is_some(), has_runs, "{big:?} {stride:?}");
            let mut slow = g.build(&op).unwrap();
            slow.runs = None;
            let c = 2;
            let plane: Vec<f32> = (0..c * fast.big_len)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let n_cols = c * fast.kernel_len * fast.small_len;
            let (mut a, mut b) = (vec![f32::NAN; n_cols], vec![f32::NAN; n_cols]);
            im2col(&fast, c, &plane, &mut a);
            im2col(&slow, c, &plane, &mut b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "im2col {big:?}");
            let cols: Vec<f32> = (0..n_cols).map(|i| (i as f32 * 0.11).cos()).collect();
            let (mut a, mut b) = (plane.clone(), plane.clone());
            col2im(&fast, c, &cols, &mut a);
            col2im(&slow, c, &cols, &mut b);
            assert_eq!(bits(&a), bits(&b), "col2im {big:?}");
        }
    }

    #[test]
    fn two_d_conv_and_its_transpose_by_hand() {
        // 1×1×2×2 weight [[1, 2], [3, 4]] on a 3×3 ramp, stride 1, no padding.
        let w = Tensor::<f64>::new([1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::<f64>::vector(vec![1.0]);
        let x = Tensor::<f64>::new([1, 3, 3], (0..9).map(f64::from).collect()).unwrap();
        let y = forward(&Op::conv2d(1, 0), &[&w, &b, &x]).unwrap();
        // Window at (0,0): 0·1 + 1·2 + 3·3 + 4·4 = 27; each step right adds 10, down adds 30.
        assert_eq!(y.shape().dims(), &[1, 2, 2]);
        assert_eq!(y.data(), &[28.0, 38.0, 58.0, 68.0]);
        // convTranspose of a single 1 at (0,0) with padding 0 places w there: out 2×2 = w + b.
        let one = Tensor::<f64>::new([1, 1, 1], vec![1.0]).unwrap();
        let yt = forward(&Op::conv_transpose2d(1, 0), &[&w, &b, &one]).unwrap();
        assert_eq!(yt.data(), &[2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn masked_backward_equals_the_full_one_on_every_mask() {
        // Batched, strided and padded, both directions: each of the 8 masks returns exactly the
        // full backward's cotangents where asked and `None` elsewhere.
        let w = Tensor::<f64>::from_fn([2, 3, 3, 2], |i| (i as f64 * 0.37).sin());
        let b = Tensor::<f64>::vector(vec![0.5, -1.5]);
        let x = Tensor::<f64>::from_fn([2, 3, 5, 4], |i| (i as f64 * 0.11).cos());
        let bt = Tensor::<f64>::vector(vec![0.25, -0.5, 1.0]);
        let xt = Tensor::<f64>::from_fn([2, 2, 3, 2], |i| i as f64 - 5.0);
        let cases = [
            (Op::conv2d(2, 1), [&w, &b, &x]),
            (Op::conv_transpose2d(2, 1), [&w, &bt, &xt]),
        ];
        for (op, operands) in &cases {
            let y = forward(op, operands).unwrap();
            let g = Tensor::from_fn(y.shape().clone(), |i| (i as f64 * 0.7).cos());
            let full = backward_masked(op, operands, &y, &g, &[]).unwrap();
            for bits in 0..8u8 {
                let mask = [bits & 1 != 0, bits & 2 != 0, bits & 4 != 0];
                let some = backward_masked(op, operands, &y, &g, &mask).unwrap();
                for (i, &on) in mask.iter().enumerate() {
                    let want = if on { full[i].clone() } else { None };
                    assert_eq!(some[i], want, "{op:?} mask {mask:?} operand {i}");
                }
            }
        }
    }

    /// Issue 14: a padding that makes the im2col workspace (and window table) larger than the
    /// allocation cap is `TooLarge` naming the op, not an abort; an overflowing one is an error.
    #[test]
    fn an_oversized_im2col_workspace_is_an_error() {
        let w = Tensor::<f64>::new([1, 1, 1], vec![1.0]).unwrap();
        let b = Tensor::<f64>::vector(vec![0.0]);
        let x = Tensor::<f64>::new([1, 1, 1], vec![1.0]).unwrap();
        let op = Op::Conv {
            stride: vec![1],
            padding: vec![1 << 40],
        };
        let e = forward(&op, &[&w, &b, &x]).unwrap_err().to_string();
        assert!(e.contains("conv") && e.contains("too large"), "{e}");
        let op = Op::Conv {
            stride: vec![1],
            padding: vec![usize::MAX / 2 + 1],
        };
        assert!(forward(&op, &[&w, &b, &x]).is_err());
    }
}
