//! How steady this machine's cores are: a fixed block of floating-point work timed on one
//! thread, then on two at once, round after round. On a dedicated machine every figure repeats
//! within a few percent; on a shared VM a core's speed can move by tens of percent from one
//! second to the next, and a two-thread step then runs at the pace of its slower thread. Run it
//! before trusting a one-run speed figure (docs/performance.md, "The VM's cores").
//!
//! ```sh
//! taskset -c 0,1 cargo run --release -p tl-session --example vcpu_probe [rounds]
//! ```
//!
//! The work is twelve independent multiply-add chains of sixteen lanes (vectorized with SSE2 in
//! the default build); only its time matters, not its result.

use std::time::{Duration, Instant};

/// Twelve independent chains of 16-lane multiply-adds, `n` times over; returns a sum so that
/// the work cannot be optimized away.
fn work(n: usize) -> f32 {
    let mut acc = [[1.0f32; 16]; 12];
    let (m, a) = (0.9999f32, 1e-5f32);
    for _ in 0..n {
        for v in acc.iter_mut() {
            for x in v.iter_mut() {
                *x = *x * m + a;
            }
        }
    }
    acc.iter().flatten().sum()
}

/// Milliseconds `work(n)` takes on the calling thread.
fn timed(n: usize) -> f64 {
    let t = Instant::now();
    std::hint::black_box(work(std::hint::black_box(n)));
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    // About 0.2 s of work a block on this project's 2-core VM (baseline x86-64 build).
    let n = 20_000_000;
    println!("round | one thread (ms) | two threads at once (ms each) | two-thread throughput");
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for round in 1..=rounds {
        let single = timed(n);
        let t = Instant::now();
        let both: Vec<f64> = std::thread::scope(|s| {
            let h: Vec<_> = (0..2).map(|_| s.spawn(|| timed(n))).collect();
            h.into_iter()
                .map(|h| h.join().unwrap_or(f64::NAN))
                .collect()
        });
        let wall = t.elapsed().as_secs_f64() * 1e3;
        for &x in both.iter().chain([&single]) {
            lo = lo.min(x);
            hi = hi.max(x);
        }
        println!(
            "{round:5} | {single:15.1} | {:13.1} / {:<13.1} | x{:.2}",
            both[0],
            both[1],
            2.0 * single / wall
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "slowest block / fastest: {:.2} (a dedicated core: close to 1.00)",
        hi / lo
    );
}
