//! `tl verify`: the conformance harness (`tl-conformance`) on a chosen backend.
//!
//! - cpu: every check, f64 and f32, exactly as `tl-verify` runs it;
//! - cuda-sim: checks 1 (forward) and 2 (backprop) of the CUDA tape on the simulation device in
//!   f32 ([`SimTape`]); checks 3 and 4 are properties of the spec and do not depend on the
//!   backend, and the CUDA tape has no f64, so those cells are "n/a" for it;
//! - cuda: the session's clear "not available" error (no device in this build).

use std::cell::RefCell;

use serde_json::json;
use tl_conformance::checks::{
    check_backward, check_backward_dag, check_forward, check_forward_dag,
};
use tl_conformance::verify::{COLUMNS, Row, row, row_names};
use tl_conformance::{Check, RunConfig, registry};
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

/// The CUDA-sim row of `name` (a registry op or `"dag"`): f32 forward and backprop cells only.
pub fn sim_row(name: &str, cfg: &RunConfig) -> Option<Row> {
    let b = SimTape;
    let entry = if name == "dag" {
        None
    } else {
        Some(registry::by_name(name)?)
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
                (None, Check::Forward) => Some(check_forward_dag(&b, cfg)),
                (None, Check::Backward) => Some(check_backward_dag(&b, cfg)),
                _ => None,
            }
        })
        .collect();
    Some(Row {
        name: name.to_owned(),
        cells,
    })
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
    let t = tl_conformance::verify::tally(rows);
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
    })
}
