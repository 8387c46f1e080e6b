//! `tl verify`: the conformance harness (`tl-conformance`) on a chosen backend.
//!
//! - cpu: every column, exactly as `tl-verify` runs it (CPU tape f64/f32, spec checks, and the
//!   CUDA tape on the simulation device);
//! - cuda-sim: only the CUDA-sim columns (checks 1, 2 and 6 through the harness's `CudaSim`
//!   backend); checks 3 and 4 are properties of the spec and do not depend on the backend, so
//!   those cells are "n/a" here;
//! - cuda: the session's clear "not available" error (no device in this build).

use serde_json::json;
use tl_conformance::verify::{
    COLUMNS, FAMILY_ROWS, Row, Tally, dag_cell, family_cell, op_cell, row, row_names, tally,
};
use tl_conformance::{RunConfig, registry};
use tl_session::Backend;

use crate::{CliError, Result};

/// The CUDA-sim row of `name` (a registry op, `"dag"` or a family row): the harness's sim columns only (1 fwd
/// sim, 2 bwd sim, 6 ≈cpu sim, 6 det sim), through `tl_conformance`'s own CUDA-sim backend;
/// other columns are "n/a". Ops with no CUDA formula yet show as pending.
/// The family rows (conventions, hard inputs, grid sizes) keep their sim cells the same way.
pub fn sim_row(name: &str, cfg: &RunConfig) -> Option<Row> {
    let family = FAMILY_ROWS.contains(&name);
    let entry = if name == "dag" || family {
        None
    } else {
        Some(registry::by_name(name)?)
    };
    let cells = COLUMNS
        .iter()
        .map(|&col| {
            if col.dtype != Some("sim") {
                return None;
            }
            match &entry {
                Some(e) => e.applies.get(col.check).then(|| op_cell(e, col, cfg)),
                None if family => family_cell(name, col, cfg),
                None => Some(dag_cell(col, cfg)),
            }
        })
        .collect();
    Some(Row {
        name: name.to_owned(),
        cells,
    })
}

/// Count the cells of `rows` (pending cells apart from failures).
pub fn counts(rows: &[Row]) -> Tally {
    tally(rows)
}

/// The rows to run: `only` (checked against the registry; an unknown name is a usage error) or
/// every row.
pub fn names(only: &[String]) -> Result<Vec<String>> {
    let all = row_names();
    if only.is_empty() {
        return Ok(all.into_iter().map(str::to_owned).collect());
    }
    if let Some(bad) = only.iter().find(|n| !all.contains(&n.as_str())) {
        return Err(CliError::usage(format!(
            "--only {bad}: no registry op or row of that name (see `tl verify` for the list)"
        )));
    }
    Ok(only.to_vec())
}

/// Check that `backend` can be verified here (cuda: the session's "not available" error where
/// this build or machine has no device, else a usage error: the harness has no real-device
/// backend).
pub fn check_backend(backend: Backend) -> Result<()> {
    if backend == Backend::Cuda {
        crate::train::eager(backend, false, 0)?;
        return Err(CliError::usage(
            "--backend cuda: the harness has no real-device backend yet; use --backend cuda-sim",
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
                            "pending": rep.is_pending(),
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
