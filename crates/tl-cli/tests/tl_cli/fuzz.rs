//! Generated bad input to what `tl` reads: checkpoint metadata and the command line.
//!
//! The bytes of a checkpoint are tl-nn's reader's (its `fuzz::` module corrupts them); here
//! the file is valid safetensors and what `tl` reads from it is generated: every metadata
//! entry `tl` interprets (`format`, `model`, `epochs`, `optimizer`, `preset`, `grid`, `modes`,
//! `output_scale`) absent, valid, at a boundary (0, 2⁶⁴, −1, NaN, ∞) or any text, with or
//! without optimizer tensors, with tensors of the wrong dtype. `checkpoint::read` and
//! `checkpoint::load` return an error naming the file, or exactly what the metadata says.
//! `tl train` / `tl eval` arguments drawn from the flags with good, boundary and arbitrary
//! values parse or are refused by clap, and a parsed `tl train` gives a configuration whose
//! checked values hold (`--batch-size` ≥ 1, a positive finite `--lr`, …) or a usage error naming
//! the flag. Nothing panics (a panic fails the property, which prints the shrunk input).
//!
//! `TL_CASES` (default 2000) and `TL_SEED` as for the harness:
//! `cargo test -p tl-cli --test tl_cli fuzz::`.

use std::collections::BTreeMap;

use clap::Parser;
use proptest::prelude::*;
use tl_cli::checkpoint;
use tl_cli::cli::{Cli, Command, ModelName, OptimizerName};
use tl_cli::fno_paper::{PAPER, PaperData, PaperModel, PaperRun};
use tl_cli::train::TrainConfig;
use tl_conformance::RunConfig;
use tl_nn::checkpoint::{Entry, FORMAT, File};

fn run_config() -> RunConfig {
    RunConfig::from_env_or(2000)
}

/// A metadata value: absent, one of `good`, a boundary, or any text.
fn value(good: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        4 => prop::sample::select(good).prop_map(|s| Some(s.to_owned())),
        2 => prop::sample::select(&[
            "0", "1", "-1", "18446744073709551615", "18446744073709551616", "1e309", "NaN",
            "inf", "-0", " 1", "", "0x10", "1.5",
        ][..])
        .prop_map(|s| Some(s.to_owned())),
        1 => "\\PC{0,8}".prop_map(Some),
    ]
}

/// The entries `tl` interprets, and good values of each.
const KEYS: [(&str, &[&str]); 8] = [
    ("format", &[FORMAT, "tl-nn/0"]),
    ("model", &["mlp", "cnn", "transformer", "fno", "MLP"]),
    ("epochs", &["1", "3", "1000000"]),
    ("optimizer", &["adam", "sgd", "momentum", "adamw", "lbfgs"]),
    ("preset", &["fno-paper", "fno"]),
    ("grid", &["64", "256", "1024", "8192"]),
    ("modes", &["16", "1", "0"]),
    ("output_scale", &["1.0", "0.5", "0", "-1"]),
];

/// Metadata: what `tl train --save` writes (a default model with Adam, or a `--preset
/// fno-paper` one), then up to 3 entries each removed or set to a generated value.
fn metadata() -> impl Strategy<Value = Vec<(&'static str, Option<String>)>> {
    let edit = (0..KEYS.len()).prop_flat_map(|k| (Just(k), value(KEYS[k].1)));
    (any::<bool>(), prop::collection::vec(edit, 0..=3)).prop_map(|(paper, edits)| {
        let good = if paper {
            [FORMAT, "fno", "3", "adam", "fno-paper", "256", "16", "1.0"]
        } else {
            [FORMAT, "mlp", "3", "adam", "", "", "", ""]
        };
        let mut m: Vec<(&str, Option<String>)> = KEYS
            .iter()
            .zip(good)
            .map(|((k, _), v)| (*k, Some(v.to_owned()).filter(|v| !v.is_empty())))
            .collect();
        for (k, v) in edits {
            m[k].1 = v;
        }
        m
    })
}

