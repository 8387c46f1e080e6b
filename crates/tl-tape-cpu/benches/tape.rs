//! CPU tape benchmarks: forward + backward of a 784-256-256-10 MLP (batch 64, f32) recorded on a
//! fresh tape each iteration, and a 512×512 f32 matmul forward.
//!
//! Run: `cargo bench -p tl-tape-cpu --bench tape` (add `-- --quick` for a short run).

#[path = "common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::filled;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cpu::{Tape, ops};

struct Mlp {
    params: Vec<Tensor<f32>>,
    x: Tensor<f32>,
    target: Tensor<f32>,
}

impl Mlp {
    fn new(batch: usize) -> Self {
        let sizes = [(784, 256), (256, 256), (256, 10)];
        let mut params = Vec::new();
        for (k, &(i, o)) in sizes.iter().enumerate() {
            let s = (1.0 / i as f32).sqrt();
            params.push(filled(&[o, i], 10 + k as u64, s));
            params.push(filled(&[o], 20 + k as u64, s));
        }
        Mlp {
            params,
            x: filled(&[batch, 784], 1, 1.0),
            target: filled(&[batch, 10], 2, 1.0),
        }
    }

    /// Record the forward pass on a fresh tape and return the parameter gradients.
    fn step(&self) -> usize {
        let mut t = Tape::new();
        let p: Vec<usize> = self
            .params
            .iter()
            .map(|w| t.leaf(w.clone(), None, true))
            .collect();
        let x = t.leaf(self.x.clone(), Some("x"), false);
        let target = t.leaf(self.target.clone(), Some("target"), false);
        let h = t.apply(&Op::Linear, &[p[0], p[1], x]).unwrap();
        let h = t.apply(&Op::Relu, &[h]).unwrap();
        let h = t.apply(&Op::Linear, &[p[2], p[3], h]).unwrap();
        let h = t.apply(&Op::Relu, &[h]).unwrap();
        let y = t.apply(&Op::Linear, &[p[4], p[5], h]).unwrap();
        let y = t.apply(&Op::LogSoftmax, &[y]).unwrap();
        let loss = t.apply(&Op::MseLoss, &[y, target]).unwrap();
        let grads = t.backward_params(loss, &Tensor::scalar(1.0), &p).unwrap();
        grads.len()
    }
}

fn bench(c: &mut Criterion) {
    let mlp = Mlp::new(64);
    c.bench_function("mlp_784_256_256_10_b64_f32_fwd_bwd", |b| {
        b.iter(|| black_box(mlp.step()))
    });

    let a = filled(&[512, 512], 3, 1.0);
    let bm = filled(&[512, 512], 4, 1.0);
    c.bench_function("matmul_512x512_f32_fwd", |b| {
        b.iter(|| black_box(ops::forward(&Op::Matmul, &[&a, &bm], &[]).unwrap()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
