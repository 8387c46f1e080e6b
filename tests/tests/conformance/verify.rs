//! The `tl-verify` table: rows, cells, `n/a` where a check does not apply, and the tally that
//! drives its exit status and `--coverage`.

use tl_conformance::verify::{COLUMNS, FAMILY_ROWS, NAME_WIDTH, render, row, row_names, tally};
use tl_conformance::{Report, RunConfig};

#[test]
fn rows_cover_every_op_and_the_dag_and_tally_their_cells() {
    let names = row_names();
    let ops = tl_conformance::registry::all().len();
    assert_eq!(names.len(), ops + 1 + FAMILY_ROWS.len());
    assert_eq!(names[ops], "dag");
    assert_eq!(&names[ops + 1..], FAMILY_ROWS);
    assert!(row("no-such-op", &RunConfig::default()).is_none());

    let cfg = RunConfig {
        cases: 3,
        ..RunConfig::default()
    };
    let rows = vec![row("mul", &cfg).unwrap(), row("detach", &cfg).unwrap()];
    let t = tally(&rows);
    assert_eq!(
        (t.passed, t.failed, t.not_applicable, t.empty),
        (2 * COLUMNS.len() - 1, 0, 1, 0)
    );
    let table = render(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].contains("1 fwd f64") && lines[0].contains("4 jvp"));
    assert!(lines[0].contains("2 bwd sim") && lines[0].contains("6 det sim"));
    assert!(lines[0].contains("5 sess cpu") && lines[0].contains("5 sess sim"));
    assert!(lines[1].starts_with("mul") && lines[1].matches("3/").count() == COLUMNS.len());
    assert!(lines[2].starts_with("detach") && lines[2].contains("n/a"));
    // Every row name fits its column, so the cells line up under the header.
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap();
    assert!(longest < NAME_WIDTH, "{longest} >= {NAME_WIDTH}");
    let width = |l: &str| l.chars().count();
    assert!(lines.iter().all(|l| width(l) == width(lines[0])), "{table}");

    let empty = RunConfig {
        cases: 0,
        ..RunConfig::default()
    };
    // A run of zero cases checks nothing: every cell fails, naming the count (it passed
    // empty, which only --coverage rejected).
    let r = row("add", &empty).unwrap();
    let t = tally(std::slice::from_ref(&r));
    assert_eq!((t.passed, t.failed), (0, COLUMNS.len()));
    let failures: Vec<&Report> = r.cells.iter().flatten().filter(|c| !c.passed()).collect();
    assert!(
        failures.len() == COLUMNS.len()
            && failures
                .iter()
                .all(|c| c.to_string().contains("case count is 0")),
        "{failures:?}"
    );
}

#[test]
fn family_rows_fill_the_columns_of_their_backends_and_pass() {
    let cfg = RunConfig {
        cases: 4,
        ..RunConfig::default()
    };
    let want = |name: &str, headers: &[&str]| {
        let r = row(name, &cfg).unwrap();
        let filled: Vec<String> = COLUMNS
            .iter()
            .zip(&r.cells)
            .filter(|(_, c)| c.is_some())
            .map(|(col, _)| col.header())
            .collect();
        assert_eq!(filled, headers, "{name}");
        let t = tally(std::slice::from_ref(&r));
        assert_eq!(
            (t.passed, t.failed, t.empty),
            (headers.len(), 0, 0),
            "{name}"
        );
    };
    let six = [
        "1 fwd f64",
        "1 fwd f32",
        "1 fwd sim",
        "2 bwd f64",
        "2 bwd f32",
        "2 bwd sim",
    ];
    want("conventions", &six);
    want("hard inputs", &six);
    want("grid sizes", &["6 ≈cpu sim", "6 det sim"]);
}
