//! Sliding-window index tables shared by the conv and pool kernels.
//!
//! A [`Table`] maps every (kernel offset `k`, small cell `o`) pair to the flat index of the big
//! cell `o·stride + k − padding` it reads, or [`PAD`] for a padded cell. It is built once per
//! geometry and thread while in use ([`Geometry::table`] keeps the last few), so the N-D index
//! arithmetic happens once per (output cell, kernel offset) and the inner loops are flat
//! gathers and scatters over channels and batches.

use std::cell::RefCell;
use std::sync::Arc;

use smallvec::SmallVec;
use tl_ir::Op;
use tl_spec::{Error as SpecError, Shape};

use crate::Result;

/// Marks a padded cell in a [`Table`].
pub(crate) const PAD: usize = usize::MAX;

/// Per-axis dims (spatial rank ≤ 8 stays inline).
pub(crate) type Dims = SmallVec<[usize; 8]>;

/// The geometry of one windowed op: spatial dims of the big and small blocks, the kernel, the
/// stride and the padding.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The same table as runs of consecutive cells, when they are long enough to copy as
    /// slices (a stride-1 window: one run per output row); `None` otherwise.
    pub runs: Option<Runs>,
}

/// A table's non-padded cells as runs: row `k`'s runs are `runs[start[k]..start[k + 1]]`, each
/// `(o, i, len)`: small cells `o..o + len` read big cells `i..i + len`.
pub(crate) struct Runs {
    pub start: Vec<usize>,
    pub runs: Vec<(usize, usize, usize)>,
    /// Whether row `k` has padded cells (their columns are zero in im2col).
    pub padded: Vec<bool>,
}

/// How many geometries' tables [`Geometry::table`] keeps per thread.
pub(crate) const CACHED_TABLES: usize = 16;

/// Entries (8 bytes each) past which a table is not kept: 16 tables of 2¹⁶ entries, 8 MiB.
pub(crate) const CACHED_TABLE_MAX: usize = 1 << 16;

/// Runs shorter than this on average are not worth a slice copy each.
const MIN_MEAN_RUN: usize = 4;

/// [`MIN_MEAN_RUN`], or its [`crate::gates`] override.
fn min_mean_run() -> usize {
    crate::gates::get(|g| g.min_mean_run, MIN_MEAN_RUN)
}

impl Runs {
    /// The runs of `idx` (rows of `ol` cells), or `None` when they are short on average.
    fn of(idx: &[usize], ol: usize) -> Option<Runs> {
        let (mut start, mut runs, mut padded) = (vec![0], Vec::new(), Vec::new());
        for row in idx.chunks_exact(ol.max(1)) {
            let mut o = 0;
            while o < row.len() {
                if row[o] == PAD {
                    o += 1;
                    continue;
                }
                let mut len = 1;
                while o + len < row.len() && row[o + len] == row[o] + len {
                    len += 1;
                }
                runs.push((o, row[o], len));
                o += len;
            }
            start.push(runs.len());
            padded.push(row.contains(&PAD));
        }
        let cells = idx.len() - idx.iter().filter(|&&i| i == PAD).count();
        (cells >= min_mean_run().saturating_mul(runs.len())).then_some(Runs {
            start,
            runs,
            padded,
        })
    }

