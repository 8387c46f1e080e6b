//! Shape ops: `reshape`, `flatten` (and `detach`) are no-copy views of their operand; the
//! permutations (`transpose2d`, `permuteBCA`, `permuteCAB`, `swapLastTwo`, `swapAdjacent`) are
//! one `permute` launch forward and the inverse permutation backward; `broadcastTo` is
//! `broadcast` forward and `reduce_broadcast` (sum over the broadcast axes) backward.

use tl_ir::Op;
use tl_spec::Shape;

use super::Forward;
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Error, Result};

/// A view of `x` under `shape` (same buffer; the tape does not own it).
pub fn view(x: &AnyBuffer, shape: &Shape) -> Result<Forward> {
    Ok(Forward {
        value: x.reshaped(shape.clone())?,
        owned: false,
        workspace: Vec::new(),
    })
}

/// The axis permutation a permutation op applies to an operand of rank `rank`: output axis k is
/// input axis `perm[k]`.
pub fn perm_of(op: &Op, rank: usize) -> Result<Vec<usize>> {
    let fixed = |p: &[usize]| -> Result<Vec<usize>> {
        if p.len() == rank {
            Ok(p.to_vec())
        } else {
            Err(Error::kernel(
                op.name(),
                format!("needs rank {}, got rank {rank}", p.len()),
            ))
        }
    };
    match op {
        Op::Transpose2d => fixed(&[1, 0]),
        Op::PermuteBca => fixed(&[1, 2, 0]),
        Op::PermuteCab => fixed(&[2, 0, 1]),
        Op::SwapLastTwo => fixed(&[0, 2, 1]),
        Op::SwapAdjacent(depth) => {
            let mut p: Vec<usize> = (0..rank).collect();
            // `depth + 1 < rank` without overflowing at `depth = usize::MAX`.
            if *depth < rank.saturating_sub(1) {
                p.swap(*depth, depth + 1);
            }
            Ok(p)
        }
        other => Err(Error::kernel(other.name(), "is not an axis permutation")),
    }
}

/// The inverse of a permutation.
pub fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (k, &p) in perm.iter().enumerate() {
        inv[p] = k;
    }
    inv
}

/// Forward of a permutation op.
pub fn permute<D: Device>(dev: &mut D, op: &Op, x: &AnyBuffer) -> Result<Buffer> {
    let dims = x.shape().dims();
    let perm = perm_of(op, dims.len())?;
    dev.permute(x.buffer(), dims, &perm)
}

/// Backward of a permutation op: the cotangent `g` (shaped like the output) permuted back.
pub fn permute_back<D: Device>(dev: &mut D, op: &Op, x: &AnyBuffer, g: Buffer) -> Result<Buffer> {
    let dims = x.shape().dims();
    let perm = perm_of(op, dims.len())?;
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    dev.permute(g, &out_dims, &inverse(&perm))
}

/// Forward of `broadcastTo`.
pub fn broadcast<D: Device>(dev: &mut D, x: &AnyBuffer, to: &Shape) -> Result<Buffer> {
    dev.broadcast(x.buffer(), x.shape().dims(), to.dims())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_and_inverses() {
        assert_eq!(perm_of(&Op::PermuteBca, 3).unwrap(), vec![1, 2, 0]);
        assert_eq!(inverse(&[1, 2, 0]), vec![2, 0, 1]);
        assert_eq!(perm_of(&Op::SwapAdjacent(1), 4).unwrap(), vec![0, 2, 1, 3]);
        assert_eq!(perm_of(&Op::SwapAdjacent(3), 4).unwrap(), vec![0, 1, 2, 3]);
        assert!(perm_of(&Op::Transpose2d, 3).is_err());
        assert!(perm_of(&Op::Add, 2).is_err());
    }
}
