//! The data-parallel check: N ranks with per-rank batch B/N against one process with batch B.
//!
//! `mpirun -np 2 target/debug/examples/dist_check --steps 20 --batch 64` (build with
//! `cargo build -p tl-nn --features mpi --example dist_check`). Every rank trains the digits MLP
//! for `--steps` steps on its shard of each global batch ([`DataLoader::shard`]); after every
//! step the ranks' parameters must be bit for bit identical (their bytes are all-gathered).
//! Then rank 0 trains the same model in one process with the global batch and the parameters
//! must agree within `--tol`; it prints both runs' loss and test accuracy. Exit 0 on success,
//! 1 with the error on every rank otherwise.
//!
//! Planted faults, each of which must make the check fail (`scripts/dist-check.sh` runs them):
//! - `--plant wrong-mean`: the engine returns the mean where the sum is asked (the gradients
//!   are divided by N twice): the ranks agree, the one-process check fails;
//! - `--plant skip-bucket`: the engine leaves the second gradient bucket of each step
//!   unreduced: the ranks' parameters differ after the first step;
//! - `--fault bad-input`: rank 1 feeds a batch of the wrong width at step 2: every rank stops
//!   with an error naming rank 1;
//! - `--fault hang`: rank 1 sleeps at step 2: rank 0's step times out naming rank 1;
//! - `--fault bad-load`: rank 1 loads a checkpoint that does not exist: every rank's load fails;
//! - `--fault shape`: rank 1's model has 33 hidden units: the start-up check names `0.weight`.

use std::cell::Cell;
use std::io::Write;
use std::time::Duration;

use tl_nn::data::{Classify, DataLoader, digits};
use tl_nn::dist::{Collective, Mpi};
use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential};
use tl_session::{Optimizer, Options, Session};
use tl_spec::Tensor;

struct Args {
    steps: usize,
    batch: usize,
    tol: f64,
    bucket: usize,
    plant: String,
    fault: String,
    timeout: f64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        steps: 20,
        batch: 64,
        tol: 2e-5,
        bucket: 500,
        plant: "none".into(),
        fault: "none".into(),
        timeout: 20.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--steps" => a.steps = num(&value)? as usize,
            "--batch" => a.batch = num(&value)? as usize,
            "--tol" => a.tol = num(&value)?,
            "--bucket" => a.bucket = num(&value)? as usize,
            "--timeout" => a.timeout = num(&value)?,
            "--plant" => a.plant = value,
            "--fault" => a.fault = value,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// An engine with a planted bug around the real one.
struct Planted<C> {
    inner: C,
    plant: String,
    /// All-reduce calls since the last all-gather (each step's buckets follow its gathers).
    since_gather: Cell<usize>,
}

impl<C: Collective> Collective for Planted<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
        let call = self.since_gather.get();
        self.since_gather.set(call + 1);
        match self.plant.as_str() {
            "skip-bucket" if call == 1 => Ok(()),
            "wrong-mean" => {
                self.inner.all_reduce_sum_f32(buf)?;
                let n = self.size() as f32;
                buf.iter_mut().for_each(|x| *x /= n);
                Ok(())
            }
            _ => self.inner.all_reduce_sum_f32(buf),
        }
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
        self.inner.all_reduce_sum_f64(buf)
    }
    fn broadcast_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
        self.inner.broadcast_f32(buf)
    }
    fn broadcast_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
        self.inner.broadcast_f64(buf)
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> tl_nn::Result<Vec<Vec<u8>>> {
        self.since_gather.set(0);
        self.inner.all_gather_bytes(mine)
    }
}

type Rt = Runtime<Session<f32>>;

fn fail(message: String) -> tl_nn::Error {
    tl_nn::Error::Other(message.into())
}

/// The digits MLP with `hidden` units, from seed 0.
fn mlp(rt: &Rt, hidden: usize) -> tl_nn::Result<Sequential<Session<f32>>> {
    let v = rt.vars();
    Ok(Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, hidden)?)
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), hidden, CLASSES)?))
}

/// Every parameter value of `model`, in order.
fn values(rt: &Rt, model: &Sequential<Session<f32>>) -> tl_nn::Result<Vec<f32>> {
    let mut out = Vec::new();
    for (_, t) in rt.state_dict(model)? {
        out.extend_from_slice(t.data());
    }
    Ok(out)
}

