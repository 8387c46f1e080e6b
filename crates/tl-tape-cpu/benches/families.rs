//! One benchmark per op family at realistic sizes, f32: each op's forward alone and forward +
//! backward (all operand cotangents), through `ops::forward` / `ops::backward` directly (no tape),
//! so the figures are the kernels' own cost. An op whose forward keeps buffers for its
//! backward (`ops::forward_saving`: attention, the norms, gelu, cross-entropy, safeLog) also
//! gets "fwd+bwd kept", the path the tape takes (`ops::backward_needed` reading them). A buffer pool is installed and every output goes
//! back to it, as a tape does between steps: without it each megabyte-sized output is a fresh
//! allocation whose page faults cost more than most kernels (relu's forward + backward on
//! 256×1024: 1.26 ms unpooled, most of it in the kernel's page-fault handler).
//!
//! Run: `cargo bench -p tl-tape-cpu --bench families` (add `-- --quick` for a short run, or a
//! filter such as `-- conv`). Figures and the machine: docs/performance.md.

#[path = "common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::filled;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tl_ir::Op;
use tl_spec::{Tensor, pool};
use tl_tape_cpu::ops;

/// Positive values in [0.5, 1.5) (for log, sqrt, division).
fn positive(dims: &[usize], seed: u64) -> Tensor<f32> {
    filled(dims, seed, 0.5).map(|v| v + 1.0)
}

/// Bench `op` on `inputs`: "fwd" and "fwd+bwd" (cotangent of ones-like pseudo-random values).
fn case(c: &mut Criterion, family: &str, label: &str, op: Op, inputs: Vec<Tensor<f32>>) {
    let args: Vec<&Tensor<f32>> = inputs.iter().collect();
    let y = ops::forward(&op, &args, &[]).unwrap();
    let g = filled(y.shape().dims(), 99, 1.0);
    let mut group = c.benchmark_group(family);
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut spare = pool::Pool::<f32>::new();
    group.bench_function(BenchmarkId::new("fwd", label), |b| {
        b.iter(|| {
            let _installed = pool::install(&mut spare);
            let y = ops::forward(black_box(&op), &args, &[]).unwrap();
            pool::recycle(black_box(y));
        })
    });
    group.bench_function(BenchmarkId::new("fwd+bwd", label), |b| {
        b.iter(|| {
            let _installed = pool::install(&mut spare);
            let y = ops::forward(black_box(&op), &args, &[]).unwrap();
            let grads = ops::backward(&op, &args, &y, &g, &[]).unwrap();
            pool::recycle(y);
            black_box(&grads);
            grads.into_iter().flatten().for_each(pool::recycle);
        })
    });
    let keeps = !ops::forward_saving(&op, &args, &[]).unwrap().1.is_empty();
    if keeps {
        group.bench_function(BenchmarkId::new("fwd+bwd kept", label), |b| {
            b.iter(|| {
                let _installed = pool::install(&mut spare);
                let (y, saved) = ops::forward_saving(black_box(&op), &args, &[]).unwrap();
                let grads = ops::backward_needed(&op, &args, &y, &g, &[], &[], &saved).unwrap();
                pool::recycle(y);
                saved.into_iter().for_each(pool::give);
                black_box(&grads);
                grads.into_iter().flatten().for_each(pool::recycle);
            })
        });
    }
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let d = [256, 1024];
    for (name, op) in [
        ("add 256x1024", Op::Add),
        ("mul 256x1024", Op::Mul),
        ("div 256x1024", Op::Div),
    ] {
        case(
            c,
            "elementwise",
            name,
            op,
            vec![filled(&d, 1, 1.0), positive(&d, 2)],
        );
    }
    for (name, op) in [
        ("relu 256x1024", Op::Relu),
        ("tanh 256x1024", Op::Tanh),
        ("sigmoid 256x1024", Op::Sigmoid),
        ("silu 256x1024", Op::Silu),
        ("exp 256x1024", Op::Exp),
        ("log 256x1024", Op::Log),
        ("gelu 256x1024", Op::Gelu),
        ("softplus 256x1024", Op::Softplus),
        ("safeLog 256x1024", Op::SafeLog { eps: 1e-6 }),
    ] {
        case(c, "elementwise", name, op, vec![positive(&d, 3)]);
    }
}

