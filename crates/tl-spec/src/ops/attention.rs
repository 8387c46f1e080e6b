//! Attention: the static boolean [`Mask`], `maskedSoftmax`, scaled dot-product attention of
//! merged heads ([`sdpa`]) and multi-head self-attention ([`mha`]: projections around it).
//!
//! The mask is a hard mask: a `false` entry contributes exactly 0 to its softmax row (as if its
//! score were −∞, but without ever forming ∞ − ∞ = NaN), and a row with nothing allowed outputs
//! zeros and passes zero gradient.

pub mod mha;
pub mod sdpa;

use std::fmt;
use std::sync::Arc;

use super::same_shape;
use crate::{Error, Result, Scalar, Shape, Tensor};

/// A static (rows, cols) boolean attention mask, row-major; `true` = allowed. Row `i` says
/// which of the `cols` keys query `i` may attend to: self-attention takes a square mask (as many
/// keys as queries), attention over keys of another length (cross-attention, a KV cache) a
/// rectangular one. One matrix serves every batch element, or a batched mask
/// ([`Mask::batched`], [`Mask::from_fn_batched`]) holds one per batch element (a padded batch's
/// key padding). Cheap to clone (shared storage). PyTorch: a boolean `attn_mask` (L, S) or (B,
/// 1, L, S) of `F.scaled_dot_product_attention` (same polarity: true = take part in attention).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Mask {
    batch: usize,
    rows: usize,
    cols: usize,
    /// The batch·rows·cols entries (a `Vec` behind the `Arc`, so that sharing it copies
    /// nothing: an `Arc<[bool]>` would copy the entries into a second, infallible allocation).
    allowed: Arc<Vec<bool>>,
    /// Its structure, found once when it is made (a function of `allowed`).
    form: Arc<MaskForm>,
}

/// The structure of a [`Mask`], found once when the mask is made, so that a kernel can take a
/// causal or key-padding mask in O(batch·cols) form without reading its entries again on each
/// call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MaskForm {
    /// Entry (b, i, j) = `(j ≤ i + o if causal = Some(o)) and keep[b·cols + j]`: no mask, a
    /// causal mask (its diagonal `o`: 0 for [`Mask::causal`] and [`Mask::causal_upper_left`],
    /// cols − rows for [`Mask::causal_lower_right`]), a key padding (per batch element in a
    /// batched mask), or causal with key padding. `keep` is `None` when every key is kept.
    Keys {
        /// `Some(o)`: query i sees only keys j ≤ i + o (`torch.tril`'s `diagonal`), in every
        /// batch element.
        causal: Option<isize>,
        /// Which of the `cols` keys take part, batch element b's at `b·cols..` (`None`: all of
        /// them, everywhere).
        keep: Option<Vec<bool>>,
    },
    /// Any other mask: only its entries say which keys each query sees.
    Dense,
}

/// The diagonal `cols − rows` of a causal mask aligned at the bottom right, saturating at
/// `isize`'s bounds (a mask with a side of 0 has no entry, and its other side may exceed
/// `isize::MAX`).
fn lower_right_diagonal(rows: usize, cols: usize) -> isize {
    if cols >= rows {
        isize::try_from(cols - rows).unwrap_or(isize::MAX)
    } else {
        isize::try_from(rows - cols).map_or(isize::MIN, |d| -d)
    }
}

impl MaskForm {
    /// Whether `(i, j)` passes the causal part of a [`MaskForm::Keys`] with diagonal `causal`.
    pub fn causal_allows(causal: Option<isize>, i: usize, j: usize) -> bool {
        // Sizes of a mask are allocation-bounded, far below isize::MAX.
        causal.is_none_or(|o| (j as isize) <= (i as isize).saturating_add(o))
    }

