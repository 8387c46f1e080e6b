//! bf16 autocast against f32: training steps (forward, backward, SGD update) of tl-nn's mlp
//! 784-256-256-10 at batch 64, small cnn at batch 64 and transformer block on 128 tokens, on
//! the eager CPU session with `Options::precision` `F32` and `Bf16`. The bf16 products run on
//! the kernel `Bf16Kernel::current` picks. Each pair first checks that both start from the same loss.
//!
//! Run: `cargo bench -p tl-session --bench bf16` (add `-- --quick`, or a filter such as
//! `-- mlp`). Figures and the machine: docs/performance.md, "bf16".

#[path = "common/models.rs"]
mod models;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use models::{BenchModel, EagerRun};
use tl_session::{Options, Precision, Session};
use tl_tape_cpu::precision::Bf16Kernel;

fn steps(c: &mut Criterion) {
    eprintln!("bf16 kernel: {:?}", Bf16Kernel::current());
    let models = [
        ("mlp 784-256-256-10 b64", BenchModel::mlp(64)),
        ("cnn 28x28 b64", BenchModel::cnn(64)),
        ("transformer block n128 d64", BenchModel::transformer(128)),
    ];
    let mut group = c.benchmark_group("train step precision");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, model) in &models {
        let run = |precision| {
            let opts = Options {
                precision,
                ..Options::default()
            };
            let session = Session::new(opts).expect("a CPU session");
            EagerRun::with_session(model, session).expect("the bench model")
        };
        let (mut f32s, mut bf16s) = (run(Precision::F32), run(Precision::Bf16));
        let (lf, lb) = (f32s.step(), bf16s.step());
        assert!(
            (lf - lb).abs() <= 2e-2 * lf.abs().max(1.0),
            "{name}: f32 loss {lf} vs bf16 {lb}"
        );
        group.bench_function(BenchmarkId::new("f32", name), |b| {
            b.iter(|| black_box(f32s.step()))
        });
        group.bench_function(BenchmarkId::new("bf16", name), |b| {
            b.iter(|| black_box(bf16s.step()))
        });
    }
    group.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
