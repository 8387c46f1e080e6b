//! Check 3: the spec VJP (`tl_ir::rules::vjp`) equals central finite differences of the spec
//! value (`tl_ir::rules::value`), in f64, element by element; and on random DAGs, the IR's
//! `backprop_all` equals finite differences of `GraphData::eval`.
//!
//! For a cotangent `w`, the VJP of operand `k` at element `i` must equal
//! `(⟨f(x + h·e_i), w⟩ − ⟨f(x − h·e_i), w⟩) / 2h` with `h = FD_STEP`. The truncation error is
//! `O(h²·f''')` and the rounding error `O(ε·|⟨f, w⟩|/h)`; with `h = 1e-5` both are ~1e-10 for the
//! registry's domains, so `Tol::fd = 1e-6` leaves room while catching any wrong rule.

use proptest::prelude::*;
use tl_ir::rules;
use tl_spec::Tensor;

use crate::dag::{DagOptions, dag_cases};
use crate::generate::direction;
use crate::metric::{tensor_err, worst_index};
use crate::{CaseResult, GraphCase, Measured, OpCase, OpInfo, Report, RunConfig, With, run_check};

/// A scalar function of all operands (`⟨f(x), w⟩`), failing with a message.
type Phi<'a> = &'a dyn Fn(&[Tensor<f64>]) -> Result<f64, String>;

/// The finite-difference step.
pub const FD_STEP: f64 = 1e-5;

/// Central differences of `phi` with respect to every element of `x[k]`, as a tensor of its
/// shape.
fn central_diff(x: &[Tensor<f64>], k: usize, phi: Phi<'_>) -> Result<Tensor<f64>, String> {
    let mut probe = x.to_vec();
    let mut out = vec![0.0; x[k].numel()];
    for (i, slot) in out.iter_mut().enumerate() {
        let x0 = x[k].data()[i];
        probe[k].data_mut()[i] = x0 + FD_STEP;
        let plus = phi(&probe)?;
        probe[k].data_mut()[i] = x0 - FD_STEP;
        let minus = phi(&probe)?;
        probe[k].data_mut()[i] = x0;
        *slot = (plus - minus) / (2.0 * FD_STEP);
    }
    Tensor::new(x[k].shape().clone(), out).map_err(|e| e.to_string())
}

fn compare(k: &str, g: &Tensor<f64>, fd: &Tensor<f64>, tol: f64) -> CaseResult {
    if g.shape() != fd.shape() {
        return Err(format!(
            "{k}: gradient has shape {}, operand has shape {}",
            g.shape(),
            fd.shape()
        ));
    }
    Measured::check(tensor_err(g, fd), tol, || {
        let i = worst_index(g, fd).unwrap_or(0);
        format!(
            "{k}: at flat index {i} the derivative is {} but finite differences give {}",
            g.data()[i],
            fd.data()[i]
        )
    })
}

/// One case of check 3 on an op: every operand's spec VJP against central differences.
pub fn fd_case(case: &OpCase, w: &Tensor<f64>, tol: f64) -> CaseResult {
    fd_case_indexed(case, w, tol, &[])
}

/// [`fd_case`] for an op with index operands (`index_operands`, see
/// [`OpInfo::index_operands`]): those are not perturbed, and their VJP must be `None`.
pub fn fd_case_indexed(
    case: &OpCase,
    w: &Tensor<f64>,
    tol: f64,
    index_operands: &[usize],
) -> CaseResult {
    let grads = rules::vjp(&case.op, &case.args(), w, &case.nats)
        .map_err(|e| format!("spec VJP failed: {e}"))?;
    if grads.len() != case.inputs.len() {
        return Err(format!(
            "spec VJP returned {} cotangents for {} operands",
            grads.len(),
            case.inputs.len()
        ));
    }
    let phi = |x: &[Tensor<f64>]| -> Result<f64, String> {
        let args: Vec<&Tensor<f64>> = x.iter().collect();
        let y = rules::value(&case.op, &args, &case.nats)
            .map_err(|e| format!("spec value failed: {e}"))?;
        y.dot_f64(w).map_err(|e| e.to_string())
    };
    let mut worst = Measured { err: 0.0, tol };
    for (k, g) in grads.iter().enumerate() {
        if index_operands.contains(&k) {
            if g.is_some() {
                return Err(format!("spec VJP gives a gradient to index operand x{k}"));
            }
            continue;
        }
        let g = g
            .as_ref()
            .ok_or_else(|| format!("spec VJP gives no gradient for operand x{k}"))?;
        let fd = central_diff(&case.inputs, k, &phi)?;
        worst = worst.max(compare(&format!("operand x{k}"), g, &fd, tol)?);
    }
    Ok(worst)
}

/// One case of check 3 on a graph: `backprop_all` at every leaf against central differences of
/// `⟨eval(out), seed⟩`. Every leaf must require grad (see [`DagOptions::all_grad`]).
pub fn fd_dag_case(case: &GraphCase, tol: f64) -> CaseResult {
    let grads = case
        .graph
        .backprop_all(&case.leaves, &case.nats, case.out, &case.seed)
        .map_err(|e| format!("IR backprop_all failed: {e}"))?;
    let phi = |x: &[Tensor<f64>]| -> Result<f64, String> {
        let values = case
            .graph
            .eval(x, &case.nats)
            .map_err(|e| format!("IR eval failed: {e}"))?;
        values[case.out]
            .dot_f64(&case.seed)
            .map_err(|e| e.to_string())
    };
    let mut worst = Measured { err: 0.0, tol };
    for (k, g) in grads.iter().enumerate().take(case.leaves.len()) {
        let fd = central_diff(&case.leaves, k, &phi)?;
        worst = worst.max(compare(&format!("leaf %{k}"), g, &fd, tol)?);
    }
    Ok(worst)
}

/// Check 3 on a registry entry (f64 spec rules).
pub fn check_finite_diff(entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("3 fd {}", entry.name);
    let tol = entry.tol.fd;
    let index_operands = &entry.index_operands;
    let cases = entry
        .cases()
        .prop_flat_map(|case| {
            let out = case.out_shape();
            (Just(case), direction(out))
        })
        .prop_map(|(case, w)| With {
            case,
            extra: vec![("w (cotangent)", w)],
        });
    run_check(label, cfg, cases, |c| {
        fd_case_indexed(&c.case, &c.extra[0].1, tol, index_operands)
    })
}

/// Check 3 on random DAGs without `detach` (whose gradient is zero by definition), every leaf
/// requiring grad.
pub fn check_finite_diff_dag(cfg: &RunConfig) -> Report {
    let opts = DagOptions {
        all_grad: true,
        detach: false,
        ..DagOptions::default()
    };
    run_check("3 fd dag".into(), cfg, dag_cases(opts), |c| {
        fd_dag_case(c, crate::dag::DAG_TOL.fd)
    })
}
