//! The losses of `tl_nn::losses` and the activations `geluErf`, `leakyRelu`, `elu` against
//! PyTorch's values and gradients (`losses_fixture.rs`, written by
//! `tests/fixtures/make_losses.py`), every reduction, on the eager CPU session, the linked
//! session and the CUDA simulation; and their bad inputs.

use tl_nn::losses::{
    Reduction, binary_cross_entropy_with_logits, cross_entropy, huber_loss, l1_loss, nll_loss,
    relative_l2_loss, smooth_l1_loss,
};
use tl_nn::{Labels, Runtime, Scope, Var};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::{Scalar, Tensor};

use crate::losses_fixture as fx;
use crate::{Input, eager, linked, rel, vals};

/// The input `x` as the one trainable parameter of a model.
/// One loss of the fixture: its name, the fixture's values for mean, sum and none, the
/// gradients of mean and sum, and the loss as a function of x (a `(3, 4)` tensor).
type Case<O> = (&'static str, [&'static [f64]; 5], LossFn<O>);

/// Every loss of the fixture.
fn cases<O: Train>() -> Vec<Case<O>> {
    vec![
        (
            "bce",
            [
                fx::BCE_MEAN,
                fx::BCE_SUM,
                fx::BCE_NONE,
                fx::BCE_MEAN_GRAD,
                fx::BCE_SUM_GRAD,
            ],
            Box::new(|x, g, r| {
                let y = g.input(vals(fx::Y, &[3, 4]))?;
                binary_cross_entropy_with_logits(x, &y, None, None, r)
            }),
        ),
        (
            "bce weighted",
            [
                fx::BCE_WEIGHTED_MEAN,
                fx::BCE_WEIGHTED_SUM,
                fx::BCE_WEIGHTED_NONE,
                fx::BCE_WEIGHTED_MEAN_GRAD,
                fx::BCE_WEIGHTED_SUM_GRAD,
            ],
            Box::new(|x, g, r| {
                let y = g.input(vals(fx::Y, &[3, 4]))?;
                let w = g.input(vals(fx::WEIGHT, &[4]))?;
                let pw = g.input(vals(fx::POS_WEIGHT, &[4]))?;
                binary_cross_entropy_with_logits(x, &y, Some(&w), Some(&pw), r)
            }),
        ),
        (
            "nll",
            [
                fx::NLL_MEAN,
                fx::NLL_SUM,
                fx::NLL_NONE,
                fx::NLL_MEAN_GRAD,
                fx::NLL_SUM_GRAD,
            ],
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                nll_loss(&x.log_softmax()?, &labels, None, None, r)
            }),
        ),
        (
            "nll weighted, ignore_index",
            [
                fx::NLL_WEIGHTED_IGNORE_MEAN,
                fx::NLL_WEIGHTED_IGNORE_SUM,
                fx::NLL_WEIGHTED_IGNORE_NONE,
                fx::NLL_WEIGHTED_IGNORE_MEAN_GRAD,
                fx::NLL_WEIGHTED_IGNORE_SUM_GRAD,
            ],
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                nll_loss(
                    &x.log_softmax()?,
                    &labels,
                    Some(fx::CLASS_WEIGHT),
                    Some(0),
                    r,
                )
            }),
        ),
        (
            "cross entropy, label smoothing 0.1",
            [
                fx::CE_SMOOTH_MEAN,
                fx::CE_SMOOTH_SUM,
                fx::CE_SMOOTH_NONE,
                fx::CE_SMOOTH_MEAN_GRAD,
                fx::CE_SMOOTH_SUM_GRAD,
            ],
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                cross_entropy(x, &labels, None, None, 0.1, r)
            }),
        ),
        (
            "cross entropy weighted, ignore_index, label smoothing 0.2",
            [
                fx::CE_SMOOTH_WEIGHTED_IGNORE_MEAN,
                fx::CE_SMOOTH_WEIGHTED_IGNORE_SUM,
                fx::CE_SMOOTH_WEIGHTED_IGNORE_NONE,
                fx::CE_SMOOTH_WEIGHTED_IGNORE_MEAN_GRAD,
                fx::CE_SMOOTH_WEIGHTED_IGNORE_SUM_GRAD,
            ],
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                cross_entropy(x, &labels, Some(fx::CLASS_WEIGHT), Some(0), 0.2, r)
            }),
        ),
        (
            "l1",
            [
                fx::L1_MEAN,
                fx::L1_SUM,
                fx::L1_NONE,
                fx::L1_MEAN_GRAD,
                fx::L1_SUM_GRAD,
            ],
            Box::new(|x, g, r| l1_loss(x, &g.input(vals(fx::T, &[3, 4]))?, r)),
        ),
        (
            "huber 1",
            [
                fx::HUBER_1_MEAN,
                fx::HUBER_1_SUM,
                fx::HUBER_1_NONE,
                fx::HUBER_1_MEAN_GRAD,
                fx::HUBER_1_SUM_GRAD,
            ],
            Box::new(|x, g, r| huber_loss(x, &g.input(vals(fx::T, &[3, 4]))?, 1.0, r)),
        ),
        (
            "huber 0.5",
            [
                fx::HUBER_0_5_MEAN,
                fx::HUBER_0_5_SUM,
                fx::HUBER_0_5_NONE,
                fx::HUBER_0_5_MEAN_GRAD,
                fx::HUBER_0_5_SUM_GRAD,
            ],
            Box::new(|x, g, r| huber_loss(x, &g.input(vals(fx::T, &[3, 4]))?, 0.5, r)),
        ),
        (
            "smooth l1 0.5",
            [
                fx::SMOOTH_L1_0_5_MEAN,
                fx::SMOOTH_L1_0_5_SUM,
                fx::SMOOTH_L1_0_5_NONE,
                fx::SMOOTH_L1_0_5_MEAN_GRAD,
                fx::SMOOTH_L1_0_5_SUM_GRAD,
            ],
            Box::new(|x, g, r| smooth_l1_loss(x, &g.input(vals(fx::T, &[3, 4]))?, 0.5, r)),
        ),
        (
            "smooth l1 0",
            [
                fx::SMOOTH_L1_0_MEAN,
                fx::SMOOTH_L1_0_SUM,
                fx::SMOOTH_L1_0_NONE,
                fx::SMOOTH_L1_0_MEAN_GRAD,
                fx::SMOOTH_L1_0_SUM_GRAD,
            ],
            Box::new(|x, g, r| smooth_l1_loss(x, &g.input(vals(fx::T, &[3, 4]))?, 0.0, r)),
        ),
    ]
}

