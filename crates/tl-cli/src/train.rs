//! The training loop, written once for every task and both sessions (generic over
//! `O: Train`; [`train`] picks the eager `Session` or the `LinkedSession` once, at the top):
//! minibatches of the model's training split in a seeded order, one `Runtime::step` per batch,
//! a progress bar per epoch, train and test metrics at the end ([`crate::metrics`]).

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tl_nn::Runtime;
use tl_nn::data::try_permutation;
use tl_session::{Backend, LinkedSession, Options, Session, Train};

use crate::checkpoint::{self, Checkpoint, Header};
use crate::cli::{ModelName, OptimizerName, Preset, TrainArgs};
use crate::dataset::{Dataset, load};
use crate::fno_paper::{
    PAPER, PAPER_BATCH, PAPER_EPOCHS, PAPER_LR, PaperData, PaperRun, check_grid, default_cache_dir,
};
pub use crate::metrics::{Metrics, evaluate};
use crate::model::{Defaults, Model, defaults};
use crate::{CliError, Result};

/// Everything a training run needs, with the model's defaults filled in.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// The model.
    pub model: ModelName,
    /// The session backend.
    pub backend: Backend,
    /// Epochs to run now.
    pub epochs: usize,
    /// Minibatch size.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Whether `lr` was chosen for this run (`--lr`) rather than left at the model's default:
    /// a resumed run keeps its checkpoint's rate unless it was.
    pub lr_given: bool,
    /// Optimizer.
    pub optimizer: OptimizerName,
    /// Whether `optimizer` was chosen for this run (`--optimizer`): a resumed run keeps its
    /// checkpoint's rule (and state) unless it was.
    pub optimizer_given: bool,
    /// Seed for initialisation and minibatch order.
    pub seed: u64,
    /// Linked session (GraphData compiled per step) instead of eager.
    pub linked: bool,
    /// Deterministic device reductions.
    pub deterministic: bool,
    /// Use only this many training examples.
    pub train_subset: Option<usize>,
    /// Evaluate on only the first this many examples of the test split (and of the paper
    /// run's super-resolution pairs); the language model's baseline on the same windows.
    pub test_subset: Option<usize>,
    /// Start from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Save the trained model and optimizer state here.
    pub save: Option<PathBuf>,
    /// Draw progress bars on stderr.
    pub progress: bool,
    /// `--preset fno-paper`: the paper's data, model, loss and optimizer schedule (with
    /// `model` fno; `lr`, `batch_size`, `optimizer` as the paper's unless a test sets them).
    pub paper: Option<PaperRun>,
}

impl TrainConfig {
    /// The configuration of `tl train` arguments (unset values from the model's defaults); a
    /// value out of range or flags that contradict each other are a usage error naming the flag
    /// and the value (every error here is one: nothing is read yet).
    pub fn from_args(a: &TrainArgs) -> Result<Self> {
        let (model, d, paper) = match a.preset {
            Some(p) => preset(a, p)?,
            None => {
                let shown = |v: Option<usize>| v.map(|v| v.to_string());
                for (flag, value) in [
                    ("--grid", shown(a.grid)),
                    ("--super-grid", shown(a.super_grid)),
                    ("--modes", shown(a.modes)),
                    ("--output-scale", a.output_scale.map(|c| c.to_string())),
                    (
                        "--data-cache",
                        a.data_cache.as_ref().map(|d| d.display().to_string()),
                    ),
                ] {
                    if let Some(v) = value {
                        return Err(CliError::usage(format!(
                            "{flag} {v}: the flag belongs to --preset fno-paper (the default fno data set is fixed at {} points)",
                            crate::burgers::GRID
                        )));
                    }
                }
                let m = a.model.unwrap_or(ModelName::Mlp);
                (m, defaults(m), None)
            }
        };
        let cfg = TrainConfig {
            model,
            backend: a.backend.backend(),
            epochs: a.epochs.unwrap_or(d.epochs),
            batch_size: a.batch_size.unwrap_or(d.batch_size),
            lr: a.lr.unwrap_or(d.lr),
            lr_given: a.lr.is_some(),
            optimizer: a.optimizer.unwrap_or(d.optimizer),
            optimizer_given: a.optimizer.is_some(),
            seed: a.seed,
            linked: a.linked,
            deterministic: a.deterministic,
            train_subset: a.train_subset,
            test_subset: a.test_subset,
            resume: a.resume.clone(),
            save: a.save.clone(),
            progress: true,
            paper,
        };
        for (flag, zero) in [
            ("--batch-size", cfg.batch_size == 0),
            ("--train-subset", cfg.train_subset == Some(0)),
            ("--test-subset", cfg.test_subset == Some(0)),
        ] {
            if zero {
                return Err(CliError::usage(format!("{flag} 0: must be at least 1")));
            }
        }
        if !(cfg.lr.is_finite() && cfg.lr > 0.0) {
            return Err(CliError::usage(format!(
                "--lr {}: must be a positive number",
                cfg.lr
            )));
        }
        Ok(cfg)
    }

