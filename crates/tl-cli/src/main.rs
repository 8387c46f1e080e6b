//! `tl`: train, evaluate and verify models on the torchlean-rs runtime. Every error a user can
//! hit prints one `error: ...` line on stderr and exits non-zero: 2 for a usage error (a flag
//! or value clap refuses, or a flag value the command refuses after parsing: the error's
//! [`Kind`]), 1 for a failure while running (I/O, a checkpoint, a backend, training). A bare
//! `tl` prints the help on stderr and exits 2.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use indicatif::{ProgressBar, ProgressStyle};
use tl_cli::cli::{Cli, Command, EvalArgs, GraphArgs, TrainArgs, VerifyArgs};
use tl_cli::error::Kind;
use tl_cli::train::{EvalConfig, TrainConfig, eval_checkpoint, train};
use tl_cli::{CliError, Result, dot, plot, verify};
use tl_conformance::RunConfig;
use tl_conformance::verify::render_header;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // A bare `tl`: the whole help, as clap prints it (on stderr), and a usage exit.
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(Kind::Usage.exit_code());
        }
        Err(e) => {
            eprintln!("{}", clap_one_line(&e.to_string()));
            return ExitCode::from(Kind::Usage.exit_code());
        }
    };
    let r = match cli.command {
        Command::Train(a) => cmd_train(&a),
        Command::Eval(a) => cmd_eval(&a),
        Command::Verify(a) => cmd_verify(&a),
        Command::Graph(a) => cmd_graph(&a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// clap's multi-line message as one line: the `error:` line, plus a `[possible values: …]` or
/// `tip:` line if there is one, then where to look.
fn clap_one_line(text: &str) -> String {
    let mut parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .collect();
    parts.push("(see tl --help)");
    let line = parts.join(" ");
    if line.starts_with("error:") {
        line
    } else {
        format!("error: {line}")
    }
}

/// Print and flush; a closed stdout (`| head`) is not an error.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

fn cmd_train(a: &TrainArgs) -> Result<ExitCode> {
    let cfg = TrainConfig::from_args(a)?;
    // Rank 0 writes the outputs; under mpirun with several ranks another machine's paths are
    // not this one's to check.
    if tl_cli::dist::launched_ranks().is_none_or(|n| n == 1) {
        tl_cli::outputs::check(a.save.as_deref(), a.plot.as_deref(), cfg.epochs)?;
    }
    let report = train(&cfg, |line| out(&format!("{line}\n")))?;
    if report.rank != 0 {
        // Under mpirun rank 0 prints and writes the outputs (its checkpoint: `train`).
        return Ok(ExitCode::SUCCESS);
    }
    let baseline = report
        .baseline
        .map(|b| format!(" (unigram baseline {b:.4} nats/char)"))
        .unwrap_or_default();
    out(&format!(
        "done: {} epoch(s) in total; train {}; test {}{baseline}\n",
        report.checkpoint.header.epochs,
        report.train.summary(),
        report.test.summary(),
    ));
    if let (Some((s, m)), Some(p)) = (&report.super_res, &cfg.paper) {
        out(&format!(
            "zero-shot super-resolution: trained at s = {}, test at s = {s}: {}\n",
            p.grid,
            m.summary()
        ));
    }
    out(&format!(
        "wall time per epoch: {:.2} s ({} thread(s))\n",
        report.epoch_secs,
        tl_nn::threads()
    ));
    if let Some(p) = &a.plot {
        plot::write_loss_png(p, &report.step_losses, &report.epoch_losses)?;
        out(&format!("wrote loss curve {}\n", p.display()));
    }
    if let Some(p) = &a.save {
        // `train` wrote it (with the runtime's parameters and the optimizer's state).
        out(&format!("saved checkpoint {}\n", p.display()));
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_eval(a: &EvalArgs) -> Result<ExitCode> {
    let cfg = EvalConfig {
        checkpoint: a.checkpoint.clone(),
        model: a.model,
        backend: a.backend.backend(),
        grid: a.grid,
        data_cache: a.data_cache.clone(),
        ..EvalConfig::new(&a.checkpoint)
    };
    let r = eval_checkpoint(&cfg, &mut |line| eprintln!("{line}"))?;
    out(&format!(
        "{} ({} epoch(s)) on {}: {}\n",
        r.header.model.as_str(),
        r.header.epochs,
        r.data,
        r.metrics.summary()
    ));
    Ok(ExitCode::SUCCESS)
}

fn cmd_verify(a: &VerifyArgs) -> Result<ExitCode> {
    let backend = a.backend.backend();
    verify::check_backend(backend)?;
    let mut cfg = RunConfig::from_env_or(64);
    if let Some(c) = a.cases {
        if c == 0 {
            return Err(CliError::usage(
                "--cases 0: must be at least 1 (0 would check nothing)",
            ));
        }
        cfg.cases = c;
    }
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    let names = verify::names(&a.only)?;
    let what = match backend {
        tl_session::Backend::CudaSim => {
            "CUDA tape on the simulation device (f32) vs IR reference; checks 3-4 are backend-independent (run them with --backend cpu)"
        }
        _ => "CPU tape (f64, f32) vs IR reference",
    };
    if !a.json {
        out(&format!(
            "tl verify: {what}, {} case(s) per cell, seed {}\n",
            cfg.cases, cfg.seed
        ));
        out(&render_header());
    }
    let pb = if a.json {
        ProgressBar::new(names.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template("verifying [{bar:30}] {pos}/{len} {msg}") {
        pb.set_style(style.progress_chars("=> "));
    }
    let mut rows = Vec::new();
    for name in &names {
        pb.set_message(name.clone());
        let r = verify::run_row(backend, name, &cfg)
            .ok_or_else(|| CliError::new(format!("no row named {name}")))?;
        if !a.json {
            out(&tl_conformance::verify::render_row(&r));
        }
        pb.inc(1);
        rows.push(r);
    }
    pb.finish_and_clear();
    let t = verify::counts(&rows);
    if a.json {
        let v = verify::to_json(backend, &cfg, &rows);
        out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ));
    } else {
        for report in rows.iter().flat_map(|r| r.cells.iter().flatten()) {
            if !report.passed() && !report.is_pending() {
                out(&format!("\n{report}\n"));
            }
        }
        if t.pending > 0 {
            out(&format!(
                "{} cell(s) pending: those ops have no CUDA formula yet (issue 4); not counted as failures\n",
                t.pending
            ));
        }
        out(&format!("{} passed, {} failed\n", t.passed, t.failed));
    }
    Ok(if t.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn cmd_graph(a: &GraphArgs) -> Result<ExitCode> {
    let g = dot::record(a.model, a.batch_size)?;
    let text = dot::to_dot(&g, a.model.as_str());
    match &a.output {
        Some(p) => {
            // Atomic (a temporary file in the same directory, synced, renamed over `p`): a
            // failed write leaves the previous file intact.
            tl_nn::checkpoint::write_atomic(p, text.as_bytes())
                .map_err(|e| CliError::new(format!("cannot write the graph to {e}")))?;
            eprintln!(
                "wrote {} ({} leaves, {} ops); render with `dot -Tsvg {} -o model.svg`",
                p.display(),
                g.num_leaves(),
                g.nodes().len(),
                p.display()
            );
        }
        None => out(&text),
    }
    Ok(ExitCode::SUCCESS)
}
