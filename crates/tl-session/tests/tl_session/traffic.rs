//! GPU cost proxies per training step ([`tl_tape_cuda::Traffic`]): kernel launches and
//! host↔device copies, counted on the simulation device and, with `--features cuda-emu`, by the
//! CUDA device's own launch code over the emulated kernels. The figures for the bench models
//! are printed by `cargo run --release -p tl-session --example gpu_proxies` (docs/performance.md).

use tl_session::models::{Activation, Mlp, regression_grid};
use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
use tl_tape_cuda::Traffic;

/// The MLP 2-16-1 (4 parameters) on the 36-point regression grid (inputs x and y).
const PARAMS: u64 = 4;
const PARAM_ELEMENTS: u64 = 2 * 16 + 16 + 16 + 1;
const INPUT_ELEMENTS: u64 = 36 * 2 + 36;

/// The traffic of steps 3..=5 of an SGD run of the MLP in `s`.
fn steps<S: Train<T = f32>>(mut s: S) -> Vec<Traffic> {
    let (x, y) = regression_grid::<f32>(6);
    let mlp = Mlp::new(&mut s, &[2, 16, 1], Activation::Tanh, 7).unwrap();
    let mut opt = Optimizer::sgd(0.05).unwrap();
    let mut out = Vec::new();
    let mut before = Traffic::default();
    for step in 0..5 {
        Train::reset(&mut s);
        let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
        s.backward_step(&loss, &mut opt).unwrap();
        let now = s.traffic().expect("a CUDA backend counts its traffic");
        if step >= 2 {
            out.push(now - before);
        }
        before = now;
    }
    out
}

fn eager(backend: Backend) -> Vec<Traffic> {
    steps(Session::<f32>::new(Options::backend(backend)).unwrap())
}

fn linked(backend: Backend) -> Vec<Traffic> {
    let mut s = LinkedSession::<f32>::new();
    s.set_backend(backend).unwrap();
    steps(s)
}

/// Every steady-state step does the same work; both sessions keep their parameters on the device
/// (the linked session compiles them in as resident mirrors and updates them there), upload
/// only the inputs and read back only the loss.
#[test]
fn steps_on_the_sim_copy_what_the_design_says() {
    for (name, run) in [
        ("eager", eager(Backend::CudaSim)),
        ("linked", linked(Backend::CudaSim)),
    ] {
        assert!(run.iter().all(|t| *t == run[0]), "{name}: {run:?}");
        assert!(run[0].launches > 20, "{name}: {:?}", run[0]);
    }
    for (name, t) in [
        ("eager", eager(Backend::CudaSim)[0]),
        ("linked", linked(Backend::CudaSim)[0]),
    ] {
        assert_eq!(
            (t.downloads, t.download_bytes),
            (1, 4),
            "{name}: the loss only"
        );
        assert_eq!(
            (t.uploads, t.upload_bytes),
            (2, 4 * INPUT_ELEMENTS),
            "{name}: the inputs only, no parameter ({PARAMS} of them, {PARAM_ELEMENTS} values)"
        );
    }
    // The CPU backends have no device to count.
    assert!(
        Session::<f32>::new(Options::backend(Backend::Cpu))
            .unwrap()
            .traffic()
            .is_none()
    );
}

/// The CUDA device's launch code over the emulated kernels copies exactly what the sim copies
/// and launches at least one kernel per sim primitive (full reductions take two).
#[cfg(feature = "cuda-emu")]
#[test]
fn the_cuda_launch_code_counts_the_same_copies_and_at_least_the_sims_launches() {
    for (name, sim, dev) in [
        ("eager", eager(Backend::CudaSim), eager(Backend::Cuda)),
        ("linked", linked(Backend::CudaSim), linked(Backend::Cuda)),
    ] {
        let (s, d) = (sim[0], dev[0]);
        assert!(dev.iter().all(|t| *t == d), "{name}: {dev:?}");
        assert_eq!(
            (d.uploads, d.upload_bytes, d.downloads, d.download_bytes),
            (s.uploads, s.upload_bytes, s.downloads, s.download_bytes),
            "{name}: {d:?} vs {s:?}"
        );
        assert!(d.launches >= s.launches, "{name}: {d:?} vs {s:?}");
    }
}