/// A loss of x: `(x, scope, reduction) ↦ loss`.
type LossFn<O> =
    Box<dyn for<'g> Fn(&Var<'g, O>, &Scope<'g, O>, Reduction) -> tl_nn::Result<Var<'g, O>>>;

/// Every case's values (three reductions) and gradients (mean, sum; by one SGD step of lr 1,
/// so `x − x'` is the gradient) on `rt`, within `tol` of PyTorch's.
fn check_all<O: Train>(rt: &mut Runtime<O>, tol: f64, backend: &str) {
    let p = rt
        .vars()
        .param_from("x", vals(fx::X, &[3, 4]), true)
        .unwrap();
    let model = Input(p.clone());
    for (name, want, loss) in cases::<O>() {
        for (k, r) in [Reduction::Mean, Reduction::Sum, Reduction::None]
            .into_iter()
            .enumerate()
        {
            rt.set_value(&p, vals(fx::X, &[3, 4])).unwrap();
            let v = rt
                .eval(&model, |g| loss(&g.param(&p)?, g, r))
                .unwrap_or_else(|e| panic!("{backend} {name} {r:?}: {e}"));
            let got: Vec<f64> = v.data().iter().map(|x| x.as_f64()).collect();
            let err = rel(&got, want[k]);
            assert!(
                err <= tol,
                "{backend} {name} {r:?}: {got:?} vs {:?}",
                want[k]
            );
            if r == Reduction::None {
                continue;
            }
            let mut opt = Optimizer::sgd(1.0).unwrap();
            rt.step(&model, &mut opt, |g| loss(&g.param(&p)?, g, r))
                .unwrap();
            let after = rt.value_of(&p).unwrap();
            let grad: Vec<f64> = fx::X
                .iter()
                .zip(after.data())
                .map(|(x, a)| x - a.as_f64())
                .collect();
            let err = rel(&grad, want[3 + k]);
            assert!(
                err <= tol,
                "{backend} {name} {r:?} gradient: {grad:?} vs {:?}",
                want[3 + k]
            );
        }
    }
}

#[test]
fn losses_match_pytorch_on_every_reduction_and_backend() {
    check_all(&mut eager::<f64>(Backend::Cpu, 0), 1e-12, "cpu");
    check_all(&mut linked::<f64>(0), 1e-12, "linked");
    check_all(&mut eager::<f32>(Backend::CudaSim, 0), 2e-6, "cuda-sim");
}

