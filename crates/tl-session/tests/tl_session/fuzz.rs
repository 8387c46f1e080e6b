//! Fuzzing the public API with mostly invalid input (issue 14: bad input never panics, aborts or
//! trains on garbage).
//!
//! Each case draws shapes whose dims are small, zero, or absurd (2³², 2⁶², `usize::MAX`, products
//! that wrap to small numbers, 10⁹–10¹¹ elements), ops with random and mostly invalid parameters,
//! random operand ids, and optimizer hyper-parameters including NaN, ±∞ and negatives, and drives
//! them through `Shape`/`Tensor` constructors, `reshape`, `GraphBuilder::apply`, IR evaluation,
//! the CPU tape (apply and backward), the CUDA tape on the simulation device, and the optimizer
//! constructors. Every case runs under `catch_unwind`: a panic anywhere fails the test and
//! prints the case. Results that succeed are checked too (a tape value has the shape the shape
//! rule promised; an accepted optimizer has valid hyper-parameters).
//!
//! The fuzzing runs in a child process only: [`fuzz_in_a_child_process_exits_cleanly`] runs this
//! test binary again, filtered to [`fuzz_cases_in_this_process`], with the allocation cap lowered
//! to 64 MiB through `TL_MAX_ALLOC_BYTES` (so an oversized but representable request is refused
//! quickly instead of allocating gigabytes), and asserts that the child exits successfully within
//! a time limit. That catches what `catch_unwind` cannot (an allocation failure aborts the
//! process; a loop over the dims of an empty tensor can run for hours), and leaves the cap of the
//! other tests of this binary alone.
//!
//! | variable | effect | default |
//! |---|---|---|
//! | `TL_FUZZ_CASES` | the number of cases | 1000 (a fraction of a second in a debug build; 100 000 take about 10 s) |
//! | `TL_FUZZ_SEED` | the seed (the same seed gives the same cases) | fixed |
//! | `TL_FUZZ_ONLY` | run only the case of this index (0-based) of the sequence, to reproduce one | all |
//! | `TL_FUZZ_TIMEOUT_S` | the child's time limit in seconds | 600 |
//!
//! For example `TL_FUZZ_CASES=5000 cargo test -p tl-session --test tl_session fuzz::`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tl_ir::{GraphBuilder, Op};
use tl_session::Optimizer;
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::Tape;
use tl_tape_cuda::{CudaTape, SimDevice};

const CAP: usize = 64 << 20;

/// The default number of cases (`TL_FUZZ_CASES` overrides it).
const DEFAULT_CASES: u32 = 1000;
/// Set in the child process: only there does [`fuzz_cases_in_this_process`] fuzz.
const CHILD_VAR: &str = "TL_FUZZ_IN_CHILD";

/// The number `name` holds; `None` when unset or empty. A value that does not parse stops the
/// test, naming it: a mistyped `TL_FUZZ_CASES=10k` must not quietly run the default.
fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var_os(name)?;
    let text = raw.to_string_lossy();
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    match text.parse() {
        Ok(v) => Some(v),
        Err(_) => panic!("{name}={raw:?} is not a number (unset it for the default)"),
    }
}

fn cases() -> u32 {
    match env("TL_FUZZ_CASES") {
        Some(0) => panic!("TL_FUZZ_CASES=0 would fuzz nothing (unset it for {DEFAULT_CASES})"),
        Some(n) => n,
        None => DEFAULT_CASES,
    }
}

fn seed() -> u64 {
    env("TL_FUZZ_SEED").unwrap_or(0x1414_1414)
}

/// A dim: mostly small, sometimes zero, sometimes absurd.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..5,
        1 => Just(1usize << 32),
        1 => Just(1usize << 62),
        1 => Just(usize::MAX),
        1 => Just(6_148_914_691_236_517_206usize), // 3 × this wraps to 2
        1 => 1_000_000_000usize..100_000_000_000,
        1 => any::<usize>(),
    ]
}

fn shape() -> impl Strategy<Value = Shape> {
    prop::collection::vec(dim(), 0..5).prop_map(Shape::from)
}

/// A usize parameter (axis, index, start, k, heads, modes…).
fn param() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..4, 1 => dim()]
}

fn params() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(param(), 0..4)
}

