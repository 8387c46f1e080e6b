//! tl-nn's losses on every session (eager CPU f64/f32, eager CUDA-sim f32, linked f64/f32):
//! value and the gradient of the input equal the loss written another way with plain
//! catalogue ops, evaluated and differentiated by the IR in f64 (`tl_conformance::nn_losses`).

use tl_conformance::nn::{NN_CASES, NnSession, on_session};
use tl_conformance::nn_losses::{LOSSES, Loss, LossCase, check_loss};
use tl_conformance::{RunConfig, assert_all_passed};
use tl_spec::Tensor;

/// One test per loss, so a failure names the loss in the test list too.
macro_rules! loss_tests {
    ($($test:ident => $loss:expr;)*) => {
        $(
            #[test]
            fn $test() {
                let cfg = RunConfig::from_env_or(NN_CASES);
                let reports: Vec<_> =
                    NnSession::ALL.iter().map(|&on| check_loss($loss, on, &cfg)).collect();
                assert_all_passed(&reports, cfg.cases);
            }
        )*

        #[test]
        fn every_loss_has_a_test() {
            let tested = [$($loss),*];
            assert!(LOSSES.iter().all(|l| tested.contains(l)), "{LOSSES:?}");
            assert_eq!(tested.len(), LOSSES.len());
        }
    };
}

loss_tests! {
    binary_cross_entropy_with_logits => Loss::BceWithLogits;
    binary_cross_entropy => Loss::Bce;
    nll_loss => Loss::Nll;
    cross_entropy => Loss::CrossEntropy;
    cross_entropy_nd => Loss::CrossEntropyNd;
    mse_loss => Loss::Mse;
    l1_loss => Loss::L1;
    huber_loss => Loss::Huber;
    smooth_l1_loss => Loss::SmoothL1;
    relative_l2_loss => Loss::RelativeL2;
    kl_div => Loss::KlDiv;
    poisson_nll_loss => Loss::PoissonNll;
    gaussian_nll_loss => Loss::GaussianNll;
    margin_ranking_loss => Loss::MarginRanking;
    hinge_embedding_loss => Loss::HingeEmbedding;
    soft_margin_loss => Loss::SoftMargin;
    multilabel_soft_margin_loss => Loss::MultilabelSoftMargin;
    multi_margin_loss => Loss::MultiMargin;
    cosine_embedding_loss => Loss::CosineEmbedding;
    triplet_margin_loss => Loss::TripletMargin;
}

/// The reference is right on a hand-worked case, and every session agrees with it: the
/// Huber loss (delta 1) of d = (0.5, 0.5, 1.5, 0.25) is (⅛, ⅛, 1, 1/32), mean 0.3203125, and
/// its gradient d/4 inside the delta, ±¼ outside.
#[test]
fn a_hand_worked_huber_case_passes_on_every_session() {
    let x = Tensor::new([2, 2], vec![0.5, -1.0, 2.0, 0.25]).unwrap();
    let t = Tensor::new([2, 2], vec![0.0, -1.5, 0.5, 0.0]).unwrap();
    let case = LossCase {
        loss: Loss::Huber,
        x: x.clone(),
        aux: vec![t],
        labels: Vec::new(),
        param: 1.0,
        flags: [false; 2],
        reduction: 0,
    };
    let mut b = tl_ir::GraphBuilder::new();
    let leaf = b.leaf([2, 2], None).unwrap();
    let out = case.reference(&mut b, leaf).unwrap();
    let graph = b.finish();
    let v = graph.eval(std::slice::from_ref(&x), &[]).unwrap();
    assert_eq!(v[out].data(), &[0.3203125]);
    let g = graph
        .backprop_all(&[x], &[], out, &Tensor::scalar(1.0))
        .unwrap();
    assert_eq!(g[0].data(), &[0.125, 0.125, 0.25, 0.0625]);
    for on in NnSession::ALL {
        on_session(on, &case).unwrap_or_else(|e| panic!("{}: {e}", on.name()));
    }
}
