//! Optimizers in the harness: every rule's steps in the sessions (SGD, momentum SGD with
//! dampening and Nesterov, Adam, AdamW, RMSprop with momentum and centering, Adagrad) equal a
//! reference written here in f64 from the update rules that PyTorch documents for
//! `torch.optim.SGD`, `Adam`, `AdamW`, `RMSprop` and `Adagrad` (amsgrad and maximize off),
//! over random cases: several parameters of random lengths, random initial values, a
//! random gradient per parameter and step, several steps, random hyper-parameters in their
//! valid ranges. On the eager CPU session and the linked session in f64 (≤ 1e-10 relative) and
//! on the eager CPU session and the CUDA sim in f32 (≤ 1e-4, scaled by magnitude), where the
//! reference starts from the same f32-rounded values; under `cuda-emu` also on the emulated
//! kernels. On a device, Adam, AdamW and momentum SGD step in one launch per parameter, and
//! the parameters with one gradient in one list launch per eight
//! (`tl_tape_cuda::gates::fused_optimizer`): those steps must give the bits of the rule
//! composed from the device's primitives, the gate forced off.
//!
//! Each parameter `w` enters the loss as `Σ w·c` with `c` a constant input, so its gradient is
//! exactly `c` on every backend, and the reference sees the gradients the optimizer sees.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tl_conformance::RunConfig;
use tl_session::{
    Backend, LinkedSession, Ops, Optimizer, Options, Param, Session, TensorRef, Train,
};
use tl_spec::{Scalar, Tensor};

/// A rule and its own hyper-parameters.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// `torch.optim.SGD(momentum=μ, dampening=τ, nesterov=…)`; μ = 0 is plain SGD.
    Sgd {
        momentum: f64,
        dampening: f64,
        nesterov: bool,
    },
    /// `torch.optim.Adam(betas=(β₁, β₂), eps=ε)`, L2 weight decay on the gradient.
    Adam { beta1: f64, beta2: f64, eps: f64 },
    /// `torch.optim.AdamW(betas=(β₁, β₂), eps=ε)`, decoupled weight decay.
    AdamW { beta1: f64, beta2: f64, eps: f64 },
    /// `torch.optim.RMSprop(alpha=α, eps=ε, momentum=μ, centered=…)`.
    RmsProp {
        alpha: f64,
        eps: f64,
        momentum: f64,
        centered: bool,
    },
    /// `torch.optim.Adagrad(lr_decay=η, eps=ε, initial_accumulator_value=s₀)`.
    Adagrad { lr_decay: f64, eps: f64, init: f64 },
}

/// One random optimizer run.
#[derive(Debug, Clone)]
struct Case {
    rule: Rule,
    lr: f64,
    weight_decay: f64,
    /// The initial value of each parameter.
    params: Vec<Vec<f64>>,
    /// `grads[t][p]`: parameter `p`'s gradient at step `t + 1`.
    grads: Vec<Vec<Vec<f64>>>,
}

