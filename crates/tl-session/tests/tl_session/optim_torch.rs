//! Trajectories against real PyTorch: RMSprop (plain, momentum + weight decay, centered,
//! centered + momentum), Adagrad (defaults; lr_decay, weight decay, initial accumulator, eps),
//! and the training controls inside the step — clipping by global norm (L2, L1, ∞, the value
//! `clip_grad_norm_` returns), by value, and a warm-up + cosine schedule — each compared after
//! every step with `torch.optim` on the same problem (fixtures/make_optimizers.py writes
//! fixtures/optimizers.txt). On the eager CPU session and the linked session in f64
//! (≤ 1e-10 relative) and on the eager CPU session, the CUDA sim and the linked session on the
//! CUDA sim in f32 (≤ 1e-4).

use std::collections::BTreeMap;

use tl_session::{
    Backend, LinkedSession, Ops, Optimizer, Options, Param, Schedule, Session, Train,
};
use tl_spec::{Scalar, Tensor};

/// One line of the fixture: the gradient norm PyTorch's clipping returned (NaN: none) and the
/// parameters after the step, `w1` then `w2`.
struct Row {
    norm: f64,
    values: Vec<f64>,
}

fn fixtures() -> BTreeMap<String, Vec<Row>> {
    let text = include_str!("../fixtures/optimizers.txt");
    let mut out: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<f64>().unwrap();
        let row = Row {
            norm: num(f[2]),
            values: f[3..].iter().map(|s| num(s)).collect(),
        };
        let rows = out.entry(f[0].to_owned()).or_default();
        assert_eq!(rows.len(), f[1].parse::<usize>().unwrap(), "{line}");
        rows.push(row);
    }
    out
}

/// The library's optimizer for each fixture config (as make_optimizers.py builds PyTorch's).
fn optimizer(name: &str) -> Optimizer {
    let o = match name {
        "rmsprop" => Optimizer::rmsprop(0.01),
        "rmsprop_momentum_wd" => Optimizer::rmsprop(0.02)
            .and_then(|o| o.rmsprop_options(0.99, 1e-8, 0.9, false))
            .and_then(|o| o.weight_decay(0.1)),
        "rmsprop_centered" => {
            Optimizer::rmsprop(0.01).and_then(|o| o.rmsprop_options(0.9, 1e-6, 0.0, true))
        }
        "rmsprop_centered_momentum" => Optimizer::rmsprop(0.005)
            .and_then(|o| o.rmsprop_options(0.95, 1e-8, 0.5, true))
            .and_then(|o| o.weight_decay(0.05)),
        "adagrad" => Optimizer::adagrad(0.1),
        "adagrad_options" => Optimizer::adagrad(0.2)
            .and_then(|o| o.adagrad_options(0.05, 1e-8, 0.3))
            .and_then(|o| o.weight_decay(0.1)),
        "momentum_clip_norm" => {
            Optimizer::momentum(0.1, 0.9).and_then(|o| o.clip_grad_norm(0.5, 2.0))
        }
        "adamw_clip_value_inf_norm" => Optimizer::adamw(0.05)
            .and_then(|o| o.clip_grad_value(0.3))
            .and_then(|o| o.clip_grad_norm(0.2, f64::INFINITY)),
        "sgd_clip_l1_norm" => Optimizer::sgd(0.1).and_then(|o| o.clip_grad_norm(0.8, 1.0)),
        "adam_cosine_warmup_clip" => Optimizer::adam(0.1)
            .and_then(|o| o.weight_decay(0.01))
            .and_then(|o| o.clip_grad_norm(1.0, 2.0))
            .and_then(|o| o.schedule(Schedule::cosine_warmup(3, 0.2, 5, 0.01)?)),
        other => panic!("no optimizer for fixture config {other}"),
    };
    o.unwrap()
}

fn params<S: Ops>(s: &mut S) -> Vec<Param> {
    let t = |v: &[f64]| Tensor::vector(v.iter().map(|&x| S::T::lit(x)).collect());
    vec![
        s.param(t(&[0.5, -1.2, 0.3, 2.0]), Some("w1"), true)
            .unwrap(),
        s.param(t(&[-0.7, 0.4, 1.1]), Some("w2"), true).unwrap(),
    ]
}

