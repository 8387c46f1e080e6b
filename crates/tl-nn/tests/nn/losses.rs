//! The losses of `tl_nn::losses` and the activations `geluErf`, `leakyRelu`, `elu` against
//! PyTorch's values and gradients (`losses_fixture.rs`, written by
//! `tests/fixtures/make_losses.py`), every reduction, on the eager CPU session, the linked
//! session and the CUDA simulation; and their bad inputs.

use tl_nn::losses::{
    KlReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cosine_embedding_loss, cross_entropy, gaussian_nll_loss, hinge_embedding_loss, huber_loss,
    kl_div, l1_loss, margin_ranking_loss, mse_loss, multi_margin_loss, multilabel_soft_margin_loss,
    nll_loss, poisson_nll_loss, relative_l2_loss, smooth_l1_loss, soft_margin_loss,
    triplet_margin_loss,
};
use tl_nn::{Labels, Runtime, Scope, Var};
use tl_session::{Backend, Optimizer, Param, Train};
use tl_spec::{Scalar, Tensor};

use crate::losses_fixture as fx;
use crate::{Input, eager, linked, rel, vals};

/// One loss of the fixture: its name, the fixture's values for mean, sum and none, the
/// gradients of mean and sum, and the loss as a function of x (a `(3, 4)` tensor).
type Case<O> = (&'static str, [&'static [f64]; 5], LossFn<O>);