#[test]
fn bad_loss_inputs_are_errors_naming_the_loss_and_the_value() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let empty = tl_nn::Sequential::<tl_session::Session<f64>>::new();
    type S = tl_session::Session<f64>;
    type Pass<'a> = dyn for<'g> Fn(&Scope<'g, S>) -> tl_nn::Result<Var<'g, S>> + 'a;
    let err = |f: &Pass<'_>| rt.eval(&empty, f).unwrap_err().to_string();
    let x = || vals::<f64>(fx::X, &[3, 4]);
    let e = err(&|g| {
        l1_loss(
            &g.input(x())?,
            &g.input(Tensor::zeros([4, 3]))?,
            Reduction::Mean,
        )
    });
    assert!(
        e.contains("l1_loss") && e.contains("[3, 4]") && e.contains("[4, 3]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        binary_cross_entropy_with_logits(
            &x,
            &g.input(Tensor::zeros([3]))?,
            None,
            None,
            Reduction::Sum,
        )
    });
    assert!(e.contains("binary_cross_entropy_with_logits"), "{e}");
    // A weight that widens the loss.
    let e = err(&|g| {
        let x = g.input(x())?;
        let w = g.input(Tensor::ones([2, 3, 4]))?;
        binary_cross_entropy_with_logits(&x, &x, Some(&w), None, Reduction::Sum)
    });
    assert!(
        e.contains("binary_cross_entropy_with_logits") && e.contains("[2, 3, 4]"),
        "{e}"
    );
    for delta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = err(&|g| huber_loss(&g.input(x())?, &g.input(x())?, delta, Reduction::Mean));
        assert!(
            e.contains("huber_loss") && e.contains(&format!("{delta}")),
            "{e}"
        );
    }
    let e = err(&|g| smooth_l1_loss(&g.input(x())?, &g.input(x())?, -0.5, Reduction::Mean));
    assert!(e.contains("smooth_l1_loss") && e.contains("-0.5"), "{e}");
    // Labels: out of range (refused when made), a count or class number that does not fit,
    // a weight per class of the wrong length, every row ignored.
    let e = Labels::new(vec![0, 4], 4).unwrap_err().to_string();
    assert!(e.contains("label 4") && e.contains("4 classes"), "{e}");
    let e = err(&|g| {
        let labels = Labels::new(vec![0, 1], 4)?;
        nll_loss(&g.input(x())?, &labels, None, None, Reduction::Mean)
    });
    assert!(
        e.contains("nll_loss") && e.contains("3 row(s)") && e.contains("2 value(s)"),
        "{e}"
    );
    let e = err(&|g| {
        let labels = Labels::new(vec![0, 1, 2], 5)?;
        nll_loss(&g.input(x())?, &labels, None, None, Reduction::Mean)
    });
    assert!(e.contains("nll_loss") && e.contains("5 classes"), "{e}");
    let e = err(&|g| {
        let labels = Labels::new(vec![0, 1, 2], 4)?;
        nll_loss(
            &g.input(x())?,
            &labels,
            Some(&[1.0, 2.0]),
            None,
            Reduction::Mean,
        )
    });
    assert!(e.contains("nll_loss") && e.contains("weight has 2"), "{e}");
    let e = err(&|g| {
        let labels = Labels::new(vec![1, 1, 1], 4)?;
        nll_loss(&g.input(x())?, &labels, None, Some(1), Reduction::Mean)
    });
    assert!(e.contains("nll_loss") && e.contains("ignored"), "{e}");
    let e = err(&|g| {
        let labels = Labels::new(vec![1], 4)?;
        nll_loss(
            &g.input(Tensor::zeros([1, 2, 4]))?,
            &labels,
            None,
            None,
            Reduction::Sum,
        )
    });
    assert!(e.contains("nll_loss") && e.contains("[1, 2, 4]"), "{e}");
    // cross_entropy: label smoothing outside [0, 1], and the label checks under its own name.
    for eps in [-0.1, 1.5, f64::NAN] {
        let e = err(&|g| {
            let labels = Labels::new(vec![0, 1, 2], 4)?;
            cross_entropy(&g.input(x())?, &labels, None, None, eps, Reduction::Mean)
        });
        assert!(
            e.contains("cross_entropy") && e.contains("label_smoothing"),
            "{e}"
        );
    }
    let e = err(&|g| {
        let labels = Labels::new(vec![1, 1, 1], 4)?;
        cross_entropy(&g.input(x())?, &labels, None, Some(1), 0.1, Reduction::Mean)
    });
    assert!(e.contains("cross_entropy") && e.contains("ignored"), "{e}");
    // Leaky ReLU and ELU refuse a non-finite parameter, naming the op and the value.
    let e = err(&|g| g.input(x())?.leaky_relu(f64::NAN));
    assert!(e.contains("leakyRelu") && e.contains("NaN"), "{e}");
    let e = err(&|g| g.input(x())?.elu(f64::INFINITY));
    assert!(e.contains("elu") && e.contains("inf"), "{e}");
}

