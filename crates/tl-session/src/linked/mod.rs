//! [`LinkedSession`]: the same op surface, but every call records a node of a
//! `GraphData` (the proved IR). Values come from pure evaluation, gradients from the IR's
//! `backprop_all`, tangents from its `jvp`; [`LinkedSession::compile`] replays the graph into a
//! tape of either backend.

mod device;
mod running;

use std::collections::HashMap;

use tl_ir::{GraphBuilder, GraphData, Op};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::Tape;
use tl_tape_cuda::{AnyBuffer, CudaTape, FlashProducts, SimDevice};

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
use crate::eager::cuda_unavailable;
use crate::handle::{NatEnv, Stamp, next_session_id};
use crate::liveness::Dropped;
use crate::params::ParamStore;
use crate::{
    Backend, Error, NatRef, NatVecRef, Ops, Optimizer, Param, Precision, Result, TensorRef,
};
pub(crate) use device::step_on_tape;
use device::{Devices, on_device};

/// A session that records a `GraphData` as ops are called. All leaves (parameters, inputs,
/// constants before the first op) must come before the first op node; [`LinkedSession::reset`]
/// is the boundary between forward passes.
pub struct LinkedSession<T: Scalar = f32> {
    stamp: Stamp,
    builder: GraphBuilder,
    pub(crate) leaves: Vec<Tensor<T>>,
    pub(crate) params: ParamStore<T>,
    leaf_param: HashMap<usize, usize>,
    nats: NatEnv,
    /// Seed of the random ops.
    seed: u64,
    /// Random ops recorded so far (the counter of the next one); survives `reset`.
    rng_counter: u64,
    /// Whether leaves recorded now may require grad ([`Ops::set_grad_enabled`]).
    grad_enabled: bool,
    /// The tape [`Train`](crate::Train) compiles each step into.
    backend: Backend,
    /// Whether graphs compiled for `Backend::Cuda` use the fixed-order reductions.
    deterministic: bool,
    /// The arithmetic of the compiled tapes' matrix products (autocast).
    precision: Precision,
    /// How the compiled CUDA tapes' fused attention multiplies (`set_flash_products`).
    flash_products: FlashProducts,
    /// The values of the graph's first ids, from the last `value` read: a read evaluates only
    /// the nodes recorded since, and lets go of the values no handle reaches once their last
    /// reader is evaluated (the empty vector in their place). Cleared when a leaf is added, a
    /// Nat input overwritten, or the session reset.
    values: Vec<Tensor<T>>,
    /// The ids dropped since the last `value` read that it evaluated already (it frees them).
    dropped_for_values: Vec<usize>,
    /// The ids dropped since the kept pass last grew (it frees those it replayed).
    dropped_for_pass: Vec<usize>,
    /// The devices of the last step's compiled tapes, kept so the next step's buffers come from
    /// their caching allocators' pools (no device allocation in steady state) and the
    /// parameters stay resident there.
    devices: Devices,
    /// The CPU tape of the last compile, cleared: its pool holds that step's buffers, which the
    /// next compile's kernels reuse (docs/performance.md, "Buffer reuse").
    cpu_tape: Option<Tape<T>>,
    /// Whether a parameter leaf of this graph was recorded with a host value older than its
    /// device mirror (synced by [`sync_leaves`](Self::sync_leaves) before host code reads it).
    leaves_stale: bool,
    /// Parameters written from the host ([`set_param`](Self::set_param)) while this graph
    /// had leaves of them: those leaves keep their recorded value, so a compile uploads it
    /// instead of compiling in the parameter's (newer) resident mirror. Cleared by `reset`.
    written: std::collections::HashSet<usize>,
    /// Parameters updated on the device ([`update_running`](Self::update_running)) while this
    /// graph had leaves of them compiled from their resident mirror: that mirror, the value
    /// those leaves were recorded with, which compiles of this graph keep borrowing for them
    /// (and a sync of the leaves downloads). Released by `reset`.
    pinned: HashMap<usize, AnyBuffer>,
    /// The current pass's compiled tape, kept by a [`Train::read`](crate::Train::read): the
    /// next read, or the step, replays only the nodes recorded since (a model that reads values
    /// during its pass, as batch norm does for its running statistics, would otherwise replay
    /// the graph once per read). Ended, its device handed back, by whatever changes what a
    /// compile would see or needs the device: a reset, a new leaf, a Nat or parameter write, a
    /// backend switch, a parameter sync, the optimizer state's import.
    pass: Option<Compiled<T>>,
    /// Nodes whose last handle was dropped (reported by their handles' watches).
    dropped: Dropped,
    /// Graph id → whether its last handle was dropped (from `dropped`): a compiled pass frees
    /// such a node's value once its last reader has run. Cleared by `reset`.
    dead: Vec<bool>,
    /// Graph id → whether it requires grad (a leaf's flag; a node's op is differentiable and
    /// an operand requires grad), as the tapes decide it: only a node that does not gets a
    /// watch on its handle (the tapes keep every other value). Cleared by `reset`.
    requires_grad: Vec<bool>,
}

