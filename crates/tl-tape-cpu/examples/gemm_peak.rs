//! This machine's f32 GEMM rate: a square `n³` product `c = a·b` through the one GEMM
//! (`tl_tape_cpu::gemm::matmul`), the best of a few runs after one warm-up, in GFLOP/s
//! (`2·n³` FLOP a product). The thread count is the library's (`TL_NUM_THREADS`, else the
//! cores); pin the process (`taskset -c 1`) for one core.
//!
//! ```sh
//! cargo run --release -p tl-tape-cpu --example gemm_peak [-- n runs]   # default 2048, 5
//! ```
//!
//! `benches/jax/ratio.py` runs it at one thread (pinned) and at every core, and divides each
//! model's step rate by it ("% of our GEMM peak"). The last line is machine-readable:
//! `gemm_peak n=<n> threads=<t> best_ms=<ms> gflops=<rate>`.

#[path = "../benches/common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::values;
use std::process::ExitCode;
use std::time::Instant;

use tl_ir::Op;
use tl_tape_cpu::gemm::{matmul, rows, rows_mut};

/// The positional argument `i` as a positive integer, or `default` when it is absent.
fn arg(i: usize, name: &str, default: usize) -> Result<usize, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("gemm_peak: {name} must be a positive integer, got {v:?}")),
    }
}

fn run() -> Result<(), String> {
    let n = arg(1, "n", 2048)?;
    let runs = arg(2, "runs", 5)?;
    if n > 16_384 {
        return Err(format!(
            "gemm_peak: n = {n} is over 16384 (three n² f32 buffers)"
        ));
    }
    let (a, b) = (values(n * n, 1), values(n * n, 2));
    let mut c = vec![0.0f32; n * n];
    let op = Op::Matmul;
    let mut best = f64::INFINITY;
    // One warm-up product (packing buffers, thread start-up), then `runs` timed ones.
    for r in 0..=runs {
        let t = Instant::now();
        let av = rows(&op, &a, n, n).map_err(|e| e.to_string())?;
        let bv = rows(&op, &b, n, n).map_err(|e| e.to_string())?;
        let cv = rows_mut(&op, &mut c, n, n).map_err(|e| e.to_string())?;
        matmul(&op, cv, false, av, bv, 1.0).map_err(|e| e.to_string())?;
        let s = t.elapsed().as_secs_f64();
        if r > 0 {
            best = best.min(s);
        }
    }
    std::hint::black_box(&c);
    let gflops = 2.0 * (n as f64).powi(3) / best / 1e9;
    println!(
        "gemm_peak n={n} threads={} best_ms={:.3} gflops={gflops:.1}",
        tl_tape_cpu::threads(),
        best * 1e3
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
