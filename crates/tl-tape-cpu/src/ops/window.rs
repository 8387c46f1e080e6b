//! Sliding-window index tables shared by the conv and pool kernels.
//!
//! A [`Table`] maps every (kernel offset `k`, small cell `o`) pair to the flat index of the big
//! cell `o·stride + k − padding` it reads, or [`PAD`] for a padded cell. It is built once per
//! call, so the N-D index arithmetic happens once per (output cell, kernel offset) and the inner
//! loops are flat gathers and scatters over channels and batches.

use smallvec::SmallVec;
use tl_ir::Op;
use tl_spec::Error as SpecError;

use crate::Result;

/// Marks a padded cell in a [`Table`].
pub(crate) const PAD: usize = usize::MAX;

/// Per-axis dims (spatial rank ≤ 8 stays inline).
pub(crate) type Dims = SmallVec<[usize; 8]>;

/// The geometry of one windowed op: spatial dims of the big and small blocks, the kernel, the
/// stride and the padding.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub big: Dims,
    pub small: Dims,
    pub kernel: Dims,
    pub stride: Dims,
    pub padding: Dims,
}

/// `table[k * small_len + o]`: the big cell read by kernel offset `k` at small cell `o`.
pub(crate) struct Table {
    pub idx: Vec<usize>,
    pub big_len: usize,
    pub small_len: usize,
    pub kernel_len: usize,
}

impl Geometry {
    /// Small dims `(big + 2p − k)/stride + 1` for a forward window (conv, pools).
    pub(crate) fn forward(
        op: &Op,
        big: &[usize],
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
    ) -> Result<Geometry> {
        check_lens(op, big.len(), kernel, stride, padding)?;
        let mut small = Dims::new();
        for i in 0..big.len() {
            let padded = big[i] + 2 * padding[i];
            if padded < kernel[i] || stride[i] == 0 {
                return Err(bad(
                    op,
                    format!(
                        "kernel {kernel:?} / stride {stride:?} do not fit spatial dims {big:?} with padding {padding:?}"
                    ),
                ));
            }
            small.push((padded - kernel[i]) / stride[i] + 1);
        }
        Ok(Geometry {
            big: big.into(),
            small,
            kernel: kernel.into(),
            stride: stride.into(),
            padding: padding.into(),
        })
    }

    /// Big dims `(s − 1)·stride + k − 2p` for a transposed window (convTranspose).
    pub(crate) fn transposed(
        op: &Op,
        small: &[usize],
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
    ) -> Result<Geometry> {
        check_lens(op, small.len(), kernel, stride, padding)?;
        let mut big = Dims::new();
        for i in 0..small.len() {
            let full = small[i].saturating_sub(1) * stride[i] + kernel[i];
            if small[i] == 0 || full <= 2 * padding[i] || stride[i] == 0 {
                return Err(bad(
                    op,
                    format!(
                        "spatial dims {small:?} with kernel {kernel:?}, stride {stride:?}, padding {padding:?} give an empty output"
                    ),
                ));
            }
            big.push(full - 2 * padding[i]);
        }
        Ok(Geometry {
            big,
            small: small.into(),
            kernel: kernel.into(),
            stride: stride.into(),
            padding: padding.into(),
        })
    }

    /// The index table of this geometry.
    pub(crate) fn table(&self) -> Table {
        let d = self.big.len();
        let (big_len, small_len, kernel_len) = (
            self.big.iter().product::<usize>(),
            self.small.iter().product::<usize>(),
            self.kernel.iter().product::<usize>(),
        );
        let mut idx = Vec::with_capacity(kernel_len * small_len);
        let mut k: Dims = smallvec::smallvec![0; d];
        for _ in 0..kernel_len {
            let mut o: Dims = smallvec::smallvec![0; d];
            for _ in 0..small_len {
                let mut flat = 0;
                let mut pad = false;
                for i in 0..d {
                    let pos = (o[i] * self.stride[i] + k[i]).wrapping_sub(self.padding[i]);
                    if pos >= self.big[i] {
                        pad = true;
                        break;
                    }
                    flat = flat * self.big[i] + pos;
                }
                idx.push(if pad { PAD } else { flat });
                advance(&mut o, &self.small);
            }
            advance(&mut k, &self.kernel);
        }
        Table {
            idx,
            big_len,
            small_len,
            kernel_len,
        }
    }
}

/// Step a row-major multi-index (wrapping to all zeros after the last cell).
fn advance(ix: &mut [usize], dims: &[usize]) {
    for i in (0..ix.len()).rev() {
        ix[i] += 1;
        if ix[i] < dims[i] {
            return;
        }
        ix[i] = 0;
    }
}

fn check_lens(
    op: &Op,
    d: usize,
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
) -> Result<()> {
    if d == 0
        || d > 8
        || kernel.len() != d
        || stride.len() != d
        || padding.len() != d
        || kernel.contains(&0)
    {
        return Err(bad(
            op,
            format!(
                "spatial rank {d} with kernel {kernel:?}, stride {stride:?}, padding {padding:?}"
            ),
        ));
    }
    Ok(())
}

/// A shape error naming `op`.
pub(crate) fn bad(op: &Op, detail: String) -> crate::Error {
    SpecError::shape(op.name(), detail).into()
}

/// `(batches, channels, spatial)` of a `(C, s..)` or `(N, C, s..)` operand of spatial rank `d`.
pub(crate) fn split(op: &Op, what: &str, dims: &[usize], d: usize) -> Result<(usize, usize, Dims)> {
    if dims.len() == d + 1 {
        Ok((1, dims[0], dims[1..].into()))
    } else if dims.len() == d + 2 {
        Ok((dims[0], dims[1], dims[2..].into()))
    } else {
        Err(bad(
            op,
            format!("{what} {dims:?} must have spatial rank {d}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_marks_padding_and_reads_row_major() {
        let op = Op::MaxPool {
            kernel: vec![3],
            stride: vec![2],
            padding: vec![1],
        };
        let g = Geometry::forward(&op, &[3], &[3], &[2], &[1]).unwrap();
        assert_eq!(g.small.as_slice(), &[2]);
        // k = 0: o = 0 reads −1 (pad), o = 1 reads 1; k = 1: 0, 2; k = 2: 1, 3 (pad).
        assert_eq!(g.table().idx, vec![PAD, 1, 0, 2, 1, PAD]);
    }
}