/// Every loss of the fixture.
fn cases<O: Train>() -> Vec<Case<O>> {
    let labels = || Labels::new(fx::LABELS.to_vec(), 4);
    vec![
        (
            "bce",
            fx::BCE,
            Box::new(|x, g, r| {
                let y = c34(g, fx::Y)?;
                binary_cross_entropy_with_logits(x, &y, None, None, r)
            }),
        ),
        (
            "bce weighted",
            fx::BCE_WEIGHTED,
            Box::new(|x, g, r| {
                let y = c34(g, fx::Y)?;
                let w = g.input(vals(fx::WEIGHT, &[4]))?;
                let pw = g.input(vals(fx::POS_WEIGHT, &[4]))?;
                binary_cross_entropy_with_logits(x, &y, Some(&w), Some(&pw), r)
            }),
        ),
        (
            "nll",
            fx::NLL,
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                nll_loss(&x.log_softmax()?, &labels, None, None, r)
            }),
        ),
        (
            "nll weighted, ignore_index",
            fx::NLL_WEIGHTED_IGNORE,
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
            fx::CE_SMOOTH,
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                cross_entropy(x, &labels, None, None, 0.1, r)
            }),
        ),
        (
            "cross entropy weighted, ignore_index, label smoothing 0.2",
            fx::CE_SMOOTH_WEIGHTED_IGNORE,
            Box::new(|x, _, r| {
                let labels = Labels::new(fx::LABELS.to_vec(), 4)?;
                cross_entropy(x, &labels, Some(fx::CLASS_WEIGHT), Some(0), 0.2, r)
            }),
        ),
        (
            "l1",
            fx::L1,
            Box::new(|x, g, r| l1_loss(x, &c34(g, fx::T)?, r)),
        ),
        (
            "huber 1",
            fx::HUBER_1,
            Box::new(|x, g, r| huber_loss(x, &c34(g, fx::T)?, 1.0, r)),
        ),
        (
            "huber 0.5",
            fx::HUBER_0_5,
            Box::new(|x, g, r| huber_loss(x, &c34(g, fx::T)?, 0.5, r)),
        ),
        (
            "smooth l1 0.5",
            fx::SMOOTH_L1_0_5,
            Box::new(|x, g, r| smooth_l1_loss(x, &c34(g, fx::T)?, 0.5, r)),
        ),
        (
            "smooth l1 0",
            fx::SMOOTH_L1_0,
            Box::new(|x, g, r| smooth_l1_loss(x, &c34(g, fx::T)?, 0.0, r)),
        ),
        (
            "mse",
            fx::MSE,
            Box::new(|x, g, r| mse_loss(x, &c34(g, fx::T)?, r)),
        ),
        (
            "bce on probabilities",
            fx::BCE_PROBS,
            Box::new(|x, g, r| binary_cross_entropy(&x.sigmoid()?, &c34(g, fx::Y)?, None, r)),
        ),
        (
            "bce on probabilities, weighted",
            fx::BCE_PROBS_WEIGHTED,
            Box::new(|x, g, r| {
                let w = g.input(vals(fx::WEIGHT, &[4]))?;
                binary_cross_entropy(&x.sigmoid()?, &c34(g, fx::Y)?, Some(&w), r)
            }),
        ),
        (
            "kl_div",
            fx::KL,
            Box::new(|x, g, r| kl_div(&x.log_softmax()?, &c34(g, fx::Q)?, kl(r), false)),
        ),
        (
            "kl_div, log_target",
            fx::KL_LOG_TARGET,
            Box::new(|x, g, r| {
                let t = c34(g, fx::T)?.log_softmax()?;
                kl_div(&x.log_softmax()?, &t, kl(r), true)
            }),
        ),
        (
            "poisson, log input",
            fx::POISSON,
            Box::new(|x, g, r| poisson_nll_loss(x, &c34(g, fx::K)?, true, false, 1e-8, r)),
        ),
        (
            "poisson, rate, full",
            fx::POISSON_RATE_FULL,
            Box::new(|x, g, r| {
                poisson_nll_loss(&x.softplus()?, &c34(g, fx::K)?, false, true, 1e-8, r)
            }),
        ),
        (
            "gaussian",
            fx::GAUSSIAN,
            Box::new(|x, g, r| {
                gaussian_nll_loss(x, &c34(g, fx::T)?, &c34(g, fx::V)?, false, 1e-6, r)
            }),
        ),
        (
            "gaussian, a variance per row, full",
            fx::GAUSSIAN_ROWS_FULL,
            Box::new(|x, g, r| {
                let v = g.input(vals(fx::ROW_VAR, &[3]))?;
                gaussian_nll_loss(x, &c34(g, fx::T)?, &v, true, 1e-6, r)
            }),
        ),
        (
            "gaussian, a (3, 1) variance",
            fx::GAUSSIAN_COLUMN,
            Box::new(|x, g, r| {
                let v = g.input(vals(fx::ROW_VAR, &[3, 1]))?;
                gaussian_nll_loss(x, &c34(g, fx::T)?, &v, false, 1e-6, r)
            }),
        ),
        (
            "gaussian, the variance a function of x, one entry under eps",
            fx::GAUSSIAN_VAR_OF_X,
            Box::new(|x, g, r| {
                let v = x.scale(0.1)?.add_scalar(0.31)?;
                gaussian_nll_loss(&c34(g, fx::T)?, &c34(g, fx::Y)?, &v, false, 0.05, r)
            }),
        ),
        (
            "margin ranking 0 (kinks)",
            fx::MARGIN_RANKING_0,
            Box::new(|x, g, r| margin_ranking_loss(x, &c34(g, fx::T)?, &c34(g, fx::S)?, 0.0, r)),
        ),
        (
            "margin ranking 0.5",
            fx::MARGIN_RANKING_0_5,
            Box::new(|x, g, r| margin_ranking_loss(x, &c34(g, fx::T)?, &c34(g, fx::S)?, 0.5, r)),
        ),
        (
            "hinge embedding 0.5 (a kink)",
            fx::HINGE_0_5,
            Box::new(|x, g, r| hinge_embedding_loss(x, &c34(g, fx::S)?, 0.5, r)),
        ),
        (
            "hinge embedding 2 (a kink)",
            fx::HINGE_2,
            Box::new(|x, g, r| hinge_embedding_loss(x, &c34(g, fx::S)?, 2.0, r)),
        ),
        (
            "soft margin",
            fx::SOFT_MARGIN,
            Box::new(|x, g, r| soft_margin_loss(x, &c34(g, fx::S)?, r)),
        ),
        (
            "multilabel soft margin",
            fx::MULTILABEL,
            Box::new(|x, g, r| {
                let y = c34(g, &multilabel_targets())?;
                multilabel_soft_margin_loss(x, &y, None, r)
            }),
        ),
        (
            "multilabel soft margin, weighted",
            fx::MULTILABEL_WEIGHTED,
            Box::new(|x, g, r| {
                let y = c34(g, &multilabel_targets())?;
                let w = g.input(vals(fx::WEIGHT, &[4]))?;
                multilabel_soft_margin_loss(x, &y, Some(&w), r)
            }),
        ),
        (
            "multi margin",
            fx::MULTI_MARGIN,
            Box::new(move |x, _, r| multi_margin_loss(x, &labels()?, 1, 1.0, None, r)),
        ),
        (
            "multi margin p 2, weighted",
            fx::MULTI_MARGIN_P2_WEIGHTED,
            Box::new(move |x, _, r| {
                multi_margin_loss(x, &labels()?, 2, 0.7, Some(fx::CLASS_WEIGHT), r)
            }),
        ),
        (
            "cosine embedding",
            fx::COSINE_EMBEDDING,
            Box::new(|x, g, r| {
                let y = g.input(vals(fx::ROW_SIGNS, &[3]))?;
                cosine_embedding_loss(x, &c34(g, fx::T)?, &y, 0.1, r)
            }),
        ),
        (
            "triplet",
            fx::TRIPLET,
            Box::new(|x, g, r| {
                triplet_margin_loss(
                    x,
                    &c34(g, fx::T)?,
                    &c34(g, fx::NEG)?,
                    1.0,
                    2,
                    1e-6,
                    false,
                    r,
                )
            }),
        ),
        (
            "triplet p 1, swap",
            fx::TRIPLET_P1_SWAP,
            Box::new(|x, g, r| {
                triplet_margin_loss(x, &c34(g, fx::T)?, &c34(g, fx::NEG)?, 0.5, 1, 1e-6, true, r)
            }),
        ),
    ]
}

