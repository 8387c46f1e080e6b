//! Optimizer state export/import: k steps, export the parameters and the optimizer state,
//! a fresh session and a fresh optimizer, import, n more steps == k + n straight steps, bit
//! for bit, for SGD, momentum SGD (with dampening and Nesterov), Adam, AdamW, RMSprop
//! (momentum, centered), Adagrad, and AdamW with a schedule and clipping (the schedule's
//! position travels in the state), in the eager CPU and CUDA-sim sessions and the linked
//! session. And state that is not finite, out of the rule's domain or with an absurd step
//! count is refused before anything changes (issue 37, point 4). The state carries the rule's
//! hyper-parameters: a resume into an optimizer built with other values takes the saved ones.

use tl_session::optim::StateDict;
use tl_session::{Backend, Error, LinkedSession, Ops, Optimizer, Options, Param, Session};
use tl_spec::{Scalar, Tensor};

fn optimizers() -> Vec<(&'static str, Optimizer)> {
    vec![
        ("sgd", Optimizer::sgd(0.1).unwrap()),
        (
            "momentum",
            Optimizer::momentum(0.1, 0.9)
                .unwrap()
                .weight_decay(0.01)
                .unwrap(),
        ),
        (
            "nesterov",
            Optimizer::momentum(0.05, 0.8)
                .unwrap()
                .dampening_nesterov(0.1, true)
                .unwrap(),
        ),
        (
            "adam",
            Optimizer::adam(0.05).unwrap().weight_decay(0.02).unwrap(),
        ),
        ("adamw", Optimizer::adamw(0.05).unwrap()),
        ("rmsprop", Optimizer::rmsprop(0.01).unwrap()),
        (
            "rmsprop_centered_momentum",
            Optimizer::rmsprop(0.01)
                .and_then(|o| o.rmsprop_options(0.9, 1e-6, 0.5, true))
                .and_then(|o| o.weight_decay(0.01))
                .unwrap(),
        ),
        (
            "adagrad",
            Optimizer::adagrad(0.1)
                .and_then(|o| o.adagrad_options(0.1, 1e-10, 0.2))
                .unwrap(),
        ),
        (
            "adamw_schedule_clip",
            Optimizer::adamw(0.05)
                .and_then(|o| o.schedule(tl_session::Schedule::exponential(0.8)?))
                .and_then(|o| o.clip_grad_norm(0.3, 2.0))
                .and_then(|o| o.clip_grad_value(0.5))
                .unwrap(),
        ),
    ]
}

/// `opt` with every hyper-parameter of its rule changed (the learning rate, the weight decay and
/// the rule's own, keeping which buffers it holds): loading a state into it must put the
/// state's values back.
fn perturbed(opt: &Optimizer) -> Optimizer {
    use tl_session::optim::Kind;
    let mut o = opt.clone();
    o.lr *= 3.0;
    o.weight_decay += 0.03;
    o.kind = match o.kind {
        Kind::Sgd {
            momentum,
            dampening,
            nesterov,
        } => Kind::Sgd {
            momentum: momentum * 0.5,
            dampening: if nesterov { dampening } else { 0.5 },
            nesterov,
        },
        Kind::Adam { decoupled, .. } => Kind::Adam {
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-3,
            decoupled,
        },
        Kind::RmsProp {
            momentum, centered, ..
        } => Kind::RmsProp {
            alpha: 0.7,
            eps: 1e-3,
            momentum: momentum * 0.5,
            centered,
        },
        Kind::Adagrad { .. } => Kind::Adagrad {
            lr_decay: 0.3,
            eps: 1e-3,
            initial_accumulator_value: 0.05,
        },
    };
    o.validate().unwrap();
    assert_ne!(o.hyper_parameters(), opt.hyper_parameters());
    o
}

