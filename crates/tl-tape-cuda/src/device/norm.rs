//! The layout of the normalization primitives ([`NormLayout`]) and their argument checks,
//! shared by the simulation device and the CUDA device so both reject the same inputs.
//!
//! x is viewed as `outer` blocks of `groups` groups of `seg` contiguous elements; group `k`
//! holds the `k`-th segment of every block, so its `m = outer·seg` elements are, in increasing
//! index order, `e ↦ ((e / seg)·groups + k)·seg + e % seg`. γ/β are indexed by the position in
//! the segment (`per_column`, layer norm) or by the group (batch norm).
//!
//! A layout is [`centred`](NormLayout::centred) (layer and batch norm: each group shifted by its
//! first element x₀ and its mean taken out) or not (RMS norm: x₀ = 0, d̄ = 0, the variance is
//! `Σ x²/m`, and there is no β).

use super::{Buffer, check};
use crate::{Error, Result, abi};

/// The longest group whose block also normalizes its elements in the forward's one launch
/// ([`NormLayout::fused_forward`]): 16 elements per thread of a 256-thread block.
pub const NORM_FUSED_MAX: usize = 4096;

/// The fewest elements a group has before its sums split over several blocks
/// ([`NormLayout::split_parts`]): 16 a thread of a 256-thread block.
pub const NORM_SPLIT_MIN_CHUNK: usize = 4096;

/// The blocks a split group sum aims for: about four a multiprocessor of an H100 or H200
/// (132), where one block a channel left half of them idle in a ResNet's batch norms.
pub const NORM_SPLIT_BLOCKS: usize = 512;

/// The most chunks a group's sums split into: every thread that reads a sum folds its chunks'
/// sums itself.
pub const NORM_SPLIT_MAX_PARTS: usize = 1024;

/// How x splits into normalization groups (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormLayout {
    /// Blocks of groups (N for a batched batch norm, else 1).
    pub outer: usize,
    /// Number of groups (rows for layer norm, channels for batch norm).
    pub groups: usize,
    /// Contiguous elements of one group per block (the row length, or H·W).
    pub seg: usize,
    /// γ/β indexed by the position in the segment (layer norm) rather than by the group.
    pub per_column: bool,
    /// Each group centred (layer and batch norm): the shift x₀ is its first element and the
    /// statistics hold the mean d̄ of `x − x₀`, and the map adds β. Not centred (RMS norm):
    /// x₀ = 0 and d̄ = 0 (no mean pass; the statistics still hold `[d̄…, rstd…]`, the d̄s 0),
    /// the variance is `Σ x²/m`, no β is read or added, and `norm_bwd_x` drops its `Σ ĝ` term.
    pub centred: bool,
}

impl NormLayout {
    /// Layer norm of `rows` rows of `cols` (PyTorch: `F.layer_norm(x, (cols,))`).
    pub fn layer(rows: usize, cols: usize) -> NormLayout {
        NormLayout {
            outer: 1,
            groups: rows,
            seg: cols,
            per_column: true,
            centred: true,
        }
    }

    /// RMS norm of `rows` rows of `cols`: the [`layer`](Self::layer) layout, not centred
    /// (`y = x/sqrt(Σ x²/cols + ε)·γ`; PyTorch: `F.rms_norm(x, (cols,), γ, ε)`).
    pub fn rms(rows: usize, cols: usize) -> NormLayout {
        NormLayout {
            centred: false,
            ..NormLayout::layer(rows, cols)
        }
    }

    /// Batch norm of x (n, c, hw) with per-channel statistics (PyTorch: `F.batch_norm`).
    pub fn channels(n: usize, c: usize, hw: usize) -> NormLayout {
        NormLayout {
            outer: n,
            groups: c,
            seg: hw,
            per_column: false,
            centred: true,
        }
    }

    /// Elements per group, `outer·seg`.
    pub fn group_len(&self) -> usize {
        self.outer * self.seg
    }

    /// Length of γ, β, dγ and dβ.
    pub fn features(&self) -> usize {
        if self.per_column {
            self.seg
        } else {
            self.groups
        }
    }

    /// Elements of x that feed one entry of dγ (and dβ): the rows (`outer·groups`) for a
    /// per-column layout, a group's elements (`outer·seg`) otherwise.
    pub fn feature_len(&self) -> usize {
        if self.per_column {
            self.outer * self.groups
        } else {
            self.group_len()
        }
    }

    /// The index in x of the `e`-th element (in increasing index order) of feature `f`.
    pub fn feature_element(&self, f: usize, e: usize) -> usize {
        if self.per_column {
            e * self.seg + f
        } else {
            self.index(f, e)
        }
    }

    /// Whether `norm_bwd_affine` sums each feature with one block (`tl_norm_bwd_affine_block`)
    /// rather than one thread: the rule of the axis sums
    /// ([`gates::sum_by_block`](crate::gates::sum_by_block)). A transformer's layerNorm (64
    /// features over 128 rows) took 44 µs on one block of threads on an H100.
    pub fn affine_by_block(&self) -> bool {
        crate::gates::sum_by_block(self.feature_len(), self.features())
    }

