//! Every error a user can hit prints one `error: ...` line and exits non-zero.

use crate::common::{self, assert_one_line_error, scratch, tl};

#[test]
fn unknown_model_and_bad_flags_are_one_line_usage_errors() {
    let o = tl(&["train", "--model", "resnet"]);
    assert_one_line_error(&o, &["resnet", "mlp"]);
    assert_eq!(o.status.code(), Some(2));
    assert_one_line_error(&tl(&["train", "--epochs", "many"]), &["many", "--epochs"]);
    assert_one_line_error(&tl(&["train", "--frobnicate"]), &["--frobnicate"]);
    assert_one_line_error(&tl(&["eval"]), &["--checkpoint"]);
    assert_one_line_error(&tl(&["train", "--lr", "-1", "--epochs", "1"]), &["--lr"]);
    assert_one_line_error(&tl(&["train", "--batch-size", "0"]), &["--batch-size"]);
    assert_one_line_error(&tl(&["verify", "--only", "nosuchop"]), &["nosuchop"]);
}

#[test]
fn resuming_another_models_checkpoint_is_a_clear_error() {
    let dir = scratch("other-model");
    let ckpt = dir.join("mlp.safetensors");
    let o = tl(&[
        "train",
        "--epochs",
        "1",
        "--train-subset",
        "32",
        "--save",
        ckpt.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let p = ckpt.to_str().unwrap();
    let o = tl(&["train", "--model", "cnn", "--epochs", "1", "--resume", p]);
    assert_one_line_error(&o, &["holds a mlp model, not cnn"]);
    let o = tl(&["eval", "--model", "transformer", "--checkpoint", p]);
    assert_one_line_error(&o, &["holds a mlp model, not transformer"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
#[test]
fn cuda_without_the_feature_is_a_clear_error() {
    for args in [
        &["train", "--backend", "cuda", "--epochs", "1"][..],
        &["train", "--backend", "cuda", "--linked", "--epochs", "1"],
        &["verify", "--backend", "cuda"],
    ] {
        let o = tl(args);
        assert_one_line_error(&o, &["cuda", "--features cuda", "--backend cuda-sim"]);
        assert!(o.stdout.is_empty(), "nothing is trained or printed first");
    }
}

/// Built with the feature: on a machine without a GPU (CI's stub libcuda), one clear line; with
/// one, `--backend cuda` trains.
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
#[test]
fn cuda_with_the_feature_trains_or_says_there_is_no_device() {
    for args in [
        &[
            "train",
            "--backend",
            "cuda",
            "--epochs",
            "1",
            "--train-subset",
            "64",
        ][..],
        &[
            "train",
            "--backend",
            "cuda",
            "--linked",
            "--epochs",
            "1",
            "--train-subset",
            "64",
        ],
    ] {
        let o = tl(args);
        if o.status.success() {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.lines().any(|l| l.starts_with("done:")), "{out}");
        } else {
            assert_one_line_error(&o, &["backend cuda is not available", "no CUDA device"]);
            eprintln!("no CUDA device: skipping the GPU run");
        }
    }
}

#[test]
fn missing_truncated_and_malformed_checkpoints() {
    let dir = scratch("ckpt-errors");
    let missing = dir.join("missing.safetensors");
    let o = tl(&["eval", "--checkpoint", missing.to_str().unwrap()]);
    assert_one_line_error(&o, &["cannot read checkpoint", "missing.safetensors"]);

    let good = dir.join("good.safetensors");
    let o = tl(&[
        "train",
        "--epochs",
        "1",
        "--train-subset",
        "64",
        "--save",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let bytes = std::fs::read(&good).unwrap();
    // Cut inside the length prefix, inside the JSON header, and inside the tensor data.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for cut in [4, 8 + header_len / 2, bytes.len() - 100, bytes.len() - 1] {
        let p = dir.join(format!("cut{cut}.safetensors"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let o = tl(&["eval", "--checkpoint", p.to_str().unwrap()]);
        assert_one_line_error(&o, &["not a valid safetensors file", "truncated"]);
    }
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(
        &garbage,
        b"this is not a checkpoint at all, just some text\n",
    )
    .unwrap();
    let o = tl(&["eval", "--checkpoint", garbage.to_str().unwrap()]);
    assert_one_line_error(&o, &["not a valid safetensors file"]);
    // A valid safetensors file that tl did not write: no metadata.
    let foreign = dir.join("foreign.safetensors");
    let mut f = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#.to_vec();
    while !f.len().is_multiple_of(8) {
        f.push(b' ');
    }
    let mut out = (f.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&f);
    out.extend_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(&foreign, out).unwrap();
    let o = tl(&["eval", "--checkpoint", foreign.to_str().unwrap()]);
    assert_one_line_error(&o, &["format"]);
    // Resuming from a bad file fails before training.
    let o = tl(&["train", "--resume", garbage.to_str().unwrap()]);
    assert_one_line_error(&o, &["not a valid safetensors file"]);

    // Optimizer state that does not fit: a moment of the wrong shape.
    let mut file = tl_nn::checkpoint::read(&good).unwrap();
    assert_eq!(
        file.metadata["optimizer"], "adam",
        "train --save keeps optimizer state"
    );
    let key = file
        .tensors
        .keys()
        .find(|k| k.starts_with("optimizer.adam.m."))
        .unwrap()
        .clone();
    let wrong = tl_nn::checkpoint::Entry::from_tensor(&tl_spec::Tensor::<f64>::zeros([3]));
    file.tensors.insert(key, wrong);
    let misfit = dir.join("misfit.safetensors");
    tl_nn::checkpoint::write(&misfit, &file).unwrap();
    let o = tl(&[
        "train",
        "--epochs",
        "1",
        "--resume",
        misfit.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, &["misfit.safetensors", "optimizer state does not fit"]);
    assert!(
        o.stdout.iter().filter(|&&b| b == b'\n').count() <= 1,
        "fails before training"
    );
    // An unknown optimizer in the metadata.
    let mut renamed = bytes.clone();
    let at = renamed
        .windows(6)
        .position(|w| w == b"\"adam\"")
        .expect("the optimizer in the metadata");
    renamed[at + 1..at + 5].copy_from_slice(b"lion");
    let lion = dir.join("lion.safetensors");
    std::fs::write(&lion, renamed).unwrap();
    let o = tl(&["eval", "--checkpoint", lion.to_str().unwrap()]);
    assert_one_line_error(&o, &["unknown optimizer \"lion\""]);
    let _ = std::fs::remove_dir_all(dir);
}