/// Parameters `w` (named), `b` (named) and one unnamed, used in a small nonlinear loss.
fn params<S: Ops>(s: &mut S, init: Option<Vec<Tensor<S::T>>>) -> Vec<Param> {
    let init = init.unwrap_or_else(|| {
        vec![
            Tensor::new(
                [2, 3],
                [0.3, -0.2, 0.5, 0.1, 0.4, -0.6].map(S::T::lit).to_vec(),
            )
            .unwrap(),
            Tensor::vector([0.1, -0.1].map(S::T::lit).to_vec()),
            Tensor::vector([0.7, 0.2].map(S::T::lit).to_vec()),
        ]
    });
    let names = [Some("w"), Some("b"), None];
    init.into_iter()
        .zip(names)
        .map(|(v, n)| s.param(v, n, true).unwrap())
        .collect()
}

/// The loss of step `k` (inputs vary by step).
fn loss<S: Ops>(s: &mut S, p: &[Param], k: usize) -> tl_session::TensorRef {
    let w = s.use_param(&p[0]).unwrap();
    let b = s.use_param(&p[1]).unwrap();
    let c = s.use_param(&p[2]).unwrap();
    let x = s
        .input(
            Tensor::vector([1.0, -0.5 * k as f64, 0.25].map(S::T::lit).to_vec()),
            false,
        )
        .unwrap();
    let y = s.linear(&w, &b, &x).unwrap();
    let t = s.tanh(&y).unwrap();
    let d = s.sub(&t, &c).unwrap();
    let d2 = s.mul(&d, &d).unwrap();
    s.sum(&d2).unwrap()
}

fn eager_steps<T: Scalar>(
    s: &mut Session<T>,
    p: &[Param],
    opt: &mut Optimizer,
    ks: std::ops::Range<usize>,
) {
    for k in ks {
        let l = loss(s, p, k);
        s.backward(&l).unwrap();
        s.step(opt).unwrap();
        s.reset();
    }
}

fn linked_steps<T: Scalar>(
    s: &mut LinkedSession<T>,
    p: &[Param],
    opt: &mut Optimizer,
    ks: std::ops::Range<usize>,
) {
    for k in ks {
        let l = loss(s, p, k);
        let g = s.backward_scalar_dense_all(&l).unwrap();
        s.step(opt, &g).unwrap();
        s.reset();
    }
}

const K: usize = 3;
const N: usize = 4;

fn eager_case<T: Scalar>(backend: Backend, name: &str, opt: &Optimizer) {
    let new = || Session::<T>::new(Options::backend(backend)).unwrap();
    // Straight: K + N steps.
    let mut s = new();
    let p = params(&mut s, None);
    let mut o = opt.clone();
    eager_steps(&mut s, &p, &mut o, 0..K + N);
    let want: Vec<Tensor<T>> = p.iter().map(|q| s.param_value(q).unwrap()).collect();
    // K steps, export, resume in a fresh session with a fresh optimizer.
    let mut a = new();
    let pa = params(&mut a, None);
    let mut oa = opt.clone();
    eager_steps(&mut a, &pa, &mut oa, 0..K);
    let state: StateDict = a.optimizer_state(&oa).unwrap();
    let rule = oa.rule_name();
    assert_eq!(
        state[&format!("{rule}.step.w")].data(),
        &[K as f64],
        "{name}"
    );
    assert!(
        state.contains_key(&format!("{rule}.step.2")),
        "unnamed param by index"
    );
    let values: Vec<Tensor<T>> = pa.iter().map(|q| a.param_value(q).unwrap()).collect();
    let mut b = new();
    let pb = params(&mut b, Some(values));
    // Loaded into an optimizer of other hyper-parameters: the state's come back.
    let mut ob = perturbed(opt);
    b.load_optimizer_state(&mut ob, &state).unwrap();
    assert_eq!(b.optimizer_state(&ob).unwrap(), state, "{name}: round trip");
    assert_eq!(ob.hyper_parameters(), oa.hyper_parameters(), "{name}");
    eager_steps(&mut b, &pb, &mut ob, K..K + N);
    let got: Vec<Tensor<T>> = pb.iter().map(|q| b.param_value(q).unwrap()).collect();
    assert_eq!(got, want, "{name} on {backend:?}: resumed != straight");
    // Without the state the trajectory differs (the test has teeth), except plain SGD.
    let mut c = new();
    let pc = params(
        &mut c,
        Some(pa.iter().map(|q| a.param_value(q).unwrap()).collect()),
    );
    let mut oc = opt.clone();
    eager_steps(&mut c, &pc, &mut oc, K..K + N);
    let cold: Vec<Tensor<T>> = pc.iter().map(|q| c.param_value(q).unwrap()).collect();
    assert_eq!(
        cold == want,
        name == "sgd",
        "{name}: state matters unless plain SGD"
    );
    for (s, o) in [
        (&mut s, &mut o),
        (&mut a, &mut oa),
        (&mut b, &mut ob),
        (&mut c, &mut oc),
    ] {
        s.release_optimizer_state(o);
    }
}

