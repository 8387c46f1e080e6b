//! The models learn on short runs (thresholds, no timing), and checkpoints round-trip.

use crate::common::{self, scratch, stdout, tl};
use tl_cli::cli::{ModelName, OptimizerName};
use tl_cli::train::{TrainConfig, train};
use tl_session::Backend;

fn quick(epochs: usize) -> TrainConfig {
    TrainConfig {
        epochs,
        ..TrainConfig::defaults(ModelName::Mlp)
    }
}

#[test]
fn mlp_reaches_90_percent_on_digits_in_3_epochs() {
    let r = train(&quick(3), |_| {}).unwrap();
    assert!(
        r.test.accuracy.unwrap() >= 0.90,
        "test accuracy {:?}",
        r.test.accuracy
    );
    assert!(
        r.train.accuracy.unwrap() >= 0.90,
        "train accuracy {:?}",
        r.train.accuracy
    );
    // The loss falls epoch over epoch and ends far below chance (ln 10 ≈ 2.30).
    assert!(
        r.epoch_losses.windows(2).all(|w| w[1] < w[0]),
        "{:?}",
        r.epoch_losses
    );
    assert!(r.test.loss < 0.5, "test loss {}", r.test.loss);
    assert_eq!(r.step_losses.len(), 3 * 1437usize.div_ceil(32));
    assert_eq!(r.checkpoint.header.epochs, 3);
}

#[test]
fn every_optimizer_learns() {
    for (opt, lr) in [
        (OptimizerName::Sgd, 0.2),
        (OptimizerName::Momentum, 0.05),
        (OptimizerName::Adamw, 3e-3),
    ] {
        let cfg = TrainConfig {
            optimizer: opt,
            lr,
            ..quick(2)
        };
        let r = train(&cfg, |_| {}).unwrap();
        assert!(
            r.test.accuracy.unwrap() >= 0.80,
            "{opt:?}: {:?}",
            r.test.accuracy
        );
    }
}

