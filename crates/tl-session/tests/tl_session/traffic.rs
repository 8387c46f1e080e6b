//! GPU cost proxies per training step ([`tl_tape_cuda::Traffic`]): kernel launches and
//! host↔device copies, counted on the simulation device and, with `--features cuda-emu`, by the
//! CUDA device's own launch code over the emulated kernels. The figures for the bench models
//! are printed by `cargo run --release -p tl-session --example gpu_proxies` (docs/performance.md).

use crate::common::mlp::{Mlp, regression_grid};
use tl_session::{Backend, LinkedSession, Ops, Optimizer, Options, Session, Train};
use tl_spec::Tensor;
use tl_tape_cuda::Traffic;

/// The MLP 2-16-1 (4 parameters) on the 36-point regression grid (inputs x and y).
const PARAMS: u64 = 4;
const PARAM_ELEMENTS: u64 = 2 * 16 + 16 + 16 + 1;
const INPUT_ELEMENTS: u64 = 36 * 2 + 36;

/// The traffic of steps 3..=5 of `step` (one training step) in `s`.
fn traffic_of<S: Train<T = f32>>(s: &mut S, mut step: impl FnMut(&mut S)) -> Vec<Traffic> {
    let mut out = Vec::new();
    let mut before = Traffic::default();
    for k in 0..5 {
        step(s);
        let now = s.traffic().expect("a CUDA backend counts its traffic");
        if k >= 2 {
            out.push(now - before);
        }
        before = now;
    }
    out
}