/// A float parameter: ordinary, boundary or non-finite.
fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(1.0),
        Just(0.5),
        Just(1e-6),
        Just(1e300),
        any::<f64>(),
    ]
}

fn mask() -> impl Strategy<Value = Mask> {
    (0usize..4).prop_map(|n| Mask::causal(n).unwrap())
}

/// An op with random (mostly invalid) parameters.
fn op() -> impl Strategy<Value = Op> {
    let simple = prop::sample::select(vec![
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Abs,
        Op::Sqrt,
        Op::Exp,
        Op::Log,
        Op::Inv,
        Op::Relu,
        Op::Max,
        Op::Min,
        Op::Sigmoid,
        Op::Tanh,
        Op::Softplus,
        Op::Detach,
        Op::Gelu,
        Op::Silu,
        Op::GeluErf,
        Op::Flatten,
        Op::Transpose2d,
        Op::PermuteBca,
        Op::PermuteCab,
        Op::SwapLastTwo,
        Op::Concat,
        Op::Sum,
        Op::Matmul,
        Op::Bmm,
        Op::Linear,
        Op::Softmax,
        Op::LogSoftmax,
        Op::MseLoss,
        Op::GatherIndexTensor,
        Op::BatchMoments,
    ]);
    let with_usize = (param(), param()).prop_flat_map(|(a, b)| {
        prop::sample::select(vec![
            Op::SwapAdjacent(a),
            Op::ReduceSum(a),
            Op::ReduceMean(a),
            Op::Slice { start: a, len: b },
            Op::CrossEntropy { labels_at: a },
            Op::GatherScalar { index: a },
            Op::GatherRow { index: a },
            Op::GatherScalarRaw { index: a },
            Op::GatherRowRaw { index: a },
            Op::GatherScalarNat { at: a },
            Op::GatherRowNat { at: a },
            Op::GatherScalarsNatVec { at: a, k: b },
            Op::GatherRowsNatVec { at: a, k: b },
            Op::ScatterAddVec { index: a },
            Op::ScatterAddRow { index: a },
            Op::SpectralConv1dRfft { modes: a },
        ])
    });
    let with_float = (float(), float()).prop_flat_map(|(a, b)| {
        prop::sample::select(vec![
            Op::Scale(a),
            Op::Clamp { lo: a, hi: b },
            Op::SafeLog { eps: a },
            Op::LeakyRelu { negative_slope: a },
            Op::Elu { alpha: b },
            Op::LayerNorm { eps: a },
            Op::RmsNorm { eps: a },
            Op::BatchNorm { eps: a },
            Op::Dropout {
                keep: a,
                seed: 1,
                counter: 2,
            },
        ])
    });
    let with_shape = (shape(), float(), any::<u64>()).prop_flat_map(|(s, keep, seed)| {
        prop::sample::select(vec![
            Op::Reshape(s.clone()),
            Op::BroadcastTo(s.clone()),
            Op::RandUniform {
                shape: s.clone(),
                seed,
                counter: 0,
            },
            Op::BernoulliMask {
                shape: s,
                keep,
                seed,
                counter: 1,
            },
        ])
    });
    let windowed = (params(), params(), params(), float()).prop_flat_map(|(k, s, p, beta)| {
        prop::sample::select(vec![
            Op::Conv {
                stride: s.clone(),
                padding: p.clone(),
            },
            Op::ConvTranspose {
                stride: s.clone(),
                padding: p.clone(),
            },
            Op::MaxPool {
                kernel: k.clone(),
                stride: s.clone(),
                padding: p.clone(),
            },
            Op::AvgPool {
                kernel: k.clone(),
                stride: s.clone(),
                padding: p.clone(),
            },
            Op::SmoothMaxPool {
                kernel: k,
                stride: s,
                padding: p,
                beta,
            },
        ])
    });
    let attention = (param(), prop::option::of(mask()), any::<bool>(), mask()).prop_flat_map(
        |(heads, m, fused, m2)| {
            prop::sample::select(vec![
                Op::MaskedSoftmax { mask: m2 },
                Op::MultiHeadAttention {
                    heads,
                    mask: m,
                    fused,
                },
            ])
        },
    );
    let constant = shape().prop_map(|s| match Tensor::<f64>::try_zeros("fuzz", s) {
        Ok(t) => Op::Constant(t),
        Err(_) => Op::Sum,
    });
    prop_oneof![
        3 => simple,
        3 => with_usize,
        2 => with_float,
        2 => with_shape,
        2 => windowed,
        1 => attention,
        1 => constant,
    ]
}

