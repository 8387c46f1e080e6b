//! Shape kernels: `reshape` and `flatten` (O(1): they share storage, and so do their backward
//! passes), the axis permutations (`transpose2d`, `permuteBCA`, `permuteCAB`, `swapLastTwo`,
//! `swapAdjacent`) and `broadcastTo` with its backward (a sum over the broadcast axes).
//!
//! Every permutation here is a batched 2-D transpose of contiguous blocks:
//! (a, b, c) → (b, c, a) transposes the (a, b·c) matrix, (a, b, c) → (c, a, b) transposes (a·b, c),
//! swapping adjacent axes (p, q) of (pre, p, q, post) transposes `pre` matrices of (p, q) cells of
//! `post` contiguous elements. `transpose_into` does the 2-D case in cache-sized blocks.

use smallvec::{SmallVec, smallvec};
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Shape, Tensor};

use super::{Grads, check_arity, check_backward, check_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of a shape op.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    let x = x[0];
    use Op::*;
    match op {
        Reshape(to) => reshape(op, x, to),
        Flatten => reshape(op, x, &Shape::new(&[x.numel()])),
        Transpose2d => {
            let (m, n) = dims2(op, x.shape())?;
            permute(x, Shape::new(&[n, m]), 1, m, n, 1)
        }
        PermuteBca => {
            let (a, b, c) = dims3(op, x.shape())?;
            permute(x, Shape::new(&[b, c, a]), 1, a, b.saturating_mul(c), 1)
        }
        PermuteCab => {
            let (a, b, c) = dims3(op, x.shape())?;
            permute(x, Shape::new(&[c, a, b]), 1, a.saturating_mul(b), c, 1)
        }
        SwapLastTwo => {
            let (a, b, c) = dims3(op, x.shape())?;
            permute(x, Shape::new(&[a, c, b]), a, b, c, 1)
        }
        SwapAdjacent(depth) => Ok(swap_adjacent(x, *depth)?),
        BroadcastTo(to) => broadcast(op, x, to),
        _ => Err(wrong_family(op, "shape")),
    }
}

/// Operand cotangent of a shape op: `g` reshaped (no copy), the inverse permutation of `g`, or
/// `g` summed over the broadcast axes.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_backward(op, x, y, g)?;
    let x = x[0];
    use Op::*;
    let dx = match op {
        Reshape(_) | Flatten => reshape(op, g, x.shape())?,
        Transpose2d => forward(&Transpose2d, &[g])?,
        PermuteBca => forward(&PermuteCab, &[g])?,
        PermuteCab => forward(&PermuteBca, &[g])?,
        SwapLastTwo => forward(&SwapLastTwo, &[g])?,
        SwapAdjacent(depth) => swap_adjacent(g, *depth)?,
        BroadcastTo(to) => {
            check_shape(op, "cotangent", g, to)?;
            unbroadcast(op, g, x.shape())?
        }
        _ => return Err(wrong_family(op, "shape")),
    };
    check_shape(op, "input cotangent", &dx, x.shape())?;
    Ok(smallvec![Some(dx)])
}

/// The same elements under `to`, sharing storage; the error names the op and both shapes.
fn reshape<T: Scalar>(op: &Op, x: &Tensor<T>, to: &Shape) -> Result<Tensor<T>> {
    if x.numel() != to.numel() {
        return Err(SpecError::shape(
            op.name(),
            format!(
                "cannot reshape {} ({} elements) to {to} ({} elements)",
                x.shape(),
                x.numel(),
                to.numel()
            ),
        )
        .into());
    }
    Ok(x.reshape(to.clone())?)
}

fn dims2(op: &Op, s: &Shape) -> Result<(usize, usize)> {
    match s.dims() {
        &[m, n] => Ok((m, n)),
        _ => Err(rank_error(op, 2, s)),
    }
}

fn dims3(op: &Op, s: &Shape) -> Result<(usize, usize, usize)> {
    match s.dims() {
        &[a, b, c] => Ok((a, b, c)),
        _ => Err(rank_error(op, 3, s)),
    }
}

fn rank_error(op: &Op, rank: usize, s: &Shape) -> crate::Error {
    SpecError::shape(
        op.name(),
        format!("expected a rank-{rank} tensor, got shape {s}"),
    )
    .into()
}

/// Swap axes `depth` and `depth + 1` (identity, sharing storage, when out of range).
fn swap_adjacent<T: Scalar>(x: &Tensor<T>, depth: usize) -> Result<Tensor<T>> {
    let d = x.shape().dims();
    // `depth + 1 >= rank` without overflowing at `depth = usize::MAX` (SEMANTICS.md: identity).
    if depth >= d.len().saturating_sub(1) {
        return Ok(x.clone());
    }
    // Saturating: an empty tensor may have dims whose product overflows (permute returns early).
    let pre = d[..depth].iter().fold(1usize, |a, &b| a.saturating_mul(b));
    let post = d[depth + 2..]
        .iter()
        .fold(1usize, |a, &b| a.saturating_mul(b));
    let mut out_dims: SmallVec<[usize; 6]> = SmallVec::from_slice(d);
    out_dims.swap(depth, depth + 1);
    permute(x, Shape::new(&out_dims), pre, d[depth], d[depth + 1], post)
}