    /// The defaults of `model` on the CPU, eager, without progress bars.
    pub fn defaults(model: ModelName) -> Self {
        let d = defaults(model);
        TrainConfig {
            model,
            backend: Backend::Cpu,
            epochs: d.epochs,
            batch_size: d.batch_size,
            lr: d.lr,
            lr_given: false,
            optimizer: d.optimizer,
            optimizer_given: false,
            seed: 0,
            linked: false,
            deterministic: false,
            train_subset: None,
            test_subset: None,
            resume: None,
            save: None,
            progress: false,
            paper: None,
        }
    }

    /// `--preset fno-paper` on the CPU, eager, without progress bars, with `run`'s data and
    /// grids and the paper's hyperparameters.
    pub fn fno_paper(run: PaperRun) -> Self {
        TrainConfig {
            epochs: PAPER_EPOCHS,
            batch_size: PAPER_BATCH,
            lr: PAPER_LR,
            optimizer: OptimizerName::Adam,
            paper: Some(run),
            ..Self::defaults(ModelName::Fno)
        }
    }
}

/// The model, defaults and run of `--preset`, refusing flags that contradict it.
fn preset(a: &TrainArgs, p: Preset) -> Result<(ModelName, Defaults, Option<PaperRun>)> {
    let name = p.as_str();
    let contradiction = |flag: &str, got: String, want: String| {
        CliError::usage(format!(
            "--preset {name} contradicts {flag} {got}: the paper's is {want} (leave the flag out)"
        ))
    };
    if let Some(m) = a.model.filter(|&m| m != ModelName::Fno) {
        return Err(contradiction("--model", m.as_str().into(), "fno".into()));
    }
    if let Some(o) = a.optimizer.filter(|&o| o != OptimizerName::Adam) {
        return Err(contradiction(
            "--optimizer",
            o.as_str().into(),
            "adam".into(),
        ));
    }
    if let Some(lr) = a.lr.filter(|&lr| lr != PAPER_LR) {
        return Err(contradiction("--lr", lr.to_string(), PAPER_LR.to_string()));
    }
    if let Some(b) = a.batch_size.filter(|&b| b != PAPER_BATCH) {
        return Err(contradiction(
            "--batch-size",
            b.to_string(),
            PAPER_BATCH.to_string(),
        ));
    }
    let dir = a.data_cache.clone().unwrap_or_else(default_cache_dir);
    let mut run = PaperRun::new(PAPER, a.grid, a.super_grid, a.modes, dir)?;
    if let Some(c) = a.output_scale {
        run = run.with_output_scale(c)?;
    }
    let d = Defaults {
        epochs: PAPER_EPOCHS,
        batch_size: PAPER_BATCH,
        lr: PAPER_LR,
        optimizer: OptimizerName::Adam,
    };
    Ok((ModelName::Fno, d, Some(run)))
}

