//! bf16 products against f32 (`tl_tape_cpu::precision`): `c = a·b` through the one GEMM
//! (`gemm::matmul`), f32 and bf16 on every bf16 kernel this CPU has (`Bf16Kernel::available`),
//! on one thread and on the default thread count, at a square 512³, the mlp's
//! 64×784·784×256 (b column-major: a linear layer's `x·wᵀ`) and a long-k 128×2048·2048×128.
//!
//! Run: `cargo bench -p tl-tape-cpu --bench bf16` (add `-- --quick`, or a filter such as
//! `-- 512`). Figures and the machine: docs/performance.md, "bf16".

#[path = "common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::values;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tl_ir::Op;
use tl_tape_cpu::gates::{self, Gates};
use tl_tape_cpu::gemm::{matmul, rows, rows_mut};
use tl_tape_cpu::precision::{self, Bf16Kernel, Precision};

fn gemm(c: &mut Criterion) {
    let shapes = [
        ("512x512x512", (512, 512, 512), false),
        ("64x784x256 x·wT", (64, 784, 256), true),
        ("128x2048x128", (128, 2048, 128), false),
    ];
    let mut group = c.benchmark_group("gemm precision");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut paths = vec![("f32".to_string(), None)];
    for k in Bf16Kernel::available() {
        paths.push((format!("bf16 {k:?}"), Some(k)));
    }
    for (name, (m, k, n), b_t) in shapes {
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let mut out = vec![0.0f32; m * n];
        for threads in [1, tl_tape_cpu::threads()] {
            for (path, kernel) in &paths {
                let mut g = Gates {
                    threads: Some(threads),
                    ..Gates::DEFAULT
                };
                g.bf16_kernel = *kernel;
                let id = BenchmarkId::new(format!("{path} t{threads}"), name);
                group.bench_function(id, |bench| {
                    let _g = gates::force(g);
                    let _p = precision::install(match kernel {
                        Some(_) => Precision::Bf16,
                        None => Precision::F32,
                    });
                    let op = Op::Matmul;
                    bench.iter(|| {
                        let av = rows(&op, &a, m, k).expect("a");
                        let bv = match b_t {
                            true => rows(&op, &b, n, k).expect("b").t(),
                            false => rows(&op, &b, k, n).expect("b"),
                        };
                        let cv = rows_mut(&op, &mut out, m, n).expect("c");
                        matmul(&op, cv, false, av, bv, 1.0).expect("product");
                        black_box(out[0])
                    })
                });
            }
            if threads == tl_tape_cpu::threads() {
                break;
            }
        }
    }
    group.finish();
}

criterion_group!(benches, gemm);
criterion_main!(benches);
