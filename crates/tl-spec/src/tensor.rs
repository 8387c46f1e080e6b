//! `Tensor<T>`: a shape plus contiguous row-major elements, shared copy-on-write.

use std::fmt;
use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::{Error, Result, Scalar, Shape};

/// A dense, row-major tensor of `T`.
///
/// Storage is reference-counted: `clone` and [`Tensor::reshape`] share the elements, and the
/// first mutation through [`Tensor::data_mut`] copies them if they are shared. Interoperates
/// with `ndarray` through [`Tensor::view`], [`Tensor::from_array`] and [`Tensor::to_array`].
///
/// PyTorch equivalent: a contiguous `torch.Tensor`.
#[derive(Clone, PartialEq)]
pub struct Tensor<T> {
    shape: Shape,
    data: Arc<Vec<T>>,
}

impl<T: Scalar> Tensor<T> {
    /// A tensor of `shape` holding `data` in row-major order; errors if the lengths disagree.
    pub fn new(shape: impl Into<Shape>, data: Vec<T>) -> Result<Self> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(Error::Data {
                len: data.len(),
                shape,
            });
        }
        Ok(Tensor {
            shape,
            data: Arc::new(data),
        })
    }

    /// A tensor whose element at row-major position `i` is `f(i)`.
    pub fn from_fn(shape: impl Into<Shape>, f: impl FnMut(usize) -> T) -> Self {
        let shape = shape.into();
        let data = (0..shape.numel()).map(f).collect();
        Tensor {
            shape,
            data: Arc::new(data),
        }
    }

    /// A tensor of `shape` filled with `v`. PyTorch: `torch.full`.
    pub fn full(shape: impl Into<Shape>, v: T) -> Self {
        let shape = shape.into();
        let data = vec![v; shape.numel()];
        Tensor {
            shape,
            data: Arc::new(data),
        }
    }

    /// A tensor of zeros. PyTorch: `torch.zeros`.
    pub fn zeros(shape: impl Into<Shape>) -> Self {
        Self::full(shape, T::zero())
    }

    /// A tensor of ones. PyTorch: `torch.ones`.
    pub fn ones(shape: impl Into<Shape>) -> Self {
        Self::full(shape, T::one())
    }

    /// A rank-0 tensor holding `v`.
    pub fn scalar(v: T) -> Self {
        Self::full(Shape::scalar(), v)
    }

    /// A 1-D tensor holding `data`.
    pub fn vector(data: Vec<T>) -> Self {
        Tensor {
            shape: Shape::new(&[data.len()]),
            data: Arc::new(data),
        }
    }

    /// Copy an `ndarray` array (any layout) into a tensor.
    pub fn from_array(a: ArrayD<T>) -> Self {
        let shape = Shape::new(a.shape());
        let data = if a.is_standard_layout() {
            a.into_raw_vec_and_offset().0
        } else {
            a.iter().copied().collect()
        };
        Tensor {
            shape,
            data: Arc::new(data),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements in row-major order.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// Mutable access to the elements (copies them first if the storage is shared).
    pub fn data_mut(&mut self) -> &mut [T] {
        Arc::make_mut(&mut self.data).as_mut_slice()
    }

    /// The elements as an owned vector (copies only if the storage is shared).
    pub fn into_vec(self) -> Vec<T> {
        Arc::try_unwrap(self.data).unwrap_or_else(|shared| (*shared).clone())
    }

    /// Whether two tensors share the same storage (a no-copy reshape does).
    pub fn shares_storage_with(&self, other: &Tensor<T>) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    /// The single element of a one-element tensor.
    pub fn item(&self) -> Result<T> {
        if self.numel() == 1 {
            Ok(self.data[0])
        } else {
            Err(Error::shape(
                "item",
                format!("expected one element, got shape {}", self.shape),
            ))
        }
    }

    /// The element at a multi-index, or `None` when out of range.
    pub fn get(&self, index: &[usize]) -> Option<T> {
        if index.len() != self.shape.rank() {
            return None;
        }
        let mut flat = 0;
        for (&i, &d) in index.iter().zip(self.shape.dims()) {
            if i >= d {
                return None;
            }
            flat = flat * d + i;
        }
        Some(self.data[flat])
    }

    /// The same elements under another shape of equal size; shares storage (no copy).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape.numel() != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    self.shape,
                    self.numel(),
                    shape,
                    shape.numel()
                ),
            ));
        }
        Ok(Tensor {
            shape,
            data: Arc::clone(&self.data),
        })
    }

    /// A borrowed `ndarray` view with this tensor's shape.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        ArrayViewD::from_shape(IxDyn(self.shape.dims()), &self.data)
            .expect("invariant: data length equals shape.numel()")
    }

    /// An owned `ndarray` copy.
    pub fn to_array(&self) -> ArrayD<T> {
        self.view().to_owned()
    }

    /// Apply `f` to every element.
    pub fn map(&self, f: impl Fn(T) -> T) -> Self {
        Tensor {
            shape: self.shape.clone(),
            data: Arc::new(self.data.iter().map(|&x| f(x)).collect()),
        }
    }

    /// Combine two tensors of the same shape elementwise; a shape error names `op` otherwise.
    pub fn zip_map(&self, op: &'static str, other: &Self, f: impl Fn(T, T) -> T) -> Result<Self> {
        if self.shape != other.shape {
            return Err(Error::shape(
                op,
                format!("operands have shapes {} and {}", self.shape, other.shape),
            ));
        }
        Ok(Tensor {
            shape: self.shape.clone(),
            data: Arc::new(
                self.data
                    .iter()
                    .zip(other.data.iter())
                    .map(|(&a, &b)| f(a, b))
                    .collect(),
            ),
        })
    }

    /// Convert every element to another scalar type (via `f64`).
    pub fn cast<U: Scalar>(&self) -> Tensor<U> {
        Tensor {
            shape: self.shape.clone(),
            data: Arc::new(self.data.iter().map(|&x| U::lit(x.as_f64())).collect()),
        }
    }

    /// Elementwise sum of two same-shaped tensors.
    pub fn add(&self, other: &Self) -> Result<Self> {
        self.zip_map("add", other, |a, b| a + b)
    }

    /// Add `other` into `self` in place (same shape required).
    pub fn add_assign(&mut self, other: &Self) -> Result<()> {
        if self.shape != other.shape {
            return Err(Error::shape(
                "accumulate",
                format!("cannot add {} into {}", other.shape, self.shape),
            ));
        }
        for (a, &b) in self.data_mut().iter_mut().zip(other.data.iter()) {
            *a += b;
        }
        Ok(())
    }

    /// Sum of all elements, accumulated in `f64`.
    pub fn sum_f64(&self) -> f64 {
        self.data.iter().map(|x| x.as_f64()).sum()
    }

    /// ⟨self, other⟩ accumulated in `f64` (same shape required).
    pub fn dot_f64(&self, other: &Self) -> Result<f64> {
        if self.shape != other.shape {
            return Err(Error::shape(
                "dot",
                format!("operands have shapes {} and {}", self.shape, other.shape),
            ));
        }
        Ok(self
            .data
            .iter()
            .zip(other.data.iter())
            .map(|(a, b)| a.as_f64() * b.as_f64())
            .sum())
    }
}