fn f32_entry(dims: Vec<usize>) -> Entry {
    let n: usize = dims.iter().product();
    Entry {
        dtype: safetensors::Dtype::F32,
        dims,
        bytes: (0..n)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect(),
    }
}

/// `file` as safetensors bytes (what `tl_nn::checkpoint::write` writes, without its sync: a
/// case a millisecond).
fn encode(file: &File) -> Vec<u8> {
    let views: Vec<_> = file
        .tensors
        .iter()
        .map(|(n, e)| {
            let v = safetensors::tensor::TensorView::new(e.dtype, e.dims.clone(), &e.bytes);
            (n.clone(), v.unwrap())
        })
        .collect();
    let meta = file.metadata.clone().into_iter().collect();
    safetensors::serialize(views, Some(meta)).unwrap()
}

/// A checkpoint's metadata is validated, or read exactly as written; its tensors are loaded
/// exactly or refused naming the file.
#[test]
fn checkpoint_metadata_is_refused_naming_the_file_or_read_exactly() {
    let dir = crate::common::scratch("fuzz-metadata");
    let n = std::cell::Cell::new(0u32);
    let (read_ok, load_ok) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = run_config().runner("fuzz tl checkpoint metadata");
    runner
        .run(
            &(metadata(), any::<bool>(), any::<bool>()),
            |(meta, with_state, f64_param)| {
                let mut file = File::default();
                for (k, v) in &meta {
                    if let Some(v) = v {
                        file.metadata.insert((*k).to_owned(), v.clone());
                    }
                }
                let mut w = f32_entry(vec![2, 3]);
                if f64_param {
                    w.dtype = safetensors::Dtype::F64;
                    w.dims = vec![3];
                }
                file.tensors.insert("0.weight".into(), w);
                if with_state {
                    let mut step = f32_entry(vec![]);
                    step.dtype = safetensors::Dtype::F64;
                    step.bytes = 1.0f64.to_le_bytes().to_vec();
                    file.tensors
                        .insert("optimizer.adam.step.0.weight".into(), step);
                }
                // A new file per case: truncating and rewriting one makes ext4 flush it.
                n.set(n.get() + 1);
                let path = dir.join(format!("ckpt-{}.safetensors", n.get()));
                let shown = path.display().to_string();
                std::fs::write(&path, encode(&file)).unwrap();
                let (read, loaded) = (checkpoint::read(&path), checkpoint::load(&path));
                let _ = std::fs::remove_file(&path);
                let m: BTreeMap<&str, &str> = meta
                    .iter()
                    .filter_map(|(k, v)| Some((*k, v.as_deref()?)))
                    .collect();
                let h = match read {
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(msg.contains(&shown), "the error names the file: {msg}");
                        prop_assert!(loaded.is_err(), "load takes what read refuses");
                        return Ok(());
                    }
                    Ok((_, h)) => h,
                };
                read_ok.set(read_ok.get() + 1);
                prop_assert_eq!(m.get("format").copied(), Some(FORMAT));
                prop_assert_eq!(
                    Some(h.model),
                    m.get("model").and_then(|s| ModelName::parse(s))
                );
                prop_assert_eq!(Some(h.epochs), m.get("epochs").and_then(|s| s.parse().ok()));
                prop_assert_eq!(
                    h.optimizer,
                    m.get("optimizer").map(|s| OptimizerName::parse(s).unwrap())
                );
                prop_assert!(h.optimizer.is_some() || !with_state);
                match h.paper {
                    None => prop_assert!(!m.contains_key("preset")),
                    Some(p) => {
                        prop_assert_eq!(m.get("preset").copied(), Some(PaperModel::PRESET));
                        prop_assert_eq!(h.model, ModelName::Fno);
                        prop_assert_eq!(Some(p.grid), m["grid"].parse().ok());
                        prop_assert_eq!(Some(p.modes), m["modes"].parse().ok());
                        prop_assert!(p.modes > 0);
                        prop_assert!(p.output_scale.is_finite() && p.output_scale > 0.0);
                    }
                }
                match loaded {
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(f64_param, "only the F64 parameter is refused: {msg}");
                        prop_assert!(msg.contains(&shown) && msg.contains("0.weight"), "{msg}");
                    }
                    Ok(c) => {
                        load_ok.set(load_ok.get() + 1);
                        prop_assert!(!f64_param, "an F64 parameter loaded as f32");
                        prop_assert_eq!(c.header, h);
                        prop_assert_eq!(c.tensors.len(), 1);
                        let want: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
                        prop_assert_eq!(c.tensors[0].1.data(), &want[..]);
                        prop_assert_eq!(c.optimizer_state.len(), usize::from(with_state));
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
    // Both halves ran: some files were read (and loaded), not only refused.
    assert!(
        read_ok.get() > 0 && load_ok.get() > 0,
        "{} of {} read, {} loaded",
        read_ok.get(),
        n.get(),
        load_ok.get()
    );
}

/// A flag's value: a number at a boundary, a name, or any text.
fn flag_value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(&[
            "4611686018427387904", "9223372036854775808", "18446744073709551615",
            "18446744073709551616", "1e309",
        ][..])
        .prop_map(str::to_owned),
        2 => prop::sample::select(&[
            "0", "1", "2", "64", "-1", "-0.0", "NaN", "inf", "-inf", "1e-3",
        ][..])
        .prop_map(str::to_owned),
        1 => prop::sample::select(&["mlp", "fno", "adam", "cpu", "fno-paper", ""][..])
            .prop_map(str::to_owned),
        1 => "\\PC{0,8}",
    ]
}