/// A `(3, 4)` constant of the fixture.
fn c34<'g, O: Train>(g: &Scope<'g, O>, v: &[f64]) -> tl_nn::Result<Var<'g, O>> {
    g.input(vals(v, &[3, 4]))
}

/// The multi-label targets: 1 where the fixture's `Y` > 0.4, else 0 (as `make_losses.py`).
fn multilabel_targets() -> Vec<f64> {
    fx::Y
        .iter()
        .map(|&v| if v > 0.4 { 1.0 } else { 0.0 })
        .collect()
}

/// [`Reduction`]'s counterpart for `kl_div`.
fn kl(r: Reduction) -> KlReduction {
    match r {
        Reduction::Mean => KlReduction::Mean,
        Reduction::Sum => KlReduction::Sum,
        Reduction::None => KlReduction::None,
    }
}

/// A loss of x: `(x, scope, reduction) ↦ loss`.
type LossFn<O> =
    Box<dyn for<'g> Fn(&Var<'g, O>, &Scope<'g, O>, Reduction) -> tl_nn::Result<Var<'g, O>>>;

/// Every case's values (three reductions) and gradients (mean, sum; by one SGD step of lr 1,
/// so `x − x'` is the gradient) on `rt`, within `tol` of PyTorch's.
fn check_all<O: Train>(rt: &mut Runtime<O>, tol: f64, backend: &str) {
    check_cases(rt, tol, backend, (fx::X, &[3, 4]), cases::<O>());
}

