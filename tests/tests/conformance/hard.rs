//! Hard inputs ([`tl_conformance::checks::hard`]): norm groups with large offsets and tiny
//! variances, softmax, logSoftmax and cross-entropy on logits of ±80, `exp` near overflow; f32
//! on the CPU tape, the CUDA sim and (feature `cuda-emu`) the emulated kernels against the f64
//! IR at each family's tolerance. And the families are hard: the one-pass variance
//! `E[x²] − μ²` in f32, which the registry's norm cases cannot tell from the two-pass one,
//! misses the `layerNorm offset` and `tiny variance` references by far more than the
//! tolerance.

use proptest::strategy::{Strategy, ValueTree};
use tl_conformance::checks::hard::{check_hard, check_hard_families, families};
use tl_conformance::checks::reduction_len;
use tl_conformance::generate::Size;
use tl_conformance::metric::tensor_err;
use tl_conformance::{Backend, CpuTape, CudaSim, RunConfig, assert_all_passed};
use tl_ir::Op;
use tl_spec::Tensor;

fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

/// Every family on its own (values and gradients), then all of them mixed (values only).
fn on<B: Backend>(backend: &B) {
    on_with(backend, &cfg());
}

fn on_with<B: Backend>(backend: &B, cfg: &RunConfig) {
    let cfg = *cfg;
    let mut reports: Vec<_> = families()
        .into_iter()
        .map(|f| check_hard_families(backend, &cfg, true, vec![f]))
        .collect();
    reports.push(check_hard(backend, &cfg, false));
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn the_cpu_tape_in_f32_and_f64_meets_the_reference_on_hard_inputs() {
    on(&CpuTape::<f32>::new());
    on(&CpuTape::<f64>::new());
}

#[test]
fn the_cuda_sim_meets_the_reference_on_hard_inputs() {
    on(&CudaSim::new());
}

#[cfg(feature = "cuda-emu")]
#[test]
fn the_emulated_kernels_meet_the_reference_on_hard_inputs() {
    use tl_conformance::backend::OnDevice;
    // Deterministic (the sim's twin) and not (the atomic kernels); the emulator runs every
    // thread as a fiber, so a quarter of the cases.
    let cfg = RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 16);
    on_with(
        &OnDevice::new("cuda-emu", tl_tape_cuda::CudaDevice::new),
        &cfg,
    );
    on_with(
        &OnDevice::nondeterministic("cuda-emu", tl_tape_cuda::CudaDevice::new),
        &cfg,
    );
}

/// layerNorm over the last axis in f32 with the one-pass variance `Σx²/n − μ²` (clamped at 0).
fn one_pass_layer_norm(x: &Tensor<f32>, g: &[f32], b: &[f32], eps: f32) -> Tensor<f64> {
    let d = g.len();
    let mut out = Vec::new();
    for row in x.data().chunks(d) {
        let n = d as f32;
        let mean = row.iter().sum::<f32>() / n;
        let sq = row.iter().map(|v| v * v).sum::<f32>() / n;
        let var = (sq - mean * mean).max(0.0);
        let r = 1.0 / (var + eps).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(j, v)| f64::from((v - mean) * r * g[j] + b[j])),
        );
    }
    Tensor::new(x.shape().clone(), out).unwrap()
}

#[test]
fn a_one_pass_variance_misses_the_norm_families_by_far_more_than_their_tolerance() {
    let mut runner = RunConfig::default().runner("one-pass variance");
    for fam in families() {
        if !fam.name.starts_with("layerNorm") {
            continue;
        }
        let mut worst = 0.0f64;
        let mut tol = 0.0f64;
        for _ in 0..16 {
            let c = (fam.cases)(Size::Small)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            let Op::LayerNorm { eps } = c.op else {
                panic!("{:?}", c.op)
            };
            let x: Tensor<f32> = c.inputs[0].cast();
            let (g, b): (Tensor<f32>, Tensor<f32>) = (c.inputs[1].cast(), c.inputs[2].cast());
            let reference: Vec<Tensor<f64>> =
                c.inputs.iter().map(|t| t.cast::<f32>().cast()).collect();
            let (graph, out) = c.graph(&[]);
            let want = graph.eval(&reference, &[]).unwrap()[out].clone();
            let got = one_pass_layer_norm(&x, g.data(), b.data(), eps as f32);
            worst = worst.max(tensor_err(&got, &want));
            tol = tol.max(fam.tol.f32_for(reduction_len(&graph)));
        }
        assert!(
            worst > 10.0 * tol,
            "{}: one-pass error {worst:e} vs tolerance {tol:e}",
            fam.name
        );
    }
}
