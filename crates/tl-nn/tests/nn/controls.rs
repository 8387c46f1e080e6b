//! Training controls (issue 38, point 2) and optimizer state checked on load (issue 37,
//! point 4): every schedule against PyTorch's `lr_scheduler` values (fixtures/
//! make_schedules.py), clipping against a hand computation on every session, the schedule's
//! position in checkpoints, the stop on a non-finite loss, refused bad values, and refused
//! optimizer state in a checkpoint.

use std::collections::BTreeMap;

use tl_nn::{Parameters, Runtime, Schedule, checkpoint};
use tl_session::{Backend, Optimizer, Param, Train};
use tl_spec::{Scalar, Tensor};

use super::{eager, linked};

/// The library's schedule for each fixture name (as make_schedules.py builds PyTorch's).
fn schedule(name: &str) -> Schedule {
    match name {
        "step" => Schedule::step(7, 0.5),
        "multi_step" => Schedule::multi_step(&[25, 10, 3, 10], 0.3),
        "exponential" => Schedule::exponential(0.93),
        "linear" => Schedule::linear(0.25, 0.9, 12),
        "cosine_warmup" => Schedule::cosine_warmup(8, 0.1, 40, 0.002),
        "cosine" => Schedule::cosine_warmup(0, 1.0, 25, 0.001),
        "one_cycle" => Schedule::one_cycle(0.4, 50),
        "one_cycle_with" => Schedule::one_cycle_with(1.5, 37, 0.4, 10.0, 100.0),
        other => panic!("no schedule for fixture {other}"),
    }
    .unwrap()
}

#[test]
fn every_schedule_gives_pytorchs_learning_rates() {
    let text = include_str!("../fixtures/schedules.txt");
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, k, want) = (
            f[0],
            f[1].parse::<u64>().unwrap(),
            f[2].parse::<f64>().unwrap(),
        );
        let got = schedule(name).lr_at(0.1, k).unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want.abs(),
            "{name} step {k}: ours {got}, PyTorch {want}"
        );
        *seen.entry(name).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 8, "every schedule of the fixture: {seen:?}");
    // PyTorch refuses a one-cycle step past total_steps; so do we, naming the step.
    let e = schedule("one_cycle")
        .lr_at(0.1, 51)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("step 51") && e.contains("total_steps = 50"),
        "{e}"
    );
}

#[test]
fn bad_schedule_and_clipping_values_are_errors_naming_the_value() {
    let cases: Vec<(tl_session::Result<Schedule>, &str)> = vec![
        (Schedule::step(0, 0.5), "step_size = 0"),
        (Schedule::step(3, 0.0), "gamma = 0"),
        (Schedule::exponential(-0.5), "gamma = -0.5"),
        (Schedule::multi_step(&[2], f64::NAN), "gamma = NaN"),
        (Schedule::linear(0.0, 1.0, 5), "start_factor = 0"),
        (Schedule::linear(0.5, 1.5, 5), "end_factor = 1.5"),
        (Schedule::linear(0.5, 1.0, 0), "total_iters = 0"),
        (Schedule::cosine_warmup(5, 0.1, 0, 0.0), "t_max = 0"),
        (Schedule::cosine_warmup(5, 0.1, 10, -1.0), "eta_min = -1"),
        (Schedule::one_cycle(0.0, 10), "max_lr = 0"),
        (Schedule::one_cycle(0.1, 0), "total_steps = 0"),
        (Schedule::one_cycle(0.1, 3), "pct_start = 0.3"),
        (
            Schedule::one_cycle_with(0.1, 10, 0.3, -1.0, 1e4),
            "div_factor = -1",
        ),
    ];
    for (r, want) in cases {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e}");
    }
    // The same schedules built from their public fields: `lr_at` refuses them (it divided by
    // zero, or gave NaN).
    for (sched, want) in [
        (
            Schedule::Step {
                step_size: 0,
                gamma: 0.5,
            },
            "step_size = 0",
        ),
        (
            Schedule::Linear {
                start_factor: 0.5,
                end_factor: 1.0,
                total_iters: 0,
            },
            "total_iters = 0",
        ),
    ] {
        let e = sched.lr_at(1.0, 3).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e}");
    }
    let opt = || Optimizer::adam(0.1).unwrap();
    for (r, want) in [
        (opt().clip_grad_norm(-1.0, 2.0), "max_norm = -1"),
        (opt().clip_grad_norm(1.0, 3.0), "norm_type = 3"),
        (opt().clip_grad_norm(f64::INFINITY, 2.0), "max_norm = inf"),
        (opt().clip_grad_value(-0.5), "clip_value = -0.5"),
    ] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "expected {want:?} in {e}");
    }
}

