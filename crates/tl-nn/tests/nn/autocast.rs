//! bf16 autocast through a [`Runtime`] (`Options::precision`): the default session trains bit
//! for bit as an explicit `Precision::F32` one; under `Bf16` a linear layer's output is the
//! reference product of the rounded operands (`tl_spec::bf16`), the parameters stay f32 through
//! the optimizer's steps, the loss still falls; an f64 session refuses it by name.

use tl_nn::{Labels, Linear, Module, Runtime};
use tl_session::{Backend, LinkedSession, Optimizer, Options, Precision, Session};
use tl_spec::bf16::{accumulation_bound, round, round_tensor};
use tl_spec::{Tensor, ops::linalg};

use crate::tensor;

fn runtime(precision: Option<Precision>) -> Runtime<Session<f32>> {
    let mut opts = Options {
        seed: 3,
        ..Options::default()
    };
    if let Some(p) = precision {
        opts.precision = p;
    }
    Runtime::new(Session::new(opts).unwrap())
}

/// Ten Adam steps of a 16 → 4 linear classifier: the losses and the final weight and bias.
fn train(precision: Option<Precision>) -> (Vec<f64>, Vec<Tensor<f32>>) {
    train_with(runtime(precision))
}

fn bits(ts: &[Tensor<f32>]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.data().iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn the_default_trains_as_f32_bit_for_bit_and_bf16_keeps_f32_parameters() {
    let (l_default, p_default) = train(None);
    let (l_f32, p_f32) = train(Some(Precision::F32));
    let loss_bits = |l: &[f64]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(loss_bits(&l_default), loss_bits(&l_f32));
    assert_eq!(bits(&p_default), bits(&p_f32));
    let (l_bf16, p_bf16) = train(Some(Precision::Bf16));
    assert_ne!(
        loss_bits(&l_bf16),
        loss_bits(&l_f32),
        "bf16 changed nothing"
    );
    for (b, f) in l_bf16.iter().zip(&l_f32) {
        assert!(
            (b - f).abs() <= 0.02 * f.abs().max(1.0),
            "bf16 loss {b} vs f32 {f}"
        );
    }
    assert!(l_bf16[9] < 0.8 * l_bf16[0], "bf16 losses {l_bf16:?}");
    // Master weights stay f32: the updates leave values no bf16 holds.
    let off_grid = p_bf16[0].data().iter().filter(|&&v| round(v) != v).count();
    assert!(
        off_grid > p_bf16[0].numel() / 2,
        "{off_grid} weights off the bf16 grid"
    );
}

#[test]
fn a_bf16_linear_layer_is_the_reference_product() {
    let rt = runtime(Some(Precision::Bf16));
    let layer = Linear::new(&rt.vars(), 24, 10).unwrap();
    let x = tensor::<f32>(&[5, 24], 2);
    let y = rt
        .eval(&layer, |g| layer.forward(&g.input(x.clone())?))
        .unwrap();
    let w = rt.value_of(&layer.weight).unwrap();
    let b: Tensor<f64> = rt
        .value_of(layer.bias.as_ref().expect("a bias"))
        .unwrap()
        .cast();
    let (wr, xr) = (round_tensor(&w).unwrap(), round_tensor(&x).unwrap());
    let want = linalg::linear(&wr, &b, &xr).unwrap();
    let abs = |t: &Tensor<f64>| t.map(f64::abs);
    let abs_sum = linalg::linear(&abs(&wr), &abs(&b), &abs(&xr)).unwrap();
    for ((&g, &v), &s) in y.data().iter().zip(want.data()).zip(abs_sum.data()) {
        let bound = accumulation_bound(24, s);
        assert!(
            (f64::from(g) - v).abs() <= bound,
            "{g} vs {v} (bound {bound:e})"
        );
    }
    // The same layer at f32 (same seed, same initial weights) gives other values.
    let rt32 = runtime(None);
    let layer32 = Linear::new(&rt32.vars(), 24, 10).unwrap();
    assert_eq!(bits(&[rt32.value_of(&layer32.weight).unwrap()]), bits(&[w]));
    let y32 = rt32
        .eval(&layer32, |g| layer32.forward(&g.input(x.clone())?))
        .unwrap();
    assert_ne!(bits(&[y32]), bits(&[y]));
}

#[test]
fn bf16_is_refused_where_it_does_not_run() {
    // Every backend has it (the CUDA tape's tensor-core GEMM); an f64 session does not.
    let sim = Session::<f32>::new(Options {
        backend: Backend::CudaSim,
        precision: Precision::Bf16,
        ..Options::default()
    });
    assert!(sim.is_ok(), "bf16 on the CUDA sim");
    let f64s = Session::<f64>::new(Options {
        precision: Precision::Bf16,
        ..Options::default()
    });
    let e = f64s
        .err()
        .expect("bf16 in an f64 session is refused")
        .to_string();
    assert!(e.contains("f64") && e.contains("bf16"), "{e}");
}

/// [`train`] on `backend`: a linked session set to `precision` (the eager session's seed) when
/// `linked`, else an eager one.
fn train_on(backend: Backend, linked: bool, precision: Precision) -> (Vec<f64>, Vec<Tensor<f32>>) {
    if !linked {
        let s = Session::new(Options {
            seed: 3,
            backend,
            precision,
            ..Options::default()
        })
        .unwrap();
        return train_with(Runtime::new(s));
    }
    let mut s = LinkedSession::<f32>::with_seed(3);
    s.set_backend(backend).unwrap();
    s.set_precision(precision).unwrap();
    assert_eq!(s.precision(), precision);
    train_with(Runtime::new(s))
}

/// [`train`]'s ten steps in `rt`.
fn train_with<O: tl_session::Train<T = f32>>(mut rt: Runtime<O>) -> (Vec<f64>, Vec<Tensor<f32>>) {
    let model = Linear::new(&rt.vars(), 16, 4).unwrap();
    let x = tensor::<f32>(&[8, 16], 1);
    let labels = Labels::new(vec![0, 1, 2, 3, 3, 2, 1, 0], 4).unwrap();
    let mut opt = Optimizer::adam(0.05).unwrap();
    let losses = (0..10)
        .map(|_| {
            rt.step(&model, &mut opt, |g| {
                model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
            })
            .unwrap()
        })
        .collect();
    let bias = model.bias.as_ref().expect("a bias");
    let params = [&model.weight, bias].map(|p| rt.value_of(p).unwrap());
    (losses, params.to_vec())
}

#[test]
fn a_linked_session_trains_under_autocast_as_the_eager_one() {
    let loss_bits = |l: &[f64]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for backend in [Backend::Cpu, Backend::CudaSim] {
        for p in [Precision::F32, Precision::Bf16, Precision::Tf32] {
            let (l_eager, p_eager) = train_on(backend, false, p);
            let (l_linked, p_linked) = train_on(backend, true, p);
            let what = format!("{backend:?} {p:?}");
            assert_eq!(loss_bits(&l_linked), loss_bits(&l_eager), "{what}: losses");
            assert_eq!(bits(&p_linked), bits(&p_eager), "{what}: parameters");
        }
        // The setting reaches the compiled tape: autocast changes the linked run.
        let (l32, _) = train_on(backend, true, Precision::F32);
        let (l16, _) = train_on(backend, true, Precision::Bf16);
        assert_ne!(
            l32, l16,
            "{backend:?}: bf16 changed nothing on the linked session"
        );
    }
}

#[test]
fn a_linked_f64_session_refuses_autocast_by_name() {
    let mut s = LinkedSession::<f64>::new();
    let e = s.set_precision(Precision::Bf16).unwrap_err().to_string();
    assert!(
        e.contains("LinkedSession::set_precision") && e.contains("f64") && e.contains("bf16"),
        "{e}"
    );
    assert_eq!(s.precision(), Precision::F32);
    assert!(s.set_precision(Precision::F32).is_ok());
}
