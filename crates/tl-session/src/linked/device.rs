//! Where a linked session's graph is compiled to, and what stays there between steps.
//!
//! The devices of the CUDA backends are kept between compiles, so a step's buffers come from
//! their pools. Parameters live on that device as resident mirrors (as in the eager session):
//! a compile borrows them as leaves instead of uploading host values, the optimizer updates
//! them in place, and only the loss comes back. The host copy of a parameter is then stale;
//! it is synced when something reads it (a parameter read, a pure evaluation of the graph, a
//! host step, a move to another backend).

use std::collections::{BTreeMap, BTreeSet};

use tl_spec::pool::PoolStats;
use tl_spec::{Scalar, Tensor};
use tl_tape_cuda::{AnyBuffer, Buffer, CudaTape, Device, MemoryUsage, SimDevice, Traffic};

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
use crate::eager::cuda_unavailable;
use crate::grad_reduce::ReduceOn;
use crate::params::ParamStore;
use crate::{Backend, GradReducer, Optimizer, Result};

use super::{Compiled, CompiledTape, LinkedSession};

/// Devices kept between the compiles of [`Train`](crate::Train) steps and reads.
#[derive(Default)]
pub(super) struct Devices {
    pub(super) sim: Option<SimDevice>,
    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    pub(super) cuda: Option<tl_tape_cuda::CudaDevice>,
}