/// One parameter `w`, a vector.
struct One(Param);

impl Parameters for One {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.0)
    }
}

fn one<O: Train>(rt: &Runtime<O>, w: &[f64]) -> One {
    let v = Tensor::vector(w.iter().map(|&x| O::T::lit(x)).collect());
    One(rt.vars().param_from("w", v, true).unwrap())
}

fn values<O: Train>(rt: &Runtime<O>, m: &One) -> Vec<f64> {
    rt.value_of(&m.0)
        .unwrap()
        .data()
        .iter()
        .map(|v| v.as_f64())
        .collect()
}

/// Clipping by norm and by value against a hand computation: the loss `Σ w·c` has gradient
/// `c`, so the step is `w − lr·clip(c)`, and the reported norm is `‖c‖` (or of the clamped
/// `c`), on the eager CPU, the CUDA sim and the linked session.
fn clipping_case<O: Train>(mut rt: Runtime<O>, what: &str, tol: f64) {
    let w0 = [0.5, -1.0, 2.0, 0.25];
    let c = [3.0, -4.0, 0.5, 12.0]; // ‖c‖₂ = 13.0190..., ‖c‖₁ = 19.5, ‖c‖∞ = 12
    let m = one(&rt, &w0);
    let cv = Tensor::vector(c.iter().map(|&x| O::T::lit(x)).collect());
    let lr = 0.1;
    let hand = |g: &[f64], p: f64, max_norm: f64| {
        let norm = if p == 2.0 {
            g.iter().map(|v| v * v).sum::<f64>().sqrt()
        } else if p == 1.0 {
            g.iter().map(|v| v.abs()).sum()
        } else {
            g.iter().fold(0.0f64, |m, v| m.max(v.abs()))
        };
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        (norm, g.iter().map(|v| v * coef).collect::<Vec<f64>>())
    };
    for (p, max_norm, value) in [
        (2.0, 1.0, None),
        (1.0, 5.0, None),
        (f64::INFINITY, 2.0, None),
        (2.0, 100.0, None), // not clipped: coef 1
        (2.0, 1.0, Some(3.5)),
    ] {
        let mut opt = Optimizer::sgd(lr)
            .unwrap()
            .clip_grad_norm(max_norm, p)
            .unwrap();
        let mut g: Vec<f64> = c.to_vec();
        if let Some(v) = value {
            opt = opt.clip_grad_value(v).unwrap();
            g.iter_mut().for_each(|x| *x = x.clamp(-v, v));
        }
        let before = values(&rt, &m);
        let r = rt
            .train_step(&m, &mut opt, |s| {
                (s.param(&m.0)? * s.input(cv.clone())?)?.sum()
            })
            .unwrap();
        let (norm, clipped) = hand(&g, p, max_norm);
        let got_norm = r.grad_norm.unwrap();
        assert!(
            (got_norm - norm).abs() <= tol * norm,
            "{what} p={p}: norm {got_norm}, hand {norm}"
        );
        assert_eq!((r.step, r.lr), (0, lr), "{what}");
        for (i, (a, b)) in values(&rt, &m).iter().zip(&before).enumerate() {
            let want = b - lr * clipped[i];
            assert!((a - want).abs() <= tol, "{what} p={p} [{i}]: {a} vs {want}");
        }
    }
    // By value alone, with momentum (not the plain SGD fast path): no norm is reported.
    let mut opt = Optimizer::momentum(lr, 0.9)
        .unwrap()
        .clip_grad_value(1.0)
        .unwrap();
    let before = values(&rt, &m);
    let r = rt
        .train_step(&m, &mut opt, |s| {
            (s.param(&m.0)? * s.input(cv.clone())?)?.sum()
        })
        .unwrap();
    assert_eq!(r.grad_norm, None);
    for (i, (a, b)) in values(&rt, &m).iter().zip(&before).enumerate() {
        let want = b - lr * c[i].clamp(-1.0, 1.0);
        assert!(
            (a - want).abs() <= tol,
            "{what} value clip [{i}]: {a} vs {want}"
        );
    }
}

