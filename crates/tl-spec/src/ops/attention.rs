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
/// rectangular one. Cheap to clone (shared storage). PyTorch: a boolean `attn_mask` (L, S) of
/// `F.scaled_dot_product_attention` (same polarity: true = take part in attention).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Mask {
    rows: usize,
    cols: usize,
    /// The rows·cols entries (a `Vec` behind the `Arc`, so that sharing it copies nothing: an
    /// `Arc<[bool]>` would copy the entries into a second, infallible allocation).
    allowed: Arc<Vec<bool>>,
    /// Its structure, found once when it is made (a function of `allowed`).
    form: Arc<MaskForm>,
}

/// The structure of a [`Mask`], found once when the mask is made, so that a kernel can take a
/// causal or key-padding mask in O(cols) form without reading its entries again on each call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MaskForm {
    /// Entry (i, j) = `(j ≤ i + o if causal = Some(o)) and keep[j]`: no mask, a causal mask
    /// (its diagonal `o`: 0 for [`Mask::causal`] and [`Mask::causal_upper_left`], cols − rows
    /// for [`Mask::causal_lower_right`]), a key padding, or causal with key padding. `keep` is
    /// `None` when every key is kept.
    Keys {
        /// `Some(o)`: query i sees only keys j ≤ i + o (`torch.tril`'s `diagonal`).
        causal: Option<isize>,
        /// Which of the `cols` keys take part (`None`: all of them).
        keep: Option<Vec<bool>>,
    },
    /// Any other mask: only its entries say which keys each query sees.
    Dense,
}

impl MaskForm {
    /// Whether `(i, j)` passes the causal part of a [`MaskForm::Keys`] with diagonal `causal`.
    pub fn causal_allows(causal: Option<isize>, i: usize, j: usize) -> bool {
        // Sizes of a mask are allocation-bounded, far below isize::MAX.
        causal.is_none_or(|o| (j as isize) <= (i as isize).saturating_add(o))
    }

    /// The structure of the `rows·cols` row-major `allowed` (one pass over the entries at most
    /// per candidate structure: no causal part, then the diagonals 0 and cols − rows).
    fn of(rows: usize, cols: usize, allowed: &[bool]) -> MaskForm {
        let lower_right = cols as isize - rows as isize;
        let candidates = [None, Some(0), Some(lower_right)];
        for (at, &causal) in candidates.iter().enumerate() {
            if candidates[..at].contains(&causal) {
                continue;
            }
            // Keep flags from the last row that reaches each key (past every row's diagonal:
            // no row sees it, so its flag is free and taken as kept).
            let keep: Vec<bool> = (0..cols)
                .map(|j| {
                    (0..rows)
                        .rev()
                        .find(|&i| MaskForm::causal_allows(causal, i, j))
                        .is_none_or(|i| allowed[i * cols + j])
                })
                .collect();
            let fits = allowed
                .chunks_exact(cols.max(1))
                .enumerate()
                .all(|(i, row)| {
                    row.iter()
                        .zip(&keep)
                        .enumerate()
                        .all(|(j, (&a, &k))| a == (MaskForm::causal_allows(causal, i, j) && k))
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

    /// A (rows, cols) mask from `rows·cols` row-major entries (row i: the keys query i sees);
    /// an error if the length is not `rows·cols`.
    pub fn rectangular(rows: usize, cols: usize, allowed: Vec<bool>) -> Result<Mask> {
        if rows.checked_mul(cols) != Some(allowed.len()) {
            return Err(Error::param(
                "mask",
                format!(
                    "{} entries cannot form a ({rows}, {cols}) mask",
                    allowed.len()
                ),
            ));
        }
        Ok(Mask::of_entries(rows, cols, allowed))
    }

    /// The mask of checked entries, its form found.
    fn of_entries(rows: usize, cols: usize, allowed: Vec<bool>) -> Mask {
        Mask {
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
        let what = || format!("a ({rows}, {cols}) attention mask");
        let len = rows.checked_mul(cols).ok_or_else(|| Error::TooLarge {
            op: "mask",
            detail: format!("{}: {rows}·{cols} entries overflow usize", what()),
        })?;
        let mut allowed = crate::alloc::try_with_capacity("mask", &what(), len)?;
        for i in 0..rows {
            allowed.extend((0..cols).map(|j| f(i, j)));
        }
        Ok(Mask::of_entries(rows, cols, allowed))
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
        let o = cols as isize - rows as isize;
        Mask::from_fn_rectangular(rows, cols, |i, j| MaskForm::causal_allows(Some(o), i, j))
    }

    /// The number of rows (queries).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The number of columns (keys).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` (the keys query `i` may attend to); an empty slice past the end.
    pub fn row(&self, i: usize) -> &[bool] {
        i.checked_mul(self.cols)
            .and_then(|at| self.allowed.get(at..)?.get(..self.cols))
            .filter(|_| i < self.rows)
            .unwrap_or(&[])
    }

    /// Whether entry (i, j) is allowed (false out of range).
    pub fn allowed(&self, i: usize, j: usize) -> bool {
        j < self.cols && self.row(i).get(j).copied().unwrap_or(false)
    }

    /// All entries, row-major.
    pub fn as_slice(&self) -> &[bool] {
        &self.allowed
    }

    /// Its structure (causal, key padding, both, none, or dense), found when it was made.
    pub fn form(&self) -> &MaskForm {
        &self.form
    }
}

impl fmt::Debug for Mask {
    /// `mask[10/11]`: rows separated by `/`, 1 = allowed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mask[")?;
        for i in 0..self.rows {
            if i > 0 {
                f.write_str("/")?;
            }
            for &a in self.row(i) {
                f.write_str(if a { "1" } else { "0" })?;
            }
        }
        f.write_str("]")
    }
}

/// Check that the scores' last two axes are (rows, cols) = the mask's sizes.
pub fn check_mask(op: &'static str, mask: &Mask, rows: usize, cols: usize) -> Result<()> {
    if rows == mask.rows() && cols == mask.cols() {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!(
                "the mask is ({}, {}) but the scores are ({rows}, {cols})",
                mask.rows(),
                mask.cols()
            ),
        ))
    }
}

/// Shape rule of `maskedSoftmax`: x of rank ≥ 2 whose last two axes are the mask's (rows,
/// cols); shape-preserving.
pub fn masked_softmax_shape(x: &Shape, mask: &Mask) -> Result<Shape> {
    let op = "maskedSoftmax";
    let d = x.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            op,
            format!("x must have rank ≥ 2 (…, rows, cols), got {x}"),
        ));
    }
    check_mask(op, mask, d[d.len() - 2], d[d.len() - 1])?;
    Ok(x.clone())
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
/// second-to-last axis). PyTorch: `torch.softmax(x.masked_fill(~mask, -inf), -1)` with NaN rows
/// (nothing allowed) replaced by zeros.
pub fn masked_softmax<T: Scalar>(x: &Tensor<T>, mask: &Mask) -> Result<Tensor<T>> {
    masked_softmax_shape(x.shape(), mask)?;
    let (rows, cols) = (mask.rows().max(1), mask.cols().max(1));
    let mut out = crate::alloc::try_zeroed("maskedSoftmax", "output", x.numel())?;
    for (r, (row, o)) in x.data().chunks(cols).zip(out.chunks_mut(cols)).enumerate() {
        masked_softmax_row(row, mask.row(r % rows), o);
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
