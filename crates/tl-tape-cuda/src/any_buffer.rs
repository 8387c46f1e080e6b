//! [`AnyBuffer`]: a device buffer with its runtime [`Shape`], and the bridge to and
//! from host tensors (upload converts to the f32 wire format, download converts back).

use std::fmt;

use tl_spec::{Scalar, Shape, Tensor};

use crate::device::{Buffer, Device};
use crate::{Error, Result, wire};

/// A shape-erased device tensor: runtime shape plus a float32 buffer of `shape.numel()`
/// elements. The CUDA tape's analogue of a `Tensor`; like the [`Buffer`] inside it, it is a
/// handle (cheap to clone) and its memory is released explicitly.
#[derive(Clone, PartialEq, Eq)]
pub struct AnyBuffer {
    shape: Shape,
    buf: Buffer,
}

impl fmt::Debug for AnyBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.shape, self.buf)
    }
}

impl AnyBuffer {
    /// Pair `buf` with `shape`; errors (naming `what`) unless the buffer has `shape.numel()`
    /// elements.
    pub fn new(what: &str, shape: Shape, buf: Buffer) -> Result<AnyBuffer> {
        if buf.len() != shape.numel() {
            return Err(Error::Count {
                what: format!("{what}: elements of a buffer for shape {shape}"),
                expected: shape.numel(),
                got: buf.len(),
            });
        }
        Ok(AnyBuffer { shape, buf })
    }

    /// The runtime shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The device buffer.
    pub fn buffer(&self) -> Buffer {
        self.buf
    }

    /// The same buffer under another shape of equal element count (a no-copy view).
    pub fn reshaped(&self, shape: Shape) -> Result<AnyBuffer> {
        AnyBuffer::new("reshape", shape, self.buf)
    }

    /// Upload a host tensor (converted to the f32 wire format; see [`crate::wire`]).
    pub fn upload<T: Scalar, D: Device + ?Sized>(dev: &mut D, t: &Tensor<T>) -> Result<AnyBuffer> {
        let data = wire::to_wire("upload", t.data())?;
        let buf = dev.upload(&data)?;
        Ok(AnyBuffer {
            shape: t.shape().clone(),
            buf,
        })
    }

    /// [`upload`](Self::upload), except that a tensor whose elements are all the same (on the
    /// wire, bit for bit: a backward seed of ones) is filled on the device instead: one kernel
    /// launch rather than a host-to-device copy.
    pub fn upload_or_fill<T: Scalar, D: Device + ?Sized>(
        dev: &mut D,
        t: &Tensor<T>,
    ) -> Result<AnyBuffer> {
        let data = wire::to_wire("upload", t.data())?;
        let buf = match data.split_first() {
            Some((&v, rest)) if rest.iter().all(|r| r.to_bits() == v.to_bits()) => {
                dev.full(data.len(), v)?
            }
            _ => dev.upload(&data)?,
        };
        Ok(AnyBuffer {
            shape: t.shape().clone(),
            buf,
        })
    }

    /// A buffer of zeros of `shape`.
    pub fn zeros<D: Device + ?Sized>(dev: &mut D, shape: &Shape) -> Result<AnyBuffer> {
        let buf = dev.zeros(shape.numel())?;
        Ok(AnyBuffer {
            shape: shape.clone(),
            buf,
        })
    }

    /// A buffer of `shape` filled with `v`.
    pub fn full<D: Device + ?Sized>(dev: &mut D, shape: &Shape, v: f32) -> Result<AnyBuffer> {
        let buf = dev.full(shape.numel(), v)?;
        Ok(AnyBuffer {
            shape: shape.clone(),
            buf,
        })
    }

    /// Download into a host tensor of scalar type `T` (widened from f32 exactly).
    pub fn download<T: Scalar, D: Device + ?Sized>(&self, dev: &D) -> Result<Tensor<T>> {
        let data = dev.download(self.buf)?;
        if data.len() != self.shape.numel() {
            return Err(Error::Count {
                what: format!("download: elements of a buffer for shape {}", self.shape),
                expected: self.shape.numel(),
                got: data.len(),
            });
        }
        Ok(Tensor::new(
            self.shape.clone(),
            wire::from_wire("download", &data)?,
        )?)
    }

    /// A fresh copy (device to device) with the same shape (TorchLean's checked copy).
    pub fn copy<D: Device + ?Sized>(&self, dev: &mut D) -> Result<AnyBuffer> {
        let buf = dev.copy(self.buf)?;
        Ok(AnyBuffer {
            shape: self.shape.clone(),
            buf,
        })
    }

    /// Release the buffer; returns whether a live allocation was freed (idempotent).
    pub fn release<D: Device + ?Sized>(&self, dev: &mut D) -> bool {
        dev.release(self.buf)
    }

    /// Bytes of data.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimDevice;

    /// A uniform tensor is filled by a launch, anything else copied; both read back as
    /// `upload` would give them (f64 values rounded to the wire's f32 the same way).
    #[test]
    fn upload_or_fill_fills_uniform_tensors_and_copies_the_rest() {
        let mut dev = SimDevice::new();
        for (t, filled) in [
            (Tensor::<f64>::full([2, 3], 0.1), true),
            (Tensor::<f64>::scalar(1.0), true),
            (Tensor::<f64>::from_fn([3], |i| 0.1 + i as f64), false),
            (Tensor::<f64>::zeros([0]), false),
        ] {
            let before = dev.traffic();
            let b = AnyBuffer::upload_or_fill(&mut dev, &t).unwrap();
            let d = dev.traffic() - before;
            assert_eq!(
                (d.launches, d.uploads),
                (u64::from(filled), u64::from(!filled))
            );
            let want = AnyBuffer::upload(&mut dev, &t).unwrap();
            assert_eq!(b.shape(), t.shape());
            assert_eq!(
                b.download::<f64, _>(&dev).unwrap(),
                want.download::<f64, _>(&dev).unwrap()
            );
        }
    }

    #[test]
    fn upload_download_round_trip_and_shape_check() {
        let mut dev = SimDevice::new();
        let t = Tensor::<f64>::from_fn([2, 3], |i| i as f64 * 0.25);
        let b = AnyBuffer::upload(&mut dev, &t).unwrap();
        assert_eq!(b.shape(), t.shape());
        assert_eq!(b.download::<f64, _>(&dev).unwrap(), t);
        let e = AnyBuffer::new("leaf", Shape::new(&[4]), b.buffer()).unwrap_err();
        assert!(e.to_string().contains("[4]"), "{e}");
        assert!(b.reshaped(Shape::new(&[3, 2])).is_ok());
        assert!(b.release(&mut dev));
        assert!(!b.release(&mut dev));
        assert!(matches!(
            b.download::<f32, _>(&dev),
            Err(Error::Released { .. })
        ));
    }
}
