//! [`Nccl`]: the [`Collective`] engine over NCCL for CUDA runs (features `cuda`, `cuda-emu`),
//! with a bootstrap engine (normally `Mpi`, feature `mpi`) for the rendezvous and the control
//! messages.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use tl_tape_cuda::nccl::{self, Elem, NcclComm, UniqueId};
use tl_tape_cuda::{Buffer, CudaDevice, Device, Traffic};

use super::Collective;
use super::status::{Status, decode_all};
use crate::Result;
use crate::error::usage;

const WHAT: &str = "Nccl::init";

/// The NCCL engine: one communicator per process (one GPU each: GPU 0 of the process, so start
/// one process per GPU with `CUDA_VISIBLE_DEVICES` set per rank), ranks and size those of the
/// bootstrap engine it was made with.
///
/// - [`Collective::all_reduce_sum_device`]: the gradients of a session on the CUDA device
///   (`Backend::Cuda`), summed in device memory by `ncclAllReduce` in place, one
///   `ncclGroupStart`/`ncclGroupEnd` per bucket; the data-parallel step then divides them by
///   the rank count on the device. No host copy of a gradient is made.
/// - [`Collective::all_reduce_sum_f32`], `_f64` and the broadcasts (host slices: the
///   parameters' broadcast at the start, and the gradients of a session on the CPU or the
///   simulation device) go through NCCL on this engine's own device: the host slice is
///   uploaded, reduced (or broadcast from rank 0) by `ncclAllReduce` (`ncclBroadcast`), and
///   downloaded. NCCL's all-reduce computes each element's sum once and sends it to every
///   rank, so the ranks stay bit for bit equal.
/// - [`Collective::all_gather_bytes`] and [`Collective::barrier`] (the per-step status records,
///   with their timeout, and the start-up checks) go to the bootstrap engine.
/// - Every NCCL collective has a timeout (`TL_DIST_TIMEOUT` seconds, default
///   [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT); [`Nccl::with_timeout`]): one that has not
///   finished by then (a rank that does not take part) or that NCCL reports failed aborts the
///   communicator (`ncclCommAbort`), and the ranks still there meet in the bootstrap's
///   exchange, whose own timeout names the rank that does not come; the error says which.
///   Every later collective of the engine is an error.
///
/// `f64` buffers travel as their bits (two `f32` words per value, `ncclFloat64`).
pub struct Nccl {
    bootstrap: Box<dyn Collective>,
    inner: RefCell<Inner>,
}

struct Inner {
    /// Declared before `dev`: the communicator is destroyed before the device goes.
    comm: NcclComm,
    dev: CudaDevice,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.bootstrap.rank())
            .field("size", &self.bootstrap.size())
            .field("library", &self.library())
            .finish()
    }
}

impl Nccl {
    /// Load NCCL (`TL_NCCL_LIBRARY`, else `libnccl.so.2`; see [`tl_tape_cuda::nccl::Nccl::load`]),
    /// open the CUDA device and join the communicator of every rank of `bootstrap`: rank 0
    /// makes NCCL's unique id and sends it to the others through `bootstrap` (an all-gather).
    /// Call it on every rank at the same point. Every rank first tells the others whether it
    /// could load NCCL and open its device, so a rank without them is an error on every rank
    /// (naming it) instead of a wait inside NCCL. PyTorch:
    /// `dist.init_process_group("nccl")`.
    pub fn init(bootstrap: Box<dyn Collective>) -> Result<Nccl> {
        Self::start(None, bootstrap)
    }

    /// [`Nccl::init`] with the NCCL library at `library` (a path, or a name the loader
    /// searches for) instead of the variable's.
    pub fn init_with_library(
        library: impl AsRef<OsStr>,
        bootstrap: Box<dyn Collective>,
    ) -> Result<Nccl> {
        Self::start(Some(library.as_ref()), bootstrap)
    }

    fn start(library: Option<&OsStr>, bootstrap: Box<dyn Collective>) -> Result<Nccl> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        let timeout = super::timeout::from_env(WHAT)?;
        let opened = (|| -> Result<(Arc<nccl::Nccl>, CudaDevice)> {
            let lib = match library {
                Some(p) => nccl::Nccl::open(p)?,
                None => nccl::Nccl::load()?,
            };
            Ok((lib, CudaDevice::new()?))
        })();
        // Every rank's outcome before any rank waits in ncclCommInitRank.
        let record = Status::of(0, &opened, &[], "").encode();
        let statuses = decode_all(WHAT, &bootstrap.all_gather_bytes(&record)?)?;
        let (lib, dev) = opened?;
        if let Some(bad) = statuses.iter().position(|s| !s.ok) {
            return Err(usage(
                WHAT,
                format!(
                    "rank {bad} could not start NCCL (rank {rank} of {size} stops with it): {}",
                    statuses[bad].message
                ),
            ));
        }
        // Rank 0's unique id to every rank.
        let id = if rank == 0 {
            lib.unique_id().map(|id| id.as_bytes().to_vec())
        } else {
            Ok(Vec::new())
        };
        let mine = match &id {
            Ok(bytes) => [&[1u8][..], bytes].concat(),
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = bootstrap.all_gather_bytes(&mine)?;
        id?;
        let first = all.first().map(Vec::as_slice).unwrap_or_default();
        let id = match first.split_first() {
            Some((1, bytes)) => UniqueId::from_bytes(bytes)?,
            Some((_, message)) => {
                return Err(usage(
                    WHAT,
                    format!(
                        "rank 0 could not make NCCL's unique id: {}",
                        String::from_utf8_lossy(message)
                    ),
                ));
            }
            None => return Err(usage(WHAT, "rank 0 sent no unique id")),
        };
        let mut comm = NcclComm::init(&lib, &id, rank, size)?;
        comm.set_timeout(timeout);
        Ok(Nccl {
            bootstrap,
            inner: RefCell::new(Inner { comm, dev }),
        })
    }