/// A linked session's graph replayed into a tape ("compiled").
pub enum CompiledTape<T: Scalar> {
    /// The CPU tape.
    Cpu(Tape<T>),
    /// The CUDA tape on the simulation device.
    CudaSim(CudaTape<SimDevice>),
    /// The CUDA tape on the real device (feature `cuda`).
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    Cuda(CudaTape<tl_tape_cuda::CudaDevice>),
}

/// `match` a [`CompiledTape`]: `cpu(t) => ..`, and `cuda(t) => ..` once for every device.
macro_rules! on_compiled {
    ($tape:expr, cpu($c:ident) => $cpu:expr, cuda($t:ident) => $dev:expr $(,)?) => {
        match $tape {
            $crate::linked::CompiledTape::Cpu($c) => $cpu,
            $crate::linked::CompiledTape::CudaSim($t) => $dev,
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            $crate::linked::CompiledTape::Cuda($t) => $dev,
        }
    };
}
pub(crate) use on_compiled;

/// A compiled graph: the tape and, for each graph id, its tape id.
pub struct Compiled<T: Scalar> {
    /// The tape.
    pub tape: CompiledTape<T>,
    /// Graph id → tape id.
    pub map: Vec<usize>,
}

impl<T: Scalar> Compiled<T> {
    /// The backend whose tape this is.
    pub fn backend(&self) -> Backend {
        match &self.tape {
            CompiledTape::Cpu(_) => Backend::Cpu,
            CompiledTape::CudaSim(_) => Backend::CudaSim,
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            CompiledTape::Cuda(_) => Backend::Cuda,
        }
    }

    /// The value of every graph id, read from the tape.
    pub fn values(&self) -> Result<Vec<Tensor<T>>> {
        (0..self.map.len()).map(|id| self.value(id)).collect()
    }

    /// The value of graph id `id`, read from the tape (downloaded on CUDA).
    pub fn value(&self, id: usize) -> Result<Tensor<T>> {
        let t = *self.map.get(id).ok_or_else(|| Error::Usage {
            what: "compiled value",
            detail: format!(
                "graph id {id} is not in this graph of {} nodes",
                self.map.len()
            ),
        })?;
        on_compiled!(&self.tape,
            cpu(tape) => Ok(tape.get(t)?.clone()),
            cuda(tape) => Ok(tape.read(t)?),
        )
    }

    /// Dense gradients of graph id `out` (cotangent `seed`) for every graph id, on the tape.
    pub fn backward_dense(&mut self, out: usize, seed: &Tensor<T>) -> Result<Vec<Tensor<T>>> {
        self.backward_dense_where(out, seed, |_| true)
    }

    /// Like [`backward_dense`](Self::backward_dense), but only the graph ids where `wanted` is
    /// true are read back (downloaded on CUDA); the others are empty tensors.
    pub(crate) fn backward_dense_where(
        &mut self,
        out: usize,
        seed: &Tensor<T>,
        wanted: impl Fn(usize) -> bool,
    ) -> Result<Vec<Tensor<T>>> {
        let to = *self.map.get(out).ok_or(Error::Count {
            what: "compiled backward_dense: graph id",
            expected: self.map.len(),
            got: out,
        })?;
        on_compiled!(&mut self.tape,
            cpu(tape) => {
                let mut g = tape.backward_dense(to, seed)?;
                let empty = || Tensor::vector(Vec::new());
                let take = |(id, &t): (usize, &usize)| {
                    if wanted(id) { std::mem::replace(&mut g[t], empty()) } else { empty() }
                };
                Ok(self.map.iter().enumerate().map(take).collect())
            },
            cuda(tape) => {
                // The 1 of a scalar loss is filled on the device and becomes its gradient slot.
                let s = AnyBuffer::upload_or_fill(tape.device_mut(), seed)?;
                let g = tape.backward_dense_owned(to, s)?;
                let out: Result<Vec<Tensor<T>>> = self
                    .map
                    .iter()
                    .enumerate()
                    .map(|(id, &t)| match wanted(id) {
                        true => Ok(g[t].download(tape.device())?),
                        false => Ok(Tensor::vector(Vec::new())),
                    })
                    .collect();
                tape.release_grads(g);
                out
            },
        )
    }
}

