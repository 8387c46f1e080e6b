//! `Backend::Cuda`: without the `cuda` feature, one clear error at construction; with it, the
//! eager session and `compile` run on the real device when the driver has one, and say "no
//! CUDA device" when it has none (the stub libcuda of `cargo xtask cuda-stub`, as CI runs it).
//! On a real GPU, a few Adam steps of a small model match the CPU session.

use tl_session::{Backend, Error, LinkedSession, Ops, Optimizer, Options, Precision, Session};
use tl_spec::Tensor;

/// The session on the real device, or `None` (after checking the error) when there is none.
fn cuda_session() -> Option<Session<f32>> {
    match Session::<f32>::new(Options::backend(Backend::Cuda)) {
        Ok(s) => Some(s),
        Err(e) => {
            let Error::BackendUnavailable { backend, detail } = &e else {
                panic!("expected BackendUnavailable, got {e:?}");
            };
            assert_eq!(*backend, "cuda");
            if cfg!(any(feature = "cuda", feature = "cuda-emu")) {
                assert!(detail.contains("no CUDA device"), "{e}");
                eprintln!("skipping the GPU part: {e}");
            } else {
                assert!(detail.contains("`cuda` feature"), "{e}");
            }
            // The linked session's compile says the same.
            let mut l = LinkedSession::<f32>::new();
            let x = l.input(Tensor::vector(vec![1.0]), true).unwrap();
            l.exp(&x).unwrap();
            let c = l
                .compile(Backend::Cuda)
                .err()
                .expect("no device, no compile");
            assert_eq!(c.to_string(), e.to_string());
            None
        }
    }
}

/// Three Adam steps of `sum(tanh(W·x + b)²)`; returns the parameters after them.
fn train(s: &mut Session<f32>) -> Vec<Tensor<f32>> {
    let w = Tensor::new([2, 3], vec![0.1, -0.2, 0.3, 0.4, 0.5, -0.6]).unwrap();
    let x = Tensor::vector(vec![1.0, -2.0, 0.5]);
    adam_steps(s, w, Tensor::vector(vec![0.05, -0.05]), x)
}

/// Three Adam steps (rate 0.05) of `sum(tanh(linear(w, b, x))²)` from the parameters `w`, `b`
/// on `s`; returns the parameters after them.
fn adam_steps(
    s: &mut Session<f32>,
    w: Tensor<f32>,
    b: Tensor<f32>,
    x: Tensor<f32>,
) -> Vec<Tensor<f32>> {
    let w = s.param(w, Some("w"), true).unwrap();
    let b = s.param(b, Some("b"), true).unwrap();
    let mut opt = Optimizer::adam(0.05).unwrap();
    for _ in 0..3 {
        let (wr, br) = (s.use_param(&w).unwrap(), s.use_param(&b).unwrap());
        let x = s.input(x.clone(), false).unwrap();
        let y = s.linear(&wr, &br, &x).unwrap();
        let t = s.tanh(&y).unwrap();
        let t2 = s.mul(&t, &t).unwrap();
        let l = s.sum(&t2).unwrap();
        s.backward(&l).unwrap();
        s.step(&mut opt).unwrap();
        s.reset();
    }
    s.release_optimizer_state(&mut opt);
    vec![s.param_value(&w).unwrap(), s.param_value(&b).unwrap()]
}

#[test]
fn cuda_backend_is_a_clear_error_or_matches_the_cpu() {
    let Some(mut gpu) = cuda_session() else {
        return;
    };
    let mut cpu = Session::<f32>::new(Options::backend(Backend::Cpu)).unwrap();
    let (want, got) = (train(&mut cpu), train(&mut gpu));
    for (a, b) in want.iter().zip(&got) {
        for (x, y) in a.data().iter().zip(b.data()) {
            assert!((x - y).abs() < 1e-4, "{a:?} vs {b:?}");
        }
    }
    // Only the two parameter mirrors stay resident.
    assert_eq!(gpu.memory_usage().unwrap().live_bytes, (6 + 2) * 4);
}