fn reductions(c: &mut Criterion) {
    let d = [512, 512];
    for (name, op) in [
        ("sum 512x512", Op::Sum),
        ("reduceSum axis0 512x512", Op::ReduceSum(0)),
        ("reduceSum axis1 512x512", Op::ReduceSum(1)),
        ("reduceMean axis1 512x512", Op::ReduceMean(1)),
    ] {
        case(c, "reduce", name, op, vec![filled(&d, 4, 1.0)]);
    }
}

fn linalg(c: &mut Criterion) {
    for n in [128, 512, 1024] {
        let a = filled(&[n, n], 5, 1.0);
        let b = filled(&[n, n], 6, 1.0);
        case(
            c,
            "linalg",
            &format!("matmul {n}x{n}"),
            Op::Matmul,
            vec![a, b],
        );
    }
    let (w, bias, x) = (
        filled(&[256, 784], 7, 0.05),
        filled(&[256], 8, 0.05),
        filled(&[64, 784], 9, 1.0),
    );
    case(
        c,
        "linalg",
        "linear 64x784->256",
        Op::Linear,
        vec![w, bias, x],
    );
    let (a, b) = (
        filled(&[8, 128, 64], 10, 1.0),
        filled(&[8, 64, 128], 11, 1.0),
    );
    case(c, "linalg", "bmm 8x128x64x128", Op::Bmm, vec![a, b]);
}

fn softmax(c: &mut Criterion) {
    let x = filled(&[256, 1024], 12, 3.0);
    case(
        c,
        "softmax",
        "softmax 256x1024",
        Op::Softmax,
        vec![x.clone()],
    );
    case(c, "softmax", "logSoftmax 256x1024", Op::LogSoftmax, vec![x]);
}

fn conv_pool(c: &mut Criterion) {
    // The small CNN's layers at batch 64 (docs/performance.md).
    let x = filled(&[64, 8, 14, 14], 13, 1.0);
    let w = filled(&[16, 8, 3, 3], 14, 0.1);
    let b = filled(&[16], 15, 0.1);
    let conv = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    case(c, "conv", "conv2d 64x8x14x14 k3 ->16", conv, vec![w, b, x]);
    let x = filled(&[64, 8, 28, 28], 16, 1.0);
    let pool = Op::MaxPool {
        kernel: vec![2, 2],
        stride: vec![2, 2],
        padding: vec![0, 0],
    };
    case(c, "pool", "maxPool2d 64x8x28x28 k2", pool, vec![x]);
}

fn norm_attention(c: &mut Criterion) {
    let x = filled(&[512, 256], 17, 1.0);
    let (gamma, beta) = (positive(&[256], 18), filled(&[256], 19, 0.1));
    case(
        c,
        "norm",
        "layerNorm 512x256",
        Op::LayerNorm { eps: 1e-5 },
        vec![x.clone(), gamma.clone(), beta],
    );
    case(
        c,
        "norm",
        "rmsNorm 512x256",
        Op::RmsNorm { eps: 1e-5 },
        vec![x, gamma],
    );
    // The ResNet's block shape: 32 images of 64 channels of 16×16.
    let x = filled(&[32, 64, 16, 16], 30, 1.0);
    let (gamma, beta) = (positive(&[64], 31), filled(&[64], 32, 0.1));
    case(
        c,
        "norm",
        "batchnorm 32x64x16x16",
        Op::BatchNorm { eps: 1e-5 },
        vec![x, gamma, beta],
    );
    let (n, dm) = (128, 64);
    let w = |k: u64| filled(&[dm, dm], 20 + k, 0.125);
    for fused in [false, true] {
        let op = Op::MultiHeadAttention {
            heads: 4,
            mask: None,
            fused,
        };
        let inputs = vec![w(0), w(1), w(2), w(3), filled(&[n, dm], 25, 1.0)];
        let label = format!(
            "mha n{n} d{dm} h4 {}",
            if fused { "fused" } else { "composed" }
        );
        case(c, "attention", &label, op, inputs);
    }
}

fn spectral(c: &mut Criterion) {
    let (n, w, m) = (256, 64, 16);
    let inputs = vec![
        filled(&[n, w], 26, 1.0),
        filled(&[m, w, w], 27, 0.05),
        filled(&[m, w, w], 28, 0.05),
    ];
    let op = Op::SpectralConv1dRfft { modes: m };
    case(c, "spectral", "spectralConv1d grid256 w64 m16", op, inputs);
}

criterion_group!(
    benches,
    elementwise,
    reductions,
    linalg,
    softmax,
    conv_pool,
    norm_attention,
    spectral
);
criterion_main!(benches);