#[test]
fn resumed_runs_continue_the_exact_trajectory_in_eager_sessions() {
    for (name, opt) in optimizers() {
        eager_case::<f64>(Backend::Cpu, name, &opt);
        eager_case::<f32>(Backend::Cpu, name, &opt);
        eager_case::<f32>(Backend::CudaSim, name, &opt);
    }
}

#[test]
fn resumed_runs_continue_the_exact_trajectory_in_the_linked_session() {
    for (name, opt) in optimizers() {
        let mut s = LinkedSession::<f64>::new();
        let p = params(&mut s, None);
        let mut o = opt.clone();
        linked_steps(&mut s, &p, &mut o, 0..K + N);
        let want: Vec<Tensor<f64>> = p.iter().map(|q| s.param_value(q).unwrap()).collect();
        let mut a = LinkedSession::<f64>::new();
        let pa = params(&mut a, None);
        let mut oa = opt.clone();
        linked_steps(&mut a, &pa, &mut oa, 0..K);
        let state = a.optimizer_state(&oa).unwrap();
        // The eager CPU session in f64 gives the same state names and values (within 1e-12:
        // its gradients come from the tape's kernels, the linked ones from the compiled graph,
        // and RMSprop's normalized steps carry their last-bit differences into the state).
        let mut e = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
        let pe = params(&mut e, None);
        let mut oe = opt.clone();
        eager_steps(&mut e, &pe, &mut oe, 0..K);
        let eager_state = e.optimizer_state(&oe).unwrap();
        assert!(eager_state.keys().eq(state.keys()), "{name}: state names");
        for (k, t) in &eager_state {
            for (a, b) in t.data().iter().zip(state[k].data()) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1e-3),
                    "{name} {k}: {a} vs {b}"
                );
            }
        }
        let values = pa.iter().map(|q| a.param_value(q).unwrap()).collect();
        let mut b = LinkedSession::<f64>::new();
        let pb = params(&mut b, Some(values));
        let mut ob = perturbed(&opt);
        b.load_optimizer_state(&mut ob, &state).unwrap();
        linked_steps(&mut b, &pb, &mut ob, K..K + N);
        let got: Vec<Tensor<f64>> = pb.iter().map(|q| b.param_value(q).unwrap()).collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn bad_state_is_a_clear_error_and_leaves_the_optimizer_unchanged() {
    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let p = params(&mut s, None);
    let mut adam = Optimizer::adam(0.1).unwrap();
    eager_steps(&mut s, &p, &mut adam, 0..2);
    let state = s.optimizer_state(&adam).unwrap();
    assert_eq!(
        state.len(),
        5 + 3 * 3,
        "lr, weight_decay, beta1, beta2, eps; step, m, v for each of three params"
    );
    // Adam's state into SGD: both rules and the entries are named, nothing is loaded.
    let mut sgd = Optimizer::momentum(0.1, 0.9).unwrap();
    let fresh_sgd = s.optimizer_state(&sgd).unwrap();
    assert!(
        fresh_sgd.keys().all(|k| k.starts_with("sgd.")),
        "{fresh_sgd:?}"
    );
    let e = s.load_optimizer_state(&mut sgd, &state).unwrap_err();
    assert!(
        matches!(&e, Error::Usage { detail, .. } if detail.contains("adam rule")
            && detail.contains("sgd") && detail.contains("adam.beta1")),
        "{e}"
    );
    assert_eq!(s.optimizer_state(&sgd).unwrap(), fresh_sgd);
    // A moment of the wrong shape, a missing moment.
    let mut bad = state.clone();
    bad.insert("adam.m.b".into(), Tensor::vector(vec![1.0; 3]));
    let mut fresh = Optimizer::adam(0.1).unwrap();
    let e = s.load_optimizer_state(&mut fresh, &bad).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    bad.remove("adam.m.b");
    let e = s.load_optimizer_state(&mut fresh, &bad).unwrap_err();
    assert!(e.to_string().contains("adam.m.b is missing"), "{e}");
    assert_eq!(
        s.optimizer_state(&fresh).unwrap(),
        s.optimizer_state(&Optimizer::adam(0.1).unwrap()).unwrap()
    );
    // Two parameters with one name cannot be exported unambiguously.
    let mut t = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    t.param(Tensor::vector(vec![1.0]), Some("x"), true).unwrap();
    t.param(Tensor::vector(vec![1.0]), Some("x"), true).unwrap();
    let e = t.optimizer_state(&adam).unwrap_err();
    assert!(e.to_string().contains("\"x\""), "{e}");
}