    /// Whether [`Device::norm_forward`](crate::device::Device::norm_forward) is one launch
    /// (`tl_norm_fwd`: each group's block writes its statistics, then normalizes its own
    /// elements) rather than `norm_stats` and `norm_apply`: groups of at most
    /// [`NORM_FUSED_MAX`] elements (a layer norm's rows; overridden per thread by
    /// [`gates::force_norm_fused_max`](crate::gates::force_norm_fused_max)) whose sums are not
    /// [split](Self::split_parts) (`tl_norm_fwd` sums a group with one block). A long group (a
    /// batch norm's channel over N·H·W) keeps the grid-wide apply, which spreads its elements
    /// over every block. The bits are the same either way.
    pub fn fused_forward(&self) -> bool {
        self.group_len() <= crate::gates::norm_fused_max() && self.split_parts() == 1
    }

    /// The chunks each group's sums are taken in, one block a chunk, the chunks' sums then
    /// added in increasing order from +0 ([`gates::norm_split_parts`](crate::gates::norm_split_parts)
    /// of the groups and their length): the statistics and `batchMoments` (`tl_norm_split_mean`,
    /// `tl_norm_split_sq`, `tl_norm_split_finish`), `norm_bwd_x` (`tl_norm_split_bwd_sums`,
    /// `tl_norm_split_bwd_x`) and, where the features are the groups (batch norm),
    /// `norm_bwd_affine` (`tl_norm_split_affine_sums`, `tl_norm_split_affine_finish`). 1: one
    /// block a group.
    pub fn split_parts(&self) -> usize {
        crate::gates::norm_split_parts(self.groups, self.group_len())
    }

    /// Whether `norm_bwd_affine` takes the split sums: split parts, and the features are the
    /// groups (not [`per_column`](Self::per_column)).
    pub fn affine_split(&self) -> bool {
        !self.per_column && self.split_parts() > 1
    }

    /// The index in x of element `e` of group `k`.
    pub fn index(&self, k: usize, e: usize) -> usize {
        ((e / self.seg) * self.groups + k) * self.seg + e % self.seg
    }

    /// The γ/β index of x's element `i`.
    pub fn feature_of(&self, i: usize) -> usize {
        if self.per_column {
            i % self.seg
        } else {
            (i / self.seg) % self.groups
        }
    }

    /// Checked: x's length is `outer·groups·seg`, every group non-empty, dims within the ABI.
    /// Returns x's length.
    pub fn check_x(&self, op: &'static str, x: Buffer) -> Result<usize> {
        abi::to_u32(op, "outer", self.outer)?;
        abi::to_u32(op, "groups", self.groups)?;
        abi::to_u32(op, "seg", self.seg)?;
        let n = check::product(op, &[self.outer, self.groups, self.seg])?;
        abi::len_u32(op, n)?;
        check::len_is(op, "input", x, n)?;
        if self.group_len() == 0 && self.groups > 0 {
            return Err(Error::kernel(
                op,
                format!("groups of {self:?} are empty: no statistics"),
            ));
        }
        Ok(n)
    }

    /// Checked: `stats` holds `2·groups` values (means, then reciprocal standard deviations).
    pub fn check_stats(&self, op: &'static str, stats: Buffer) -> Result<()> {
        check::len_is(op, "statistics", stats, 2 * self.groups)
    }

    /// Checked: γ (or β) holds [`features`](Self::features) values.
    pub fn check_affine(&self, op: &'static str, what: &str, b: Buffer) -> Result<()> {
        check::len_is(op, what, b, self.features())
    }

    /// Checked: β is given exactly where the layout is [`centred`](Self::centred), and then
    /// holds [`features`](Self::features) values. Returns the buffer the kernels take in β's
    /// place: β, or, where not centred, `gamma` as a live stand-in that they never read (the
    /// kernel emulator requires every pointer argument to be a live allocation).
    pub fn check_beta(
        &self,
        op: &'static str,
        gamma: Buffer,
        beta: Option<Buffer>,
    ) -> Result<Buffer> {
        match (beta, self.centred) {
            (Some(b), true) => {
                self.check_affine(op, "beta", b)?;
                Ok(b)
            }
            (None, false) => Ok(gamma),
            (Some(_), false) => Err(Error::kernel(
                op,
                "beta given for a layout that is not centred (RMS norm has no beta)",
            )),
            (None, true) => Err(Error::kernel(op, "no beta for a centred layout")),
        }
    }
}