/// What a training run produced.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// This process's rank under `mpirun` (0 in a one-process run): only rank 0 reports.
    pub rank: usize,
    /// The loss of every minibatch step, in order.
    pub step_losses: Vec<f32>,
    /// The mean minibatch loss of each epoch run now.
    pub epoch_losses: Vec<f32>,
    /// Metrics on the (possibly subset) training split.
    pub train: Metrics,
    /// Metrics on the test split.
    pub test: Metrics,
    /// The unigram model's test loss (language modelling only): the baseline to beat.
    pub baseline: Option<f32>,
    /// `--preset fno-paper`: the zero-shot super-resolution test (its grid, and the metrics of
    /// the model trained at `--grid` on the test pairs at that grid).
    pub super_res: Option<(usize, Metrics)>,
    /// Mean wall time of an epoch run now, in seconds.
    pub epoch_secs: f64,
    /// The trained parameters, the optimizer's state and the total epochs (including resumed
    /// ones): what `--save` wrote.
    pub checkpoint: Checkpoint,
}

fn bar(progress: bool, steps: usize, epoch: usize, total: usize) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(steps as u64);
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    b.set_style(style);
    b.set_prefix(format!("epoch {epoch:>3}/{total}"));
    b
}

/// The session error of a backend that cannot be had, in the command's words.
pub fn backend_error(e: tl_session::Error) -> CliError {
    match e {
        // The session speaks of `Backend::CudaSim`; on the command line it is a flag.
        tl_session::Error::BackendUnavailable { backend, detail } => CliError::new(format!(
            "backend {backend} is not available: {}",
            detail.replace("Backend::CudaSim", "--backend cuda-sim")
        )),
        e => e.into(),
    }
}

/// The eager session on `backend` (`Options::deterministic` and `seed` as given).
pub fn eager(backend: Backend, deterministic: bool, seed: u64) -> Result<Session<f32>> {
    Session::new(Options {
        backend,
        deterministic,
        seed,
        ..Options::default()
    })
    .map_err(backend_error)
}

/// Train as `cfg` says; `log` receives one line per epoch. The one place that picks the
/// session: eager, or linked (each step's recorded graph compiled into `cfg.backend`'s tape).
pub fn train(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    if cfg.linked {
        let mut s = LinkedSession::<f32>::with_seed(cfg.seed);
        s.set_backend(cfg.backend).map_err(backend_error)?;
        s.set_deterministic(cfg.deterministic);
        run(&mut Runtime::new(s), cfg, &mut log)
    } else {
        let s = eager(cfg.backend, cfg.deterministic, cfg.seed)?;
        run(&mut Runtime::new(s), cfg, &mut log)
    }
}

