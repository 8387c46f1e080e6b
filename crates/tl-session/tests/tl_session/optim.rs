//! Optimizer trajectories over a few steps, on every session kind, against hand-computed values
//! and an independent scalar transcription of PyTorch's update rules.

use crate::common::{Any, KINDS, Kind, assert_close, f64s};
use tl_session::{Ops, Optimizer};
use tl_spec::Tensor;

const W0: [f64; 3] = [1.0, -2.0, 0.5];
const C: [f64; 3] = [1.0, 2.0, -3.0];

fn tol(kind: Kind) -> f64 {
    if kind == Kind::CudaSim { 2e-6 } else { 1e-12 }
}

/// Runs `steps` steps of `opt` on the loss `Σ c·w` (gradient `c`, constant) or, with
/// `quadratic`, `Σ w·w` (gradient `2w`); returns the parameter after each step.
fn trajectory(kind: Kind, mut opt: Optimizer, steps: usize, quadratic: bool) -> Vec<Vec<f64>> {
    if kind == Kind::CudaSim {
        return trajectory_f32(opt, steps, quadratic);
    }
    let mut s = Any::<f64>::new(kind);
    let p = s
        .ops()
        .param(Tensor::vector(W0.to_vec()), Some("w"), true)
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let o = s.ops();
        let w = o.use_param(&p).unwrap();
        let c = o.input(Tensor::vector(C.to_vec()), false).unwrap();
        let y = if quadratic {
            o.mul(&w, &w)
        } else {
            o.mul(&w, &c)
        }
        .unwrap();
        let loss = o.sum(&y).unwrap();
        s.step(&loss, &mut opt).unwrap();
        out.push(f64s(&s.param_value(&p).unwrap()));
    }
    out
}

fn trajectory_f32(mut opt: Optimizer, steps: usize, quadratic: bool) -> Vec<Vec<f64>> {
    let mut s = Any::<f32>::new(Kind::CudaSim);
    let w0: Vec<f32> = W0.iter().map(|&v| v as f32).collect();
    let c: Vec<f32> = C.iter().map(|&v| v as f32).collect();
    let p = s.ops().param(Tensor::vector(w0), Some("w"), true).unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let o = s.ops();
        let w = o.use_param(&p).unwrap();
        let c = o.input(Tensor::vector(c.clone()), false).unwrap();
        let y = if quadratic {
            o.mul(&w, &w)
        } else {
            o.mul(&w, &c)
        }
        .unwrap();
        let loss = o.sum(&y).unwrap();
        s.step(&loss, &mut opt).unwrap();
        out.push(f64s(&s.param_value(&p).unwrap()));
    }
    out
}

fn check(opt: &Optimizer, steps: usize, quadratic: bool, want: &[Vec<f64>], what: &str) {
    for kind in KINDS {
        let got = trajectory(kind, opt.clone(), steps, quadratic);
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_close(g, w, tol(kind), &format!("{what} {kind:?} step {}", k + 1));
        }
    }
}

fn lin(coef: f64) -> Vec<f64> {
    W0.iter().zip(C).map(|(w, c)| w - coef * c).collect()
}

#[test]
fn sgd_and_momentum_by_hand() {
    // Plain SGD, constant gradient c: w_k = w0 − k·lr·c.
    check(
        &Optimizer::sgd(0.1).unwrap(),
        2,
        false,
        &[lin(0.1), lin(0.2)],
        "sgd",
    );
    // Momentum 0.9: b = g, 1.9g, 2.71g → cumulative lr·(1, 2.9, 5.61)·c.
    check(
        &Optimizer::momentum(0.1, 0.9).unwrap(),
        3,
        false,
        &[lin(0.1), lin(0.29), lin(0.561)],
        "momentum",
    );
    // Nesterov: the step uses g + μb: 1.9g, then 2.71g.
    check(
        &Optimizer::momentum(0.1, 0.9)
            .unwrap()
            .dampening_nesterov(0.0, true)
            .unwrap(),
        2,
        false,
        &[lin(0.19), lin(0.19 + 0.271)],
        "nesterov",
    );
    // Dampening 0.5 applies from the second step: b = g, then 0.9g + 0.5g = 1.4g.
    check(
        &Optimizer::momentum(0.1, 0.9)
            .unwrap()
            .dampening_nesterov(0.5, false)
            .unwrap(),
        2,
        false,
        &[lin(0.1), lin(0.24)],
        "dampening",
    );
}