/// How the rows of a masked row softmax ([`Device::masked_softmax_rows`]) meet their mask.
///
/// x is (rows, n); the mask is `batch` matrices of `m` rows of `n` entries, back to back
/// (row-major, matrix b's row i at `(b·m + i)·n`): one per batch element of the scores, or one
/// shared by all (`batch` = 1). They split x's rows in order into `batch` shares of `group =
/// rows / batch` rows: row r takes row `r mod m` of matrix `r / group`
/// ([`MaskedRows::mask_row`]; `tl_masked_softmax_rows`). For attention's (B·H, nq, nk) scores
/// m = nq, and a per-sequence mask has B matrices, each under the H·nq score rows of its batch
/// element.
///
/// [`Device::masked_softmax_rows`]: crate::device::Device::masked_softmax_rows
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskedRows {
    /// Rows of x.
    pub rows: usize,
    /// Entries of each row of x and of the mask.
    pub n: usize,
    /// Rows of one mask matrix (nq).
    pub m: usize,
    /// Mask matrices (1: shared by every row of x; B: one per batch element).
    pub batch: usize,
    /// Rows of x under each matrix, `rows / batch` (a whole number of blocks of m).
    pub group: usize,
}

impl MaskedRows {
    /// Checked operands: x (rows, n) within the `u32` ABI, a mask of a whole number (≥ 1) of
    /// (m, n) matrices, and rows a whole number of blocks of m per matrix. Errors name `op`
    /// and the sizes.
    pub fn check(
        op: &'static str,
        x: Buffer,
        mask: &[bool],
        rows: usize,
        n: usize,
        m: usize,
    ) -> Result<MaskedRows> {
        check::rows_cols(op, x, rows, n)?;
        abi::to_u32(op, "mask rows", m)?;
        let matrix = check::product(op, &[m, n])?;
        if matrix == 0 {
            // No entry to read: an empty mask over an empty x.
            if !mask.is_empty() || (rows > 0 && n > 0) {
                return Err(Error::kernel(
                    op,
                    format!(
                        "a ({m}, {n}) mask of {} entries cannot mask {rows} rows of {n}",
                        mask.len()
                    ),
                ));
            }
            return Ok(MaskedRows {
                rows,
                n,
                m,
                batch: 1,
                group: rows,
            });
        }
        let batch = mask.len() / matrix;
        if batch == 0 || batch * matrix != mask.len() {
            return Err(Error::kernel(
                op,
                format!(
                    "the mask has {} entries, not a whole number (≥ 1) of ({m}, {n}) matrices",
                    mask.len()
                ),
            ));
        }
        if !rows.is_multiple_of(batch * m) {
            return Err(Error::kernel(
                op,
                format!(
                    "{rows} rows are not a whole number of ({m}, {n}) score blocks for each of \
                     the mask's {batch} matrices"
                ),
            ));
        }
        Ok(MaskedRows {
            rows,
            n,
            m,
            batch,
            group: rows / batch,
        })
    }

    /// The mask row that row `r` of x takes: row `r mod m` of matrix `r / group`, i.e. mask
    /// row `(r / group)·m + r mod m`.
    pub fn mask_row(&self, r: usize) -> usize {
        (r / self.group.max(1)) * self.m + r % self.m.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_groups_span_the_blocks() {
        // (N=2, C=3, HW=2): channel 1 holds indices 2, 3 of sample 0 and 8, 9 of sample 1.
        let l = NormLayout::channels(2, 3, 2);
        let idx: Vec<usize> = (0..l.group_len()).map(|e| l.index(1, e)).collect();
        assert_eq!(idx, [2, 3, 8, 9]);
        assert_eq!(l.feature_of(9), 1);
        let r = NormLayout::layer(2, 3);
        assert_eq!((0..3).map(|e| r.index(1, e)).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(r.feature_of(4), 1);
        assert_eq!(r.features(), 3);
        assert!(l.centred && r.centred);
        let q = NormLayout::rms(2, 3);
        assert!(!q.centred);
        assert_eq!(NormLayout { centred: true, ..q }, r);
    }

    /// B = 2 matrices of m = 2 rows under 8 rows of scores (H = 2): rows 0..4 take matrix 0's
    /// rows 0, 1, 0, 1, rows 4..8 matrix 1's (mask rows 2, 3, 2, 3); one shared matrix
    /// repeats its rows over all 8.
    #[test]
    fn masked_rows_take_their_batch_elements_matrix() {
        let x = Buffer::fresh(24);
        let l = MaskedRows::check("t", x, &[true; 12], 8, 3, 2).unwrap();
        assert_eq!((l.batch, l.group), (2, 4));
        let rows: Vec<usize> = (0..8).map(|r| l.mask_row(r)).collect();
        assert_eq!(rows, [0, 1, 0, 1, 2, 3, 2, 3]);
        let l = MaskedRows::check("t", x, &[true; 6], 8, 3, 2).unwrap();
        assert_eq!((l.batch, l.group), (1, 8));
        let rows: Vec<usize> = (0..8).map(|r| l.mask_row(r)).collect();
        assert_eq!(rows, [0, 1, 0, 1, 0, 1, 0, 1]);
        // Three matrices cannot split 8 rows; 5 entries are no whole matrix.
        let e = MaskedRows::check("t", x, &[true; 18], 8, 3, 2).unwrap_err();
        assert!(
            e.to_string().contains("8 rows") && e.to_string().contains("3 matrices"),
            "{e}"
        );
        let e = MaskedRows::check("t", x, &[true; 5], 8, 3, 2).unwrap_err();
        assert!(e.to_string().contains("5 entries"), "{e}");
    }
}
