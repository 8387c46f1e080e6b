//! Per-op overhead and graph-size scaling, f32 on the CPU.
//!
//! - eager per-op overhead: a chain of 1,000 `tanh` ops on a one-element tensor, then `sum` and
//!   backward, on a reset eager session each iteration; the forward alone; the forward without
//!   gradients (each op releasing the link before it); criterion's throughput line reads as ops
//!   per second (per-op time = 1 / throughput).
//! - linked scaling: a chain of n `relu` nodes (n = 1k, 4k, 16k) on a 16-element input: record
//!   it in a `LinkedSession`, compile it to the CPU tape, backward on the tape; each phase alone
//!   and all three together. Linear cost means the 16k chain costs about 16× the 1k chain.
//!
//! Run: `cargo bench -p tl-session --bench overhead` (add `-- --quick` for a short run).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tl_session::{Backend, LinkedSession, Ops, Options, Session, TensorRef};
use tl_spec::Tensor;

const CHAIN: usize = 1000;

fn eager_chain(s: &mut Session<f32>) -> f32 {
    s.reset();
    let x = s.input(Tensor::vector(vec![0.5]), true).unwrap();
    let mut h = x.clone();
    for _ in 0..CHAIN {
        h = s.tanh(&h).unwrap();
    }
    let loss = s.sum(&h).unwrap();
    s.backward(&loss).unwrap();
    s.grad_of(&x).unwrap().data()[0]
}

fn eager_overhead(c: &mut Criterion) {
    let mut s = Session::<f32>::new(Options::backend(Backend::Cpu)).unwrap();
    let mut group = c.benchmark_group("eager per-op overhead");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(CHAIN as u64));
    group.bench_function("tanh chain 1000 scalar fwd+bwd", |b| {
        b.iter(|| black_box(eager_chain(&mut s)))
    });
    group.bench_function("tanh chain 1000 scalar fwd", |b| {
        b.iter(|| {
            s.reset();
            let mut h = s.input(Tensor::vector(vec![0.5]), true).unwrap();
            for _ in 0..CHAIN {
                h = s.tanh(&h).unwrap();
            }
            black_box(h)
        })
    });
    // Without gradients each op's handle carries a watch, and each op first releases the
    // value whose last handle was dropped (the previous link).
    group.bench_function("tanh chain 1000 scalar fwd, no grad", |b| {
        b.iter(|| {
            s.reset();
            s.set_grad_enabled(false);
            let mut h = s.input(Tensor::vector(vec![0.5]), false).unwrap();
            for _ in 0..CHAIN {
                h = s.tanh(&h).unwrap();
            }
            s.set_grad_enabled(true);
            black_box(h)
        })
    });
    group.finish();
}

fn record(s: &mut LinkedSession<f32>, n: usize) -> TensorRef {
    s.reset();
    let x = s
        .input(Tensor::from_fn([16], |i| i as f32 - 7.5), true)
        .unwrap();
    let mut h = x;
    for _ in 0..n {
        h = s.relu(&h).unwrap();
    }
    s.sum(&h).unwrap()
}

fn linked_scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("linked relu chain");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let one = Tensor::scalar(1.0f32);
    for n in [1_000, 4_000, 16_000] {
        let mut s = LinkedSession::<f32>::new();
        group.bench_function(BenchmarkId::new("record", n), |b| {
            b.iter(|| black_box(record(&mut s, n)))
        });
        let loss = record(&mut s, n);
        group.bench_function(BenchmarkId::new("compile", n), |b| {
            b.iter(|| black_box(s.compile(Backend::Cpu).unwrap()))
        });
        let mut compiled = s.compile(Backend::Cpu).unwrap();
        group.bench_function(BenchmarkId::new("backward", n), |b| {
            b.iter(|| black_box(compiled.backward_dense(loss.id(), &one).unwrap()))
        });
        group.bench_function(BenchmarkId::new("record+compile+backward", n), |b| {
            b.iter(|| {
                let loss = record(&mut s, n);
                let mut c = s.compile(Backend::Cpu).unwrap();
                black_box(c.backward_dense(loss.id(), &one).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, eager_overhead, linked_scaling);
criterion_main!(benches);