    /// The NCCL library in use (what was loaded), and its version.
    pub fn library(&self) -> String {
        let inner = self.inner.borrow();
        let lib = inner.comm.library();
        match lib.version() {
            Ok(v) => format!("NCCL {v} ({})", lib.path()),
            Err(_) => lib.path().to_owned(),
        }
    }

    /// The same engine with another timeout for its NCCL collectives (see the type's docs).
    pub fn with_timeout(self, timeout: Duration) -> Nccl {
        self.inner.borrow_mut().comm.set_timeout(timeout);
        self
    }

    /// The timeout of the NCCL collectives.
    pub fn timeout(&self) -> Duration {
        self.inner.borrow().comm.timeout()
    }

    /// The error of a failed collective. When it aborted the communicator (a timeout, or a
    /// failure NCCL reported while it ran), the ranks still there meet in the bootstrap's
    /// exchange: a rank that does not come is named by the bootstrap's timeout.
    fn failed(&self, e: tl_tape_cuda::Error) -> crate::Error {
        if !self.inner.borrow().comm.is_aborted() {
            return e.into();
        }
        let who = match self.bootstrap.all_gather_bytes(&[]) {
            Err(lost) => format!("the ranks' exchange after it: {lost}"),
            Ok(_) => "every rank answered the exchange after it, so no rank is lost: NCCL \
                      itself stalled or failed (NCCL_DEBUG=INFO says more)"
                .to_owned(),
        };
        usage(
            "Nccl (collective)",
            format!(
                "rank {} of {}: {e}; {who}",
                self.bootstrap.rank(),
                self.bootstrap.size()
            ),
        )
    }

    /// The host↔device copies of this engine's collectives so far (its own device's counter).
    pub fn traffic(&self) -> Traffic {
        self.inner.borrow().dev.traffic()
    }

    /// `buf` uploaded, through `ncclAllReduce` (`root == None`) or `ncclBroadcast` from
    /// `root`, and downloaded into `buf` again.
    fn run(&self, words: &mut [f32], elem: Elem, root: Option<usize>) -> Result<()> {
        if words.is_empty() {
            return Ok(());
        }
        let mut inner = self.inner.borrow_mut();
        let Inner { comm, dev } = &mut *inner;
        let x = dev.upload(words)?;
        let out = match root {
            None => comm.all_reduce_sum(dev, x, elem),
            Some(r) => comm.broadcast(dev, x, r, elem),
        };
        dev.release(x);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                drop(inner);
                return Err(self.failed(e));
            }
        };
        let got = dev.download(out);
        dev.release(out);
        words.copy_from_slice(&got?);
        Ok(())
    }

    fn run_f64(&self, buf: &mut [f64], root: Option<usize>) -> Result<()> {
        let mut words: Vec<f32> = tl_spec::alloc::try_with_capacity(
            "Nccl (f64 collective)",
            "f64 words",
            buf.len().saturating_mul(2),
        )?;
        // Each value's bits as two words in memory order (the device reads them as one f64).
        for v in buf.iter() {
            let b = v.to_ne_bytes();
            words.push(f32::from_bits(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])));
            words.push(f32::from_bits(u32::from_ne_bytes([b[4], b[5], b[6], b[7]])));
        }
        self.run(&mut words, Elem::F64, root)?;
        for (v, w) in buf.iter_mut().zip(words.chunks_exact(2)) {
            let (lo, hi) = (w[0].to_bits().to_ne_bytes(), w[1].to_bits().to_ne_bytes());
            *v = f64::from_ne_bytes([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]);
        }
        Ok(())
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.bootstrap.rank()
    }
    fn size(&self) -> usize {
        self.bootstrap.size()
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.run(buf, Elem::F32, None)
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.run_f64(buf, None)
    }
    fn broadcast_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.run(buf, Elem::F32, Some(0))
    }
    fn broadcast_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.run_f64(buf, Some(0))
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.bootstrap.all_gather_bytes(mine)
    }
    fn barrier(&self) -> Result<()> {
        self.bootstrap.barrier()
    }
    fn reduces_on_device(&self) -> bool {
        true
    }
    fn all_reduce_sum_device(&self, dev: &mut CudaDevice, bufs: &[Buffer]) -> Result<()> {
        let out = self
            .inner
            .borrow_mut()
            .comm
            .all_reduce_sum_in_place(dev, bufs, Elem::F32);
        out.map_err(|e| self.failed(e))
    }
}