/// The traffic of steps 3..=5 of an SGD run of the MLP in `s`.
fn steps<S: Train<T = f32>>(mut s: S) -> Vec<Traffic> {
    let (x, y) = regression_grid::<f32>(6);
    let mlp = Mlp::new(&mut s, &[2, 16, 1], 7).unwrap();
    let mut opt = Optimizer::sgd(0.05).unwrap();
    traffic_of(&mut s, |s| {
        Train::reset(s);
        let loss = mlp.loss(s, x.clone(), y.clone()).unwrap();
        s.backward_step(&loss, &mut opt).unwrap();
    })
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
        assert!(run[0].launches > 10, "{name}: {:?}", run[0]);
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

/// A classifier's step copies its labels to the device once: the cross-entropy forward keeps
/// them as the node's workspace and its backward reads them there (before, each uploaded its
/// own copy). Steps 3..=5 of a linear classifier (8 rows, 3 features, 4 classes): two uploads
/// (the batch and the labels), the loss read back, the same work every step.
#[test]
fn a_classifier_step_uploads_its_labels_once() {
    use tl_spec::Tensor;
    fn run<S: Train<T = f32>>(mut s: S) -> Vec<Traffic> {
        let w = s.param(
            Tensor::from_fn([4, 3], |i| 0.1 * i as f32 - 0.5),
            None,
            true,
        );
        let b = s.param(Tensor::zeros([4]), None, true);
        let (w, b) = (w.unwrap(), b.unwrap());
        let x = Tensor::<f32>::from_fn([8, 3], |i| (i as f32 * 0.37).sin());
        let labels: Vec<usize> = (0..8).map(|i| i % 4).collect();
        let mut opt = Optimizer::sgd(0.1).unwrap();
        traffic_of(&mut s, |s| {
            Train::reset(s);
            let at = s.record_nat_vec(&labels).pos();
            let (wr, br) = (s.use_param(&w).unwrap(), s.use_param(&b).unwrap());
            let xr = s.input(x.clone(), false).unwrap();
            let logits = s.linear(&wr, &br, &xr).unwrap();
            let loss = s.cross_entropy(&logits, at).unwrap();
            s.backward_step(&loss, &mut opt).unwrap();
        })
    }
    let mut linked = LinkedSession::<f32>::new();
    linked.set_backend(Backend::CudaSim).unwrap();
    for (name, t) in [
        (
            "eager",
            run(Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap()),
        ),
        ("linked", run(linked)),
    ] {
        assert!(t.iter().all(|s| *s == t[0]), "{name}: {t:?}");
        assert_eq!(
            (t[0].uploads, t[0].upload_bytes),
            (2, 4 * (8 * 3 + 8)),
            "{name}: the batch and the labels, once"
        );
        assert_eq!((t[0].downloads, t[0].download_bytes), (1, 4), "{name}");
    }
}

/// A plain SGD step updates the parameters in one launch per eight (PyTorch's `foreach` SGD),
/// with the values of one update per parameter: the parameters after two steps equal, bit for
/// bit, those of the same steps taken parameter by parameter (the finite check's path, which
/// commits the same values). Momentum steps parameter by parameter at its first step (which
/// makes its buffers), then in the list launches of momentum SGD.
#[test]
fn a_plain_sgd_step_takes_one_launch_per_eight_parameters() {
    let (x, y) = regression_grid::<f32>(4);
    for (widths, lists) in [(&[2, 16, 1][..], 1), (&[2, 8, 8, 8, 8, 8, 1][..], 2)] {
        let params = 2 * (widths.len() as u64 - 1);
        let mut values = Vec::new();
        for (opt, steps) in [
            (
                Optimizer::sgd(0.05).unwrap(),
                [lists..=lists, lists..=lists],
            ),
            (
                Optimizer::sgd(0.05).unwrap().check_finite(true),
                [params..=u64::MAX, params..=u64::MAX],
            ),
            // At least one launch per parameter (its buffer, then the update), then the lists.
            (
                Optimizer::momentum(0.05, 0.9).unwrap(),
                [params..=u64::MAX, lists..=lists],
            ),
        ] {
            let mut opt = opt;
            let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
            let mlp = Mlp::new(&mut s, widths, 3).unwrap();
            for launches in steps {
                s.reset();
                let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
                s.backward(&loss).unwrap();
                let before = s.traffic().unwrap();
                s.step(&mut opt).unwrap();
                let got = (s.traffic().unwrap() - before).launches;
                assert!(launches.contains(&got), "{widths:?} {}: {got}", opt.name());
            }
            let w: Vec<Vec<u32>> = (mlp.layers.iter())
                .flat_map(|(w, b)| [w, b])
                .map(|p| {
                    s.param_value(p)
                        .unwrap()
                        .data()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect();
            values.push(w);
        }
        assert_eq!(
            values[0], values[1],
            "one launch per list against one per parameter"
        );
        assert_ne!(values[0], values[2], "momentum takes other steps");
    }
}

/// Adam, AdamW and momentum SGD (after its first step) update up to eight parameters in one
/// launch (`Device::adam_update_list`, `Device::momentum_update_list`; PyTorch's multi-tensor
/// `foreach` Adam and SGD): ten parameters take two launches, where the rule composed from
/// the primitives takes one launch per operation: 12 a parameter for Adam(W), 4 for momentum
/// SGD, 5 for Nesterov's. With clipping (not in the lists), the clipped gradient feeds one
/// launch a parameter. The same bits either way.
#[test]
fn adam_and_momentum_steps_take_one_launch_per_eight_parameters() {
    let (x, y) = regression_grid::<f32>(4);
    let widths = [2, 8, 8, 8, 8, 1];
    let params = 2 * (widths.len() as u64 - 1);
    let optimizers = || {
        [
            Optimizer::adamw(1e-2).unwrap(),
            Optimizer::adam(1e-2).unwrap().weight_decay(0.01).unwrap(),
            Optimizer::momentum(0.05, 0.9).unwrap(),
            Optimizer::momentum(0.05, 0.9)
                .unwrap()
                .dampening_nesterov(0.0, true)
                .unwrap(),
            Optimizer::adamw(1e-2)
                .unwrap()
                .clip_grad_norm(0.5, 2.0)
                .unwrap(),
            Optimizer::momentum(0.05, 0.9)
                .unwrap()
                .clip_grad_value(0.05)
                .unwrap(),
        ]
    };
    // (launches of the third step, parameter bits after it) for each optimizer.
    let run = |fused: bool| {
        let _gate = tl_tape_cuda::gates::force_fused_optimizer(Some(fused));
        optimizers().map(|mut opt| {
            let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
            let mlp = Mlp::new(&mut s, &widths, 3).unwrap();
            let mut launches = 0;
            for _ in 0..3 {
                s.reset();
                let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
                s.backward(&loss).unwrap();
                let before = s.traffic().unwrap();
                s.step(&mut opt).unwrap();
                launches = (s.traffic().unwrap() - before).launches;
            }
            let bits: Vec<Vec<u32>> = (mlp.layers.iter())
                .flat_map(|(w, b)| [w, b])
                .map(|p| {
                    let v = s.param_value(p).unwrap();
                    v.data().iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            (opt.name(), launches, bits)
        })
    };
    let (fused, composed) = (run(true), run(false));
    // The rule's launches a parameter when composed (the clipped ones besides the clipping).
    let per_param = [12, 12, 4, 5, 11, 3];
    assert_eq!(params, 10);
    for (k, ((f, c), per)) in fused.iter().zip(&composed).zip(per_param).enumerate() {
        if k < 4 {
            assert_eq!(f.1, 2, "{}: one launch per eight parameters", f.0);
            assert_eq!(c.1, per * params, "{}: composed", c.0);
        } else {
            assert_eq!(c.1 - f.1, (per - 1) * params, "{}: clipped", c.0);
        }
        assert_eq!(f.2, c.2, "{}: fused and composed steps differ", f.0);
    }
}

/// An Adam list launch keeps each parameter's own step count: parameter 2, left out of the
/// first pass, steps one behind the others (its bias corrections those of its own step, as
/// PyTorch counts steps per parameter) and still shares their launch; parameter 3, used twice
/// (its gradients summed first), steps on its own beside the list. The bits and the step
/// counts equal the composed rule's.
#[test]
fn adam_lists_keep_each_parameters_own_step_count() {
    let run = |fused: bool| {
        let _gate = tl_tape_cuda::gates::force_fused_optimizer(Some(fused));
        let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
        let ps: Vec<_> = (0..4)
            .map(|k| {
                let w = vec![0.5 - 0.3 * k as f32, 1.25, -0.75];
                s.param(Tensor::vector(w), None, true).unwrap()
            })
            .collect();
        let mut opt = Optimizer::adamw(0.1).unwrap();
        let mut launches = Vec::new();
        for step in 0..3 {
            s.reset();
            let mut total = None;
            for (k, p) in ps.iter().enumerate() {
                if step == 0 && k == 2 {
                    continue;
                }
                for _ in 0..(if k == 3 { 2 } else { 1 }) {
                    let w = s.use_param(p).unwrap();
                    let c = vec![1.0 + k as f32, -0.5, 0.25 + step as f32];
                    let c = s.input(Tensor::vector(c), false).unwrap();
                    let y = s.mul(&w, &c).unwrap();
                    let l = s.sum(&y).unwrap();
                    total = Some(match total {
                        None => l,
                        Some(t) => s.add(&t, &l).unwrap(),
                    });
                }
            }
            s.backward(&total.unwrap()).unwrap();
            let before = s.traffic().unwrap();
            s.step(&mut opt).unwrap();
            launches.push((s.traffic().unwrap() - before).launches);
        }
        let bits: Vec<Vec<u32>> = (ps.iter())
            .map(|p| {
                let v = s.param_value(p).unwrap();
                v.data().iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        // Every state tensor (step counts, moments) by name, as bits.
        let state: Vec<(String, Vec<u64>)> = (s.optimizer_state(&opt).unwrap().into_iter())
            .map(|(k, t)| (k, t.data().iter().map(|v| v.to_bits()).collect()))
            .collect();
        (launches, bits, state)
    };
    let (fused, composed) = (run(true), run(false));
    // Each step: one list launch, parameter 3's own step (its first gradient copied, the
    // second added, then its update), and two zero fills (Adam's moments) for each parameter
    // at its first step: three at the first, parameter 2 at the second.
    assert_eq!(fused.0, [1 + 3 + 2 * 3, 1 + 3 + 2, 1 + 3], "fused launches");
    assert_eq!(fused.1, composed.1, "fused and composed steps differ");
    assert_eq!(fused.2, composed.2, "the optimizer's state");
    let steps: Vec<f64> = (0..4)
        .map(|k| {
            let (_, b) = (fused.2.iter())
                .find(|(name, _)| *name == format!("adamw.step.{k}"))
                .expect("a step count per parameter");
            f64::from_bits(b[0])
        })
        .collect();
    assert_eq!(
        steps,
        [3.0, 3.0, 2.0, 3.0],
        "each parameter's own step count"
    );
}

/// A parameter used twice in a plain SGD step is summed and updated on its own; the others
/// still share one launch. Values equal the per-parameter path's bit for bit: `w` after the
/// step is `w − lr·2wx` and `v` is `v − lr·1`.
#[test]
fn a_parameter_used_twice_steps_on_its_own_beside_the_list() {
    use tl_session::Ops;
    let mut results = Vec::new();
    for opt in [
        Optimizer::sgd(0.5).unwrap(),
        Optimizer::sgd(0.5).unwrap().check_finite(true),
    ] {
        let mut opt = opt;
        let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
        let p = s.param(tl_spec::Tensor::vector(vec![1.0, 2.0]), None, true);
        let q = s.param(tl_spec::Tensor::vector(vec![0.25, -4.0]), None, true);
        let (p, q) = (p.unwrap(), q.unwrap());
        let (w, w2, v) = (s.use_param(&p), s.use_param(&p), s.use_param(&q));
        let (w, w2, v) = (w.unwrap(), w2.unwrap(), v.unwrap());
        let x = s
            .input(tl_spec::Tensor::vector(vec![3.0, -1.0]), false)
            .unwrap();
        let wx = s.mul(&w, &x).unwrap();
        let wwx = s.mul(&wx, &w2).unwrap();
        let y = s.add(&wwx, &v).unwrap();
        let loss = s.sum(&y).unwrap();
        s.backward(&loss).unwrap();
        let before = s.traffic().unwrap();
        s.step(&mut opt).unwrap();
        let launches = (s.traffic().unwrap() - before).launches;
        let (pw, qv) = (s.param_value(&p).unwrap(), s.param_value(&q).unwrap());
        assert_eq!(pw.data(), &[1.0 - 0.5 * 6.0, 2.0 - 0.5 * -4.0]);
        assert_eq!(qv.data(), &[0.25 - 0.5, -4.0 - 0.5]);
        results.push(launches);
    }
    // The list path: p's gradients summed (a copy and an add) and its update, then q's list.
    assert_eq!(results[0], 4, "plain SGD launches");
    assert!(results[1] > results[0], "the per-parameter path takes more");
}

/// The eager session's training step on a device takes the tape's sparse backward
/// (`backward_step`): the parameters after three steps are bit for bit those of `backward` +
/// `step`, with fewer launches (the residual's cotangent is shared, not copied) and fewer pool
/// allocations; a parameter's gradient is readable afterwards as after `backward`, a hidden
/// tensor's is an error that says how to keep it.
#[test]
fn the_eager_device_step_keeps_the_parameters_gradients_only_with_the_same_bits() {
    fn value(rows: usize, cols: usize, k: f32) -> tl_spec::Tensor<f32> {
        tl_spec::Tensor::from_fn([rows, cols], |i| ((i as f32 + k) * 0.37).sin())
    }
    // y = sum(h + linear(relu(linear(h)))) with h = linear(x): a residual block.
    let run = |sparse: bool| {
        let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
        let shapes = [(4, 3), (1, 4), (4, 4), (1, 4), (4, 4), (1, 4)];
        let params: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(k, &(r, c))| {
                let v = value(r, c, k as f32);
                let v = if r == 1 { v.reshape([c]).unwrap() } else { v };
                s.param(v, None, true).unwrap()
            })
            .collect();
        let mut opt = Optimizer::sgd(0.1).unwrap();
        let mut launches = Vec::new();
        let mut grad = None;
        for _ in 0..3 {
            Train::reset(&mut s);
            let before = s.traffic().unwrap();
            let allocs = s.memory_usage().unwrap().alloc_count;
            let p: Vec<_> = params.iter().map(|p| s.use_param(p).unwrap()).collect();
            let x = s.input(value(5, 3, 9.0), false).unwrap();
            let h = s.linear(&p[0], &p[1], &x).unwrap();
            let a = s.linear(&p[2], &p[3], &h).unwrap();
            let a = s.relu(&a).unwrap();
            let b = s.linear(&p[4], &p[5], &a).unwrap();
            let y = s.add(&h, &b).unwrap();
            let loss = s.sum(&y).unwrap();
            if sparse {
                s.backward_step(&loss, &mut opt).unwrap();
                let e = s.grad_of(&a).unwrap_err().to_string();
                assert!(e.contains("grad") && e.contains("backward"), "{e}");
            } else {
                s.backward(&loss).unwrap();
                s.step(&mut opt).unwrap();
            }
            let work = (
                (s.traffic().unwrap() - before).launches,
                s.memory_usage().unwrap().alloc_count - allocs,
            );
            launches.push(work);
            grad = Some(s.grad(&params[0]).unwrap());
        }
        let values: Vec<Vec<u32>> = params
            .iter()
            .map(|p| {
                let v = s.param_value(p).unwrap();
                v.data().iter().map(|x| x.to_bits()).collect()
            })
            .collect();
        let g = grad
            .unwrap()
            .data()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>();
        (values, g, launches[2])
    };
    let (dense, dense_grad, (dense_launches, dense_allocs)) = run(false);
    let (sparse, sparse_grad, (sparse_launches, sparse_allocs)) = run(true);
    assert_eq!(sparse, dense, "parameters after three steps");
    assert_eq!(sparse_grad, dense_grad, "the first weight's gradient");
    assert!(
        sparse_launches < dense_launches && sparse_allocs < dense_allocs,
        "sparse {sparse_launches} launches, {sparse_allocs} allocations; dense {dense_launches}, {dense_allocs}"
    );
}

/// One linked pass on the sim: `b = exp(w)·w`, `y = sum(tanh(b)) + b[2]` (the index a Nat
/// recorded after the first read), read after the product and after the sum when `reads`,
/// then an SGD step. The launches and downloads of the pass, the values
/// read, the loss, and the parameter before and after the step.
fn pass_with_reads(reads: bool) -> (Traffic, Vec<Vec<f32>>, f64, [Vec<f32>; 2]) {
    let mut s = LinkedSession::<f32>::new();
    s.set_backend(Backend::CudaSim).unwrap();
    let p = s
        .param(Tensor::vector(vec![0.5, -1.0, 2.0]), Some("w"), true)
        .unwrap();
    let mut opt = Optimizer::sgd(0.1).unwrap();
    // A first step makes the kept device (its counters start there).
    for _ in 0..2 {
        Train::reset(&mut s);
        let w = s.use_param(&p).unwrap();
        let loss = s.sum(&w).unwrap();
        s.backward_step(&loss, &mut opt).unwrap();
    }
    let w0 = s.param_value(&p).unwrap().data().to_vec();
    let before = s.traffic().unwrap();
    Train::reset(&mut s);
    let w = s.use_param(&p).unwrap();
    let b = s.exp(&w).and_then(|a| s.mul(&a, &w)).unwrap();
    let mut got = Vec::new();
    if reads {
        got.push(Train::read(&mut s, &b).unwrap().data().to_vec());
    }
    let i = s.record_nat(2);
    let pick = s.gather_scalar_nat(&b, i.pos()).unwrap();
    let loss = s
        .tanh(&b)
        .and_then(|c| s.sum(&c))
        .and_then(|t| s.add(&t, &pick))
        .unwrap();
    if reads {
        got.push(Train::read(&mut s, &loss).unwrap().data().to_vec());
    }
    let l = s.backward_step(&loss, &mut opt).unwrap();
    let after = s.traffic().unwrap();
    let w1 = s.param_value(&p).unwrap().data().to_vec();
    (after - before, got, l, [w0, w1])
}

/// A read during a linked pass compiles the graph so far and keeps the tape for the pass: the
/// next read and the step replay only the nodes recorded since, so the pass launches what it
/// launches without reads (batch norm's running-statistics update compiles the pass so far
/// the same way, once per layer; each used to replay the pass from its start). The values read, the loss and the step are those of the plain pass.
#[test]
fn reads_during_a_linked_pass_replay_only_what_is_new() {
    let (plain, _, l0, w0) = pass_with_reads(false);
    let (read, got, l1, w1) = pass_with_reads(true);
    assert_eq!(read.launches, plain.launches, "{read:?} vs {plain:?}");
    assert_eq!(read.downloads, plain.downloads + 2, "{read:?} vs {plain:?}");
    let b: Vec<f32> = w0[0].iter().map(|&x| x.exp() * x).collect();
    for (g, want) in got[0].iter().zip(&b) {
        assert!((g - want).abs() <= 1e-6 * want.abs().max(1.0), "{got:?}");
    }
    assert_eq!(f64::from(got[1][0]), l0);
    assert_eq!((l1, &w1), (l0, &w0));
}
