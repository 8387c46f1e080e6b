//! GPU cost proxies of one training step, counted without a GPU: kernel launches, host↔device
//! copies and allocations per step, for the step benches' tl-nn models
//! (`benches/common/models.rs`), eager and linked, each step the user's `Runtime::step` (reset,
//! record, `backward_step` with the model's optimizer): the small ones (mlp, cnn, transformer
//! block) by default, the realistic sizes (the wide mlp, the ResNet, the LM) with `--models
//! realistic`, both with `--models all`, one realistic model alone with `--models wide-mlp`,
//! `resnet` or `lm` (the sim computes every product on the host: the three take most of an
//! hour on one core).
//!
//! ```sh
//! cargo run --release -p tl-session --example gpu_proxies                 # the simulation device
//! cargo run --release -p tl-session --example gpu_proxies -- --models realistic
//! cargo run --release -p tl-session --features cuda-emu --example gpu_proxies -- --backend cuda
//! cargo run --release -p tl-session --example gpu_proxies -- --models resnet --precision bf16
//! ```
//!
//! `--precision bf16` (or `tf32`) steps under autocast (`Options::precision`,
//! `LinkedSession::set_precision`): the products on the tensor-core kernels.
//!
//! On the simulation device a launch is one primitive; `--backend cuda` with `cuda-emu` runs
//! the CUDA device's own launch code over the emulated kernels and counts every kernel
//! (`tl_tape_cuda::Traffic`). Each figure is the third step's (the first two warm the pools),
//! and the program checks that the fourth step does exactly the same work.

#[path = "../benches/common/models.rs"]
#[allow(missing_docs)]
mod models;

use models::{BenchModel, Run};
use tl_nn::Result;
use tl_session::{Backend, LinkedSession, Options, Precision, Session, Train};
use tl_tape_cuda::{MemoryUsage, Traffic};

/// One step's work: launches and copies, pool allocations, raw device allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepWork {
    traffic: Traffic,
    allocs: u64,
    device_allocs: u64,
}

fn reading<S: Train>(s: &S) -> (Traffic, MemoryUsage) {
    (
        s.traffic().unwrap_or_default(),
        s.memory_usage().unwrap_or_default(),
    )
}

/// The work of the third and fourth steps of `m` in `s`.
fn measure<S: Train<T = f32>>(s: S, m: &BenchModel) -> Result<[StepWork; 2]> {
    let mut run = Run::with_session(m, s)?;
    for _ in 0..2 {
        m.train_step(&mut run.rt, &run.net, &mut run.opt)?;
    }
    let mut out = [None, None];
    for o in &mut out {
        let (t0, u0) = reading(&*run.rt.session());
        m.train_step(&mut run.rt, &run.net, &mut run.opt)?;
        let (t1, u1) = reading(&*run.rt.session());
        *o = Some(StepWork {
            traffic: t1 - t0,
            allocs: u1.alloc_count - u0.alloc_count,
            device_allocs: u1.device_alloc_count - u0.device_alloc_count,
        });
    }
    let [Some(a), Some(b)] = out else {
        unreachable!("both steps measured")
    };
    Ok([a, b])
}

/// Which of the bench models to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Models {
    /// The mlp, the cnn and the transformer block.
    Small,
    /// The wide mlp, the ResNet and the LM.
    Realistic,
    /// Both.
    All,
    /// One realistic model alone: the name's prefix (`wide mlp`, `resnet`, `lm`).
    One(&'static str),
}

const USAGE: &str = "usage: gpu_proxies [--backend cuda-sim|cuda] [--models small|realistic|all|wide-mlp|resnet|lm] [--precision f32|bf16|tf32]";

fn parse(args: &[String]) -> Option<(Backend, Models, Precision)> {
    let (mut backend, mut models, mut precision) =
        (Backend::CudaSim, Models::Small, Precision::F32);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next()?.as_str();
        match (flag.as_str(), value) {
            ("--backend", "cuda-sim") => backend = Backend::CudaSim,
            ("--backend", "cuda") => backend = Backend::Cuda,
            ("--models", "small") => models = Models::Small,
            ("--models", "realistic") => models = Models::Realistic,
            ("--models", "all") => models = Models::All,
            ("--models", "wide-mlp") => models = Models::One("wide mlp"),
            ("--models", "resnet") => models = Models::One("resnet"),
            ("--models", "lm") => models = Models::One("lm"),
            ("--precision", "f32") => precision = Precision::F32,
            ("--precision", "bf16") => precision = Precision::Bf16,
            ("--precision", "tf32") => precision = Precision::Tf32,
            _ => return None,
        }
    }
    Some((backend, models, precision))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((backend, models, precision)) = parse(&args) else {
        eprintln!("{USAGE}");
        return std::process::ExitCode::from(2);
    };
    match run(backend, models, precision) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(backend: Backend, which: Models, precision: Precision) -> Result<()> {
    let small = [
        ("mlp b64", BenchModel::mlp(64)),
        ("cnn b64", BenchModel::cnn(64)),
        ("transformer n128", BenchModel::transformer(128)),
    ];
    let realistic = [
        ("wide mlp b256", BenchModel::wide_mlp(256)),
        ("resnet b32", BenchModel::resnet(32, 32)),
        ("lm b16", BenchModel::lm(16)),
    ];
    let models: Vec<_> = match which {
        Models::Small => small.into_iter().collect(),
        Models::Realistic => realistic.into_iter().collect(),
        Models::All => small.into_iter().chain(realistic).collect(),
        Models::One(name) => realistic
            .into_iter()
            .filter(|(n, _)| n.starts_with(name))
            .collect(),
    };
    println!("backend: {backend:?}, {precision:?} (figures per training step, steady state)\n");
    println!(
        "| model | session | launches | uploads | upload bytes | downloads | download bytes | pool allocs | device allocs |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, m) in &models {
        for linked in [false, true] {
            let work = if linked {
                let mut s = LinkedSession::<f32>::new();
                s.set_backend(backend)?;
                s.set_precision(precision)?;
                measure(s, m)?
            } else {
                let opts = Options {
                    precision,
                    ..Options::backend(backend)
                };
                measure(Session::<f32>::new(opts)?, m)?
            };
            let w = work[0];
            if work[1] != w {
                return Err(tl_nn::Error::Usage {
                    what: "gpu_proxies",
                    detail: format!(
                        "{name}: steps 3 and 4 differ ({:?} vs {:?})",
                        work[0], work[1]
                    ),
                });
            }
            let t = w.traffic;
            println!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
                if linked { "linked" } else { "eager" },
                t.launches,
                t.uploads,
                t.upload_bytes,
                t.downloads,
                t.download_bytes,
                w.allocs,
                w.device_allocs
            );
        }
    }
    Ok(())
}
