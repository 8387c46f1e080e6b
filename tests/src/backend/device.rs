//! Two more [`Backend`]s: the CUDA tape on any device ([`OnDevice`], e.g. the kernel
//! emulator's `CudaDevice` under feature `cuda-emu`), and the f64 IR itself ([`IrRef`]: `eval`
//! and `backprop_all`), so that checks written against hand-worked values (the conventions)
//! hold the reference to them too.

use tl_ir::{GraphData, Id};
use tl_spec::Tensor;
use tl_tape_cuda::determinism::set_deterministic_reductions;
use tl_tape_cuda::{CudaTape, Device};

use super::{CudaProgram, SimError};
use crate::Backend;

/// The CUDA tape on a fresh device from `make` for every recorded graph, with deterministic
/// reductions on or off: each call that launches kernels holds
/// [`flag_lock`](crate::checks::sim::flag_lock) and sets the process-wide flag for its
/// duration (it is left on).
pub struct OnDevice<D> {
    name: String,
    make: fn() -> tl_tape_cuda::Result<D>,
    deterministic: bool,
}

impl<D: Device> OnDevice<D> {
    /// The CUDA tape on devices made by `make` in deterministic mode, reported as `name`
    /// (`"cuda-emu"`).
    pub fn new(name: &str, make: fn() -> tl_tape_cuda::Result<D>) -> Self {
        OnDevice {
            name: name.to_owned(),
            make,
            deterministic: true,
        }
    }

    /// The same with deterministic reductions off (the atomic kernels), reported as
    /// `"<name> nondet"`.
    pub fn nondeterministic(name: &str, make: fn() -> tl_tape_cuda::Result<D>) -> Self {
        OnDevice {
            name: format!("{name} nondet"),
            make,
            deterministic: false,
        }
    }

    /// Run `f` with the flag set as this backend runs.
    fn in_mode<R>(&self, f: impl FnOnce() -> R) -> R {
        let _flag = crate::checks::sim::flag_lock();
        set_deterministic_reductions(self.deterministic);
        let r = f();
        set_deterministic_reductions(true);
        r
    }
}

fn msg(e: SimError) -> String {
    e.to_string()
}

impl<D: Device> Backend for OnDevice<D> {
    type T = f32;
    type Program = CudaProgram<D>;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<CudaProgram<D>, String> {
        let device = (self.make)().map_err(|e| format!("{}: {e}", self.name))?;
        self.in_mode(|| CudaProgram::replay(CudaTape::new(device), graph, leaves, nats))
            .map_err(msg)
    }

    fn values(&self, p: &CudaProgram<D>) -> Result<Vec<Tensor<f32>>, String> {
        p.values().map_err(msg)
    }

    fn backward_dense(
        &self,
        p: &CudaProgram<D>,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        self.in_mode(|| p.backward_dense(out, seed)).map_err(msg)
    }
}

/// The pure f64 IR as a backend: `record` runs `GraphData::eval` (so bad leaf values are
/// refused there, as the trait asks of every backend), `values` hands its values back,
/// `backward_dense` is `GraphData::backprop_values` on them.
#[derive(Debug, Clone, Copy, Default)]
pub struct IrRef;

/// What [`IrRef`] records: the graph, the value of every id and the Nat environment.
#[derive(Debug, Clone)]
pub struct IrProgram {
    graph: GraphData,
    values: Vec<Tensor<f64>>,
    nats: Vec<usize>,
}

impl Backend for IrRef {
    type T = f64;
    type Program = IrProgram;

    fn name(&self) -> String {
        "ir".to_owned()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f64>],
        nats: &[usize],
    ) -> Result<IrProgram, String> {
        let values = graph
            .eval(leaves, nats)
            .map_err(|e| format!("IR eval: {e}"))?;
        Ok(IrProgram {
            graph: graph.clone(),
            values,
            nats: nats.to_vec(),
        })
    }

    fn values(&self, p: &IrProgram) -> Result<Vec<Tensor<f64>>, String> {
        Ok(p.values.clone())
    }

    fn backward_dense(
        &self,
        p: &IrProgram,
        out: Id,
        seed: &Tensor<f64>,
    ) -> Result<Vec<Tensor<f64>>, String> {
        p.graph
            .backprop_values(&p.values, &p.nats, out, seed)
            .map_err(|e| format!("IR backprop_all: {e}"))
    }
}
