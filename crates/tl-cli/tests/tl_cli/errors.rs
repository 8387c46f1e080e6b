//! Every error a user can hit prints one `error: ...` line and exits non-zero: 2 for a usage
//! error (however it is found), 1 for a runtime one.

use std::process::Output;

use crate::common::{self, assert_one_line_error, scratch, tl};

/// Assert `o` is one `error: …` line containing every `needle`, with exit status 2.
fn assert_usage_error(o: &Output, needles: &[&str]) {
    assert_one_line_error(o, needles);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(o));
    assert!(o.stdout.is_empty(), "{}", common::stdout(o));
}

/// A bare `tl` prints clap's whole help (usage and the subcommands, one per line) on stderr and
/// exits 2, as a clap command whose subcommand is missing does; it was squashed into one
/// `error:` line.
#[test]
fn a_bare_tl_prints_the_help_and_exits_2() {
    let o = tl(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "the help goes to stderr");
    let err = common::stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.len() > 5, "the help, one item a line: {err}");
    assert!(lines.iter().any(|l| l.starts_with("Usage: tl")), "{err}");
    for sub in ["train", "eval", "verify", "graph"] {
        assert!(
            lines.iter().any(|l| l.trim_start().starts_with(sub)),
            "no line for {sub}: {err}"
        );
    }
    // The same text as `tl --help` (on stdout, exit 0).
    let help = tl(&["--help"]);
    assert!(help.status.success());
    assert_eq!(common::stdout(&help), err);
}

