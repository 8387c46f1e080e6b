//! Checks 1, 2 and 6 on the CUDA tape over the simulation device, for every registry entry and
//! for random DAGs; and the pending path: an op whose CUDA formula is missing makes its cells
//! pending (listed, not passed, not failed) and is kept out of random DAGs.

use tl_conformance::backend::SimWith;
use tl_conformance::checks::sim::{
    check_backward_dag_on, check_backward_on, check_deterministic_dag, check_forward_sim_dag,
    check_sim_vs_cpu_dag, sim_pending_ops,
};
use tl_conformance::verify::{COLUMNS, op_row, pending_summary, tally};
use tl_conformance::{Check, CudaSim, PENDING, Report, RunConfig, assert_all_passed, registry};
use tl_ir::Op;
use tl_tape_cuda::{CudaTape, Error, SimDevice};

/// Per-op sim cells: a quarter of the default count (four sim columns per op) unless
/// `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

#[test]
fn every_registry_op_passes_checks_1_2_and_6_on_the_sim_or_is_pending() {
    let cfg = cfg();
    let sim_cols: Vec<usize> = COLUMNS
        .iter()
        .enumerate()
        .filter(|(_, c)| c.dtype == Some("sim") && c.check != Check::Session)
        .map(|(k, _)| k)
        .collect();
    // Check 5's sim column runs in the `session` module.
    assert_eq!(sim_cols.len(), 4);
    let mut reports: Vec<Report> = Vec::new();
    let mut pending = Vec::new();
    for entry in registry::all() {
        for &k in &sim_cols {
            if !entry.applies.get(COLUMNS[k].check) {
                continue;
            }
            let r = tl_conformance::verify::op_cell(&entry, COLUMNS[k], &cfg);
            if r.is_pending() {
                pending.push(r.label.clone());
            } else {
                reports.push(r);
            }
        }
    }
    if !pending.is_empty() {
        eprintln!("{PENDING}: {}", pending.join(", "));
    }
    // Ops the probe finds pending are exactly those with pending cells.
    let probed = sim_pending_ops();
    for p in &pending {
        assert!(
            probed.iter().any(|op| p.contains(&format!(" {op} "))),
            "{p}"
        );
    }
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn random_dags_pass_checks_1_2_and_6_on_the_sim() {
    let cfg = cfg();
    let sim = CudaSim::new();
    let reports = [
        check_forward_sim_dag(&cfg),
        check_backward_dag_on(&sim, &cfg),
        check_sim_vs_cpu_dag(&cfg),
        check_deterministic_dag(&cfg),
    ];
    for r in &reports {
        assert!(!r.is_pending(), "{r}");
    }
    assert_all_passed(&reports, cfg.cases);
}

/// Records as the sim does, except that `tanh` answers `Unsupported`, as an op without a CUDA
/// formula does.
fn record_without_tanh(
    tape: &mut CudaTape<SimDevice>,
    op: &Op,
    args: &[usize],
) -> Result<usize, Error> {
    if *op == Op::Tanh {
        return Err(Error::Unsupported { op: op.name() });
    }
    tape.apply(op, args)
}

#[test]
fn an_op_without_a_cuda_formula_is_pending_not_failed_nor_passed() {
    let cfg = RunConfig {
        cases: 16,
        ..RunConfig::default()
    };
    let no_tanh = SimWith::new("cuda-sim-no-tanh", record_without_tanh);
    let tanh = registry::by_name("tanh").unwrap();
    let r = check_backward_on(&no_tanh, &tanh, &cfg);
    assert!(r.is_pending() && r.passed(), "{r}");
    assert_eq!(
        (r.cases, r.pending.as_slice(), r.cell().as_str()),
        (0, &["tanh"][..], "pending")
    );
    assert!(
        r.to_string()
            .contains("pending (CUDA formula missing): tanh"),
        "{r}"
    );

    // Other ops are unaffected.
    let mul = registry::by_name("mul").unwrap();
    let r = check_backward_on(&no_tanh, &mul, &cfg);
    assert!(
        r.passed() && !r.is_pending() && r.pending.is_empty() && r.cases == 16,
        "{r}"
    );

    // Random DAGs skip the cases that need tanh, list it, and still run their full count.
    let r = check_backward_dag_on(&no_tanh, &cfg);
    assert!(r.passed() && r.cases == 16, "{r}");
    // The list names tanh and every op the sim itself has no formula for (those the DAGs are
    // drawn without), and nothing else.
    let mut want: Vec<&str> = sim_pending_ops().iter().copied().collect();
    want.push("tanh");
    want.sort_unstable();
    want.dedup();
    assert_eq!(r.pending, want);
    assert!(r.cell().ends_with('*'), "{}", r.cell());

    // A check that is not pending-aware fails, naming the op: never a silent pass.
    let plain = tl_conformance::checks::check_backward(&no_tanh, &tanh, &cfg);
    assert!(!plain.passed(), "{plain}");
    assert!(plain.failure.unwrap().contains(PENDING));
}

#[test]
fn the_table_counts_pending_cells_apart_and_names_their_ops() {
    let cfg = RunConfig {
        cases: 3,
        ..RunConfig::default()
    };
    let mut row = op_row(&registry::by_name("exp").unwrap(), &cfg);
    assert_eq!(row.cells.len(), COLUMNS.len());
    let t = tally(std::slice::from_ref(&row));
    assert_eq!((t.passed, t.failed, t.pending), (COLUMNS.len(), 0, 0));
    assert!(pending_summary(std::slice::from_ref(&row)).is_none());

    // Make the sim backward cell pending, as a missing formula would.
    let k = COLUMNS
        .iter()
        .position(|c| c.check == Check::Backward && c.dtype == Some("sim"))
        .unwrap();
    let cell = row.cells[k].as_mut().unwrap();
    cell.cases = 0;
    cell.pending = vec!["exp"];
    let t = tally(std::slice::from_ref(&row));
    assert_eq!(
        (t.passed, t.failed, t.pending, t.empty),
        (COLUMNS.len() - 1, 0, 1, 0)
    );
    let line = pending_summary(std::slice::from_ref(&row)).unwrap();
    assert!(line.contains("1 cell(s) pending, ops: exp"), "{line}");
    assert!(line.starts_with(PENDING), "{line}");
}

/// Records as the sim does, except `max(a, b)` as `relu(a − b) + b`: the same value up to
/// rounding and the same gradient off ties, but a tie sends the whole gradient to `b` (a wrong
/// tie rule, invisible to the tie-free registry cases).
fn record_max_with_a_wrong_tie_rule(
    tape: &mut CudaTape<SimDevice>,
    op: &Op,
    args: &[usize],
) -> Result<usize, Error> {
    if *op != Op::Max {
        return tape.apply(op, args);
    }
    let d = tape.apply(&Op::Sub, &[args[0], args[1]])?;
    let r = tape.apply(&Op::Relu, &[d])?;
    tape.apply(&Op::Add, &[r, args[1]])
}

#[test]
fn the_kink_share_of_the_sim_checks_catches_a_wrong_tie_rule() {
    let cfg = cfg();
    let mutant = SimWith::new("cuda-sim-max-tie", record_max_with_a_wrong_tie_rule);
    let max = registry::by_name("max").unwrap();
    // Without ties the mutant is right ...
    let tie_free = tl_conformance::run_check(
        "2 bwd max tie-free mutant".into(),
        &cfg,
        tl_conformance::checks::op_graph_cases(&max),
        |c| tl_conformance::checks::backward_case(&mutant, c, &max.tol),
    );
    assert!(tie_free.passed(), "{tie_free}");
    // ... and the sim check, a quarter of whose cases sit on ties, fails.
    let r = check_backward_on(&mutant, &max, &cfg);
    let msg = r.failure.expect("the kink share has ties");
    assert!(msg.contains("gradient of %"), "{msg}");
    // So does the conventions check on it.
    let conv = tl_conformance::checks::conventions::check_conventions(&mutant, &cfg, true);
    assert!(!conv.passed(), "{conv}");
}
