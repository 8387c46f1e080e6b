//! The command line (clap derive): `tl train | eval | verify | graph`.
//!
//! Every numeric flag takes a negative number as its value (`allow_negative_numbers`), so
//! `--epochs -1` is refused naming the flag and the value rather than read as an unknown flag
//! `-1`; the integer flags parse with [`count`], [`count_u32`] and [`seed`], which say what the
//! value must be.

use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `tl`: train, evaluate and verify models on the torchlean-rs runtime.
#[derive(Debug, Parser)]
#[command(name = "tl", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model on its dataset and report train/test metrics.
    Train(TrainArgs),
    /// Evaluate a checkpoint on the test split.
    Eval(EvalArgs),
    /// Run the conformance harness and print the op × check table.
    Verify(VerifyArgs),
    /// Write a model's recorded graph as Graphviz DOT.
    Graph(GraphArgs),
}

/// Which model (and so which dataset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelName {
    /// Multi-layer perceptron on the UCI digits.
    Mlp,
    /// Small convolutional network on the UCI digits.
    Cnn,
    /// Char-level transformer language model on the KJV text.
    Transformer,
    /// 1-D Fourier neural operator on Burgers' equation.
    Fno,
}

impl ModelName {
    /// The name as typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelName::Mlp => "mlp",
            ModelName::Cnn => "cnn",
            ModelName::Transformer => "transformer",
            ModelName::Fno => "fno",
        }
    }

    /// Parse a name (as stored in a checkpoint).
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Mlp, Self::Cnn, Self::Transformer, Self::Fno]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// A named configuration of `tl train`: model, data, optimizer and schedule from a paper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// The FNO paper's Burgers benchmark (Li et al., ICLR 2021): its data (ν = 0.1, GRF initial
    /// conditions, 8192-point solutions subsampled to --grid, 1000 / 200 pairs), its FNO (4
    /// Fourier layers, width 64, 16 modes, projection 128), relative L2 loss, Adam 1e-3 halved
    /// every 100 epochs, 500 epochs, batch 20 (docs/benchmarks.md).
    FnoPaper,
}

impl Preset {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::FnoPaper => "fno-paper",
        }
    }
}

/// Which tape runs the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum BackendName {
    /// The CPU tape.
    #[default]
    Cpu,
    /// The CUDA tape on the simulation device (host f32).
    CudaSim,
    /// The CUDA tape on a real GPU (build with `--features cuda`).
    Cuda,
}

impl BackendName {
    /// The session backend.
    pub fn backend(self) -> tl_session::Backend {
        match self {
            BackendName::Cpu => tl_session::Backend::Cpu,
            BackendName::CudaSim => tl_session::Backend::CudaSim,
            BackendName::Cuda => tl_session::Backend::Cuda,
        }
    }
}

/// The optimizer (PyTorch's formulas and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerName {
    /// Plain SGD.
    Sgd,
    /// SGD with momentum 0.9.
    Momentum,
    /// Adam.
    Adam,
    /// AdamW (weight decay 0.01).
    Adamw,
}

impl OptimizerName {
    const ALL: [OptimizerName; 4] = [Self::Sgd, Self::Momentum, Self::Adam, Self::Adamw];

    /// The name on the command line (and in checkpoint metadata).
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerName::Sgd => "sgd",
            OptimizerName::Momentum => "momentum",
            OptimizerName::Adam => "adam",
            OptimizerName::Adamw => "adamw",
        }
    }

    /// Parse a name (as stored in a checkpoint).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// The optimizer with learning rate `lr`; an error when `lr` is negative or not finite.
    pub fn build(self, lr: f64) -> Result<tl_session::Optimizer, tl_session::Error> {
        use tl_session::Optimizer;
        match self {
            OptimizerName::Sgd => Optimizer::sgd(lr),
            OptimizerName::Momentum => Optimizer::momentum(lr, 0.9),
            OptimizerName::Adam => Optimizer::adam(lr),
            OptimizerName::Adamw => Optimizer::adamw(lr),
        }
    }
}

