//! Sizes past the kernels' grid limits ([`tl_conformance::checks::grid`]): one case per
//! reduction, scatter and conv family above 2¹⁸ elements and above one grid's worth of blocks,
//! the sim against the CPU f32 tape and deterministic across runs (the emulated kernels run
//! them in the `cuda_emu` module), and a user's backend through `check_backend`.

use tl_conformance::checks::grid::{
    GRID_N, ONE_GRID, check_grid_deterministic, check_grid_sim_vs_cpu, grid_cases,
};
use tl_conformance::user::check_backend;
use tl_conformance::{Backend, CpuTape, RunConfig, TapeProgram};
use tl_ir::{GraphData, Id, Op};
use tl_spec::Tensor;

#[test]
fn every_grid_case_has_an_operand_or_output_past_one_grid() {
    let cases = grid_cases();
    let names: Vec<&str> = cases.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "sum",
            "mseLoss",
            "reduceMean",
            "logSoftmax",
            "gather",
            "conv"
        ]
    );
    for (name, c) in &cases {
        let largest = (0..c.graph.len())
            .map(|id| c.graph.shape(id).unwrap().numel())
            .max()
            .unwrap();
        // More elements than one grid's 1024 blocks of 256 threads cover in one pass.
        assert!(largest > ONE_GRID, "{name}: {largest}");
        assert!(largest.div_ceil(256) > 1024, "{name}");
    }
    const { assert!(GRID_N > 1 << 18) };
}

#[test]
fn past_one_grid_the_sim_matches_the_cpu_and_is_deterministic() {
    let n = grid_cases().len() as u32;
    let reports = [check_grid_sim_vs_cpu(), check_grid_deterministic()];
    tl_conformance::assert_all_passed(&reports, n);
}

/// A user's backend whose kernels go over only the first grid's worth of elements (a grid-stride
/// loop that does not loop): the CPU f32 tape, except that a `sum` of more than [`ONE_GRID`]
/// elements adds up the first [`ONE_GRID`] (`values`), or its backward leaves the gradient past
/// them at 0 (`grads`). Every case of the registry and of the random DAGs is far smaller, so
/// only `check_backend`'s grid check can see it.
struct OneGridPass {
    inner: CpuTape<f32>,
    values: bool,
    grads: bool,
}

/// The ids of `graph`'s `sum` nodes over more than [`ONE_GRID`] elements, with their operand.
fn long_sums(graph: &GraphData) -> Vec<(Id, Id)> {
    let first = graph.leaves().len();
    (graph.nodes().iter().enumerate())
        .filter(|(_, n)| *n.op() == Op::Sum)
        .filter_map(|(k, n)| {
            let x = *n.args().first()?;
            (graph.shape(x).ok()?.numel() > ONE_GRID).then_some((first + k, x))
        })
        .collect()
}

impl Backend for OneGridPass {
    type T = f32;
    type Program = (TapeProgram<f32>, GraphData);

    fn name(&self) -> String {
        "one-grid-pass".into()
    }
    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        Ok((self.inner.record(graph, leaves, nats)?, graph.clone()))
    }
    fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f32>>, String> {
        let mut v = self.inner.values(&p.0)?;
        if self.values {
            for (id, x) in long_sums(&p.1) {
                let s: f32 = v[x].data()[..ONE_GRID].iter().sum();
                v[id] = Tensor::scalar(s);
            }
        }
        Ok(v)
    }
    fn backward_dense(
        &self,
        p: &Self::Program,
        out: Id,
        seed: &Tensor<f32>,
    ) -> Result<Vec<Tensor<f32>>, String> {
        let mut g = self.inner.backward_dense(&p.0, out, seed)?;
        if self.grads {
            for (_, x) in long_sums(&p.1) {
                let n = g[x].numel();
                g[x] = Tensor::new(
                    g[x].shape().clone(),
                    (0..n)
                        .map(|i| if i < ONE_GRID { g[x].data()[i] } else { 0.0 })
                        .collect(),
                )
                .map_err(|e| e.to_string())?;
            }
        }
        Ok(g)
    }
}

/// `check_backend` reaches sizes past one grid: a backend that sums only the first grid's worth
/// of elements, or leaves the gradient past it at 0, passes every check of the catalogue's
/// suite but the grid check, which names the case; the same backend without the bug passes it.
#[test]
fn a_backend_that_stops_after_one_grid_fails_check_backends_grid_check_alone() {
    let cfg = RunConfig::from_env_or(4);
    for (values, grads) in [(false, false), (true, false), (false, true)] {
        let backend = OneGridPass {
            inner: CpuTape::new(),
            values,
            grads,
        };
        let report = check_backend(&backend, &cfg);
        let grid = report
            .reports
            .iter()
            .find(|r| r.label == "grid one-grid-pass")
            .expect("the grid check runs");
        let failed: Vec<&str> = report.failures().iter().map(|r| r.label.as_str()).collect();
        if values || grads {
            assert_eq!(failed, ["grid one-grid-pass"], "{report}");
            let what = if values { "value" } else { "gradient" };
            let msg = grid.failure.as_deref().unwrap_or_default();
            assert!(msg.starts_with("case sum: ") && msg.contains(what), "{msg}");
        } else {
            assert!(report.passed(), "{report}");
            assert_eq!(grid.cases, 6, "{grid}");
        }
    }
}
