//! `--preset fno-paper`: a reduced run of the FNO paper's Burgers benchmark (a small source
//! grid, few pairs, three epochs; the full run is the documented command in
//! docs/benchmarks.md, not a test), its data cache, and the flags it refuses.

use std::path::PathBuf;

use crate::common::{assert_one_line_error, scratch, tl};
use tl_cli::cli::ModelName;
use tl_cli::fno_paper::{PAPER, PAPER_OUTPUT_SCALE, PaperData, PaperRun};
use tl_cli::train::{EvalConfig, TrainConfig, eval_checkpoint, train};

/// The reduced set: 256-point solutions, 80 + 20 pairs.
const REDUCED: PaperData = PaperData {
    source_grid: 256,
    n_train: 80,
    n_test: 20,
    ..PAPER
};

#[test]
fn a_reduced_paper_run_learns_and_evaluates_at_a_finer_grid() {
    let dir = scratch("fno-paper");
    let run = PaperRun::new(REDUCED, Some(64), None, None, dir.clone()).unwrap();
    // The default super-resolution grid: 4·64 = 256.
    assert_eq!(run.super_grid, Some(256));
    let ck = dir.join("ck.safetensors");
    let cfg = TrainConfig {
        epochs: 3,
        save: Some(ck.clone()),
        ..TrainConfig::fno_paper(run.clone())
    };
    let mut log = Vec::new();
    let r = train(&cfg, |l| log.push(l.to_owned())).unwrap();
    assert!(
        log.iter()
            .any(|l| l.contains("solving 100 Burgers pairs on 256 points")),
        "{log:?}"
    );
    assert!(REDUCED.cache_path(&dir).exists());
    // The relative L2 loss falls from epoch to epoch.
    let e = &r.epoch_losses;
    assert!(e[2] < e[1] && e[1] < e[0], "epoch losses {e:?}");
    let rel = r.test.rel_l2.unwrap();
    assert!(
        rel < e[0],
        "test relative L2 {rel} vs the first epoch's {}",
        e[0]
    );
    // The zero-shot super-resolution test runs on the same test pairs at 256 points, and the
    // resolution-independent operator gives about the same error there.
    let (s, m) = r.super_res.unwrap();
    let sup = m.rel_l2.unwrap();
    assert_eq!(s, 256);
    assert!(
        sup.is_finite() && (sup - rel).abs() < 0.25 * rel,
        "{sup} vs {rel}"
    );
    // A second run reads the cache instead of solving again.
    let mut log = Vec::new();
    let again = train(
        &TrainConfig {
            epochs: 1,
            ..TrainConfig::fno_paper(run.clone())
        },
        |l| log.push(l.to_owned()),
    )
    .unwrap();
    assert!(log.iter().any(|l| l.starts_with("data: read")), "{log:?}");
    let (a, b) = (again.epoch_losses[0], r.epoch_losses[0]);
    assert!((a - b).abs() <= 1e-5 * b, "{a} vs {b}");
    // `--test-subset`: the same training, evaluated on the first test pairs only (the test and
    // the super-resolution metrics both); a subset of all 20 pairs is the whole split.
    let subset = |n| {
        let cfg = TrainConfig {
            epochs: 1,
            test_subset: Some(n),
            ..TrainConfig::fno_paper(run.clone())
        };
        train(&cfg, |_| {}).unwrap()
    };
    let (two, all) = (subset(2), subset(REDUCED.n_test));
    let metrics = |r: &tl_cli::train::TrainReport| {
        let sup = r.super_res.as_ref().map(|(_, m)| m.rel_l2);
        (r.test.rel_l2, sup)
    };
    assert_eq!(two.step_losses, again.step_losses);
    assert_eq!(metrics(&all), metrics(&again));
    let (t2, ta) = (metrics(&two), metrics(&again));
    assert!(t2.0 != ta.0 && t2.1 != ta.1, "{t2:?} vs {ta:?}");
    checkpoints_rebuild_the_preset_model(&dir, &ck, &run, &r);
    let _ = std::fs::remove_dir_all(dir);
}