/// `tl train` options. Unset hyperparameters take the model's defaults.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// The model to train [default: mlp; fno with --preset fno-paper].
    #[arg(long, value_enum)]
    pub model: Option<ModelName>,
    /// A paper's configuration (model, data, optimizer, schedule); flags that contradict it are
    /// an error.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Training grid s of --preset fno-paper (a power of two, 32..=8192) [default: 256].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = count)]
    pub grid: Option<usize>,
    /// Grid of the zero-shot super-resolution test of --preset fno-paper (a power of two up to
    /// 8192; 0: none) [default: 4·S, at most 8192; none when S = 8192].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = count)]
    pub super_grid: Option<usize>,
    /// Fourier modes of --preset fno-paper (at most S/2) [default: 16].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub modes: Option<usize>,
    /// Output scale of --preset fno-paper: the FNO's output is multiplied by C (1: the paper's
    /// model as published; see docs/benchmarks.md) [default: 0.01].
    #[arg(long, value_name = "C", allow_negative_numbers = true)]
    pub output_scale: Option<f64>,
    /// Directory of the data cache of --preset fno-paper [default: $TL_CACHE_DIR, else
    /// $XDG_CACHE_HOME/tl, else ~/.cache/tl].
    #[arg(long, value_name = "DIR")]
    pub data_cache: Option<PathBuf>,
    /// The session backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendName,
    /// Epochs to run (in this invocation; a resumed run counts on from the checkpoint).
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub epochs: Option<usize>,
    /// Minibatch size (at least 1).
    #[arg(long, allow_negative_numbers = true, value_parser = count)]
    pub batch_size: Option<usize>,
    /// Learning rate (a positive number).
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// The optimizer.
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerName>,
    /// Seed for initialisation and minibatch order.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = seed)]
    pub seed: u64,
    /// Record each step as a GraphData (LinkedSession) and compile it into the backend's tape.
    #[arg(long)]
    pub linked: bool,
    /// Deterministic reductions on the device.
    #[arg(long)]
    pub deterministic: bool,
    /// Write the loss curve (per minibatch, and the per-epoch mean) as a PNG.
    #[arg(long, value_name = "PNG")]
    pub plot: Option<PathBuf>,
    /// Save the trained parameters (safetensors, by parameter name).
    #[arg(long, value_name = "CKPT")]
    pub save: Option<PathBuf>,
    /// Start from a checkpoint saved by `--save`: its parameters and its optimizer (the rule,
    /// its state and hyper-parameters, the learning rate among them). `--optimizer` naming
    /// another rule starts that one fresh; `--lr` replaces the checkpoint's rate, with a note
    /// when the two differ.
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,
    /// Use only the first N training examples (quick runs and tests; at least 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub train_subset: Option<usize>,
    /// Evaluate on only the first N test examples (quick runs and tests; at least 1; for the
    /// transformer the unigram baseline is computed on the same windows).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = count)]
    pub test_subset: Option<usize>,
}

/// `tl eval` options.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The model the checkpoint must hold [default: the checkpoint's].
    #[arg(long, value_enum)]
    pub model: Option<ModelName>,
    /// The checkpoint (safetensors) to evaluate.
    #[arg(long, value_name = "CKPT")]
    pub checkpoint: PathBuf,
    /// The session backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendName,
    /// A --preset fno-paper checkpoint: the grid to test at (a power of two up to 8192; a
    /// finer grid than the training one is the zero-shot super-resolution test) [default: the
    /// training grid].
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = count)]
    pub grid: Option<usize>,
    /// A --preset fno-paper checkpoint: the directory of the data cache [default: as tl train].
    #[arg(long, value_name = "DIR")]
    pub data_cache: Option<PathBuf>,
}

/// `tl verify` options.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The tape to verify against the IR reference.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendName,
    /// Cases per check, at least 1 (default: $TL_CASES or 64).
    #[arg(long, allow_negative_numbers = true, value_parser = count_u32)]
    pub cases: Option<u32>,
    /// Seed (default: $TL_SEED or the harness' fixed seed).
    #[arg(long, allow_negative_numbers = true, value_parser = seed)]
    pub seed: Option<u64>,
    /// Only these rows (op names, or `dag`); repeatable.
    #[arg(long, value_name = "OP")]
    pub only: Vec<String>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `tl graph` options.
