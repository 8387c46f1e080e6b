//! Heap allocations per training step on the CPU: the step benches' tl-nn models (mlp, cnn,
//! transformer block; `benches/common/models.rs`), eager and linked, each step the user's
//! `Runtime::step` (reset, record, `backward_step` with SGD).
//!
//! ```sh
//! cargo run --release -p tl-session --example cpu_allocs
//! ```
//!
//! dhat's global allocator (testing mode) counts every block the process allocates. Each
//! figure is the sixth step's (five warm up: the tape's buffer pool fills in the first two); the
//! seventh is measured too and the
//! program fails unless it allocates the same number of blocks. One GEMM thread
//! (`tl_tape_cpu::set_threads(1)`), so the count does not depend on the machine's cores.

#[path = "../benches/common/models.rs"]
#[allow(missing_docs)]
mod models;

use models::{BenchModel, Run};
use tl_nn::Result;
use tl_session::{LinkedSession, Options, Session, Train};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Blocks and bytes allocated by one step, and the bytes still live after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepAllocs {
    blocks: u64,
    bytes: u64,
    live_after: usize,
}

/// The allocations of the sixth and seventh steps of `m` in `s`.
fn measure<S: Train<T = f32>>(s: S, m: &BenchModel) -> Result<[StepAllocs; 2]> {
    let mut run = Run::with_session(m, s)?;
    for _ in 0..5 {
        m.train_step(&mut run.rt, &run.net, &mut run.opt)?;
    }
    let mut out = [None, None];
    for o in &mut out {
        let before = dhat::HeapStats::get();
        m.train_step(&mut run.rt, &run.net, &mut run.opt)?;
        let after = dhat::HeapStats::get();
        *o = Some(StepAllocs {
            blocks: after.total_blocks - before.total_blocks,
            bytes: after.total_bytes - before.total_bytes,
            live_after: after.curr_bytes,
        });
    }
    let [Some(a), Some(b)] = out else {
        unreachable!("both steps measured")
    };
    Ok([a, b])
}

fn main() -> std::process::ExitCode {
    let _profiler = dhat::Profiler::builder().testing().build();
    tl_tape_cpu::set_threads(1);
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let models = [
        ("mlp b64", BenchModel::mlp(64)),
        ("cnn b64", BenchModel::cnn(64)),
        ("transformer n128", BenchModel::transformer(128)),
    ];
    println!("CPU, f32, SGD; heap allocations per training step (steady state)\n");
    println!("| model | session | allocations | MiB allocated | live MiB after |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let mib = |b: f64| b / (1024.0 * 1024.0);
    for (name, m) in &models {
        for linked in [false, true] {
            let [a, b] = if linked {
                measure(LinkedSession::<f32>::new(), m)?
            } else {
                measure(Session::<f32>::new(Options::default())?, m)?
            };
            if a.blocks != b.blocks {
                return Err(tl_nn::Error::Usage {
                    what: "cpu_allocs",
                    detail: format!("{name}: steps 6 and 7 differ ({a:?} vs {b:?})"),
                });
            }
            println!(
                "| {name} | {} | {} | {:.2} | {:.2} |",
                if linked { "linked" } else { "eager" },
                a.blocks,
                mib(a.bytes as f64),
                mib(a.live_after as f64)
            );
        }
    }
    Ok(())
}