/// Issue 37 point 4: NaN, infinite or huge moments, a negative second moment or accumulator,
/// and absurd step counts are refused with an error naming the entry, before anything changes
/// (also on the CUDA sim, where the state would be uploaded); the next step stays finite.
#[test]
fn state_out_of_the_rules_domain_is_refused_and_changes_nothing() {
    let cases: Vec<(Optimizer, &str, f64, &str)> = vec![
        (Optimizer::adam(0.1).unwrap(), "adam.m.w", f64::NAN, "NaN"),
        (
            Optimizer::adam(0.1).unwrap(),
            "adam.v.w",
            f64::INFINITY,
            "inf",
        ),
        (Optimizer::adam(0.1).unwrap(), "adam.m.b", 1e300, "1e300"),
        (Optimizer::adam(0.1).unwrap(), "adam.v.b", -0.5, "≥ 0"),
        (
            Optimizer::adam(0.1).unwrap(),
            "adam.step.w",
            1e300,
            "not a step count",
        ),
        (
            Optimizer::adam(0.1).unwrap(),
            "adam.step.w",
            9.1e15,
            "not a step count",
        ),
        (
            Optimizer::adamw(0.1).unwrap(),
            "adamw.step.b",
            -1.0,
            "not a step count",
        ),
        (
            Optimizer::momentum(0.1, 0.9).unwrap(),
            "sgd.momentum_buffer.w",
            -1e39,
            "magnitude",
        ),
        (
            Optimizer::rmsprop(0.1).unwrap(),
            "rmsprop.square_avg.w",
            -1.0,
            "≥ 0",
        ),
        (
            Optimizer::adagrad(0.1).unwrap(),
            "adagrad.sum.b",
            -2.0,
            "≥ 0",
        ),
        (
            Optimizer::adam(0.1)
                .unwrap()
                .schedule(tl_session::Schedule::step(2, 0.5).unwrap())
                .unwrap(),
            "lr_scheduler.last_epoch",
            0.5,
            "not a step count",
        ),
    ];
    for backend in [Backend::Cpu, Backend::CudaSim] {
        for (opt, key, value, want) in &cases {
            let mut s = Session::<f32>::new(Options::backend(backend)).unwrap();
            let p = params(&mut s, None);
            let mut o = opt.clone();
            eager_steps(&mut s, &p, &mut o, 0..2);
            let mut state = s.optimizer_state(&o).unwrap();
            let t = state.get_mut(*key).unwrap_or_else(|| panic!("{key}"));
            let n = t.numel();
            *t = Tensor::new(t.shape().clone(), vec![*value; n]).unwrap();
            let before = s.optimizer_state(&o).unwrap();
            let e = s
                .load_optimizer_state(&mut o, &state)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains(want),
                "{backend:?} {key}={value}: {e}"
            );
            assert_eq!(s.optimizer_state(&o).unwrap(), before, "{key}: changed");
            eager_steps(&mut s, &p, &mut o, 2..3);
            for q in &p {
                let v = s.param_value(q).unwrap();
                assert!(v.data().iter().all(|x| x.is_finite()), "{key}: {v:?}");
            }
            s.release_optimizer_state(&mut o);
        }
    }
}