#[test]
fn clipping_matches_a_hand_computation_on_every_session() {
    clipping_case(eager::<f64>(Backend::Cpu, 0), "cpu f64", 1e-12);
    clipping_case(linked::<f64>(0), "linked f64", 1e-12);
    clipping_case(eager::<f32>(Backend::CudaSim, 0), "cuda sim", 1e-5);
    let mut sim_linked = linked::<f32>(0);
    sim_linked
        .session_mut()
        .set_backend(Backend::CudaSim)
        .unwrap();
    clipping_case(sim_linked, "linked cuda sim", 1e-5);
}

/// The step consults the schedule (the report's lr is the schedule's), and the schedule's
/// position travels in the checkpoint: a run saved after 4 steps and resumed in a fresh
/// runtime continues with the same learning rates and parameters as an uninterrupted run, also
/// when loaded into an optimizer built with other hyper-parameters (the file's come back).
#[test]
fn the_schedule_is_consulted_and_checkpointed() {
    let sched = Schedule::cosine_warmup(3, 0.1, 6, 0.001).unwrap();
    let make = || {
        Optimizer::adamw(0.05)
            .unwrap()
            .schedule(sched.clone())
            .unwrap()
    };
    let c = Tensor::vector(vec![0.3, -0.8, 1.1]);
    let run = |rt: &mut Runtime<_>, m: &One, opt: &mut Optimizer, n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let r = rt
                    .train_step(m, opt, |s| {
                        let w = s.param(&m.0)?;
                        ((w.clone() * w)? * s.input(c.clone())?)?.sum()
                    })
                    .unwrap();
                assert_eq!(r.lr, sched.lr_at(0.05, r.step).unwrap());
                r.lr
            })
            .collect()
    };
    let mut rt = eager::<f64>(Backend::Cpu, 0);
    let m = one(&rt, &[1.0, 2.0, -0.5]);
    let mut opt = make();
    let lrs = run(&mut rt, &m, &mut opt, 4);
    assert!(lrs.windows(2).all(|w| w[0] < w[1]), "warm-up: {lrs:?}");
    let path = std::env::temp_dir().join(format!("tl-nn-sched-{}.safetensors", std::process::id()));
    rt.save_with(&m, &path, Some(&opt), &BTreeMap::new())
        .unwrap();
    let file = checkpoint::read(&path).unwrap();
    assert!(
        file.tensors
            .contains_key("optimizer.lr_scheduler.last_epoch")
    );
    let straight = run(&mut rt, &m, &mut opt, 4);
    assert!(
        straight.windows(2).all(|w| w[0] > w[1]),
        "cosine decay: {straight:?}"
    );
    let want = values(&rt, &m);

    let mut rt2 = eager::<f64>(Backend::Cpu, 7);
    let m2 = one(&rt2, &[0.0, 0.0, 0.0]);
    // Built with another learning rate and decay: the file's hyper-parameters come back, as
    // PyTorch's `load_state_dict` restores `param_groups`.
    let mut opt2 = Optimizer::adamw(0.2)
        .unwrap()
        .weight_decay(0.3)
        .unwrap()
        .schedule(sched.clone())
        .unwrap();
    rt2.load_with(&m2, &path, Some(&mut opt2)).unwrap();
    assert_eq!(opt2.steps_done(), 4);
    assert_eq!(opt2.hyper_parameters(), opt.hyper_parameters());
    assert_eq!(run(&mut rt2, &m2, &mut opt2, 4), straight);
    assert_eq!(values(&rt2, &m2), want);
    // A schedule's position cannot go into an optimizer without a schedule.
    let mut plain = Optimizer::adamw(0.05).unwrap();
    let e = rt2
        .load_with(&m2, &path, Some(&mut plain))
        .unwrap_err()
        .to_string();
    assert!(e.contains("lr_scheduler.last_epoch"), "{e}");
    std::fs::remove_file(&path).ok();
}

