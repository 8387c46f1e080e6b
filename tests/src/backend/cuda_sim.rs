//! The CUDA tape over the simulation device ([`tl_tape_cuda::CudaTape`]`<`[`SimDevice`]`>`) as a
//! harness backend: f32 device buffers, leaves uploaded from the f32-rounded values the checks
//! hand every f32 backend, values and gradients downloaded back to host tensors.
//!
//! **Pending ops.** An op that exists in the catalogue but has no CUDA formula yet makes the
//! tape return [`tl_tape_cuda::Error::Unsupported`]. The inherent methods of [`CudaSim`] return
//! it as [`SimError::Pending`]; the [`Backend`] methods turn it into a failure message *and*
//! remember the op, which [`CudaSim::take_pending`] hands to the sim checks so that they report
//! the cell as "pending (CUDA formula missing)" rather than as a failure or a pass.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use tl_ir::{GraphData, Id};
use tl_spec::Tensor;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};

use crate::Backend;
use crate::report::PENDING;

/// What a sim call can fail with: an op whose CUDA formula is missing, or anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// The op (by `Op::name`) has no CUDA formula yet (`tl_tape_cuda::Error::Unsupported`).
    Pending(&'static str),
    /// Any other failure, as a message.
    Failed(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Pending(op) => write!(f, "{PENDING}: {op}"),
            SimError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl SimError {
    /// Classify a CUDA tape error from the call `what`: `Unsupported` is pending, anything else
    /// a failure naming `what`.
    pub fn from_tape(what: &str, e: tl_tape_cuda::Error) -> Self {
        match e {
            tl_tape_cuda::Error::Unsupported { op } => SimError::Pending(op),
            e => SimError::Failed(format!("{what}: {e}")),
        }
    }
}

/// The CUDA tape on the simulation device (always built; the twin of the deterministic kernels).
#[derive(Debug, Default)]
pub struct CudaSim {
    pending: Cell<Option<&'static str>>,
}

impl CudaSim {
    /// The sim backend.
    pub fn new() -> Self {
        CudaSim::default()
    }

    /// The op that made the last failing [`Backend`] call fail as pending, if any (and forget
    /// it). The sim checks call this after a case fails.
    pub fn take_pending(&self) -> Option<&'static str> {
        self.pending.take()
    }

    /// A sim result as a [`Backend`] result: the error becomes its message, and a pending op is
    /// remembered for [`take_pending`](Self::take_pending). For wrappers (tests) that build
    /// their own [`SimProgram`].
    pub fn note<T>(&self, r: Result<T, SimError>) -> Result<T, String> {
        r.map_err(|e| {
            if let SimError::Pending(op) = e {
                self.pending.set(Some(op));
            }
            e.to_string()
        })
    }

    /// Record `graph` into a fresh sim tape through `GraphData::replay`.
    pub fn try_record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<SimProgram, SimError> {
        SimProgram::replay(CudaTape::new(SimDevice::new()), graph, leaves, nats)
    }
}

/// A recorded CUDA tape on device `D` and, for each graph id, the id it received on the tape.
#[derive(Debug)]
pub struct CudaProgram<D: Device> {
    /// The tape (its backward calls take `&mut`; the [`Backend`] trait hands out `&`).
    pub tape: RefCell<CudaTape<D>>,
    /// Graph id → tape id.
    pub map: Vec<usize>,
}

/// A recorded sim tape (the [`CudaSim`] backend's program).
pub type SimProgram = CudaProgram<SimDevice>;

impl<D: Device> CudaProgram<D> {
    /// Record `graph` into `tape` (which may be reused after a `reset`: its allocator then hands
    /// out cached blocks holding stale data).
    pub fn replay(
        mut tape: CudaTape<D>,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<Self, SimError> {
        let map = graph
            .replay(&mut tape, leaves, nats)
            .map_err(|e| SimError::from_tape("replay into the CUDA tape failed", e))?;
        Ok(CudaProgram {
            tape: RefCell::new(tape),
            map,
        })
    }

    /// Give the tape back, reset (every buffer it owns released to the allocator's cache).
    pub fn into_tape(self) -> CudaTape<D> {
        let mut tape = self.tape.into_inner();
        tape.reset();
        tape
    }

    fn tape_id(&self, id: Id) -> Result<usize, SimError> {
        self.map
            .get(id)
            .copied()
            .ok_or_else(|| SimError::Failed(format!("graph id {id} was not recorded")))
    }

    /// Every graph id's value, downloaded.
    pub fn values(&self) -> Result<Vec<Tensor<f32>>, SimError> {
        let tape = self.tape.borrow();
        self.map
            .iter()
            .map(|&t| tape.read(t).map_err(|e| SimError::from_tape("read", e)))
            .collect()
    }

    /// Upload a host tensor to the tape's device.
    fn upload(&self, t: &Tensor<f32>) -> Result<AnyBuffer, SimError> {
        AnyBuffer::upload(self.tape.borrow_mut().device_mut(), t)
            .map_err(|e| SimError::from_tape("upload", e))
    }

    /// Download tape-indexed gradients for every graph id, then release them all.
    fn download_grads(&self, grads: Vec<AnyBuffer>) -> Result<Vec<Tensor<f32>>, SimError> {
        let mut tape = self.tape.borrow_mut();
        let out = self
            .map
            .iter()
            .map(|&t| match grads.get(t) {
                Some(g) => g
                    .download(tape.device())
                    .map_err(|e| SimError::from_tape("download", e)),
                None => Err(SimError::Failed(format!(
                    "tape returned no gradient for tape id {t}"
                ))),
            })
            .collect();
        tape.release_grads(grads);
        out
    }

    /// Dense backward on the tape (`CudaTape::backward_dense`), re-indexed by graph id.
    pub fn backward_dense(
        &self,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, SimError> {
        let tape_out = self.tape_id(out)?;
        let seed = self.upload(seed)?;
        let r = self.tape.borrow_mut().backward_dense(tape_out, &seed);
        seed.release(self.tape.borrow_mut().device_mut());
        let grads = r.map_err(|e| SimError::from_tape("tape backward_dense failed", e))?;
        self.download_grads(grads)
    }

    /// `CudaTape::backward_first_n` from a graph-indexed gradient array (`n` counts tape nodes);
    /// `backward_dense_from` is `n = tape length`.
    pub fn backward_first_n(
        &self,
        n: usize,
        grads0: &[Tensor<f32>],
    ) -> Result<Vec<Tensor<f32>>, SimError> {
        let len = self.tape.borrow().len();
        if grads0.len() != self.map.len() || len != self.map.len() {
            return Err(SimError::Failed(format!(
                "backward_first_n: {} gradients for {} graph ids on a tape of {len} nodes",
                grads0.len(),
                self.map.len()
            )));
        }
        let mut by_tape: Vec<Option<AnyBuffer>> = vec![None; len];
        for (&t, g) in self.map.iter().zip(grads0) {
            by_tape[t] = Some(self.upload(g)?);
        }
        let bufs: Vec<AnyBuffer> = by_tape.into_iter().flatten().collect();
        let mut tape = self.tape.borrow_mut();
        let r = if n == len {
            tape.backward_dense_from(bufs)
        } else {
            tape.backward_first_n(n, bufs)
        };
        drop(tape);
        let grads = r.map_err(|e| SimError::from_tape("tape backward_first_n failed", e))?;
        self.download_grads(grads)
    }

    /// `CudaTape::backward_params` for graph ids `wanted`, downloaded (keys are graph ids).
    pub fn backward_params(
        &self,
        out: Id,
        seed: &Tensor<f32>,
        wanted: &[Id],
    ) -> Result<HashMap<Id, Tensor<f32>>, SimError> {
        let tape_out = self.tape_id(out)?;
        let tape_wanted = wanted
            .iter()
            .map(|&w| self.tape_id(w))
            .collect::<Result<Vec<_>, _>>()?;
        let seed = self.upload(seed)?;
        let r = self
            .tape
            .borrow_mut()
            .backward_params(tape_out, &seed, &tape_wanted);
        let mut tape = self.tape.borrow_mut();
        seed.release(tape.device_mut());
        let map = r.map_err(|e| SimError::from_tape("tape backward_params failed", e))?;
        let out = wanted
            .iter()
            .zip(&tape_wanted)
            .map(|(&w, t)| match map.get(t) {
                Some(g) => g
                    .download(tape.device())
                    .map(|g| (w, g))
                    .map_err(|e| SimError::from_tape("download", e)),
                None => Err(SimError::Failed(format!(
                    "backward_params returned no gradient for id {w}"
                ))),
            })
            .collect();
        tape.release_grad_map(map);
        out
    }
}

impl Backend for CudaSim {
    type T = f32;
    type Program = SimProgram;

    fn name(&self) -> String {
        "cuda-sim".to_owned()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<SimProgram, String> {
        self.note(self.try_record(graph, leaves, nats))
    }

    fn values(&self, program: &SimProgram) -> Result<Vec<Tensor<f32>>, String> {
        self.note(program.values())
    }

    fn backward_dense(
        &self,
        program: &SimProgram,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.note(program.backward_dense(out, seed))
    }
}
