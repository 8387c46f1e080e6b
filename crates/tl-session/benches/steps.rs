//! Training steps (forward, backward, SGD update), f32 on the CPU: the mlp 784-256-256-10 at
//! batch 64, a small cnn at batch 64 and one transformer block on a 128-token sequence, each on
//! the eager session and on the linked session (record the graph, compile it to the CPU tape,
//! backward on the tape, update). The models are tl-nn's, trained with `Runtime::step`
//! (`common/models.rs`).
//!
//! Run: `cargo bench -p tl-session --bench steps` (add `-- --quick` for a short run, or a filter
//! such as `-- mlp`). Figures and the machine: docs/performance.md.

#[path = "common/models.rs"]
mod models;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use models::{BenchModel, EagerRun, LinkedRun};

fn steps(c: &mut Criterion) {
    let models = [
        ("mlp 784-256-256-10 b64", BenchModel::mlp(64)),
        ("cnn 28x28 b64", BenchModel::cnn(64)),
        ("transformer block n128 d64", BenchModel::transformer(128)),
    ];
    let mut group = c.benchmark_group("train step");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for (name, model) in &models {
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
