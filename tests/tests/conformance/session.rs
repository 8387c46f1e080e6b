//! Check 5: random programs give the same values and gradients in the eager session (CPU,
//! CUDA-sim) and the linked session as in the IR reference.

use tl_conformance::checks::{SESSION_CASES, check_session_dag, session_case};
use tl_conformance::verify::{COLUMNS, op_cell};
use tl_conformance::{Check, GraphCase, RunConfig, assert_all_passed, registry};
use tl_ir::{GraphBuilder, Op};
use tl_spec::Tensor;

#[test]
fn sessions_agree_on_random_dags() {
    // Each case runs three sessions; a quarter of the default count keeps this fast.
    let mut cfg = RunConfig::default();
    cfg.cases = (cfg.cases / 4).max(8);
    let r = check_session_dag(&cfg);
    assert_all_passed(&[r], cfg.cases);
}

#[test]
fn every_registry_op_passes_check_5_in_both_columns() {
    // Eight cases per op and column (TL_CASES overrides, up to the column's cap): the full count
    // runs in `cargo xtask coverage`.
    let cfg = RunConfig::from_env_or(8);
    let cases = cfg.cases.min(SESSION_CASES);
    let cols: Vec<_> = COLUMNS
        .iter()
        .filter(|c| c.check == Check::Session)
        .collect();
    assert_eq!(cols.len(), 2, "5 sess cpu and 5 sess sim");
    let mut reports = Vec::new();
    for entry in registry::all() {
        if !entry.applies.get(Check::Session) {
            continue;
        }
        for c in &cols {
            let r = op_cell(&entry, **c, &cfg);
            assert!(!r.is_pending(), "every op has a CUDA formula: {r}");
            reports.push(r);
        }
    }
    assert!(reports.len() > 100, "{} cells", reports.len());
    assert_all_passed(&reports, cases);
}

#[test]
fn constants_fan_out_and_bad_cases() {
    // x → scale → (· x) with a constant node mid-graph: fan-out and a constant through `apply`.
    let mut b = GraphBuilder::new();
    let x = b.leaf([2], Some("x")).unwrap();
    let y = b.apply(Op::Scale(2.0), &[x]).unwrap();
    let c = b
        .apply(Op::Constant(Tensor::vector(vec![0.5, 4.0])), &[])
        .unwrap();
    let z = b.apply(Op::Mul, &[y, x]).unwrap();
    let w = b.apply(Op::Add, &[z, c]).unwrap();
    let good = GraphCase {
        graph: b.finish(),
        leaves: vec![Tensor::vector(vec![1.0, -3.0])],
        out: w,
        seed: Tensor::vector(vec![1.0, 2.0]),
        nats: vec![],
    };
    let m = session_case(&good).expect("the sessions agree");
    assert!(m.err <= 1e-6, "{m:?}");
    // A leaf value of the wrong shape is a reported failure, not a panic.
    let mut bad = good.clone();
    bad.leaves = vec![Tensor::vector(vec![1.0, 2.0, 3.0])];
    let e = session_case(&bad).unwrap_err();
    assert!(e.contains("[3]"), "{e}");
}