/// View `x` as (batch, rows, cols, cell) and write (batch, cols, rows, cell) under `out_shape`.
fn permute<T: Scalar>(
    x: &Tensor<T>,
    out_shape: Shape,
    batch: usize,
    rows: usize,
    cols: usize,
    cell: usize,
) -> Result<Tensor<T>> {
    let src = x.data();
    if src.is_empty() {
        // Nothing moves; the dims of an empty tensor may multiply past usize (never computed).
        return tensor(out_shape, Vec::new());
    }
    let block = rows * cols * cell;
    if src.len() != batch * block || out_shape.numel() != src.len() {
        return Err(SpecError::shape(
            "permute",
            format!(
                "input {} cannot be viewed as ({batch}, {rows}, {cols}, {cell})",
                x.shape()
            ),
        )
        .into());
    }
    if rows <= 1 || cols <= 1 {
        // Transposing a row or a column vector moves no element.
        return Ok(x.reshape(out_shape)?);
    }
    let mut out = tl_spec::alloc::try_zeroed("permute", "output", src.len())?;
    if block > 0 {
        for (s, d) in src.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
            if cell == 1 {
                transpose_into(s, d, rows, cols);
            } else {
                for (i, row) in s.chunks_exact(cols * cell).enumerate() {
                    for (j, c) in row.chunks_exact(cell).enumerate() {
                        let at = (j * rows + i) * cell;
                        d[at..at + cell].copy_from_slice(c);
                    }
                }
            }
        }
    }
    tensor(out_shape, out)
}

/// Blocked transpose of the row-major (rows, cols) matrix `src` into `dst` (cols, rows): tiles of
/// 32 × 32 keep both the reads and the writes within a few cache lines.
fn transpose_into<T: Copy>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
    const B: usize = 32;
    for ib in (0..rows).step_by(B) {
        let ie = (ib + B).min(rows);
        for jb in (0..cols).step_by(B) {
            let je = (jb + B).min(cols);
            for i in ib..ie {
                let row = &src[i * cols + jb..i * cols + je];
                for (j, &v) in (jb..je).zip(row) {
                    dst[j * rows + i] = v;
                }
            }
        }
    }
}

/// The broadcast of `from` to `to` as a loop nest: `dims` (outermost first) with the stride of
/// each in the source (0 on broadcast axes). Size-1 target axes are dropped and neighbouring axes
/// of the same kind are merged, so the innermost loop is one long copy, fill or sum.
struct Plan {
    dims: SmallVec<[usize; 6]>,
    strides: SmallVec<[usize; 6]>,
}

impl Plan {
    fn new(op: &Op, from: &Shape, to: &Shape) -> Result<Plan> {
        let (f, t) = (from.dims(), to.dims());
        let ok = f.len() <= t.len() && {
            let off = t.len() - f.len();
            f.iter().zip(&t[off..]).all(|(&a, &b)| a == b || a == 1)
        };
        if !ok {
            return Err(SpecError::shape(
                op.name(),
                format!(
                    "cannot broadcast {from} to {to} (dims are matched from the right; each must be equal or 1)"
                ),
            )
            .into());
        }
        let off = t.len() - f.len();
        // (target dim, broadcast?) for every target axis of length > 1, innermost last.
        let axes = t
            .iter()
            .enumerate()
            .filter(|&(_, &d)| d > 1)
            .map(|(k, &d)| {
                let src = if k >= off { f[k - off] } else { 1 };
                (d, src == 1)
            });
        let mut merged: SmallVec<[(usize, bool); 6]> = SmallVec::new();
        for (d, b) in axes {
            match merged.last_mut() {
                Some((md, mb)) if *mb == b => *md *= d,
                _ => merged.push((d, b)),
            }
        }
        let mut strides: SmallVec<[usize; 6]> = smallvec![0; merged.len()];
        let mut s = 1;
        for (k, &(d, b)) in merged.iter().enumerate().rev() {
            if !b {
                strides[k] = s;
                s *= d;
            }
        }
        Ok(Plan {
            dims: merged.iter().map(|&(d, _)| d).collect(),
            strides,
        })
    }

    /// Call `f(dst_offset, src_offset, run, broadcast)` for every innermost run, in order.
    fn for_each_run(&self, mut f: impl FnMut(usize, usize, usize, bool)) {
        let k = self.dims.len();
        if k == 0 {
            f(0, 0, 1, true);
            return;
        }
        let (run, run_bcast) = (self.dims[k - 1], self.strides[k - 1] == 0);
        let outer: usize = self.dims[..k - 1].iter().product();
        let mut counter: SmallVec<[usize; 6]> = smallvec![0; k - 1];
        let mut src = 0;
        for o in 0..outer {
            f(o * run, src, run, run_bcast);
            for a in (0..k - 1).rev() {
                counter[a] += 1;
                src += self.strides[a];
                if counter[a] < self.dims[a] {
                    break;
                }
                src -= self.strides[a] * counter[a];
                counter[a] = 0;
            }
        }
    }
}