fn run(mpi: Mpi, a: &Args) -> tl_nn::Result<()> {
    let (rank, size) = (mpi.rank(), mpi.size());
    let mpi = mpi.with_timeout(Duration::from_secs_f64(a.timeout));
    let (train, test) = digits()?;
    let x_test: Tensor<f32> = test.features();
    let y_test = test.labels(CLASSES)?;

    let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
    // `--fault shape`: rank 1's model is wider (the start-up check names the parameter).
    let hidden = if a.fault == "shape" && rank == 1 {
        33
    } else {
        32
    };
    let model = mlp(&rt, hidden)?;
    let comm = Planted {
        inner: mpi,
        plant: a.plant.clone(),
        since_gather: Cell::new(0),
    };
    rt.data_parallel(&model, Box::new(comm))?;
    rt.set_bucket_elems(a.bucket)?;
    let mut opt = Optimizer::sgd(0.1)?;
    let loader = DataLoader::new(&train, a.batch, Classify { classes: CLASSES })?
        .shuffle(1)
        .shard(rank, size)?;
    let mut step = 0;
    let mut last_loss = 0.0;
    'train: for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            if step == a.steps {
                break 'train;
            }
            let (mut x, labels) = batch?;
            if step == 2 && rank == 1 && a.fault == "bad-input" {
                x = Tensor::zeros(vec![x.shape().dims()[0], PIXELS - 1]);
            }
            if step == 2 && rank == 1 && a.fault == "hang" {
                std::thread::sleep(Duration::from_secs(600));
            }
            last_loss = rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x)?)?.cross_entropy(&labels)
            })?;
            // The replicas must stay bit for bit identical: every rank's parameter bytes
            // (kilobytes: the all-gather's long-record path) equal to this rank's.
            let mine: Vec<u8> = values(&rt, &model)?
                .iter()
                .flat_map(|x| x.to_bits().to_le_bytes())
                .collect();
            let comm = rt.collective().ok_or_else(|| fail("no group".into()))?;
            let all = comm.all_gather_bytes(&mine)?;
            if let Some(r) = all.iter().position(|b| *b != mine) {
                return Err(fail(format!(
                    "rank {rank}: the ranks' parameters differ after step {step} (rank {r}'s are not this rank's)"
                )));
            }
            step += 1;
        }
    }
    let acc = rt.accuracy(&model, &x_test, &y_test, 128)?;
    let path =
        std::env::temp_dir().join(format!("tl-dist-check-{}.safetensors", std::process::id()));
    // Rank 0's pid names the file: every rank learns it from the all-gather.
    let comm = rt.collective().ok_or_else(|| fail("no group".into()))?;
    let paths = comm.all_gather_bytes(path.to_string_lossy().as_bytes())?;
    let shared = std::path::PathBuf::from(String::from_utf8_lossy(&paths[0]).into_owned());
    rt.save(&model, &shared)?;
    let load_from = if a.fault == "bad-load" && rank == 1 {
        shared.with_extension("missing")
    } else {
        shared.clone()
    };
    let loaded = rt.load(&model, &load_from);
    if rank == 0 {
        std::fs::remove_file(&shared).ok();
    }
    loaded?;
    println!(
        "rank {rank}/{size}: {step} steps, last loss {last_loss:.6}, test accuracy {acc:.4}, checkpoint saved by rank 0 and loaded"
    );
    if rank != 0 {
        return Ok(());
    }

    // One process, the global batch, the same seeds.
    let mut one = Runtime::new(Session::<f32>::new(Options::default())?);
    let reference = mlp(&one, 32)?;
    let mut opt1 = Optimizer::sgd(0.1)?;
    let full = DataLoader::new(&train, a.batch, Classify { classes: CLASSES })?
        .shuffle(1)
        .drop_last(true);
    let mut step1 = 0;
    let mut loss1 = 0.0;
    'one: for epoch in 0.. {
        for batch in full.epoch(epoch) {
            if step1 == a.steps {
                break 'one;
            }
            let (x, labels) = batch?;
            loss1 = one.step(&reference, &mut opt1, |g| {
                reference.forward(&g.input(x)?)?.cross_entropy(&labels)
            })?;
            step1 += 1;
        }
    }
    let acc1 = one.accuracy(&reference, &x_test, &y_test, 128)?;
    let (p, p1) = (values(&rt, &model)?, values(&one, &reference)?);
    let worst = p
        .iter()
        .zip(&p1)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    println!(
        "one process, batch {}: last loss {loss1:.6}, test accuracy {acc1:.4}; largest parameter difference {worst:.3e} (tolerance {:.1e})",
        a.batch, a.tol
    );
    if worst > a.tol || !worst.is_finite() {
        return Err(fail(format!(
            "{size} ranks with batch {}/{size} do not take the steps of one process with batch {}: largest parameter difference {worst:.3e} > {:.1e}",
            a.batch, a.batch, a.tol
        )));
    }
    println!(
        "dist_check passed: {size} ranks = one process within {:.1e}",
        a.tol
    );
    Ok(())
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dist_check: {e}");
            std::process::exit(2);
        }
    };
    tl_nn::set_threads(1);
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("dist_check: {e}");
            std::process::exit(1);
        }
    };
    let rank = mpi.rank();
    if let Err(e) = run(mpi, &a) {
        // One write, so that mpirun does not interleave it with another rank's line.
        let line = format!("dist_check rank {rank}: error: {e}\n");
        std::io::stderr().write_all(line.as_bytes()).ok();
        // A moment for the other ranks, which learned of the error in the same call, to print
        // theirs before mpirun ends the job on this rank's exit code.
        std::thread::sleep(Duration::from_millis(300));
        std::process::exit(1);
    }
}
