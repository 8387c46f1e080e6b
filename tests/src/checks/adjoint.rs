//! Check 4: the JVP and the VJP are adjoint, `⟨J v, w⟩ = ⟨v, Jᵀ w⟩`, per op through
//! `rules::jvp`/`rules::vjp` and on random DAGs through `GraphData::jvp`/`backprop_all`.
//! Error: [`crate::metric::scalar_err`] of the two sides.

use proptest::prelude::*;
use tl_ir::rules;
use tl_spec::{Shape, Tensor};

use crate::dag::{DagOptions, dag_cases};
use crate::generate::direction;
use crate::metric::scalar_err;
use crate::{CaseResult, GraphCase, Measured, OpCase, OpInfo, Report, RunConfig, With, run_check};

fn directions(shapes: Vec<Shape>) -> BoxedStrategy<Vec<Tensor<f64>>> {
    shapes
        .into_iter()
        .map(direction)
        .collect::<Vec<_>>()
        .boxed()
}

fn dot(a: &Tensor<f64>, b: &Tensor<f64>, what: &str) -> Result<f64, String> {
    a.dot_f64(b).map_err(|e| format!("{what}: {e}"))
}

/// One case of check 4 on an op, with operand tangents `v` and output cotangent `w`.
pub fn adjoint_case(case: &OpCase, v: &[Tensor<f64>], w: &Tensor<f64>, tol: f64) -> CaseResult {
    let dx: Vec<&Tensor<f64>> = v.iter().collect();
    let jv = rules::jvp(&case.op, &case.args(), &dx, &case.nats)
        .map_err(|e| format!("spec JVP failed: {e}"))?;
    let lhs = dot(&jv, w, "⟨J v, w⟩ (JVP has the wrong shape)")?;
    let grads = rules::vjp(&case.op, &case.args(), w, &case.nats)
        .map_err(|e| format!("spec VJP failed: {e}"))?;
    if grads.len() != v.len() {
        return Err(format!(
            "spec VJP returned {} cotangents for {} operands",
            grads.len(),
            v.len()
        ));
    }
    let mut rhs = 0.0;
    for (k, (g, vk)) in grads.iter().zip(v).enumerate() {
        if let Some(g) = g {
            rhs += dot(
                vk,
                g,
                &format!("⟨v, Jᵀ w⟩ (VJP of x{k} has the wrong shape)"),
            )?;
        }
    }
    Measured::check(scalar_err(lhs, rhs), tol, || {
        format!("⟨J v, w⟩ = {lhs} but ⟨v, Jᵀ w⟩ = {rhs}")
    })
}

/// One case of check 4 on a graph: tangents `v` for every leaf, the seed as `w`.
pub fn adjoint_dag_case(case: &GraphCase, v: &[Tensor<f64>], tol: f64) -> CaseResult {
    let dots = case
        .graph
        .jvp(&case.leaves, &case.nats, v)
        .map_err(|e| format!("IR jvp failed: {e}"))?;
    let lhs = dot(&dots[case.out], &case.seed, "⟨J v, w⟩")?;
    let grads = case
        .graph
        .backprop_all(&case.leaves, &case.nats, case.out, &case.seed)
        .map_err(|e| format!("IR backprop_all failed: {e}"))?;
    let mut rhs = 0.0;
    for (k, vk) in v.iter().enumerate() {
        rhs += dot(vk, &grads[k], "⟨v, Jᵀ w⟩")?;
    }
    Measured::check(scalar_err(lhs, rhs), tol, || {
        format!("⟨J v, w⟩ = {lhs} but ⟨v, Jᵀ w⟩ = {rhs}")
    })
}

/// Check 4 on a registry entry.
pub fn check_adjoint(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("4 jvp {}", entry.name);
    let tol = entry.tol.adjoint;
    let cases = entry
        .mixed_cases()
        .prop_flat_map(|case| {
            let shapes = case.inputs.iter().map(|t| t.shape().clone()).collect();
            let out = case.out_shape();
            (Just(case), directions(shapes), direction(out))
        })
        .prop_map(|(case, v, w)| {
            let mut extra: Vec<(&'static str, Tensor<f64>)> =
                v.into_iter().map(|t| ("v (tangent)", t)).collect();
            extra.push(("w (cotangent)", w));
            With { case, extra }
        });
    run_check(label, cfg, cases, |c| {
        let (w, v) = c.extra.split_last().expect("w is last");
        let v: Vec<Tensor<f64>> = v.iter().map(|(_, t)| t.clone()).collect();
        adjoint_case(&c.case, &v, &w.1, tol)
    })
}

/// Check 4 on random DAGs (every leaf requiring grad, so `backprop_all` is the full transpose).
pub fn check_adjoint_dag(cfg: &RunConfig) -> Report {
    let opts = DagOptions {
        all_grad: true,
        ..DagOptions::default()
    };
    let cases = dag_cases(opts)
        .prop_flat_map(|case| {
            let shapes = case.leaves.iter().map(|t| t.shape().clone()).collect();
            (Just(case), directions(shapes))
        })
        .prop_map(|(case, v)| With {
            case,
            extra: v.into_iter().map(|t| ("v (tangent)", t)).collect(),
        });
    run_check("4 jvp dag".into(), cfg, cases, |c| {
        let v: Vec<Tensor<f64>> = c.extra.iter().map(|(_, t)| t.clone()).collect();
        adjoint_dag_case(&c.case, &v, crate::dag::DAG_TOL.adjoint)
    })
}