/// `broadcastTo`: numpy rules, each innermost run a `copy_from_slice` or a `fill`.
fn broadcast<T: Scalar>(op: &Op, x: &Tensor<T>, to: &Shape) -> Result<Tensor<T>> {
    let plan = Plan::new(op, x.shape(), to)?;
    if x.shape() == to {
        return Ok(x.clone());
    }
    let src = x.data();
    let mut out = tl_spec::alloc::try_zeroed(op.name(), "output", to.numel())?;
    if !out.is_empty() {
        plan.for_each_run(|d, s, n, bcast| {
            if bcast {
                out[d..d + n].fill(src[s]);
            } else {
                out[d..d + n].copy_from_slice(&src[s..s + n]);
            }
        });
    }
    tensor(to.clone(), out)
}

/// The VJP of `broadcastTo`: sum `g` over the broadcast axes back to `from`.
fn unbroadcast<T: Scalar>(op: &Op, g: &Tensor<T>, from: &Shape) -> Result<Tensor<T>> {
    let plan = Plan::new(op, from, g.shape())?;
    if g.shape() == from {
        return Ok(g.clone());
    }
    let gd = g.data();
    let mut out = tl_spec::alloc::try_zeroed(op.name(), "output", from.numel())?;
    if !gd.is_empty() {
        plan.for_each_run(|d, s, n, bcast| {
            let run = &gd[d..d + n];
            if bcast {
                out[s] += super::sum_slice(run);
            } else {
                for (o, &v) in out[s..s + n].iter_mut().zip(run) {
                    *o += v;
                }
            }
        });
    }
    tensor(from.clone(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(dims: &[usize]) -> Tensor<f64> {
        Tensor::from_fn(dims, |i| i as f64)
    }

    #[test]
    fn blocked_transpose_matches_index_formula_across_block_edges() {
        for &(m, n) in &[(1, 1), (3, 5), (33, 31), (64, 65)] {
            let x = iota(&[m, n]);
            let y = forward(&Op::Transpose2d, &[&x]).unwrap();
            assert_eq!(y.shape().dims(), &[n, m]);
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(y.get(&[j, i]), x.get(&[i, j]));
                }
            }
        }
    }

    #[test]
    fn permutations_move_elements_as_documented() {
        let x = iota(&[2, 3, 4]);
        let bca = forward(&Op::PermuteBca, &[&x]).unwrap();
        let cab = forward(&Op::PermuteCab, &[&x]).unwrap();
        let swp = forward(&Op::SwapLastTwo, &[&x]).unwrap();
        let sw0 = forward(&Op::SwapAdjacent(0), &[&x]).unwrap();
        for (a, b, c) in
            (0..2).flat_map(|a| (0..3).flat_map(move |b| (0..4).map(move |c| (a, b, c))))
        {
            let v = x.get(&[a, b, c]);
            assert_eq!(bca.get(&[b, c, a]), v);
            assert_eq!(cab.get(&[c, a, b]), v);
            assert_eq!(swp.get(&[a, c, b]), v);
            assert_eq!(sw0.get(&[b, a, c]), v);
        }
        let same = forward(&Op::SwapAdjacent(2), &[&x]).unwrap();
        assert!(same.shares_storage_with(&x));
    }

    #[test]
    fn reshape_and_its_backward_share_storage() {
        let x = iota(&[2, 3]);
        let y = forward(&Op::Reshape(Shape::new(&[3, 2])), &[&x]).unwrap();
        assert!(y.shares_storage_with(&x));
        let g = iota(&[3, 2]);
        let dx = backward(&Op::Reshape(Shape::new(&[3, 2])), &[&x], &y, &g).unwrap();
        let dx = dx[0].as_ref().unwrap();
        assert!(dx.shares_storage_with(&g));
        assert_eq!(dx.shape().dims(), &[2, 3]);
        let f = forward(&Op::Flatten, &[&x]).unwrap();
        assert!(f.shares_storage_with(&x) && f.shape().dims() == [6]);
    }

    #[test]
    fn broadcast_and_its_sum_back_by_hand() {
        let x = Tensor::<f64>::new([2, 1], vec![1.0, 2.0]).unwrap();
        let op = Op::BroadcastTo(Shape::new(&[3, 2, 2]));
        let y = forward(&op, &[&x]).unwrap();
        assert_eq!(
            y.data(),
            &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
        );
        let g = iota(&[3, 2, 2]);
        let dx = backward(&op, &[&x], &y, &g).unwrap();
        // x[0] collects 0+1+4+5+8+9 = 27, x[1] collects 2+3+6+7+10+11 = 39.
        assert_eq!(dx[0].as_ref().unwrap().data(), &[27.0, 39.0]);
        let s = Tensor::scalar(3.0);
        let op = Op::BroadcastTo(Shape::new(&[2, 2]));
        assert_eq!(forward(&op, &[&s]).unwrap().data(), &[3.0; 4]);
        let e = forward(
            &Op::BroadcastTo(Shape::new(&[2, 3])),
            &[&Tensor::<f64>::zeros([2])],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("broadcastTo") && e.contains("[2]") && e.contains("[2, 3]"),
            "{e}"
        );
    }
}
