//! The sim path has teeth: a CUDA sim tape whose `mul` backward is wrong (recorded, inside this
//! test only, as `mul(detach(a), b) + ½·a·a − ½·detach(a)·detach(a)`: the same value, exactly,
//! but a cotangent `g·a` for `a` instead of `g·b`) makes check 2 on the sim fail, per op and on
//! random DAGs, while check 1 still passes.

use tl_conformance::backend::SimWith;
use tl_conformance::checks::forward_case;
use tl_conformance::checks::sim::{check_backward_dag_on, check_backward_on};
use tl_conformance::{RunConfig, registry, run_check};
use tl_ir::Op;
use tl_tape_cuda::{CudaTape, Error, SimDevice};

/// Records as the sim does, except `mul`, recorded with the wrong backward described above.
fn record_mutant_mul(t: &mut CudaTape<SimDevice>, op: &Op, args: &[usize]) -> Result<usize, Error> {
    if *op != Op::Mul {
        return t.apply(op, args);
    }
    let (a, b) = (args[0], args[1]);
    let da = t.apply(&Op::Detach, &[a])?;
    let ab = t.apply(&Op::Mul, &[da, b])?;
    let aa = t.apply(&Op::Mul, &[a, a])?;
    let dada = t.apply(&Op::Mul, &[da, da])?;
    let half = t.apply(&Op::Scale(0.5), &[aa])?;
    let half_d = t.apply(&Op::Scale(0.5), &[dada])?;
    let zero = t.apply(&Op::Sub, &[half, half_d])?;
    t.apply(&Op::Add, &[ab, zero])
}

#[test]
fn a_broken_mul_backward_on_the_sim_fails_check_2() {
    let cfg = RunConfig::from_env_or(32);
    let mutant = SimWith::new("cuda-sim-mutant-mul", record_mutant_mul);
    let mul = registry::by_name("mul").unwrap();
    let fwd = run_check(
        "1 fwd mul mutant".into(),
        &cfg,
        tl_conformance::checks::op_graph_cases(&mul),
        |c| forward_case(&mutant, c, &mul.tol),
    );
    assert!(fwd.passed(), "the mutant's forward is right: {fwd}");

    let bwd = check_backward_on(&mutant, &mul, &cfg);
    assert!(!bwd.is_pending(), "{bwd}");
    let msg = bwd.failure.as_deref().expect("check 2 on sim catches it");
    assert!(msg.contains("gradient of %0"), "names the operand: {msg}");
    assert!(msg.contains("minimal failing input"), "{msg}");

    let dag = check_backward_dag_on(&mutant, &RunConfig::from_env_or(64));
    let msg = dag.failure.expect("DAG check 2 on sim catches it");
    assert!(msg.contains("mul("), "the shrunk DAG holds the mul: {msg}");
}