/// Run `$body` with `$d` bound to the kept device of `$backend` (`&Option<D>`, or
/// `&mut Option<D>` with `dev(mut d)`), or `$cpu` on the CPU backend (and on CUDA in a build
/// without it).
macro_rules! on_device {
    ($devices:expr, $backend:expr, cpu => $cpu:expr, dev(mut $d:ident) => $body:expr $(,)?) => {
        on_device!(@ $devices, $backend, $cpu, $d, $body, mut)
    };
    ($devices:expr, $backend:expr, cpu => $cpu:expr, dev($d:ident) => $body:expr $(,)?) => {
        on_device!(@ $devices, $backend, $cpu, $d, $body,)
    };
    (@ $devices:expr, $backend:expr, $cpu:expr, $d:ident, $body:expr, $($m:tt)?) => {
        match $backend {
            Backend::Cpu => $cpu,
            Backend::CudaSim => {
                let $d = &$($m)? $devices.sim;
                $body
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Backend::Cuda => {
                let $d = &$($m)? $devices.cuda;
                $body
            }
            #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
            Backend::Cuda => $cpu,
        }
    };
}
pub(super) use on_device;

/// Record the graph's leaves and nodes onto a CUDA tape on `dev`: parameter leaves as their
/// resident mirrors when `resident`, other leaves uploaded from their host values; `wrap`
/// names the compiled tape's variant. A failed replay puts the device back into `slot`, so it
/// (and the mirrors on it) is kept.
fn replay_cuda<T: Scalar, D: Device>(
    s: &mut LinkedSession<T>,
    dev: D,
    resident: bool,
    dead: Dead,
    slot: &mut Option<D>,
    wrap: fn(CudaTape<D>) -> CompiledTape<T>,
) -> Result<Compiled<T>> {
    let (tape, map) = replay_cuda_leaves(s, dev, resident, dead);
    match map {
        Ok(map) => Ok(Compiled {
            tape: wrap(tape),
            map,
        }),
        Err(e) => {
            *slot = Some(tape.into_device());
            Err(e)
        }
    }
}

/// [`replay_cuda`]'s replay; the tape comes back whatever the outcome.
fn replay_cuda_leaves<T: Scalar, D: Device>(
    s: &mut LinkedSession<T>,
    dev: D,
    resident: bool,
    dead: Dead,
) -> (CudaTape<D>, Result<Vec<usize>>) {
    let mut tape = CudaTape::new(dev);
    tape.set_nats(s.nats.values.clone());
    tape.set_precision(s.precision);
    let g = s.builder.graph();
    let mut leaves = Vec::with_capacity(g.leaves().len());
    for (id, (leaf, value)) in g.leaves().iter().zip(&s.leaves).enumerate() {
        let (name, rg) = (leaf.name.as_deref(), leaf.requires_grad);
        let t = match s.leaf_param.get(&id) {
            // Updated on the device since it was recorded: the mirror it was recorded with.
            Some(index) if resident && s.pinned.contains_key(index) => {
                Ok(tape.leaf_borrowed(s.pinned[index].clone(), name, rg))
            }
            Some(&index) if resident && !s.written.contains(&index) => s
                .params
                .mirror(index, tape.device_mut())
                .map(|m| tape.leaf_borrowed(m, name, rg)),
            _ => tape.upload_leaf(value, name, rg).map_err(Into::into),
        };
        match t {
            Ok(t) => leaves.push(t),
            Err(e) => return (tape, Err(e)),
        }
    }
    let map = replay_nodes::<T, _>(g, &mut tape, leaves, dead);
    (tape, map)
}

/// Which graph ids no handle refers to any more, for a compile that frees their values once
/// read ([`GraphData::replay_more_releasing`]); `None` keeps every value.
pub(super) type Dead<'a> = Option<&'a dyn Fn(usize) -> bool>;

/// Record the graph's nodes onto `rec`, whose leaves have the recorder ids `map`; releasing
/// what `dead` names once read. Returns each graph id's recorder id.
fn replay_nodes<T: Scalar, R: tl_ir::Recorder<T>>(
    g: &tl_ir::GraphData,
    rec: &mut R,
    mut map: Vec<usize>,
    dead: Dead,
) -> Result<Vec<usize>>
where
    crate::Error: From<R::Error>,
{
    match dead {
        // A fresh replay: every dead node is offered as its last reader runs.
        Some(dead) => g.replay_more_releasing(rec, &mut map, dead, &[])?,
        None => map = g.replay_nodes(rec, map)?,
    }
    Ok(map)
}

impl<T: Scalar> LinkedSession<T> {
    /// Replay the graph onto `backend`'s kept device (made on first use), parameters as
    /// resident mirrors. The device comes back through [`recycle`](Self::recycle); on a
    /// failed replay it is kept here.
    pub(crate) fn compile_reusing(&mut self, backend: Backend, dead: Dead) -> Result<Compiled<T>> {
        let mut devices = std::mem::take(&mut self.devices);
        let compiled = self.compile_onto(backend, &mut devices, true, dead);
        self.devices = devices;
        compiled
    }

    /// Replay onto the devices in `devices` (taken from there; a failed replay puts its
    /// device back), parameters as resident mirrors when `resident`.
    pub(super) fn compile_onto(
        &mut self,
        backend: Backend,
        devices: &mut Devices,
        resident: bool,
        dead: Dead,
    ) -> Result<Compiled<T>> {
        match backend {
            Backend::Cpu => {
                // The last step's tape (cleared by `recycle`): its kernels draw from that
                // step's buffers. A failed replay keeps it, cleared, for the next compile.
                let mut tape = self.cpu_tape.take().unwrap_or_default();
                tape.set_precision(self.precision);
                let g = self.builder.graph();
                let replayed = g
                    .replay_leaves(&mut tape, &self.leaves, &self.nats.values)
                    .map_err(Into::into)
                    .and_then(|leaves| replay_nodes(g, &mut tape, leaves, dead));
                match replayed {
                    Ok(map) => Ok(Compiled {
                        tape: CompiledTape::Cpu(tape),
                        map,
                    }),
                    Err(e) => {
                        tape.clear();
                        self.cpu_tape = Some(tape);
                        Err(e)
                    }
                }
            }
            Backend::CudaSim => {
                let mut dev = devices.sim.take().unwrap_or_default();
                dev.set_flash_products(self.flash_products);
                replay_cuda(
                    self,
                    dev,
                    resident,
                    dead,
                    &mut devices.sim,
                    CompiledTape::CudaSim,
                )
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Backend::Cuda => {
                let mut dev = match devices.cuda.take() {
                    Some(dev) => dev,
                    None => crate::eager::cuda_device(self.deterministic)?,
                };
                dev.set_flash_products(self.flash_products);
                replay_cuda(
                    self,
                    dev,
                    resident,
                    dead,
                    &mut devices.cuda,
                    CompiledTape::Cuda,
                )
            }
            #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
            Backend::Cuda => {
                let _ = (devices, resident, dead);
                Err(cuda_unavailable())
            }
        }
    }

    /// The current pass's compiled tape extended by the nodes recorded since it was made
    /// ([`GraphData::replay_more`](tl_ir::GraphData::replay_more)), or, without one (or for
    /// another backend), a compile onto `backend`'s kept device. Hand it back with
    /// [`keep_pass`](Self::keep_pass) (a read) or [`recycle`](Self::recycle) (a step).
    ///
    /// Values no handle refers to any more are freed once their last reader has run (the
    /// tape keeps what a backward may read): a pass read without gradients holds only what
    /// its handles and pending readers need.
    pub(crate) fn compile_pass(&mut self, backend: Backend) -> Result<Compiled<T>> {
        let (dead, dropped) = self.take_dead();
        let is_dead = |id: usize| dead.get(id).copied().unwrap_or(false);
        let out = self.compile_pass_releasing(backend, &is_dead, &dropped);
        self.keep_dead(dead);
        out
    }

    /// [`compile_pass`](Self::compile_pass) with the handles' liveness: `dead` (graph id →
    /// its last handle was dropped) and the ids `dropped` since the last compile.
    fn compile_pass_releasing(
        &mut self,
        backend: Backend,
        dead: &dyn Fn(usize) -> bool,
        dropped: &[usize],
    ) -> Result<Compiled<T>> {
        let Some(mut c) = self.pass.take() else {
            return self.compile_reusing(backend, Some(dead));
        };
        if c.backend() != backend {
            self.recycle(c);
            return self.compile_reusing(backend, Some(dead));
        }
        let g = self.builder.graph();
        let more: Result<()> = match &mut c.tape {
            CompiledTape::Cpu(t) => g
                .replay_more_releasing::<T, _>(t, &mut c.map, dead, dropped)
                .map_err(Into::into),
            CompiledTape::CudaSim(t) => g
                .replay_more_releasing::<T, _>(t, &mut c.map, dead, dropped)
                .map_err(Into::into),
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            CompiledTape::Cuda(t) => g
                .replay_more_releasing::<T, _>(t, &mut c.map, dead, dropped)
                .map_err(Into::into),
        };
        match more {
            Ok(()) => Ok(c),
            Err(e) => {
                self.recycle(c);
                Err(e)
            }
        }
    }

    /// Keep `compiled` as the current pass's tape ([`compile_pass`](Self::compile_pass)).
    pub(crate) fn keep_pass(&mut self, compiled: Compiled<T>) {
        self.end_pass();
        self.pass = Some(compiled);
    }

    /// Hand the current pass's compiled tape (if any) back: its device to the kept devices.
    pub(super) fn end_pass(&mut self) {
        self.dropped_for_pass.clear();
        if let Some(c) = self.pass.take() {
            self.recycle(c);
            self.release_retired();
        }
    }

    /// Make the current backend's kept device if there is none yet.
    pub(super) fn ensure_device(&mut self) -> Result<()> {
        self.end_pass();
        match self.backend {
            Backend::Cpu => {}
            Backend::CudaSim => {
                self.devices.sim.get_or_insert_with(SimDevice::default);
            }
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Backend::Cuda => {
                if self.devices.cuda.is_none() {
                    self.devices.cuda = Some(crate::eager::cuda_device(self.deterministic)?);
                }
            }
            #[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
            Backend::Cuda => return Err(cuda_unavailable()),
        }
        Ok(())
    }

    /// Hand a compiled tape's device (a CPU tape: the tape and its buffers) back for the next
    /// [`compile_reusing`](Self::compile_reusing).
    pub(crate) fn recycle(&mut self, compiled: Compiled<T>) {
        match compiled.tape {
            CompiledTape::Cpu(mut t) => {
                // Its values go to its pool now, not at the next compile (nothing reads them).
                t.clear();
                self.cpu_tape = Some(t);
            }
            CompiledTape::CudaSim(t) => self.devices.sim = Some(t.into_device()),
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            CompiledTape::Cuda(t) => self.devices.cuda = Some(t.into_device()),
        }
    }

    /// The allocator counters of the device the steps of the current backend compile onto
    /// (kept between steps); `None` on the CPU or before the first step or read.
    pub fn memory_usage(&self) -> Option<MemoryUsage> {
        self.device_counters().map(|(m, _)| m)
    }

    /// The CPU tape's buffer pool: buffers reused and missed, the bytes it holds now and the
    /// most it has held (between steps it holds the last step's buffers, which the next step's
    /// kernels reuse); `None` on another backend or before the first step.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        match self.pass.as_ref().map(|c| &c.tape) {
            Some(CompiledTape::Cpu(t)) => Some(t.pool_stats()),
            _ => self.cpu_tape.as_ref().map(|t| t.pool_stats()),
        }
    }

    /// The kernel launches and host↔device copies of that same device
    /// ([`memory_usage`](Self::memory_usage)'s); `None` likewise.
    pub fn traffic(&self) -> Option<Traffic> {
        self.device_counters().map(|(_, t)| t)
    }

    /// [`Train::release_device_buffers`](crate::Train::release_device_buffers): each of
    /// `bufs` that the device the steps compile onto holds goes back to its pool (the pass's
    /// compiled tape holds that device during a pass).
    pub(crate) fn release_device_buffers(&mut self, bufs: &[tl_tape_cuda::Buffer]) {
        fn release<D: Device>(d: Option<&mut D>, bufs: &[tl_tape_cuda::Buffer]) {
            if let Some(d) = d {
                for &b in bufs {
                    d.release(b);
                }
            }
        }
        match self.pass.as_mut().map(|c| &mut c.tape) {
            Some(CompiledTape::CudaSim(t)) => return release(Some(t.device_mut()), bufs),
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Some(CompiledTape::Cuda(t)) => return release(Some(t.device_mut()), bufs),
            _ => {}
        }
        on_device!(self.devices, self.backend,
            cpu => {},
            dev(mut d) => release(d.as_mut(), bufs),
        )
    }

    fn device_counters(&self) -> Option<(MemoryUsage, Traffic)> {
        fn read<D: Device>(d: Option<&D>) -> Option<(MemoryUsage, Traffic)> {
            d.map(|d| (d.memory_usage(), d.traffic()))
        }
        // During a pass the kept device is in the pass's compiled tape.
        match self.pass.as_ref().map(|c| &c.tape) {
            Some(CompiledTape::CudaSim(t)) => return read(Some(t.device())),
            #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
            Some(CompiledTape::Cuda(t)) => return read(Some(t.device())),
            _ => {}
        }
        on_device!(self.devices, self.backend, cpu => None, dev(d) => read(d.as_ref()))
    }

    /// Parameter `index`'s host value made current (downloaded from the resident mirror when
    /// a device step changed it).
    pub(super) fn sync_param(&mut self, index: usize) -> Result<()> {
        if !self.params.slots[index].host_stale {
            return Ok(());
        }
        // The download needs the kept device, which a pass's tape holds.
        self.end_pass();
        let params = &mut self.params;
        on_device!(self.devices, self.backend,
            cpu => params.sync::<SimDevice>(index, None),
            dev(d) => params.sync(index, d.as_ref()),
        )
    }

    /// Make the recorded parameter leaves' host values current (the pure evaluations, the
    /// host step and a move to another backend read them).
    pub(super) fn sync_leaves(&mut self) -> Result<()> {
        if !self.leaves_stale {
            return Ok(());
        }
        let params: BTreeSet<usize> = self.leaf_param.values().copied().collect();
        for index in params {
            self.sync_param_leaves(index)?;
        }
        self.leaves_stale = false;
        self.clear_values();
        Ok(())
    }

    /// [`sync_leaves`](Self::sync_leaves) for the leaves of parameter `index` only: each holds
    /// the value it was recorded with afterwards. A leaf recorded with a host value older than
    /// the device mirror gets the mirror's value: the pinned one if the parameter was updated
    /// on the device since, else the parameter's (synced). A leaf written from the host since
    /// keeps its value. Nothing is downloaded unless some leaf was recorded stale.
    pub(super) fn sync_param_leaves(&mut self, index: usize) -> Result<()> {
        if !self.leaves_stale || self.written.contains(&index) {
            return Ok(());
        }
        let leaves: Vec<usize> = (self.leaf_param.iter())
            .filter(|&(_, &i)| i == index)
            .map(|(&l, _)| l)
            .collect();
        if leaves.is_empty() {
            return Ok(());
        }
        let value = match self.pinned.get(&index).cloned() {
            Some(b) => self.download_kept(&b)?,
            None => {
                self.sync_param(index)?;
                self.params.slots[index].host.clone()
            }
        };
        for leaf in leaves {
            self.leaves[leaf] = value.clone();
        }
        self.clear_values();
        Ok(())
    }

    /// The value of a buffer of the current backend's kept device (the pass ends: its tape
    /// holds the device).
    fn download_kept(&mut self, b: &AnyBuffer) -> Result<Tensor<T>> {
        self.end_pass();
        fn read<T: Scalar, D: Device>(d: Option<&D>, b: &AnyBuffer) -> Result<Tensor<T>> {
            match d {
                Some(d) => Ok(b.download(d)?),
                None => Err(crate::Error::Usage {
                    what: "param_value",
                    detail: "a device buffer of this graph is kept but no device is attached"
                        .into(),
                }),
            }
        }
        on_device!(self.devices, self.backend,
            cpu => read::<T, SimDevice>(None, b),
            dev(d) => read(d.as_ref(), b),
        )
    }

    /// Bring every parameter home from the current backend's device (synced, mirrors
    /// released): before the session compiles onto another one.
    pub(super) fn unload_params(&mut self) -> Result<()> {
        self.end_pass();
        self.sync_leaves()?;
        // The leaves now hold the pinned mirrors' values: compiles on the next device upload
        // them, as for a host write.
        for (index, b) in self.pinned.drain() {
            self.written.insert(index);
            self.params.retired.push(b.buffer());
        }
        let params = &mut self.params;
        on_device!(self.devices, self.backend,
            cpu => Ok(()),
            dev(mut d) => match d.as_mut() {
                Some(d) => params.unload(d),
                None => Ok(()),
            },
        )
    }

    /// Release the mirrors a host write retired, on the current backend's device (during a
    /// pass: when it ends).
    pub(super) fn release_retired(&mut self) {
        if self.pass.is_some() {
            // The kept device is in the pass's tape: released when the pass ends.
            return;
        }
        let params = &mut self.params;
        on_device!(self.devices, self.backend,
            cpu => {},
            dev(mut d) => if let Some(d) = d.as_mut() {
                params.release_retired(d);
            },
        )
    }

    /// For each trainable parameter used in this graph, its leaves in leaf order (a parameter
    /// used twice gets the sum of both leaves' gradients), by parameter index.
    pub(crate) fn trainable_uses(&self) -> BTreeMap<usize, Vec<usize>> {
        let mut by_param: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (&leaf, &index) in &self.leaf_param {
            if self.params.slots[index].requires_grad {
                by_param.entry(index).or_default().push(leaf);
            }
        }
        by_param.values_mut().for_each(|l| l.sort_unstable());
        by_param
    }
}

