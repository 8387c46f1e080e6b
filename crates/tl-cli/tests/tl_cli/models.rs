//! The cnn, fno and transformer models learn (thresholds, no timing), and a cnn checkpoint
//! round-trips through `tl eval`.

use crate::common::{self, scratch, stdout, tl};
use tl_cli::cli::ModelName;
use tl_cli::train::{TrainConfig, train};
use tl_session::Backend;

#[test]
fn cnn_defaults_reach_97_percent_on_digits() {
    // What `tl train --model cnn` runs (25 epochs; a few seconds in the test profile).
    let r = train(&TrainConfig::defaults(ModelName::Cnn), |_| {}).unwrap();
    let acc = r.test.accuracy.unwrap();
    assert!(acc >= 0.97, "test accuracy {acc}");
    assert_eq!(r.checkpoint.header.epochs, 25);
    assert!(r.baseline.is_none() && r.test.rel_l2.is_none());
}

#[test]
fn fno_reaches_under_10_percent_relative_l2_in_2_epochs() {
    let cfg = TrainConfig {
        epochs: 2,
        ..TrainConfig::defaults(ModelName::Fno)
    };
    let r = train(&cfg, |_| {}).unwrap();
    let rel = r.test.rel_l2.unwrap();
    assert!(rel < 0.10, "test relative L2 {rel}");
    assert!(r.test.accuracy.is_none());
    // The loss falls from the first steps to the last.
    let (first, last) = (r.step_losses[0], *r.step_losses.last().unwrap());
    assert!(last < first / 10.0, "{first} -> {last}");
}

#[test]
fn transformer_beats_the_unigram_baseline_on_a_short_run() {
    let cfg = TrainConfig {
        train_subset: Some(400),
        ..TrainConfig::defaults(ModelName::Transformer)
    };
    let r = train(&cfg, |_| {}).unwrap();
    let base = r.baseline.unwrap();
    // The unigram model of this text costs about 3.0 nats/char; uniform over 72 chars, ln 72.
    assert!((2.8..3.2).contains(&base), "baseline {base}");
    assert!(
        r.test.loss < base - 0.25,
        "test loss {} vs unigram {base}",
        r.test.loss
    );
}

#[test]
fn cnn_save_eval_and_graph_through_the_binary() {
    let dir = scratch("cnn");
    let ckpt = dir.join("cnn.safetensors");
    let o = tl(&[
        "train",
        "--model",
        "cnn",
        "--epochs",
        "2",
        "--linked",
        "--save",
        ckpt.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = stdout(&o);
    let done = text.lines().find(|l| l.starts_with("done:")).unwrap();
    let acc = done
        .rsplit("accuracy ")
        .next()
        .unwrap()
        .trim_end()
        .to_owned();
    let e = tl(&[
        "eval",
        "--model",
        "cnn",
        "--checkpoint",
        ckpt.to_str().unwrap(),
    ]);
    assert!(e.status.success(), "{}", common::stderr(&e));
    assert!(
        stdout(&e).trim_end().ends_with(&acc),
        "{} vs {acc}",
        stdout(&e)
    );
    let ck = tl_cli::checkpoint::load(&ckpt).unwrap();
    assert_eq!(ck.header.model, ModelName::Cnn);
    assert!(
        ck.tensors
            .iter()
            .any(|(n, t)| n == "3.weight" && t.shape().dims() == [32, 16, 3, 3])
    );

    for model in ["fno", "transformer"] {
        let o = tl(&["graph", "--model", model]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        assert!(stdout(&o).starts_with(&format!("digraph \"{model}\"")));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A few steps of `model` on `subset` training examples: the CUDA tape over the simulation
/// device (conv, pools, spectral conv, gathers, layerNorm, attention, crossEntropy all have
/// CUDA formulas), eager and linked, takes the same steps as the CPU tape, within f32 rounding.
/// One test per model, so the three run side by side.
fn trains_the_same_on_the_cuda_sim_eager_and_linked(model: ModelName, subset: usize) {
    let d = TrainConfig::defaults(model);
    let base = TrainConfig {
        epochs: 1,
        train_subset: Some(subset),
        // The steps are compared, not the final metrics: a few test examples (the
        // transformer's whole test split on the sim took 14 s).
        test_subset: Some(8),
        ..d
    };
    let cpu = train(&base, |_| {}).unwrap();
    assert!(cpu.step_losses.len() >= 3, "{model:?}");
    for linked in [false, true] {
        let cfg = TrainConfig {
            backend: Backend::CudaSim,
            linked,
            ..base.clone()
        };
        let r = train(&cfg, |_| {}).unwrap_or_else(|e| panic!("{model:?} linked={linked}: {e}"));
        assert_eq!(r.step_losses.len(), cpu.step_losses.len());
        for (a, b) in r.step_losses.iter().zip(&cpu.step_losses) {
            assert!(
                (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                "{model:?} linked={linked}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn cnn_trains_the_same_on_the_cuda_sim_eager_and_linked() {
    trains_the_same_on_the_cuda_sim_eager_and_linked(ModelName::Cnn, 96);
}

#[test]
fn fno_trains_the_same_on_the_cuda_sim_eager_and_linked() {
    trains_the_same_on_the_cuda_sim_eager_and_linked(ModelName::Fno, 60);
}

#[test]
fn transformer_trains_the_same_on_the_cuda_sim_eager_and_linked() {
    trains_the_same_on_the_cuda_sim_eager_and_linked(ModelName::Transformer, 48);
}