/// A leaf value: a small real tensor, or an empty tensor whose other dims are absurd.
fn leaf() -> impl Strategy<Value = Tensor<f64>> {
    prop_oneof![
        3 => prop::collection::vec(0usize..4, 0..4).prop_map(|d| {
            Tensor::from_fn(Shape::from(d), |i| (i as f64) * 0.37 - 1.0)
        }),
        1 => shape().prop_map(|s| {
            // Keep the shape only when it holds no elements (or few).
            match Tensor::<f64>::try_zeros("fuzz", s.clone()) {
                Ok(t) if t.numel() <= 64 => t,
                _ => {
                    let mut d = s.dims().to_vec();
                    d.push(0);
                    Tensor::new(Shape::from(d), vec![]).expect("a zero dim holds 0 elements")
                }
            }
        }),
    ]
}

/// One application: an op and operand ids (some out of range).
fn application() -> impl Strategy<Value = (Op, Vec<usize>)> {
    (
        op(),
        prop::collection::vec(prop_oneof![9 => 0usize..8, 1 => any::<usize>()], 0..6),
    )
}

#[derive(Debug, Clone)]
struct Case {
    shapes: Vec<Shape>,
    data_len: usize,
    leaves: Vec<Tensor<f64>>,
    apps: Vec<(Op, Vec<usize>)>,
    nats: Vec<usize>,
    opt: (f64, f64, f64, f64, f64, f64),
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(shape(), 1..4),
        0usize..8,
        prop::collection::vec(leaf(), 1..5),
        prop::collection::vec(application(), 1..6),
        prop::collection::vec(param(), 0..4),
        (float(), float(), float(), float(), float(), float()),
    )
        .prop_map(|(shapes, data_len, leaves, apps, nats, opt)| Case {
            shapes,
            data_len,
            leaves,
            apps,
            nats,
            opt,
        })
}

/// Shape and tensor constructors, reshape.
fn constructors(c: &Case) {
    let small = Tensor::<f64>::from_fn([2, 3], |i| i as f64);
    for s in &c.shapes {
        let checked = s.check_size("fuzz");
        assert_eq!(
            checked.is_ok(),
            s.checked_numel().is_some_and(|n| n <= Shape::MAX_NUMEL)
        );
        assert_eq!(
            Shape::try_new("fuzz", s.dims()).is_ok(),
            checked.is_ok(),
            "{s}"
        );
        let data = vec![0.5f32; c.data_len];
        let t = Tensor::new(s.clone(), data);
        assert_eq!(t.is_ok(), s.checked_numel() == Some(c.data_len), "{s}");
        if let Ok(t) = t {
            assert_eq!(t.numel(), c.data_len);
        }
        match small.reshape(s.clone()) {
            Ok(r) => {
                assert_eq!(s.checked_numel(), Some(6), "{s}");
                assert_eq!(r.data(), small.data());
                // Every in-range multi-index reads an element.
                let last: Vec<usize> = s.dims().iter().map(|d| d - 1).collect();
                assert_eq!(r.get(&last), Some(5.0));
            }
            Err(_) => assert_ne!(s.checked_numel(), Some(6), "{s}"),
        }
        let z = Tensor::<f32>::try_zeros("fuzz", s.clone());
        if let Ok(z) = z {
            assert_eq!(z.shape(), s);
            assert!(z.numel() * 4 <= CAP);
        }
    }
}

