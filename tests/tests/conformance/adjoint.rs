//! Check 4: ⟨J v, w⟩ = ⟨v, Jᵀ w⟩ per op (spec JVP vs spec VJP) and on DAGs (IR jvp vs IR
//! backprop_all).

use tl_conformance::checks::{check_adjoint, check_adjoint_dag};
use tl_conformance::{RunConfig, assert_all_passed, registry};

#[test]
fn spec_jvp_and_vjp_are_adjoint() {
    let cfg = RunConfig::from_env();
    let reports: Vec<_> = registry::all()
        .iter()
        .filter(|e| e.applies.adjoint)
        .map(|e| check_adjoint(e, &cfg))
        .collect();
    assert_eq!(
        reports.len(),
        registry::all().len(),
        "the adjoint check applies to every op"
    );
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn dag_jvp_and_backprop_are_adjoint() {
    let cfg = RunConfig::from_env();
    assert_all_passed(&[check_adjoint_dag(&cfg)], cfg.cases);
}
