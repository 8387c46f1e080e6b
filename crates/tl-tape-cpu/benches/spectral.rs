//! `spectralConv1dRfft` forward at FNO sizes: the CPU kernel (a direct DFT over the kept modes
//! only, cos/sin tables built per call) against the same op through `realfft` (a real FFT of
//! every channel, the first `modes` bins mixed, an inverse real FFT), f32, channels last.
//!
//! The FFT variant is given its best case: its plans are made once, outside the timed loop, and
//! its buffers are reused; the direct kernel builds its tables inside every call.
//!
//! Run: `cargo bench -p tl-tape-cpu --bench spectral -- --quick`. The decision this informed
//! (and the figures) are in docs/semantics.md, "## Spectral".

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cpu::ops;

/// Deterministic pseudo-random values in [-1, 1).
fn filled(dims: &[usize], seed: u64) -> Tensor<f32> {
    let mut s = seed;
    Tensor::from_fn(dims, |_| {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    })
}

/// The op through realfft, with plans and buffers made once.
struct ViaFft {
    n: usize,
    w: usize,
    m: usize,
    fwd: Arc<dyn RealToComplex<f32>>,
    inv: Arc<dyn ComplexToReal<f32>>,
    line: Vec<f32>,
    spec: Vec<Complex<f32>>,
    xs: Vec<Complex<f32>>,
    zs: Vec<Complex<f32>>,
}

impl ViaFft {
    fn new(n: usize, w: usize, m: usize) -> Self {
        let mut p = RealFftPlanner::<f32>::new();
        let (fwd, inv) = (p.plan_fft_forward(n), p.plan_fft_inverse(n));
        ViaFft {
            n,
            w,
            m,
            spec: fwd.make_output_vec(),
            fwd,
            inv,
            line: vec![0.0; n],
            xs: vec![Complex::default(); m * w],
            zs: vec![Complex::default(); m * w],
        }
    }

    fn forward(&mut self, x: &[f32], wr: &[f32], wi: &[f32], y: &mut [f32]) {
        let (n, w, m) = (self.n, self.w, self.m);
        for c in 0..w {
            for t in 0..n {
                self.line[t] = x[t * w + c];
            }
            self.fwd.process(&mut self.line, &mut self.spec).unwrap();
            for k in 0..m {
                self.xs[k * w + c] = self.spec[k];
            }
        }
        self.zs.fill(Complex::default());
        for k in 0..m {
            for c in 0..w {
                let a = self.xs[k * w + c];
                for o in 0..w {
                    let b = Complex::new(wr[(k * w + c) * w + o], wi[(k * w + c) * w + o]);
                    self.zs[k * w + o] += a * b;
                }
            }
        }
        let scale = 1.0 / n as f32;
        for o in 0..w {
            self.spec.fill(Complex::default());
            for k in 0..m {
                self.spec[k] = self.zs[k * w + o];
            }
            self.spec[0].im = 0.0;
            if n % 2 == 0 {
                self.spec[n / 2].im = 0.0;
            }
            self.inv.process(&mut self.spec, &mut self.line).unwrap();
            for t in 0..n {
                y[t * w + o] = self.line[t] * scale;
            }
        }
    }
}

fn spectral(c: &mut Criterion) {
    let mut group = c.benchmark_group("spectralConv1dRfft forward f32");
    for (n, w, m) in [
        (64, 32, 8),
        (64, 64, 16),
        (128, 32, 12),
        (256, 32, 16),
        (256, 64, 16),
    ] {
        let x = filled(&[n, w], 1);
        let wr = filled(&[m, w, w], 2);
        let wi = filled(&[m, w, w], 3);
        let op = Op::SpectralConv1dRfft { modes: m };
        let id = format!("grid {n} width {w} modes {m}");
        // The two must compute the same thing before their speeds are compared.
        let direct = ops::forward(&op, &[&x, &wr, &wi], &[]).unwrap();
        let mut fft = ViaFft::new(n, w, m);
        let mut y = vec![0.0f32; n * w];
        fft.forward(x.data(), wr.data(), wi.data(), &mut y);
        let diff = direct
            .data()
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-3, "{id}: direct and FFT differ by {diff}");
        group.bench_function(BenchmarkId::new("direct DFT (kernel)", &id), |b| {
            b.iter(|| ops::forward(black_box(&op), &[&x, &wr, &wi], &[]).unwrap())
        });
        group.bench_function(BenchmarkId::new("realfft", &id), |b| {
            b.iter(|| {
                fft.forward(black_box(x.data()), wr.data(), wi.data(), &mut y);
                black_box(&y);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, spectral);
criterion_main!(benches);
