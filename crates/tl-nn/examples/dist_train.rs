//! Data-parallel training of the digits MLP or the character LM, the same program for one
//! process and for `mpirun -np N` (build with `--features mpi`):
//!
//! ```text
//! cargo build -p tl-nn --features mpi --example dist_train
//! TL_NUM_THREADS=2 target/debug/examples/dist_train --model mlp            # 1 rank, 2 threads
//! mpirun -np 2 -x TL_NUM_THREADS=1 target/debug/examples/dist_train --model mlp   # 2 ranks
//! ```
//!
//! Each rank takes its shard of every global batch (`--batch`, the global size) through
//! `DataLoader::shard`; the model, optimizer and seeds are the same whatever the rank count, so
//! the runs' losses and accuracies agree. Rank 0 prints the result and the training time per
//! step (`mpirun --allow-run-as-root --oversubscribe` as root or with more ranks than cores).

use std::time::Instant;

use tl_nn::data::{Classify, DataLoader, TokenBatch, TokenWindows, Vocab, digits, kjv_text};
use tl_nn::dist::Mpi;
use tl_nn::models::{LmConfig, TransformerLm};
use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS};
use tl_nn::{Result, Runtime, Scope, Sequential, Var, Vars};
use tl_session::{Optimizer, Options, Session, Train};

const N: usize = 32; // the LM's context
const D: usize = 64; // the LM's width

/// The character LM: two causal pre-norm blocks of width 64 (examples/char_lm.rs's shape),
/// as `tl_nn::models` builds it.
fn lm_model<O: Train>(v: &Vars<'_, O>, vocab: usize) -> Result<TransformerLm> {
    let config = LmConfig {
        vocab,
        context: N,
        d_model: D,
        heads: 4,
        d_ff: 4 * D,
        blocks: 2,
    };
    TransformerLm::new(v, &config)
}

/// The mean next-token cross-entropy of a batch.
fn lm_loss<'g, O: Train>(
    model: &TransformerLm,
    g: &Scope<'g, O>,
    b: &TokenBatch,
) -> Result<Var<'g, O>> {
    model
        .logits(g, &b.inputs, b.batch)?
        .cross_entropy(&b.targets)
}

struct Args {
    model: String,
    steps: usize,
    batch: usize,
}

fn args() -> std::result::Result<Args, String> {
    let mut a = Args {
        model: "mlp".into(),
        steps: 0,
        batch: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => a.model = v,
            "--steps" => a.steps = v.parse().map_err(|e| format!("--steps {v:?}: {e}"))?,
            "--batch" => a.batch = v.parse().map_err(|e| format!("--batch {v:?}: {e}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.steps == 0 {
        a.steps = if a.model == "lm" { 300 } else { 440 }; // the MLP: 20 epochs of batch 64
    }
    Ok(a)
}

type Rt = Runtime<Session<f32>>;

fn mlp(rt: &mut Rt, a: &Args, mpi: Mpi) -> Result<()> {
    let (train, test) = digits()?;
    let v = rt.vars();
    let model = Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, 128)?)
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), 128, CLASSES)?);
    let (rank, size) = (
        tl_nn::dist::Collective::rank(&mpi),
        tl_nn::dist::Collective::size(&mpi),
    );
    rt.data_parallel(&model, Box::new(mpi))?;
    let loader = DataLoader::new(&train, a.batch, Classify { classes: CLASSES })?
        .shuffle(0)
        .shard(rank, size)?;
    let mut opt = Optimizer::adam(1e-3)?;
    let (mut losses, start) = (Vec::new(), Instant::now());
    'train: for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            if losses.len() == a.steps {
                break 'train;
            }
            let (x, labels) = batch?;
            losses.push(rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x)?)?.cross_entropy(&labels)
            })?);
        }
    }
    let step = losses.len();
    // Rank 0's mean loss over the last epoch's worth of steps.
    let last = &losses[step.saturating_sub(loader.len().max(1))..];
    let epoch_loss = (last.iter().sum::<f64>(), last.len());
    let secs = start.elapsed().as_secs_f64();
    let acc = rt.accuracy(&model, &test.features(), &test.labels(CLASSES)?, 128)?;
    if rank == 0 {
        println!(
            "mlp, {size} rank(s) × {} thread(s), global batch {}: {step} steps, rank 0's last-epoch loss {:.4}, test accuracy {:.4}, {:.2} ms/step",
            tl_nn::threads(),
            a.batch,
            epoch_loss.0 / epoch_loss.1.max(1) as f64,
            acc,
            1e3 * secs / step as f64
        );
    }
    Ok(())
}

fn lm(rt: &mut Rt, a: &Args, mpi: Mpi) -> Result<()> {
    let text = kjv_text();
    let vocab = Vocab::from_text(text)?;
    let (tokens, v) = (vocab.encode(text)?, vocab.len());
    let cut = tokens.len() * 9 / 10;
    let train = TokenWindows::new(tokens[..cut].to_vec(), N, v)?;
    let val = TokenWindows::new(tokens[cut..].to_vec(), N, v)?;
    let model = lm_model(&rt.vars(), v)?;
    let (rank, size) = (
        tl_nn::dist::Collective::rank(&mpi),
        tl_nn::dist::Collective::size(&mpi),
    );
    rt.data_parallel(&model, Box::new(mpi))?;
    let loader = train.loader(a.batch)?.shuffle(0).shard(rank, size)?;
    let mut opt = Optimizer::adamw(3e-3)?.clip_grad_norm(1.0, 2.0)?;
    let start = Instant::now();
    let mut step = 0;
    for b in loader.epoch(0).take(a.steps) {
        let b = b?;
        rt.step(&model, &mut opt, |g| lm_loss(&model, g, &b))?;
        step += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    // The validation loss on the first 20 batches of 64 windows (every rank computes it).
    let mut losses = Vec::new();
    for b in val.loader(64)?.drop_last(true).epoch(0).take(20) {
        losses.push(f64::from(
            rt.eval(&model, |g| lm_loss(&model, g, &b?))?.item()?,
        ));
    }
    let loss = losses.iter().sum::<f64>() / losses.len() as f64;
    if rank == 0 {
        println!(
            "lm, {size} rank(s) × {} thread(s), global batch {}: {step} steps, validation loss {loss:.4} nats/char, {:.2} ms/step",
            tl_nn::threads(),
            a.batch,
            1e3 * secs / step as f64
        );
    }
    Ok(())
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dist_train: {e}");
            std::process::exit(2);
        }
    };
    let result = Mpi::init().and_then(|mpi| {
        let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
        match a.model.as_str() {
            "mlp" => mlp(&mut rt, &a, mpi),
            "lm" => lm(&mut rt, &a, mpi),
            m => Err(tl_nn::Error::Other(
                format!("--model {m:?}: mlp or lm").into(),
            )),
        }
    });
    if let Err(e) = result {
        eprintln!("dist_train: error: {e}");
        std::process::exit(1);
    }
}