/// Three Adam steps of `sum(tanh(x·Wᵀ + b)²)` with a 24-wide contraction, on a session made
/// with `opts`; returns the parameters after them.
fn train_wide(opts: Options) -> Vec<Tensor<f32>> {
    let mut s = Session::<f32>::new(opts).unwrap();
    let data = |n: usize, k: u32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32 * k % 97) as f32 - 48.0) / 61.0 + 1.0e-3)
            .collect()
    };
    let w = Tensor::new([8, 24], data(8 * 24, 37)).unwrap();
    let x = Tensor::new([5, 24], data(5 * 24, 53)).unwrap();
    adam_steps(&mut s, w, Tensor::vector(data(8, 11)), x)
}

/// Autocast on the CUDA backends (the tensor-core GEMM: its sim twin, and under `cuda-emu` or
/// on a GPU the kernel): each setting trains as the CPU session at the same setting, within
/// f32 rounding of the sums, and not as f32.
#[test]
fn autocast_on_the_cuda_backends_trains_as_on_the_cpu() {
    let with = |backend, precision| Options {
        backend,
        precision,
        deterministic: true,
        ..Options::default()
    };
    let mut backends = vec![Backend::CudaSim];
    if cuda_session().is_some() {
        backends.push(Backend::Cuda);
    }
    for backend in backends {
        let f32s = train_wide(with(backend, Precision::F32));
        for p in [Precision::Bf16, Precision::Tf32] {
            let want = train_wide(with(Backend::Cpu, p));
            let got = train_wide(with(backend, p));
            for (a, b) in want.iter().zip(&got) {
                for (x, y) in a.data().iter().zip(b.data()) {
                    assert!((x - y).abs() < 1e-4, "{backend:?} {p:?}: {a:?} vs {b:?}");
                }
            }
            assert_ne!(got, f32s, "{backend:?} {p:?} trained as f32");
        }
    }
    // An f64 session refuses autocast by name.
    let e = Session::<f64>::new(Options {
        precision: Precision::Bf16,
        ..Options::default()
    })
    .err()
    .expect("bf16 in an f64 session")
    .to_string();
    assert!(e.contains("f64") && e.contains("bf16"), "{e}");
}

/// A pass without gradients on the device (the kernel emulator in CI, a GPU in the bundle):
/// the bits of the same pass with gradients, fewer live device bytes during it (each op's
/// workspace released as it returns), and no parameter moved by its step.
#[test]
fn a_pass_without_gradients_on_the_device_keeps_no_workspace() {
    let Some(s) = cuda_session() else {
        return;
    };
    let live = |s: &Session<f32>| s.memory_usage().map_or(0, |m| m.live_bytes);
    let with = crate::grad_enabled::pass(s, true, live);
    let without = crate::grad_enabled::pass(cuda_session().expect("a device"), false, live);
    assert_eq!(without.bits, with.bits, "the same values");
    assert!(
        without.during < with.during,
        "no backward workspace held: {} vs {} bytes",
        without.during,
        with.during
    );
    assert!(
        with.stepped && !without.stepped,
        "only the pass with gradients steps"
    );
    println!(
        "device: {} live bytes without gradients, {} with",
        without.during, with.during
    );
}

/// A chain without gradients on the device (the kernel emulator in CI, a GPU in the bundle)
/// frees each value its handles let go: the device's peak holds the input and two values,
/// against every value when all handles are kept; the same bits either way.
#[test]
fn a_chain_without_gradients_on_the_device_frees_each_value_it_lets_go() {
    use crate::release::{K, N, chain};
    let Some(s) = cuda_session() else {
        return;
    };
    let peak = |s: &Session<f32>| s.memory_usage().map_or(0, |m| m.peak_bytes);
    let (bits, freed) = chain(s, K, false, peak);
    let (kept_bits, kept) = chain(cuda_session().expect("a device"), K, true, peak);
    assert_eq!(bits, kept_bits, "the same values");
    assert!(freed <= 3 * N * 4, "{freed} bytes at the peak");
    assert!(kept >= (K + 1) * N * 4, "{kept} bytes at the peak");
    println!("device: peak {freed} bytes with handles dropped, {kept} with every handle kept");
}