/// `cases` at the input `x0` (values, dims), as [`check_all`]; `Reduction::None`'s output
/// has the fixture's element count.
fn check_cases<O: Train>(
    rt: &mut Runtime<O>,
    tol: f64,
    backend: &str,
    (x0, dims): (&[f64], &[usize]),
    cases: Vec<Case<O>>,
) {
    let p = rt.vars().param_from("x", vals(x0, dims), true).unwrap();
    let model = Input(p.clone());
    for (name, want, loss) in cases {
        for (k, r) in [Reduction::Mean, Reduction::Sum, Reduction::None]
            .into_iter()
            .enumerate()
        {
            rt.set_value(&p, vals(x0, dims)).unwrap();
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
            let grad: Vec<f64> = x0
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
    // The losses of likelihood, margin and embedding: shapes, parameters.
    let e = err(&|g| {
        let x = g.input(x())?;
        let v = g.input(Tensor::ones([4]))?;
        gaussian_nll_loss(&x, &x, &v, false, 1e-6, Reduction::Mean)
    });
    assert!(
        e.contains("gaussian_nll_loss") && e.contains("var [4]") && e.contains("[3, 4]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        let v = g.input(Tensor::ones([1, 1]))?;
        gaussian_nll_loss(&x, &x, &v, false, 1e-6, Reduction::Mean)
    });
    assert!(
        e.contains("gaussian_nll_loss") && e.contains("[1, 1]"),
        "{e}"
    );
    for eps in [0.0, -1e-6, f64::NAN] {
        let e = err(&|g| {
            let x = g.input(x())?;
            gaussian_nll_loss(&x, &x, &x, false, eps, Reduction::Mean)
        });
        assert!(e.contains("gaussian_nll_loss") && e.contains("eps"), "{e}");
        if eps != 0.0 {
            let e = err(&|g| {
                let x = g.input(x())?;
                poisson_nll_loss(&x, &x, false, false, eps, Reduction::Mean)
            });
            assert!(e.contains("poisson_nll_loss") && e.contains("eps"), "{e}");
        }
    }
    let e = err(&|g| {
        let x = g.input(x())?;
        kl_div(
            &x,
            &g.input(Tensor::zeros([3]))?,
            KlReduction::BatchMean,
            false,
        )
    });
    assert!(e.contains("kl_div") && e.contains("[3]"), "{e}");
    let e = err(&|g| {
        let x = g.input(x())?;
        margin_ranking_loss(&x, &x, &x, f64::INFINITY, Reduction::Sum)
    });
    assert!(
        e.contains("margin_ranking_loss") && e.contains("margin") && e.contains("inf"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        hinge_embedding_loss(&x, &g.input(Tensor::zeros([12]))?, 1.0, Reduction::Sum)
    });
    assert!(
        e.contains("hinge_embedding_loss") && e.contains("[12]"),
        "{e}"
    );
    for p in [0, 3] {
        let e = err(&|g| {
            let labels = Labels::new(vec![0, 1, 2], 4)?;
            multi_margin_loss(&g.input(x())?, &labels, p, 1.0, None, Reduction::Mean)
        });
        assert!(
            e.contains("multi_margin_loss") && e.contains(&format!("got {p}")),
            "{e}"
        );
        let e = err(&|g| {
            let x = g.input(x())?;
            triplet_margin_loss(&x, &x, &x, 1.0, p, 1e-6, false, Reduction::Mean)
        });
        assert!(
            e.contains("triplet_margin_loss") && e.contains(&format!("got {p}")),
            "{e}"
        );
    }
    let e = err(&|g| {
        let labels = Labels::new(vec![0, 1], 4)?;
        multi_margin_loss(&g.input(x())?, &labels, 1, 1.0, None, Reduction::Mean)
    });
    assert!(
        e.contains("multi_margin_loss") && e.contains("2 value(s)"),
        "{e}"
    );
    // Embeddings: a target that is not one value per row, three axes, unequal shapes.
    let e = err(&|g| {
        let x = g.input(x())?;
        cosine_embedding_loss(&x, &x, &g.input(Tensor::ones([4]))?, 0.0, Reduction::Mean)
    });
    assert!(
        e.contains("cosine_embedding_loss") && e.contains("target [4]") && e.contains("[3, 4]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(Tensor::zeros([2, 3, 4]))?;
        cosine_embedding_loss(&x, &x, &g.input(Tensor::ones([2]))?, 0.0, Reduction::Mean)
    });
    assert!(
        e.contains("cosine_embedding_loss") && e.contains("[2, 3, 4]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        let n = g.input(Tensor::zeros([3, 5]))?;
        triplet_margin_loss(&x, &x, &n, 1.0, 2, 1e-6, false, Reduction::Mean)
    });
    assert!(
        e.contains("triplet_margin_loss") && e.contains("[3, 5]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        let w = g.input(Tensor::ones([2, 3, 4]))?;
        multilabel_soft_margin_loss(&x, &x, Some(&w), Reduction::Mean)
    });
    assert!(
        e.contains("multilabel_soft_margin_loss") && e.contains("[2, 3, 4]"),
        "{e}"
    );
    let e = err(&|g| {
        let x = g.input(x())?;
        binary_cross_entropy(&x, &g.input(Tensor::zeros([4]))?, None, Reduction::Mean)
    });
    assert!(
        e.contains("binary_cross_entropy") && e.contains("[4]"),
        "{e}"
    );
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
                relative_l2_loss(&g.param(&p)?, &c34(g, fx::T)?, Reduction::None)
            })
            .unwrap();
        let got: Vec<f64> = none.data().iter().map(|v| v.as_f64()).collect();
        assert!(rel(&got, want) <= tol, "{got:?} vs {want:?}");
        let mean = rt
            .eval(&model, |g| {
                relative_l2_loss(&g.param(&p)?, &c34(g, fx::T)?, Reduction::Mean)
            })
            .unwrap();
        let m = want.iter().sum::<f64>() / 3.0;
        assert!((mean.data()[0].as_f64() - m).abs() <= tol, "{m}");
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| {
            relative_l2_loss(&g.param(&p)?, &c34(g, fx::T)?, Reduction::Sum)
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

/// `kl_div`'s `batchmean` (the sum over the batch's length) against PyTorch's, value and
/// gradient, on the eager CPU and linked sessions and the CUDA simulation.
#[test]
fn kl_div_batchmean_matches_pytorch() {
    fn loss<'g, O: Train>(g: &Scope<'g, O>, p: &Param) -> tl_nn::Result<Var<'g, O>> {
        let q = g.input(vals(fx::Q, &[3, 4]))?;
        kl_div(
            &g.param(p)?.log_softmax()?,
            &q,
            KlReduction::BatchMean,
            false,
        )
    }
    fn run<O: Train>(rt: &mut Runtime<O>, tol: f64, backend: &str) {
        let p = rt
            .vars()
            .param_from("x", vals(fx::X, &[3, 4]), true)
            .unwrap();
        let model = Input(p.clone());
        let v = rt.eval(&model, |g| loss(g, &p)).unwrap();
        let got = v.data()[0].as_f64();
        assert!(
            (got - fx::KL_BATCHMEAN[0]).abs() <= tol * fx::KL_BATCHMEAN[0],
            "{backend}: {got}"
        );
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| loss(g, &p)).unwrap();
        let after = rt.value_of(&p).unwrap();
        let grad: Vec<f64> = fx::X
            .iter()
            .zip(after.data())
            .map(|(x, a)| x - a.as_f64())
            .collect();
        assert!(
            rel(&grad, fx::KL_BATCHMEAN_GRAD) <= tol,
            "{backend} gradient: {grad:?}"
        );
    }
    run(&mut eager::<f64>(Backend::Cpu, 0), 1e-12, "cpu");
    run(&mut linked::<f64>(0), 1e-12, "linked");
    run(&mut eager::<f32>(Backend::CudaSim, 0), 2e-6, "cuda-sim");
}

