//! Run every check for every registry entry and the random DAGs, and tabulate the results
//! (what `tl-verify` prints).

use std::fmt::Write as _;

use crate::checks::*;
use crate::{Check, CpuTape, OpInfo, Report, RunConfig, registry};

/// The columns of the table: a check and, for checks 1–2, the backend precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The check.
    pub check: Check,
    /// `Some("f64")` / `Some("f32")` for backend checks, `None` for the f64 spec checks.
    pub dtype: Option<&'static str>,
}

impl Column {
    /// Table header text.
    pub fn header(&self) -> String {
        match self.dtype {
            Some(t) => format!("{} {t}", self.check.label()),
            None => self.check.label().to_owned(),
        }
    }
}

/// The six columns: 1 fwd f64, 1 fwd f32, 2 bwd f64, 2 bwd f32, 3 fd, 4 jvp.
pub const COLUMNS: [Column; 6] = [
    Column {
        check: Check::Forward,
        dtype: Some("f64"),
    },
    Column {
        check: Check::Forward,
        dtype: Some("f32"),
    },
    Column {
        check: Check::Backward,
        dtype: Some("f64"),
    },
    Column {
        check: Check::Backward,
        dtype: Some("f32"),
    },
    Column {
        check: Check::FiniteDiff,
        dtype: None,
    },
    Column {
        check: Check::Adjoint,
        dtype: None,
    },
];

/// One row: a registry entry (or the DAG row) and one optional report per column
/// (`None` = not applicable).
#[derive(Debug, Clone)]
pub struct Row {
    /// The op name, or `"dag"`.
    pub name: String,
    /// One cell per [`COLUMNS`] entry.
    pub cells: Vec<Option<Report>>,
}

/// Run the applicable checks of one entry on the CPU tape.
pub fn op_row(entry: &OpInfo, cfg: &RunConfig) -> Row {
    let f64b = CpuTape::<f64>::new();
    let f32b = CpuTape::<f32>::new();
    let cells = COLUMNS
        .iter()
        .map(|col| {
            entry
                .applies
                .get(col.check)
                .then(|| match (col.check, col.dtype) {
                    (Check::Forward, Some("f64")) => check_forward(&f64b, entry, cfg),
                    (Check::Forward, _) => check_forward(&f32b, entry, cfg),
                    (Check::Backward, Some("f64")) => check_backward(&f64b, entry, cfg),
                    (Check::Backward, _) => check_backward(&f32b, entry, cfg),
                    (Check::FiniteDiff, _) => check_finite_diff(entry, cfg),
                    (Check::Adjoint, _) => check_adjoint(entry, cfg),
                })
        })
        .collect();
    Row {
        name: entry.name.to_owned(),
        cells,
    }
}

/// Run every check on random DAGs.
pub fn dag_row(cfg: &RunConfig) -> Row {
    let f64b = CpuTape::<f64>::new();
    let f32b = CpuTape::<f32>::new();
    Row {
        name: "dag".to_owned(),
        cells: vec![
            Some(check_forward_dag(&f64b, cfg)),
            Some(check_forward_dag(&f32b, cfg)),
            Some(check_backward_dag(&f64b, cfg)),
            Some(check_backward_dag(&f32b, cfg)),
            Some(check_finite_diff_dag(cfg)),
            Some(check_adjoint_dag(cfg)),
        ],
    }
}

/// Every registry row, then the DAG row.
pub fn all_rows(cfg: &RunConfig) -> Vec<Row> {
    let mut rows: Vec<Row> = registry::all().iter().map(|e| op_row(e, cfg)).collect();
    rows.push(dag_row(cfg));
    rows
}

/// Cell counts of a table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Applicable cells whose check passed.
    pub passed: usize,
    /// Applicable cells whose check failed.
    pub failed: usize,
    /// Applicable cells that ran no case at all.
    pub empty: usize,
    /// Cells that do not apply.
    pub not_applicable: usize,
}

/// Count the cells of `rows`.
pub fn tally(rows: &[Row]) -> Tally {
    let mut t = Tally::default();
    for cell in rows.iter().flat_map(|r| &r.cells) {
        match cell {
            None => t.not_applicable += 1,
            Some(r) if !r.passed() => t.failed += 1,
            Some(r) => {
                t.passed += 1;
                if r.cases == 0 {
                    t.empty += 1;
                }
            }
        }
    }
    t
}

/// The table: one row per op, one column per check, cells `cases/maxerr`, `n/a` or `FAIL`.
pub fn render(rows: &[Row]) -> String {
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let cell_w = 13;
    let mut out = String::new();
    let _ = write!(out, "{:<name_w$}", "op");
    for c in COLUMNS {
        let _ = write!(out, " {:>cell_w$}", c.header());
    }
    out.push('\n');
    for row in rows {
        let _ = write!(out, "{:<name_w$}", row.name);
        for cell in &row.cells {
            let text = cell.as_ref().map_or_else(|| "n/a".to_owned(), Report::cell);
            let _ = write!(out, " {text:>cell_w$}");
        }
        out.push('\n');
    }
    out
}
