//! Sliding-window geometry shared by the conv and pool families: channels-first operands
//! `(C, s1..sd)` or batched `(N, C, s1..sd)`, spatial rank `d` in `1..=8`, and the cell a window
//! reads, `o·stride + k − padding` along each axis (outside the input: a padded cell).
//!
//! Every windowed op relates a *big* spatial block (conv input, convTranspose output, pool input)
//! to a *small* one (conv output, convTranspose input, pool output) with
//! `small_i = (big_i + 2·p_i − k_i)/stride_i + 1`.

use crate::{Error, Result, Shape};

/// The largest spatial rank the windowed ops accept (the seeds' ConvPool FFI limit).
pub const MAX_SPATIAL_RANK: usize = 8;

/// The validated geometry of one windowed op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The batch size of a batched `(N, C, ...)` operand; `None` for `(C, ...)`.
    pub batch: Option<usize>,
    /// Spatial dims of the big side.
    pub big: Vec<usize>,
    /// Spatial dims of the small side.
    pub small: Vec<usize>,
    /// Kernel extent per axis (all ≥ 1).
    pub kernel: Vec<usize>,
    /// Stride per axis (all ≥ 1).
    pub stride: Vec<usize>,
    /// Zero padding per axis, on both sides.
    pub padding: Vec<usize>,
}

impl Window {
    /// The number of batch entries (1 when unbatched).
    pub fn batches(&self) -> usize {
        self.batch.unwrap_or(1)
    }

    /// Cells of the big spatial block (saturating at `usize::MAX`, as
    /// [`Shape::saturating_product`]: an empty block's other dims may overflow).
    pub fn big_len(&self) -> usize {
        Shape::saturating_product(&self.big)
    }

    /// Cells of the small spatial block (saturating, as [`Window::big_len`]).
    pub fn small_len(&self) -> usize {
        Shape::saturating_product(&self.small)
    }

    /// Cells of one window, the kernel volume (saturating, as [`Window::big_len`]: a kernel of
    /// `[2³², 2³²]` is a valid pool's over a small padded input, and [`Window::windows`] refuses
    /// it).
    pub fn kernel_len(&self) -> usize {
        Shape::saturating_product(&self.kernel)
    }

    /// The element count of the operand `(N?, channels, spatial...)`, checked: an
    /// [`Error::TooLarge`] naming `op` when it overflows or exceeds [`Shape::MAX_NUMEL`] (an
    /// output no machine holds; its dims' products must not be taken unchecked).
    pub fn checked_len(
        &self,
        op: &'static str,
        channels: usize,
        spatial: &[usize],
    ) -> Result<usize> {
        self.shape(channels, spatial).check_size(op)
    }

    /// The row-major flat index into the big block of the cell `o·stride + k − padding`, or
    /// `None` where that cell is padding.
    pub fn position(&self, o: &[usize], k: &[usize]) -> Option<usize> {
        let mut flat = 0;
        for i in 0..self.big.len() {
            let pos = (o[i] * self.stride[i] + k[i]).checked_sub(self.padding[i])?;
            if pos >= self.big[i] {
                return None;
            }
            flat = flat * self.big[i] + pos;
        }
        Some(flat)
    }

    /// For each small cell (row-major), the positions of its window's cells in row-major
    /// kernel order (`None` for padded cells). The table (small cells × kernel cells entries)
    /// is checked against the allocation cap and allocated fallibly: an error naming `op`.
    pub fn windows(&self, op: &'static str) -> Result<Vec<Vec<Option<usize>>>> {
        let volume = |dims: &[usize], what: &str| {
            Shape::new(dims)
                .checked_numel()
                .ok_or_else(|| Error::TooLarge {
                    op,
                    detail: format!("the {what} {dims:?} has more cells than usize holds"),
                })
        };
        let (sl, kl) = (
            volume(&self.small, "output's spatial block")?,
            volume(&self.kernel, "kernel")?,
        );
        let entries = sl.checked_mul(kl).ok_or_else(|| Error::TooLarge {
            op,
            detail: format!("the window table of {sl} cell(s) × {kl} kernel cell(s) overflows"),
        })?;
        crate::alloc::check_len::<Option<usize>>(op, "window table", entries)?;
        let ks = cells(&self.kernel);
        let mut table = crate::alloc::try_with_capacity(op, "window table", sl)?;
        for o in cells(&self.small) {
            let row = ks.iter().map(|k| self.position(&o, k));
            table.push(crate::alloc::try_collect(op, "window table", kl, row)?);
        }
        Ok(table)
    }

    /// The operand shape `(N?, channels, spatial...)`.
    pub fn shape(&self, channels: usize, spatial: &[usize]) -> Shape {
        let mut dims: Vec<usize> = self.batch.into_iter().collect();
        dims.push(channels);
        dims.extend_from_slice(spatial);
        Shape::from(dims)
    }
}

