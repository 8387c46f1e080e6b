//! Device memory of one `multiHeadAttention` call, forward and backward, on the CUDA tape over
//! the simulation device (whose allocator is the GPU's caching allocator, so the telemetry
//! counts what a GPU would hold): `fused = true` (the flash kernels, O(n·d)) beside
//! `fused = false` (the composed launches, which hold (heads, n, n) scores and probabilities).
//!
//! ```sh
//! cargo run -p tl-tape-cuda --example flash_memory                  # n = 1k, 4k, 16k
//! cargo run -p tl-tape-cuda --example flash_memory -- --n 1024,4096 --composed-max 4096
//! cargo run -p tl-tape-cuda --example flash_memory -- --n 4096,16384 --queries 256
//! cargo run -p tl-tape-cuda --example flash_memory -- --n 1024,4096 --precision bf16
//! ```
//!
//! With `--queries m`, the call is `scaledDotProductAttention` of m queries over the n keys
//! under the causal mask aligned at the bottom right (the newest m positions of a sequence
//! whose first n − m are cached: a KV cache's chunk), where the composed path holds (m, n)
//! scores.
//!
//! With `--precision bf16` (or `tf32`) the tape runs under autocast
//! (`CudaTape::set_precision`): the fused core rounds its operands, probabilities and dS
//! (two passes over the keys forward, O(n·d) as in f32), the composed path's products round
//! theirs.
//!
//! One causal attention, batch 1, one head of `d` = 4 (dModel 4: the sim computes every score on
//! the host, n²·d work per pass, so a small head keeps n = 16k to tens of seconds; the memory
//! terms are the same functions of n and d as on a GPU). Per run: the peak of the buffers the
//! call allocated (the operands' bytes subtracted), what the node keeps for its backward, and
//! the live bytes once the gradients are released (nothing may be left). Prints a markdown
//! table (docs/performance.md, "Attention memory").

use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Precision, SimDevice};

struct Args {
    ns: Vec<usize>,
    composed_max: usize,
    d: usize,
    /// `Some(m)`: scaledDotProductAttention of m queries over the n keys.
    queries: Option<usize>,
    /// The tape's products: f32 or autocast.
    precision: Precision,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        ns: vec![1024, 4096, 16384],
        composed_max: 4096,
        d: 4,
        queries: None,
        precision: Precision::F32,
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.and_then(|s| s.parse().ok())
            .filter(|&n| n > 0)
            .ok_or(format!("{what} needs a positive number"))
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "--n" => {
                a.ns = it
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(|s| s.parse().map_err(|_| format!("--n: bad length {s:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--composed-max" => a.composed_max = num(it.next(), "--composed-max")?,
            "--d" => a.d = num(it.next(), "--d")?,
            "--queries" => a.queries = Some(num(it.next(), "--queries")?),
            "--precision" => {
                a.precision = match it.next().as_deref() {
                    Some("f32") => Precision::F32,
                    Some("bf16") => Precision::Bf16,
                    Some("tf32") => Precision::Tf32,
                    other => return Err(format!("--precision: f32, bf16 or tf32, not {other:?}")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// (peak bytes the call allocated, bytes the node kept, bytes left at the end, seconds).
fn run(a: &Args, n: usize, fused: bool) -> Result<(usize, usize, usize, f64), String> {
    let (d, queries) = (a.d, a.queries);
    let e = |e: tl_tape_cuda::Error| e.to_string();
    let start = std::time::Instant::now();
    let mut tape = CudaTape::new(SimDevice::new());
    tape.set_precision(a.precision);
    let fill = |dims: &[usize], salt: u64| {
        Tensor::<f32>::from_fn(Shape::new(dims), |i| {
            ((tl_spec::rng::unit(salt, i as u64) - 0.5) * 2.0) as f32
        })
    };
    let shapes: Vec<[usize; 2]> = match queries {
        None => vec![[d, d], [d, d], [d, d], [d, d], [n, d]],
        Some(m) => vec![[m, d], [n, d], [n, d]],
    };
    let mut leaves = Vec::new();
    for (k, s) in shapes.iter().enumerate() {
        leaves.push(
            tape.upload_leaf(&fill(s, k as u64), None, true)
                .map_err(e)?,
        );
    }
    let base = tape.device().memory_usage().live_bytes;
    let op = match queries {
        None => Op::MultiHeadAttention {
            heads: 1,
            mask: Some(Mask::causal(n).map_err(|e| e.to_string())?),
            fused,
        },
        Some(m) => Op::ScaledDotProductAttention {
            heads: 1,
            mask: Some(Mask::causal_lower_right(m, n).map_err(|e| e.to_string())?),
            fused,
        },
    };
    let y = tape.apply(&op, &leaves).map_err(e)?;
    let kept: usize = tape
        .node(y)
        .ok_or("the node is missing")?
        .cleanup()
        .iter()
        .map(|b| b.bytes())
        .sum();
    let loss = tape.apply(&Op::Sum, &[y]).map_err(e)?;
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).map_err(e)?;
    let grads = tape.backward_dense(loss, &seed).map_err(e)?;
    let peak = tape.device().memory_usage().peak_bytes - base;
    tape.release_grads(grads);
    tape.device_mut().release(seed.buffer());
    tape.reset();
    let left = tape.device().memory_usage().live_bytes;
    Ok((peak, kept, left, start.elapsed().as_secs_f64()))
}

/// `b` bytes in MiB (in KiB below 0.01 MiB, which would print as 0.00; in bytes below 1 KiB).
fn mib(b: usize) -> String {
    let m = b as f64 / (1 << 20) as f64;
    match (b < 1024, m < 0.005) {
        (true, _) => format!("{b} B"),
        (false, true) => format!("{:.1} KiB", b as f64 / 1024.0),
        (false, false) => format!("{m:.2} MiB"),
    }
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("flash_memory: {e}");
            std::process::exit(2);
        }
    };
    let n_col = match a.queries {
        None => "n".to_string(),
        Some(m) => format!("{m} queries over n keys"),
    };
    println!(
        "| {n_col} | d | path ({}) | peak during the call | kept for the backward | left after | sim seconds |",
        a.precision.name()
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &a.ns {
        for fused in [true, false] {
            let path = if fused { "flash (fused)" } else { "composed" };
            if !fused && n > a.composed_max {
                println!(
                    "| {n} | {} | {path} | not run (--composed-max {}) | | | |",
                    a.d, a.composed_max
                );
                continue;
            }
            match run(&a, n, fused) {
                Ok((peak, kept, left, secs)) => println!(
                    "| {n} | {} | {path} | {} | {} | {left} B | {secs:.1} |",
                    a.d,
                    mib(peak),
                    mib(kept)
                ),
                Err(e) => println!("| {n} | {} | {path} | error: {e} | | | |", a.d),
            }
        }
    }
}