/// `binary_cross_entropy` at PyTorch's clamp: probabilities of exactly 0 and 1 and one under
/// e⁻¹⁰⁰ give PyTorch's finite values (100 where wrong, 0 where right), in f64 and in f32 (the
/// floor under e⁻¹⁰⁰ is an f32 subnormal), on the CPU and the CUDA simulation; and the
/// gradient is finite: 0 through a clamped log, the other side's log's elsewhere.
#[test]
fn binary_cross_entropy_clamps_its_logs_at_minus_100_as_pytorch() {
    fn loss<'g, O: Train>(g: &Scope<'g, O>, p: &Param, r: Reduction) -> tl_nn::Result<Var<'g, O>> {
        let y = g.input(vals(fx::Y_EDGE, &[fx::Y_EDGE.len()]))?;
        binary_cross_entropy(&g.param(p)?, &y, None, r)
    }
    fn run<O: Train>(rt: &mut Runtime<O>, tol: f64, backend: &str) {
        let n = fx::P_EDGE.len();
        let p = rt
            .vars()
            .param_from("p", vals(fx::P_EDGE, &[n]), true)
            .unwrap();
        let model = Input(p.clone());
        let v = rt.eval(&model, |g| loss(g, &p, Reduction::None)).unwrap();
        let got: Vec<f64> = v.data().iter().map(|x| x.as_f64()).collect();
        assert!(
            rel(&got, fx::BCE_PROBS_EDGE) <= tol,
            "{backend}: {got:?} vs {:?}",
            fx::BCE_PROBS_EDGE
        );
        // The gradient as the step's change (in f32, 1e-50 is 0 before the step).
        let before = rt.value_of(&p).unwrap();
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| loss(g, &p, Reduction::Sum))
            .unwrap();
        let after = rt.value_of(&p).unwrap();
        for (k, (x, a)) in before.data().iter().zip(after.data()).enumerate() {
            let g = x.as_f64() - a.as_f64();
            assert!(g.is_finite(), "{backend} gradient {k}: {g}");
            // Exactly 0 or 1, or under the floor: the clamped side gives no gradient, the
            // other side its log's, 1/(1 − x) or −1/x (PyTorch's formula gives 0 at a right
            // 0 or 1 and ±1e12 at a wrong one).
            let edge = match (fx::P_EDGE[k], fx::Y_EDGE[k]) {
                (0.0, 0.0) => Some(1.0),
                (1.0, 1.0) => Some(-1.0),
                (x, 1.0) if x < 1e-44 => Some(0.0),
                (0.0 | 1.0, _) => Some(0.0),
                _ => None,
            };
            if let Some(want) = edge {
                assert_eq!(g, want, "{backend} gradient {k}");
            } else {
                // (x − y)/(x(1 − x)), PyTorch's formula.
                let (x, y) = (fx::P_EDGE[k], fx::Y_EDGE[k]);
                let want = (x - y) / (x * (1.0 - x));
                assert!(
                    (g - want).abs() <= tol.max(1e-6) * want.abs(),
                    "{backend} {k}: {g} vs {want}"
                );
            }
        }
    }
    run(&mut eager::<f64>(Backend::Cpu, 0), 1e-12, "cpu");
    // f32: 0.999 rounds to 0.99900001, which moves ln(1 − x) and 1/(1 − x) by 1.3e-5.
    run(&mut eager::<f32>(Backend::Cpu, 0), 1e-4, "cpu f32");
    run(&mut eager::<f32>(Backend::CudaSim, 0), 1e-4, "cuda-sim");
}