#[test]
fn eager_linked_and_cuda_sim_train_the_same_model() {
    let base = TrainConfig {
        train_subset: Some(256),
        ..quick(1)
    };
    let eager = train(&base, |_| {}).unwrap();
    for (backend, linked, deterministic) in [
        (Backend::Cpu, true, false),
        (Backend::CudaSim, false, false),
        (Backend::CudaSim, true, false),
        // --deterministic reaches Options::deterministic / LinkedSession::set_deterministic.
        (Backend::CudaSim, false, true),
        (Backend::CudaSim, true, true),
    ] {
        let cfg = TrainConfig {
            backend,
            linked,
            deterministic,
            ..base.clone()
        };
        let r = train(&cfg, |_| {}).unwrap();
        assert_eq!(r.step_losses.len(), eager.step_losses.len());
        for (a, b) in r.step_losses.iter().zip(&eager.step_losses) {
            assert!(
                (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                "{backend:?} linked={linked} deterministic={deterministic}: {a} vs {b}"
            );
        }
        assert!(
            (r.test.accuracy.unwrap() - eager.test.accuracy.unwrap()).abs() <= 1.0 / 360.0 + 1e-6
        );
        if deterministic {
            // Fixed-order reductions: a second run repeats every loss bit for bit.
            let again = train(&cfg, |_| {}).unwrap();
            assert_eq!(again.step_losses, r.step_losses, "linked={linked}");
        }
    }
}

#[test]
fn seeds_change_the_run_and_repeat_exactly() {
    let a = train(&quick(1), |_| {}).unwrap();
    let b = train(&quick(1), |_| {}).unwrap();
    assert_eq!(a.step_losses, b.step_losses);
    let c = train(
        &TrainConfig {
            seed: 7,
            ..quick(1)
        },
        |_| {},
    )
    .unwrap();
    assert_ne!(a.step_losses, c.step_losses);
}

#[test]
fn save_then_eval_gives_the_same_accuracy_and_resume_continues() {
    let dir = scratch("save-eval");
    let ckpt = dir.join("one.safetensors");
    let png = dir.join("loss.png");
    let o = tl(&[
        "train",
        "--epochs",
        "1",
        "--save",
        ckpt.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = stdout(&o);
    let done = text
        .lines()
        .find(|l| l.starts_with("done:"))
        .expect("a final line");
    let test_acc = done.rsplit("accuracy ").next().unwrap().to_owned();
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    let e = tl(&["eval", "--checkpoint", ckpt.to_str().unwrap()]);
    assert!(e.status.success(), "{}", common::stderr(&e));
    assert!(
        stdout(&e).trim_end().ends_with(test_acc.trim_end()),
        "{} vs {test_acc}",
        stdout(&e)
    );

    let two = dir.join("two.safetensors");
    let r = tl(&[
        "train",
        "--epochs",
        "1",
        "--resume",
        ckpt.to_str().unwrap(),
        "--save",
        two.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", common::stderr(&r));
    let text = stdout(&r);
    assert!(text.contains("epoch   2/2"), "resume counts on: {text}");
    let ck1 = tl_cli::checkpoint::load(&ckpt).unwrap();
    let ck2 = tl_cli::checkpoint::load(&two).unwrap();
    assert_eq!((ck1.header.epochs, ck2.header.epochs), (1, 2));
    let names = |c: &tl_cli::checkpoint::Checkpoint| {
        c.tensors.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
    };
    // PyTorch's `nn.Sequential(Linear, ReLU, Linear).state_dict()` names.
    assert_eq!(names(&ck1), ["0.bias", "0.weight", "2.bias", "2.weight"]);
    assert_ne!(ck1.tensors, ck2.tensors, "the resumed run trained");
    // The resumed run starts from the saved parameters: its first loss is far below a fresh
    // start's (≈ ln 10) and its second epoch ends better than the first.
    let eval = |path: &std::path::Path| {
        let cfg = tl_cli::train::EvalConfig {
            model: Some(ModelName::Mlp),
            ..tl_cli::train::EvalConfig::new(path)
        };
        tl_cli::train::eval_checkpoint(&cfg, &mut |_| {})
            .unwrap()
            .metrics
    };
    let (e1, e2) = (eval(&ckpt), eval(&two));
    assert!(e2.loss < e1.loss, "{} !< {}", e2.loss, e1.loss);
    let resumed = train(
        &TrainConfig {
            resume: Some(ckpt.clone()),
            ..quick(1)
        },
        |_| {},
    )
    .unwrap();
    assert!(
        resumed.step_losses[0] < 1.2,
        "first resumed loss {}",
        resumed.step_losses[0]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn resume_continues_the_exact_trajectory_with_the_optimizer_state() {
    // Two epochs straight, or one, save, resume for one: the same steps bit for bit, for Adam
    // (moments and step counts) and momentum SGD (its buffer), eager and linked.
    let dir = scratch("resume-exact");
    for (opt, lr, linked) in [
        (OptimizerName::Adam, 1e-3, false),
        (OptimizerName::Momentum, 0.05, true),
    ] {
        let base = TrainConfig {
            optimizer: opt,
            lr,
            linked,
            train_subset: Some(256),
            ..quick(2)
        };
        let straight = train(&base, |_| {}).unwrap();
        let path = dir.join(format!("{}.safetensors", opt.as_str()));
        let first = train(
            &TrainConfig {
                epochs: 1,
                save: Some(path.clone()),
                ..base.clone()
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(first.checkpoint.header.optimizer, Some(opt));
        let state = &first.checkpoint.optimizer_state;
        // Per parameter (4): step, m, v for Adam, step and momentum buffer for momentum SGD;
        // and the rule's five hyper-parameters.
        let want = if opt == OptimizerName::Adam { 3 } else { 2 };
        assert_eq!(state.len(), want * 4 + 5, "{:?}", state.keys());
        let rule = if opt == OptimizerName::Adam {
            "adam"
        } else {
            "sgd"
        };
        assert_eq!(state[&format!("{rule}.lr")].data(), &[lr]);
        // The file holds every tensor bit for bit.
        assert_eq!(tl_cli::checkpoint::load(&path).unwrap(), first.checkpoint);
        let mut notes = Vec::new();
        let resumed = train(
            &TrainConfig {
                epochs: 1,
                resume: Some(path.clone()),
                ..base.clone()
            },
            |l| notes.push(l.to_owned()),
        )
        .unwrap();
        assert!(!notes.iter().any(|l| l.starts_with("note:")), "{notes:?}");
        let half = straight.step_losses.len() / 2;
        assert_eq!(resumed.step_losses, straight.step_losses[half..], "{opt:?}");
        assert_eq!(resumed.checkpoint, straight.checkpoint, "{opt:?}");

        // Neither --optimizer nor --lr (the model's defaults otherwise, Adam 3e-3 for the
        // mlp): the checkpoint's rule and rate, so the same steps again, and its line says so.
        let mut lines = Vec::new();
        let kept = train(
            &TrainConfig {
                epochs: 1,
                resume: Some(path.clone()),
                linked,
                train_subset: Some(256),
                ..quick(2)
            },
            |l| lines.push(l.to_owned()),
        )
        .unwrap();
        assert!(!lines.iter().any(|l| l.starts_with("note:")), "{lines:?}");
        assert!(lines[0].contains(&format!("{opt:?} lr {lr}")), "{lines:?}");
        assert_eq!(kept.step_losses, straight.step_losses[half..], "{opt:?}");
        assert_eq!(kept.checkpoint, straight.checkpoint, "{opt:?}");

        // Another --lr: the run says it differs from the checkpoint's and takes it.
        let mut lr_notes = Vec::new();
        let faster = train(
            &TrainConfig {
                epochs: 1,
                lr: 2.0 * lr,
                lr_given: true,
                resume: Some(path.clone()),
                ..base.clone()
            },
            |l| lr_notes.push(l.to_owned()),
        )
        .unwrap();
        let note = format!("was trained with lr {lr}; this run uses --lr {}", 2.0 * lr);
        assert!(
            lr_notes
                .iter()
                .any(|l| l.starts_with("note:") && l.contains(&note)),
            "{lr_notes:?}"
        );
        assert_eq!(
            faster.checkpoint.optimizer_state[&format!("{rule}.lr")].data(),
            &[2.0 * lr]
        );
        assert_ne!(faster.step_losses, resumed.step_losses, "{opt:?}");

        // Another optimizer starts fresh, and says so; the run still trains.
        let other = train(
            &TrainConfig {
                epochs: 1,
                optimizer: OptimizerName::Sgd,
                optimizer_given: true,
                lr: 0.1,
                lr_given: true,
                resume: Some(path.clone()),
                ..base.clone()
            },
            |l| notes.push(l.to_owned()),
        )
        .unwrap();
        assert!(
            notes
                .iter()
                .any(|l| l.starts_with("note:") && l.contains("fresh")),
            "{notes:?}"
        );
        assert_eq!(other.checkpoint.header.optimizer, Some(OptimizerName::Sgd));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn verify_and_graph_through_the_binary() {
    let o = tl(&[
        "verify", "--cases", "4", "--only", "linear", "--only", "dag",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = stdout(&o);
    assert!(text.lines().any(|l| l.starts_with("linear")), "{text}");
    assert!(text.trim_end().ends_with("24 passed, 0 failed"), "{text}");

    let o = tl(&[
        "verify",
        "--backend",
        "cuda-sim",
        "--cases",
        "4",
        "--only",
        "add",
        "--json",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["backend"], "cuda-sim");
    assert_eq!(v["failed"], 0);
    assert_eq!(v["rows"][0]["op"], "add");
    assert_eq!(v["rows"][0]["checks"]["2 bwd sim"]["cases"], 4);
    assert_eq!(v["rows"][0]["checks"]["6 det sim"]["cases"], 4);
    assert_eq!(v["rows"][0]["checks"]["5 sess sim"]["cases"], 4);
    assert!(v["rows"][0]["checks"]["2 bwd f64"].is_null());

    // gelu (issue 3) has its CUDA formula: all five sim cells run, nothing is pending. (The
    // pending path itself is tested in tl-conformance's cuda_sim tests with a tape that hides
    // a formula.)
    let o = tl(&[
        "verify",
        "--backend",
        "cuda-sim",
        "--cases",
        "4",
        "--only",
        "gelu",
        "--only",
        "dag",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = stdout(&o);
    for row in ["gelu", "dag"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("a {row} row in {text}"));
        assert_eq!(line.matches("4/").count(), 5, "{line}");
        assert!(!line.contains("pending"), "{line}");
    }
    assert!(!text.contains("pending:"), "{text}");

    let dir = scratch("graph");
    let dot = dir.join("mlp.dot");
    let o = tl(&["graph", "--model", "mlp", "-o", dot.to_str().unwrap()]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let text = std::fs::read_to_string(&dot).unwrap();
    assert!(
        text.starts_with("digraph") && text.contains("0.weight") && text.contains("crossEntropy")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn mlp_defaults_reach_95_percent_on_digits() {
    // What `tl train` runs with no flags (20 epochs; about a second in a debug build).
    let r = train(&TrainConfig::defaults(ModelName::Mlp), |_| {}).unwrap();
    assert!(
        r.test.accuracy.unwrap() >= 0.95,
        "test accuracy {:?}",
        r.test.accuracy
    );
}