/// The training loop on any session.
fn run<O: Train<T = f32>>(
    rt: &mut Runtime<O>,
    cfg: &TrainConfig,
    log: &mut dyn FnMut(&str),
) -> Result<TrainReport> {
    let (m, (train, test, baseline), super_test) = match &cfg.paper {
        Some(p) => {
            let m = Model::fno_paper(rt, &p.fno_config(), p.output_scale)?;
            let (tr, te, sup) = p.splits(log)?;
            let cut = |d: Dataset| d.first(cfg.test_subset);
            (m, (tr, cut(te), None), sup.map(cut))
        }
        None => (
            Model::new(cfg.model, rt)?,
            load(cfg.model, cfg.test_subset)?,
            None,
        ),
    };
    let train = train.first(cfg.train_subset);
    // Under `mpirun -np N` (feature mpi): a rank of N; rank 0 alone logs (crate::dist).
    let (rank, ranks) = crate::dist::join(rt, &m, cfg.batch_size)?;
    let mut quiet = |_: &str| {};
    let log: &mut dyn FnMut(&str) = if rank == 0 { log } else { &mut quiet };
    let data = match &cfg.paper {
        Some(p) => format!(
            "the FNO paper's Burgers set (--preset fno-paper: s = {}, {} modes, {} / {} pairs)",
            p.grid,
            p.modes,
            train.len(),
            test.len()
        ),
        None => crate::model::dataset(cfg.model).to_owned(),
    };
    // A resumed run keeps its checkpoint's rule and rate unless `--optimizer` or `--lr` chose
    // others; what it keeps or replaces is said after the run's line.
    let resumed = match &cfg.resume {
        Some(path) => Some((path, checkpoint::read(path)?)),
        None => None,
    };
    let optimizer = match &resumed {
        Some((_, (_, header))) if !cfg.optimizer_given => header.optimizer.unwrap_or(cfg.optimizer),
        _ => cfg.optimizer,
    };
    let mut done = 0;
    let mut opt = match &cfg.paper {
        Some(p) => p.optimizer(cfg.lr, train.len(), cfg.batch_size)?,
        None => optimizer.build(cfg.lr)?,
    };
    let mut notes = Vec::new();
    if let Some((path, file)) = &resumed {
        let header = &file.1;
        header.expect_model(path, cfg.model)?;
        match (&cfg.paper, header.paper) {
            (Some(p), saved) => p.check_checkpoint(path, saved)?,
            (None, Some(_)) => {
                return Err(CliError::new(format!(
                    "checkpoint {} holds a --preset fno-paper model: resume it with --preset fno-paper",
                    path.display()
                )));
            }
            (None, None) => {}
        }
        let same = header.optimizer == Some(optimizer);
        checkpoint::restore(rt, &m, cfg.model, path, file, same.then_some(&mut opt))?;
        done = header.epochs;
        match header.optimizer {
            // The restore put the checkpoint's hyper-parameters in place, its rate among them;
            // `--lr` replaces the rate.
            Some(_) if same && cfg.lr_given && opt.lr != cfg.lr => {
                notes.push(format!(
                    "note: checkpoint {} was trained with lr {}; this run uses --lr {}",
                    path.display(),
                    opt.lr,
                    cfg.lr
                ));
                opt.lr = cfg.lr;
            }
            Some(_) if same => {}
            Some(name) => notes.push(format!(
                "note: checkpoint {} holds {} state; --optimizer {} starts with fresh state",
                path.display(),
                name.as_str(),
                optimizer.as_str()
            )),
            None => notes.push(format!(
                "note: checkpoint {} holds no optimizer state; the optimizer starts fresh",
                path.display()
            )),
        }
    }
    let resumed_from = resumed.as_ref().map(|(path, _)| path.as_path());
    let total = total_epochs(resumed_from, done, cfg.epochs)?;
    log(&format!(
        "tl train: {} on {} ({}, {}), {} epoch(s), batch {}, {:?} lr {}, seed {}",
        cfg.model.as_str(),
        data,
        cfg.backend.name(),
        if cfg.linked { "linked" } else { "eager" },
        cfg.epochs,
        cfg.batch_size,
        optimizer,
        opt.lr,
        cfg.seed
    ));
    for note in &notes {
        log(note);
    }
    let (mut step_losses, mut epoch_losses) = (Vec::new(), Vec::new());
    let mut epoch_secs = 0.0;
    // `done + i`, not `done + 1..=total`: `done + 1` overflows when the count is already at its
    // largest (and `--epochs 0` runs none).
    for epoch in (1..=cfg.epochs).map(|i| done + i) {
        let order = try_permutation(train.len(), cfg.seed ^ (epoch as u64).wrapping_mul(0x9E37))?;
        let batches: Vec<&[usize]> = order.chunks(cfg.batch_size).collect();
        let pb = bar(cfg.progress && rank == 0, batches.len(), epoch, total);
        let start = Instant::now();
        let (mut sum, mut seen) = (0.0f64, 0usize);
        for idx in &batches {
            let Some(idx) = crate::dist::shard(idx, cfg.batch_size, rank, ranks) else {
                continue;
            };
            let batch = train.batch(idx)?;
            let l = rt.step(&m, &mut opt, |g| Ok(m.forward(g, &batch)?.loss))? as f32;
            if !l.is_finite() {
                return Err(CliError::new(format!(
                    "the loss became {l} at epoch {epoch}; try a smaller --lr"
                )));
            }
            step_losses.push(l);
            // Under mpirun: rank 0's loss, the examples of every rank.
            let n = idx.len() * ranks;
            sum += f64::from(l) * n as f64;
            seen += n;
            let rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
            pb.set_message(format!("loss {l:.4} · {rate:.0} ex/s"));
            pb.inc(1);
        }
        pb.finish_and_clear();
        let mean = (sum / seen.max(1) as f64) as f32;
        epoch_losses.push(mean);
        let secs = start.elapsed().as_secs_f64();
        epoch_secs += secs / cfg.epochs as f64;
        log(&format!(
            "epoch {epoch:>3}/{total}  loss {mean:.4}  {:.0} ex/s  {secs:.2} s",
            seen as f64 / secs.max(1e-9)
        ));
    }
    let train_m = evaluate(rt, &m, &train, cfg.batch_size)?;
    let test_m = evaluate(rt, &m, &test, cfg.batch_size)?;
    let super_res = match (&super_test, &cfg.paper) {
        (Some(d), Some(p)) => Some((
            p.super_grid.unwrap_or(p.grid),
            evaluate(rt, &m, d, cfg.batch_size)?,
        )),
        _ => None,
    };
    let header = Header {
        model: cfg.model,
        epochs: total,
        optimizer: Some(optimizer),
        paper: cfg.paper.as_ref().map(PaperRun::model),
    };
    let checkpoint = checkpoint::snapshot(rt, &m, header, &opt)?;
    if let Some(path) = &cfg.save {
        checkpoint::save(rt, &m, path, header, &opt)?;
    }
    Ok(TrainReport {
        rank,
        step_losses,
        epoch_losses,
        train: train_m,
        test: test_m,
        baseline,
        super_res,
        epoch_secs,
        checkpoint,
    })
}

