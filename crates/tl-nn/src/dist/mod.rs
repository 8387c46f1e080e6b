//! Data-parallel training: one process per rank, the same model on each, every rank's shard of
//! each global batch, and the gradients averaged across ranks between the backward and the
//! update. PyTorch: `DistributedDataParallel` with `DistributedSampler`.
//!
//! - [`Collective`]: what the training loop needs from a communication engine (rank, size,
//!   sums and broadcasts of `f32`/`f64` buffers, an all-gather of small records that names a
//!   rank that does not answer). Engines: [`Local`] (one process, identity) and, with the
//!   `mpi` feature, `Mpi` (Open MPI or any MPI-3 library, through the `mpi` crate; started
//!   with `mpirun -np N`), and with the `cuda` (or `cuda-emu`) feature `Nccl` (NCCL on the
//!   GPU, loaded at run time; rendezvous and control messages through a bootstrap engine,
//!   normally `Mpi`).
//! - [`Runtime::data_parallel`] makes a runtime one rank of a group, before its first step (a
//!   runtime that has stepped is refused): it checks that every rank has the same parameter
//!   names and shapes (an error names the first that differs), copies rank 0's parameter
//!   values to every rank, and from then on [`Runtime::step`] (and `train_step`,
//!   `step_accumulated`) averages the gradients across the ranks in buckets before the
//!   optimizer's clipping and update, so every rank takes the same step. The group is tied to
//!   the model it was set up with: a step on a model with a parameter outside it is an error
//!   on every rank. Every step compares the ranks' optimizers (rule, hyper-parameters,
//!   schedule, clipping, steps done; at the group's first step a hash of the state too): ranks
//!   stepping different optimizers fail that step on every rank, naming the first that differs.
//! - [`crate::data::DataLoader::shard`]: each rank's part of each global batch.
//! - Faults: each step starts with an all-gather of every rank's status, so a rank whose
//!   forward or backward failed makes every rank's step fail with an error naming it (no rank
//!   updates); a rank that does not answer within the engine's timeout is an error naming it.
//!   [`Runtime::save`] writes on rank 0 only, and every rank learns whether it succeeded;
//!   [`Runtime::load`] fails on every rank when it fails on one.
//!
//! docs/guide.md "Training on several processes" shows the loop and the `mpirun` command.

mod collective;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod nccl;
pub(crate) mod reduce;
mod status;
mod timeout;

pub use collective::{Collective, Local};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
pub use nccl::Nccl;
pub use reduce::DEFAULT_BUCKET_ELEMS;
pub use timeout::DEFAULT_TIMEOUT;

use std::cell::Cell;
use std::collections::HashSet;

use tl_session::{Optimizer, TensorRef, Train};

use crate::error::usage;
use crate::{Parameters, Result, Runtime};

/// A runtime's place in a data-parallel group ([`Runtime::data_parallel`]).
pub(crate) struct Group {
    comm: Box<dyn Collective>,
    /// The parameters (`Param::index`) of the model the group was set up with: checked alike
    /// on every rank and broadcast from rank 0, so a step may update these and no other.
    params: HashSet<usize>,
    bucket_elems: usize,
    /// Steps taken in the group (each rank's count must agree).
    steps: Cell<u64>,
    /// Whether the open step has exchanged its status (its failure needs no second exchange).
    agreed: Cell<bool>,
}

impl Group {
    /// Every rank's outcome of one collective phase named `what`: `Ok` when all succeeded;
    /// else this rank's own error, or an error naming the first rank that failed.
    fn agree<R>(&self, what: &'static str, mine: Result<R>) -> Result<R> {
        self.agree_layout(what, mine, &[], "")
    }

