//! The eager [`Session`] (seed 000): ops run immediately on a CPU tape or a CUDA tape; the
//! session keeps the tape, the Nat environment, the parameters and the leaf → parameter map.

mod grad;

use std::collections::HashMap;

use tl_ir::Op;
use tl_spec::{Scalar, Tensor};
use tl_tape_cpu::Tape;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, MemoryUsage, SimDevice};

use crate::handle::{NatEnv, Stamp, next_session_id};
use crate::params::ParamStore;
use crate::{Error, NatRef, NatVecRef, Ops, Param, Result, TensorRef};

/// Which tape an eager session runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The CPU tape (`tl_tape_cpu::Tape<T>`).
    #[default]
    Cpu,
    /// The CUDA tape on the simulation device (host f32, the kernels' twins).
    CudaSim,
    /// The CUDA tape on a real GPU (feature `cuda`; not available yet).
    Cuda,
}

impl Backend {
    /// The backend's name (`"cpu"`, `"cuda-sim"`, `"cuda"`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::CudaSim => "cuda-sim",
            Backend::Cuda => "cuda",
        }
    }
}

/// Session options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// The tape to run on.
    pub backend: Backend,
    /// Deterministic reductions on the device (the simulation device always is).
    pub deterministic: bool,
    /// Seed for random ops.
    pub seed: u64,
}

impl Options {
    /// Options for `backend`, other fields default.
    pub fn backend(backend: Backend) -> Self {
        Options {
            backend,
            ..Options::default()
        }
    }
}

/// The tape behind a session.
pub(crate) enum Engine<T: Scalar> {
    Cpu(Tape<T>),
    Sim(CudaTape<SimDevice>),
}

/// Gradients of the last backward, by tape id.
pub(crate) enum Grads<T: Scalar> {
    Cpu(Vec<Tensor<T>>),
    Sim(Vec<AnyBuffer>),
}

/// An eager session: every op runs as it is called. PyTorch comparison: ordinary eager PyTorch
/// with autograd (`torch.Tensor` handles are [`TensorRef`]s, `nn.Parameter`s are [`Param`]s).
pub struct Session<T: Scalar = f32> {
    opts: Options,
    stamp: Stamp,
    pub(crate) engine: Engine<T>,
    pub(crate) params: ParamStore<T>,
    /// Tape leaf id → parameter index (for the optimizer and `grad(&Param)`).
    pub(crate) leaf_param: HashMap<usize, usize>,
    nats: NatEnv,
    pub(crate) grads: Option<Grads<T>>,
}

impl<T: Scalar> Session<T> {
    /// A fresh session. `Backend::Cuda` is an error naming what is missing.
    pub fn new(opts: Options) -> Result<Self> {
        let engine = match opts.backend {
            Backend::Cpu => Engine::Cpu(Tape::new()),
            Backend::CudaSim => Engine::Sim(CudaTape::new(SimDevice::new())),
            Backend::Cuda => return Err(cuda_unavailable()),
        };
        let session = next_session_id();
        Ok(Session {
            opts,
            stamp: Stamp { session, epoch: 0 },
            engine,
            params: ParamStore::new(session),
            leaf_param: HashMap::new(),
            nats: NatEnv::default(),
            grads: None,
        })
    }

    /// The options the session was made with.
    pub fn options(&self) -> Options {
        self.opts
    }

    /// This session's id and current epoch (number of resets).
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    /// The device's allocator counters (CUDA backends only).
    pub fn memory_usage(&self) -> Option<MemoryUsage> {
        match &self.engine {
            Engine::Cpu(_) => None,
            Engine::Sim(t) => Some(t.device().memory_usage()),
        }
    }

    pub(crate) fn check(&self, what: &'static str, r: &TensorRef) -> Result<()> {
        r.stamp.check(what, self.stamp)
    }

    fn handle(&self, id: usize, shape: tl_spec::Shape) -> TensorRef {
        TensorRef {
            stamp: self.stamp,
            id,
            shape,
        }
    }

    fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, rg: bool) -> Result<TensorRef> {
        let shape = value.shape().clone();
        let id = match &mut self.engine {
            Engine::Cpu(t) => t.leaf(value, name, rg),
            Engine::Sim(t) => t.upload_leaf(&value, name, rg)?,
        };
        Ok(self.handle(id, shape))
    }

    /// Record `x`'s value as a new leaf that does not require grad. PyTorch: `x.detach()` as a
    /// leaf (the `detach` op method records an identity node instead).
    pub fn detach_leaf(&mut self, x: &TensorRef) -> Result<TensorRef> {
        let v = self.value(x)?;
        self.leaf(v, None, false)
    }

    /// Overwrite a parameter's host value; the device mirror is invalidated.
    pub fn set_param(&mut self, p: &Param, value: Tensor<T>) -> Result<()> {
        self.params.write(p, value)
    }

    /// A parameter's current value (synced back from the device explicitly if a device step
    /// made the host copy stale).
    pub fn param_value(&mut self, p: &Param) -> Result<Tensor<T>> {
        match &self.engine {
            Engine::Cpu(_) => self.params.read::<SimDevice>(p, None),
            Engine::Sim(t) => self.params.read(p, Some(t.device())),
        }
    }

    /// The parameter's name, if it has one.
    pub fn param_name(&self, p: &Param) -> Result<Option<String>> {
        Ok(self.params.slot("param_name", p)?.name.clone())
    }

    // ---- Nat environment ------------------------------------------------------------------

    fn push_nats(&mut self) {
        let v = self.nats.values.clone();
        match &mut self.engine {
            Engine::Cpu(t) => t.set_nats(v),
            Engine::Sim(t) => t.set_nats(v),
        }
    }

    /// Record a non-differentiable Nat input (a label, an index).
    pub fn record_nat(&mut self, v: usize) -> NatRef {
        let r = self.nats.record(self.stamp, v);
        self.push_nats();
        r
    }

    /// Read a recorded Nat input.
    pub fn read_nat(&self, r: NatRef) -> Result<usize> {
        self.nats.read(r, self.stamp)
    }

    /// Overwrite a recorded Nat input (ops already recorded keep the value they read).
    pub fn write_nat(&mut self, r: NatRef, v: usize) -> Result<()> {
        self.nats.write(r, v, self.stamp)?;
        self.push_nats();
        Ok(())
    }

    /// Record a block of Nat inputs (gather indices, labels).
    pub fn record_nat_vec(&mut self, vs: &[usize]) -> NatVecRef {
        let r = self.nats.record_vec(self.stamp, vs);
        self.push_nats();
        r
    }

    /// Read a recorded block of Nat inputs.
    pub fn read_nat_vec(&self, r: NatVecRef) -> Result<Vec<usize>> {
        self.nats.read_vec(r, self.stamp)
    }

    /// Overwrite a recorded block; `vs` must have the block's length.
    pub fn write_nat_vec(&mut self, r: NatVecRef, vs: &[usize]) -> Result<()> {
        self.nats.write_vec(r, vs, self.stamp)?;
        self.push_nats();
        Ok(())
    }

    /// Start a fresh tape: every `TensorRef`, `NatRef` and gradient of the old one becomes
    /// invalid (a clear error if used). On CUDA, releases the tape's buffers, the gradients and
    /// retired parameter mirrors; live parameter mirrors stay resident.
    pub fn reset(&mut self) {
        self.release_grads();
        match &mut self.engine {
            Engine::Cpu(t) => t.clear(),
            Engine::Sim(t) => {
                t.reset();
                self.params.release_retired(t.device_mut());
            }
        }
        self.leaf_param.clear();
        self.nats = NatEnv::default();
        self.stamp.epoch += 1;
    }
}

pub(crate) fn cuda_unavailable() -> Error {
    #[cfg(not(feature = "cuda"))]
    let detail = "tl-session was built without the `cuda` feature (rebuild with `--features cuda`; until then use Backend::CudaSim)";
    // TODO(issue 4): construct the real device once tl-tape-cuda's `device::cuda` module has it.
    #[cfg(feature = "cuda")]
    let detail = "the real CUDA device of tl-tape-cuda (`device::cuda`) is not written yet; use Backend::CudaSim";
    Error::BackendUnavailable {
        backend: "cuda",
        detail: detail.into(),
    }
}

impl<T: Scalar> Ops for Session<T> {
    type T = T;

    fn apply(&mut self, op: Op, args: &[&TensorRef]) -> Result<TensorRef> {
        let mut ids = Vec::with_capacity(args.len());
        for a in args {
            self.check(op.name(), a)?;
            ids.push(a.id);
        }
        let id = match &mut self.engine {
            Engine::Cpu(t) => t.apply(&op, &ids)?,
            Engine::Sim(t) => t.apply(&op, &ids)?,
        };
        let shape = match &self.engine {
            Engine::Cpu(t) => t.get(id)?.shape().clone(),
            Engine::Sim(t) => t.get(id)?.shape().clone(),
        };
        Ok(self.handle(id, shape))
    }

    fn param(&mut self, init: Tensor<T>, name: Option<&str>, rg: bool) -> Result<Param> {
        Ok(self.params.create(init, name, rg))
    }

    fn use_param(&mut self, p: &Param) -> Result<TensorRef> {
        let slot = self.params.slot("use_param", p)?;
        let (name, rg) = (slot.name.clone(), slot.requires_grad);
        let id = match &mut self.engine {
            Engine::Cpu(t) => {
                let v = self.params.slots[p.index].host.clone();
                t.leaf(v, name.as_deref(), rg)
            }
            Engine::Sim(t) => {
                let m = self.params.mirror(p.index, t.device_mut())?;
                t.leaf_borrowed(m, name.as_deref(), rg)
            }
        };
        self.leaf_param.insert(id, p.index);
        Ok(self.handle(id, self.params.shape(p.index).clone()))
    }

    fn input(&mut self, value: Tensor<T>, requires_grad: bool) -> Result<TensorRef> {
        self.leaf(value, None, requires_grad)
    }

    fn constant(&mut self, value: Tensor<T>) -> Result<TensorRef> {
        self.leaf(value, None, false)
    }

    fn value(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.check("value", r)?;
        Ok(match &self.engine {
            Engine::Cpu(t) => t.value(r.id, &r.shape)?.clone(),
            Engine::Sim(t) => t.value(r.id, &r.shape)?.download(t.device())?,
        })
    }
}