/// The epoch count after `epochs` more on top of a checkpoint's `done` (`resumed`: its path;
/// none, and `done` 0, for a fresh run). A total past `usize::MAX` is refused: as a usage error
/// naming `--epochs` when the flag is the larger part, else as a runtime error naming the
/// checkpoint and the count in its metadata, which cannot be continued.
pub fn total_epochs(
    resumed: Option<&std::path::Path>,
    done: usize,
    epochs: usize,
) -> Result<usize> {
    if let Some(total) = done.checked_add(epochs) {
        return Ok(total);
    }
    let from = resumed.map_or_else(String::new, |p| format!(" of checkpoint {}", p.display()));
    if epochs > done {
        Err(CliError::usage(format!(
            "--epochs {epochs} after the {done} epoch(s){from}: the total is past {}",
            usize::MAX
        )))
    } else {
        Err(CliError::new(format!(
            "checkpoint{}: `epochs` in the metadata is {done}, which cannot be continued: {epochs} more epoch(s) (--epochs {epochs}) count past {}",
            resumed.map_or_else(String::new, |p| format!(" {}", p.display())),
            usize::MAX
        )))
    }
}

/// What `tl eval` evaluates.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    /// The checkpoint.
    pub checkpoint: PathBuf,
    /// The model it must hold (`None`: whichever it holds).
    pub model: Option<ModelName>,
    /// The session backend (eager).
    pub backend: Backend,
    /// A `--preset fno-paper` checkpoint: the grid to test at (`None`: its training grid).
    pub grid: Option<usize>,
    /// A `--preset fno-paper` checkpoint: the data cache (`None`: [`default_cache_dir`]).
    pub data_cache: Option<PathBuf>,
    /// A `--preset fno-paper` checkpoint: the data set ([`PAPER`]; tests use smaller ones).
    pub paper_data: PaperData,
}

impl EvalConfig {
    /// Evaluate `checkpoint` on the CPU with nothing else set.
    pub fn new(checkpoint: impl Into<PathBuf>) -> Self {
        EvalConfig {
            checkpoint: checkpoint.into(),
            model: None,
            backend: Backend::Cpu,
            grid: None,
            data_cache: None,
            paper_data: PAPER,
        }
    }
}

