//! Row-major shapes. A scalar has no dims.

use smallvec::SmallVec;
use std::fmt;

use crate::{Error, Result};

/// The dims of a tensor, outermost first (row-major). `Shape::scalar()` has no dims.
///
/// PyTorch equivalent: `torch.Size`.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(SmallVec<[usize; 6]>);

impl Shape {
    /// The shape of a scalar (rank 0, one element).
    pub fn scalar() -> Self {
        Shape(SmallVec::new())
    }

    /// A shape with the given dims. Any dims are accepted; a shape whose element count
    /// overflows can be described but never allocated: [`Shape::try_new`] and
    /// [`Shape::check_size`] reject it, and so does every fallible entry point (tensor
    /// constructors, `reshape`, the IR's shape rules, tape leaves and sessions).
    pub fn new(dims: &[usize]) -> Self {
        Shape(SmallVec::from_slice(dims))
    }

    /// The largest element count of a shape the runtime accepts: `isize::MAX / 8`, so that a
    /// buffer of any scalar (or index) type of the shape has a byte size that fits in `isize`.
    /// (Allocations are further bounded by [`crate::alloc`]'s cap.)
    pub const MAX_NUMEL: usize = isize::MAX as usize / 8;

    /// A shape with the given dims, or an [`Error::TooLarge`] naming `op` when its element count
    /// overflows or exceeds [`Shape::MAX_NUMEL`].
    pub fn try_new(op: &'static str, dims: &[usize]) -> Result<Self> {
        let s = Shape::new(dims);
        s.check_size(op)?;
        Ok(s)
    }

    /// The element count, or `None` when the product of the dims overflows `usize`. A shape
    /// with a zero dim has 0 elements whatever its other dims.
    pub fn checked_numel(&self) -> Option<usize> {
        if self.0.contains(&0) {
            return Some(0);
        }
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// The element count, checked: an [`Error::TooLarge`] naming `op` and the shape when it
    /// overflows `usize` or exceeds [`Shape::MAX_NUMEL`].
    pub fn check_size(&self, op: &'static str) -> Result<usize> {
        match self.checked_numel() {
            Some(n) if n <= Self::MAX_NUMEL => Ok(n),
            Some(n) => Err(Error::TooLarge {
                op,
                detail: format!(
                    "shape {self} has {n} elements, more than the {} a tensor may have",
                    Self::MAX_NUMEL
                ),
            }),
            None => Err(Error::TooLarge {
                op,
                detail: format!("the element count of shape {self} overflows usize"),
            }),
        }
    }

    /// The dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar; 0 if any dim is 0). Saturates at `usize::MAX` when
    /// the product overflows (it never wraps); see [`Shape::checked_numel`].
    pub fn numel(&self) -> usize {
        sat_product(&self.0)
    }

    /// The product of `dims`: 0 when any is 0 (however large the others), saturating at
    /// `usize::MAX` otherwise. For row lengths and strides of tensors that may be empty:
    /// `dims[1..]` of an empty `[0, 2⁶², 8]` has a product that overflows, which `iter().product()`
    /// would panic on (debug) or wrap (release).
    pub fn saturating_product(dims: &[usize]) -> usize {
        sat_product(dims)
    }

    /// Whether this is the scalar shape.
    pub fn is_scalar(&self) -> bool {
        self.0.is_empty()
    }

    /// The length of `axis`, or a parameter error naming `op` when the axis is out of range.
    pub fn dim(&self, op: &'static str, axis: usize) -> Result<usize> {
        self.0.get(axis).copied().ok_or_else(|| {
            Error::param(
                op,
                format!(
                    "axis {axis} out of range for shape {self} (rank {})",
                    self.rank()
                ),
            )
        })
    }

    /// Row-major strides (in elements) of a contiguous tensor of this shape.
    pub fn strides(&self) -> SmallVec<[usize; 6]> {
        let mut strides: SmallVec<[usize; 6]> = SmallVec::from_elem(1, self.rank());
        for i in (0..self.rank().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(self.0[i + 1]);
        }
        strides
    }

    /// This shape with `axis` removed (the result shape of an axis reduction).
    pub fn remove_axis(&self, op: &'static str, axis: usize) -> Result<Shape> {
        self.dim(op, axis)?;
        let mut dims = self.0.clone();
        dims.remove(axis);
        Ok(Shape(dims))
    }

    /// Split at `axis` into (product of dims before, dim, product of dims after).
    pub fn split_at_axis(&self, op: &'static str, axis: usize) -> Result<(usize, usize, usize)> {
        let n = self.dim(op, axis)?;
        let outer = sat_product(&self.0[..axis]);
        let inner = sat_product(&self.0[axis + 1..]);
        Ok((outer, n, inner))
    }

    /// Fold all leading axes into rows and keep the last as columns: the softmax view.
    /// A scalar is one row of one column.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.0.last() {
            None => (1, 1),
            Some(&c) => (sat_product(&self.0[..self.rank() - 1]), c),
        }
    }
}

/// The product of `dims`, 0 if any is 0, saturating at `usize::MAX` otherwise.
fn sat_product(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        return 0;
    }
    dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape::new(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::new(&dims)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape::new(&dims)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_has_one_element_and_no_dims() {
        let s = Shape::scalar();
        assert_eq!(s.rank(), 0);
        assert_eq!(s.numel(), 1);
        assert_eq!(s.to_string(), "[]");
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(Shape::new(&[2, 3, 4]).strides().as_slice(), &[12, 4, 1]);
        assert_eq!(Shape::new(&[5]).strides().as_slice(), &[1]);
    }

    #[test]
    fn axis_out_of_range_is_an_error_naming_the_op() {
        let e = Shape::new(&[2, 3]).dim("reduceSum", 2).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("reduceSum") && msg.contains("[2, 3]"), "{msg}");
    }

    #[test]
    fn overflowing_element_counts_are_caught_not_wrapped() {
        let big = Shape::new(&[1 << 32, 1 << 32]);
        assert_eq!(big.checked_numel(), None);
        assert_eq!(
            big.numel(),
            usize::MAX,
            "saturates instead of wrapping to 0"
        );
        let e = big.check_size("reshape").unwrap_err().to_string();
        assert!(e.contains("reshape") && e.contains("overflows"), "{e}");
        // 3 · 6148914691236517206 wraps to 2 in usize arithmetic.
        let wraps = Shape::new(&[3, 6148914691236517206]);
        assert_eq!(wraps.checked_numel(), None);
        assert!(Shape::try_new("x", &[3, 6148914691236517206]).is_err());
        // A zero dim makes the count 0 whatever the others.
        assert_eq!(Shape::new(&[0, usize::MAX, 7]).checked_numel(), Some(0));
        assert_eq!(Shape::new(&[0, usize::MAX]).numel(), 0);
        // Fits usize but not the per-tensor limit.
        assert!(Shape::new(&[Shape::MAX_NUMEL + 1]).check_size("x").is_err());
        assert_eq!(Shape::new(&[2, 3]).check_size("x"), Ok(6));
    }

    #[test]
    fn rows_cols_folds_leading_axes() {
        assert_eq!(Shape::new(&[2, 3, 4]).rows_cols(), (6, 4));
        assert_eq!(Shape::new(&[7]).rows_cols(), (1, 7));
        assert_eq!(Shape::scalar().rows_cols(), (1, 1));
    }
}
