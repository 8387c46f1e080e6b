//! Check 2 (the core claim): tape `backward_dense` == IR `backprop_all`, for every registry op
//! and random DAGs with fan-out, on the CPU tape in f64 and f32.

use tl_conformance::checks::{check_backward, check_backward_dag};
use tl_conformance::{Backend, CpuTape, RunConfig, assert_all_passed, registry};

fn run<B: Backend>(backend: &B) {
    let cfg = RunConfig::from_env();
    let mut reports: Vec<_> = registry::all()
        .iter()
        .filter(|e| e.applies.backward)
        .map(|e| check_backward(backend, e, &cfg))
        .collect();
    reports.push(check_backward_dag(backend, &cfg));
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn cpu_f64_backward_matches_ir_backprop() {
    run(&CpuTape::<f64>::new());
}

#[test]
fn cpu_f32_backward_matches_ir_backprop() {
    run(&CpuTape::<f32>::new());
}
