//! tl-nn's layers on every session (eager CPU f64/f32, eager CUDA-sim f32, linked f64/f32):
//! output and gradients of a random linear functional equal the layer written with plain
//! catalogue ops, evaluated and differentiated by the IR in f64 (`tl_conformance::nn`).

use tl_conformance::nn::{
    LAYERS, LayerCase, LayerSpec, NN_CASES, NnSession, check_layer, layer_case,
};
use tl_conformance::{RunConfig, assert_all_passed};
use tl_spec::Tensor;

fn cfg() -> (RunConfig, u32) {
    let cfg = RunConfig::from_env_or(NN_CASES);
    (cfg, cfg.cases)
}

/// One test per layer, so a failure names the layer in the test list too.
macro_rules! layer_tests {
    ($($test:ident => $name:expr;)*) => {$(
        #[test]
        fn $test() {
            let (cfg, cases) = cfg();
            let reports: Vec<_> = NnSession::ALL.iter().map(|&on| check_layer($name, on, &cfg)).collect();
            assert_all_passed(&reports, cases);
        }
    )*};
}

layer_tests! {
    linear => "Linear";
    conv => "Conv";
    conv_transpose => "ConvTranspose";
    max_pool => "MaxPool";
    avg_pool => "AvgPool";
    layer_norm => "LayerNorm";
    batch_norm => "BatchNorm";
    rms_norm => "RmsNorm";
    group_norm => "GroupNorm";
    embedding => "Embedding";
    dropout => "Dropout";
    multi_head_attention => "MultiHeadAttention";
    cross_attention => "CrossAttention";
    spectral_conv1d => "SpectralConv1d";
    prelu => "PRelu";
    upsample => "Upsample";
    adaptive_avg_pool => "AdaptiveAvgPool";
    activation => "Activation";
    flatten => "Flatten";
    sequential => "Sequential";
    cross_entropy => "CrossEntropy";
}

#[test]
fn every_layer_has_a_test() {
    assert_eq!(LAYERS.len(), 21);
}

#[test]
fn a_hand_worked_linear_passes_and_a_bad_case_names_layer_and_session() {
    // y = 0.5·1 − 1·1 + 0.25 = −0.25; every session agrees with the reference.
    let case = LayerCase {
        spec: LayerSpec::Linear {
            inputs: 2,
            outputs: 1,
            bias: true,
            lead: vec![1],
        },
        params: vec![
            Tensor::new([1, 2], vec![0.5, -1.0]).unwrap(),
            Tensor::vector(vec![0.25]),
        ],
        x: Some(Tensor::new([1, 2], vec![1.0, 1.0]).unwrap()),
        seed: Tensor::new([1, 1], vec![1.0]).unwrap(),
    };
    for on in NnSession::ALL {
        let m = layer_case(&case, on).unwrap_or_else(|e| panic!("{e}"));
        assert!(m.err <= 1e-6, "{m:?}");
    }
    // A cotangent of the wrong shape is a reported failure naming the layer and the session.
    let mut bad = case;
    bad.seed = Tensor::vector(vec![1.0, 2.0]);
    let e = layer_case(&bad, NnSession::SimF32).unwrap_err();
    assert!(e.starts_with("Linear eager cuda-sim-f32: "), "{e}");
}
