//! Training steps (forward, backward, optimizer update), f32 on the CPU: the mlp 784-256-256-10
//! at batch 64, a small cnn at batch 64 and one transformer block on a 128-token sequence (SGD),
//! and the realistic sizes: the wide mlp 784-4096-4096-10 at batch 256 (SGD), the ResNet on
//! 3×32×32 at batch 32 (SGD with momentum) and the LM of width 256 on 16 windows of 128
//! (AdamW); each on the eager session and on the linked session (record the graph, compile it
//! to the CPU tape, backward on the tape, update). The models are tl-nn's, trained with
//! `Runtime::step` (`common/models.rs`).
//!
//! Run: `cargo bench -p tl-session --bench steps` (add `-- --quick` for a short run, or a filter
//! such as `-- mlp` or `-- "wide mlp"`). Figures and the machine: docs/performance.md.

#[path = "common/models.rs"]
mod models;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use models::{BenchModel, EagerRun, LinkedRun};

fn steps(c: &mut Criterion) {
    // (name, model, samples, seconds of measurement): ten samples of the slow realistic steps.
    let models = [
        ("mlp 784-256-256-10 b64", BenchModel::mlp(64), 20, 4),
        ("cnn 28x28 b64", BenchModel::cnn(64), 20, 4),
        (
            "transformer block n128 d64",
            BenchModel::transformer(128),
            20,
            4,
        ),
        (
            "wide mlp 784-4096-4096-10 b256",
            BenchModel::wide_mlp(256),
            10,
            8,
        ),
        ("resnet 3x32x32 c64 b32", BenchModel::resnet(32, 32), 10, 8),
        ("lm d256 n128 b16", BenchModel::lm(16), 10, 8),
    ];
    let mut group = c.benchmark_group("train step");
    group.warm_up_time(Duration::from_secs(1));
    for (name, model, samples, secs) in &models {
        group
            .sample_size(*samples)
            .measurement_time(Duration::from_secs(*secs));
        let mut eager = EagerRun::new(model);
        let mut linked = LinkedRun::new(model);
        // Both sessions start from the same parameters and see the same batch.
        let (le, ll) = (eager.step(), linked.step());
        assert!(
            (le - ll).abs() <= 1e-4 * le.abs().max(1.0),
            "{name}: eager loss {le} vs linked {ll}"
        );
        group.bench_function(BenchmarkId::new("eager", name), |b| {
            b.iter(|| black_box(eager.step()))
        });
        group.bench_function(BenchmarkId::new("linked", name), |b| {
            b.iter(|| black_box(linked.step()))
        });
    }
    group.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