    /// [`Group::agree`] carrying a step's gradient layout (each buffer's length) and optimizer
    /// ([`status::optimizer_record`]), which must be the same on every rank.
    fn agree_layout<R>(
        &self,
        what: &'static str,
        mine: Result<R>,
        layout: &[u64],
        optimizer: &str,
    ) -> Result<R> {
        let record = status::Status::of(self.steps.get(), &mine, layout, optimizer);
        let all = self.comm.all_gather_bytes(&record.encode())?;
        if all.len() != self.comm.size() {
            return Err(usage(
                what,
                format!(
                    "the engine's all-gather returned {} record(s) for a world of {}",
                    all.len(),
                    self.comm.size()
                ),
            ));
        }
        let statuses = status::decode_all(what, &all)?;
        if mine.is_ok() && statuses.iter().all(|s| s.ok) {
            reduce::check_layout(&statuses)?;
            status::check_optimizers(what, &statuses)?;
        }
        match mine {
            Err(e) => Err(e),
            Ok(r) => match statuses.iter().position(|s| !s.ok) {
                Some(rank) => Err(usage(
                    what,
                    format!(
                        "rank {rank} failed (rank {} of {} stops with it): {}",
                        self.comm.rank(),
                        self.comm.size(),
                        statuses[rank].message
                    ),
                )),
                None => Ok(r),
            },
        }
    }

    /// One data-parallel step after a successful forward pass: backward, the status exchange
    /// and the bucketed gradient mean inside the session's hook (in device memory when the
    /// session is on the CUDA device and the engine reduces there: NCCL), then the update.
    /// `pre` first transforms this rank's gradients on the host (gradient accumulation's
    /// mean over the micro-batches), before the exchange.
    fn step<O: Train>(
        &self,
        session: &mut O,
        loss: &TensorRef,
        opt: &mut Optimizer,
        pre: Option<&mut dyn tl_session::GradReducer<O::T>>,
    ) -> Result<f64> {
        // At the group's first step the optimizer's state is compared too.
        let optimizer = status::optimizer_record(&*session, opt, self.steps.get() == 0);
        let mut hook = StepReducer {
            group: self,
            failure: None,
            pre,
            optimizer,
        };
        // The pass ends with the step (`Runtime::step` resets it next): updates in place.
        let out = session.backward_step_reduced_then_reset(loss, opt, Some(&mut hook));
        match (out, hook.failure) {
            (Ok(l), _) => Ok(l),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
        }
    }

    /// The step's status exchange, carrying the gradient layout (each buffer's length) and
    /// the optimizer's record.
    fn agree_step(&self, layout: Vec<u64>, optimizer: &str) -> Result<()> {
        self.agreed.set(true);
        self.agree_layout("Runtime::step (data-parallel)", Ok(()), &layout, optimizer)
    }
}

/// The gradient hook of a data-parallel step ([`Group::step`]): `pre` (if any), the status
/// exchange, then the mean over the ranks; the first error is kept whole for the caller (the
/// session sees a copy).
struct StepReducer<'g, 'p, T> {
    group: &'g Group,
    failure: Option<crate::Error>,
    pre: Option<&'p mut dyn tl_session::GradReducer<T>>,
    /// The step's optimizer as the ranks compare it ([`status::optimizer_record`]).
    optimizer: String,
}

impl<T> StepReducer<'_, '_, T> {
    fn keep(&mut self, r: Result<()>) -> tl_session::Result<()> {
        r.map_err(|e| {
            let detail = e.to_string();
            self.failure = Some(e);
            tl_session::Error::Usage {
                what: "Runtime::step (data-parallel)",
                detail,
            }
        })
    }
}

impl<T: tl_spec::Scalar> tl_session::GradReducer<T> for StepReducer<'_, '_, T> {
    fn reduce(&mut self, grads: &mut [&mut [T]]) -> tl_session::Result<()> {
        if let Some(pre) = self.pre.as_mut() {
            pre.reduce(grads)?;
        }
        let g = self.group;
        let layout = grads.iter().map(|g| g.len() as u64).collect();
        let r = g
            .agree_step(layout, &self.optimizer)
            .and_then(|()| reduce::mean::<T>(&*g.comm, g.bucket_elems, grads));
        self.keep(r)
    }