/// The IR: leaves by shape, nodes by random ops; eval of what got built.
fn graph(c: &Case) {
    let mut b = GraphBuilder::new();
    for s in c.shapes.iter().chain(c.leaves.iter().map(|t| t.shape())) {
        let r = b.leaf(s.clone(), None);
        assert_eq!(r.is_ok(), s.check_size("fuzz").is_ok(), "leaf {s}");
    }
    for (op, args) in &c.apps {
        let n = b.graph().len();
        match b.apply(op.clone(), args) {
            Ok(id) => {
                let shape = b.graph().shape(id).expect("a new id has a shape");
                assert!(shape.check_size("fuzz").is_ok(), "{op:?} gave {shape}");
            }
            Err(e) => {
                assert_eq!(b.graph().len(), n, "a failed apply changed the graph");
                assert!(!e.to_string().is_empty());
            }
        }
    }
    // Again over the case's small leaves, then evaluate and differentiate what got built.
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = c
        .leaves
        .iter()
        .filter_map(|t| b.leaf(t.shape().clone(), None).ok())
        .collect();
    assert_eq!(ids.len(), c.leaves.len());
    for (op, args) in &c.apps {
        let _ = b.apply(op.clone(), args);
    }
    let g = b.finish();
    if let Ok(values) = g.eval(&c.leaves, &c.nats) {
        assert_eq!(values.len(), g.len());
        for (id, v) in values.iter().enumerate() {
            assert_eq!(v.shape(), g.shape(id).expect("an id of the graph"));
        }
        if let Some(last) = values.last() {
            let seed = Tensor::ones(last.shape().clone());
            let _ = g.backprop_all(&c.leaves, &c.nats, g.len() - 1, &seed);
        }
    }
}

/// The CPU tape: apply random ops; values have the promised shapes; backward never panics.
fn cpu_tape(c: &Case) {
    let mut t = Tape::<f32>::new();
    t.set_nats(c.nats.clone());
    for v in &c.leaves {
        t.leaf(v.cast(), None, true);
    }
    for (op, args) in &c.apps {
        let len = t.len();
        match t.apply(op, args) {
            Ok(id) => {
                let shapes: Vec<&Shape> = args.iter().map(|&a| t.get(a).unwrap().shape()).collect();
                let expect = op.infer_shape(&shapes).expect("the tape applied it");
                assert_eq!(t.get(id).unwrap().shape(), &expect, "{op:?}");
            }
            Err(_) => assert_eq!(t.len(), len, "a failed apply changed the tape"),
        }
    }
    let out = t.len() - 1;
    let seed = Tensor::ones(t.get(out).unwrap().shape().clone());
    if let Ok(grads) = t.backward_dense(out, &seed) {
        assert_eq!(grads.len(), t.len());
    }
    let _ = t.backward_dense(out, &Tensor::ones([3, 1, 2]));
    let _ = t.backward_dense(usize::MAX, &seed);
}

/// The CUDA tape on the simulation device.
fn cuda_sim_tape(c: &Case) {
    let mut t = CudaTape::new(SimDevice::new());
    t.set_nats(c.nats.clone());
    for v in &c.leaves {
        // An empty leaf with a dim past the kernel ABI's u32 is refused (an error, not a panic).
        let _ = t.upload_leaf(v, None, true);
    }
    for (op, args) in &c.apps {
        if let Ok(id) = t.apply(op, args) {
            let shapes: Vec<&Shape> = args
                .iter()
                .map(|&a| t.get(a).expect("an operand").shape())
                .collect();
            let expect = op.infer_shape(&shapes).expect("the tape applied it");
            assert_eq!(t.get(id).unwrap().shape(), &expect, "{op:?}");
        }
    }
}

/// Optimizer constructors accept exactly the documented ranges.
fn optimizers(c: &Case) {
    let (lr, m, wd, b1, b2, eps) = c.opt;
    let lr_ok = lr.is_finite() && lr >= 0.0;
    let unit = |v: f64| (0.0..1.0).contains(&v);
    assert_eq!(Optimizer::sgd(lr).is_ok(), lr_ok, "sgd({lr})");
    assert_eq!(Optimizer::adam(lr).is_ok(), lr_ok, "adam({lr})");
    assert_eq!(Optimizer::adamw(lr).is_ok(), lr_ok, "adamw({lr})");
    assert_eq!(
        Optimizer::momentum(lr, m).is_ok(),
        lr_ok && unit(m),
        "momentum({lr}, {m})"
    );
    if let Ok(o) = Optimizer::sgd(0.1) {
        assert_eq!(
            o.weight_decay(wd).is_ok(),
            wd.is_finite() && wd >= 0.0,
            "wd {wd}"
        );
    }
    let adam = Optimizer::adam(0.1).expect("valid");
    assert_eq!(
        adam.betas_eps(b1, b2, eps).is_ok(),
        unit(b1) && unit(b2) && eps.is_finite() && eps > 0.0,
        "betas ({b1}, {b2}), eps {eps}"
    );
}

