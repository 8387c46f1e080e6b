//! A training step's gradient reduction on a device ([`Train::backward_step_reduced`] of both
//! sessions on a CUDA tape): in device memory when the reducer works there
//! (`GradReducer::reduce_on_device`, features `cuda`, `cuda-emu`: NCCL, on the CUDA device),
//! else through the host.
//!
//! [`Train::backward_step_reduced`]: crate::Train::backward_step_reduced

use std::collections::HashMap;

use tl_spec::{Scalar, Tensor};
use tl_tape_cuda::{AnyBuffer, Device, SimDevice};

use crate::{Error, GradReducer, Result};

const WHAT: &str = "backward_step_reduced";

/// A device whose tape's gradients a [`GradReducer`] can reduce.
pub(crate) trait ReduceOn: Device + Sized {
    /// The gradients of `ids` (tape ids of `grads`, in the reducer's order) handed to
    /// `reduce`; what it leaves is put back in `grads` (replaced buffers released). On the
    /// host unless the device and the reducer both work in device memory.
    fn reduce_grads<T: Scalar>(
        &mut self,
        grads: &mut HashMap<usize, AnyBuffer>,
        ids: &[usize],
        reduce: &mut dyn GradReducer<T>,
    ) -> Result<()> {
        through_host(self, grads, ids, reduce)
    }
}

impl ReduceOn for SimDevice {}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
impl ReduceOn for tl_tape_cuda::CudaDevice {
    fn reduce_grads<T: Scalar>(
        &mut self,
        grads: &mut HashMap<usize, AnyBuffer>,
        ids: &[usize],
        reduce: &mut dyn GradReducer<T>,
    ) -> Result<()> {
        match on_device(self, grads, ids, reduce) {
            Some(r) => r,
            None => through_host(self, grads, ids, reduce),
        }
    }
}

/// The gradient of tape id `id` in `grads`, or an error naming it.
fn grad_of(grads: &HashMap<usize, AnyBuffer>, id: usize) -> Result<&AnyBuffer> {
    grads.get(&id).ok_or_else(|| Error::Usage {
        what: WHAT,
        detail: format!("gradient of tape node {id} is missing"),
    })
}

/// Each of `ids` once (the reducer must see each buffer once: a sum taken twice is wrong).
fn distinct(ids: &[usize]) -> Result<()> {
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    match ids.iter().find(|&&id| !seen.insert(id)) {
        Some(id) => Err(Error::Usage {
            what: WHAT,
            detail: format!("gradient of tape node {id} is listed twice"),
        }),
        None => Ok(()),
    }
}

/// The gradients of `ids` downloaded, reduced on the host by `reduce`, uploaded back (the old
/// buffers released).
fn through_host<T: Scalar, D: Device>(
    dev: &mut D,
    grads: &mut HashMap<usize, AnyBuffer>,
    ids: &[usize],
    reduce: &mut dyn GradReducer<T>,
) -> Result<()> {
    distinct(ids)?;
    let mut host = Vec::with_capacity(ids.len());
    for &id in ids {
        host.push(grad_of(grads, id)?.download::<T, _>(dev)?);
    }
    let mut bufs: Vec<&mut [T]> = host.iter_mut().map(Tensor::data_mut).collect();
    reduce.reduce(&mut bufs)?;
    for (id, h) in ids.iter().zip(&host) {
        let up = AnyBuffer::upload(dev, h)?;
        if let Some(old) = grads.insert(*id, up) {
            old.release(dev);
        }
    }
    Ok(())
}

/// The gradient buffers of `ids` handed to `reduce`'s device path, and the buffers it leaves
/// put back in `grads` (whatever its outcome, so every buffer stays owned once). `None` when
/// `reduce` works on the host only.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
fn on_device<T: Scalar>(
    dev: &mut tl_tape_cuda::CudaDevice,
    grads: &mut HashMap<usize, AnyBuffer>,
    ids: &[usize],
    reduce: &mut dyn GradReducer<T>,
) -> Option<Result<()>> {
    if let Err(e) = distinct(ids) {
        return Some(Err(e));
    }
    let mut shapes = Vec::with_capacity(ids.len());
    let mut bufs = Vec::with_capacity(ids.len());
    for &id in ids {
        match grad_of(grads, id) {
            Ok(g) => {
                shapes.push(g.shape().clone());
                bufs.push(g.buffer());
            }
            Err(e) => return Some(Err(e)),
        }
    }
    let out = reduce.reduce_on_device(dev, &mut bufs)?;
    for ((&id, shape), buf) in ids.iter().zip(shapes).zip(bufs) {
        match AnyBuffer::new("backward_step_reduced (a reduced gradient)", shape, buf) {
            Ok(g) => {
                grads.insert(id, g);
            }
            Err(e) => return Some(out.and(Err(e.into()))),
        }
    }
    Some(out)
}