/// `L = Σ tanh(w1·a1)·c1 + Σ w2·w2·a2 · (1 + k/4)`, as make_optimizers.py writes it.
fn loss<S: Ops>(s: &mut S, p: &[Param], k: usize) -> tl_session::TensorRef {
    let t = |v: &[f64]| Tensor::vector(v.iter().map(|&x| S::T::lit(x)).collect());
    let w1 = s.use_param(&p[0]).unwrap();
    let w2 = s.use_param(&p[1]).unwrap();
    let a1 = s.input(t(&[1.5, -0.5, 2.0, 0.8]), false).unwrap();
    let c1 = s.input(t(&[1.0, -2.0, 0.5, 3.0]), false).unwrap();
    let a2 = s
        .input(
            t(&[0.6, -1.1, 0.9].map(|v| v * (1.0 + 0.25 * k as f64))),
            false,
        )
        .unwrap();
    let x = s.mul(&w1, &a1).unwrap();
    let x = s.tanh(&x).unwrap();
    let x = s.mul(&x, &c1).unwrap();
    let l1 = s.sum(&x).unwrap();
    let y = s.mul(&w2, &w2).unwrap();
    let y = s.mul(&y, &a2).unwrap();
    let l2 = s.sum(&y).unwrap();
    s.add(&l1, &l2).unwrap()
}

/// Run `rows.len()` training steps through `Train::backward_step` and compare after each.
fn check<S: Train>(mut s: S, what: &str, name: &str, rows: &[Row], tol: f64) {
    let p = params(&mut s);
    let mut opt = optimizer(name);
    for (k, row) in rows.iter().enumerate() {
        let l = loss(&mut s, &p, k);
        s.backward_step(&l, &mut opt).unwrap();
        s.reset();
        let got: Vec<f64> = p
            .iter()
            .flat_map(|q| s.param_value(q).unwrap().data().to_vec())
            .map(|v| v.as_f64())
            .collect();
        for (i, (&g, &w)) in got.iter().zip(&row.values).enumerate() {
            assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "{what} {name} step {k} value {i}: got {g}, PyTorch {w}"
            );
        }
        let stats = opt.last_step().unwrap();
        assert_eq!(stats.step, k as u64);
        match stats.grad_norm {
            Some(n) => assert!(
                (n - row.norm).abs() <= tol * row.norm.abs().max(1.0),
                "{what} {name} step {k}: grad norm {n}, PyTorch {}",
                row.norm
            ),
            None => assert!(row.norm.is_nan(), "{what} {name}: no norm reported"),
        }
    }
}

fn linked<T: Scalar>(backend: Backend) -> LinkedSession<T> {
    let mut s = LinkedSession::<T>::new();
    s.set_backend(backend).unwrap();
    s
}

#[test]
fn rmsprop_adagrad_and_the_step_controls_follow_pytorch() {
    let all = fixtures();
    assert_eq!(all.len(), 10, "every config of make_optimizers.py");
    for (name, rows) in &all {
        let sess = |b| Session::<f64>::new(Options::backend(b)).unwrap();
        check(sess(Backend::Cpu), "cpu f64", name, rows, 1e-10);
        check(linked::<f64>(Backend::Cpu), "linked f64", name, rows, 1e-10);
        let sess32 = |b| Session::<f32>::new(Options::backend(b)).unwrap();
        check(sess32(Backend::Cpu), "cpu f32", name, rows, 1e-4);
        check(sess32(Backend::CudaSim), "cuda-sim f32", name, rows, 1e-4);
        check(
            linked::<f32>(Backend::CudaSim),
            "linked sim f32",
            name,
            rows,
            1e-4,
        );
    }
}

/// The comparison has teeth: a neighbouring rule (RMSprop not centered, Adagrad without
/// lr_decay, no clipping) misses PyTorch's trajectory.
#[test]
fn the_torch_comparison_tells_neighbouring_rules_apart() {
    let all = fixtures();
    let run = |name: &str, opt: Optimizer| {
        let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
        let p = params(&mut s);
        let mut opt = opt;
        let rows = &all[name];
        for k in 0..rows.len() {
            let l = loss(&mut s, &p, k);
            s.backward_step(&l, &mut opt).unwrap();
            s.reset();
        }
        let got: Vec<f64> = p
            .iter()
            .flat_map(|q| s.param_value(q).unwrap().data().to_vec())
            .collect();
        let want = &rows.last().unwrap().values;
        got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-10)
    };
    assert!(run("rmsprop_centered", optimizer("rmsprop_centered")));
    let not_centered = Optimizer::rmsprop(0.01)
        .and_then(|o| o.rmsprop_options(0.9, 1e-6, 0.0, false))
        .unwrap();
    assert!(!run("rmsprop_centered", not_centered));
    let no_decay = Optimizer::adagrad(0.2)
        .and_then(|o| o.adagrad_options(0.0, 1e-8, 0.3))
        .and_then(|o| o.weight_decay(0.1))
        .unwrap();
    assert!(!run("adagrad_options", no_decay));
    assert!(!run(
        "momentum_clip_norm",
        Optimizer::momentum(0.1, 0.9).unwrap()
    ));
}