fn run_case(c: &Case) {
    constructors(c);
    graph(c);
    cpu_tape(c);
    cuda_sim_tape(c);
    optimizers(c);
}

/// The fuzz body, run by [`fuzz_in_a_child_process_exits_cleanly`] in a child process (it does
/// nothing elsewhere, so that it never lowers the allocation cap of the other tests): every case
/// under `catch_unwind`; the panicking cases are reported together. Each case's index goes to
/// stderr before it runs, so a case that hangs or aborts is named by the last line.
#[test]
#[ignore = "run in a child process by fuzz_in_a_child_process_exits_cleanly"]
fn fuzz_cases_in_this_process() {
    if std::env::var_os(CHILD_VAR).is_none() {
        eprintln!(
            "not in the fuzz child process: nothing to do (see fuzz_in_a_child_process_exits_cleanly)"
        );
        return;
    }
    assert_eq!(
        tl_spec::alloc::max_alloc_bytes(),
        CAP,
        "the child runs under the lowered allocation cap"
    );
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed().to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let only: Option<u32> = env("TL_FUZZ_ONLY");
    let mut panics: Vec<String> = Vec::new();
    let mut ran = 0u32;
    let mut slowest = (std::time::Duration::ZERO, 0u32);
    let strategy = case();
    for i in 0..cases() {
        let c = strategy
            .new_tree(&mut runner)
            .expect("strategy generates")
            .current();
        if only.is_some_and(|o| o != i) {
            continue;
        }
        eprintln!("fuzz case {i}");
        ran += 1;
        let start = std::time::Instant::now();
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| run_case(&c))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panics.push(format!("case {i}: {msg}\n  case: {c:?}"));
        }
        slowest = slowest.max((start.elapsed(), i));
    }
    assert_eq!(ran, if only.is_some() { 1 } else { cases() });
    // Read by the parent: the number of cases this child ran.
    println!(
        "fuzz cases run: {ran}; slowest: case {} in {:?}",
        slowest.1, slowest.0
    );
    assert!(
        panics.is_empty(),
        "{} of {ran} cases panicked:\n{}",
        panics.len(),
        panics.join("\n\n")
    );
}

/// No panic and no abort: the fuzz cases in a child process (this test binary filtered to
/// [`fuzz_cases_in_this_process`]) under a 64 MiB allocation cap, which must exit successfully
/// within `TL_FUZZ_TIMEOUT_S` seconds, having run every case.
#[test]
fn fuzz_in_a_child_process_exits_cleanly() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    if std::env::var_os(CHILD_VAR).is_some() {
        return; // never recurse
    }
    // The test's path as libtest names it: this module's path without the crate.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!("{module}::fuzz_cases_in_this_process");
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([
            name.as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env("TL_MAX_ALLOC_BYTES", CAP.to_string())
        .env("TL_FUZZ_CASES", cases().to_string())
        .env("TL_FUZZ_SEED", seed().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let limit = Duration::from_secs(env("TL_FUZZ_TIMEOUT_S").unwrap_or(600));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().expect("stdout reader");
    let stderr = err.join().expect("stderr reader");
    let last = stderr.lines().rev().find(|l| l.starts_with("fuzz case "));
    let Some(status) = status else {
        panic!(
            "the fuzz child ran past {limit:?}; the last case started: {last:?} (rerun it with TL_FUZZ_ONLY)\nstderr:\n{stderr}"
        );
    };
    assert!(
        status.success(),
        "the fuzz child exited with {status:?}; the last case started: {last:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let expected = match env::<u32>("TL_FUZZ_ONLY") {
        Some(_) => 1,
        None => cases(),
    };
    assert!(
        stdout.contains(&format!("fuzz cases run: {expected};")),
        "the child did not run {expected} fuzz cases:\n{stdout}"
    );
    println!(
        "{}",
        stdout
            .lines()
            .find(|l| l.contains("fuzz cases run"))
            .unwrap_or("")
    );
}