    #[cfg(any(feature = "cuda", feature = "cuda-emu"))]
    fn reduce_on_device(
        &mut self,
        dev: &mut tl_tape_cuda::CudaDevice,
        grads: &mut [tl_tape_cuda::Buffer],
    ) -> Option<tl_session::Result<()>> {
        let g = self.group;
        // `pre` works on the host (the micro-batches' sum is there): the host path.
        if !g.comm.reduces_on_device() || self.pre.is_some() {
            return None;
        }
        let layout = grads.iter().map(|g| g.len() as u64).collect();
        let r = g
            .agree_step(layout, &self.optimizer)
            .and_then(|()| reduce::mean_on_device(&*g.comm, g.bucket_elems, dev, grads));
        Some(self.keep(r))
    }
}

impl<O: Train> Runtime<O> {
    /// Make this runtime one rank of the data-parallel group `comm`, for `model`: checks that
    /// every rank's `model` has the same parameters (names, shapes, in order; an error names
    /// the first that differs and the ranks) and copies rank 0's parameter values to every
    /// rank. From then on [`Runtime::step`] averages the gradients across the ranks (buckets of
    /// [`DEFAULT_BUCKET_ELEMS`] elements; [`Runtime::set_bucket_elems`]), [`Runtime::save`]
    /// writes on rank 0 only and every rank's [`Runtime::load`] succeeds or fails together.
    /// Call it on every rank, at the same point, before the first step: a runtime that has
    /// taken a step ([`Runtime::step`], `train_step`, `step_accumulated`) is refused (its
    /// optimizer's state, which this does not copy, may differ across the ranks). PyTorch:
    /// `DistributedDataParallel(model)` (which also broadcasts rank 0's parameters).
    ///
    /// The group is tied to `model`: a later step whose model lists a parameter `model` does
    /// not (one that was neither checked nor broadcast) is an error on every rank, naming the
    /// parameter, and no rank updates. A step on a part of `model` (its head alone, one of two
    /// models trained in turn, set up together) is accepted.
    ///
    /// With [`Local`] (one process) the steps are bit for bit those without a group.
    pub fn data_parallel<M: Parameters + ?Sized>(
        &mut self,
        model: &M,
        comm: Box<dyn Collective>,
    ) -> Result<()> {
        const WHAT: &str = "Runtime::data_parallel";
        if self.group.is_some() {
            return Err(usage(
                WHAT,
                "this runtime is in a data-parallel group already",
            ));
        }
        if self.steps_taken > 0 {
            return Err(usage(
                WHAT,
                format!(
                    "this runtime has taken {} step(s) already: call data_parallel on every rank before the first step (it copies rank 0's parameters, not the optimizers' state, so ranks that stepped apart would stay apart)",
                    self.steps_taken
                ),
            ));
        }
        self.check_listed(WHAT, model)?;
        let (rank, size) = (comm.rank(), comm.size());
        if size == 0 || rank >= size {
            return Err(usage(
                WHAT,
                format!(
                    "the engine reports rank {rank} of a world of {size}: a world has at least one rank, numbered from 0 below its size"
                ),
            ));
        }
        let params = self.named_params_of(model);
        let mut mine = Vec::with_capacity(params.len());
        {
            let s = self.session();
            for (name, p) in &params {
                mine.push(status::ParamSig {
                    name: name.clone(),
                    dims: p.shape().dims().to_vec(),
                    trainable: s.requires_grad(p)?,
                });
            }
        }
        let encoded = status::encode_sigs(comm.size(), <O::T as tl_spec::Scalar>::NAME, &mine);
        let all = comm.all_gather_bytes(&encoded)?;
        if all.len() != size {
            return Err(usage(
                WHAT,
                format!(
                    "the engine's all-gather returned {} record(s) for a world of {size} (one per rank expected)",
                    all.len()
                ),
            ));
        }
        status::check_sigs(rank, &all)?;
        // Rank 0's values everywhere (also when the ranks were seeded alike: a cheap guarantee).
        for (_, p) in &params {
            let mut t = self.value_of(p)?;
            reduce::broadcast(&*comm, t.data_mut())?;
            self.set_value(p, t)?;
        }
        self.group = Some(Group {
            comm,
            params: params.iter().map(|(_, p)| p.index()).collect(),
            bucket_elems: DEFAULT_BUCKET_ELEMS,
            steps: Cell::new(0),
            agreed: Cell::new(false),
        });
        Ok(())
    }

