//! The eager [`Session`]: ops run immediately on a CPU tape or a CUDA tape; the
//! session keeps the tape, the Nat environment, the parameters and the leaf → parameter map.

mod grad;

use std::collections::HashMap;

use tl_ir::Op;
use tl_spec::pool::PoolStats;
use tl_spec::{Scalar, Tensor};
use tl_tape_cpu::{Precision, Tape};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, FlashProducts, MemoryUsage, SimDevice};

use crate::handle::{NatEnv, Stamp, next_session_id};
use crate::liveness::Dropped;
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
    /// The CUDA tape on a real GPU (`tl_tape_cuda::CudaDevice`, feature `cuda`): an error at
    /// session construction without the feature or without a usable device.
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
    /// Deterministic reductions on the device: `true` puts this session's CUDA device on the
    /// fixed-order reduction kernels whatever the process-wide flag says, so two runs give the
    /// same bits; `false` follows the flag (`TL_DETERMINISTIC`,
    /// `tl_tape_cuda::determinism::set_deterministic_reductions`). The simulation device and
    /// the CPU are always deterministic. PyTorch: `torch.use_deterministic_algorithms(True)`.
    pub deterministic: bool,
    /// Seed for random ops.
    pub seed: u64,
    /// The arithmetic of the matrix products (matmul, bmm, linear, conv, attention, forward and
    /// backward): [`Precision::F32`] (the default, unchanged bit for bit) or
    /// [`Precision::Bf16`], bf16 autocast: operands rounded to bf16, f32 sums; parameters,
    /// optimizer state and every other op stay f32 (docs/semantics.md, "Mixed precision");
    /// [`Precision::Tf32`] likewise with TF32 operands. Every backend: the CUDA ones run the
    /// products on the tensor-core GEMM.
    /// Autocast needs an `f32` session (an error at construction otherwise). PyTorch:
    /// `torch.autocast(device, dtype=torch.bfloat16)` around the forward and backward;
    /// `torch.backends.cuda.matmul.allow_tf32 = True`.
    pub precision: Precision,
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

/// The tape behind a session: the CPU tape, or the CUDA tape over one of the devices. Code
/// for the CUDA tape is written once, generic over the device, and dispatched by
/// [`on_engine!`].
pub(crate) enum Engine<T: Scalar> {
    Cpu(Tape<T>),
    Sim(CudaTape<SimDevice>),
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    Gpu(CudaTape<tl_tape_cuda::CudaDevice>),
}

/// `match` an [`Engine`]: `cpu(t) => ..` for the CPU tape, `cuda(t) => ..` once for every
/// CUDA-tape variant (the body is generic over the device: the simulation device and, with
/// feature `cuda`, the real one).
macro_rules! on_engine {
    ($engine:expr, cpu($c:pat) => $cpu:expr, cuda($t:ident) => $dev:expr $(,)?) => {
        match $engine {
            $crate::eager::Engine::Cpu($c) => $cpu,
            $crate::eager::Engine::Sim($t) => $dev,
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            $crate::eager::Engine::Gpu($t) => $dev,
        }
    };
}
pub(crate) use on_engine;

/// Gradients of the last backward, by tape id.
pub(crate) enum Grads<T: Scalar> {
    Cpu(Vec<Tensor<T>>),
    /// The trainable parameters' leaves only (the training loop's step on the CPU: the tape's
    /// sparse backward, which recycles every other gradient as it goes).
    CpuParams(HashMap<usize, Tensor<T>>),
    Device(Vec<AnyBuffer>),
    /// The trainable parameters' leaves only (the training loop's step on a device: the
    /// tape's sparse backward, which releases every other gradient as it goes).
    DeviceParams(HashMap<usize, AnyBuffer>),
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
    /// Random ops drawn so far (the counter of the next one); survives `reset`.
    rng_counter: u64,
    /// Whether leaves recorded now may require grad ([`Ops::set_grad_enabled`]).
    grad_enabled: bool,
    /// Nodes whose last handle was dropped, released on the tape before the next op or read.
    dropped: Dropped,
    /// Scratch for the ids taken from `dropped` (kept to spare an allocation per op).
    releasing: Vec<usize>,
}

