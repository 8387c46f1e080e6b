//! The backend abstraction checks 1 and 2 run against: "record this graph with these leaf
//! values, give me every id's value" and "dense backward from an output". Implemented here for
//! the CPU tape in f32 and f64, for the CUDA tape over the simulation device ([`CudaSim`], in
//! [`cuda_sim`]) or any other device ([`OnDevice`], in [`device`]: the kernel emulator), and
//! for the f64 IR itself ([`IrRef`]); any wrapper a test builds (such as the deliberately
//! broken ones in the conformance binary's `teeth` module) implements it the same way, or,
//! over the sim, is a [`SimWith`] ([`sim_with`]) with a hook for what it changes. [`TapeApi`]
//! ([`api`]) adds the rest of the tape API: `backward_dense_from`, `backward_first_n`,
//! `backward_params`. A backend that implements part of the catalogue says which ops with
//! [`Backend::supports`] ([`partial`]: how the suite then skips the rest).

pub mod api;
pub mod cuda_sim;
pub mod device;
pub mod partial;
pub mod sim_with;

pub use api::TapeApi;
pub use cuda_sim::{CudaProgram, CudaSim, SimError, SimProgram};
pub use device::{IrProgram, IrRef, OnDevice};
pub use sim_with::SimWith;

use std::marker::PhantomData;

use tl_ir::{GraphData, Id};
use tl_spec::{Scalar, Tensor};
use tl_tape_cpu::Tape;

/// A runtime that can execute a recorded [`GraphData`] and differentiate it.
///
/// Results are indexed by **graph** id (leaves first, then nodes), whatever ids the backend uses
/// internally.
pub trait Backend {
    /// The element type the backend computes in.
    type T: Scalar;
    /// The backend's recorded program (e.g. a tape plus the graph-id → tape-id map).
    type Program;

    /// A short name for reports (`"cpu-f64"`).
    fn name(&self) -> String;

    /// Record ("compile") `graph` with `leaves` (one per graph leaf, in order) and the Nat
    /// environment `nats`, and run it forward.
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<Self::T>],
        nats: &[usize],
    ) -> Result<Self::Program, String>;

    /// The forward value of every graph id.
    fn values(&self, program: &Self::Program) -> Result<Vec<Tensor<Self::T>>, String>;

    /// Dense gradients of graph id `out` with cotangent `seed`, for every graph id.
    fn backward_dense(
        &self,
        program: &Self::Program,
        out: Id,
        seed: &Tensor<Self::T>,
    ) -> Result<Vec<Tensor<Self::T>>, String>;

    /// Whether this backend implements the op named `op`, as [`tl_ir::Op::name`] spells it
    /// (`"add"`, `"conv2d"`, a user op's name): every op unless the backend says otherwise. A
    /// backend under construction lists what it has so far: [`crate::user::check_backend`]
    /// then skips the checks of each op it lacks and draws again every random case that holds
    /// one, and says so in its report ([`partial`]), instead of failing those cells. Like
    /// PyTorch's per-device `skips` in its OpInfo tests, it is a statement of scope, not a
    /// verdict: an op listed here as supported is held to every check.
    fn supports(&self, op: &str) -> bool {
        let _ = op;
        true
    }
}

/// The CPU tape (`tl_tape_cpu::Tape<T>`), compiled into by `GraphData::replay`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTape<T>(PhantomData<T>);

impl<T: Scalar> CpuTape<T> {
    /// The CPU tape backend in `T`.
    pub fn new() -> Self {
        CpuTape(PhantomData)
    }
}

/// A recorded tape and, for each graph id, the id it received on the tape.
#[derive(Debug, Clone)]
pub struct TapeProgram<T: Scalar> {
    /// The tape.
    pub tape: Tape<T>,
    /// Graph id → tape id.
    pub map: Vec<usize>,
}

impl<T: Scalar> TapeProgram<T> {
    /// Record `graph` into a fresh tape through `GraphData::replay`.
    pub fn replay(graph: &GraphData, leaves: &[Tensor<T>], nats: &[usize]) -> Result<Self, String> {
        let mut tape = Tape::new();
        let map = graph
            .replay(&mut tape, leaves, nats)
            .map_err(|e| format!("replay into the CPU tape failed: {e}"))?;
        Ok(TapeProgram { tape, map })
    }

    /// Every graph id's value, read back from the tape.
    pub fn values(&self) -> Result<Vec<Tensor<T>>, String> {
        self.map
            .iter()
            .map(|&t| self.tape.get(t).cloned().map_err(|e| e.to_string()))
            .collect()
    }

    /// Dense backward on the tape, re-indexed by graph id.
    pub fn backward_dense(&self, out: Id, seed: &Tensor<T>) -> Result<Vec<Tensor<T>>, String> {
        let &tape_out = self
            .map
            .get(out)
            .ok_or_else(|| format!("graph id {out} was not recorded"))?;
        let grads = self
            .tape
            .backward_dense(tape_out, seed)
            .map_err(|e| format!("tape backward_dense failed: {e}"))?;
        self.map
            .iter()
            .map(|&t| {
                grads
                    .get(t)
                    .cloned()
                    .ok_or_else(|| format!("tape returned no gradient for tape id {t}"))
            })
            .collect()
    }
}

impl<T: Scalar> Backend for CpuTape<T> {
    type T = T;
    type Program = TapeProgram<T>;

    fn name(&self) -> String {
        format!("cpu-{}", T::NAME)
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<TapeProgram<T>, String> {
        TapeProgram::replay(graph, leaves, nats)
    }

    fn values(&self, program: &TapeProgram<T>) -> Result<Vec<Tensor<T>>, String> {
        program.values()
    }

    fn backward_dense(
        &self,
        program: &TapeProgram<T>,
        out: Id,
        seed: &Tensor<T>,
    ) -> Result<Vec<Tensor<T>>, String> {
        program.backward_dense(out, seed)
    }
}
