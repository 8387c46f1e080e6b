//! `tl verify`: the conformance harness (`tl-conformance`) on a chosen backend.
//!
//! - cpu: every check, f64 and f32, exactly as `tl-verify` runs it;
//! - cuda-sim: checks 1 (forward) and 2 (backprop) of the CUDA tape on the simulation device in
//!   f32 ([`SimTape`]); checks 3 and 4 are properties of the spec and do not depend on the
//!   backend, and the CUDA tape has no f64, so those cells are "n/a" for it;
//! - cuda: the session's clear "not available" error (no device in this build).

use std::cell::RefCell;
use std::fmt::Write as _;

use proptest::strategy::Strategy;

use serde_json::json;
use tl_conformance::checks::{backward_case, check_backward, check_forward, forward_case};
use tl_conformance::dag::{DAG_TOL, DagOptions, dag_cases};
use tl_conformance::verify::{CELL_WIDTH, COLUMNS, NAME_WIDTH, Row, row, row_names};
use tl_conformance::{Backend as _, Check, GraphCase, Report, RunConfig, registry, run_check};
use tl_ir::{GraphData, Id};
use tl_session::Backend;
use tl_spec::Tensor;
use tl_tape_cuda::{AnyBuffer, CudaTape, SimDevice};

use crate::{CliError, Result};

/// The CUDA tape on the simulation device, as a harness backend (f32).
#[derive(Debug, Default, Clone, Copy)]
pub struct SimTape;

/// A graph replayed into a simulated CUDA tape, with the graph-id → tape-id map.
pub struct SimProgram {
    tape: RefCell<CudaTape<SimDevice>>,
    map: Vec<usize>,
}

impl tl_conformance::Backend for SimTape {
    type T = f32;
    type Program = SimProgram;

    fn name(&self) -> String {
        "cuda-sim-f32".to_owned()
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<f32>],
        nats: &[usize],
    ) -> std::result::Result<SimProgram, String> {
        let mut tape = CudaTape::new(SimDevice::new());
        let map = graph
            .replay(&mut tape, leaves, nats)
            .map_err(|e| format!("replay into the CUDA-sim tape failed: {e}"))?;
        Ok(SimProgram {
            tape: RefCell::new(tape),
            map,
        })
    }

    fn values(&self, p: &SimProgram) -> std::result::Result<Vec<Tensor<f32>>, String> {
        let tape = p.tape.borrow();
        p.map
            .iter()
            .map(|&t| tape.read(t).map_err(|e| e.to_string()))
            .collect()
    }

    fn backward_dense(
        &self,
        p: &SimProgram,
        out: Id,
        seed: &Tensor<f32>,
    ) -> std::result::Result<Vec<Tensor<f32>>, String> {
        let &to = p
            .map
            .get(out)
            .ok_or_else(|| format!("graph id {out} was not recorded"))?;
        let mut tape = p.tape.borrow_mut();
        let s = AnyBuffer::upload(tape.device_mut(), seed).map_err(|e| e.to_string())?;
        let g = tape.backward_dense(to, &s);
        s.release(tape.device_mut());
        let g = g.map_err(|e| format!("tape backward_dense failed: {e}"))?;
        let out = p
            .map
            .iter()
            .map(|&t| g[t].download(tape.device()).map_err(|e| e.to_string()))
            .collect();
        tape.release_grads(g);
        out
    }
}

/// The tail of the CUDA tape's "no formula yet" message (`Error::Unsupported`), to tell an op
/// that is pending on the CUDA tape (issue 4) from a wrong answer.
fn pending_marker() -> String {
    let e = tl_tape_cuda::Error::Unsupported { op: "\u{1}" }.to_string();
    e.split('\u{1}').nth(1).unwrap_or(&e).to_owned()
}

/// Whether a failed report failed only because the CUDA tape has no formula for the op yet.
pub fn is_pending(rep: &Report) -> bool {
    rep.failure
        .as_deref()
        .is_some_and(|f| f.contains(&pending_marker()))
}

/// Whether every op of `case`'s graph has a CUDA formula (replaying it raises no
/// `Unsupported`).
fn sim_supports(case: &GraphCase) -> bool {
    let leaves: Vec<Tensor<f32>> = case.leaves.iter().map(Tensor::cast).collect();
    !matches!(
        SimTape.record(&case.graph, &leaves, &case.nats),
        Err(e) if e.contains(&pending_marker())
    )
}