/// One training step on a compiled CUDA tape: the loss (tape id `to`) is read back (the step's
/// only download), gradients flow to the trainable parameter leaves only (`uses`: each
/// parameter's leaves as tape ids), `reduce` (a data-parallel group's mean) sees them, and
/// `opt` updates each parameter's resident mirror on the device. With `ends_pass` the
/// backward lets go of each value as it passes it
/// ([`CudaTape::backward_params_releasing`]).
pub(crate) fn step_on_tape<T: Scalar, D: ReduceOn>(
    params: &mut ParamStore<T>,
    uses: &BTreeMap<usize, Vec<usize>>,
    tape: &mut CudaTape<D>,
    to: usize,
    opt: &mut Optimizer,
    reduce: Option<&mut dyn GradReducer<T>>,
    ends_pass: bool,
) -> Result<Tensor<T>> {
    let value: Tensor<T> = tape.read(to)?;
    // A non-finite loss stops here when the optimizer asks for it, before the backward.
    opt.observe_loss(value.item()?.as_f64())?;
    let wanted: Vec<usize> = uses.values().flatten().copied().collect();
    // The 1 of a scalar loss is filled on the device and becomes the loss's gradient slot.
    let seed = AnyBuffer::upload_or_fill(tape.device_mut(), &Tensor::scalar(T::one()))?;
    let mut grads = match ends_pass {
        true => tape.backward_params_releasing(to, seed, &wanted)?,
        false => tape.backward_params_owned(to, seed, &wanted)?,
    };
    // The group's mean before the clipping and the update (an error changes nothing).
    let reduced = match reduce {
        Some(reduce) => tape.device_mut().reduce_grads(&mut grads, &wanted, reduce),
        None => Ok(()),
    };
    let r = reduced.and_then(|()| {
        let items = uses
            .iter()
            .map(|(&index, leaves)| {
                let gs = leaves.iter().map(|&l| grads[&l].buffer()).collect();
                (index, gs)
            })
            .collect::<Vec<(usize, Vec<Buffer>)>>();
        params.step_all_on_device(tape.device_mut(), opt, &items)
    });
    tape.release_grad_map(grads);
    r.map(|()| value)
}
