//! Memory of one CPU training step: the step benches' tl-nn models (`benches/common/models.rs`),
//! one model and one session (eager or linked) per process, so that one model's peak does not
//! hide another's. `benches/jax/ratio.py` runs it beside the JAX twin's memory analysis.
//!
//! ```sh
//! cargo run --release -p tl-session --example step_memory -- <model> [eager|linked] [--warm W] [--steps N] [--eval]
//! # <model>: mlp, cnn, transformer, wide-mlp, resnet, lm; default eager, W = 5, N = 3
//! ```
//!
//! With `--eval` the passes measured are evaluation passes of the model on the same batch
//! (`Runtime::eval`: eval mode, no gradients) instead of training steps; the optimizer's
//! state is then 0.
//!
//! The global allocator counts live heap bytes with a resettable peak (`benches/common/heap.rs`):
//! after `W` warm-up steps (the tape's pool fills in the first two), each of `N` steps is
//! measured: the live bytes before it, the most live at once during it (every thread), the live
//! bytes after it. The process's resident set (`VmRSS`, `VmHWM`) is read before the first step
//! and at the end. Then the parts of the live heap: the optimizer's state (the bytes freed when
//! it is dropped), the parameters (their element count × 4), the bytes the tape's buffer pool
//! holds after the last step and the most it held (`pool_stats`), and the live bytes left once
//! the session and the model are dropped. One line of JSON on stdout, the
//! figures in bytes; the threads are the library's (`TL_NUM_THREADS`, else the cores).

#[path = "../benches/common/heap.rs"]
#[allow(missing_docs)]
mod heap;
#[path = "../benches/common/models.rs"]
#[allow(missing_docs)]
mod models;

use heap::HeapSpan;
use models::{BenchModel, Run};
use peak_alloc::PeakAlloc;
use tl_nn::Result;
use tl_session::{LinkedSession, Options, Session, Train};
use tl_spec::pool::PoolStats;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// The command line.
struct Args {
    key: String,
    linked: bool,
    warm: usize,
    steps: usize,
    /// Evaluation passes instead of training steps.
    eval: bool,
}

fn usage(detail: String) -> tl_nn::Error {
    tl_nn::Error::Usage {
        what: "step_memory",
        detail,
    }
}

fn parse() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        key: String::new(),
        linked: false,
        warm: 5,
        steps: 3,
        eval: false,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "eager" => out.linked = false,
            "linked" => out.linked = true,
            "--eval" => out.eval = true,
            "--warm" | "--steps" => {
                let v = args.next().unwrap_or_default();
                let n = v
                    .parse::<usize>()
                    .map_err(|_| usage(format!("{a} takes a count, got {v:?}")))?;
                if a == "--warm" {
                    out.warm = n;
                } else if n == 0 {
                    return Err(usage("--steps must be at least 1".into()));
                } else {
                    out.steps = n;
                }
            }
            key if out.key.is_empty() && !key.starts_with('-') => out.key = key.to_string(),
            other => return Err(usage(format!("unknown argument {other:?}"))),
        }
    }
    if out.key.is_empty() {
        return Err(usage(
            "name a model: mlp, cnn, transformer, wide-mlp, resnet, lm".into(),
        ));
    }
    Ok(out)
}

/// What one process measured.
struct Report {
    rss_before: Option<(usize, usize)>,
    rss_end: Option<(usize, usize)>,
    live_before_first: usize,
    steps: Vec<HeapSpan>,
    optimizer_state: usize,
    params: usize,
    /// The tape's pool after the last step: bytes held, and the most it held.
    pool: Option<PoolStats>,
    /// Live bytes once the session and the model are dropped (what the process keeps outside
    /// them: the GEMM's per-thread packing buffers, the batch).
    live_after_drop: usize,
}

