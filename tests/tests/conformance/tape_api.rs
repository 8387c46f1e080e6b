//! The tape API beyond `backward_dense` (`backward_dense_from`, `backward_first_n`,
//! `backward_params`) on random DAGs, on the CPU tape in f64 and f32 and on the CUDA sim.

use tl_conformance::checks::tape_api::{check_tape_api_dag, check_tape_api_sim_dag};
use tl_conformance::{CpuTape, RunConfig, assert_all_passed};

/// DAG cases are the expensive ones: a quarter of the default count unless `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

#[test]
fn tape_api_on_the_cpu_tape_f64_and_f32() {
    let cfg = cfg();
    let reports = [
        check_tape_api_dag(&CpuTape::<f64>::new(), &cfg),
        check_tape_api_dag(&CpuTape::<f32>::new(), &cfg),
    ];
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn tape_api_on_the_cuda_sim() {
    let cfg = cfg();
    let r = check_tape_api_sim_dag(&cfg);
    assert!(!r.is_pending(), "{r}");
    assert_all_passed(&[r], cfg.cases);
}

/// The tape-API check has teeth: a CPU tape whose API methods each carry one planted bug (the
/// real tape is untouched: the wrapper bends what it returns) must fail the check, and the
/// same wrapper with no bug must pass it.
mod teeth {
    use std::collections::HashMap;

    use tl_conformance::checks::tape_api::check_tape_api_dag;
    use tl_conformance::{Backend, CpuTape, RunConfig, TapeApi, TapeProgram};
    use tl_ir::{GraphData, Id};
    use tl_spec::Tensor;

    /// Which API method is wrong, and how.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Plant {
        /// None: the tape's own results.
        Honest,
        /// `backward_dense_from` returns what flowed into each id, without the id's own
        /// given gradient (the seeds are not counted where they were put).
        FromLeavesOutTheSeeds,
        /// `backward_first_n` ignores `n` and sweeps the whole tape.
        FirstNSweepsAll,
        /// `backward_params` adds a wanted id's gradient once per listing (leaf 0, listed
        /// twice, gets twice its gradient).
        ParamsCountsRepeats,
    }

    struct Planted(Plant);

    fn cpu() -> CpuTape<f64> {
        CpuTape::new()
    }

    impl Backend for Planted {
        type T = f64;
        type Program = TapeProgram<f64>;

        fn name(&self) -> String {
            format!("cpu-f64-{:?}", self.0)
        }
        fn record(
            &self,
            graph: &GraphData,
            leaves: &[Tensor<f64>],
            nats: &[usize],
        ) -> Result<Self::Program, String> {
            cpu().record(graph, leaves, nats)
        }
        fn values(&self, p: &Self::Program) -> Result<Vec<Tensor<f64>>, String> {
            cpu().values(p)
        }
        fn backward_dense(
            &self,
            p: &Self::Program,
            out: Id,
            seed: &Tensor<f64>,
        ) -> Result<Vec<Tensor<f64>>, String> {
            cpu().backward_dense(p, out, seed)
        }
    }

    impl TapeApi for Planted {
        fn backward_dense_from(
            &self,
            p: &Self::Program,
            grads0: &[Tensor<f64>],
        ) -> Result<Vec<Tensor<f64>>, String> {
            let got = cpu().backward_dense_from(p, grads0)?;
            if self.0 != Plant::FromLeavesOutTheSeeds {
                return Ok(got);
            }
            got.iter()
                .zip(grads0)
                .map(|(g, s)| g.zip_map("sub", s, |a, b| a - b).map_err(|e| e.to_string()))
                .collect()
        }
        fn backward_first_n(
            &self,
            p: &Self::Program,
            n: usize,
            grads0: &[Tensor<f64>],
        ) -> Result<Vec<Tensor<f64>>, String> {
            match self.0 {
                Plant::FirstNSweepsAll => cpu().backward_dense_from(p, grads0),
                _ => cpu().backward_first_n(p, n, grads0),
            }
        }
        fn backward_params(
            &self,
            p: &Self::Program,
            out: Id,
            seed: &Tensor<f64>,
            wanted: &[Id],
        ) -> Result<HashMap<Id, Tensor<f64>>, String> {
            let mut got = cpu().backward_params(p, out, seed, wanted)?;
            if self.0 == Plant::ParamsCountsRepeats {
                for (k, w) in wanted.iter().enumerate() {
                    if wanted[..k].contains(w) {
                        let g = got[w].map(|v| 2.0 * v);
                        got.insert(*w, g);
                    }
                }
            }
            Ok(got)
        }
    }

    #[test]
    fn each_planted_api_bug_fails_the_check_and_the_honest_wrapper_passes() {
        let cfg = RunConfig {
            cases: RunConfig::from_env().cases.max(32),
            ..RunConfig::from_env()
        };
        let honest = check_tape_api_dag(&Planted(Plant::Honest), &cfg);
        assert!(honest.passed(), "the wrapper without a bug: {honest}");
        for (plant, names) in [
            (Plant::FromLeavesOutTheSeeds, "backward_dense_from gradient"),
            (Plant::FirstNSweepsAll, "backward_first_n gradient"),
            (Plant::ParamsCountsRepeats, "backward_params differs"),
        ] {
            let r = check_tape_api_dag(&Planted(plant), &cfg);
            let msg = r
                .failure
                .as_deref()
                .unwrap_or_else(|| panic!("{plant:?} must fail the tape-API check: {r}"));
            assert!(msg.contains(names), "{plant:?}: {msg}");
        }
    }
}
