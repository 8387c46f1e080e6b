//! [`Mpi`]: the [`Collective`] engine over MPI (Open MPI or any MPI-3 library, through the `mpi`
//! crate; feature `mpi`). Start the program with `mpirun -np N program …`.

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::point_to_point::{Destination, Source};
use mpi::request::{CancelGuard, scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::{Count, Tag};

use super::Collective;
use crate::Result;
use crate::error::usage;

/// The bytes of one all-gather record (a length and the first part of the payload). Small
/// enough for MPI's eager protocol, so a send to a rank that hangs completes anyway.
const RECORD: usize = 1024;

/// The all-gather calls whose records may be in flight at once (a rank that runs ahead by a
/// few calls, e.g. a step's status and layout records).
const BUFFERED_CALLS: usize = 16;

/// More than MPI's per-message bookkeeping in the buffered-send buffer (`MPI_BSEND_OVERHEAD`,
/// 128 bytes or less in Open MPI and MPICH).
const BSEND_OVERHEAD: usize = 512;

/// The MPI engine: this process's rank in `MPI_COMM_WORLD`. Sums are reduced to rank 0 and
/// broadcast from there, so every rank gets the same bits whatever the library's algorithm.
/// The per-step all-gather ([`Collective::all_gather_bytes`]) is point to point with a
/// timeout, so a rank that does not answer is an error naming it. A rank that dies inside a
/// sum is the library's to detect (Open MPI ends the job).
///
/// After a rank was lost, dropping the engine does not call `MPI_Finalize` (which would wait
/// for that rank): the process exits with its error and `mpirun` ends the job. [`Mpi::abort`]
/// ends every rank at once.
pub struct Mpi {
    /// Finalizes MPI when dropped, unless a rank was lost ([`Drop`] below).
    universe: Option<mpi::environment::Universe>,
    /// Whether a rank did not answer: `MPI_Finalize` would wait for it forever.
    lost: Cell<bool>,
    world: SimpleCommunicator,
    timeout: Duration,
    calls: Cell<u64>,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Mpi {
    /// Initialise MPI (once per process) with the timeout of `TL_DIST_TIMEOUT` (seconds) or
    /// [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT). Run outside `mpirun`, this is rank 0 of 1.
    /// An error when MPI is initialised already or the variable is not a positive number of
    /// seconds.
    pub fn init() -> Result<Mpi> {
        const WHAT: &str = "Mpi::init";
        let timeout = super::timeout::from_env(WHAT)?;
        let mut universe = mpi::initialize().ok_or_else(|| {
            usage(
                WHAT,
                "MPI is initialised already in this process (one Mpi per process)",
            )
        })?;
        let world = universe.world();
        // The all-gather's records go out as buffered sends, which never wait for a receiver
        // (a send to a rank that hangs cannot be cancelled): room for a few calls' records.
        let records = BUFFERED_CALLS.saturating_mul(world.size().max(1) as usize);
        universe.set_buffer_size(records.saturating_mul(RECORD + BSEND_OVERHEAD));
        Ok(Mpi {
            universe: Some(universe),
            lost: Cell::new(false),
            world,
            timeout,
            calls: Cell::new(0),
        })
    }

    /// The same engine with another timeout for the per-step all-gather.
    pub fn with_timeout(mut self, timeout: Duration) -> Mpi {
        self.timeout = timeout;
        self
    }

    /// The timeout of the per-step all-gather.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// End every rank of the job with exit code `code` (`MPI_Abort`): the way out after an
    /// error, when another rank may be waiting or hung.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    fn sum<T: mpi::datatype::Equivalence + Copy + 'static>(&self, buf: &mut [T]) -> Result<()> {
        let root = self.world.process_at_rank(0);
        if self.world.rank() == 0 {
            let mut send =
                tl_spec::alloc::try_with_capacity("Mpi::all_reduce_sum", "send copy", buf.len())?;
            send.extend_from_slice(buf);
            root.reduce_into_root(&send[..], buf, SystemOperation::sum());
        } else {
            root.reduce_into(&buf[..], SystemOperation::sum());
        }
        root.broadcast_into(buf);
        Ok(())
    }
}

impl Drop for Mpi {
    /// `MPI_Finalize`, which waits for every rank; after a rank was lost, nothing (the process
    /// ends without it, and `mpirun` ends the job).
    fn drop(&mut self) {
        if let Some(u) = self.universe.take()
            && self.lost.get()
        {
            std::mem::forget(u);
        }
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.sum(buf)
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.sum(buf)
    }

    fn broadcast_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.world.process_at_rank(0).broadcast_into(buf);
        Ok(())
    }

    fn broadcast_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.world.process_at_rank(0).broadcast_into(buf);
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        const WHAT: &str = "Mpi::all_gather_bytes";
        let (me, size) = (self.rank(), self.size());
        let call = self.calls.get();
        self.calls.set(call + 1);
        // Every rank counts its calls alike: the tag keeps one call's records from another's.
        let tag = (call % (1 << 20)) as Tag;
        let mut send = vec![0u8; RECORD];
        send[..8].copy_from_slice(&(mine.len() as u64).to_le_bytes());
        let head = mine.len().min(RECORD - 8);
        send[8..8 + head].copy_from_slice(&mine[..head]);
        let mut recv = vec![vec![0u8; RECORD]; size];
        let timeout = self.timeout;
        let world = &self.world;
        let missing: Vec<usize> = scope(|sc| {
            for r in (0..size).filter(|&r| r != me) {
                world
                    .process_at_rank(r as i32)
                    .buffered_send_with_tag(&send[..], tag);
            }
            let mut recvs: Vec<_> = recv
                .iter_mut()
                .enumerate()
                .filter(|(r, _)| *r != me)
                .map(|(r, b)| {
                    (
                        r,
                        Some(
                            world
                                .process_at_rank(r as i32)
                                .immediate_receive_into_with_tag(sc, &mut b[..], tag),
                        ),
                    )
                })
                .collect();
            let start = Instant::now();
            loop {
                for (_, slot) in recvs.iter_mut() {
                    if let Some(req) = slot.take() {
                        *slot = req.test().err();
                    }
                }
                let pending = recvs.iter().any(|(_, s)| s.is_some());
                let waited = start.elapsed();
                if !pending || waited >= timeout {
                    break;
                }
                if waited < Duration::from_millis(10) {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let missing = recvs
                .iter()
                .filter(|(_, s)| s.is_some())
                .map(|(r, _)| *r)
                .collect();
            // A receive still pending is cancelled (and completed) before the scope ends.
            for req in recvs.into_iter().filter_map(|(_, s)| s) {
                drop(CancelGuard::from(req));
            }
            missing
        });
        if !missing.is_empty() {
            self.lost.set(true);
            return Err(usage(
                WHAT,
                format!(
                    "rank(s) {missing:?} did not answer within {:.1} s (rank {me} of {size} waited at collective call #{call}): a rank that failed outside a step, hangs or died",
                    timeout.as_secs_f64()
                ),
            ));
        }
        let mut lens = vec![0usize; size];
        for (r, b) in recv.iter().enumerate() {
            lens[r] = if r == me {
                mine.len()
            } else {
                u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as usize
            };
        }
        if lens.iter().all(|&l| l <= RECORD - 8) {
            return Ok(recv
                .into_iter()
                .enumerate()
                .map(|(r, b)| {
                    if r == me {
                        mine.to_vec()
                    } else {
                        b[8..8 + lens[r]].to_vec()
                    }
                })
                .collect());
        }
        // A long record (the start-up parameter list): every rank is here and knows every
        // length, so the whole payloads go in one blocking all-gather.
        let total: usize = lens.iter().sum();
        let too_big =
            lens.iter().any(|&l| Count::try_from(l).is_err()) || Count::try_from(total).is_err();
        if too_big {
            return Err(usage(
                WHAT,
                format!("records of {lens:?} bytes exceed MPI's count"),
            ));
        }
        let counts: Vec<Count> = lens.iter().map(|&l| l as Count).collect();
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect();
        let mut all = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(mine, &mut part);
        }
        Ok(displs
            .iter()
            .zip(&lens)
            .map(|(&d, &l)| all[d as usize..d as usize + l].to_vec())
            .collect())
    }
}