fn rule() -> impl Strategy<Value = Rule> {
    let sgd = (
        prop_oneof![Just(0.0), 0.0..0.99f64],
        prop_oneof![Just(0.0), 0.0..1.0f64],
        any::<bool>(),
    )
        .prop_map(|(momentum, dampening, nesterov)| {
            // PyTorch accepts Nesterov only with momentum > 0 and dampening 0.
            let nesterov = nesterov && momentum > 0.0;
            Rule::Sgd {
                momentum,
                dampening: if nesterov { 0.0 } else { dampening },
                nesterov,
            }
        });
    // ε log-uniform in [1e-8, 1e-3].
    let adam = || (0.0..0.99f64, 0.9..0.9999f64, -8.0..-3.0f64);
    prop_oneof![
        sgd,
        adam().prop_map(|(beta1, beta2, e)| Rule::Adam {
            beta1,
            beta2,
            eps: 10f64.powf(e)
        }),
        adam().prop_map(|(beta1, beta2, e)| Rule::AdamW {
            beta1,
            beta2,
            eps: 10f64.powf(e)
        }),
        (
            0.8..0.999f64,
            -8.0..-3.0f64,
            prop_oneof![Just(0.0), 0.0..0.95f64],
            any::<bool>()
        )
            .prop_map(|(alpha, e, momentum, centered)| Rule::RmsProp {
                alpha,
                eps: 10f64.powf(e),
                momentum,
                centered,
            }),
        (
            prop_oneof![Just(0.0), 0.0..0.5f64],
            -10.0..-3.0f64,
            prop_oneof![Just(0.0), 0.0..1.0f64]
        )
            .prop_map(|(lr_decay, e, init)| Rule::Adagrad {
                lr_decay,
                eps: 10f64.powf(e),
                init,
            }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let values = |n: usize| prop::collection::vec(-2.0..2.0f64, n);
    (
        rule(),
        -3.0..-0.5f64, // lr log-uniform in [1e-3, 0.32]
        prop_oneof![Just(0.0), 0.0..0.1f64],
        prop::collection::vec(1usize..=8, 1..=5),
        1usize..=6,
    )
        .prop_flat_map(move |(rule, lr, weight_decay, lens, steps)| {
            let params: Vec<_> = lens.iter().map(|&n| values(n)).collect();
            let grads = prop::collection::vec(params.clone(), steps);
            (Just((rule, 10f64.powf(lr), weight_decay)), params, grads)
        })
        .prop_map(|((rule, lr, weight_decay), params, grads)| Case {
            rule,
            lr,
            weight_decay,
            params,
            grads,
        })
}

/// The parameters after the last step, from PyTorch's documented pseudo-code, element by
/// element in f64 (θ: parameter, g: gradient, γ: lr, λ: weight decay, t: step from 1).
fn reference(c: &Case) -> Vec<Vec<f64>> {
    let (lr, wd) = (c.lr, c.weight_decay);
    let mut out = Vec::new();
    for (p, theta0) in c.params.iter().enumerate() {
        let mut theta = theta0.clone();
        for (i, th) in theta.iter_mut().enumerate() {
            // SGD's (and RMSprop's) momentum buffer b; Adam's first and second moments m, v
            // (RMSprop: v is square_avg, m is grad_avg); Adagrad's sum s.
            let (mut b, mut m, mut v) = (0.0, 0.0, 0.0);
            let mut s = match c.rule {
                Rule::Adagrad { init, .. } => init,
                _ => 0.0,
            };
            for (t0, step) in c.grads.iter().enumerate() {
                let t = t0 as i32 + 1;
                let mut g = step[p][i];
                match c.rule {
                    Rule::Sgd {
                        momentum: mu,
                        dampening: tau,
                        nesterov,
                    } => {
                        // if λ ≠ 0: g ← g + λθ
                        g += wd * *th;
                        if mu != 0.0 {
                            // b ← g at t = 1, else μb + (1 − τ)g
                            b = if t > 1 { mu * b + (1.0 - tau) * g } else { g };
                            // nesterov: g ← g + μb, else g ← b
                            g = if nesterov { g + mu * b } else { b };
                        }
                        *th -= lr * g;
                    }
                    Rule::Adam { beta1, beta2, eps } | Rule::AdamW { beta1, beta2, eps } => {
                        if matches!(c.rule, Rule::AdamW { .. }) {
                            // AdamW: θ ← θ − γλθ
                            *th -= lr * wd * *th;
                        } else {
                            // Adam: g ← g + λθ
                            g += wd * *th;
                        }
                        m = beta1 * m + (1.0 - beta1) * g;
                        v = beta2 * v + (1.0 - beta2) * g * g;
                        let m_hat = m / (1.0 - beta1.powi(t));
                        let v_hat = v / (1.0 - beta2.powi(t));
                        *th -= lr * m_hat / (v_hat.sqrt() + eps);
                    }
                    Rule::RmsProp {
                        alpha,
                        eps,
                        momentum: mu,
                        centered,
                    } => {
                        g += wd * *th;
                        // v ← αv + (1−α)g²; centered: m ← αm + (1−α)g, ṽ = v − m²
                        v = alpha * v + (1.0 - alpha) * g * g;
                        let avg = if centered {
                            m = alpha * m + (1.0 - alpha) * g;
                            (v - m * m).sqrt() + eps
                        } else {
                            v.sqrt() + eps
                        };
                        if mu > 0.0 {
                            b = mu * b + g / avg;
                            *th -= lr * b;
                        } else {
                            *th -= lr * g / avg;
                        }
                    }
                    Rule::Adagrad { lr_decay, eps, .. } => {
                        g += wd * *th;
                        let clr = lr / (1.0 + f64::from(t - 1) * lr_decay);
                        s += g * g;
                        *th -= clr * g / (s.sqrt() + eps);
                    }
                }
            }
        }
        out.push(theta);
    }
    out
}

/// The library's optimizer for a case, through its public constructors.
fn optimizer(c: &Case) -> Optimizer {
    let built = match c.rule {
        Rule::Sgd {
            momentum,
            dampening,
            nesterov,
        } => if momentum == 0.0 {
            Optimizer::sgd(c.lr)
        } else {
            Optimizer::momentum(c.lr, momentum)
        }
        .and_then(|o| o.dampening_nesterov(dampening, nesterov)),
        Rule::Adam { beta1, beta2, eps } => {
            Optimizer::adam(c.lr).and_then(|o| o.betas_eps(beta1, beta2, eps))
        }
        Rule::AdamW { beta1, beta2, eps } => {
            Optimizer::adamw(c.lr).and_then(|o| o.betas_eps(beta1, beta2, eps))
        }
        Rule::RmsProp {
            alpha,
            eps,
            momentum,
            centered,
        } => {
            Optimizer::rmsprop(c.lr).and_then(|o| o.rmsprop_options(alpha, eps, momentum, centered))
        }
        Rule::Adagrad {
            lr_decay,
            eps,
            init,
        } => Optimizer::adagrad(c.lr).and_then(|o| o.adagrad_options(lr_decay, eps, init)),
    };
    built
        .and_then(|o| o.weight_decay(c.weight_decay))
        .unwrap_or_else(|e| panic!("the generated hyper-parameters are valid: {e}"))
}

/// The case with every value rounded to `T`: what a `T` session starts from and is given.
fn rounded<T: Scalar>(c: &Case) -> Case {
    let r = |v: &Vec<f64>| v.iter().map(|&x| T::lit(x).as_f64()).collect::<Vec<f64>>();
    Case {
        params: c.params.iter().map(r).collect(),
        grads: c.grads.iter().map(|s| s.iter().map(r).collect()).collect(),
        ..c.clone()
    }
}

fn tensor<T: Scalar>(v: &[f64]) -> Tensor<T> {
    Tensor::vector(v.iter().map(|&x| T::lit(x)).collect())
}

/// Record `Σ_p Σ w_p·c_p` for one step's gradients `c` (every leaf first: the linked session
/// wants its leaves before any op). The parameters of index 0 and 3 are used twice, each use
/// with `c/2` (exact in binary), so their gradient is still exactly `c` but reaches the
/// optimizer as two contributions that the session must add (a step that kept only one was
/// missed until this: `cargo xtask mutants`, `optim-sgd-first-gradient-only`). The others,
/// with one gradient each, step together in the device's list launches (up to three in one
/// `adam_update_list` / `momentum_update_list` launch).
fn loss<S: Ops + ?Sized>(
    s: &mut S,
    ps: &[Param],
    grads: &[Vec<f64>],
) -> tl_session::Result<TensorRef> {
    let mut leaves = Vec::new();
    for (k, (p, g)) in ps.iter().zip(grads).enumerate() {
        if k % 3 == 0 {
            let half: Vec<f64> = g.iter().map(|v| 0.5 * v).collect();
            for _ in 0..2 {
                let w = s.use_param(p)?;
                let c = s.input(tensor::<S::T>(&half), false)?;
                leaves.push((w, c));
            }
        } else {
            let w = s.use_param(p)?;
            let c = s.input(tensor::<S::T>(g), false)?;
            leaves.push((w, c));
        }
    }
    let mut total: Option<TensorRef> = None;
    for (w, c) in &leaves {
        let y = s.mul(w, c)?;
        let l = s.sum(&y)?;
        total = Some(match total {
            None => l,
            Some(a) => s.add(&a, &l)?,
        });
    }
    Ok(total.expect("at least one parameter"))
}

/// The eager session on `backend`: the parameters after the last step. Each step is a
/// backward, a step and a reset, or, with `in_place`, a step that ends its pass as
/// `Runtime::step` takes it (`backward_step_reduced_then_reset`: on the CPU the parameters are
/// written in place).
fn eager<T: Scalar>(
    backend: Backend,
    c: &Case,
    in_place: bool,
) -> tl_session::Result<Vec<Vec<f64>>> {
    let mut s = Session::<T>::new(Options::backend(backend))?;
    let ps = c
        .params
        .iter()
        .map(|w| s.param(tensor(w), None, true))
        .collect::<tl_session::Result<Vec<_>>>()?;
    let mut opt = optimizer(c);
    for step in &c.grads {
        let l = loss(&mut s, &ps, step)?;
        if in_place {
            s.backward_step_reduced_then_reset(&l, &mut opt, None)?;
        } else {
            s.backward(&l)?;
            s.step(&mut opt)?;
            s.reset();
        }
    }
    ps.iter().map(|p| Ok(f64s(&s.param_value(p)?))).collect()
}

/// The linked session (f64): the parameters after the last step.
fn linked(c: &Case) -> tl_session::Result<Vec<Vec<f64>>> {
    let mut s = LinkedSession::<f64>::new();
    let ps = c
        .params
        .iter()
        .map(|w| s.param(tensor(w), None, true))
        .collect::<tl_session::Result<Vec<_>>>()?;
    let mut opt = optimizer(c);
    for step in &c.grads {
        let l = loss(&mut s, &ps, step)?;
        let g = s.backward_scalar_dense_all(&l)?;
        s.step(&mut opt, &g)?;
        s.reset();
    }
    ps.iter().map(|p| Ok(f64s(&s.param_value(p)?))).collect()
}

/// The device's steps (fused where the gate allows) bit for bit those of the rule composed
/// from the primitives (`force_fused_optimizer(Some(false))`).
fn fused_equals_composed(backend: Backend, c: &Case) -> Result<(), TestCaseError> {
    let bits = |r: tl_session::Result<Vec<Vec<f64>>>| -> Result<Vec<Vec<u64>>, TestCaseError> {
        let r = r.map_err(|e| TestCaseError::fail(format!("{}: {e}", backend.name())))?;
        Ok(r.iter()
            .map(|p| p.iter().map(|v| v.to_bits()).collect())
            .collect())
    };
    let fused = bits(eager::<f32>(backend, c, false))?;
    let composed = {
        let _off = tl_tape_cuda::gates::force_fused_optimizer(Some(false));
        bits(eager::<f32>(backend, c, false))?
    };
    prop_assert!(
        fused == composed,
        "{}: the fused optimizer steps differ from the composed rule",
        backend.name()
    );
    Ok(())
}

fn f64s<T: Scalar>(t: &Tensor<T>) -> Vec<f64> {
    t.data().iter().map(|v| v.as_f64()).collect()
}

/// `|got − want| ≤ tol · max(1, |want|)` element for element.
fn compare(
    got: tl_session::Result<Vec<Vec<f64>>>,
    want: &[Vec<f64>],
    tol: f64,
    what: &str,
) -> Result<(), TestCaseError> {
    let got = got.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
    prop_assert_eq!(got.len(), want.len(), "{}: parameter count", what);
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert_eq!(g.len(), w.len(), "{}: parameter {} length", what, p);
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            prop_assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "{what}: parameter {p}[{i}]: got {g}, reference {w} (tol {tol})"
            );
        }
    }
    Ok(())
}