/// A step count is a 0-d tensor, as PyTorch's `state_dict()` stores `step` and as the export
/// writes it: one of shape `[1]`, `[1, 1]`, `[0]` or `[2]` is refused with an error naming the
/// entry and the shape; its value must be a whole number in `[0, 2^53]`, named when it is not.
/// Nothing changes on a refusal; the boundary values load.
#[test]
fn step_counts_are_scalars_holding_whole_numbers() {
    let sched = || {
        Optimizer::adam(0.1)
            .unwrap()
            .schedule(tl_session::Schedule::step(2, 0.5).unwrap())
            .unwrap()
    };
    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let p = params(&mut s, None);
    let mut o = sched();
    eager_steps(&mut s, &p, &mut o, 0..2);
    let good = s.optimizer_state(&o).unwrap();
    for key in ["adam.step.w", "adam.step.2", "lr_scheduler.last_epoch"] {
        assert_eq!(
            good[key].shape().dims(),
            &[] as &[usize],
            "{key} as exported"
        );
        for dims in [vec![1], vec![1, 1], vec![0], vec![2]] {
            let mut state = good.clone();
            let n = dims.iter().product();
            state.insert(
                key.to_owned(),
                Tensor::new(dims.clone(), vec![2.0; n]).unwrap(),
            );
            let before = s.optimizer_state(&o).unwrap();
            let e = s
                .load_optimizer_state(&mut o, &state)
                .unwrap_err()
                .to_string();
            let shape = tl_spec::Shape::new(&dims).to_string();
            assert!(
                e.contains(key) && e.contains(&shape) && e.contains("scalar"),
                "{key} {dims:?}: {e}"
            );
            assert_eq!(s.optimizer_state(&o).unwrap(), before, "{key}: changed");
        }
        for bad in [
            -1.0,
            -f64::MIN_POSITIVE,
            0.5,
            f64::NAN,
            f64::INFINITY,
            9_007_199_254_740_994.0,
        ] {
            let mut state = good.clone();
            state.insert(key.to_owned(), Tensor::scalar(bad));
            let e = s
                .load_optimizer_state(&mut o, &state)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains("not a step count"),
                "{key}={bad}: {e}"
            );
        }
        for fine in [0.0, 9_007_199_254_740_992.0] {
            let mut state = good.clone();
            state.insert(key.to_owned(), Tensor::scalar(fine));
            let mut o2 = sched();
            s.load_optimizer_state(&mut o2, &state)
                .unwrap_or_else(|e| panic!("{key}={fine}: {e}"));
            assert_eq!(s.optimizer_state(&o2).unwrap()[key].data(), &[fine]);
            s.release_optimizer_state(&mut o2);
        }
    }
}

