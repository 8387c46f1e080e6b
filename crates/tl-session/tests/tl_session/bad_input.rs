//! Issue 14 at the session level: optimizer hyper-parameters are validated when the optimizer is
//! built, and `Optimizer::check_finite(true)` refuses a step that would write a non-finite value
//! into a parameter, naming it and leaving the parameter and the optimizer state unchanged, on
//! every session kind. Also: oversized session ops are errors, not aborts.

use crate::common::{Any, KINDS};
use tl_session::{Backend, Error, Ops, Optimizer, Options, Session};
use tl_spec::{Shape, Tensor};

fn hyper(r: Result<Optimizer, Error>, name: &str) {
    match r {
        Err(Error::Hyperparameter { name: n, .. }) => assert_eq!(n, name),
        other => panic!("expected a hyper-parameter error on {name}, got {other:?}"),
    }
}

#[test]
fn out_of_range_hyper_parameters_are_refused_when_built() {
    for lr in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1] {
        hyper(Optimizer::sgd(lr), "lr");
        hyper(Optimizer::momentum(lr, 0.9), "lr");
        hyper(Optimizer::adam(lr), "lr");
        hyper(Optimizer::adamw(lr), "lr");
    }
    let msg = Optimizer::sgd(f64::NAN).unwrap_err().to_string();
    assert!(
        msg.contains("sgd") && msg.contains("lr") && msg.contains("NaN"),
        "{msg}"
    );
    for m in [-0.1, 1.0, 1.5, f64::NAN] {
        hyper(Optimizer::momentum(0.1, m), "momentum");
    }
    for wd in [-1e-3, f64::NAN, f64::INFINITY] {
        hyper(
            Optimizer::adam(0.1).unwrap().weight_decay(wd),
            "weight_decay",
        );
    }
    hyper(
        Optimizer::momentum(0.1, 0.9)
            .unwrap()
            .dampening_nesterov(2.0, false),
        "dampening",
    );
    hyper(
        Optimizer::sgd(0.1).unwrap().dampening_nesterov(0.0, true),
        "momentum",
    );
    let adam = || Optimizer::adam(0.1).unwrap();
    hyper(adam().betas_eps(1.0, 0.999, 1e-8), "beta1");
    hyper(adam().betas_eps(-0.1, 0.999, 1e-8), "beta1");
    hyper(adam().betas_eps(0.9, f64::NAN, 1e-8), "beta2");
    hyper(adam().betas_eps(0.9, 0.999, 0.0), "eps");
    hyper(adam().betas_eps(0.9, 0.999, -1e-8), "eps");
    // Boundaries that are valid.
    assert!(Optimizer::sgd(0.0).is_ok());
    assert!(Optimizer::momentum(0.1, 0.0).is_ok());
    assert!(adam().betas_eps(0.0, 0.0, 1e-12).is_ok());
    assert!(
        Optimizer::momentum(0.1, 0.9)
            .unwrap()
            .dampening_nesterov(0.0, true)
            .is_ok()
    );
}

/// The public fields can be set after building; the step validates them again.
#[test]
fn a_step_revalidates_public_fields() {
    let mut s = Session::<f64>::new(Options::backend(Backend::Cpu)).unwrap();
    let p = s.param(Tensor::vector(vec![1.0]), Some("w"), true).unwrap();
    let w = s.use_param(&p).unwrap();
    let l = s.sum(&w).unwrap();
    s.backward(&l).unwrap();
    let mut opt = Optimizer::sgd(0.1).unwrap();
    opt.lr = f64::NAN;
    hyper(
        s.step(&mut opt).map(|()| Optimizer::sgd(0.1).unwrap()),
        "lr",
    );
    assert_eq!(
        s.param_value(&p).unwrap().data(),
        &[1.0],
        "no step was applied"
    );
}

/// A step to −1e40 (−∞ in f32) is refused with `check_finite`, and applied without it.
#[test]
fn check_finite_refuses_non_finite_steps_and_leaves_the_parameter_unchanged() {
    for kind in KINDS {
        for make in [
            || Optimizer::sgd(1e10).unwrap(),
            || Optimizer::momentum(1e10, 0.5).unwrap(),
            || Optimizer::adam(1e40).unwrap(),
        ] {
            let run = |opt: &mut Optimizer| {
                let mut s = Any::<f32>::new(kind);
                let o = s.ops();
                let p = o
                    .param(Tensor::vector(vec![1.0, 2.0]), Some("w"), true)
                    .unwrap();
                let w = o.use_param(&p).unwrap();
                let y = o.scale(&w, 1e30).unwrap();
                let l = o.sum(&y).unwrap();
                let r = s.step(&l, opt);
                (r, s.param_value(&p).unwrap())
            };
            let mut plain = make();
            let (r, w) = run(&mut plain);
            assert!(
                r.is_ok(),
                "{kind:?}: without the check the step runs: {r:?}"
            );
            assert!(w.data().iter().any(|v| !v.is_finite()), "{kind:?}: {w:?}");
            let mut checked = make().check_finite(true);
            assert!(checked.checks_finite());
            let (r, w) = run(&mut checked);
            let msg = r.unwrap_err().to_string();
            assert!(
                msg.contains("\"w\"") && msg.contains("non-finite"),
                "{kind:?}: {msg}"
            );
            assert_eq!(
                w.data(),
                &[1.0, 2.0],
                "{kind:?}: the parameter is unchanged"
            );
        }
    }
}

/// With the check on, a finite step gives exactly what it gives without the check, and the
/// state advances identically (two momentum steps).
#[test]
fn check_finite_does_not_change_finite_steps() {
    for kind in KINDS {
        let run = |mut opt: Optimizer| {
            let mut s = Any::<f32>::new(kind);
            let p = s
                .ops()
                .param(Tensor::vector(vec![1.0, -2.0]), Some("w"), true)
                .unwrap();
            for _ in 0..2 {
                let o = s.ops();
                let w = o.use_param(&p).unwrap();
                let y = o.mul(&w, &w).unwrap();
                let l = o.sum(&y).unwrap();
                s.step(&l, &mut opt).unwrap();
            }
            s.param_value(&p).unwrap()
        };
        let make = || Optimizer::momentum(0.1, 0.9).unwrap();
        let a = run(make());
        let b = run(make().check_finite(true));
        assert_eq!(a, b, "{kind:?}");
        assert_ne!(a.data(), &[1.0, -2.0], "{kind:?}: the steps moved");
    }
}

/// Session ops with absurd shapes are errors naming the op, on every session kind.
#[test]
fn oversized_session_ops_are_errors() {
    for kind in KINDS {
        let mut s = Any::<f32>::new(kind);
        let o = s.ops();
        let x = o.input(Tensor::zeros([2]), false).unwrap();
        let e = o
            .reshape(&x, Shape::new(&[3, 6148914691236517206]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reshape"), "{kind:?}: {e}");
        let e = o
            .broadcast_to(&x, Shape::new(&[1 << 40, 1 << 40, 2]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("broadcastTo") && e.contains("too large"),
            "{kind:?}: {e}"
        );
    }
}