#[derive(Debug, Clone, Args)]
pub struct GraphArgs {
    /// The model whose training step to record.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ModelName,
    /// Batch size of the recorded step (at least 1; past the training examples, all of them).
    #[arg(
        long,
        default_value_t = 1,
        allow_negative_numbers = true,
        value_parser = count
    )]
    pub batch_size: usize,
    /// Output file (default: standard output).
    #[arg(short = 'o', long, value_name = "DOT")]
    pub output: Option<PathBuf>,
}

/// An integer flag's value: `T` parsed, or what the value must be: a non-negative integer
/// (for `-1`, `1.5`, `many`), or one at most `max` (for a string of digits too large).
fn non_negative<T: FromStr>(s: &str, max: impl Display) -> Result<T, String> {
    if let Ok(v) = s.parse() {
        return Ok(v);
    }
    let digits = s.strip_prefix('+').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        Err(format!("must be a non-negative integer up to {max}"))
    } else {
        Err("must be a non-negative integer".to_owned())
    }
}

/// clap value parser of a count or size flag (`--epochs`, `--batch-size`, `--grid`, …): a
/// non-negative integer that fits a `usize`; a range (at least 1, a power of two) is the
/// command's to check. clap prints the error as `invalid value '-1' for '--epochs <EPOCHS>':
/// must be a non-negative integer`.
pub fn count(s: &str) -> Result<usize, String> {
    non_negative(s, usize::MAX)
}

/// [`count`] for a `u32` flag (`tl verify --cases`).
pub fn count_u32(s: &str) -> Result<u32, String> {
    non_negative(s, u32::MAX)
}

/// clap value parser of a `--seed`: a non-negative integer that fits a `u64`.
pub fn seed(s: &str) -> Result<u64, String> {
    non_negative(s, u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::any::TypeId;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn integer_flags_say_what_the_value_must_be() {
        assert_eq!(count("0"), Ok(0));
        assert_eq!(count("+7"), Ok(7));
        assert_eq!(seed(&u64::MAX.to_string()), Ok(u64::MAX));
        for bad in ["-1", "-0.5", "1.5", "many", "", "0x10", " 1"] {
            assert_eq!(
                count(bad),
                Err("must be a non-negative integer".to_owned()),
                "{bad:?}"
            );
        }
        let e = count_u32("4294967296").unwrap_err();
        assert!(e.contains("up to 4294967295"), "{e}");
        let e = seed("18446744073709551616").unwrap_err();
        assert!(e.contains("up to 18446744073709551615"), "{e}");
    }

    /// Every numeric flag of every subcommand takes `-1` as its value: an integer flag refuses
    /// it saying it must be a non-negative integer (naming the flag and the value), a float flag
    /// parses it for the command to check. A numeric flag added without
    /// `allow_negative_numbers` (or an integer one without its parser) fails here.
    #[test]
    fn every_numeric_flag_takes_negative_numbers_as_values() {
        let ints = [
            TypeId::of::<usize>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
        ];
        let mut numeric = Vec::new();
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_value_parser().type_id();
                let int = ints.iter().any(|&t| id == t);
                if !(int || id == TypeId::of::<f64>()) {
                    continue;
                }
                let (name, flag) = (sub.get_name(), arg.get_long().unwrap_or_default());
                numeric.push(format!("{name} --{flag}"));
                let long = format!("--{flag}");
                let mut argv = vec!["tl", name, &long, "-1"];
                if name == "eval" {
                    argv.extend(["--checkpoint", "c.safetensors"]);
                }
                let r = Cli::try_parse_from(&argv);
                if int {
                    let e = r.err().map(|e| e.to_string()).unwrap_or_default();
                    for want in ["-1", flag, "must be a non-negative integer"] {
                        assert!(e.contains(want), "{argv:?}: {e:?} lacks {want:?}");
                    }
                } else {
                    assert!(r.is_ok(), "{argv:?}: {:?}", r.err());
                }
            }
        }
        assert_eq!(
            numeric,
            [
                "train --grid",
                "train --super-grid",
                "train --modes",
                "train --output-scale",
                "train --epochs",
                "train --batch-size",
                "train --lr",
                "train --seed",
                "train --train-subset",
                "train --test-subset",
                "eval --grid",
                "verify --cases",
                "verify --seed",
                "graph --batch-size",
            ]
        );
    }
}
