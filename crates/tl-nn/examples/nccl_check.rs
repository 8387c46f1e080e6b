//! NCCL on this machine, one rank: loads the library, prints its version, all-reduces and
//! broadcasts device buffers (f32 and f64) and checks that one rank gets its input back bit for
//! bit, then trains the digits MLP data-parallel with the NCCL engine (over `Local`, one rank)
//! against the same steps without a group: the parameters must be equal, bit for bit, on the
//! CPU and with the model on the CUDA device (both sessions), where the gradients are reduced
//! in device memory: a step in the group copies nothing more between host and device. Prints
//! one `PASS`/`FAIL` line per check; exit 0 when all pass, 1 otherwise, 2 when built without
//! a CUDA feature or given a bad `TL_NCCL_CHECK_STEPS` (the training steps each comparison
//! takes; 10 by default, CI's emulator run takes 2).
//!
//! On a GPU (NCCL from PyTorch's wheels):
//! `TL_NCCL_LIBRARY=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")/lib/libnccl.so.2 target/release/examples/nccl_check`
//! (build: `eval "$(cargo xtask cuda-stub)"; cargo build --release -p tl-nn --features cuda --example nccl_check`;
//! the GPU bundle carries it). Without a GPU, on the kernel emulator and the one-rank stub:
//! `eval "$(cargo xtask nccl-stub)"; cargo run -p tl-nn --features cuda-emu --example nccl_check`.

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
fn main() {
    let mut failed = 0;
    let mut report = |name: &str, r: Result<String, String>| match r {
        Ok(detail) => println!("PASS {name}: {detail}"),
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e}");
        }
    };
    let steps = match check::steps() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("nccl_check: {e}");
            std::process::exit(2);
        }
    };
    report("load", check::load());
    report("all-reduce and broadcast (one rank)", check::collectives());
    report(
        "data-parallel digits MLP (Nccl over Local)",
        check::training(steps),
    );
    report(
        "data-parallel digits MLP on the CUDA device, gradients reduced there",
        check::training_on_device(steps),
    );
    std::process::exit(i32::from(failed > 0));
}

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
fn main() {
    eprintln!("nccl_check: build with --features cuda (a GPU) or cuda-emu (the kernel emulator)");
    std::process::exit(2);
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod check {
    use tl_nn::data::{Classify, DataLoader, digits};
    use tl_nn::dist::{Collective, Local, Nccl};
    use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential};
    use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
    use tl_tape_cuda::nccl::{self, Elem, NcclComm};
    use tl_tape_cuda::{CudaDevice, Device};

    type R = Result<String, String>;

    pub fn load() -> R {
        let lib = nccl::Nccl::load().map_err(|e| e.to_string())?;
        let v = lib.version().map_err(|e| e.to_string())?;
        Ok(format!("NCCL {v} (code {}) from {}", v.code, lib.path()))
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    pub fn collectives() -> R {
        let e = |e: tl_tape_cuda::Error| e.to_string();
        let lib = nccl::Nccl::load().map_err(e)?;
        let mut dev = CudaDevice::new().map_err(e)?;
        let id = lib.unique_id().map_err(e)?;
        let mut comm = NcclComm::init(&lib, &id, 0, 1).map_err(e)?;
        let n = 1 << 20;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.001).sin() * 1e3).collect();
        let b = dev.upload(&x).map_err(e)?;
        let s = comm.all_reduce_sum(&mut dev, b, Elem::F32).map_err(e)?;
        let c = comm.broadcast(&mut dev, b, 0, Elem::F32).map_err(e)?;
        let (sum, cast) = (dev.download(s).map_err(e)?, dev.download(c).map_err(e)?);
        for buf in [b, s, c] {
            dev.release(buf);
        }
        if bits(&sum) != bits(&x) || bits(&cast) != bits(&x) {
            return Err("one rank's all-reduce or broadcast changed the values".into());
        }
        // f64 through the engine (two words per value).
        let engine = Nccl::init(Box::new(Local)).map_err(|e| e.to_string())?;
        let z: Vec<f64> = (0..4097).map(|i| (i as f64).sqrt() / 3.0).collect();
        let mut w = z.clone();
        engine
            .all_reduce_sum_f64(&mut w)
            .map_err(|e| e.to_string())?;
        engine.broadcast_f64(&mut w).map_err(|e| e.to_string())?;
        if w.iter().zip(&z).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err("f64 values changed".into());
        }
        Ok(format!(
            "{n} f32 values summed and broadcast, 4097 f64 values, bit for bit"
        ))
    }

    /// The eager session on `backend`, seed 7.
    fn eager(backend: Backend) -> tl_nn::Result<Runtime<Session<f32>>> {
        Ok(Runtime::new(Session::<f32>::new(Options {
            seed: 7,
            backend,
            ..Options::default()
        })?))
    }

    /// The parameters after `steps` SGD steps of the MLP on `rt`, with `comm` as the group (or
    /// none), the last loss, and the session's host↔device copies of the last step
    /// (`(uploads, downloads)`; zeros on the CPU).
    fn train<O: Train<T = f32>>(
        mut rt: Runtime<O>,
        comm: Option<Nccl>,
        steps: usize,
    ) -> tl_nn::Result<(Vec<u32>, f64, (u64, u64))> {
        let (data, _) = digits()?;
        let v = rt.vars();
        let model = Sequential::new()
            .add(Linear::new(&v.pp(0), PIXELS, 32)?)
            .add(Activation::Relu)
            .add(Linear::new(&v.pp(2), 32, CLASSES)?);
        let mut loader = DataLoader::new(&data, 64, Classify { classes: CLASSES })?.shuffle(1);
        if let Some(c) = comm {
            let (rank, size) = (c.rank(), c.size());
            rt.data_parallel(&model, Box::new(c))?;
            rt.set_bucket_elems(1000)?; // several buckets per step
            loader = loader.shard(rank, size)?;
        }
        let mut opt = Optimizer::sgd(0.1)?;
        let mut loss = 0.0;
        let mut copies = (0, 0);
        for batch in loader.epoch(0).take(steps) {
            let (x, labels) = batch?;
            let before = rt.session().traffic().unwrap_or_default();
            loss = rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x)?)?.cross_entropy(&labels)
            })?;
            let t = rt.session().traffic().unwrap_or_default() - before;
            copies = (t.uploads, t.downloads);
        }
        let params = rt
            .state_dict(&model)?
            .into_iter()
            .flat_map(|(_, t)| bits(t.data()))
            .collect();
        Ok((params, loss, copies))
    }

    /// Training steps a comparison takes: `TL_NCCL_CHECK_STEPS` (a positive count; unset or
    /// empty: 10), read as the library reads its variables (`tl_spec::env`), but a bad value
    /// is an error: a check must not run other than asked.
    pub fn steps() -> Result<usize, String> {
        const NAME: &str = "TL_NCCL_CHECK_STEPS";
        tl_spec::env::interpret(
            NAME,
            std::env::var_os(NAME).as_deref(),
            "a number of steps (a positive integer)",
            tl_spec::env::parse_positive,
            || "none (nccl_check stops)".into(),
        )
        .map(|n| n.unwrap_or(10))
        .map_err(|w| w.trim_start_matches("warning: ").to_owned())
    }

    pub fn training(steps: usize) -> R {
        let (alone, l0, _) = train(eager(Backend::Cpu).map_err(|e| e.to_string())?, None, steps)
            .map_err(|e| e.to_string())?;
        let engine = Nccl::init(Box::new(Local)).map_err(|e| e.to_string())?;
        let (grouped, l1, _) = train(
            eager(Backend::Cpu).map_err(|e| e.to_string())?,
            Some(engine),
            steps,
        )
        .map_err(|e| e.to_string())?;
        if alone != grouped {
            let differ = alone.iter().zip(&grouped).filter(|(a, b)| a != b).count();
            return Err(format!(
                "{differ} of {} parameters differ after {steps} steps",
                alone.len()
            ));
        }
        Ok(format!(
            "{steps} steps, {} parameters equal bit for bit (loss {l0:.4} alone, {l1:.4} with NCCL)",
            alone.len()
        ))
    }

    /// The same steps with the model on the CUDA device, for the eager and the linked session:
    /// equal to no group bit for bit, and the step in the group copies between host and device
    /// what the step alone copies (the gradients stay on the device).
    pub fn training_on_device(steps: usize) -> R {
        let e = |e: tl_nn::Error| e.to_string();
        let linked = || -> tl_nn::Result<Runtime<LinkedSession<f32>>> {
            let mut rt = Runtime::new(LinkedSession::<f32>::with_seed(7));
            rt.session_mut().set_backend(Backend::Cuda)?;
            Ok(rt)
        };
        let mut said = Vec::new();
        for session in ["eager", "linked"] {
            let run = |comm: Option<Nccl>| match session {
                "eager" => train(eager(Backend::Cuda)?, comm, steps),
                _ => train(linked()?, comm, steps),
            };
            let (alone, _, c0) = run(None).map_err(e)?;
            let engine = Nccl::init(Box::new(Local)).map_err(e)?;
            let (grouped, _, c1) = run(Some(engine)).map_err(e)?;
            if alone != grouped {
                let differ = alone.iter().zip(&grouped).filter(|(a, b)| a != b).count();
                return Err(format!(
                    "{session}: {differ} of {} parameters differ after {steps} steps",
                    alone.len()
                ));
            }
            if c1 != c0 {
                return Err(format!(
                    "{session}: a step in the group makes {c1:?} (uploads, downloads), one alone \
                     {c0:?}: the gradients left the device"
                ));
            }
            said.push(format!("{session} {c0:?}"));
        }
        Ok(format!(
            "{steps} steps each, parameters equal bit for bit; (uploads, downloads) a step, \
             alone = in the group: {}",
            said.join(", ")
        ))
    }
}
