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

    /// A shape with the given dims.
    pub fn new(dims: &[usize]) -> Self {
        Shape(SmallVec::from_slice(dims))
    }

    /// The dims, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar; 0 if any dim is 0).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
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
            strides[i] = strides[i + 1] * self.0[i + 1];
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
        let outer = self.0[..axis].iter().product();
        let inner = self.0[axis + 1..].iter().product();
        Ok((outer, n, inner))
    }

    /// Fold all leading axes into rows and keep the last as columns: the softmax view.
    /// A scalar is one row of one column.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.0.last() {
            None => (1, 1),
            Some(&c) => (self.0[..self.rank() - 1].iter().product(), c),
        }
    }
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
    fn rows_cols_folds_leading_axes() {
        assert_eq!(Shape::new(&[2, 3, 4]).rows_cols(), (6, 4));
        assert_eq!(Shape::new(&[7]).rows_cols(), (1, 7));
        assert_eq!(Shape::scalar().rows_cols(), (1, 1));
    }
}