    /// The number of gradient elements all-reduced at a time in a data-parallel step (at
    /// least 1; the default is [`DEFAULT_BUCKET_ELEMS`]). An error outside a group or for 0.
    pub fn set_bucket_elems(&mut self, elems: usize) -> Result<()> {
        match &mut self.group {
            Some(g) if elems > 0 => {
                g.bucket_elems = elems;
                Ok(())
            }
            Some(_) => Err(usage(
                "Runtime::set_bucket_elems",
                "the bucket size must be at least 1, got 0",
            )),
            None => Err(usage(
                "Runtime::set_bucket_elems",
                "not in a data-parallel group (call Runtime::data_parallel first)",
            )),
        }
    }

    /// This process's rank in its data-parallel group (0 without one).
    pub fn rank(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.comm.rank())
    }

    /// The number of ranks in the data-parallel group (1 without one).
    pub fn world_size(&self) -> usize {
        self.group.as_ref().map_or(1, |g| g.comm.size())
    }

    /// The group's engine, for the collectives a loop needs besides the step (a barrier,
    /// an all-gather of a metric); `None` without a group.
    pub fn collective(&self) -> Option<&dyn Collective> {
        self.group.as_ref().map(|g| &*g.comm)
    }

    /// `Ok(())` unless this runtime is in a group and `model` lists a parameter the group was
    /// not set up with ([`Runtime::data_parallel`]'s model): the error of a step (`call`) on
    /// `model`, naming the first such parameter. Checked before the step's pass, so its
    /// failure is told to every rank as a failed forward's is.
    pub(crate) fn check_group_model<M: Parameters + ?Sized>(
        &self,
        call: &'static str,
        model: &M,
    ) -> Result<()> {
        let Some(g) = &self.group else {
            return Ok(());
        };
        let mut outside = None;
        model.visit_params(&mut |p| {
            if outside.is_none() && !g.params.contains(&p.index()) {
                outside = Some(p.clone());
            }
        });
        match outside {
            None => Ok(()),
            Some(p) => Err(usage(
                call,
                format!(
                    "the step's model has parameter {:?} {:?}, which is not in the model this data-parallel group was set up with (Runtime::data_parallel checked and broadcast that model's parameters only): step the model given to data_parallel, or a part of it",
                    self.name_of(&p),
                    p.shape().dims()
                ),
            )),
        }
    }

    /// The step of a runtime in a group, from the forward pass's outcome: the hook's status
    /// exchange when the pass succeeded, else this rank's failure told to every rank. `pre`:
    /// as [`Group::step`] takes it.
    pub(crate) fn dist_backward_step(
        &self,
        forward: Result<TensorRef>,
        opt: &mut Optimizer,
        pre: Option<&mut dyn tl_session::GradReducer<O::T>>,
    ) -> Result<f64> {
        let Some(g) = self.group.as_ref() else {
            return Err(usage("Runtime::step", "not in a data-parallel group"));
        };
        g.agreed.set(false);
        let out = forward.and_then(|loss| g.step(&mut *self.borrow_mut(), &loss, opt, pre));
        let out = match out {
            Err(e) if !g.agreed.get() => g.agree("Runtime::step (data-parallel)", Err::<f64, _>(e)),
            out => out,
        };
        g.steps.set(g.steps.get() + 1);
        out
    }

    /// Every rank's outcome `mine` of a phase all ranks run (a checkpoint's write on rank 0,
    /// its load everywhere), told to every rank: an error on one is an error on all. Without a
    /// group, `mine`.
    pub(crate) fn agree_group<R>(&self, what: &'static str, mine: Result<R>) -> Result<R> {
        match &self.group {
            Some(g) => g.agree(what, mine),
            None => mine,
        }
    }
}