impl<T: Scalar> Session<T> {
    /// A fresh session. `Backend::Cuda` without the `cuda` feature or without a usable GPU is
    /// an error naming what is missing.
    pub fn new(opts: Options) -> Result<Self> {
        check_precision::<T>("Session::new", opts.precision)?;
        let engine = match opts.backend {
            Backend::Cpu => {
                let mut tape = Tape::new();
                tape.set_precision(opts.precision);
                Engine::Cpu(tape)
            }
            Backend::CudaSim => {
                let mut tape = CudaTape::new(SimDevice::new());
                tape.set_precision(opts.precision);
                Engine::Sim(tape)
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Backend::Cuda => {
                let mut tape = CudaTape::new(cuda_device(opts.deterministic)?);
                tape.set_precision(opts.precision);
                Engine::Gpu(tape)
            }
            #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
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
            rng_counter: 0,
            grad_enabled: true,
            dropped: Dropped::default(),
            releasing: Vec::new(),
        })
    }

    /// The options the session was made with.
    pub fn options(&self) -> Options {
        self.opts
    }

    /// How the core of fused attention nodes multiplies, forward and backward, on the CUDA
    /// backends (`Backend::Cuda`, `Backend::CudaSim`) from now on: [`FlashProducts::Fma`] (the
    /// default) or [`FlashProducts::Tf32x3`], the products on the tensor cores: in f32 as
    /// three TF32 products each, as PyTorch's f32 `scaled_dot_product_attention` on sm80+ (the
    /// same function within f32 tolerance, not the FMA kernels' bits), under autocast
    /// ([`Options::precision`]) the rounded operands' exact products; heads up to 64, the FMA
    /// kernels elsewhere (docs/semantics.md, the fused path's table). The CPU's fused
    /// attention has no such choice: the setting changes nothing there.
    pub fn set_flash_products(&mut self, products: FlashProducts) {
        on_engine!(&mut self.engine, cpu(_) => {}, cuda(t) => t.device_mut().set_flash_products(products));
    }

    /// This session's id and current epoch (number of resets).
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    /// The counter the next random op will use (the seed is `options().seed`).
    pub fn random_counter(&self) -> u64 {
        self.rng_counter
    }

    /// Set the random counter (e.g. to resume a run from a checkpoint).
    pub fn set_random_counter(&mut self, counter: u64) {
        self.rng_counter = counter;
    }

    /// The device's allocator counters (CUDA backends only).
    pub fn memory_usage(&self) -> Option<MemoryUsage> {
        on_engine!(&self.engine, cpu(_) => None, cuda(t) => Some(t.device().memory_usage()))
    }

    /// The CPU tape's buffer pool: buffers reused and missed, the bytes it holds now and the
    /// most it has held (after a [`reset`](Self::reset) it holds the last pass's buffers, which
    /// the next pass's kernels reuse); `None` on a CUDA backend
    /// ([`memory_usage`](Self::memory_usage) counts its device's buffers).
    pub fn pool_stats(&self) -> Option<PoolStats> {
        match &self.engine {
            Engine::Cpu(t) => Some(t.pool_stats()),
            _ => None,
        }
    }

    /// The device's kernel launches and host↔device copies so far (CUDA backends only):
    /// subtract two readings for a step's work.
    pub fn traffic(&self) -> Option<tl_tape_cuda::Traffic> {
        on_engine!(&self.engine, cpu(_) => None, cuda(t) => Some(t.device().traffic()))
    }

    /// [`Train::release_device_buffers`](crate::Train::release_device_buffers): each of
    /// `bufs` the device holds goes back to its pool.
    pub(crate) fn release_device_buffers(&mut self, bufs: &[tl_tape_cuda::Buffer]) {
        on_engine!(&mut self.engine, cpu(_) => {}, cuda(t) => {
            let dev = t.device_mut();
            for &b in bufs {
                tl_tape_cuda::Device::release(dev, b);
            }
        })
    }

    /// The buffers the device holds live, counted in the device's own table of buffers rather
    /// than by the allocator's counters (from which [`MemoryUsage::live_buffers`] is derived as
    /// `alloc_count − free_count`); `None` on the CPU backend. A leak test checks that the two
    /// agree.
    pub fn device_live_buffers(&self) -> Option<usize> {
        on_engine!(&self.engine, cpu(_) => None, cuda(t) => Some(t.device().live_buffers()))
    }