/// The flags of `tl train` and `tl eval` whose values are checked.
const FLAGS: [&str; 16] = [
    "--model",
    "--preset",
    "--grid",
    "--super-grid",
    "--modes",
    "--output-scale",
    "--backend",
    "--epochs",
    "--batch-size",
    "--lr",
    "--optimizer",
    "--seed",
    "--train-subset",
    "--test-subset",
    "--checkpoint",
    "--data-cache",
];

/// `tl train` / `tl eval` arguments: a subcommand, half the time `--preset fno-paper` (whose
/// flags are checked further), and up to 3 other flags (each at most once) with values.
fn args() -> impl Strategy<Value = Vec<String>> {
    let flags = prop::sample::subsequence(&FLAGS[..], 0..=3)
        .prop_shuffle()
        .prop_flat_map(|f| {
            let n = f.len();
            (Just(f), prop::collection::vec(flag_value(), n))
        });
    (
        prop::sample::select(&["train", "train", "train", "eval"][..]),
        any::<bool>(),
        flags,
    )
        .prop_map(|(sub, paper, (flags, values))| {
            let mut v = vec!["tl".to_owned(), sub.to_owned()];
            if paper {
                v.extend(["--preset".to_owned(), "fno-paper".to_owned()]);
            }
            for (f, x) in flags.into_iter().zip(values) {
                v.push(f.to_owned());
                v.push(x);
            }
            v
        })
}