/// The per-row losses on one unbatched row ((features) or (classes)) give a scalar, the
/// batched loss's first row (PyTorch's values: the fixture's `none` arrays).
#[test]
fn per_row_losses_of_one_unbatched_row_are_the_batched_first_row() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let empty = tl_nn::Sequential::<tl_session::Session<f64>>::new();
    type S = tl_session::Session<f64>;
    type Loss = dyn for<'g> Fn(&Scope<'g, S>) -> tl_nn::Result<Var<'g, S>>;
    let row = |v: &[f64]| vals::<f64>(&v[..4], &[4]);
    let r = Reduction::Mean;
    let cases: Vec<(&str, f64, Box<Loss>)> = vec![
        (
            "multi margin",
            fx::MULTI_MARGIN_NONE[0],
            Box::new(move |g| {
                let labels = Labels::new(vec![fx::LABELS[0]], 4)?;
                multi_margin_loss(&g.input(row(fx::X))?, &labels, 1, 1.0, None, r)
            }),
        ),
        (
            "multi margin p 2, weighted",
            fx::MULTI_MARGIN_P2_WEIGHTED_NONE[0],
            Box::new(move |g| {
                let labels = Labels::new(vec![fx::LABELS[0]], 4)?;
                let w = Some(fx::CLASS_WEIGHT);
                multi_margin_loss(&g.input(row(fx::X))?, &labels, 2, 0.7, w, r)
            }),
        ),
        (
            "multilabel soft margin",
            fx::MULTILABEL_NONE[0],
            Box::new(move |g| {
                let y = g.input(row(&multilabel_targets()))?;
                multilabel_soft_margin_loss(&g.input(row(fx::X))?, &y, None, r)
            }),
        ),
        (
            "cosine embedding",
            fx::COSINE_EMBEDDING_NONE[0],
            Box::new(move |g| {
                let y = g.input(vals(&fx::ROW_SIGNS[..1], &[]))?;
                cosine_embedding_loss(&g.input(row(fx::X))?, &g.input(row(fx::T))?, &y, 0.1, r)
            }),
        ),
        (
            "triplet p 1, swap",
            fx::TRIPLET_P1_SWAP_NONE[0],
            Box::new(move |g| {
                let (a, p, n) = (
                    g.input(row(fx::X))?,
                    g.input(row(fx::T))?,
                    g.input(row(fx::NEG))?,
                );
                triplet_margin_loss(&a, &p, &n, 0.5, 1, 1e-6, true, r)
            }),
        ),
    ];
    for (name, want, loss) in cases {
        let v = rt.eval(&empty, |g| loss(g)).unwrap();
        assert!(v.shape().dims().is_empty(), "{name}: {:?}", v.shape());
        assert!(
            (v.data()[0] - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{name}: {} vs {want}",
            v.data()[0]
        );
    }
}