/// The hyper-parameters in a state: all of the rule's or none (a state without them keeps the
/// optimizer's own), each a scalar, a flag 0 or 1, the set valid for the rule; a refusal names
/// the entry and changes neither the state nor the hyper-parameters.
#[test]
fn hyper_parameters_in_a_state_are_checked_and_all_or_none() {
    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let p = params(&mut s, None);
    let opt = Optimizer::momentum(0.1, 0.9)
        .unwrap()
        .dampening_nesterov(0.0, true)
        .unwrap();
    let mut o = opt.clone();
    eager_steps(&mut s, &p, &mut o, 0..2);
    let good = s.optimizer_state(&o).unwrap();
    for (name, v) in o.hyper_parameters() {
        assert_eq!(good[&format!("sgd.{name}")].data(), &[v], "{name}");
    }
    let cases: Vec<(&str, Tensor<f64>, &str)> = vec![
        ("sgd.lr", Tensor::scalar(-1.0), "lr = -1"),
        ("sgd.lr", Tensor::scalar(f64::NAN), "lr = NaN"),
        ("sgd.momentum", Tensor::scalar(1.0), "momentum = 1"),
        ("sgd.dampening", Tensor::scalar(2.0), "dampening = 2"),
        ("sgd.nesterov", Tensor::scalar(0.5), "not a flag"),
        ("sgd.weight_decay", Tensor::vector(vec![0.0]), "scalar"),
    ];
    for (key, value, want) in cases {
        let mut state = good.clone();
        state.insert(key.into(), value);
        let mut o2 = perturbed(&opt);
        let before = o2.hyper_parameters();
        let e = s
            .load_optimizer_state(&mut o2, &state)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{key}: {e}");
        assert_eq!(o2.hyper_parameters(), before, "{key}: changed");
        let fresh = s.optimizer_state(&perturbed(&opt)).unwrap();
        assert_eq!(
            s.optimizer_state(&o2).unwrap(),
            fresh,
            "{key}: state loaded"
        );
    }
    // One missing: refused, naming it.
    let mut state = good.clone();
    state.remove("sgd.dampening");
    let mut o2 = perturbed(&opt);
    let e = s.load_optimizer_state(&mut o2, &state).unwrap_err();
    assert!(e.to_string().contains("sgd.dampening is missing"), "{e}");
    // None: a state from before they were exported keeps the optimizer's own.
    let mut state = good.clone();
    for (name, _) in opt.hyper_parameters() {
        state.remove(&format!("sgd.{name}"));
    }
    let mut o2 = perturbed(&opt);
    let own = o2.hyper_parameters();
    s.load_optimizer_state(&mut o2, &state).unwrap();
    assert_eq!(o2.hyper_parameters(), own);
    s.release_optimizer_state(&mut o2);
    s.release_optimizer_state(&mut o);
}

/// The hyper-parameters decide which buffers a rule keeps (SGD's momentum): a momentum state
/// loaded into plain SGD brings its momentum and its buffers and continues the momentum run;
/// into an optimizer that already holds state the state does not cover, such a change is
/// refused.
#[test]
fn a_state_whose_hyper_parameters_change_the_buffers_loads_into_a_fresh_optimizer() {
    let momentum = Optimizer::momentum(0.1, 0.9).unwrap();
    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let p = params(&mut s, None);
    let mut o = momentum.clone();
    eager_steps(&mut s, &p, &mut o, 0..K + N);
    let want: Vec<Tensor<f64>> = p.iter().map(|q| s.param_value(q).unwrap()).collect();
    let mut a = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let pa = params(&mut a, None);
    let mut oa = momentum.clone();
    eager_steps(&mut a, &pa, &mut oa, 0..K);
    let state = a.optimizer_state(&oa).unwrap();
    let values = pa.iter().map(|q| a.param_value(q).unwrap()).collect();
    let mut b = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let pb = params(&mut b, Some(values));
    let mut plain = Optimizer::sgd(0.1).unwrap();
    b.load_optimizer_state(&mut plain, &state).unwrap();
    assert_eq!(plain.name(), "momentum");
    eager_steps(&mut b, &pb, &mut plain, K..K + N);
    let got: Vec<Tensor<f64>> = pb.iter().map(|q| b.param_value(q).unwrap()).collect();
    assert_eq!(got, want);
    // A plain SGD state covering only `w`, into the momentum optimizer holding state for all.
    let mut partial: StateDict = Optimizer::sgd(0.1)
        .unwrap()
        .hyper_parameters()
        .into_iter()
        .map(|(n, v)| (format!("sgd.{n}"), Tensor::scalar(v)))
        .collect();
    partial.insert("sgd.step.w".into(), Tensor::scalar(1.0));
    let before = a.optimizer_state(&oa).unwrap();
    let e = a.load_optimizer_state(&mut oa, &partial).unwrap_err();
    assert!(
        e.to_string().contains("momentum_buffer") && e.to_string().contains("without state"),
        "{e}"
    );
    assert_eq!(a.optimizer_state(&oa).unwrap(), before);
    for (s, o) in [(&mut s, &mut o), (&mut a, &mut oa), (&mut b, &mut plain)] {
        s.release_optimizer_state(o);
    }
}