    /// Nodes on the tape now: the current pass's leaves and ops (0 right after a
    /// [`reset`](Self::reset)). On the CPU backend, which has no allocator to count, this and the
    /// optimizer's state are what a long run could grow.
    pub fn tape_len(&self) -> usize {
        on_engine!(&self.engine, cpu(t) => t.len(), cuda(t) => t.len())
    }

    pub(crate) fn check(&self, what: &'static str, r: &TensorRef) -> Result<()> {
        r.stamp.check(what, self.stamp)
    }

    fn handle(&self, id: usize, shape: tl_spec::Shape) -> TensorRef {
        TensorRef {
            stamp: self.stamp,
            id,
            shape,
            watch: None,
        }
    }

    /// Whether the node of `r` (checked to be of this pass by the caller) requires grad.
    pub(crate) fn requires_grad_of(&self, r: &TensorRef) -> bool {
        on_engine!(&self.engine,
            cpu(t) => t.node(r.id).is_some_and(|n| n.requires_grad()),
            cuda(t) => t.node(r.id).is_some_and(|n| n.requires_grad()),
        )
    }

    /// Hand the values of the nodes whose last handle was dropped back to the tape (it keeps
    /// what a backward may read): before an op runs, so its output can reuse them, and before
    /// a read.
    #[inline]
    fn release_dropped(&mut self) -> Result<()> {
        match self.dropped.is_empty() {
            true => Ok(()),
            false => self.release_dropped_now(),
        }
    }

    /// [`release_dropped`](Self::release_dropped) when some handle was dropped.
    #[cold]
    fn release_dropped_now(&mut self) -> Result<()> {
        let mut ids = std::mem::take(&mut self.releasing);
        self.dropped.take_into(self.stamp.epoch, &mut ids);
        let released = ids.drain(..).try_for_each(|id| -> Result<()> {
            on_engine!(&mut self.engine, cpu(t) => t.release(id)?, cuda(t) => t.release(id)?);
            Ok(())
        });
        self.releasing = ids;
        released
    }

    fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, rg: bool) -> Result<TensorRef> {
        self.release_dropped()?;
        let shape = value.shape().clone();
        let id = on_engine!(&mut self.engine,
            cpu(t) => t.leaf(value, name, rg),
            cuda(t) => t.upload_leaf(&value, name, rg)?,
        );
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
        on_engine!(&self.engine,
            cpu(_) => self.params.read::<SimDevice>(p, None),
            cuda(t) => self.params.read(p, Some(t.device())),
        )
    }

    /// The parameter's name, if it has one.
    pub fn param_name(&self, p: &Param) -> Result<Option<String>> {
        Ok(self.params.slot("param_name", p)?.name.clone())
    }

    // ---- Nat environment ------------------------------------------------------------------

    fn push_nats(&mut self) {
        let v = self.nats.values.clone();
        on_engine!(&mut self.engine, cpu(t) => t.set_nats(v), cuda(t) => t.set_nats(v))
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

    /// Before a step that ends the pass (`Train::backward_step_reduced_then_reset`): the CPU
    /// tape's values go to its pool, so the parameters' values are theirs alone and the update
    /// writes them in place. The gradients and the leaf → parameter map stay for the step; a
    /// reset must follow. (On a device the update already runs in place, on the mirrors.)
    pub(crate) fn release_pass_values(&mut self) {
        if let Engine::Cpu(t) = &mut self.engine {
            t.clear();
        }
    }

    /// Start a fresh tape: every `TensorRef`, `NatRef` and gradient of the old one becomes
    /// invalid (a clear error if used). On CUDA, releases the tape's buffers, the gradients and
    /// retired parameter mirrors; live parameter mirrors stay resident.
    pub fn reset(&mut self) {
        self.release_grads();
        on_engine!(&mut self.engine,
            cpu(t) => t.clear(),
            cuda(t) => {
                t.reset();
                self.params.release_retired(t.device_mut());
            }
        );
        self.leaf_param.clear();
        self.nats = NatEnv::default();
        self.dropped.clear();
        self.stamp.epoch += 1;
    }
}

