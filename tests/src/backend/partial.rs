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
//!
//! `Partial` forwards everything else to the backend, its [`Backend::tolerance`] included, and
//! notes when that tolerance is wider than the suite's default, for the suite's report to say
//! so ([`crate::user::SuiteReport::widened`]).

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

use tl_ir::{GraphData, Id};
use tl_spec::Tensor;

use crate::checks::backend_tol;
use crate::{Backend, Tol};

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
/// sees it, and noting whether `B` widened a tolerance ([`Partial::take_widened`]).
pub(crate) struct Partial<'a, B> {
    backend: &'a B,
    widened: Cell<bool>,
}

impl<'a, B: Backend> Partial<'a, B> {
    /// `backend`, nothing widened yet.
    pub(crate) fn new(backend: &'a B) -> Self {
        Partial {
            backend,
            widened: Cell::new(false),
        }
    }

    /// Whether [`Backend::tolerance`] returned more than its default since the last call,
    /// clearing it.
    pub(crate) fn take_widened(&self) -> bool {
        self.widened.take()
    }
}

impl<B: Backend> Backend for Partial<'_, B> {
    type T = B::T;
    type Program = B::Program;

    fn name(&self) -> String {
        self.backend.name()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<Self::T>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        if let Some(op) = first_unsupported(self.backend, graph) {
            note(op);
            return Err(format!(
                "{op}: backend {} does not implement it (Backend::supports)",
                self.backend.name()
            ));
        }
        self.backend.record(graph, leaves, nats)
    }

    fn values(&self, program: &Self::Program) -> Result<Vec<Tensor<Self::T>>, String> {
        self.backend.values(program)
    }

    fn backward_dense(
        &self,
        program: &Self::Program,
        out: Id,
        seed: &Tensor<Self::T>,
    ) -> Result<Vec<Tensor<Self::T>>, String> {
        self.backend.backward_dense(program, out, seed)
    }

    fn supports(&self, op: &str) -> bool {
        self.backend.supports(op)
    }

    fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
        let own = self.backend.tolerance(tol, graph);
        if own > backend_tol::<B::T>(tol, graph) {
            self.widened.set(true);
        }
        own
    }

    fn precision(&self) -> tl_tape_cpu::Precision {
        self.backend.precision()
    }
}

#[cfg(test)]
mod tests {
    use tl_ir::{GraphBuilder, GraphData, Id, Op};
    use tl_spec::Tensor;

    use super::Partial;
    use crate::checks::backend_tol;
    use crate::{Backend, CpuTape, TapeProgram, Tol};

    /// The CPU f32 tape, holding itself to twice the suite's tolerance.
    struct Loose;

    impl Backend for Loose {
        type T = f32;
        type Program = TapeProgram<f32>;

        fn name(&self) -> String {
            "loose".into()
        }
        fn record(
            &self,
            graph: &GraphData,
            leaves: &[Tensor<f32>],
            nats: &[usize],
        ) -> Result<TapeProgram<f32>, String> {
            TapeProgram::replay(graph, leaves, nats)
        }
        fn values(&self, p: &TapeProgram<f32>) -> Result<Vec<Tensor<f32>>, String> {
            p.values()
        }
        fn backward_dense(
            &self,
            p: &TapeProgram<f32>,
            out: Id,
            seed: &Tensor<f32>,
        ) -> Result<Vec<Tensor<f32>>, String> {
            p.backward_dense(out, seed)
        }
        fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
            2.0 * backend_tol::<f32>(tol, graph)
        }
    }

    /// A (100, 3)·(3, 2) product: a reduction of 100, so the default scales `Tol::f32`.
    fn product() -> GraphData {
        let mut b = GraphBuilder::new();
        let x = b.leaf([100, 3], None).expect("a leaf");
        let w = b.leaf([3, 2], None).expect("a leaf");
        b.apply(Op::Matmul, &[x, w]).expect("a product");
        b.finish()
    }

    #[test]
    fn partial_forwards_the_backends_tolerance_and_notes_that_it_widened() {
        let graph = product();
        let partial = Partial::new(&Loose);
        let own = partial.tolerance(&Tol::DEFAULT, &graph);
        assert_eq!(own, Loose.tolerance(&Tol::DEFAULT, &graph));
        assert_eq!(own, 2.0 * Tol::DEFAULT.f32_for(100));
        assert!(partial.take_widened());
        assert!(!partial.take_widened(), "taking it clears it");

        let cpu = CpuTape::<f32>::new();
        let plain = Partial::new(&cpu);
        let default = plain.tolerance(&Tol::DEFAULT, &graph);
        assert_eq!(default, Tol::DEFAULT.f32_for(100));
        assert!(!plain.take_widened(), "the default widens nothing");
    }
}