impl<T: Scalar> Default for LinkedSession<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Scalar> LinkedSession<T> {
    /// A fresh linked session.
    pub fn new() -> Self {
        let session = next_session_id();
        LinkedSession {
            stamp: Stamp { session, epoch: 0 },
            builder: GraphBuilder::new(),
            leaves: Vec::new(),
            params: ParamStore::new(session),
            leaf_param: HashMap::new(),
            nats: NatEnv::default(),
            seed: 0,
            rng_counter: 0,
            grad_enabled: true,
            backend: Backend::Cpu,
            deterministic: false,
            precision: Precision::F32,
            flash_products: FlashProducts::Fma,
            values: Vec::new(),
            dropped_for_values: Vec::new(),
            dropped_for_pass: Vec::new(),
            dropped: Dropped::default(),
            dead: Vec::new(),
            requires_grad: Vec::new(),
            devices: Devices::default(),
            cpu_tape: None,
            leaves_stale: false,
            written: std::collections::HashSet::new(),
            pinned: HashMap::new(),
            pass: None,
        }
    }

    /// A fresh linked session whose random ops use `seed` (the eager session's
    /// `Options::seed`).
    pub fn with_seed(seed: u64) -> Self {
        LinkedSession {
            seed,
            ..Self::new()
        }
    }

    /// The backend whose tape [`Train`](crate::Train)'s steps and reads compile the graph into
    /// (default [`Backend::Cpu`]).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Compile steps and reads into `backend`'s tape from now on. `Backend::Cuda` without the
    /// `cuda` feature or a device is an error here, not at the first step. Parameters resident
    /// on the old backend's device come home first (their newest values downloaded).
    /// Optimizer state kept on that device stays there: to move a stateful optimizer, export
    /// it ([`optimizer_state`](Self::optimizer_state)) before and load it after.
    pub fn set_backend(&mut self, backend: Backend) -> Result<()> {
        self.end_pass();
        if backend == Backend::Cuda {
            #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
            return Err(cuda_unavailable());
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            if self.devices.cuda.is_none() {
                drop(crate::eager::cuda_device(false)?);
            }
        }
        if backend != self.backend {
            self.unload_params()?;
        }
        self.backend = backend;
        Ok(())
    }

    /// Compile graphs for `Backend::Cuda` onto the fixed-order (deterministic) reduction
    /// kernels (`true`), or follow the process-wide flag (`false`, the default), as
    /// [`Options::deterministic`](crate::Options::deterministic) does for the eager session.
    pub fn set_deterministic(&mut self, on: bool) {
        self.end_pass();
        self.deterministic = on;
        #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
        if let Some(dev) = &mut self.devices.cuda {
            // The kept device (and the parameters resident on it) switches in place.
            dev.set_deterministic(on.then_some(true));
        }
    }

