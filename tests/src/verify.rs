//! Run every check for every registry entry and the random DAGs, and tabulate the results
//! (what `tl-verify` prints). After the op rows and the DAG row come the check families that
//! are not one op ([`FAMILY_ROWS`]): the conventions at kinks, ties and bounds, the hard
//! inputs, and the sizes past the kernels' grid limits, each in the columns of the backends it
//! runs on.

use std::fmt::Write as _;

use crate::checks::*;
use crate::checks::{conventions, grid, hard, sim};
use crate::{Check, CpuTape, CudaSim, OpInfo, Report, RunConfig, registry};

/// The columns of the table: a check and, for the tape checks, the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The check.
    pub check: Check,
    /// `Some("f64")` / `Some("f32")` for the CPU tape, `Some("sim")` for the CUDA tape on the
    /// simulation device (f32), `None` for the f64 spec checks; for check 5, `Some("cpu")` (the
    /// eager CPU session vs the linked session) and `Some("sim")` (eager CUDA-sim vs linked).
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

const fn col(check: Check, dtype: Option<&'static str>) -> Column {
    Column { check, dtype }
}

/// The twelve columns: 1 fwd f64/f32/sim, 2 bwd f64/f32/sim, 3 fd, 4 jvp, 5 sess cpu/sim
/// (eager session vs linked session), 6 ≈cpu sim, 6 det sim.
pub const COLUMNS: [Column; 12] = [
    col(Check::Forward, Some("f64")),
    col(Check::Forward, Some("f32")),
    col(Check::Forward, Some("sim")),
    col(Check::Backward, Some("f64")),
    col(Check::Backward, Some("f32")),
    col(Check::Backward, Some("sim")),
    col(Check::FiniteDiff, None),
    col(Check::Adjoint, None),
    col(Check::Session, Some("cpu")),
    col(Check::Session, Some("sim")),
    col(Check::CudaVsCpu, Some("sim")),
    col(Check::Deterministic, Some("sim")),
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

/// Run one column's check on a registry entry.
pub fn op_cell(entry: &OpInfo, column: Column, cfg: &RunConfig) -> Report {
    let f64b = CpuTape::<f64>::new();
    let f32b = CpuTape::<f32>::new();
    match (column.check, column.dtype) {
        (Check::Forward, Some("f64")) => check_forward(&f64b, entry, cfg),
        (Check::Forward, Some("sim")) => sim::check_forward_sim(entry, cfg),
        (Check::Forward, _) => check_forward(&f32b, entry, cfg),
        (Check::Backward, Some("f64")) => check_backward(&f64b, entry, cfg),
        (Check::Backward, Some("sim")) => sim::check_backward_sim(entry, cfg),
        (Check::Backward, _) => check_backward(&f32b, entry, cfg),
        (Check::FiniteDiff, _) => check_finite_diff(entry, cfg),
        (Check::Adjoint, _) => check_adjoint(entry, cfg),
        (Check::Session, Some("sim")) => check_session_sim(entry, cfg),
        (Check::Session, _) => check_session(entry, cfg),
        (Check::CudaVsCpu, _) => sim::check_sim_vs_cpu(entry, cfg),
        (Check::Deterministic, _) => sim::check_deterministic(entry, cfg),
    }
}

/// Run one column's check on random DAGs.
pub fn dag_cell(column: Column, cfg: &RunConfig) -> Report {
    let f64b = CpuTape::<f64>::new();
    let f32b = CpuTape::<f32>::new();
    match (column.check, column.dtype) {
        (Check::Forward, Some("f64")) => check_forward_dag(&f64b, cfg),
        (Check::Forward, Some("sim")) => sim::check_forward_sim_dag(cfg),
        (Check::Forward, _) => check_forward_dag(&f32b, cfg),
        (Check::Backward, Some("f64")) => check_backward_dag(&f64b, cfg),
        (Check::Backward, Some("sim")) => sim::check_backward_sim_dag(cfg),
        (Check::Backward, _) => check_backward_dag(&f32b, cfg),
        (Check::FiniteDiff, _) => check_finite_diff_dag(cfg),
        (Check::Adjoint, _) => check_adjoint_dag(cfg),
        (Check::Session, Some("sim")) => check_session_sim_dag(cfg),
        (Check::Session, _) => check_session_cpu_dag(cfg),
        (Check::CudaVsCpu, _) => sim::check_sim_vs_cpu_dag(cfg),
        (Check::Deterministic, _) => sim::check_deterministic_dag(cfg),
    }
}

/// The rows of check families that are not one op, after the DAG row:
/// - `conventions` ([`conventions::check_conventions`]): hand-worked and generated cases at
///   kinks, ties, bounds, signed zeros and NaN; values in the `1 fwd` columns, values and
///   gradients in the `2 bwd` columns, on the CPU tape (f64, f32) and the sim;
/// - `hard inputs` ([`hard::check_hard`]): large offsets, tiny variances, logits of ±80, `exp`
///   near overflow, against the f64 IR, in the same columns;
/// - `grid sizes` ([`grid`]): one case per reduction, scatter and conv family past 2¹⁸
///   elements, sim vs CPU f32 (`6 ≈cpu sim`) and deterministic runs (`6 det sim`).
pub const FAMILY_ROWS: [&str; 3] = ["conventions", "hard inputs", "grid sizes"];

/// One column's cell of the family row `name` (`None`: the column does not apply, or `name`
/// is not a family row). The grid cells run their fixed cases whatever `cfg.cases` says.
pub fn family_cell(name: &str, column: Column, cfg: &RunConfig) -> Option<Report> {
    let f64b = CpuTape::<f64>::new();
    let f32b = CpuTape::<f32>::new();
    let sim = CudaSim::new();
    let grads = match column.check {
        Check::Forward => false,
        Check::Backward => true,
        Check::CudaVsCpu if name == "grid sizes" => return Some(grid::check_grid_sim_vs_cpu()),
        Check::Deterministic if name == "grid sizes" => {
            return Some(grid::check_grid_deterministic());
        }
        _ => return None,
    };
    let which = match column.dtype {
        Some("f64") => Which::F64(&f64b),
        Some("f32") => Which::F32(&f32b),
        Some("sim") => Which::Sim(&sim),
        _ => return None,
    };
    match name {
        "conventions" => Some(match which {
            Which::F64(b) => conventions::check_conventions(b, cfg, grads),
            Which::F32(b) => conventions::check_conventions(b, cfg, grads),
            Which::Sim(b) => conventions::check_conventions(b, cfg, grads),
        }),
        "hard inputs" => Some(match which {
            Which::F64(b) => hard::check_hard(b, cfg, grads),
            Which::F32(b) => hard::check_hard(b, cfg, grads),
            Which::Sim(b) => hard::check_hard(b, cfg, grads),
        }),
        _ => None,
    }
}

/// A backend of the family rows.
enum Which<'a> {
    F64(&'a CpuTape<f64>),
    F32(&'a CpuTape<f32>),
    Sim(&'a CudaSim),
}

/// The family row `name` (one of [`FAMILY_ROWS`]).
pub fn family_row(name: &str, cfg: &RunConfig) -> Row {
    Row {
        name: name.to_owned(),
        cells: COLUMNS.iter().map(|&c| family_cell(name, c, cfg)).collect(),
    }
}

/// Run the applicable checks of one entry on the CPU tape and the CUDA sim.
pub fn op_row(entry: &OpInfo, cfg: &RunConfig) -> Row {
    let cells = COLUMNS
        .iter()
        .map(|&c| entry.applies.get(c.check).then(|| op_cell(entry, c, cfg)))
        .collect();
    Row {
        name: entry.name.to_owned(),
        cells,
    }
}

/// The cells of one entry's row on the CUDA sim that apply to it (checks 1, 2 and 6; check 5,
/// the sessions, has its own module): what a test runs again with a CUDA gate forced.
pub fn sim_cells(entry: &OpInfo, cfg: &RunConfig) -> Vec<Report> {
    COLUMNS
        .iter()
        .filter(|c| c.dtype == Some("sim") && c.check != Check::Session)
        .filter(|c| entry.applies.get(c.check))
        .map(|&c| op_cell(entry, c, cfg))
        .collect()
}

/// Run every check on random DAGs.
pub fn dag_row(cfg: &RunConfig) -> Row {
    Row {
        name: "dag".to_owned(),
        cells: COLUMNS.iter().map(|&c| Some(dag_cell(c, cfg))).collect(),
    }
}

/// Every registry row, then the DAG row.
pub fn all_rows(cfg: &RunConfig) -> Vec<Row> {
    row_names()
        .iter()
        .map(|n| row(n, cfg).expect("known row"))
        .collect()
}

/// The names of all rows: every registry entry, then `"dag"`, then the [`FAMILY_ROWS`].
pub fn row_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = registry::all().iter().map(|e| e.name).collect();
    names.push("dag");
    names.extend(FAMILY_ROWS);
    names
}

/// The row named `name` (a registry op, `"dag"` or a family row), or `None` for an unknown
/// name.
pub fn row(name: &str, cfg: &RunConfig) -> Option<Row> {
    if name == "dag" {
        Some(dag_row(cfg))
    } else if FAMILY_ROWS.contains(&name) {
        Some(family_row(name, cfg))
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
    /// Applicable cells that ran no case at all (pending cells not included).
    pub empty: usize,
    /// Applicable cells whose backend has no formula for the op yet ([`crate::PENDING`]):
    /// listed, not counted as passes.
    pub pending: usize,
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
            Some(r) if r.is_pending() => t.pending += 1,
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

/// The summary line of pending cells (`None` when there are none): how many, the ops, and
/// the cells they hold back (`op: column, ...`). DAG cells that skipped cases needing a pending
/// op (marked `*`) are named too.
pub fn pending_summary(rows: &[Row]) -> Option<String> {
    let mut ops = std::collections::BTreeSet::new();
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    for row in rows {
        for (c, cell) in COLUMNS.iter().zip(&row.cells) {
            let Some(r) = cell
                .as_ref()
                .filter(|r| r.passed() && !r.pending.is_empty())
            else {
                continue;
            };
            ops.extend(r.pending.iter().copied());
            if r.is_pending() {
                cells.push(format!("{} {}", row.name, c.header()));
            } else {
                skipped.push(format!("{} {}", row.name, c.header()));
            }
        }
    }
    if ops.is_empty() {
        return None;
    }
    let ops: Vec<&str> = ops.into_iter().collect();
    let mut line = format!(
        "{}: {} cell(s) pending, ops: {}",
        crate::PENDING,
        cells.len(),
        ops.join(", ")
    );
    if !skipped.is_empty() {
        let _ = write!(
            line,
            "; cases needing them skipped (*) in: {}",
            skipped.join(", ")
        );
    }
    line.push('\n');
    Some(line)
}

/// Width of the op-name column: fits every registry name and `"dag"` (tested), so the cells of
/// every row line up under the header.
pub const NAME_WIDTH: usize = 27;
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

/// One table line: the name, then `cases/maxerr`, `n/a`, `pending` or `FAIL` per column.
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
