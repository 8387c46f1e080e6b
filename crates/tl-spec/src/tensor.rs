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
    /// A tensor of `shape` holding `data` in row-major order; errors if the lengths disagree
    /// (including when the shape's element count overflows: it is never taken modulo 2⁶⁴).
    pub fn new(shape: impl Into<Shape>, data: Vec<T>) -> Result<Self> {
        let shape = shape.into();
        if shape.checked_numel() != Some(data.len()) {
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

    /// [`Tensor::full`], checked: an [`Error::TooLarge`] naming `op` when the shape's element
    /// count overflows or its bytes exceed the allocation cap ([`crate::alloc`]). Use this
    /// wherever the shape comes from input.
    pub fn try_full(op: &'static str, shape: impl Into<Shape>, v: T) -> Result<Self> {
        let shape = shape.into();
        crate::alloc::check_shape::<T>(op, &shape)?;
        let data = crate::alloc::try_vec(op, "tensor", shape.numel(), v)?;
        Ok(Tensor {
            shape,
            data: Arc::new(data),
        })
    }

    /// [`Tensor::zeros`], checked as [`Tensor::try_full`].
    pub fn try_zeros(op: &'static str, shape: impl Into<Shape>) -> Result<Self> {
        Self::try_full(op, shape, T::zero())
    }

    /// [`Tensor::from_fn`], checked as [`Tensor::try_full`].
    pub fn try_from_fn(
        op: &'static str,
        shape: impl Into<Shape>,
        f: impl FnMut(usize) -> T,
    ) -> Result<Self> {
        let shape = shape.into();
        crate::alloc::check_shape::<T>(op, &shape)?;
        let mut data = crate::alloc::try_with_capacity(op, "tensor", shape.numel())?;
        data.extend((0..shape.numel()).map(f));
        Ok(Tensor {
            shape,
            data: Arc::new(data),
        })
    }

    /// A tensor whose element at row-major position `i` is `f(i)`.
    ///
    /// For shapes the caller controls (literals, the shape of a tensor that exists). A shape
    /// from input goes through [`Tensor::try_from_fn`], as all of this workspace's library code
    /// does.
    ///
    /// # Panics
    ///
    /// A programmer error: when the shape's element count overflows, its bytes exceed the
    /// allocation cap ([`crate::alloc`]) or the system allocator refuses them. The message is
    /// [`Tensor::try_from_fn`]'s error; the process is never aborted.
    pub fn from_fn(shape: impl Into<Shape>, f: impl FnMut(usize) -> T) -> Self {
        Self::try_from_fn("Tensor::from_fn", shape, f).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A tensor of `shape` filled with `v`. PyTorch: `torch.full`.
    ///
    /// For shapes the caller controls; see [`Tensor::try_full`] for shapes from input.
    ///
    /// # Panics
    ///
    /// As [`Tensor::from_fn`]: a shape that cannot be allocated is a programmer error.
    pub fn full(shape: impl Into<Shape>, v: T) -> Self {
        Self::try_full("Tensor::full", shape, v).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A tensor of zeros. PyTorch: `torch.zeros`. Panics as [`Tensor::full`];
    /// [`Tensor::try_zeros`] for shapes from input.
    pub fn zeros(shape: impl Into<Shape>) -> Self {
        Self::full(shape, T::zero())
    }

    /// A tensor of ones. PyTorch: `torch.ones`. Panics as [`Tensor::full`].
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

    /// Mutable access to the elements if nothing else shares the storage; `None` (and no
    /// copy) if something does. An update that can write in place uses it, and makes a new
    /// buffer otherwise.
    pub fn unique_data_mut(&mut self) -> Option<&mut [T]> {
        Arc::get_mut(&mut self.data).map(Vec::as_mut_slice)
    }

    /// The elements as an owned vector (copies only if the storage is shared).
    pub fn into_vec(self) -> Vec<T> {
        Arc::try_unwrap(self.data).unwrap_or_else(|shared| (*shared).clone())
    }

    /// The data, if nothing else shares it (else the tensor back, unchanged). Used to pool a
    /// buffer only when no other tensor can still read it ([`crate::pool::Pool::recycle`]).
    pub fn try_into_vec(self) -> std::result::Result<Vec<T>, Self> {
        let shape = self.shape;
        Arc::try_unwrap(self.data).map_err(|data| Tensor { shape, data })
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
        let mut flat = 0usize;
        for (&i, &d) in index.iter().zip(self.shape.dims()) {
            if i >= d {
                return None;
            }
            flat = flat.checked_mul(d)?.checked_add(i)?;
        }
        self.data.get(flat).copied()
    }

    /// The same elements under another shape of equal size; shares storage (no copy). A target
    /// shape whose element count overflows is an error (never taken modulo 2⁶⁴).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let n = shape.check_size("reshape")?;
        if n != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    self.shape,
                    self.numel(),
                    shape,
                    n
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

    /// `f` applied to every element, into a buffer checked as [`crate::alloc::try_with_capacity`]
    /// (a spare buffer of the installed [`crate::pool`] where there is one): an
    /// [`Error::TooLarge`] naming `op` when the allocation is refused. This is how library code
    /// maps a tensor.
    pub fn try_map(&self, op: &'static str, f: impl Fn(T) -> T) -> Result<Self> {
        self.same_shape_from(op, self.data.iter().map(|&x| f(x)))
    }

    /// A tensor of this one's shape holding `values` (one per element), its buffer checked as
    /// [`crate::alloc::try_collect`]'s: the one allocation of [`Tensor::try_map`],
    /// [`Tensor::zip_map`] and [`Tensor::try_cast`].
    fn same_shape_from<U: Scalar>(
        &self,
        op: &'static str,
        values: impl Iterator<Item = U>,
    ) -> Result<Tensor<U>> {
        let data = crate::alloc::try_collect(op, "tensor", self.data.len(), values)?;
        Ok(Tensor {
            shape: self.shape.clone(),
            data: Arc::new(data),
        })
    }

    /// `f` applied to every element: [`Tensor::try_map`] for tensors the caller controls (tests,
    /// examples).
    ///
    /// # Panics
    ///
    /// As [`Tensor::from_fn`]: when the allocation is refused (the message is
    /// [`Tensor::try_map`]'s error); the process is never aborted.
    pub fn map(&self, f: impl Fn(T) -> T) -> Self {
        self.try_map("Tensor::map", f)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Combine two tensors of the same shape elementwise; a shape error names `op` otherwise, and
    /// the output is allocated as [`Tensor::try_map`]'s.
    pub fn zip_map(&self, op: &'static str, other: &Self, f: impl Fn(T, T) -> T) -> Result<Self> {
        if self.shape != other.shape {
            return Err(Error::shape(
                op,
                format!("operands have shapes {} and {}", self.shape, other.shape),
            ));
        }
        let values = self.data.iter().zip(other.data.iter());
        self.same_shape_from(op, values.map(|(&a, &b)| f(a, b)))
    }

    /// Every element converted to another scalar type (via `f64`), into a buffer checked as
    /// [`Tensor::try_map`]'s: an [`Error::TooLarge`] naming `op` when the allocation is refused.
    pub fn try_cast<U: Scalar>(&self, op: &'static str) -> Result<Tensor<U>> {
        self.same_shape_from(op, self.data.iter().map(|&x| U::lit(x.as_f64())))
    }

    /// Every element converted to another scalar type (via `f64`): [`Tensor::try_cast`] for
    /// tensors the caller controls.
    ///
    /// # Panics
    ///
    /// As [`Tensor::map`], when the allocation is refused.
    pub fn cast<U: Scalar>(&self) -> Tensor<U> {
        self.try_cast("Tensor::cast")
            .unwrap_or_else(|e| panic!("{e}"))
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
    fn overflowing_shapes_are_rejected_not_wrapped() {
        // 2^32 · 2^32 wraps to 0 in usize arithmetic.
        let e = Tensor::<f32>::new([1 << 32, 1 << 32], vec![]).unwrap_err();
        assert!(matches!(e, Error::Data { len: 0, .. }), "{e}");
        // 3 · 6148914691236517206 wraps to 2.
        let t = Tensor::<f64>::vector(vec![1.0, 2.0]);
        let e = t.reshape([3, 6148914691236517206]).unwrap_err().to_string();
        assert!(e.contains("reshape") && e.contains("overflows"), "{e}");
        assert_eq!(t.get(&[2, 0]), None);
        // Zero-element shapes with huge dims are fine (they hold nothing).
        assert!(Tensor::<f32>::new([1 << 32, 0], vec![]).is_ok());
        let e = Tensor::<f64>::try_zeros("zeros", [1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(e, Error::TooLarge { op: "zeros", .. }), "{e}");
        let e = Tensor::<f64>::try_from_fn("fill", [1 << 60], |i| i as f64).unwrap_err();
        assert!(matches!(e, Error::TooLarge { op: "fill", .. }), "{e}");
        assert_eq!(
            Tensor::<f32>::try_full("full", [2], 3.0).unwrap().data(),
            &[3.0, 3.0]
        );
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
