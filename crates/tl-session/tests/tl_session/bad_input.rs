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

/// The sites the fuzz test found (issue 14), each once a hang or an overflow panic: ops on empty
/// tensors whose other dims are huge (reduceSum/reduceMean walked 2⁴⁰ rows of an empty output in
/// tl-spec and on the CUDA sim; sliceRange0's row length overflowed in tl-spec and on the CUDA
/// tape) now give their empty result at once, forward and backward, on the IR, the CPU tape and
/// the CUDA sim tape; overflowing shape arithmetic in batch norm's and pooling's shape rules is an
/// error.
#[test]
fn fuzz_found_sites_return_at_once() {
    use tl_ir::{GraphBuilder, Op};
    use tl_tape_cpu::Tape;
    use tl_tape_cuda::{AnyBuffer, CudaTape, SimDevice};

    let start = std::time::Instant::now();
    let empty = |dims: &[usize]| Tensor::<f64>::new(Shape::new(dims), vec![]).unwrap();
    let big = 1usize << 20;
    let huge = 1usize << 31; // within the CUDA ABI's u32 per dim
    let cases = [
        (
            empty(&[big, big, 3, 0]),
            Op::ReduceSum(2),
            vec![big, big, 0],
        ),
        (
            empty(&[big, big, 3, 0]),
            Op::ReduceMean(2),
            vec![big, big, 0],
        ),
        (
            empty(&[2, huge, huge, huge, 0]),
            Op::Slice { start: 1, len: 1 },
            vec![1, huge, huge, huge, 0],
        ),
    ];
    for (x, op, want) in cases {
        let want = Shape::new(&want);
        // IR: eval and backprop.
        let mut b = GraphBuilder::new();
        let l = b.leaf(x.shape().clone(), None).unwrap();
        let y = b.apply(op.clone(), &[l]).unwrap();
        let g = b.finish();
        let values = g.eval(std::slice::from_ref(&x), &[]).unwrap();
        assert_eq!(values[y].shape(), &want, "{op:?}");
        let seed = Tensor::new(want.clone(), vec![]).unwrap();
        let grads = g
            .backprop_all(std::slice::from_ref(&x), &[], y, &seed)
            .unwrap();
        assert_eq!(grads[l].shape(), x.shape(), "{op:?}");
        // CPU tape.
        let mut t = Tape::<f64>::new();
        let l = t.leaf(x.clone(), None, true);
        let y = t.apply(&op, &[l]).unwrap();
        assert_eq!(t.get(y).unwrap().shape(), &want, "{op:?}");
        let grads = t.backward_dense(y, &seed).unwrap();
        assert_eq!(grads[l].shape(), x.shape(), "{op:?}");
        // CUDA tape on the simulation device.
        let mut t = CudaTape::new(SimDevice::new());
        let l = t.upload_leaf(&x, None, true).unwrap();
        let y = t.apply(&op, &[l]).unwrap();
        assert_eq!(t.get(y).unwrap().shape(), &want, "{op:?}");
        let seed = AnyBuffer::full(t.device_mut(), &want, 1.0).unwrap();
        let grads = t.backward_dense(y, &seed).unwrap();
        assert_eq!(grads[l].shape(), x.shape(), "{op:?}");
    }
    // The reference kernels themselves (public), below the dispatchers' early return.
    let x = empty(&[big, big, 3, 0]);
    let r = tl_spec::ops::reduce::reduce_sum(&x, 2).unwrap();
    assert_eq!(r.shape(), &Shape::new(&[big, big, 0]));
    let x = empty(&[2, 1 << 62, 8, 0]);
    let r = tl_spec::ops::concat::slice(&x, 1, 1).unwrap();
    assert_eq!(r.shape(), &Shape::new(&[1, 1 << 62, 8, 0]));
    // Shape arithmetic: H·W of an empty batch-norm input, 2·padding of a pool.
    let r = tl_spec::ops::norm::batch_norm_shape(
        &Shape::new(&[1, 0, 1 << 62, 1 << 62]),
        &Shape::new(&[0]),
        &Shape::new(&[0]),
    );
    assert_eq!(r.ok(), Some(Shape::new(&[1, 0, 1 << 62, 1 << 62])));
    let pool = tl_spec::ops::pool::PoolParams {
        kernel: &[2],
        stride: &[1],
        padding: &[usize::MAX],
    };
    let e = tl_spec::ops::pool::pool_shape("maxPool", &Shape::new(&[1, 4]), pool).unwrap_err();
    assert!(e.to_string().contains("maxPool"), "{e}");
    let slow = start.elapsed();
    assert!(slow < std::time::Duration::from_secs(20), "took {slow:?}");
}