/// Arguments parse or are refused by clap; a parsed `tl train` is a valid configuration or an
/// error naming a flag. Nothing panics.
#[test]
fn command_lines_parse_to_valid_configurations_or_are_refused() {
    let (refused, accepted) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = run_config().runner("fuzz tl command line");
    runner
        .run(&args(), |argv| {
            let Ok(cli) = Cli::try_parse_from(&argv) else {
                return Ok(());
            };
            let Command::Train(a) = cli.command else {
                return Ok(());
            };
            match TrainConfig::from_args(&a) {
                Err(e) => {
                    refused.set(refused.get() + 1);
                    let msg = e.to_string();
                    prop_assert!(msg.contains("--"), "the error names a flag: {msg}");
                    // Nothing is read yet: every refusal is of the command line (exit 2).
                    prop_assert!(e.is_usage(), "a usage error: {msg}");
                }
                Ok(cfg) => {
                    accepted.set(accepted.get() + 1);
                    prop_assert!(cfg.batch_size >= 1, "{argv:?}");
                    prop_assert!(cfg.lr.is_finite() && cfg.lr > 0.0, "{argv:?}");
                    prop_assert!(cfg.train_subset != Some(0), "{argv:?}");
                    prop_assert!(cfg.test_subset != Some(0), "{argv:?}");
                    if let Some(p) = &cfg.paper {
                        let m = p.model();
                        prop_assert!(m.modes > 0 && m.grid.is_power_of_two(), "{argv:?}: {m:?}");
                        prop_assert!(m.output_scale.is_finite() && m.output_scale > 0.0);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // Both halves ran: parsed arguments were refused by the checks and accepted.
    assert!(
        refused.get() > 0 && accepted.get() > 0,
        "{} refused, {} accepted",
        refused.get(),
        accepted.get()
    );
}

/// Found by reading the check the command-line property drives: `--modes` of 2⁶³ or more
/// overflowed `2 * modes` in `PaperRun::validate` (a panic in a debug build; in a release build
/// it wrapped to 0 and the absurd mode count passed the check). Now it is refused, naming the
/// flag, from the command line and from a checkpoint's metadata alike.
#[test]
fn a_huge_modes_count_is_refused_not_an_overflow() {
    for modes in ["9223372036854775808", "18446744073709551615"] {
        let argv = ["tl", "train", "--preset", "fno-paper", "--modes", modes];
        let Command::Train(a) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let e = TrainConfig::from_args(&a).unwrap_err().to_string();
        assert!(e.contains("--modes") && e.contains(modes), "{e}");
        // `tl eval` of a checkpoint whose metadata says so makes the same run.
        let dir = std::env::temp_dir();
        let saved = modes.parse().unwrap();
        let e = PaperRun::new(PAPER, Some(256), Some(0), Some(saved), dir).unwrap_err();
        assert!(e.to_string().contains(modes), "{e}");
    }
}

/// The `--preset fno-paper` data cache (a safetensors file `tl` wrote) truncated at any byte or
/// with 1–8 bytes flipped: `PaperData::read_cache` refuses it naming the file and telling the
/// user to delete it, or (a flip in the header's padding, say) reads exactly the pairs written.
#[test]
fn a_corrupted_data_cache_is_refused_or_read_exactly() {
    let data = PaperData {
        source_grid: 16,
        n_train: 2,
        n_test: 1,
        ..PAPER
    };
    let dir = crate::common::scratch("fuzz-cache");
    let pairs = data.load_or_generate(&dir, 1, &mut |_| {}).unwrap();
    let good = std::fs::read(data.cache_path(&dir)).unwrap();
    let n = std::cell::Cell::new(0u32);
    let corruption = prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| vec![(i, 0u8)]),
        prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..=8),
    ];
    let mut runner = run_config().runner("fuzz tl data cache");
    runner
        .run(&corruption, |flips| {
            let mut bytes = good.clone();
            match flips[..] {
                [(at, 0)] => bytes.truncate(at.index(good.len())),
                _ => {
                    for (at, mask) in &flips {
                        bytes[at.index(good.len())] ^= mask;
                    }
                }
            }
            n.set(n.get() + 1);
            let path = dir.join(format!("cache-{}.safetensors", n.get()));
            std::fs::write(&path, &bytes).unwrap();
            let read = data.read_cache(&path);
            let _ = std::fs::remove_file(&path);
            match read {
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(
                        msg.contains(&path.display().to_string())
                            && msg.contains("delete the file"),
                        "{msg}"
                    );
                }
                Ok(p) => prop_assert!(p == pairs, "a damaged cache read as other pairs"),
            }
            Ok(())
        })
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