    /// The structure of the `batch·rows·cols` row-major `allowed` (one pass over the entries
    /// at most per candidate structure: no causal part, then the diagonals 0 and cols − rows).
    fn of(rows: usize, cols: usize, allowed: &[bool]) -> MaskForm {
        let lower_right = lower_right_diagonal(rows, cols);
        let candidates = [None, Some(0), Some(lower_right)];
        let matrix = (rows * cols).max(1);
        for (at, &causal) in candidates.iter().enumerate() {
            if candidates[..at].contains(&causal) {
                continue;
            }
            // Keep flags from the last row that reaches each key (past every row's diagonal:
            // no row sees it, so its flag is free and taken as kept), per batch element.
            let last = |j: usize| {
                (0..rows)
                    .rev()
                    .find(|&i| MaskForm::causal_allows(causal, i, j))
            };
            let keep: Vec<bool> = allowed
                .chunks_exact(matrix)
                .flat_map(|m| (0..cols).map(move |j| last(j).is_none_or(|i| m[i * cols + j])))
                .collect();
            let fits = allowed
                .chunks_exact(matrix)
                .zip(keep.chunks_exact(cols.max(1)))
                .all(|(m, keep)| {
                    m.chunks_exact(cols.max(1)).enumerate().all(|(i, row)| {
                        row.iter()
                            .zip(keep)
                            .enumerate()
                            .all(|(j, (&a, &k))| a == (MaskForm::causal_allows(causal, i, j) && k))
                    })
                });
            if fits {
                let keep = (!keep.iter().all(|&k| k)).then_some(keep);
                return MaskForm::Keys { causal, keep };
            }
        }
        MaskForm::Dense
    }
}

impl Mask {
    /// A square (n, n) mask from `n·n` row-major entries; an error if the length is not `n·n`.
    pub fn new(n: usize, allowed: Vec<bool>) -> Result<Mask> {
        Mask::rectangular(n, n, allowed)
    }

    /// A (rows, cols) mask from `rows·cols` row-major entries (row i: the keys query i sees),
    /// shared by every batch element; an error if the length is not `rows·cols`.
    pub fn rectangular(rows: usize, cols: usize, allowed: Vec<bool>) -> Result<Mask> {
        Mask::batched(1, rows, cols, allowed)
    }

    /// A mask of one (rows, cols) matrix per batch element from `batch·rows·cols` entries
    /// (batch element b's matrix at `b·rows·cols..`, row-major): for operands of that batch
    /// size (PyTorch: an `attn_mask` of (B, 1, L, S)). An error if the length is not
    /// `batch·rows·cols` or `batch` is 0.
    pub fn batched(batch: usize, rows: usize, cols: usize, allowed: Vec<bool>) -> Result<Mask> {
        let len = Shape::new(&[batch, rows, cols]).checked_numel();
        if batch == 0 || len != Some(allowed.len()) {
            return Err(Error::param(
                "mask",
                format!(
                    "{} entries cannot form a mask of {batch} ({rows}, {cols}) matrices (batch ≥ 1)",
                    allowed.len()
                ),
            ));
        }
        Ok(Mask::of_entries(batch, rows, cols, allowed))
    }

    /// The mask of checked entries, its form found.
    fn of_entries(batch: usize, rows: usize, cols: usize, allowed: Vec<bool>) -> Mask {
        Mask {
            batch,
            rows,
            cols,
            form: Arc::new(MaskForm::of(rows, cols, &allowed)),
            allowed: Arc::new(allowed),
        }
    }

    /// The square mask with entry (i, j) = `f(i, j)`. Checked as
    /// [`Mask::from_fn_rectangular`].
    pub fn from_fn(n: usize, f: impl FnMut(usize, usize) -> bool) -> Result<Mask> {
        Mask::from_fn_rectangular(n, n, f)
    }

    /// The (rows, cols) mask with entry (i, j) = `f(i, j)`. Its rows·cols entries are checked
    /// before anything is allocated: sizes whose product overflows, or whose mask exceeds the
    /// allocation cap ([`crate::alloc`], `TL_MAX_ALLOC_BYTES`), or that the system allocator
    /// refuses, are a [`Error::TooLarge`] naming `mask` and the sizes.
    pub fn from_fn_rectangular(
        rows: usize,
        cols: usize,
        mut f: impl FnMut(usize, usize) -> bool,
    ) -> Result<Mask> {
        Mask::from_fn_batched(1, rows, cols, |_, i, j| f(i, j))
    }

