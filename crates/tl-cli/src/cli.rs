//! The command line (clap derive): `tl train | eval | verify | graph`.

use std::path::PathBuf;

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
    #[arg(long, value_name = "S")]
    pub grid: Option<usize>,
    /// Grid of the zero-shot super-resolution test of --preset fno-paper (a power of two up to
    /// 8192; 0: none) [default: 4·S, at most 8192; none when S = 8192].
    #[arg(long, value_name = "S")]
    pub super_grid: Option<usize>,
    /// Fourier modes of --preset fno-paper (at most S/2) [default: 16].
    #[arg(long, value_name = "N")]
    pub modes: Option<usize>,
    /// Output scale of --preset fno-paper: the FNO's output is multiplied by C (1: the paper's
    /// model as published; see docs/benchmarks.md) [default: 0.01].
    #[arg(long, value_name = "C")]
    pub output_scale: Option<f64>,
    /// Directory of the data cache of --preset fno-paper [default: $TL_CACHE_DIR, else
    /// $XDG_CACHE_HOME/tl, else ~/.cache/tl].
    #[arg(long, value_name = "DIR")]
    pub data_cache: Option<PathBuf>,
    /// The session backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendName,
    /// Epochs to run (in this invocation; a resumed run counts on from the checkpoint).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Minibatch size.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// The optimizer.
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerName>,
    /// Seed for initialisation and minibatch order.
    #[arg(long, default_value_t = 0)]
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
    /// Start from the parameters of a checkpoint saved by `--save`.
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,
    /// Use only the first N training examples (quick runs and tests).
    #[arg(long, value_name = "N")]
    pub train_subset: Option<usize>,
    /// Evaluate on only the first N test examples (quick runs and tests; for the transformer
    /// the unigram baseline is computed on the same windows).
    #[arg(long, value_name = "N")]
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
    #[arg(long, value_name = "S")]
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
    /// Cases per check (default: $TL_CASES or 64).
    #[arg(long)]
    pub cases: Option<u32>,
    /// Seed (default: $TL_SEED or the harness' fixed seed).
    #[arg(long)]
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
    /// Batch size of the recorded step.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Output file (default: standard output).
    #[arg(short = 'o', long, value_name = "DOT")]
    pub output: Option<PathBuf>,
}
