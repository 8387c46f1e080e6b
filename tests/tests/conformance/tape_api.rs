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