#[test]
fn adam_and_adamw_by_hand_on_a_constant_gradient() {
    // With a constant gradient, m̂ = g and √v̂ = |g|: each step moves lr·g/(|g|+ε).
    let step = |k: f64, lr: f64| -> Vec<f64> {
        W0.iter()
            .zip(C)
            .map(|(w, c)| w - k * lr * c / (c.abs() + 1e-8))
            .collect()
    };
    check(
        &Optimizer::adam(0.01).unwrap(),
        3,
        false,
        &[step(1.0, 0.01), step(2.0, 0.01), step(3.0, 0.01)],
        "adam",
    );
    // AdamW (default decay 0.01): w ← w·(1 − lr·λ) first, then the Adam move.
    let decay = 1.0 - 0.1 * 0.01;
    let w1: Vec<f64> = W0
        .iter()
        .zip(C)
        .map(|(w, c)| w * decay - 0.1 * c / (c.abs() + 1e-8))
        .collect();
    check(&Optimizer::adamw(0.1).unwrap(), 1, false, &[w1], "adamw");
}

/// PyTorch's update rules, transcribed per element (independent of the library's VecOps code).
fn reference(opt: &str, steps: usize, lr: f64, wd: f64) -> Vec<Vec<f64>> {
    let (b1, b2, eps, mu) = (0.9f64, 0.999f64, 1e-8, 0.9);
    let mut w = W0.to_vec();
    let mut m = [0.0; 3];
    let mut v = [0.0; 3];
    let mut buf = [0.0; 3];
    let mut out = Vec::new();
    for t in 1..=steps {
        for i in 0..3 {
            let mut g = 2.0 * w[i];
            match opt {
                "momentum" => {
                    g += wd * w[i];
                    buf[i] = if t == 1 { g } else { mu * buf[i] + g };
                    w[i] -= lr * buf[i];
                }
                "adam" | "adamw" => {
                    if opt == "adam" {
                        g += wd * w[i];
                    } else {
                        w[i] *= 1.0 - lr * wd;
                    }
                    m[i] = b1 * m[i] + (1.0 - b1) * g;
                    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                    let bc1 = 1.0 - b1.powi(t as i32);
                    let bc2 = 1.0 - b2.powi(t as i32);
                    let denom = v[i].sqrt() / bc2.sqrt() + eps;
                    w[i] -= lr / bc1 * m[i] / denom;
                }
                _ => unreachable!(),
            }
        }
        out.push(w.clone());
    }
    out
}

#[test]
fn weight_decay_and_state_follow_pytorch_on_a_quadratic() {
    let cases = [
        (
            "momentum",
            Optimizer::momentum(0.05, 0.9)
                .unwrap()
                .weight_decay(0.1)
                .unwrap(),
            0.05,
            0.1,
        ),
        (
            "adam",
            Optimizer::adam(0.05).unwrap().weight_decay(0.1).unwrap(),
            0.05,
            0.1,
        ),
        (
            "adamw",
            Optimizer::adamw(0.05).unwrap().weight_decay(0.1).unwrap(),
            0.05,
            0.1,
        ),
    ];
    for (name, opt, lr, wd) in cases {
        let want = reference(name, 4, lr, wd);
        check(&opt, 4, true, &want, name);
    }
}

#[test]
fn cuda_optimizer_state_lives_on_the_device_and_is_released() {
    let mut s =
        tl_session::Session::<f32>::new(tl_session::Options::backend(tl_session::Backend::CudaSim))
            .unwrap();
    let p = s
        .param(Tensor::vector(vec![1.0f32, 2.0]), None, true)
        .unwrap();
    let mut opt = Optimizer::adam(0.1).unwrap();
    let w = s.use_param(&p).unwrap();
    let l = s.sum(&w).unwrap();
    s.backward(&l).unwrap();
    s.step(&mut opt).unwrap();
    s.reset();
    let live = s.memory_usage().unwrap().live_bytes;
    // The parameter mirror plus Adam's two moments, 2 floats each.
    assert_eq!(live, 3 * 2 * 4, "{:?}", s.memory_usage());
    assert_eq!(s.release_optimizer_state(&mut opt), 2);
    assert_eq!(s.memory_usage().unwrap().live_bytes, 2 * 4);
}
