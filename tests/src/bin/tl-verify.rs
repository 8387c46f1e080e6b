//! `tl-verify`: run every check for every registry op (and the random DAGs) on the CPU tape in
//! f64 and f32 and on the CUDA tape over the simulation device, print the op × check table, and
//! exit non-zero on any failure.
//!
//! ```text
//! tl-verify [--cases N] [--seed S] [--coverage] [--only NAME]...
//! ```
//! `--coverage` also fails when an applicable cell ran zero cases. Cells whose op has no CUDA
//! formula yet read `pending`: they are listed in a summary line naming the ops, and counted
//! neither as passes nor as failures. The last line is `N passed, N failed, N pending` (cells). `TL_CASES` / `TL_SEED` set the defaults of
//! `--cases` (64 otherwise) / `--seed`.

use std::process::ExitCode;

use std::io::Write;

use tl_conformance::RunConfig;
use tl_conformance::verify::{pending_summary, render_header, render_row, row, row_names, tally};

/// Print and flush (rows appear as they finish); a closed stdout (`| head`) is not an error.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

const USAGE: &str = "usage: tl-verify [--cases N] [--seed S] [--coverage] [--only OP]...
  defaults: --cases $TL_CASES or 64, --seed $TL_SEED or the harness' fixed seed";

/// Cases per cell when neither `--cases` nor `TL_CASES` is given.
const DEFAULT_CASES: u32 = 64;

struct Args {
    cfg: RunConfig,
    coverage: bool,
    only: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        cfg: RunConfig::from_env_or(DEFAULT_CASES),
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
    let names: Vec<String> = if args.only.is_empty() {
        row_names().into_iter().map(str::to_owned).collect()
    } else {
        args.only.clone()
    };
    if let Some(bad) = names.iter().find(|n| !row_names().contains(&n.as_str())) {
        eprintln!("tl-verify: no registry entry named {bad:?}");
        return ExitCode::from(2);
    }
    out(&format!(
        "tl-verify: CPU tape (f64, f32) and CUDA sim tape vs IR reference, {} case(s) per cell, seed {}\n",
        cfg.cases, cfg.seed
    ));
    out(&render_header());
    let mut rows = Vec::new();
    for name in &names {
        let r = row(name, &cfg).expect("names were checked");
        out(&render_row(&r));
        rows.push(r);
    }
    for report in rows.iter().flat_map(|r| r.cells.iter().flatten()) {
        if !report.passed() {
            out(&format!("\n{report}\n"));
        }
    }
    let t = tally(&rows);
    let mut ok = t.failed == 0;
    if args.coverage && t.empty > 0 {
        out(&format!(
            "coverage: {} applicable cell(s) ran zero cases\n",
            t.empty
        ));
        ok = false;
    }
    if let Some(line) = pending_summary(&rows) {
        out(&line);
    }
    out(&format!(
        "{} passed, {} failed, {} pending\n",
        t.passed, t.failed, t.pending
    ));
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