#[test]
fn optimizer_steps_match_pytorchs_update_rules() {
    let cfg = RunConfig::from_env();
    let mut runner = cfg.runner("optim");
    let result = runner.run(&case(), |c| {
        let want = reference(&c);
        compare(
            eager::<f64>(Backend::Cpu, &c, false),
            &want,
            1e-10,
            "cpu f64",
        )?;
        compare(
            eager::<f64>(Backend::Cpu, &c, true),
            &want,
            1e-10,
            "cpu f64 in place",
        )?;
        compare(linked(&c), &want, 1e-10, "linked f64")?;
        let want32 = reference(&rounded::<f32>(&c));
        compare(
            eager::<f32>(Backend::Cpu, &c, false),
            &want32,
            1e-4,
            "cpu f32",
        )?;
        compare(
            eager::<f32>(Backend::Cpu, &c, true),
            &want32,
            1e-4,
            "cpu f32 in place",
        )?;
        compare(
            eager::<f32>(Backend::CudaSim, &c, false),
            &want32,
            1e-4,
            "cuda-sim f32",
        )?;
        fused_equals_composed(Backend::CudaSim, &c)?;
        #[cfg(feature = "cuda-emu")]
        {
            compare(
                eager::<f32>(Backend::Cuda, &c, false),
                &want32,
                1e-4,
                "cuda-emu f32",
            )?;
            fused_equals_composed(Backend::Cuda, &c)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The comparison has teeth: runs of the library's AdamW, dampened momentum and Nesterov
/// momentum are told apart from the reference of a neighbouring rule (Adam's L2 decay, no
/// dampening, no Nesterov), on the f64 CPU session and on the CUDA sim.
#[test]
fn the_comparison_tells_neighbouring_rules_apart() {
    let base = Case {
        rule: Rule::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        lr: 0.1,
        weight_decay: 0.05,
        params: vec![vec![1.5, -0.7, 0.3]],
        grads: (0..3)
            .map(|t| vec![vec![0.2 + 0.1 * t as f64, -0.4, 0.9 - 0.3 * t as f64]])
            .collect(),
    };
    let adam = Rule::Adam {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let momentum = |dampening, nesterov| Rule::Sgd {
        momentum: 0.9,
        dampening,
        nesterov,
    };
    // (the rule run, the rule of the wrong reference)
    let rms = |momentum, centered| Rule::RmsProp {
        alpha: 0.9,
        eps: 1e-8,
        momentum,
        centered,
    };
    let adagrad = |lr_decay| Rule::Adagrad {
        lr_decay,
        eps: 1e-10,
        init: 0.1,
    };
    let pairs = [
        (base.rule, adam),
        (momentum(0.5, false), momentum(0.0, false)),
        (momentum(0.0, true), momentum(0.0, false)),
        (rms(0.0, true), rms(0.0, false)),
        (rms(0.5, false), rms(0.0, false)),
        (adagrad(0.3), adagrad(0.0)),
    ];
    for (run, wrong) in pairs {
        let c = Case {
            rule: run,
            ..base.clone()
        };
        let bad = reference(&Case {
            rule: wrong,
            ..c.clone()
        });
        // The right reference passes, the wrong one fails, on both precisions.
        compare(
            eager::<f64>(Backend::Cpu, &c, false),
            &reference(&c),
            1e-10,
            "cpu f64",
        )
        .unwrap();
        assert!(
            compare(
                eager::<f64>(Backend::Cpu, &c, false),
                &bad,
                1e-10,
                "cpu f64"
            )
            .is_err()
        );
        let want32 = reference(&rounded::<f32>(&c));
        compare(
            eager::<f32>(Backend::CudaSim, &c, false),
            &want32,
            1e-4,
            "sim",
        )
        .unwrap();
        let bad32 = reference(&Case {
            rule: wrong,
            ..rounded::<f32>(&c)
        });
        assert!(
            compare(
                eager::<f32>(Backend::CudaSim, &c, false),
                &bad32,
                1e-4,
                "sim"
            )
            .is_err()
        );
    }
}

/// A parameter longer than two of the host update's blocks
/// (`tl_session::optim::HOST_BLOCK` elements each: the stateful rules widen a block at a time
/// to f64): every rule's steps equal the reference across the blocks' seams and the short last
/// block, f64 and f32, stepped both ways on the CPU and on the linked session.
#[test]
fn a_parameter_of_several_host_blocks_steps_as_the_reference() {
    let n = 2 * tl_session::optim::HOST_BLOCK + 5;
    let wave = |i: usize, t: usize| ((i * 37 + t * 11) % 101) as f64 / 50.0 - 1.0;
    let rules = [
        Rule::Sgd {
            momentum: 0.9,
            dampening: 0.2,
            nesterov: false,
        },
        Rule::Sgd {
            momentum: 0.8,
            dampening: 0.0,
            nesterov: true,
        },
        Rule::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        Rule::AdamW {
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-6,
        },
        Rule::RmsProp {
            alpha: 0.9,
            eps: 1e-8,
            momentum: 0.5,
            centered: true,
        },
        Rule::Adagrad {
            lr_decay: 0.1,
            eps: 1e-10,
            init: 0.1,
        },
    ];
    for rule in rules {
        let c = Case {
            rule,
            lr: 0.05,
            weight_decay: 0.01,
            params: vec![(0..n).map(|i| wave(i, 0)).collect()],
            grads: (1..4)
                .map(|t| vec![(0..n).map(|i| wave(i, t)).collect()])
                .collect(),
        };
        let what = format!("{rule:?}");
        let want = reference(&c);
        let want32 = reference(&rounded::<f32>(&c));
        let runs = [
            (
                eager::<f64>(Backend::Cpu, &c, false),
                &want,
                1e-10,
                "cpu f64",
            ),
            (
                eager::<f64>(Backend::Cpu, &c, true),
                &want,
                1e-10,
                "cpu f64 in place",
            ),
            (linked(&c), &want, 1e-10, "linked f64"),
            (
                eager::<f32>(Backend::Cpu, &c, false),
                &want32,
                1e-4,
                "cpu f32",
            ),
            (
                eager::<f32>(Backend::Cpu, &c, true),
                &want32,
                1e-4,
                "cpu f32 in place",
            ),
        ];
        for (got, want, tol, how) in runs {
            compare(got, want, tol, how).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}