/// `stop_on_non_finite_loss`: a NaN loss is an error naming the step, and neither the model
/// nor the optimizer moved; without it the step runs (PyTorch's behaviour).
fn non_finite_case<O: Train>(mut rt: Runtime<O>, what: &str) {
    let m = one(&rt, &[1.0, -2.0]);
    let mut opt = Optimizer::adam(0.1).unwrap().stop_on_non_finite_loss(true);
    let good = Tensor::vector(vec![O::T::lit(0.5), O::T::lit(1.0)]);
    let bad = Tensor::vector(vec![O::T::lit(f64::NAN), O::T::lit(1.0)]);
    for _ in 0..2 {
        rt.train_step(&m, &mut opt, |s| {
            (s.param(&m.0)? * s.input(good.clone())?)?.sum()
        })
        .unwrap();
    }
    let before = values(&rt, &m);
    let e = rt
        .train_step(&m, &mut opt, |s| {
            (s.param(&m.0)? * s.input(bad.clone())?)?.sum()
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("training step 2") && e.contains("NaN"),
        "{what}: {e}"
    );
    assert_eq!(values(&rt, &m), before, "{what}: the model moved");
    assert_eq!(
        opt.steps_done(),
        2,
        "{what}: the optimizer counted the step"
    );
    let r = rt
        .train_step(&m, &mut opt, |s| {
            (s.param(&m.0)? * s.input(good.clone())?)?.sum()
        })
        .unwrap();
    assert_eq!(r.step, 2, "{what}");
    let mut lenient = Optimizer::adam(0.1).unwrap();
    let l = rt
        .step(&m, &mut lenient, |s| {
            (s.param(&m.0)? * s.input(bad.clone())?)?.sum()
        })
        .unwrap();
    assert!(l.is_nan(), "{what}");
}

/// A schedule whose rate overflows (exponential γ = 1e200: 1, 1e200, then ∞) stops the step
/// that would use it, naming the schedule and the step, before anything changes (PyTorch
/// steps on with an infinite rate and writes ±∞); the steps before it ran.
#[test]
fn a_schedule_rate_that_is_not_finite_stops_the_step() {
    fn check<O: Train>(mut rt: Runtime<O>, what: &str) {
        let m = one(&rt, &[1.0, -2.0]);
        let sched = Schedule::exponential(1e200).unwrap();
        let mut opt = Optimizer::sgd(1e-300).unwrap().schedule(sched).unwrap();
        let c = Tensor::vector(vec![O::T::lit(1.0), O::T::lit(1.0)]);
        let step = |rt: &mut Runtime<O>, opt: &mut Optimizer| {
            rt.step(&m, opt, |s| (s.param(&m.0)? * s.input(c.clone())?)?.sum())
        };
        for _ in 0..2 {
            step(&mut rt, &mut opt).unwrap();
        }
        let before = values(&rt, &m);
        let e = step(&mut rt, &mut opt).unwrap_err().to_string();
        assert!(
            e.contains("ExponentialLR") && e.contains("step 2") && e.contains("inf"),
            "{what}: {e}"
        );
        assert_eq!(values(&rt, &m), before, "{what}: the model moved");
        assert_eq!(opt.steps_done(), 2, "{what}");
    }
    check(eager::<f64>(Backend::Cpu, 0), "cpu");
    check(eager::<f32>(Backend::CudaSim, 0), "cuda sim");
    check(linked::<f64>(0), "linked");
}

#[test]
fn a_non_finite_loss_stops_the_step_when_asked() {
    non_finite_case(eager::<f64>(Backend::Cpu, 0), "cpu");
    non_finite_case(eager::<f32>(Backend::CudaSim, 0), "cuda sim");
    non_finite_case(linked::<f64>(0), "linked");
    let mut sim_linked = linked::<f32>(0);
    sim_linked
        .session_mut()
        .set_backend(Backend::CudaSim)
        .unwrap();
    non_finite_case(sim_linked, "linked cuda sim");
}

/// Issue 37 point 4: a checkpoint whose optimizer state is NaN, infinite, 1e300, a negative
/// second moment, or an absurd step count is refused, and the model and the optimizer are
/// left as they were; the next step then writes finite values. (Before the check, each
/// loaded and the next step wrote non-finite parameters.)
#[test]
fn bad_optimizer_state_in_a_checkpoint_is_refused_and_changes_nothing() {
    let mut rt = eager::<f32>(Backend::Cpu, 0);
    let m = one(&rt, &[1.0, -2.0, 0.5]);
    let c = Tensor::vector(vec![0.5f32, 1.0, -0.25]);
    let mut opt = Optimizer::adam(0.1).unwrap();
    let step = |rt: &mut Runtime<_>, opt: &mut Optimizer| {
        rt.step(&m, opt, |s| (s.param(&m.0)? * s.input(c.clone())?)?.sum())
            .unwrap()
    };
    step(&mut rt, &mut opt);
    let good = std::env::temp_dir().join(format!("tl-nn-optgood-{}.st", std::process::id()));
    rt.save_with(&m, &good, Some(&opt), &BTreeMap::new())
        .unwrap();
    let file = checkpoint::read(&good).unwrap();
    let bad = std::env::temp_dir().join(format!("tl-nn-optbad-{}.st", std::process::id()));
    let cases: [(&str, f64, &str); 7] = [
        ("optimizer.adam.m.w", f64::NAN, "NaN"),
        ("optimizer.adam.v.w", f64::INFINITY, "inf"),
        ("optimizer.adam.m.w", 1e300, "1e300"),
        ("optimizer.adam.v.w", -1.0, "must be ≥ 0"),
        ("optimizer.adam.step.w", 1e300, "not a step count"),
        ("optimizer.adam.step.w", -3.0, "not a step count"),
        ("optimizer.adam.step.w", 2.5, "not a step count"),
    ];
    for (name, v, want) in cases {
        let mut f = file.clone();
        let e = f.tensors.get_mut(name).unwrap();
        let n = e.bytes.len() / 8;
        e.bytes = (0..n).flat_map(|_| v.to_le_bytes()).collect();
        checkpoint::write(&bad, &f).unwrap();
        let before_w = values(&rt, &m);
        let before_state = rt.session().optimizer_state(&opt).unwrap();
        let err = rt
            .load_with(&m, &bad, Some(&mut opt))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(name.trim_start_matches("optimizer.")) && err.contains(want),
            "{name}={v}: {err}"
        );
        assert_eq!(values(&rt, &m), before_w, "{name}: the model changed");
        assert_eq!(
            rt.session().optimizer_state(&opt).unwrap(),
            before_state,
            "{name}: the optimizer changed"
        );
        step(&mut rt, &mut opt);
        assert!(values(&rt, &m).iter().all(|v| v.is_finite()), "{name}");
    }
    std::fs::remove_file(&good).ok();
    std::fs::remove_file(&bad).ok();
}