    /// Compile steps and reads (`Train::read`) onto tapes whose matrix products run at
    /// `precision` from now on: [`Precision::Bf16`] or [`Precision::Tf32`] autocast (operands
    /// rounded, f32 sums; docs/semantics.md, "Mixed precision"), as
    /// [`Options::precision`](crate::Options::precision) does for the eager session, on every
    /// backend. The pure algorithms ([`Ops::value`], [`LinkedSession::backward_dense_all`], the
    /// JVP) evaluate the graph in the IR's own arithmetic whatever the setting. Autocast needs
    /// an `f32` session: an error otherwise.
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        crate::eager::check_precision::<T>("LinkedSession::set_precision", precision)?;
        self.end_pass();
        self.precision = precision;
        Ok(())
    }

    /// The arithmetic of the compiled tapes' matrix products
    /// ([`set_precision`](Self::set_precision)).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// How the core of fused attention nodes multiplies, forward and backward, on the CUDA
    /// backends (`Backend::Cuda`, `Backend::CudaSim`) from the next compile on:
    /// [`FlashProducts::Fma`] (the default) or [`FlashProducts::Tf32x3`], the products on the
    /// tensor cores: in f32 as three TF32 products each, as PyTorch's f32
    /// `scaled_dot_product_attention` on sm80+ (the same function within f32 tolerance, not the
    /// FMA kernels' bits), under autocast ([`set_precision`](Self::set_precision)) the rounded
    /// operands' exact products; heads up to 64, the FMA kernels elsewhere (docs/semantics.md,
    /// the fused path's table). The CPU's fused attention has no such choice: the setting
    /// changes nothing there.
    pub fn set_flash_products(&mut self, products: FlashProducts) {
        self.end_pass();
        self.flash_products = products;
    }

    /// The seed of the random ops.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The counter the next random op will record.
    pub fn random_counter(&self) -> u64 {
        self.rng_counter
    }

    /// Set the random counter (e.g. to resume a run from a checkpoint).
    pub fn set_random_counter(&mut self, counter: u64) {
        self.rng_counter = counter;
    }

    /// This session's id and current epoch.
    pub fn stamp(&self) -> Stamp {
        self.stamp
    }

    /// The graph recorded so far.
    pub fn graph(&self) -> &GraphData {
        self.builder.graph()
    }

    /// The leaf values recorded so far, in leaf order (parameter leaves synced from the device
    /// first when a device step changed them).
    pub fn leaf_values(&mut self) -> Result<&[Tensor<T>]> {
        self.sync_leaves()?;
        Ok(&self.leaves)
    }

    /// The Nat environment.
    pub fn nats(&self) -> &[usize] {
        &self.nats.values
    }

    /// Start a new graph: leaves, nodes, the Nat environment and the leaf → parameter map are
    /// dropped; old handles become invalid. Parameters keep their values.
    pub fn reset(&mut self) {
        self.end_pass();
        self.builder = GraphBuilder::new();
        // Leaf values nothing else holds (a parameter's value before the last step) become
        // spare buffers of the CPU tape.
        match &self.cpu_tape {
            Some(t) => self.leaves.drain(..).for_each(|v| t.recycle(v)),
            None => self.leaves.clear(),
        }
        self.leaf_param.clear();
        self.nats = NatEnv::default();
        self.clear_values();
        self.leaves_stale = false;
        self.written.clear();
        // The pinned mirrors: nothing reads them once the graph is gone.
        let pinned = self.pinned.drain().map(|(_, b)| b.buffer());
        self.params.retired.extend(pinned);
        self.release_retired();
        self.dead.clear();
        self.dropped.clear();
        self.requires_grad.clear();
        self.stamp.epoch += 1;
    }

    fn check(&self, what: &'static str, r: &TensorRef) -> Result<()> {
        r.stamp.check(what, self.stamp)
    }

    /// Check that `r` belongs to this session's current graph.
    pub(crate) fn check_handle(&self, what: &'static str, r: &TensorRef) -> Result<()> {
        self.check(what, r)
    }

    /// Check that `loss` is a scalar of this session's current graph.
    pub(crate) fn check_loss(&self, what: &'static str, loss: &TensorRef) -> Result<()> {
        self.check(what, loss)?;
        if !loss.shape.is_scalar() {
            return Err(Error::Shape {
                what,
                expected: Shape::scalar(),
                got: loss.shape.clone(),
            });
        }
        Ok(())
    }

    fn handle(&self, id: usize) -> Result<TensorRef> {
        let g = self.builder.graph();
        Ok(TensorRef {
            stamp: self.stamp,
            id,
            shape: g.shape(id)?.clone(),
            // Leaves keep their values, and so does a node that requires grad; another node's
            // may go once its handle is dropped.
            watch: (id >= g.num_leaves() && !self.requires_grad.get(id).copied().unwrap_or(true))
                .then(|| self.dropped.watch(self.stamp.epoch, id)),
        })
    }

    /// Whether graph id `r` (checked to be of this graph by the caller) requires grad.
    pub(crate) fn requires_grad_of(&self, r: &TensorRef) -> bool {
        self.requires_grad.get(r.id).copied().unwrap_or(false)
    }

    /// The graph ids whose last handle was dropped, as `dead` (graph id → dropped) for a
    /// compiled pass, and those dropped since the kept pass last grew; hand `dead` back with
    /// [`keep_dead`](Self::keep_dead).
    pub(super) fn take_dead(&mut self) -> (Vec<bool>, Vec<usize>) {
        self.collect_dropped();
        (
            std::mem::take(&mut self.dead),
            std::mem::take(&mut self.dropped_for_pass),
        )
    }

    /// Empty the value cache: the next `value` read evaluates from the leaves.
    fn clear_values(&mut self) {
        self.values.clear();
        self.dropped_for_values.clear();
    }

    /// Mark the ids the handles' watches reported since the last call in `dead`, and list
    /// them for the value cache and the kept pass, each only while it holds evaluated or
    /// replayed values (one that holds none starts from `dead` alone).
    fn collect_dropped(&mut self) {
        if self.dropped.is_empty() {
            return;
        }
        let mut since = Vec::new();
        self.dropped.take_into(self.stamp.epoch, &mut since);
        for &id in &since {
            if self.dead.len() <= id {
                self.dead.resize(id + 1, false);
            }
            self.dead[id] = true;
        }
        if !self.values.is_empty() {
            self.dropped_for_values.extend_from_slice(&since);
        }
        if self.pass.is_some() {
            self.dropped_for_pass.extend_from_slice(&since);
        }
    }

    /// Put back what [`take_dead`](Self::take_dead) took.
    pub(super) fn keep_dead(&mut self, dead: Vec<bool>) {
        self.dead = dead;
    }

    fn leaf(&mut self, value: Tensor<T>, name: Option<&str>, rg: bool) -> Result<TensorRef> {
        let id = self.builder.leaf_with(value.shape().clone(), name, rg)?;
        self.requires_grad.push(rg);
        self.end_pass();
        self.leaves.push(value);
        self.clear_values();
        self.handle(id)
    }

    /// A parameter's current value (downloaded from the device when a device step changed it).
    pub fn param_value(&mut self, p: &Param) -> Result<Tensor<T>> {
        self.params.slot("param_value", p)?;
        self.sync_param(p.index)?;
        Ok(self.params.slots[p.index].host.clone())
    }

    /// Overwrite a parameter's value (its device mirror, if any, is dropped and made again
    /// from this value on next use). Leaves of the current graph keep the value they were
    /// recorded with. Only this parameter is touched: no other parameter is synced from the
    /// device.
    pub fn set_param(&mut self, p: &Param, value: Tensor<T>) -> Result<()> {
        self.params.slot("set_param", p)?;
        if value.shape() != self.params.shape(p.index) {
            return Err(Error::Shape {
                what: "set_param",
                expected: self.params.shape(p.index).clone(),
                got: value.shape().clone(),
            });
        }
        let recorded = self.leaf_param.values().any(|&i| i == p.index);
        // A pass's tape keeps what it compiled in: a leaf uploaded from its recorded value, or
        // the parameter's old mirror, whose release waits for the end of the pass.
        if recorded {
            // Its leaves hold the value they were recorded with (synced from the device first
            // if a device step made them stale), and compiles use it from now on.
            self.sync_param_leaves(p.index)?;
        }
        self.params.write(p, value)?;
        if recorded {
            self.written.insert(p.index);
            if let Some(b) = self.pinned.remove(&p.index) {
                self.params.retired.push(b.buffer());
            }
        }
        self.release_retired();
        Ok(())
    }

    // ---- Nat environment ------------------------------------------------------------------

    /// Record a non-differentiable Nat input.
    pub fn record_nat(&mut self, v: usize) -> NatRef {
        let r = self.nats.record(self.stamp, v);
        self.pass_nats();
        r
    }
    /// Read a recorded Nat input.
    pub fn read_nat(&self, r: NatRef) -> Result<usize> {
        self.nats.read(r, self.stamp)
    }
    /// Give the pass's compiled tape (if any) the Nat environment as it is now: recording
    /// appends, so the nodes it holds read the values they were compiled with.
    fn pass_nats(&mut self) {
        let Some(c) = &mut self.pass else {
            return;
        };
        let nats = self.nats.values.clone();
        match &mut c.tape {
            CompiledTape::Cpu(t) => t.set_nats(nats),
            CompiledTape::CudaSim(t) => t.set_nats(nats),
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            CompiledTape::Cuda(t) => t.set_nats(nats),
        }
    }

    /// Overwrite a recorded Nat input (evaluation reads the current environment).
    pub fn write_nat(&mut self, r: NatRef, v: usize) -> Result<()> {
        self.end_pass();
        self.clear_values();
        self.nats.write(r, v, self.stamp)
    }
    /// Record a block of Nat inputs.
    pub fn record_nat_vec(&mut self, vs: &[usize]) -> NatVecRef {
        let r = self.nats.record_vec(self.stamp, vs);
        self.pass_nats();
        r
    }
    /// Read a recorded block.
    pub fn read_nat_vec(&self, r: NatVecRef) -> Result<Vec<usize>> {
        self.nats.read_vec(r, self.stamp)
    }
    /// Overwrite a recorded block; `vs` must have the block's length.
    pub fn write_nat_vec(&mut self, r: NatVecRef, vs: &[usize]) -> Result<()> {
        self.end_pass();
        self.clear_values();
        self.nats.write_vec(r, vs, self.stamp)
    }

    // ---- pure algorithms ------------------------------------------------------------------

    /// Replay the graph into a fresh tape of `backend` ("compile"), on a new device for the
    /// CUDA backends (parameters uploaded from their host values).
    pub fn compile(&mut self, backend: Backend) -> Result<Compiled<T>> {
        self.sync_leaves()?;
        self.compile_onto(backend, &mut Devices::default(), false, None)
    }

    /// Dense gradients of `out` with cotangent `seed`, for every id (`GraphData::backprop_all`).
    pub fn backward_dense_all(
        &mut self,
        out: &TensorRef,
        seed: &Tensor<T>,
    ) -> Result<Vec<Tensor<T>>> {
        self.check("backward_dense_all", out)?;
        self.sync_leaves()?;
        Ok(self
            .builder
            .graph()
            .backprop_all(&self.leaves, &self.nats.values, out.id, seed)?)
    }

    /// [`backward_dense_all`](Self::backward_dense_all) from a scalar loss with seed 1.
    pub fn backward_scalar_dense_all(&mut self, loss: &TensorRef) -> Result<Vec<Tensor<T>>> {
        if !loss.shape.is_scalar() {
            return Err(Error::Shape {
                what: "backward_scalar_dense_all",
                expected: Shape::scalar(),
                got: loss.shape.clone(),
            });
        }
        self.backward_dense_all(loss, &Tensor::scalar(T::one()))
    }

    /// The entry for `r` of a dense gradient (or tangent) array.
    pub fn grad_of(&self, grads: &[Tensor<T>], r: &TensorRef) -> Result<Tensor<T>> {
        self.check("grad_of", r)?;
        let g = grads.get(r.id).ok_or(Error::Count {
            what: "grad_of: gradient array length",
            expected: self.builder.graph().len(),
            got: grads.len(),
        })?;
        if g.shape() != &r.shape {
            return Err(Error::Shape {
                what: "grad_of",
                expected: r.shape.clone(),
                got: g.shape().clone(),
            });
        }
        Ok(g.clone())
    }

    /// Tangents of every id given one tangent per leaf, in leaf order (`GraphData::jvp`).
    pub fn jvp(&mut self, tangents: &[Tensor<T>]) -> Result<Vec<Tensor<T>>> {
        self.sync_leaves()?;
        Ok(self
            .builder
            .graph()
            .jvp(&self.leaves, &self.nats.values, tangents)?)
    }

    /// The tangent of `out` when leaf `leaf` moves along `tangent` and every other leaf is
    /// fixed. PyTorch: `torch.func.jvp` in one input.
    pub fn jvp_leaf(
        &mut self,
        leaf: &TensorRef,
        tangent: Tensor<T>,
        out: &TensorRef,
    ) -> Result<Tensor<T>> {
        self.check("jvp_leaf", leaf)?;
        self.check("jvp_leaf", out)?;
        if leaf.id >= self.leaves.len() {
            return Err(Error::Usage {
                what: "jvp_leaf",
                detail: format!("id {} is an op node, not a leaf", leaf.id),
            });
        }
        if tangent.shape() != &leaf.shape {
            return Err(Error::Shape {
                what: "jvp_leaf tangent",
                expected: leaf.shape.clone(),
                got: tangent.shape().clone(),
            });
        }
        let mut ts: Vec<Tensor<T>> = self
            .leaves
            .iter()
            .map(|l| Tensor::try_zeros("jvp_leaf", l.shape().clone()))
            .collect::<tl_spec::Result<_>>()?;
        ts[leaf.id] = tangent;
        Ok(self.jvp(&ts)?.swap_remove(out.id))
    }

    /// The derivative of `out` in a scalar leaf (tangent 1 on that leaf, 0 elsewhere).
    pub fn jvp_scalar_leaf(&mut self, leaf: &TensorRef, out: &TensorRef) -> Result<Tensor<T>> {
        if !leaf.shape.is_scalar() {
            return Err(Error::Shape {
                what: "jvp_scalar_leaf",
                expected: Shape::scalar(),
                got: leaf.shape.clone(),
            });
        }
        self.jvp_leaf(leaf, Tensor::scalar(T::one()), out)
    }

    // ---- optimizers -----------------------------------------------------------------------

    /// `opt`'s state for this session's parameters as named tensors. PyTorch:
    /// `optimizer.state_dict()`.
    /// On a CUDA backend, the state of device steps is read back from the kept device.
    pub fn optimizer_state(&self, opt: &Optimizer) -> Result<crate::optim::StateDict> {
        let params = &self.params;
        // During a pass the kept device is in the pass's compiled tape.
        match self.pass.as_ref().map(|c| &c.tape) {
            Some(CompiledTape::CudaSim(t)) => {
                return crate::optim::export_state(opt, params, Some(t.device()));
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Some(CompiledTape::Cuda(t)) => {
                return crate::optim::export_state(opt, params, Some(t.device()));
            }
            _ => {}
        }
        on_device!(self.devices, self.backend,
            cpu => crate::optim::export_state::<T, SimDevice>(opt, params, None),
            dev(d) => crate::optim::export_state(opt, params, d.as_ref()),
        )
    }

    /// Load `state` (from `optimizer_state` of a session with the same parameter names) into
    /// `opt` for this session's parameters. PyTorch: `optimizer.load_state_dict(...)`.
    /// On a CUDA backend the state is uploaded to the device the steps compile onto.
    pub fn load_optimizer_state(
        &mut self,
        opt: &mut Optimizer,
        state: &crate::optim::StateDict,
    ) -> Result<()> {
        // On a CUDA backend the state goes up to the kept device (made now if need be), where
        // the device steps read it.
        self.ensure_device()?;
        let params = &self.params;
        on_device!(self.devices, self.backend,
            cpu => crate::optim::import_state::<T, SimDevice>(opt, params, state, None),
            dev(mut d) => crate::optim::import_state(opt, params, state, d.as_mut()),
        )
    }

    /// `w ← w − lr·g` for every trainable parameter used in this graph, from dense gradients
    /// (e.g. [`backward_scalar_dense_all`](Self::backward_scalar_dense_all)).
    pub fn sgd_step_all(&mut self, lr: f64, grads: &[Tensor<T>]) -> Result<()> {
        self.step(&mut Optimizer::sgd(lr)?, grads)
    }

    /// One optimizer step for every trainable parameter used in this graph, from dense
    /// gradients (a parameter used twice gets the sum of both leaves' gradients).
    pub fn step(&mut self, opt: &mut Optimizer, grads: &[Tensor<T>]) -> Result<()> {
        // Checked against the graph's leaves: a step that ends its pass
        // (`Train::backward_step_reduced_then_reset`) has let go of the leaf values.
        let leaves = self.builder.graph().leaves();
        if grads.len() < leaves.len() {
            return Err(Error::Count {
                what: "step: gradient array length (at least the leaves)",
                expected: self.builder.graph().len(),
                got: grads.len(),
            });
        }
        let uses = self.trainable_uses();
        for &leaf in uses.values().flatten() {
            let g = &grads[leaf];
            if g.shape() != &leaves[leaf].shape {
                return Err(Error::Shape {
                    what: "step: gradient of a parameter leaf",
                    expected: leaves[leaf].shape.clone(),
                    got: g.shape().clone(),
                });
            }
        }
        let all: Vec<Vec<&Tensor<T>>> = uses
            .values()
            .map(|leaves| leaves.iter().map(|&l| &grads[l]).collect())
            .collect();
        // The step's learning rate and clipping, from every gradient, before any update.
        let r = opt.begin_step_host(&all).and_then(|()| {
            for ((&index, _), gs) in uses.iter().zip(&all) {
                // A parameter resident on a device is stepped on its host value, synced
                // first; the mirror is made again from the new value on next use.
                self.sync_param(index)?;
                let key = (self.params.session, index);
                let slot = &mut self.params.slots[index];
                opt.update_host(key, &mut slot.host, gs)
                    .map_err(|e| e.with_param_name(slot.name.as_deref()))?;
                self.params.retire_mirror(index);
            }
            Ok(())
        });
        opt.end_step(r.is_ok());
        r?;
        self.release_retired();
        Ok(())
    }
}