/// Every multi-index of `dims` in row-major order (one empty index for no dims; none if a dim
/// is 0).
pub fn cells(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    for &d in dims {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..d).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

/// Check a spatial rank `d` and that `stride`/`padding` (and `kernel`, if given) have length
/// `d`, with strides and kernel dims non-zero.
pub(crate) fn check_params(
    op: &'static str,
    d: usize,
    kernel: Option<&[usize]>,
    stride: &[usize],
    padding: &[usize],
) -> Result<()> {
    if d == 0 || d > MAX_SPATIAL_RANK {
        return Err(Error::param(
            op,
            match kernel {
                Some(k) => {
                    format!("spatial rank {d} (kernel {k:?}) is outside 1..={MAX_SPATIAL_RANK}")
                }
                None => format!("spatial rank {d} is outside 1..={MAX_SPATIAL_RANK}"),
            },
        ));
    }
    let lists = [
        ("kernel", kernel),
        ("stride", Some(stride)),
        ("padding", Some(padding)),
    ];
    for (what, list) in lists {
        if let Some(list) = list
            && list.len() != d
        {
            return Err(Error::param(
                op,
                format!(
                    "{what} {list:?} has length {}, spatial rank is {d}",
                    list.len()
                ),
            ));
        }
    }
    if let Some(k) = kernel
        && k.contains(&0)
    {
        return Err(Error::param(op, format!("kernel {k:?} has a zero dim")));
    }
    if stride.contains(&0) {
        return Err(Error::param(
            op,
            format!("stride {stride:?} has a zero entry"),
        ));
    }
    Ok(())
}

/// Split an operand shape into `(batch, channels, spatial)` for spatial rank `d`.
pub(crate) fn split_operand<'s>(
    op: &'static str,
    what: &str,
    x: &'s Shape,
    d: usize,
) -> Result<(Option<usize>, usize, &'s [usize])> {
    let dims = x.dims();
    if dims.len() == d + 1 {
        Ok((None, dims[0], &dims[1..]))
    } else if dims.len() == d + 2 {
        Ok((Some(dims[0]), dims[1], &dims[2..]))
    } else {
        Err(Error::shape(
            op,
            format!(
                "{what} {x} must have rank {} (C, spatial...) or {} (N, C, spatial...) for spatial rank {d}",
                d + 1,
                d + 2
            ),
        ))
    }
}

/// The small spatial dims for a big block `big`: `(big + 2p − k)/stride + 1`; an error when a
/// kernel is larger than the padded input.
pub(crate) fn forward_out(
    op: &'static str,
    x: &Shape,
    big: &[usize],
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
) -> Result<Vec<usize>> {
    (0..big.len())
        .map(|i| {
            let padded = padding[i]
                .checked_mul(2)
                .and_then(|p2| big[i].checked_add(p2))
                .ok_or_else(|| Error::TooLarge {
                    op,
                    detail: format!(
                        "the padded extent {} + 2·{} of spatial axis {i} of input {x} overflows usize",
                        big[i], padding[i]
                    ),
                })?;
            if padded < kernel[i] {
                Err(Error::shape(
                    op,
                    format!(
                        "kernel {kernel:?} is larger than the padded input {x} (padding {padding:?}) along spatial axis {i}"
                    ),
                ))
            } else {
                Ok((padded - kernel[i]) / stride[i] + 1)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_row_major_and_positions_skip_padding() {
        assert_eq!(
            cells(&[2, 2]),
            vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]
        );
        assert!(cells(&[2, 0]).is_empty());
        let w = Window {
            batch: None,
            big: vec![3],
            small: vec![2],
            kernel: vec![3],
            stride: vec![2],
            padding: vec![1],
        };
        assert_eq!(
            w.windows("test").unwrap(),
            vec![vec![None, Some(0), Some(1)], vec![Some(1), Some(2), None]]
        );
    }

    #[test]
    fn a_kernel_whose_volume_overflows_is_refused_not_wrapped() {
        // A pool's valid window (padding half the kernel) over a one-cell input: 2⁶⁴ cells.
        let w = Window {
            batch: None,
            big: vec![1, 1],
            small: vec![2, 2],
            kernel: vec![1 << 32; 2],
            stride: vec![1; 2],
            padding: vec![1 << 31; 2],
        };
        assert_eq!(w.kernel_len(), usize::MAX);
        let e = w.windows("maxPool").unwrap_err().to_string();
        assert!(
            e.contains("maxPool") && e.contains("kernel [4294967296, 4294967296]"),
            "{e}"
        );
        // An empty operand's other dims may overflow: its count is 0, checked, and the spatial
        // product saturates instead of wrapping.
        let empty = Window {
            batch: Some(1 << 40),
            big: vec![0, 1 << 40, 1 << 40],
            ..w.clone()
        };
        assert_eq!(empty.big_len(), 0);
        assert_eq!(
            empty.checked_len("maxPool", 1 << 40, &empty.big).unwrap(),
            0
        );
        let e = w
            .checked_len("maxPool", 1 << 40, &[1 << 40])
            .unwrap_err()
            .to_string();
        assert!(e.contains("maxPool") && e.contains("overflows"), "{e}");
    }
}