impl<T: Scalar> fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{} ", T::NAME, self.shape)?;
        const MAX: usize = 16;
        f.debug_list()
            .entries(self.data.iter().take(MAX))
            .finish()?;
        if self.numel() > MAX {
            write!(f, " … ({} more)", self.numel() - MAX)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_wrong_length() {
        let e = Tensor::<f64>::new([2, 3], vec![0.0; 5]).unwrap_err();
        assert!(e.to_string().contains("[2, 3]"));
    }

    #[test]
    fn reshape_shares_storage_and_checks_size() {
        let t = Tensor::<f32>::from_fn([2, 3], |i| i as f32);
        let r = t.reshape([3, 2]).unwrap();
        assert!(r.shares_storage_with(&t));
        assert_eq!(r.get(&[2, 1]), Some(5.0));
        assert!(t.reshape([4]).is_err());
    }

    #[test]
    fn data_mut_copies_shared_storage() {
        let t = Tensor::<f64>::zeros([3]);
        let mut u = t.clone();
        u.data_mut()[0] = 1.0;
        assert_eq!(t.data()[0], 0.0);
        assert_eq!(u.data()[0], 1.0);
    }

    #[test]
    fn ndarray_round_trip_handles_non_standard_layout() {
        let t = Tensor::<f64>::from_fn([2, 3], |i| i as f64);
        let transposed = t.view().reversed_axes().to_owned();
        let back = Tensor::from_array(transposed.reversed_axes());
        assert_eq!(back, t);
        let tt = Tensor::from_array(t.view().reversed_axes().to_owned());
        assert_eq!(tt.data(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