#[test]
fn nll_of_one_unbatched_row_is_a_scalar() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let empty = tl_nn::Sequential::<tl_session::Session<f64>>::new();
    let labels = Labels::new(vec![2], 4).unwrap();
    for r in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let v = rt
            .eval(&empty, |g| {
                nll_loss(&g.input(vals(&fx::X[..4], &[4]))?, &labels, None, None, r)
            })
            .unwrap();
        assert!(v.shape().dims().is_empty());
        assert_eq!(v.data()[0], -fx::X[2]);
    }
}

/// `relative_l2_loss` of x against T (three examples of four): the values
/// `‖x_b − t_b‖ / ‖t_b‖` and the gradient `(x_b − t_b) / (‖x_b − t_b‖·‖t_b‖)` (sum) computed
/// here in f64, on the eager CPU session and the linked session; a scalar input is an error.
#[test]
fn relative_l2_matches_its_closed_form() {
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let mut want = Vec::new();
    let mut grad = Vec::new();
    for b in 0..3 {
        let (x, y) = (&fx::X[4 * b..4 * b + 4], &fx::T[4 * b..4 * b + 4]);
        let d: Vec<f64> = x.iter().zip(y).map(|(a, c)| a - c).collect();
        want.push(norm(&d) / norm(y));
        grad.extend(d.iter().map(|v| v / (norm(&d) * norm(y))));
    }
    fn run<O: Train>(rt: &mut Runtime<O>, want: &[f64], grad: &[f64], tol: f64) {
        let p = rt
            .vars()
            .param_from("x", vals(fx::X, &[3, 4]), true)
            .unwrap();
        let model = Input(p.clone());
        let none = rt
            .eval(&model, |g| {
                relative_l2_loss(
                    &g.param(&p)?,
                    &g.input(vals(fx::T, &[3, 4]))?,
                    Reduction::None,
                )
            })
            .unwrap();
        let got: Vec<f64> = none.data().iter().map(|v| v.as_f64()).collect();
        assert!(rel(&got, want) <= tol, "{got:?} vs {want:?}");
        let mean = rt
            .eval(&model, |g| {
                relative_l2_loss(
                    &g.param(&p)?,
                    &g.input(vals(fx::T, &[3, 4]))?,
                    Reduction::Mean,
                )
            })
            .unwrap();
        let m = want.iter().sum::<f64>() / 3.0;
        assert!((mean.data()[0].as_f64() - m).abs() <= tol, "{m}");
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| {
            relative_l2_loss(
                &g.param(&p)?,
                &g.input(vals(fx::T, &[3, 4]))?,
                Reduction::Sum,
            )
        })
        .unwrap();
        let after = rt.value_of(&p).unwrap();
        let got: Vec<f64> = fx::X
            .iter()
            .zip(after.data())
            .map(|(x, a)| x - a.as_f64())
            .collect();
        assert!(rel(&got, grad) <= tol, "gradient {got:?} vs {grad:?}");
    }
    run(&mut eager::<f64>(Backend::Cpu, 0), &want, &grad, 1e-12);
    run(&mut linked::<f64>(0), &want, &grad, 1e-12);
    let rt = eager::<f64>(Backend::Cpu, 0);
    let p = rt.vars().param_from("s", vals(&[1.0], &[]), true).unwrap();
    let e = rt
        .eval(&Input(p), |g| {
            let s = g.input(vals(&[2.0], &[]))?;
            relative_l2_loss(&s, &s, Reduction::Mean)
        })
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("relative_l2_loss") && e.contains("batch axis"),
        "{e}"
    );
}

/// Without label smoothing `cross_entropy` is `nll_loss` of `log_softmax`, bit for bit, and
/// with no options it is the catalogue's fused `Var::cross_entropy` within rounding.
#[test]
fn cross_entropy_without_smoothing_is_nll_of_log_softmax() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let p = rt
        .vars()
        .param_from("x", vals(fx::X, &[3, 4]), true)
        .unwrap();
    let labels = Labels::new(fx::LABELS.to_vec(), 4).unwrap();
    let model = Input(p.clone());
    for r in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let w = Some(fx::CLASS_WEIGHT);
        let a = rt
            .eval(&model, |g| {
                cross_entropy(&g.param(&p)?, &labels, w, Some(0), 0.0, r)
            })
            .unwrap();
        let b = rt
            .eval(&model, |g| {
                nll_loss(&g.param(&p)?.log_softmax()?, &labels, w, Some(0), r)
            })
            .unwrap();
        assert_eq!(a.data(), b.data(), "{r:?}");
    }
    let a = rt
        .eval(&model, |g| {
            cross_entropy(&g.param(&p)?, &labels, None, None, 0.0, Reduction::Mean)
        })
        .unwrap();
    let b = rt
        .eval(&model, |g| g.param(&p)?.cross_entropy(&labels))
        .unwrap();
    assert!((a.data()[0] - b.data()[0]).abs() < 1e-14, "{a:?} vs {b:?}");
}
