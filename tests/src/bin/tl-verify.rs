//! `tl-verify`: run every check for every registry op (and the random DAGs) on the CPU tape in
//! f64 and f32, print the op × check table, and exit non-zero on any failure.
//!
//! ```text
//! tl-verify [--cases N] [--seed S] [--coverage] [--only NAME]...
//! ```
//! `--coverage` also fails when an applicable cell ran zero cases. The last line is
//! `N passed, N failed` (counting cells).

use std::process::ExitCode;

use tl_conformance::verify::{all_rows, dag_row, op_row, render, tally};
use tl_conformance::{RunConfig, registry};

const USAGE: &str = "usage: tl-verify [--cases N] [--seed S] [--coverage] [--only OP]...";

struct Args {
    cfg: RunConfig,
    coverage: bool,
    only: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        cfg: RunConfig {
            cases: 64,
            ..RunConfig::default()
        },
        coverage: false,
        only: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--cases" => {
                let v = value("--cases")?;
                args.cfg.cases = v
                    .parse()
                    .map_err(|_| format!("--cases {v}: not a number"))?;
            }
            "--seed" => {
                let v = value("--seed")?;
                args.cfg.seed = v.parse().map_err(|_| format!("--seed {v}: not a number"))?;
            }
            "--only" => args.only.push(value("--only")?),
            "--coverage" => args.coverage = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("tl-verify: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cfg = args.cfg;
    println!(
        "tl-verify: CPU tape (f64, f32) vs IR reference, {} case(s) per cell, seed {}",
        cfg.cases, cfg.seed
    );
    let rows = if args.only.is_empty() {
        all_rows(&cfg)
    } else {
        let mut rows = Vec::new();
        for name in &args.only {
            if name == "dag" {
                rows.push(dag_row(&cfg));
            } else if let Some(e) = registry::by_name(name) {
                rows.push(op_row(&e, &cfg));
            } else {
                eprintln!("tl-verify: no registry entry named {name:?}");
                return ExitCode::from(2);
            }
        }
        rows
    };
    print!("{}", render(&rows));
    for report in rows.iter().flat_map(|r| r.cells.iter().flatten()) {
        if !report.passed() {
            println!("\n{report}");
        }
    }
    let t = tally(&rows);
    let mut ok = t.failed == 0;
    if args.coverage && t.empty > 0 {
        println!("coverage: {} applicable cell(s) ran zero cases", t.empty);
        ok = false;
    }
    println!("{} passed, {} failed", t.passed, t.failed);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
