//! Your own op, verified everywhere: the exact (erf) GELU, which the catalogue lacks, written
//! as a user op (`op.rs`), used in a tl-nn model that trains on the digits, and put through
//! the harness's checks 0–7 by one public call — then the same op with a deliberately wrong
//! VJP, which the harness rejects with a readable report.
//!
//! The op carries its CUDA kernels (`gelu_erf.cu`, `kernel.rs`): on a GPU (`--features cuda`,
//! `--backend cuda`) the committed PTX runs; with `--features cuda-emu` the kernels run on the
//! kernel emulator and the harness compares them with the simulation device, where the op's
//! reference in f32 is their twin.
//!
//! `cargo run --release -p tl-nn --example custom_op [-- --backend cpu|cuda-sim|cuda] [-- --linked]`.
//! The last line is the harness summary, `geluErf: N passed, 0 failed` (`, 1 skipped` without
//! the `cuda-emu` features: the device check of its kernels, named on a `skip` line); the exit
//! status is non-zero if either verdict is wrong.

mod kernel;
mod op;

use std::process::ExitCode;

use tl_conformance::RunConfig;
use tl_conformance::user::check_user_op;
use tl_nn::{CLASSES, Linear, Module, PIXELS, Runtime, Sequential, UserLayer, data};
use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
use tl_tape_cuda::user::with_device;

/// Train a 784-64-10 MLP with the user op as its activation for a few epochs; returns the test
/// accuracy.
fn train<O: Train<T = f32>>(rt: Runtime<O>, act: UserLayer) -> tl_nn::Result<f64> {
    let mut rt = rt;
    let v = rt.vars();
    let model = Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, 64)?)
        .add(act)
        .add(Linear::new(&v.pp(2), 64, CLASSES)?);
    let (train, test) = data::digits()?;
    let mut opt = Optimizer::adam(2e-3)?;
    for epoch in 0..5 {
        let mut loss = 0.0;
        let batches = train.batches::<f32>(32, CLASSES, epoch)?;
        for (x, labels) in &batches {
            loss += rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(labels)
            })?;
        }
        println!(
            "epoch {epoch}: train loss {:.4}",
            loss / batches.len() as f64
        );
    }
    let (x_test, y_test) = (test.features(), test.labels(CLASSES)?);
    rt.accuracy(&model, &x_test, &y_test, 128)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let backend = match args
        .windows(2)
        .find(|w| w[0] == "--backend")
        .map(|w| w[1].as_str())
    {
        None | Some("cpu") => Backend::Cpu,
        Some("cuda-sim") => Backend::CudaSim,
        Some("cuda") => Backend::Cuda,
        Some(other) => {
            eprintln!("error: unknown backend {other:?} (cpu, cuda-sim or cuda)");
            return ExitCode::FAILURE;
        }
    };
    let linked = args.iter().any(|a| a == "--linked");

    let gelu = with_device(op::gelu_erf(false), kernel::device_impl());
    let act = UserLayer(gelu.clone());
    let acc = if linked {
        train(Runtime::new(LinkedSession::<f32>::with_seed(0)), act)
    } else {
        Session::<f32>::new(Options::backend(backend))
            .map_err(tl_nn::Error::from)
            .and_then(|s| train(Runtime::new(s), act))
    };
    match acc {
        Ok(acc) => println!("test accuracy with geluErf: {:.2}%\n", 100.0 * acc),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }

    let cfg = RunConfig::from_env();
    let wrong = with_device(op::gelu_erf(true), kernel::device_impl());
    let wrong = check_user_op(&op::entry(wrong), &cfg);
    println!("The op with a planted bug in its VJP:\n{wrong}\n");
    let right = check_user_op(&op::entry(gelu), &cfg);
    println!("The op as written:\n{right}");
    if wrong.passed() || !right.passed() {
        eprintln!("error: the harness's verdicts are not the expected ones");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
