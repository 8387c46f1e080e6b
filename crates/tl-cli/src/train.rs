//! The training loop, shared by every task: minibatches of the model's training split in a
//! seeded order, one optimizer step per batch, a progress bar per epoch, train and test metrics
//! at the end ([`crate::metrics`]).

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tl_session::{Backend, Optimizer};

use crate::checkpoint::Checkpoint;
use crate::cli::{ModelName, OptimizerName, TrainArgs};
use crate::data::permutation;
use crate::dataset::load;
pub use crate::metrics::{Metrics, evaluate};
use crate::model::Model;
use crate::runner::{Runner, session};
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
    /// Optimizer.
    pub optimizer: OptimizerName,
    /// Seed for initialisation and minibatch order.
    pub seed: u64,
    /// Linked session (GraphData compiled per step) instead of eager.
    pub linked: bool,
    /// Deterministic device reductions.
    pub deterministic: bool,
    /// Use only this many training examples.
    pub train_subset: Option<usize>,
    /// Start from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

impl TrainConfig {
    /// The configuration of `tl train` arguments (unset values from the model's defaults).
    pub fn from_args(a: &TrainArgs) -> Result<Self> {
        let d = Model::defaults(a.model);
        let cfg = TrainConfig {
            model: a.model,
            backend: a.backend.backend(),
            epochs: a.epochs.unwrap_or(d.epochs),
            batch_size: a.batch_size.unwrap_or(d.batch_size),
            lr: a.lr.unwrap_or(d.lr),
            optimizer: a.optimizer.unwrap_or(d.optimizer),
            seed: a.seed,
            linked: a.linked,
            deterministic: a.deterministic,
            train_subset: a.train_subset,
            resume: a.resume.clone(),
            progress: true,
        };
        if cfg.batch_size == 0 {
            return Err(CliError::new("--batch-size must be at least 1"));
        }
        if !(cfg.lr.is_finite() && cfg.lr > 0.0) {
            return Err(CliError::new(format!(
                "--lr {}: must be a positive number",
                cfg.lr
            )));
        }
        if cfg.train_subset == Some(0) {
            return Err(CliError::new("--train-subset must be at least 1"));
        }
        Ok(cfg)
    }

    /// The defaults of `model` on the CPU, eager, without progress bars.
    pub fn defaults(model: ModelName) -> Self {
        let d = Model::defaults(model);
        TrainConfig {
            model,
            backend: Backend::Cpu,
            epochs: d.epochs,
            batch_size: d.batch_size,
            lr: d.lr,
            optimizer: d.optimizer,
            seed: 0,
            linked: false,
            deterministic: false,
            train_subset: None,
            resume: None,
            progress: false,
        }
    }
}

/// What a training run produced.
#[derive(Debug, Clone)]
pub struct TrainReport {
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
    /// The trained parameters and total epochs (including resumed ones), ready to save.
    pub checkpoint: Checkpoint,
}

/// Copy the model's parameters out of the session, by name, with the optimizer's state when
/// one is given.
pub fn snapshot(
    s: &mut dyn Runner,
    m: &Model,
    epochs: usize,
    optimizer: Option<(OptimizerName, &Optimizer)>,
) -> Result<Checkpoint> {
    let mut tensors = Vec::new();
    for (name, p) in m.param_names().into_iter().zip(m.params()) {
        tensors.push((name, s.read_param(&p)?));
    }
    let optimizer = match optimizer {
        Some((name, opt)) => Some((name, s.optimizer_state(opt)?)),
        None => None,
    };
    Ok(Checkpoint {
        model: m.name(),
        epochs,
        tensors,
        optimizer,
    })
}