/// Flag values the command refuses after clap has parsed them are usage errors like clap's own:
/// exit 2, one line naming the flag and the value; they exited 1, as runtime failures (a file
/// that cannot be written, a missing checkpoint) still do.
#[test]
fn flag_values_refused_after_parsing_exit_2_and_runtime_failures_1() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["train", "--batch-size", "0"],
            &["--batch-size 0", "at least 1"],
        ),
        (&["train", "--lr", "0"], &["--lr 0", "positive"]),
        (&["train", "--lr", "-1"], &["--lr -1", "positive"]),
        (&["train", "--lr", "NaN"], &["--lr NaN", "positive"]),
        (&["train", "--train-subset", "0"], &["--train-subset 0"]),
        (&["train", "--test-subset", "0"], &["--test-subset 0"]),
        (
            &["train", "--modes", "8"],
            &["--modes 8", "--preset fno-paper"],
        ),
        (
            &["train", "--preset", "fno-paper", "--lr", "0.5"],
            &["--lr 0.5", "--preset fno-paper"],
        ),
        (
            &["train", "--preset", "fno-paper", "--model", "mlp"],
            &["--model mlp", "--preset fno-paper"],
        ),
        (
            &["train", "--preset", "fno-paper", "--grid", "100"],
            &["--grid 100"],
        ),
        (
            &["train", "--preset", "fno-paper", "--super-grid", "100"],
            &["--super-grid 100"],
        ),
        (
            &["train", "--preset", "fno-paper", "--modes", "0"],
            &["--modes 0"],
        ),
        (
            &["train", "--preset", "fno-paper", "--output-scale", "0"],
            &["--output-scale 0"],
        ),
        (
            &["train", "--plot", "loss.svg"],
            &["--plot loss.svg", ".png"],
        ),
        (
            &["train", "--epochs", "0", "--plot", "l.png"],
            &["--plot l.png", "--epochs 0"],
        ),
        (&["train", "--save", "/"], &["--save /", "names no file"]),
        (&["verify", "--cases", "0"], &["--cases 0", "at least 1"]),
        (&["verify", "--only", "nosuchop"], &["--only nosuchop"]),
    ];
    for (args, want) in cases {
        assert_usage_error(&tl(args), want);
    }
    let dir = scratch("exit-status");
    let missing = dir.join("no/such/dir/m.safetensors");
    let missing = missing.to_str().unwrap();
    for (args, want) in [
        (
            &["eval", "--checkpoint", missing][..],
            &["cannot read checkpoint"][..],
        ),
        (
            &["train", "--epochs", "1", "--save", missing],
            &["--save", "does not exist"],
        ),
    ] {
        let o = tl(args);
        assert_one_line_error(&o, want);
        assert_eq!(o.status.code(), Some(1), "{args:?}: a runtime failure");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A negative number on any numeric flag of any subcommand is refused naming the flag and the
/// value (an integer flag: it must be a non-negative integer), exit 2; clap read `-1` as an
/// unknown flag ("unexpected argument '-1'"). A value that is not an integer at all says the
/// same.
#[test]
fn negative_numbers_on_numeric_flags_name_the_flag_and_the_value() {
    let integer_flags: &[(&str, &str)] = &[
        ("train", "--epochs"),
        ("train", "--batch-size"),
        ("train", "--seed"),
        ("train", "--train-subset"),
        ("train", "--test-subset"),
        ("train", "--grid"),
        ("train", "--super-grid"),
        ("train", "--modes"),
        ("eval", "--grid"),
        ("verify", "--cases"),
        ("verify", "--seed"),
        ("graph", "--batch-size"),
    ];
    for &(sub, flag) in integer_flags {
        for value in ["-1", "-3", "2.5"] {
            let mut args = vec![sub, flag, value];
            if sub == "eval" {
                args.extend(["--checkpoint", "c.safetensors"]);
            }
            let o = tl(&args);
            assert_usage_error(&o, &[flag, value, "must be a non-negative integer"]);
        }
    }
    let o = tl(&["train", "--epochs", "-1"]);
    assert_usage_error(&o, &["'-1'", "--epochs", "must be a non-negative integer"]);
    // Float flags: the value parses and the command refuses it.
    assert_usage_error(&tl(&["train", "--lr", "-0.5"]), &["--lr -0.5", "positive"]);
    assert_usage_error(
        &tl(&["train", "--preset", "fno-paper", "--output-scale", "-2"]),
        &["--output-scale -2", "positive"],
    );
}

/// `tl graph --batch-size 0` is the usage error `tl train --batch-size 0` is; it recorded a
/// batch of 1 and exited 0.
#[test]
fn graph_batch_size_zero_is_a_usage_error() {
    assert_usage_error(
        &tl(&["graph", "--batch-size", "0"]),
        &["--batch-size 0", "at least 1"],
    );
    let o = tl(&["graph", "--batch-size", "3"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(
        common::stdout(&o).contains("[3, 64]"),
        "a batch of 3 recorded"
    );
}

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
    assert_one_line_error(&tl(&["verify", "--cases", "0"]), &["--cases", "at least 1"]);
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
    // The command line is fine; the file does not fit it: a runtime failure.
    assert_eq!(o.status.code(), Some(1));
    let o = tl(&["eval", "--model", "transformer", "--checkpoint", p]);
    assert_one_line_error(&o, &["holds a mlp model, not transformer"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--save` and `--plot` are checked before anything trains (they were written after the
/// run, so a bad path lost it): a missing directory, a directory, a plot that is not a PNG,
/// a plot of zero epochs, a plot and a checkpoint naming one file. And a resumed run whose
/// epoch count would overflow is an error, not a wrapped count with exit 0.
#[test]
fn bad_output_paths_and_epoch_counts_are_refused_before_training() {
    let dir = scratch("outputs");
    let at = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let missing = at("no/such/dir/m.safetensors");
    let (svg, png, ckpt) = (at("l.svg"), at("z.png"), at("z.safetensors"));
    let d = dir.to_str().unwrap().to_owned();
    let same = format!("{d}/./z.png");
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--epochs", "1", "--save", &missing],
            &["--save", "does not exist"],
        ),
        (
            &["--epochs", "1", "--save", &d],
            &["--save", "not a regular file"],
        ),
        (&["--epochs", "1", "--plot", &svg], &["--plot", ".png"]),
        (
            &["--epochs", "0", "--plot", &png, "--save", &ckpt],
            &["--epochs 0"],
        ),
        (
            &["--epochs", "1", "--save", &png, "--plot", &same],
            &[&format!("--save {png} and --plot {same}"), "same file"],
        ),
    ];
    for (flags, want) in cases {
        let mut args = vec!["train", "--train-subset", "32"];
        args.extend_from_slice(flags);
        let o = tl(&args);
        assert_one_line_error(&o, want);
        assert!(o.stdout.is_empty(), "{flags:?}: trained before refusing");
    }
    assert!(
        !dir.join("z.safetensors").exists(),
        "a refused run wrote its checkpoint"
    );
    let o = tl(&[
        "train",
        "--epochs",
        "1",
        "--train-subset",
        "32",
        "--save",
        &ckpt,
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let huge = usize::MAX.to_string();
    let o = tl(&[
        "train", "--resume", &ckpt, "--epochs", &huge, "--save", &ckpt,
    ]);
    assert_one_line_error(&o, &["--epochs", "the total is past"]);
    // A flag's value that cannot be: a usage error, clap's exit status.
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    // A checkpoint whose metadata counts usize::MAX epochs: one more is an error naming the
    // file and the count (the loop from `done + 1` overflowed: a panic in this debug build);
    // none more runs (and evaluates) as asked.
    let mut file = tl_nn::checkpoint::read(std::path::Path::new(&ckpt)).unwrap();
    file.metadata.insert("epochs".into(), huge.clone());
    tl_nn::checkpoint::write(std::path::Path::new(&ckpt), &file).unwrap();
    let o = tl(&[
        "train",
        "--resume",
        &ckpt,
        "--epochs",
        "1",
        "--train-subset",
        "32",
    ]);
    assert_one_line_error(
        &o,
        &[&format!("checkpoint {ckpt}"), &huge, "cannot be continued"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(o.stdout.is_empty(), "refused before the run's first line");
    let o = tl(&[
        "train",
        "--resume",
        &ckpt,
        "--epochs",
        "0",
        "--train-subset",
        "32",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(
        common::stdout(&o).contains(&format!("done: {huge} epoch(s)")),
        "{}",
        common::stdout(&o)
    );
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

/// Run `tl args…` with writes to files limited to 512 bytes (`ulimit -f 1`, SIGXFSZ ignored), so a
/// write past that fails with "File too large": an injected write error in the middle of a file.
fn tl_with_file_size_limit(args: &[&str]) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"trap "" XFSZ; ulimit -f 1; exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_tl"))
        .args(args)
        .output()
        .expect("sh runs")
}

/// The files in `dir`, sorted (to see that no temporary file was left behind).
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `tl graph -o` writes atomically (issue 14): a write that fails part-way leaves the previous
/// file as it was, no temporary file behind, and one clear error line; a target that is a
/// directory is refused the same way; a write that succeeds replaces the file.
#[test]
fn graph_output_is_written_atomically() {
    let dir = scratch("graph-atomic");
    let dot = dir.join("model.dot");
    let path = dot.to_str().unwrap();
    let o = tl(&["graph", "--model", "transformer", "-o", path]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let full = std::fs::read_to_string(&dot).unwrap();
    assert!(
        full.starts_with("digraph") && full.len() > 4096,
        "the graph is larger than the 512-byte limit below: {} bytes",
        full.len()
    );

    std::fs::write(&dot, "previous graph").unwrap();
    let o = tl_with_file_size_limit(&["graph", "--model", "transformer", "-o", path]);
    assert_one_line_error(&o, &["cannot write the graph", path, "too large"]);
    assert_eq!(std::fs::read_to_string(&dot).unwrap(), "previous graph");
    assert_eq!(listing(&dir), ["model.dot"], "no temporary file is left");

    // The target is a directory: the rename fails; the directory and its content stay.
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("keep"), "kept").unwrap();
    let o = tl(&[
        "graph",
        "--model",
        "transformer",
        "-o",
        sub.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, &["cannot write the graph", sub.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(sub.join("keep")).unwrap(), "kept");
    assert_eq!(listing(&dir), ["model.dot", "sub"]);

    // Without the limit the write replaces the previous file.
    let o = tl(&["graph", "--model", "transformer", "-o", path]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(std::fs::read_to_string(&dot).unwrap(), full);
    let _ = std::fs::remove_dir_all(dir);
}

/// `tl train --plot` writes atomically too: a failed write leaves the previous image intact.
#[test]
fn loss_plot_is_written_atomically() {
    let dir = scratch("plot-atomic");
    let png = dir.join("loss.png");
    std::fs::write(&png, "previous plot").unwrap();
    let args = ["train", "--epochs", "1", "--plot", png.to_str().unwrap()];
    let o = tl_with_file_size_limit(&args);
    assert_one_line_error(&o, &["cannot write plot", png.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&png).unwrap(), "previous plot");
    assert_eq!(listing(&dir), ["loss.png"], "no temporary file is left");
    let o = tl(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let _ = std::fs::remove_dir_all(dir);
}

/// `tl train` started by mpirun with several ranks (here: the variable Open MPI sets) needs the
/// `mpi` feature; without it, one clear line before anything is trained.
#[cfg(not(feature = "mpi"))]
#[test]
fn mpirun_without_the_mpi_feature_is_a_clear_error() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tl"))
        .args(["train", "--epochs", "1", "--train-subset", "32"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .expect("the tl binary runs");
    assert_one_line_error(&o, &["mpirun with 2 ranks", "--features mpi"]);
    assert!(o.stdout.is_empty(), "nothing is trained or printed first");
}
