//! The gradient mean of a data-parallel step: every rank's gradient buffers, checked to have
//! one layout on every rank, summed across the ranks in buckets and divided by the rank count.

use tl_spec::{Scalar, TypedMut};

use super::Collective;
use crate::Result;
use crate::error::usage;

/// The gradient elements all-reduced at a time by default (4 MiB of `f32`): large enough that
/// the per-call latency is small beside the transfer, small enough for the copy to stay cheap.
pub const DEFAULT_BUCKET_ELEMS: usize = 1 << 20;

const WHAT: &str = "Runtime::step (data-parallel)";

/// Replace every buffer of `grads` by its mean over the ranks: the buffers, concatenated in
/// order, are reduced `bucket` elements at a time. The layout (the buffers' lengths) must be
/// the same on every rank: the step's status exchange compared it ([`check_layout`]).
pub(crate) fn mean<T: Scalar>(
    comm: &dyn Collective,
    bucket: usize,
    grads: &mut [&mut [T]],
) -> Result<()> {
    let total: usize = grads.iter().map(|g| g.len()).sum();
    let cap = bucket.min(total).max(1);
    let mut buf: Vec<T> = tl_spec::alloc::try_with_capacity(WHAT, "gradient bucket", cap)?;
    let n = T::lit(comm.size() as f64);
    // (buffer, offset, length) of each piece of the bucket being filled.
    let mut pieces: Vec<(usize, usize, usize)> = Vec::new();
    let flush = |buf: &mut Vec<T>,
                 pieces: &mut Vec<(usize, usize, usize)>,
                 grads: &mut [&mut [T]]|
     -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        all_reduce_sum(comm, buf)?;
        let mut at = 0;
        for &(g, off, len) in pieces.iter() {
            for (dst, &src) in grads[g][off..off + len].iter_mut().zip(&buf[at..at + len]) {
                *dst = src / n;
            }
            at += len;
        }
        buf.clear();
        pieces.clear();
        Ok(())
    };
    for g in 0..grads.len() {
        let mut off = 0;
        while off < grads[g].len() {
            let len = (cap - buf.len()).min(grads[g].len() - off);
            buf.extend_from_slice(&grads[g][off..off + len]);
            pieces.push((g, off, len));
            off += len;
            if buf.len() == cap {
                flush(&mut buf, &mut pieces, grads)?;
            }
        }
    }
    flush(&mut buf, &mut pieces, grads)
}

/// [`mean`] in CUDA device memory: the buffers (`f32` words on `dev`) grouped in order into
/// buckets of at least `bucket` elements (a buffer is never split: NCCL chunks it itself), each
/// bucket summed across the ranks in place by the engine
/// ([`Collective::all_reduce_sum_device`]: one NCCL group), then every buffer divided by the
/// rank count on the device (replaced by the quotient; the same `x / n` as [`mean`]'s, so the
/// ranks' values are those of the host path). No host copy is made.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub(crate) fn mean_on_device(
    comm: &dyn Collective,
    bucket: usize,
    dev: &mut tl_tape_cuda::CudaDevice,
    grads: &mut [tl_tape_cuda::Buffer],
) -> Result<()> {
    let mut start = 0;
    while start < grads.len() {
        let mut end = start;
        let mut elems = 0;
        while end < grads.len() && (end == start || elems < bucket) {
            elems += grads[end].len();
            end += 1;
        }
        comm.all_reduce_sum_device(dev, &grads[start..end])?;
        start = end;
    }
    Ok(divide_on_device(dev, grads, comm.size())?)
}

/// Each of `grads` (`f32` words on `dev`) replaced by its quotient by `n` (the old buffer
/// released): the host's `x / n` in f32, bit for bit. The mean over the ranks, and over the
/// micro-batches of gradient accumulation (`Runtime::step_accumulated`).
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub(crate) fn divide_on_device(
    dev: &mut tl_tape_cuda::CudaDevice,
    grads: &mut [tl_tape_cuda::Buffer],
    n: usize,
) -> tl_tape_cuda::Result<()> {
    use tl_tape_cuda::Device;
    let n = n as f32;
    for g in grads.iter_mut() {
        let d = dev.full(g.len(), n)?;
        let q = dev.div(*g, d);
        dev.release(d);
        dev.release(std::mem::replace(g, q?));
    }
    Ok(())
}

/// Every rank's gradient layout equal to rank 0's, else an error naming the first rank that
/// differs and both layouts.
pub(crate) fn check_layout(all: &[super::status::Status]) -> Result<()> {
    let first = &all[0].layout;
    for (rank, s) in all.iter().enumerate().skip(1) {
        if s.layout != *first {
            return Err(usage(
                WHAT,
                format!(
                    "the ranks' gradients differ at step {}: rank 0 has {} buffer(s) of {:?} elements, rank {rank} has {} of {:?} (every rank must run the same model on the same shapes, step for step)",
                    s.step,
                    first.len(),
                    first,
                    s.layout.len(),
                    s.layout
                ),
            ));
        }
    }
    Ok(())
}

/// `buf` summed over the ranks, through the engine's call for `T`.
fn all_reduce_sum<T: Scalar>(comm: &dyn Collective, buf: &mut [T]) -> Result<()> {
    match T::typed_mut(buf) {
        TypedMut::F32(b) => comm.all_reduce_sum_f32(b),
        TypedMut::F64(b) => comm.all_reduce_sum_f64(b),
        TypedMut::Other => Err(unsupported::<T>()),
    }
}

/// `buf` replaced by rank 0's.
pub(crate) fn broadcast<T: Scalar>(comm: &dyn Collective, buf: &mut [T]) -> Result<()> {
    match T::typed_mut(buf) {
        TypedMut::F32(b) => comm.broadcast_f32(b),
        TypedMut::F64(b) => comm.broadcast_f64(b),
        TypedMut::Other => Err(unsupported::<T>()),
    }
}

fn unsupported<T: Scalar>() -> crate::Error {
    usage(
        WHAT,
        format!("the engines reduce f32 and f64 buffers, not {}", T::NAME),
    )
}
