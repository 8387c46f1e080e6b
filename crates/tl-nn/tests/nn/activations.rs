//! `Activation` against PyTorch: values and gradients on the eager CPU session (f64), the
//! linked session (f64) and the CUDA sim (f32), on inputs that include every kink, so each
//! composed activation's gradient at its bounds is PyTorch's; printing as PyTorch's
//! `repr`; invalid parameters as errors naming the activation.

use tl_nn::{Activation, Runtime};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::Scalar;

use crate::activations_fixture as ax;
use crate::losses_fixture as fx;
use crate::{Input, eager, linked, rel, vals};

/// `act`'s values on `x` (shaped `dims`) and the gradient of `Σ w·act(x)` (by one SGD step
/// of lr 1: `x − x'`; `w` shaped as the output, `dims` unless the activation changes the
/// shape), each within `tol` of `want` (relative where |want| > 1).
fn check<O: Train>(
    rt: &mut Runtime<O>,
    act: Activation,
    (x, w, dims): (&[f64], &[f64], &[usize]),
    want: [&[f64]; 2],
    tol: f64,
) {
    let out_dims: Vec<usize> = match act {
        Activation::Glu => {
            let mut d = dims.to_vec();
            d[dims.len() - 1] /= 2;
            d
        }
        _ => dims.to_vec(),
    };
    let p = rt.vars().param_from("x", vals(x, dims), true).unwrap();
    let model = Input(p.clone());
    let v = rt.eval(&model, |g| act.apply(&g.param(&p)?)).unwrap();
    let got: Vec<f64> = v.data().iter().map(|x| x.as_f64()).collect();
    assert!(
        rel(&got, want[0]) <= tol,
        "{act:?}: {got:?} vs {:?}",
        want[0]
    );
    let mut opt = Optimizer::sgd(1.0).unwrap();
    rt.step(&model, &mut opt, |g| {
        let y = act.apply(&g.param(&p)?)?;
        (&y * &g.input(vals(w, &out_dims))?)?.sum()
    })
    .unwrap();
    let after = rt.value_of(&p).unwrap();
    let grad: Vec<f64> = x
        .iter()
        .zip(after.data())
        .map(|(x, a)| x - a.as_f64())
        .collect();
    assert!(
        rel(&grad, want[1]) <= tol,
        "{act:?} gradient: {grad:?} vs {:?}",
        want[1]
    );
}

/// An activation, its inputs, PyTorch's values and gradients there, and the f64 tolerance.
type Case = (Activation, &'static [f64], [&'static [f64]; 2], f64);

/// Every case.
fn cases() -> Vec<Case> {
    let f = |v, g| [v, g];
    // PyTorch's CPU kernels of Hardsigmoid and CELU take 1/6 and 1/alpha in f32 even in f64:
    // their gradients are that far (5e-9 and 4e-8 at most here) from the exact ones.
    vec![
        (
            Activation::GeluErf,
            fx::X,
            f(fx::GELU_ERF, fx::GELU_ERF_GRAD),
            1e-14,
        ),
        (
            Activation::LeakyRelu(0.2),
            fx::X,
            f(fx::LEAKY_RELU_0_2, fx::LEAKY_RELU_0_2_GRAD),
            1e-14,
        ),
        (
            Activation::Elu(0.7),
            fx::X,
            f(fx::ELU_0_7, fx::ELU_0_7_GRAD),
            1e-14,
        ),
        (
            Activation::Hardtanh(-0.8, 1.3),
            ax::X,
            f(ax::HARDTANH, ax::HARDTANH_GRAD),
            1e-14,
        ),
        (
            Activation::Relu6,
            ax::X,
            f(ax::RELU6, ax::RELU6_GRAD),
            1e-14,
        ),
        (
            Activation::Hardsigmoid,
            ax::X,
            f(ax::HARDSIGMOID, ax::HARDSIGMOID_GRAD),
            1e-7,
        ),
        (
            Activation::Hardswish,
            ax::X,
            f(ax::HARDSWISH, ax::HARDSWISH_GRAD),
            1e-14,
        ),
        (Activation::Mish, ax::X, f(ax::MISH, ax::MISH_GRAD), 1e-14),
        (Activation::Selu, ax::X, f(ax::SELU, ax::SELU_GRAD), 1e-14),
        (
            Activation::Celu(0.6),
            ax::X,
            f(ax::CELU, ax::CELU_GRAD),
            1e-6,
        ),
        (
            Activation::LogSigmoid,
            ax::X,
            f(ax::LOG_SIGMOID, ax::LOG_SIGMOID_GRAD),
            1e-14,
        ),
        (
            Activation::Softsign,
            ax::X,
            f(ax::SOFTSIGN, ax::SOFTSIGN_GRAD),
            1e-14,
        ),
        (
            Activation::Tanhshrink,
            ax::X,
            f(ax::TANHSHRINK, ax::TANHSHRINK_GRAD),
            1e-14,
        ),
        (
            Activation::Softshrink(0.4),
            ax::X,
            f(ax::SOFTSHRINK, ax::SOFTSHRINK_GRAD),
            1e-14,
        ),
    ]
}