/// The classes on axis 1, (N, C, d₁, d₂) = (2, 3, 2, 2) with a label per position (a
/// segmentation's loss): `cross_entropy` (plain; weighted, with `ignore_index` and label
/// smoothing) and `nll_loss` of `log_softmax_axis(1)`, every reduction (`None` shaped (N, d₁,
/// d₂)); and `softmax_axis` / `log_softmax_axis` along each of the four axes, values and the
/// gradient of a weighted sum: PyTorch's, on the eager CPU, linked and CUDA-sim sessions.
#[test]
fn classes_on_axis_1_and_the_softmax_along_any_axis_match_pytorch() {
    fn along<'g, O: Train>(x: &Var<'g, O>, axis: usize, log: bool) -> tl_nn::Result<Var<'g, O>> {
        if log {
            x.log_softmax_axis(axis)
        } else {
            x.softmax_axis(axis)
        }
    }
    fn run<O: Train>(rt: &mut Runtime<O>, tol: f64, backend: &str) {
        let labels = || Labels::new(fx::LABELS4.to_vec(), 3);
        let cases: Vec<Case<O>> = vec![
            (
                "cross entropy (N, C, d1, d2)",
                fx::CE4,
                Box::new(move |x, _, r| {
                    let v = cross_entropy(x, &labels()?, None, None, 0.0, r)?;
                    if r == Reduction::None {
                        assert_eq!(v.dims(), &[2, 2, 2]);
                    }
                    Ok(v)
                }),
            ),
            (
                "cross entropy (N, C, d1, d2), weighted, ignore_index, smoothing",
                fx::CE4_OPTIONS,
                Box::new(move |x, _, r| {
                    let w = Some(&[0.5, 2.0, 1.0][..]);
                    cross_entropy(x, &labels()?, w, Some(1), 0.1, r)
                }),
            ),
            (
                "nll (N, C, d1, d2) of log_softmax_axis(1)",
                fx::NLL4,
                Box::new(move |x, _, r| {
                    nll_loss(&x.log_softmax_axis(1)?, &labels()?, None, None, r)
                }),
            ),
        ];
        check_cases(rt, tol, backend, (fx::X4, &[2, 3, 2, 2]), cases);
        let p = rt
            .vars()
            .param_from("x4", vals(fx::X4, &[2, 3, 2, 2]), true)
            .unwrap();
        let model = Input(p.clone());
        let want = [
            [
                fx::SOFTMAX4_AXIS0,
                fx::SOFTMAX4_AXIS0_GRAD,
                fx::LOG_SOFTMAX4_AXIS0,
                fx::LOG_SOFTMAX4_AXIS0_GRAD,
            ],
            [
                fx::SOFTMAX4_AXIS1,
                fx::SOFTMAX4_AXIS1_GRAD,
                fx::LOG_SOFTMAX4_AXIS1,
                fx::LOG_SOFTMAX4_AXIS1_GRAD,
            ],
            [
                fx::SOFTMAX4_AXIS2,
                fx::SOFTMAX4_AXIS2_GRAD,
                fx::LOG_SOFTMAX4_AXIS2,
                fx::LOG_SOFTMAX4_AXIS2_GRAD,
            ],
            [
                fx::SOFTMAX4_AXIS3,
                fx::SOFTMAX4_AXIS3_GRAD,
                fx::LOG_SOFTMAX4_AXIS3,
                fx::LOG_SOFTMAX4_AXIS3_GRAD,
            ],
        ];
        for (axis, want) in want.iter().enumerate() {
            for (log, (value, grad)) in [(false, (want[0], want[1])), (true, (want[2], want[3]))] {
                rt.set_value(&p, vals(fx::X4, &[2, 3, 2, 2])).unwrap();
                let v = rt
                    .eval(&model, |g| along(&g.param(&p)?, axis, log))
                    .unwrap();
                assert_eq!(v.shape().dims(), &[2, 3, 2, 2]);
                let got: Vec<f64> = v.data().iter().map(|x| x.as_f64()).collect();
                assert!(
                    rel(&got, value) <= tol,
                    "{backend} axis {axis} log {log}: {got:?}"
                );
                let mut opt = Optimizer::sgd(1.0).unwrap();
                rt.step(&model, &mut opt, |g| {
                    let w = g.input(vals(fx::W4, &[2, 3, 2, 2]))?;
                    (&along(&g.param(&p)?, axis, log)? * &w)?.sum()
                })
                .unwrap();
                let after = rt.value_of(&p).unwrap();
                let got: Vec<f64> = fx::X4
                    .iter()
                    .zip(after.data())
                    .map(|(x, a)| x - a.as_f64())
                    .collect();
                assert!(
                    rel(&got, grad) <= tol,
                    "{backend} axis {axis} log {log} gradient: {got:?}"
                );
            }
        }
        // An axis out of range names the op, the axis and the shape.
        let e = rt
            .eval(&model, |g| g.param(&p)?.softmax_axis(4))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("softmax") && e.contains("axis 4") && e.contains("[2, 3, 2, 2]"),
            "{e}"
        );
        let e = rt
            .eval(&model, |g| {
                let labels = Labels::new(vec![0; 6], 3)?;
                cross_entropy(&g.param(&p)?, &labels, None, None, 0.0, Reduction::Mean)
            })
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("cross_entropy")
                && e.contains("[2, 3, 2, 2]")
                && e.contains("8 position(s)")
                && e.contains("6 value(s)"),
            "{e}"
        );
    }
    run(&mut eager::<f64>(Backend::Cpu, 0), 1e-12, "cpu");
    run(&mut linked::<f64>(0), 1e-12, "linked");
    run(&mut eager::<f32>(Backend::CudaSim, 0), 2e-6, "cuda-sim");
}