/// `tl eval` and `--resume` on the reduced run's checkpoint `ck`: the model comes back from
/// the checkpoint's metadata, at its grid or another, and a run that would build another model
/// is an error.
fn checkpoints_rebuild_the_preset_model(
    dir: &std::path::Path,
    ck: &std::path::Path,
    run: &PaperRun,
    r: &tl_cli::train::TrainReport,
) {
    let saved = tl_cli::checkpoint::load(ck).unwrap().header;
    assert_eq!(saved.paper, Some(run.model()));
    assert_eq!(run.model().output_scale, PAPER_OUTPUT_SCALE);
    let eval = |grid: Option<usize>| {
        let cfg = EvalConfig {
            grid,
            data_cache: Some(dir.to_owned()),
            paper_data: REDUCED,
            ..EvalConfig::new(ck)
        };
        eval_checkpoint(&cfg, &mut |_| {}).unwrap()
    };
    // The same model on the same pairs: the training run's own test metrics, exactly.
    let e = eval(None);
    assert_eq!(e.metrics.rel_l2, r.test.rel_l2);
    assert!(e.data.contains("s = 64 (trained at s = 64)"), "{}", e.data);
    let (s, sup) = r.super_res.as_ref().unwrap();
    let e = eval(Some(*s));
    assert_eq!(e.metrics.rel_l2, sup.rel_l2);
    // Resuming with another output scale, or without the preset, would build another model.
    let resume = |cfg: TrainConfig| {
        let cfg = TrainConfig {
            epochs: 1,
            resume: Some(ck.to_owned()),
            ..cfg
        };
        train(&cfg, |_| {}).err().unwrap().to_string()
    };
    let other = run.clone().with_output_scale(1.0).unwrap();
    let e = resume(TrainConfig::fno_paper(other));
    assert!(
        e.contains("trained with --output-scale 0.01")
            && e.contains("this run has --output-scale 1"),
        "{e}"
    );
    let e = resume(TrainConfig::defaults(ModelName::Fno));
    assert!(e.contains("resume it with --preset fno-paper"), "{e}");
    // The checkpoint holds an fno model; `--model` must agree when it is given.
    let o = tl(&[
        "eval",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--model",
        "mlp",
    ]);
    assert_one_line_error(&o, &["holds a fno model, not mlp"]);
}

fn preset(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "train",
        "--preset",
        "fno-paper",
        "--epochs",
        "1",
        "--data-cache",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    tl(&args)
}

#[test]
fn bad_grids_modes_and_contradicting_flags_are_one_line_errors() {
    let dir = scratch("fno-paper-flags");
    for (extra, needles) in [
        (&["--grid", "300"][..], &["--grid 300", "power of two"][..]),
        (&["--grid", "16384"], &["--grid 16384", "up to 8192"]),
        (&["--grid", "16"], &["--modes 16", "s/2 = 8"]),
        (
            &["--grid", "256", "--modes", "200"],
            &["--modes 200", "s/2 = 128"],
        ),
        (
            &["--super-grid", "1000"],
            &["--super-grid 1000", "power of two"],
        ),
        (
            &["--model", "cnn"],
            &["--preset fno-paper contradicts --model cnn"],
        ),
        (
            &["--optimizer", "sgd"],
            &["contradicts --optimizer sgd", "adam"],
        ),
        (&["--lr", "0.01"], &["contradicts --lr 0.01", "0.001"]),
        (
            &["--output-scale", "0"],
            &["--output-scale 0", "positive number"],
        ),
        (
            &["--batch-size", "32"],
            &["contradicts --batch-size 32", "20"],
        ),
    ] {
        assert_one_line_error(&preset(&dir, extra), needles);
    }
    // The paper's own values are no contradiction; nothing is solved before the check above,
    // so the directory stays empty.
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
    assert_one_line_error(
        &tl(&["train", "--model", "fno", "--grid", "256"]),
        &["--grid 256: the flag belongs to --preset fno-paper"],
    );
    assert_one_line_error(
        &tl(&["train", "--model", "fno", "--output-scale", "1"]),
        &["--output-scale 1: the flag belongs to --preset fno-paper"],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_damaged_cache_or_an_unusable_cache_directory_is_an_error_naming_the_path() {
    let dir = scratch("fno-paper-cache");
    let path: PathBuf = PAPER.cache_path(&dir);
    std::fs::write(&path, b"not a safetensors file").unwrap();
    let o = preset(&dir, &[]);
    assert_one_line_error(&o, &[path.to_str().unwrap(), "delete the file"]);
    // A regular file where the directory should be.
    let file = dir.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let o = preset(&file, &[]);
    assert_one_line_error(&o, &["cannot create the data cache directory", "plain"]);
    let _ = std::fs::remove_dir_all(dir);
}