    /// The mask of one (rows, cols) matrix per batch element with entry (b, i, j) = `f(b, i,
    /// j)` (for a padded batch: `f(b, i, j) = j < len[b]`). Checked as
    /// [`Mask::from_fn_rectangular`]; a batch of 0 is an error.
    pub fn from_fn_batched(
        batch: usize,
        rows: usize,
        cols: usize,
        mut f: impl FnMut(usize, usize, usize) -> bool,
    ) -> Result<Mask> {
        let what = || match batch {
            1 => format!("a ({rows}, {cols}) attention mask"),
            _ => format!("a ({batch}, {rows}, {cols}) attention mask"),
        };
        if batch == 0 {
            return Err(Error::param(
                "mask",
                format!("{}: batch must be ≥ 1", what()),
            ));
        }
        let len = Shape::new(&[batch, rows, cols])
            .checked_numel()
            .ok_or_else(|| Error::TooLarge {
                op: "mask",
                detail: format!("{}: {batch}·{rows}·{cols} entries overflow usize", what()),
            })?;
        let mut allowed = crate::alloc::try_with_capacity("mask", &what(), len)?;
        // No entry: nothing to ask `f` (a side of 0 leaves the others unbounded).
        for b in 0..if len == 0 { 0 } else { batch } {
            for i in 0..rows {
                allowed.extend((0..cols).map(|j| f(b, i, j)));
            }
        }
        Ok(Mask::of_entries(batch, rows, cols, allowed))
    }

    /// The causal mask: query i sees keys j ≤ i. PyTorch: `is_causal=True`. Checked as
    /// [`Mask::from_fn`].
    pub fn causal(n: usize) -> Result<Mask> {
        Mask::from_fn(n, |i, j| j <= i)
    }

    /// The causal mask of `rows` queries over `cols` keys aligned at the top left: query i
    /// sees keys j ≤ i (PyTorch: `is_causal=True` with L ≠ S, `causal_upper_left(L, S)`).
    pub fn causal_upper_left(rows: usize, cols: usize) -> Result<Mask> {
        Mask::from_fn_rectangular(rows, cols, |i, j| j <= i)
    }

    /// The causal mask of `rows` queries over `cols` keys aligned at the bottom right: query i
    /// sees keys j ≤ i + cols − rows, so the last query sees every key (PyTorch:
    /// `causal_lower_right(L, S)`). The `rows` new positions of a sequence whose first
    /// `cols − rows` positions are cached (a KV cache); with rows > cols the first rows − cols
    /// queries see nothing.
    pub fn causal_lower_right(rows: usize, cols: usize) -> Result<Mask> {
        let o = lower_right_diagonal(rows, cols);
        Mask::from_fn_rectangular(rows, cols, |i, j| MaskForm::causal_allows(Some(o), i, j))
    }

    /// The batch elements it has a matrix for: 1 for a mask shared by every batch element.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The number of rows (queries).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The number of columns (keys).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` of batch element 0 (the keys query `i` may attend to); an empty slice past the
    /// end.
    pub fn row(&self, i: usize) -> &[bool] {
        self.row_in(0, i)
    }

    /// Row `i` of batch element `b` (of the one matrix when the mask is shared: every b reads
    /// it); an empty slice past the end.
    pub fn row_in(&self, b: usize, i: usize) -> &[bool] {
        let b = if self.batch == 1 { 0 } else { b };
        if b < self.batch && i < self.rows {
            &self.allowed[(b * self.rows + i) * self.cols..][..self.cols]
        } else {
            &[]
        }
    }

    /// Whether entry (i, j) of batch element 0 is allowed (false out of range).
    pub fn allowed(&self, i: usize, j: usize) -> bool {
        self.allowed_in(0, i, j)
    }

    /// Whether entry (i, j) of batch element `b` is allowed (false out of range).
    pub fn allowed_in(&self, b: usize, i: usize, j: usize) -> bool {
        self.row_in(b, i).get(j).copied().unwrap_or(false)
    }

    /// All entries, row-major, batch element after batch element.
    pub fn as_slice(&self) -> &[bool] {
        &self.allowed
    }

    /// Its structure (causal, key padding, both, none, or dense), found when it was made.
    pub fn form(&self) -> &MaskForm {
        &self.form
    }
}

impl fmt::Debug for Mask {
    /// `mask[10/11]`: rows separated by `/`, 1 = allowed; batch elements separated by `|`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mask[")?;
        for b in 0..self.batch {
            if b > 0 {
                f.write_str("|")?;
            }
            for i in 0..self.rows {
                if i > 0 {
                    f.write_str("/")?;
                }
                for &a in self.row_in(b, i) {
                    f.write_str(if a { "1" } else { "0" })?;
                }
            }
        }
        f.write_str("]")
    }
}