/// The CUDA-sim row of `name` (a registry op or `"dag"`): f32 forward and backprop cells only.
/// The DAG row draws only DAGs whose ops all have CUDA formulas.
pub fn sim_row(name: &str, cfg: &RunConfig) -> Option<Row> {
    let b = SimTape;
    let entry = if name == "dag" {
        None
    } else {
        Some(registry::by_name(name)?)
    };
    let dags = || {
        dag_cases(DagOptions::default()).prop_filter("ops pending on the CUDA tape", sim_supports)
    };
    let cells = COLUMNS
        .iter()
        .map(|col| {
            if col.dtype != Some("f32") {
                return None;
            }
            match (&entry, col.check) {
                (Some(e), Check::Forward) => e
                    .applies
                    .get(Check::Forward)
                    .then(|| check_forward(&b, e, cfg)),
                (Some(e), Check::Backward) => e
                    .applies
                    .get(Check::Backward)
                    .then(|| check_backward(&b, e, cfg)),
                (None, Check::Forward) => Some(run_check(
                    format!("1 fwd dag {}", b.name()),
                    cfg,
                    dags(),
                    |c| forward_case(&b, c, &DAG_TOL),
                )),
                (None, Check::Backward) => Some(run_check(
                    format!("2 bwd dag {}", b.name()),
                    cfg,
                    dags(),
                    |c| backward_case(&b, c, &DAG_TOL),
                )),
                _ => None,
            }
        })
        .collect();
    Some(Row {
        name: name.to_owned(),
        cells,
    })
}

/// Counts of a table, with cells pending on the CUDA tape apart from failures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Cells that passed.
    pub passed: usize,
    /// Cells that failed (a wrong answer or an error other than "pending").
    pub failed: usize,
    /// Cells whose op has no CUDA formula yet.
    pub pending: usize,
}

/// Count the cells of `rows`.
pub fn counts(rows: &[Row]) -> Counts {
    let mut c = Counts::default();
    for rep in rows.iter().flat_map(|r| r.cells.iter().flatten()) {
        if rep.passed() {
            c.passed += 1;
        } else if is_pending(rep) {
            c.pending += 1;
        } else {
            c.failed += 1;
        }
    }
    c
}

/// One table line, like `tl-verify`'s, with "pending" for ops the CUDA tape lacks.
pub fn render_row(row: &Row) -> String {
    let mut out = format!("{:<NAME_WIDTH$}", row.name);
    for cell in &row.cells {
        let text = match cell {
            None => "n/a".to_owned(),
            Some(r) if is_pending(r) => "pending".to_owned(),
            Some(r) => r.cell(),
        };
        let _ = write!(out, " {text:>CELL_WIDTH$}");
    }
    out.push('\n');
    out
}

/// The rows to run: `only` (checked against the registry) or every row.
pub fn names(only: &[String]) -> Result<Vec<String>> {
    let all = row_names();
    if only.is_empty() {
        return Ok(all.into_iter().map(str::to_owned).collect());
    }
    if let Some(bad) = only.iter().find(|n| !all.contains(&n.as_str())) {
        return Err(CliError::new(format!(
            "--only {bad}: no registry op or row of that name (see `tl verify` for the list)"
        )));
    }
    Ok(only.to_vec())
}

/// Check that `backend` can be verified here (cuda: the session's "not available" error).
pub fn check_backend(backend: Backend) -> Result<()> {
    if backend == Backend::Cuda {
        crate::runner::session(backend, false, false)?;
        return Err(CliError::new(
            "backend cuda: the harness has no real-device backend yet; use --backend cuda-sim",
        ));
    }
    Ok(())
}

/// Run the row `name` on `backend`.
pub fn run_row(backend: Backend, name: &str, cfg: &RunConfig) -> Option<Row> {
    match backend {
        Backend::CudaSim => sim_row(name, cfg),
        _ => row(name, cfg),
    }
}

/// The table as JSON: backend, cases, seed, one object per row with one entry per column
/// (`null` where not applicable), and the pass/fail counts.
pub fn to_json(backend: Backend, cfg: &RunConfig, rows: &[Row]) -> serde_json::Value {
    let t = counts(rows);
    let rows: Vec<_> = rows
        .iter()
        .map(|r| {
            let cells: serde_json::Map<String, serde_json::Value> = COLUMNS
                .iter()
                .zip(&r.cells)
                .map(|(c, cell)| {
                    let v = match cell {
                        None => serde_json::Value::Null,
                        Some(rep) => json!({
                            "cases": rep.cases,
                            "max_err": rep.max_err,
                            "tol": rep.tol,
                            "passed": rep.passed(),
                            "pending": is_pending(rep),
                            "failure": rep.failure,
                        }),
                    };
                    (c.header(), v)
                })
                .collect();
            json!({ "op": r.name, "checks": cells })
        })
        .collect();
    json!({
        "backend": backend.name(),
        "cases": cfg.cases,
        "seed": cfg.seed,
        "rows": rows,
        "passed": t.passed,
        "failed": t.failed,
        "pending": t.pending,
    })
}
