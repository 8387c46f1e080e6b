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
use tl_tape_cpu::{Precision, Tape};

use crate::Tol;

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

    /// The tolerance this backend's results on `graph` are held to: a bound on each id's
    /// error as [`crate::metric`] measures it (`max |got − want| / max(1, max |want|)`,
    /// against the f64 IR run on the backend's own inputs), in every check of
    /// [`crate::user::check_backend`] (and every other check that takes a [`Backend`]).
    /// `tol` is the check's tolerances: the op's registry entry's, [`crate::dag::DAG_TOL`] on
    /// random DAGs, a hard-input family's ([`crate::checks::hard`]), the conventions'
    /// ([`crate::checks::conventions::CONVENTIONS_TOL`]).
    ///
    /// The default is the suite's, the same for every backend: `tol.f64` for an f64 backend,
    /// else `tol.f32` scaled by the graph's longest reduction ([`crate::checks::backend_tol`]:
    /// [`Tol::f32_for`] of [`crate::checks::reduction_len`]). On random DAGs an id's tolerance
    /// is still at least the reference's own f32 error there
    /// ([`crate::checks::reference_floors`]), whatever this returns.
    ///
    /// A backend that computes in less than its element type on purpose (TF32 or bf16
    /// products on tensor cores, an approximate `exp`) states here the precision it means:
    /// wider on the graphs it rounds, for the reason it rounds, with a comment saying why, and
    /// the default everywhere else. A wider tolerance hides every bug smaller than it, so
    /// widen no more than the arithmetic needs; `check_backend`'s report marks each check in
    /// which this was wider than the default ([`crate::user::SuiteReport::widened`]). Like
    /// PyTorch's per-op, per-dtype `toleranceOverride` (`tf32_on_and_off(0.005)`) in its
    /// OpInfo tests.
    ///
    /// A backend whose matrix products read their operands rounded to TF32 (11 significant
    /// bits: a unit roundoff u = 2⁻¹¹ against f32's 2⁻²⁴) widens the graphs that hold one, by
    /// so many u per product a result passes through. The error of one product does not grow
    /// with its length here, since the metric divides by the result's largest magnitude,
    /// which grows as the error does; a backend whose error does (an f16 accumulator) scales
    /// with the length as the default does, with [`Tol::f32_for`] of
    /// [`crate::checks::reduction_len`]. The conformance suite's `tolerance::` module runs
    /// this backend through `check_backend` and says where 16u comes from:
    ///
    /// ```
    /// use tl_conformance::checks::backend_tol;
    /// use tl_conformance::{Backend, TapeProgram, Tol};
    /// use tl_ir::{GraphData, Id, Op};
    /// use tl_spec::Tensor;
    /// use tl_tape_cpu::Precision;
    ///
    /// /// The CPU tape with its matrix products in TF32.
    /// struct Tf32Tape;
    ///
    /// impl Backend for Tf32Tape {
    ///     type T = f32;
    ///     type Program = TapeProgram<f32>;
    ///     fn record(
    ///         &self,
    ///         graph: &GraphData,
    ///         leaves: &[Tensor<f32>],
    ///         nats: &[usize],
    ///     ) -> Result<Self::Program, String> {
    ///         TapeProgram::replay_at(Precision::Tf32, graph, leaves, nats)
    ///     }
    ///     // name, values, backward_dense: the CPU tape's.
    /// #   fn name(&self) -> String {
    /// #       "tf32".into()
    /// #   }
    /// #   fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f32>>, String> {
    /// #       p.values()
    /// #   }
    /// #   fn backward_dense(
    /// #       &self,
    /// #       p: &Self::Program,
    /// #       out: Id,
    /// #       seed: &Tensor<f32>,
    /// #   ) -> Result<Vec<Tensor<f32>>, String> {
    /// #       p.backward_dense(out, seed)
    /// #   }
    ///
    ///     /// TF32 rounds the products' operands: 16 units of its roundoff per product a result
    ///     /// passes through (attention is a chain of 2, with its projections 4), at least the
    ///     /// suite's f32 tolerance.
    ///     fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
    ///         let chain = |op: &Op| match op {
    ///             Op::Matmul | Op::Bmm | Op::Linear => 1.0,
    ///             Op::Conv { .. } | Op::ConvTranspose { .. } => 1.0,
    ///             Op::ScaledDotProductAttention { .. } => 2.0,
    ///             Op::MultiHeadAttention { .. } => 4.0,
    ///             _ => 0.0,
    ///         };
    ///         let products: f64 = graph.nodes().iter().map(|n| chain(n.op())).sum();
    ///         backend_tol::<f32>(tol, graph).max(16.0 * 2f64.powi(-11) * products)
    ///     }
    ///
    ///     /// The products' setting: check_backend then holds each product op to the TF32
    ///     /// reference exactly (`Backend::precision`).
    ///     fn precision(&self) -> Precision {
    ///         Precision::Tf32
    ///     }
    /// }
    /// ```
    fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
        crate::checks::backend_tol::<Self::T>(tol, graph)
    }

    /// The autocast setting the backend's matrix products run at (docs/semantics.md, "Mixed
    /// precision"): [`Precision::F32`], the default, for none. A backend that states
    /// [`Precision::Bf16`] or [`Precision::Tf32`] says its products read their operands
    /// rounded so (bf16 to nearest even, TF32 to nearest with ties away) and sum in f32, and
    /// [`crate::user::check_backend`] then holds every product op it supports (matmul, bmm,
    /// linear, conv, convTranspose) to that exactly: each registry case's value and every
    /// gradient against the op's rules on the rounded operands within the f32 accumulation
    /// bound ([`crate::checks::autocast::check_products`], rows `autocast <setting> <op>
    /// <name>`), however wide [`Backend::tolerance`] is in the other checks. So the widened
    /// tolerance the rounding needs there does not hide a product that is wrong by less. If
    /// it has `scaledDotProductAttention`, the core is held to the spec's autocast reference
    /// too (its products' operands rounded, the probabilities and dS included; within 1e-5 of
    /// the scale but where a rounding flips: [`crate::checks::autocast::check_attention`],
    /// row `autocast <setting> scaledDotProductAttention <name>`).
    fn precision(&self) -> Precision {
        Precision::F32
    }
}