/// Check that the scores' last two axes are (rows, cols) = the mask's sizes, and that the
/// mask is shared (batch 1) or has one matrix per batch element of the `batch` the op runs on
/// (`None`: the op takes shared masks only).
pub fn check_mask(
    op: &'static str,
    mask: &Mask,
    batch: Option<usize>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if rows != mask.rows() || cols != mask.cols() {
        return Err(Error::shape(
            op,
            format!(
                "the mask is ({}, {}) but the scores are ({rows}, {cols})",
                mask.rows(),
                mask.cols()
            ),
        ));
    }
    match (mask.batch(), batch) {
        (1, _) => Ok(()),
        (mb, Some(b)) if mb == b => Ok(()),
        (mb, Some(b)) => Err(Error::shape(
            op,
            format!("the mask has {mb} batch elements but the operands have batch {b}"),
        )),
        (mb, None) => Err(Error::shape(
            op,
            format!("takes a mask shared by every row (batch 1), got one of {mb} batch elements"),
        )),
    }
}

/// Shape rule of `maskedSoftmax`: x of rank ≥ 2 whose last two axes are the mask's (rows,
/// cols), and for a batched mask of rank ≥ 3 with the mask's batch as its first axis;
/// shape-preserving.
pub fn masked_softmax_shape(x: &Shape, mask: &Mask) -> Result<Shape> {
    let op = "maskedSoftmax";
    let d = x.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            op,
            format!("x must have rank ≥ 2 (…, rows, cols), got {x}"),
        ));
    }
    let batch = (d.len() >= 3).then(|| d[0]);
    check_mask(op, mask, batch, d[d.len() - 2], d[d.len() - 1])?;
    Ok(x.clone())
}

/// The mask row that score row `r` of x (rows of `cols`, `numel` entries in all) takes: row
/// `r mod rows` of the matrix of x's batch element (its first axis) for a batched mask, of the
/// one matrix otherwise. The batch element's index within the mask's batch and the row.
pub fn mask_row_of(mask: &Mask, numel: usize, r: usize) -> (usize, usize) {
    let (rows, cols) = (mask.rows().max(1), mask.cols().max(1));
    let per_batch = (numel / cols / mask.batch()).max(1);
    (r / per_batch, r % rows)
}

/// Softmax of one row over the allowed entries only; disallowed entries (and every entry of a
/// row with nothing allowed) are exactly 0.
pub fn masked_softmax_row<T: Scalar>(row: &[T], allowed: &[bool], out: &mut [T]) {
    let m = (row.iter().zip(allowed))
        .filter(|(_, a)| **a)
        .map(|(&v, _)| v)
        .fold(T::neg_infinity(), T::max);
    let z: T = (row.iter().zip(allowed))
        .filter(|(_, a)| **a)
        .map(|(&v, _)| (v - m).exp())
        .sum();
    for ((o, &v), &a) in out.iter_mut().zip(row).zip(allowed) {
        *o = if a { (v - m).exp() / z } else { T::zero() };
    }
}

/// Softmax along the last axis with a hard mask broadcast over the leading axes (row index =
/// second-to-last axis; a batched mask's matrix b for x's batch element b, the first axis:
/// PyTorch's (B, 1, …, L, S) broadcast). PyTorch: `torch.softmax(x.masked_fill(~mask, -inf), -1)` with NaN rows
/// (nothing allowed) replaced by zeros.
pub fn masked_softmax<T: Scalar>(x: &Tensor<T>, mask: &Mask) -> Result<Tensor<T>> {
    masked_softmax_shape(x.shape(), mask)?;
    let cols = mask.cols().max(1);
    let mut out = crate::alloc::try_zeroed("maskedSoftmax", "output", x.numel())?;
    for (r, (row, o)) in x.data().chunks(cols).zip(out.chunks_mut(cols)).enumerate() {
        let (b, i) = mask_row_of(mask, x.numel(), r);
        masked_softmax_row(row, mask.row_in(b, i), o);
    }
    Tensor::new(x.shape().clone(), out)
}

