//! `spectralConv1dRfft` forward at FNO sizes (grid 64–256, width 32–64, modes 8–16), f32: the
//! CPU kernel (real FFTs through `realfft`, plans made inside every call) against the direct
//! DFT over the kept modes only (`ops::spectral::forward_direct`, cos/sin tables built inside
//! every call), which the kernel uses as its fallback for other scalar types.
//!
//! Run: `cargo bench -p tl-tape-cpu --bench spectral -- --quick`. The decision this informed
//! (and the figures) are in docs/semantics.md, "## Spectral".

#[path = "common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::filled;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tl_ir::Op;
use tl_tape_cpu::ops;

fn spectral(c: &mut Criterion) {
    let mut group = c.benchmark_group("spectralConv1dRfft forward f32");
    for (n, w, m) in [
        (64, 32, 8),
        (64, 64, 16),
        (128, 32, 12),
        (256, 32, 16),
        (256, 64, 16),
    ] {
        let x = filled(&[n, w], 1, 1.0);
        let wr = filled(&[m, w, w], 2, 1.0);
        let wi = filled(&[m, w, w], 3, 1.0);
        let op = Op::SpectralConv1dRfft { modes: m };
        let args = [&x, &wr, &wi];
        let id = format!("grid {n} width {w} modes {m}");
        // The two must compute the same thing before their speeds are compared.
        let fft = ops::forward(&op, &args, &[]).unwrap();
        let direct = ops::spectral::forward_direct(&op, &args).unwrap();
        let diff = fft
            .data()
            .iter()
            .zip(direct.data())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-3, "{id}: direct and FFT differ by {diff}");
        group.bench_function(BenchmarkId::new("kernel (realfft)", &id), |b| {
            b.iter(|| ops::forward(black_box(&op), &args, &[]).unwrap())
        });
        group.bench_function(BenchmarkId::new("direct DFT", &id), |b| {
            b.iter(|| ops::spectral::forward_direct(black_box(&op), &args).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, spectral);
criterion_main!(benches);
