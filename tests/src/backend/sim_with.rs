//! [`SimWith`]: the CUDA sim backend with one thing changed, for tests that need a sim whose
//! recording differs from [`CudaSim`]'s in a controlled way (an op made pending, a deliberately
//! wrong formula). Everything else — values, dense backward, pending bookkeeping, tolerance — is
//! [`CudaSim`]'s, which the wrapper also hands to the sim checks (`AsRef<CudaSim>`).

use std::cell::RefCell;

use tl_ir::{GraphData, Id, Op, Recorder};
use tl_spec::Tensor;
use tl_tape_cuda::{CudaTape, Error, SimDevice};

use super::{CudaSim, SimError, SimProgram};
use crate::{Backend, Tol};

/// The sim backend named `name`, whose graphs are recorded op by op through `hook(tape, op,
/// args)` instead of `tape.apply(op, args)`; leaves and the Nat environment are recorded as
/// the tape records them. `hook` may forward to `tape.apply`, record something else, or fail
/// (`Error::Unsupported` makes the op pending, as a missing CUDA formula does).
pub struct SimWith<F> {
    sim: CudaSim,
    name: &'static str,
    hook: F,
}

impl<F> SimWith<F>
where
    F: Fn(&mut CudaTape<SimDevice>, &Op, &[usize]) -> Result<usize, Error>,
{
    /// The sim with `hook` recording each op (see [`SimWith`]).
    pub fn new(name: &'static str, hook: F) -> Self {
        SimWith {
            sim: CudaSim::new(),
            name,
            hook,
        }
    }
}

impl<F> AsRef<CudaSim> for SimWith<F> {
    fn as_ref(&self) -> &CudaSim {
        &self.sim
    }
}

/// Records on `tape`, each op through `hook`.
struct HookRecorder<'a, F> {
    tape: &'a mut CudaTape<SimDevice>,
    hook: &'a F,
}

impl<F> Recorder<f32> for HookRecorder<'_, F>
where
    F: Fn(&mut CudaTape<SimDevice>, &Op, &[usize]) -> Result<usize, Error>,
{
    type Error = Error;
    fn leaf(&mut self, v: Tensor<f32>, name: Option<&str>, rg: bool) -> Result<usize, Error> {
        self.tape.upload_leaf(&v, name, rg)
    }
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Error> {
        (self.hook)(self.tape, op, args)
    }
    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Error> {
        self.tape.set_nats(nats.to_vec());
        Ok(())
    }
}

impl<F> Backend for SimWith<F>
where
    F: Fn(&mut CudaTape<SimDevice>, &Op, &[usize]) -> Result<usize, Error>,
{
    type T = f32;
    type Program = SimProgram;
    fn name(&self) -> String {
        self.name.into()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<SimProgram, String> {
        let mut tape = CudaTape::new(SimDevice::new());
        let mut rec = HookRecorder {
            tape: &mut tape,
            hook: &self.hook,
        };
        let r = graph
            .replay(&mut rec, leaves, nats)
            .map_err(|e| SimError::from_tape("replay", e))
            .map(|map| SimProgram {
                tape: RefCell::new(tape),
                map,
            });
        self.sim.note(r)
    }
    fn values(&self, p: &SimProgram) -> Result<Vec<Tensor<f32>>, String> {
        self.sim.values(p)
    }
    fn backward_dense(
        &self,
        p: &SimProgram,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.sim.backward_dense(p, out, seed)
    }
    fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
        self.sim.tolerance(tol, graph)
    }
}