impl<T: Scalar> Ops for LinkedSession<T> {
    type T = T;

    fn apply(&mut self, op: Op, args: &[&TensorRef]) -> Result<TensorRef> {
        let mut ids = Vec::with_capacity(args.len());
        for a in args {
            self.check(op.name(), a)?;
            ids.push(a.id);
        }
        let differentiable = op.is_differentiable();
        let id = self.builder.apply(op, &ids)?;
        let rg = differentiable
            && ids
                .iter()
                .any(|&a| self.requires_grad.get(a) != Some(&false));
        self.requires_grad.push(rg);
        self.handle(id)
    }

    fn param(&mut self, init: Tensor<T>, name: Option<&str>, rg: bool) -> Result<Param> {
        Ok(self.params.create(init, name, rg))
    }

    fn use_param(&mut self, p: &Param) -> Result<TensorRef> {
        let slot = self.params.slot("use_param", p)?;
        let rg = slot.requires_grad && self.grad_enabled;
        let (v, name) = (slot.host.clone(), slot.name.clone());
        // A value older than the device mirror is recorded as it is (a device step compiles
        // the mirror in) and synced only when host code reads it.
        let stale = slot.host_stale;
        let r = self.leaf(v, name.as_deref(), rg)?;
        self.leaves_stale |= stale;
        self.leaf_param.insert(r.id, p.index);
        Ok(r)
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

    /// A leaf before the first op node; a `constant` node after.
    fn constant(&mut self, value: Tensor<T>) -> Result<TensorRef> {
        if self.builder.graph().nodes().is_empty() {
            self.leaf(value, None, false)
        } else {
            self.apply(Op::Constant(value.try_cast("constant")?), &[])
        }
    }

    fn next_random_key(&mut self) -> Result<(u64, u64)> {
        let c = self.rng_counter;
        self.rng_counter = c.wrapping_add(1);
        Ok((self.seed, c))
    }

    fn value(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.check("value", r)?;
        self.sync_leaves()?;
        self.collect_dropped();
        if r.id >= self.values.len() || !self.dropped_for_values.is_empty() {
            let dead = &self.dead;
            let is_dead = |id: usize| dead.get(id).copied().unwrap_or(false);
            let g = self.builder.graph();
            let dropped = std::mem::take(&mut self.dropped_for_values);
            g.eval_more_releasing(
                &mut self.values,
                &self.leaves,
                &self.nats.values,
                &is_dead,
                &dropped,
            )?;
        }
        Ok(self.values[r.id].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_reads_evaluate_new_nodes_only_and_follow_nat_writes() {
        let mut s = LinkedSession::<f64>::new();
        let x = s
            .input_named(Tensor::vector(vec![1.0, 2.0, 3.0]), Some("x"), false)
            .unwrap();
        assert_eq!(s.graph().leaves()[0].name.as_deref(), Some("x"));
        let i = s.record_nat(2);
        let y = s.exp(&x).unwrap();
        let ey = s.value(&y).unwrap();
        assert_eq!(s.values.len(), 2, "x and exp(x) evaluated");
        let z = s.gather_scalar_nat(&y, i.pos()).unwrap();
        assert_eq!(s.value(&z).unwrap().item().unwrap(), 3f64.exp());
        assert_eq!(s.values.len(), 3, "only the new node was evaluated");
        assert_eq!(
            s.value(&y).unwrap(),
            ey,
            "a read of an evaluated node is a lookup"
        );
        // Overwriting a Nat input changes what depends on it.
        s.write_nat(i, 0).unwrap();
        assert_eq!(s.value(&z).unwrap().item().unwrap(), 1f64.exp());
        s.reset();
        assert!(s.values.is_empty());
        let w = s.input(Tensor::scalar(5.0), false).unwrap();
        assert_eq!(s.value(&w).unwrap().item().unwrap(), 5.0);
    }

    #[test]
    fn value_reads_let_go_of_the_values_no_handle_reaches() {
        let x0 = Tensor::vector(vec![0.25, 0.5, 0.75]);
        let mut s = LinkedSession::<f64>::new();
        s.set_grad_enabled(false);
        let x = s.input(x0.clone(), false).unwrap();
        let held = |s: &LinkedSession<f64>| s.values.iter().filter(|v| v.numel() > 0).count();
        let fresh = |s: &LinkedSession<f64>, id: usize| {
            s.graph().eval(std::slice::from_ref(&x0), &[]).unwrap()[id].clone()
        };
        let mut h = s.exp(&x).unwrap();
        for _ in 0..10 {
            h = s.tanh(&h).unwrap();
        }
        let last = s.value(&h).unwrap();
        // The leaf and the chain's last node: the ten before it went once their reader ran.
        assert_eq!((s.values.len(), held(&s)), (12, 2));
        assert_eq!(last, fresh(&s, 11));
        // Read, then read by a node recorded after the read, then dropped: it goes once that
        // reader is evaluated, which still reads its value.
        let y = s.exp(&h).unwrap();
        s.value(&y).unwrap();
        let z = s.tanh(&y).unwrap();
        drop(y);
        assert_eq!(s.value(&z).unwrap(), fresh(&s, 13));
        assert_eq!((s.values.len(), held(&s)), (14, 3), "x, h and z");
        // A read that evaluates nothing still lets go of what was dropped since.
        drop(h);
        assert_eq!(s.value(&x).unwrap(), x0);
        assert_eq!(held(&s), 2, "x and z");
        assert_eq!(s.value(&z).unwrap(), fresh(&s, 13));
    }

    #[test]
    fn op_method_errors_name_the_rust_method() {
        let mut s = LinkedSession::<f64>::new();
        let x = s.input(Tensor::vector(vec![1.0, 2.0, 3.0]), false).unwrap();
        let e = s
            .broadcast_to(&x, Shape::new(&[2, 4]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("broadcast_to: "), "{e}");
        assert!(e.contains("[3]") && e.contains("[2, 4]"), "{e}");
        s.reset();
        let e = s.exp(&x).unwrap_err();
        assert!(matches!(e, Error::StaleHandle { what: "exp", .. }), "{e}");
        assert!(e.to_string().contains("reset") && !e.to_string().contains("epoch"));
    }
}