#[test]
fn activations_match_pytorch_values_and_gradients_at_and_around_their_kinks() {
    for (act, x, want, tol) in cases() {
        let ones = vec![1.0; x.len()];
        let at = (x, &ones[..], &[x.len()][..]);
        check(&mut eager::<f64>(Backend::Cpu, 0), act, at, want, tol);
        check(&mut linked::<f64>(0), act, at, want, tol);
        check(
            &mut eager::<f32>(Backend::CudaSim, 0),
            act,
            at,
            want,
            tol.max(1e-6),
        );
    }
    // The softmax family along the last axis of (3, 4), the gradient of Σ W·y.
    let rows = [
        (Activation::Softmax, [ax::SOFTMAX, ax::SOFTMAX_GRAD]),
        (
            Activation::LogSoftmax,
            [ax::LOG_SOFTMAX, ax::LOG_SOFTMAX_GRAD],
        ),
        (Activation::Softmin, [ax::SOFTMIN, ax::SOFTMIN_GRAD]),
    ];
    for (act, want) in rows {
        let at = (ax::X, ax::W, &[3, 4][..]);
        check(&mut eager::<f64>(Backend::Cpu, 0), act, at, want, 1e-14);
        check(&mut linked::<f64>(0), act, at, want, 1e-14);
        check(&mut eager::<f32>(Backend::CudaSim, 0), act, at, want, 1e-6);
    }
    // The gated linear unit halves the last axis: (3, 4) → (3, 2).
    let at = (ax::X, &ax::W[..6], &[3, 4][..]);
    let want = [ax::GLU, ax::GLU_GRAD];
    let glu = Activation::Glu;
    check(&mut eager::<f64>(Backend::Cpu, 0), glu, at, want, 1e-14);
    check(&mut linked::<f64>(0), glu, at, want, 1e-14);
    check(&mut eager::<f32>(Backend::CudaSim, 0), glu, at, want, 1e-6);
    // PyTorch's defaults.
    assert_eq!(Activation::LEAKY_RELU, Activation::LeakyRelu(0.01));
    assert_eq!(Activation::ELU, Activation::Elu(1.0));
    assert_eq!(Activation::HARDTANH, Activation::Hardtanh(-1.0, 1.0));
    assert_eq!(Activation::CELU, Activation::Celu(1.0));
    assert_eq!(Activation::SOFTSHRINK, Activation::Softshrink(0.5));
}

#[test]
fn activations_print_as_pytorch() {
    let cases = [
        (Activation::Hardtanh(-0.8, 1.3), ax::HARDTANH_REPR),
        (Activation::Relu6, ax::RELU6_REPR),
        (Activation::Hardsigmoid, ax::HARDSIGMOID_REPR),
        (Activation::Hardswish, ax::HARDSWISH_REPR),
        (Activation::Mish, ax::MISH_REPR),
        (Activation::Selu, ax::SELU_REPR),
        (Activation::Celu(0.6), ax::CELU_REPR),
        (Activation::LogSigmoid, ax::LOG_SIGMOID_REPR),
        (Activation::Softsign, ax::SOFTSIGN_REPR),
        (Activation::Tanhshrink, ax::TANHSHRINK_REPR),
        (Activation::Softshrink(0.4), ax::SOFTSHRINK_REPR),
        (Activation::Softmax, ax::SOFTMAX_REPR),
        (Activation::LogSoftmax, ax::LOG_SOFTMAX_REPR),
        (Activation::Softmin, ax::SOFTMIN_REPR),
        (Activation::Glu, ax::GLU_REPR),
    ];
    for (act, repr) in cases {
        assert_eq!(tl_nn::tree(&act).to_string(), repr, "{act:?}");
    }
}

#[test]
fn invalid_activation_parameters_are_errors_naming_the_activation_and_the_value() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let p = rt.vars().param_from("x", vals(ax::X, &[12]), true).unwrap();
    let model = Input(p.clone());
    let err = |act: Activation| {
        rt.eval(&model, |g| act.apply(&g.param(&p)?))
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (Activation::Hardtanh(1.0, -1.0), ["Hardtanh", "min_val 1"]),
        (Activation::Hardtanh(f64::NAN, 1.0), ["Hardtanh", "NaN"]),
        (Activation::Celu(0.0), ["CELU", "alpha 0"]),
        (Activation::Celu(f64::INFINITY), ["CELU", "inf"]),
        (Activation::Softshrink(-0.5), ["Softshrink", "lambd -0.5"]),
    ];
    for (act, says) in cases {
        let e = err(act);
        for s in says {
            assert!(e.contains(s), "{act:?}: {e}");
        }
    }
    // GLU halves the last axis: an odd length (or a scalar) is an error naming it and the
    // shape.
    for dims in [&[3, 3][..], &[]] {
        let n = dims.iter().product::<usize>();
        let e = rt
            .eval(&model, |g| {
                Activation::Glu.apply(&g.input(vals(&ax::X[..n], dims))?)
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("GLU") && e.contains(&format!("{dims:?}")), "{e}");
    }
}
