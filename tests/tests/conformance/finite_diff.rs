//! Check 3: spec VJP == central finite differences of the spec value (f64), for every op that
//! is smooth on its generated domain, and IR backprop == finite differences of IR eval on DAGs.

use tl_conformance::checks::{check_finite_diff, check_finite_diff_dag};
use tl_conformance::{RunConfig, assert_all_passed, registry};

#[test]
fn spec_vjps_match_finite_differences() {
    let cfg = RunConfig::from_env();
    let reports: Vec<_> = registry::all()
        .iter()
        .filter(|e| e.applies.finite_diff)
        .map(|e| check_finite_diff(e, &cfg))
        .collect();
    assert!(reports.len() >= 30, "finite differences cover most ops");
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn dag_backprop_matches_finite_differences() {
    let cfg = RunConfig::from_env();
    assert_all_passed(&[check_finite_diff_dag(&cfg)], cfg.cases);
}