/// `backend` as a [`crate::checks::autocast::TapeRun`]: `op` recorded alone on its operands
/// (cast to the backend's type, none of them index tensors), its value, then every operand's
/// gradient from a dense backward seeded with the cotangent, cast to f32. The precision the
/// check passes must be the backend's own ([`Backend::precision`]).
pub fn run_op<B: Backend>(backend: &B) -> Box<crate::checks::autocast::TapeRun<'_>> {
    Box::new(move |p, op, x, g| {
        if p != backend.precision() {
            return Err(format!(
                "{op} at {}: backend {} states {} (Backend::precision)",
                p.name(),
                backend.name(),
                backend.precision().name()
            ));
        }
        let mut b = tl_ir::GraphBuilder::new();
        let leaves = x
            .iter()
            .map(|t| b.leaf_with(t.shape().clone(), None, true))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let out = b.apply(op.clone(), &leaves).map_err(|e| e.to_string())?;
        let graph = b.finish();
        let xs: Vec<Tensor<B::T>> = x.iter().map(Tensor::cast).collect();
        let program = backend.record(&graph, &xs, &[])?;
        let values = backend.values(&program)?;
        let grads = backend.backward_dense(&program, out, &g.cast())?;
        let mut r = vec![values.get(out).ok_or("no value for the op")?.cast()];
        for &id in &leaves {
            r.push(grads.get(id).ok_or("no gradient for an operand")?.cast());
        }
        Ok(r)
    })
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
        Self::replay_at(Precision::F32, graph, leaves, nats)
    }

    /// [`TapeProgram::replay`] on a tape whose matrix products run at `precision` (autocast:
    /// `tl_tape_cpu::Tape::set_precision`; an f64 tape computes in f64 whatever the setting).
    pub fn replay_at(
        precision: Precision,
        graph: &GraphData,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<Self, String> {
        let mut tape = Tape::new();
        tape.set_precision(precision);
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