/// Autocast (bf16 / TF32) runs on every backend's tape of an `f32` session (the CPU tape's
/// rounded copies, the CUDA tape's tensor-core GEMM); autocast concerns f32 only. `what` names
/// the call in the error.
pub(crate) fn check_precision<T: Scalar>(what: &'static str, precision: Precision) -> Result<()> {
    if precision == Precision::F32 || T::NAME == "f32" {
        return Ok(());
    }
    Err(Error::Usage {
        what,
        detail: format!(
            "precision {} (autocast) needs an f32 session, not {}",
            precision.name(),
            T::NAME
        ),
    })
}

/// The error of `Backend::Cuda` in a build without the `cuda` feature.
#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
pub(crate) fn cuda_unavailable() -> Error {
    Error::BackendUnavailable {
        backend: "cuda",
        detail: "tl-session was built without the `cuda` feature (rebuild with `--features cuda`; until then use Backend::CudaSim)".into(),
    }
}

/// The real CUDA device, or one clear error when the driver has none (no GPU, or the stub
/// libcuda of `cargo xtask cuda-stub`).
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub(crate) fn cuda_device(deterministic: bool) -> Result<tl_tape_cuda::CudaDevice> {
    let mut dev = tl_tape_cuda::CudaDevice::new().map_err(|e| Error::BackendUnavailable {
        backend: "cuda",
        detail: match e {
            tl_tape_cuda::Error::NoDevice { detail } => format!(
                "no CUDA device ({detail}); use Backend::CudaSim or Backend::Cpu on this machine"
            ),
            other => format!("the CUDA device could not be initialized: {other}"),
        },
    })?;
    if deterministic {
        dev.set_deterministic(Some(true));
    }
    Ok(dev)
}

impl<T: Scalar> Ops for Session<T> {
    type T = T;

    fn apply(&mut self, op: Op, args: &[&TensorRef]) -> Result<TensorRef> {
        let mut ids = Vec::with_capacity(args.len());
        for a in args {
            self.check(op.name(), a)?;
            ids.push(a.id);
        }
        self.release_dropped()?;
        let id = on_engine!(&mut self.engine, cpu(t) => t.apply(&op, &ids)?, cuda(t) => t.apply(&op, &ids)?);
        let shape = on_engine!(&self.engine,
            cpu(t) => t.get(id)?.shape().clone(),
            cuda(t) => t.get(id)?.shape().clone(),
        );
        let mut r = self.handle(id, shape);
        // A node that requires grad keeps its value for the backward: no watch needed.
        if !self.requires_grad_of(&r) {
            r.watch = Some(self.dropped.watch(self.stamp.epoch, id));
        }
        Ok(r)
    }

    fn param(&mut self, init: Tensor<T>, name: Option<&str>, rg: bool) -> Result<Param> {
        Ok(self.params.create(init, name, rg))
    }

    fn use_param(&mut self, p: &Param) -> Result<TensorRef> {
        let slot = self.params.slot("use_param", p)?;
        let (name, rg) = (slot.name.clone(), slot.requires_grad && self.grad_enabled);
        let id = on_engine!(&mut self.engine,
            cpu(t) => {
                let v = self.params.slots[p.index].host.clone();
                t.leaf(v, name.as_deref(), rg)
            },
            cuda(t) => {
                let m = self.params.mirror(p.index, t.device_mut())?;
                t.leaf_borrowed(m, name.as_deref(), rg)
            },
        );
        self.leaf_param.insert(id, p.index);
        Ok(self.handle(id, self.params.shape(p.index).clone()))
    }

    fn input_named(
        &mut self,
        value: Tensor<T>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<TensorRef> {
        self.leaf(value, name, requires_grad && self.grad_enabled)
    }

    fn set_grad_enabled(&mut self, enabled: bool) {
        self.grad_enabled = enabled;
    }

    fn is_grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    fn constant(&mut self, value: Tensor<T>) -> Result<TensorRef> {
        self.leaf(value, None, false)
    }

    fn next_random_key(&mut self) -> Result<(u64, u64)> {
        let c = self.rng_counter;
        self.rng_counter = c.wrapping_add(1);
        Ok((self.opts.seed, c))
    }

    fn value(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.check("value", r)?;
        // A pass's last values are dropped after its last op: a read lets them go too.
        self.release_dropped()?;
        Ok(on_engine!(&self.engine,
            cpu(t) => t.value(r.id, &r.shape)?.clone(),
            cuda(t) => t.value(r.id, &r.shape)?.download(t.device())?,
        ))
    }
}
