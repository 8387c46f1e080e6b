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
    row_names()
        .iter()
        .map(|n| row(n, cfg).expect("known row"))
        .collect()
}

/// The names of all rows: every registry entry, then `"dag"`.
pub fn row_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = registry::all().iter().map(|e| e.name).collect();
    names.push("dag");
    names
}

/// The row named `name` (a registry op or `"dag"`), or `None` for an unknown name.
pub fn row(name: &str, cfg: &RunConfig) -> Option<Row> {
    if name == "dag" {
        Some(dag_row(cfg))
    } else {
        registry::by_name(name).map(|e| op_row(&e, cfg))
    }
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

/// Width of the op-name column (fits every registry name and `"dag"`).
pub const NAME_WIDTH: usize = 13;
/// Width of a cell.
pub const CELL_WIDTH: usize = 13;

/// The table's header line (with a trailing newline).
pub fn render_header() -> String {
    let mut out = format!("{:<NAME_WIDTH$}", "op");
    for c in COLUMNS {
        let _ = write!(out, " {:>CELL_WIDTH$}", c.header());
    }
    out.push('\n');
    out
}

/// One table line: the name, then `cases/maxerr`, `n/a` or `FAIL` per column.
pub fn render_row(row: &Row) -> String {
    let mut out = format!("{:<NAME_WIDTH$}", row.name);
    for cell in &row.cells {
        let text = cell.as_ref().map_or_else(|| "n/a".to_owned(), Report::cell);
        let _ = write!(out, " {text:>CELL_WIDTH$}");
    }
    out.push('\n');
    out
}

/// The whole table: one row per op, one column per check.
pub fn render(rows: &[Row]) -> String {
    let mut out = render_header();
    for row in rows {
        out.push_str(&render_row(row));
    }
    out
}