/// VJP of `maskedSoftmax`: `y·(g − Σ g·y)` per row (0 where y is 0: masked entries and empty
/// rows).
pub fn masked_softmax_vjp<T: Scalar>(
    x: &Tensor<T>,
    mask: &Mask,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    let y = masked_softmax(x, mask)?;
    same_shape("maskedSoftmax", x, g)?;
    let c = mask.cols().max(1);
    let mut out = crate::alloc::try_with_capacity("maskedSoftmax", "gradient", x.numel())?;
    for (yr, gr) in y.data().chunks(c).zip(g.data().chunks(c)) {
        let dot: T = yr.iter().zip(gr).map(|(&y, &g)| y * g).sum();
        out.extend(yr.iter().zip(gr).map(|(&y, &g)| y * (g - dot)));
    }
    Tensor::new(x.shape().clone(), out)
}

/// JVP of `maskedSoftmax`: `y·(dx − Σ y·dx)` per row (the Jacobian is symmetric).
pub fn masked_softmax_jvp<T: Scalar>(
    x: &Tensor<T>,
    mask: &Mask,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    masked_softmax_vjp(x, mask, dx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_with_a_side_of_zero_are_empty_whatever_the_other() {
        // Neither side's difference overflows, and no loop runs over the other side.
        let m = Mask::causal_lower_right(1 << 63, 0).unwrap();
        assert_eq!((m.rows(), m.cols(), m.as_slice().len()), (1 << 63, 0, 0));
        let m = Mask::rectangular(0, usize::MAX, vec![]).unwrap();
        assert_eq!((m.rows(), m.cols()), (0, usize::MAX));
        let m = Mask::from_fn_batched(1 << 62, 1 << 62, 0, |_, _, _| true).unwrap();
        assert!(m.as_slice().is_empty());
        assert_eq!(lower_right_diagonal(0, usize::MAX), isize::MAX);
        assert_eq!(lower_right_diagonal(usize::MAX, 0), isize::MIN);
        assert_eq!(lower_right_diagonal(2, 5), 3);
        // A side too large to hold is an error naming the mask, not an abort.
        let e = Mask::causal_lower_right(1, 1 << 63)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mask"), "{e}");
    }

    #[test]
    fn a_masks_form_is_found_when_it_is_made() {
        let keys = |causal: bool, keep: Option<Vec<bool>>| MaskForm::Keys {
            causal: causal.then_some(0),
            keep,
        };
        let pad = [true, true, false, true, false];
        let form = |f: &dyn Fn(usize, usize) -> bool| Mask::from_fn(5, f).unwrap().form().clone();
        assert_eq!(*Mask::causal(5).unwrap().form(), keys(true, None));
        assert_eq!(form(&|_, _| true), keys(false, None));
        assert_eq!(form(&|_, j| pad[j]), keys(false, Some(pad.to_vec())));
        assert_eq!(
            form(&|i, j| j <= i && pad[j]),
            keys(true, Some(pad.to_vec()))
        );
        // Anti-causal, one entry off causal, and a padding that differs in one row: dense.
        assert_eq!(form(&|i, j| j >= i), MaskForm::Dense);
        assert_eq!(form(&|i, j| j <= i && (i, j) != (3, 1)), MaskForm::Dense);
        assert_eq!(form(&|i, j| pad[j] || (i, j) == (0, 2)), MaskForm::Dense);
        assert_eq!(*Mask::new(0, vec![]).unwrap().form(), keys(false, None));
        assert_eq!(
            *Mask::new(1, vec![false]).unwrap().form(),
            keys(false, Some(vec![false]))
        );
    }

    #[test]
    fn rectangular_masks_find_their_diagonal_and_padding() {
        let form = |r, c, f: &dyn Fn(usize, usize) -> bool| {
            Mask::from_fn_rectangular(r, c, f).unwrap().form().clone()
        };
        let keys = |causal, keep: Option<Vec<bool>>| MaskForm::Keys { causal, keep };
        // A KV cache: 2 new queries over 5 keys, the first 3 cached.
        let lr = Mask::causal_lower_right(2, 5).unwrap();
        assert_eq!(format!("{lr:?}"), "mask[11110/11111]");
        assert_eq!(*lr.form(), keys(Some(3), None));
        assert_eq!((lr.rows(), lr.cols()), (2, 5));
        let ul = Mask::causal_upper_left(2, 5).unwrap();
        assert_eq!(format!("{ul:?}"), "mask[10000/11000]");
        assert_eq!(*ul.form(), keys(Some(0), None));
        // More queries than keys at the bottom right: the first rows see nothing.
        let tall = Mask::causal_lower_right(4, 2).unwrap();
        assert_eq!(format!("{tall:?}"), "mask[00/00/10/11]");
        assert_eq!(*tall.form(), keys(Some(-2), None));
        // One query over padded keys; causal over padded keys; a dense one.
        let pad = [true, false, true];
        assert_eq!(form(1, 3, &|_, j| pad[j]), keys(None, Some(pad.to_vec())));
        assert_eq!(
            form(2, 3, &|i, j| j <= i + 1 && pad[j]),
            keys(Some(1), Some(pad.to_vec()))
        );
        assert_eq!(form(2, 3, &|i, j| i != j), MaskForm::Dense);
        // Every form holds its mask entry by entry.
        for m in [&lr, &ul, &tall] {
            let MaskForm::Keys { causal, .. } = m.form() else {
                panic!("{m:?} is not dense")
            };
            for i in 0..m.rows() {
                for j in 0..m.cols() {
                    assert_eq!(
                        m.allowed(i, j),
                        MaskForm::causal_allows(*causal, i, j),
                        "{m:?} ({i}, {j})"
                    );
                }
            }
        }
        let e = Mask::rectangular(2, 3, vec![true; 5])
            .unwrap_err()
            .to_string();
        assert!(e.contains("(2, 3)") && e.contains('5'), "{e}");
        assert!(masked_softmax_shape(&Shape::new(&[4, 2, 5]), &lr).is_ok());
        let e = masked_softmax_shape(&Shape::new(&[5, 2]), &lr)
            .unwrap_err()
            .to_string();
        assert!(e.contains("(2, 5)") && e.contains("(5, 2)"), "{e}");
        let x = Tensor::new(Shape::new(&[2, 5]), vec![0.5f64; 10]).unwrap();
        let y = masked_softmax(&x, &lr).unwrap();
        assert_eq!(y.data()[..5], [0.25, 0.25, 0.25, 0.25, 0.0]);
        assert_eq!(y.data()[5..], [0.2; 5]);
    }

    #[test]
    fn batched_masks_keep_one_matrix_per_batch_element() {
        // A padded batch: element 0 has 3 keys, element 1 all 4; causal on top for `both`.
        let len = [3, 4];
        let pad = Mask::from_fn_batched(2, 2, 4, |b, _, j| j < len[b]).unwrap();
        assert_eq!(format!("{pad:?}"), "mask[1110/1110|1111/1111]");
        assert_eq!(pad.batch(), 2);
        let keep = |v: &[u8]| Some(v.iter().map(|&k| k == 1).collect::<Vec<bool>>());
        assert_eq!(
            *pad.form(),
            MaskForm::Keys {
                causal: None,
                keep: keep(&[1, 1, 1, 0, 1, 1, 1, 1])
            }
        );
        let both = Mask::from_fn_batched(2, 3, 3, |b, i, j| j <= i && j < len[b] - 1).unwrap();
        assert_eq!(
            *both.form(),
            MaskForm::Keys {
                causal: Some(0),
                keep: keep(&[1, 1, 0, 1, 1, 1])
            }
        );
        // Rows that differ within one element: dense.
        let odd = Mask::from_fn_batched(2, 2, 2, |b, i, j| b == 0 || i == j).unwrap();
        assert_eq!(*odd.form(), MaskForm::Dense);
        assert!(odd.allowed_in(0, 0, 1) && !odd.allowed_in(1, 0, 1) && odd.allowed_in(1, 1, 1));
        assert!(odd.row_in(2, 0).is_empty(), "no third batch element");
        // A shared mask reads its one matrix in every batch element.
        let shared = Mask::causal(2).unwrap();
        assert_eq!(
            (shared.batch(), shared.row_in(5, 1)),
            (1, &[true, true][..])
        );
        // Checks: the batch must be 1 or the operands'; maskedSoftmax takes shared masks only.
        assert!(check_mask("op", &pad, Some(2), 2, 4).is_ok());
        assert!(check_mask("op", &shared, Some(7), 2, 2).is_ok());
        let e = check_mask("op", &pad, Some(3), 2, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("op") && e.contains("2 batch elements") && e.contains("batch 3"),
            "{e}"
        );
        // maskedSoftmax: matrix b for x's batch element b (its first axis), over the rest.
        assert!(masked_softmax_shape(&Shape::new(&[2, 3, 2, 4]), &pad).is_ok());
        let e = masked_softmax_shape(&Shape::new(&[3, 2, 4]), &pad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("maskedSoftmax") && e.contains("batch 3"), "{e}");
        let e = masked_softmax_shape(&Shape::new(&[2, 4]), &pad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("maskedSoftmax") && e.contains("batch 1"), "{e}");
        let x = Tensor::new(Shape::new(&[2, 2, 2, 4]), vec![0.0f64; 32]).unwrap();
        let y = masked_softmax(&x, &pad).unwrap();
        let third = 1.0 / 3.0;
        for r in 0..4 {
            assert_eq!(
                y.data()[r * 4..][..4],
                [third, third, third, 0.0],
                "row {r}"
            );
            assert_eq!(y.data()[16 + r * 4..][..4], [0.25; 4], "row {}", 4 + r);
        }
        for e in [
            Mask::batched(0, 1, 1, vec![]).unwrap_err(),
            Mask::batched(2, 1, 2, vec![true; 3]).unwrap_err(),
            Mask::from_fn_batched(0, 1, 1, |_, _, _| true).unwrap_err(),
        ] {
            assert!(e.to_string().contains("mask"), "{e}");
        }
    }

    /// Set in the child process of [`masks_under_a_lowered_cap_are_refused`].
    const CHILD_VAR: &str = "TL_SPEC_MASK_CAP_CHILD";

    /// Issue 37: n·n was computed unchecked (`causal(2³²)` wrapped to an empty mask, a larger n
    /// aborted) and never met the allocation cap.
    #[test]
    fn masks_whose_entries_overflow_are_errors_naming_the_mask() {
        for n in [1usize << 32, usize::MAX] {
            let e = Mask::causal(n).unwrap_err().to_string();
            assert!(e.contains("mask") && e.contains("overflow"), "{n}: {e}");
            let e = Mask::from_fn(n, |_, _| true).unwrap_err().to_string();
            assert!(e.contains(&format!("({n}, {n})")), "{n}: {e}");
        }
        let m = Mask::causal(3).unwrap();
        assert_eq!(format!("{m:?}"), "mask[100/110/111]");
        assert_eq!(
            m.row(usize::MAX),
            &[] as &[bool],
            "a row past the end is empty"
        );
        assert!(Mask::causal(0).unwrap().as_slice().is_empty());
    }

    /// A 60 000-token causal mask (3.6 GB of entries) under `TL_MAX_ALLOC_BYTES=1G`: an error
    /// naming the cap, before anything is allocated. In a child process, so that the lowered
    /// cap (read once per process) touches no other test.
    #[test]
    fn masks_under_a_lowered_cap_are_refused() {
        if std::env::var_os(CHILD_VAR).is_some() {
            let e = Mask::causal(60_000).unwrap_err().to_string();
            assert!(e.contains("mask") && e.contains("allocation cap"), "{e}");
            assert_eq!(Mask::causal(1_000).unwrap().row(999).len(), 1_000);
            println!("mask child: refused");
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let name = format!("{}::masks_under_a_lowered_cap_are_refused", module_path!());
        let name = name.split_once("::").map_or(name.as_str(), |(_, m)| m);
        let out = std::process::Command::new(exe)
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, "1")
            .env(crate::alloc::ENV_VAR, "1G")
            .output()
            .expect("spawn the test binary");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("mask child: refused"),
            "{:?}\n{stdout}\n{stderr}",
            out.status
        );
    }

    #[test]
    fn masked_entries_are_exact_zeros_and_empty_rows_are_zero() {
        let mask = Mask::new(2, vec![true, false, false, false]).unwrap();
        let x = Tensor::<f64>::new([2, 2], vec![3.0, 1e308, -1.0, 2.0]).unwrap();
        let y = masked_softmax(&x, &mask).unwrap();
        assert_eq!(y.data(), &[1.0, 0.0, 0.0, 0.0]);
        let g = Tensor::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let dx = masked_softmax_vjp(&x, &mask, &g).unwrap();
        assert_eq!(dx.data(), &[0.0, 0.0, 0.0, 0.0]);
        assert_eq!(format!("{mask:?}"), "mask[10/00]");
        assert!(Mask::new(2, vec![true; 3]).is_err());
        assert!(masked_softmax_shape(&Shape::new(&[2, 3]), &mask).is_err());
        assert!(masked_softmax_shape(&Shape::new(&[2]), &mask).is_err());
    }
}