/// What `tl eval` found: the checkpoint's header, the test split's name and the metrics.
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// The checkpoint's metadata.
    pub header: Header,
    /// The test split, in words.
    pub data: String,
    /// The metrics on it.
    pub metrics: Metrics,
}

/// Evaluate a checkpoint on its model's test split (eager, on `cfg.backend`); a
/// `--preset fno-paper` checkpoint on the paper's test pairs at its grid or `cfg.grid`.
/// `log` hears of a data set being made (the paper's, when it is not cached yet).
pub fn eval_checkpoint(cfg: &EvalConfig, log: &mut dyn FnMut(&str)) -> Result<EvalReport> {
    let path = &cfg.checkpoint;
    let file = checkpoint::read(path)?;
    let header = file.1;
    if let Some(model) = cfg.model {
        header.expect_model(path, model)?;
    }
    let mut rt = Runtime::new(eager(cfg.backend, false, 0)?);
    let (m, test, data) = match header.paper {
        Some(saved) => {
            let dir = cfg.data_cache.clone().unwrap_or_else(default_cache_dir);
            // `--grid` is a usage error on its own; against the checkpoint's modes (or a grid
            // read from it) the checkpoint does not fit: a runtime error.
            if let Some(g) = cfg.grid {
                check_grid("--grid", g, cfg.paper_data.source_grid)?;
            }
            let grid = cfg.grid.unwrap_or(saved.grid);
            let run = PaperRun::new(cfg.paper_data, Some(grid), Some(0), Some(saved.modes), dir)
                .and_then(|r| r.with_output_scale(saved.output_scale))
                .map_err(CliError::into_runtime)?;
            let m = Model::fno_paper(&rt, &run.fno_config(), run.output_scale)?;
            let (_, test, _) = run.splits(log)?;
            let data = format!(
                "the FNO paper's Burgers test pairs at s = {grid} (trained at s = {})",
                saved.grid
            );
            (m, test, data)
        }
        None => {
            for (flag, set) in [
                ("--grid", cfg.grid.is_some()),
                ("--data-cache", cfg.data_cache.is_some()),
            ] {
                if set {
                    return Err(CliError::new(format!(
                        "{flag} belongs to --preset fno-paper checkpoints; {} holds the {} model",
                        path.display(),
                        header.model.as_str()
                    )));
                }
            }
            let m = Model::new(header.model, &rt)?;
            let (_, test, _) = load(header.model, None)?;
            let data = format!("the {} test split", crate::model::dataset(header.model));
            (m, test, data)
        }
    };
    checkpoint::restore(&mut rt, &m, header.model, path, &file, None)?;
    // The model's default training batch (a checkpoint does not record the run's).
    let metrics = evaluate(
        &rt,
        &m,
        &test,
        crate::model::defaults(header.model).batch_size,
    )?;
    Ok(EvalReport {
        header,
        data,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint whose metadata says `epochs` = usize::MAX cannot be continued: one more
    /// epoch is an error naming the checkpoint and the count (the loop `done + 1..=total`
    /// overflowed: a panic in a debug build, an endless run in a release one); none more is
    /// fine; an `--epochs` too large for a small count names the flag.
    #[test]
    fn an_epoch_count_that_cannot_be_continued_is_an_error() {
        let path = std::path::Path::new("ck.safetensors");
        let max = usize::MAX;
        let e = total_epochs(Some(path), max, 1).unwrap_err();
        assert!(!e.is_usage(), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("checkpoint ck.safetensors") && m.contains(&max.to_string()),
            "{m}"
        );
        assert_eq!(total_epochs(Some(path), max, 0).unwrap(), max);
        assert_eq!(total_epochs(Some(path), 3, 4).unwrap(), 7);
        assert_eq!(total_epochs(None, 0, max).unwrap(), max);
        let e = total_epochs(Some(path), 3, max).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains("--epochs"), "{e}");
    }
}