fn measure<S: Train<T = f32>>(
    s: S,
    m: &BenchModel,
    a: &Args,
    pool: fn(&S) -> Option<PoolStats>,
) -> Result<Report> {
    let mut run = Run::with_session(m, s)?;
    let live_before_first = ALLOC.current_usage();
    let rss_before = heap::rss();
    let pass = |run: &mut Run<S>| -> Result<()> {
        match a.eval {
            true => m.eval_pass(&run.rt, &run.net).map(drop),
            false => m.train_step(&mut run.rt, &run.net, &mut run.opt).map(drop),
        }
    };
    for _ in 0..a.warm {
        pass(&mut run)?;
    }
    let mut steps = Vec::with_capacity(a.steps);
    for _ in 0..a.steps {
        let (done, span) = heap::measure(&ALLOC, || pass(&mut run));
        done?;
        steps.push(span);
    }
    let rss_end = heap::rss();
    let pool = pool(&run.rt.session());
    // The optimizer's state: what dropping it frees (a fresh optimizer holds none).
    let fresh = m.optimizer()?;
    let with_state = ALLOC.current_usage();
    drop(std::mem::replace(&mut run.opt, fresh));
    let optimizer_state = with_state.saturating_sub(ALLOC.current_usage());
    let params = run
        .param_values()?
        .iter()
        .map(|t| t.shape().numel() * std::mem::size_of::<f32>())
        .sum();
    drop(run);
    Ok(Report {
        live_after_drop: ALLOC.current_usage(),
        rss_before,
        rss_end,
        live_before_first,
        steps,
        optimizer_state,
        params,
        pool,
    })
}

fn json_opt(v: Option<usize>) -> String {
    v.map_or_else(|| "null".to_string(), |b| b.to_string())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let a = parse()?;
    let m = BenchModel::from_key(&a.key).ok_or_else(|| {
        usage(format!(
            "unknown model {:?}; choose from mlp, cnn, transformer, wide-mlp, resnet, lm",
            a.key
        ))
    })?;
    let r = if a.linked {
        measure(
            LinkedSession::<f32>::new(),
            &m,
            &a,
            LinkedSession::pool_stats,
        )?
    } else {
        let s = Session::<f32>::new(Options::default())?;
        measure(s, &m, &a, Session::pool_stats)?
    };
    let most = |f: fn(&HeapSpan) -> usize| r.steps.iter().map(f).max().unwrap_or(0);
    let steps: Vec<String> = r
        .steps
        .iter()
        .map(|s| format!("[{}, {}, {}]", s.before, s.peak, s.after))
        .collect();
    println!(
        "{{\"model\": \"{}\", \"session\": \"{}\", \"pass\": \"{}\", \"threads\": {}, \"warm\": {}, \
         \"rss_before_first_step\": {}, \"rss_hwm_before_first_step\": {}, \"rss_end\": {}, \
         \"rss_hwm\": {}, \"live_before_first_step\": {}, \"live_before_step\": {}, \
         \"step_peak\": {}, \"step_growth\": {}, \"steps_before_peak_after\": [{}], \
         \"optimizer_state\": {}, \"params\": {}, \"pool_held\": {}, \"pool_peak_held\": {}, \
         \"live_after_drop\": {}}}",
        a.key,
        if a.linked { "linked" } else { "eager" },
        if a.eval { "eval" } else { "step" },
        tl_tape_cpu::threads(),
        a.warm,
        json_opt(r.rss_before.map(|x| x.0)),
        json_opt(r.rss_before.map(|x| x.1)),
        json_opt(r.rss_end.map(|x| x.0)),
        json_opt(r.rss_end.map(|x| x.1)),
        r.live_before_first,
        most(|s| s.before),
        most(|s| s.peak),
        most(HeapSpan::growth),
        steps.join(", "),
        r.optimizer_state,
        r.params,
        json_opt(r.pool.map(|p| p.held_bytes)),
        json_opt(r.pool.map(|p| p.peak_held_bytes)),
        r.live_after_drop,
    );
    Ok(())
}