/// Load a checkpoint's parameters into the model (names and shapes must match).
pub fn restore(
    s: &mut dyn Runner,
    m: &Model,
    ckpt: &Checkpoint,
    path: &std::path::Path,
) -> Result<()> {
    if ckpt.model != m.name() {
        return Err(CliError::new(format!(
            "checkpoint {} holds a {} model, not {}",
            path.display(),
            ckpt.model.as_str(),
            m.name().as_str()
        )));
    }
    for (name, p) in m.param_names().into_iter().zip(m.params()) {
        let t = ckpt.get(path, &name, p.shape().dims())?;
        s.write_param(&p, t.clone())?;
    }
    Ok(())
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

/// Train as `cfg` says; `log` receives one line per epoch.
pub fn train(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    let mut s = session(cfg.backend, cfg.linked, cfg.deterministic)?;
    let m = Model::new(cfg.model, s.as_mut(), cfg.seed)?;
    let (train, test, baseline) = load(cfg.model)?;
    let train = match cfg.train_subset {
        Some(n) => train.truncate(n),
        None => train,
    };
    log(&format!(
        "tl train: {} on {} ({}, {}), {} epoch(s), batch {}, {:?} lr {}, seed {}",
        cfg.model.as_str(),
        crate::model::dataset(cfg.model),
        cfg.backend.name(),
        if cfg.linked { "linked" } else { "eager" },
        cfg.epochs,
        cfg.batch_size,
        cfg.optimizer,
        cfg.lr,
        cfg.seed
    ));
    let mut done = 0;
    let mut opt = cfg.optimizer.build(cfg.lr)?;
    if let Some(path) = &cfg.resume {
        let ckpt = crate::checkpoint::load(path)?;
        restore(s.as_mut(), &m, &ckpt, path)?;
        done = ckpt.epochs;
        match &ckpt.optimizer {
            Some((name, state)) if *name == cfg.optimizer => {
                s.load_optimizer_state(&mut opt, state).map_err(|e| {
                    CliError::new(format!(
                        "checkpoint {}: its {} state does not fit this model: {e}",
                        path.display(),
                        name.as_str()
                    ))
                })?
            }
            Some((name, _)) => log(&format!(
                "note: checkpoint {} holds {} state; --optimizer {} starts with fresh state",
                path.display(),
                name.as_str(),
                cfg.optimizer.as_str()
            )),
            None => log(&format!(
                "note: checkpoint {} holds no optimizer state; the optimizer starts fresh",
                path.display()
            )),
        }
    }
    let (mut step_losses, mut epoch_losses) = (Vec::new(), Vec::new());
    let total = done + cfg.epochs;
    for epoch in done + 1..=total {
        let order = permutation(train.len(), cfg.seed ^ (epoch as u64).wrapping_mul(0x9E37));
        let batches: Vec<&[usize]> = order.chunks(cfg.batch_size).collect();
        let pb = bar(cfg.progress, batches.len(), epoch, total);
        let start = Instant::now();
        let (mut sum, mut seen) = (0.0f64, 0usize);
        for idx in &batches {
            let out = m.forward(s.as_mut(), train.batch(idx))?;
            let l = s.train_step(&out.loss.expect("batches carry targets"), &mut opt)?;
            s.end_step();
            if !l.is_finite() {
                return Err(CliError::new(format!(
                    "the loss became {l} at epoch {epoch}; try a smaller --lr"
                )));
            }
            step_losses.push(l);
            sum += f64::from(l) * idx.len() as f64;
            seen += idx.len();
            let rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
            pb.set_message(format!("loss {l:.4} · {rate:.0} ex/s"));
            pb.inc(1);
        }
        pb.finish_and_clear();
        let mean = (sum / seen.max(1) as f64) as f32;
        epoch_losses.push(mean);
        let secs = start.elapsed().as_secs_f64();
        log(&format!(
            "epoch {epoch:>3}/{total}  loss {mean:.4}  {:.0} ex/s",
            seen as f64 / secs.max(1e-9)
        ));
    }
    let train_m = evaluate(s.as_mut(), &m, &train)?;
    let test_m = evaluate(s.as_mut(), &m, &test)?;
    let checkpoint = snapshot(s.as_mut(), &m, total, Some((cfg.optimizer, &opt)))?;
    Ok(TrainReport {
        step_losses,
        epoch_losses,
        train: train_m,
        test: test_m,
        baseline,
        checkpoint,
    })
}

/// Evaluate a checkpoint of `model` on the test split.
pub fn eval_checkpoint(
    model: ModelName,
    backend: Backend,
    path: &std::path::Path,
) -> Result<(Checkpoint, Metrics)> {
    let ckpt = crate::checkpoint::load(path)?;
    let mut s = session(backend, false, false)?;
    let m = Model::new(model, s.as_mut(), 0)?;
    restore(s.as_mut(), &m, &ckpt, path)?;
    let (_, test, _) = load(model)?;
    let metrics = evaluate(s.as_mut(), &m, &test)?;
    Ok((ckpt, metrics))
}
