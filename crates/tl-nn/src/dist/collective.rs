//! [`Collective`]: the communication a data-parallel loop needs, and [`Local`], the engine of
//! one process.

use crate::Result;

/// A communication engine for data-parallel training: this process's rank among `size`
/// processes and the collective calls, which every rank makes in the same order. Every call
/// returns the same result on every rank (a sum is computed once and shared, so the ranks
/// stay bit for bit identical). Implemented by [`Local`] and, with the `mpi` feature,
/// `tl_nn::dist::Mpi`; a test wraps one to plant a fault.
pub trait Collective {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;

    /// The number of processes.
    fn size(&self) -> usize;

    /// Replace `buf` by its element-wise sum over the ranks (each rank's `buf` has the same
    /// length).
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;

    /// [`Collective::all_reduce_sum_f32`] for `f64`.
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;

    /// Replace `buf` by rank 0's (same length on every rank).
    fn broadcast_f32(&self, buf: &mut [f32]) -> Result<()>;

    /// [`Collective::broadcast_f32`] for `f64`.
    fn broadcast_f64(&self, buf: &mut [f64]) -> Result<()>;

    /// Every rank's `mine`, by rank (lengths may differ). A rank that does not answer within
    /// the engine's timeout is an error naming it: this is the call each step starts with, so
    /// a lost rank stops the others instead of hanging them.
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Wait until every rank has called it (an error naming a rank that does not arrive).
    fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(&[]).map(|_| ())
    }

    /// Whether this engine sums buffers in CUDA device memory
    /// ([`Collective::all_reduce_sum_device`]; features `cuda`, `cuda-emu`): then a session on
    /// the CUDA device hands a data-parallel step's gradients over where they are, with no
    /// host copy. `false` (the default) for host engines ([`Local`], `Mpi`).
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn reduces_on_device(&self) -> bool {
        false
    }

    /// Replace every buffer of `bufs` (`f32` words on `dev`, the same lengths in the same
    /// order on every rank) by its element-wise sum over the ranks, in place, on the device.
    /// Only for an engine whose [`Collective::reduces_on_device`] is `true`; the default is an
    /// error saying the engine reduces host buffers.
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn all_reduce_sum_device(
        &self,
        dev: &mut tl_tape_cuda::CudaDevice,
        bufs: &[tl_tape_cuda::Buffer],
    ) -> Result<()> {
        let _ = (dev, bufs);
        Err(crate::error::usage(
            "Collective::all_reduce_sum_device",
            "this engine sums host buffers only (reduces_on_device is false)",
        ))
    }
}

/// The engine of a single process: rank 0 of 1, every collective the identity. A runtime in a
/// group of one steps bit for bit as one without a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Local;

impl Collective for Local {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn broadcast_f32(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
}
