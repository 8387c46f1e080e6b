//! A backend that implements part of the catalogue ([`Backend::supports`]): how
//! [`crate::user::check_backend`] keeps its checks to the ops the backend has.
//!
//! - A registry op the backend does not support gets no checks (1, 2 and 7); the suite's
//!   report lists it as skipped.
//! - The checks that draw graphs holding several ops (random DAGs, the conventions, the hard
//!   inputs, check 7's DAGs, the oversized graphs) run on `Partial`: its `record` refuses a
//!   graph holding an op the backend does not support, and notes the op on the running
//!   thread; the harness's case loop then draws the case again instead of judging
//!   it, whatever the check made of the refusal, and the check's report lists the op in
//!   [`crate::Report::pending`]. A check whose every case held one is skipped as a whole.

use std::cell::RefCell;
use std::collections::BTreeSet;

use tl_ir::{GraphData, Id};
use tl_spec::Tensor;

use crate::Backend;

thread_local! {
    /// The unsupported ops [`Partial`] refused on this thread since the last [`take`].
    static LACKING: RefCell<BTreeSet<&'static str>> = const { RefCell::new(BTreeSet::new()) };
}

/// Note that the case running on this thread needed `op`, which the backend does not support.
pub(crate) fn note(op: &'static str) {
    LACKING.with(|l| l.borrow_mut().insert(op));
}

/// The ops [`note`]d on this thread since the last call (sorted), clearing them.
fn take() -> Vec<&'static str> {
    LACKING
        .with(|l| std::mem::take(&mut *l.borrow_mut()))
        .into_iter()
        .collect()
}

/// Run one case: `Ok` with what it gave, or `Err` with the unsupported ops the backend was
/// asked for meanwhile (sorted), whatever the case made of the refusal: such a case is not
/// judged.
pub(crate) fn unless_lacking<R>(case: impl FnOnce() -> R) -> Result<R, Vec<&'static str>> {
    take();
    let outcome = case();
    match take() {
        lacks if lacks.is_empty() => Ok(outcome),
        lacks => Err(lacks),
    }
}

/// The first op of `graph` (in node order) that `backend` does not support.
pub fn first_unsupported<B: Backend + ?Sized>(
    backend: &B,
    graph: &GraphData,
) -> Option<&'static str> {
    graph
        .nodes()
        .iter()
        .map(|n| n.op().name())
        .find(|op| !backend.supports(op))
}

/// `B`, refusing (and [`note`]-ing) a graph that holds an op `B` does not support before `B`
/// sees it.
pub(crate) struct Partial<'a, B>(pub &'a B);

impl<B: Backend> Backend for Partial<'_, B> {
    type T = B::T;
    type Program = B::Program;

    fn name(&self) -> String {
        self.0.name()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<Self::T>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        if let Some(op) = first_unsupported(self.0, graph) {
            note(op);
            return Err(format!(
                "{op}: backend {} does not implement it (Backend::supports)",
                self.0.name()
            ));
        }
        self.0.record(graph, leaves, nats)
    }

    fn values(&self, program: &Self::Program) -> Result<Vec<Tensor<Self::T>>, String> {
        self.0.values(program)
    }

    fn backward_dense(
        &self,
        program: &Self::Program,
        out: Id,
        seed: &Tensor<Self::T>,
    ) -> Result<Vec<Tensor<Self::T>>, String> {
        self.0.backward_dense(program, out, seed)
    }

    fn supports(&self, op: &str) -> bool {
        self.0.supports(op)
    }
}
