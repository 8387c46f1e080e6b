//! The benches' (and `examples/gemm_peak.rs`'s) inputs: a linear congruential sequence keyed
//! by a seed, each value in [−1, 1), so every run times the same data.

use tl_spec::Tensor;

/// `n` values in [−1, 1) from the sequence keyed by `seed`.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `dims` holding [`values`] times `scale`.
pub fn filled(dims: &[usize], seed: u64, scale: f32) -> Tensor<f32> {
    let n = dims.iter().product();
    let data = values(n, seed).into_iter().map(|v| v * scale).collect();
    Tensor::new(dims, data).expect("as many values as the shape holds")
}