    /// Row `k`'s runs.
    pub fn row(&self, k: usize) -> &[(usize, usize, usize)] {
        &self.runs[self.start[k]..self.start[k + 1]]
    }
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
            // Checked: an absurd padding must be an error, not an overflow.
            let padded = padding[i]
                .checked_mul(2)
                .and_then(|p2| big[i].checked_add(p2));
            let Some(padded) = padded.filter(|&p| p >= kernel[i] && stride[i] > 0) else {
                return Err(bad(
                    op,
                    format!(
                        "kernel {kernel:?} / stride {stride:?} do not fit spatial dims {big:?} with padding {padding:?}"
                    ),
                ));
            };
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
            // Checked: absurd strides or paddings must be errors, not overflows. `full > 2p` is
            // tested as `full − p > p` (2p may overflow).
            let full = small[i]
                .saturating_sub(1)
                .checked_mul(stride[i])
                .and_then(|f| f.checked_add(kernel[i]));
            let Some(full) = full.filter(|&f| {
                small[i] > 0 && stride[i] > 0 && f > padding[i] && f - padding[i] > padding[i]
            }) else {
                return Err(bad(
                    op,
                    format!(
                        "spatial dims {small:?} with kernel {kernel:?}, stride {stride:?}, padding {padding:?} give an empty output"
                    ),
                ));
            };
            big.push(full - padding[i] - padding[i]);
        }
        Ok(Geometry {
            big,
            small: small.into(),
            kernel: kernel.into(),
            stride: stride.into(),
            padding: padding.into(),
        })
    }

    /// The index table of this geometry, built once per thread while it is among the last
    /// [`CACHED_TABLES`] geometries used (a training step asks for the same few every step;
    /// tables over [`CACHED_TABLE_MAX`] entries are built each time, so the cache holds a few MiB
    /// at most). See [`Geometry::build`] for the checks. Under a [`crate::gates`] override of
    /// the cache's limit or of the runs' threshold, only tables built under the same threshold
    /// are reused, and a limit of 0 bypasses the cache.
    pub(crate) fn table(&self, op: &Op) -> Result<Arc<Table>> {
        type Cached = (Geometry, usize, Arc<Table>);
        thread_local! {
            static TABLES: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
        }
        let limit = crate::gates::get(|g| g.cached_table_max, CACHED_TABLE_MAX);
        let min_run = min_mean_run();
        let hit = TABLES.with_borrow_mut(|cache| {
            let i = cache
                .iter()
                .position(|(g, r, _)| g == self && *r == min_run && limit > 0)?;
            // Most recent first.
            let entry = cache.remove(i);
            let t = entry.2.clone();
            cache.insert(0, entry);
            Some(t)
        });
        if let Some(t) = hit {
            return Ok(t);
        }
        let t = Arc::new(self.build(op)?);
        if t.idx.len() <= limit {
            TABLES.with_borrow_mut(|cache| {
                cache.truncate(CACHED_TABLES - 1);
                cache.insert(0, (self.clone(), min_run, t.clone()));
            });
        }
        Ok(t)
    }

    /// The index table of this geometry: `kernel_len · small_len` entries, a workspace sized by
    /// the input (a large kernel over a padded empty input is small data and a huge table), so it
    /// is checked against the allocation cap ([`tl_spec::alloc`]) and refused with
    /// `TooLarge` naming `op` before anything is allocated.
    pub(crate) fn build(&self, op: &Op) -> Result<Table> {
        let d = self.big.len();
        let too_large = |what: &str, dims: &[usize]| -> crate::Error {
            SpecError::TooLarge {
                op: op.name(),
                detail: format!("the {what} {dims:?} has more elements than usize can count"),
            }
            .into()
        };
        let product = |what: &str, dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .ok_or_else(|| too_large(what, dims))
        };
        let big_len = Shape::saturating_product(&self.big);
        let small_len = product("output window grid", &self.small)?;
        let kernel_len = product("kernel", &self.kernel)?;
        let entries = kernel_len
            .checked_mul(small_len)
            .ok_or_else(|| too_large("window index table of kernel × output", &self.small))?;
        let mut idx: Vec<usize> =
            tl_spec::alloc::try_with_capacity(op.name(), "the window index table", entries)?;
        let mut k: Dims = smallvec::smallvec![0; d];
        // No output cell: no row of the table (and no walk over a huge kernel for nothing).
        let rows = if small_len == 0 { 0 } else { kernel_len };
        for _ in 0..rows {
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
        let runs = Runs::of(&idx, small_len);
        Ok(Table {
            idx,
            big_len,
            small_len,
            kernel_len,
            runs,
        })
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
        assert_eq!(g.table(&Op::Sum).unwrap().idx, vec![PAD, 1, 0, 2, 1, PAD]);
    }
}
