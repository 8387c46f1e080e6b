//! Check 1: compiled tape values == IR eval, for every registry op and random DAGs, on the CPU
//! tape in f64 and f32.

use tl_conformance::checks::{check_forward, check_forward_dag};
use tl_conformance::{Backend, CpuTape, RunConfig, assert_all_passed, registry};

fn run<B: Backend>(backend: &B) {
    let cfg = RunConfig::from_env();
    let mut reports: Vec<_> = registry::all()
        .iter()
        .filter(|e| e.applies.forward)
        .map(|e| check_forward(backend, e, &cfg))
        .collect();
    reports.push(check_forward_dag(backend, &cfg));
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn cpu_f64_forward_matches_ir_eval() {
    run(&CpuTape::<f64>::new());
}

#[test]
fn cpu_f32_forward_matches_ir_eval() {
    run(&CpuTape::<f32>::new());
}
