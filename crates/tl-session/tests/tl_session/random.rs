//! The random conveniences of [`Ops`]: `rand_uniform`, `bernoulli_mask` and `dropout` draw
//! their key from the session's seed and a per-session counter (the user passes none), the
//! same sequence in every session kind, fresh masks per call and after `reset`.

use tl_ir::Op;
use tl_session::{Backend, LinkedSession, Ops, Options, Session};
use tl_spec::{Shape, Tensor};

fn eager(b: Backend, seed: u64) -> Session<f64> {
    Session::new(Options {
        seed,
        ..Options::backend(b)
    })
    .unwrap()
}

/// Values of `rand_uniform([8])`, `bernoulli_mask([8], 0.5)` and `dropout(1, 0.5)` of `s`,
/// then of the same three calls after a reset.
fn draws<S: Ops<T = f64>>(s: &mut S, reset: impl Fn(&mut S)) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for _ in 0..2 {
        let ones = s.input(Tensor::full([8], 1.0), false).unwrap();
        let u = s.rand_uniform(Shape::new(&[8])).unwrap();
        let m = s.bernoulli_mask(Shape::new(&[8]), 0.5).unwrap();
        let d = s.dropout(&ones, 0.5).unwrap();
        for r in [u, m, d] {
            out.push(s.value(&r).unwrap().data().to_vec());
        }
        reset(s);
    }
    out
}

#[test]
fn every_session_kind_draws_the_same_sequence_and_each_call_is_fresh() {
    let seed = 1234;
    let cpu = draws(&mut eager(Backend::Cpu, seed), |s| s.reset());
    let sim = draws(&mut eager(Backend::CudaSim, seed), |s| s.reset());
    let linked = draws(&mut LinkedSession::<f64>::with_seed(seed), |s| s.reset());
    // The same keys in every session kind; the sim computes in f32 (uniforms round).
    assert_eq!(cpu, linked);
    for (a, b) in cpu.iter().zip(&sim) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }
    // Counters 0..6: the first mask equals the keyed op at counter 1, the first dropout at 2,
    // and the calls after reset continue at 3, 4, 5.
    let mut k = eager(Backend::Cpu, seed);
    let keyed = k
        .bernoulli_mask_keyed(Shape::new(&[8]), 0.5, seed, 1)
        .unwrap();
    assert_eq!(k.value(&keyed).unwrap().data(), &cpu[1][..]);
    let again = k
        .bernoulli_mask_keyed(Shape::new(&[8]), 0.5, seed, 4)
        .unwrap();
    assert_eq!(k.value(&again).unwrap().data(), &cpu[4][..]);
    // Fresh draws: no two calls give the same uniforms, masks differ before and after reset.
    assert_ne!(cpu[0], cpu[3]);
    assert_ne!(cpu[1], cpu[4], "the counter survives reset");
    assert!(cpu[0].iter().all(|&u| (0.0..1.0).contains(&u)));
    // Dropout of ones is mask / keep: every element 0 or 2, and it matches the mask drawn at
    // the same counter.
    let d = &cpu[2];
    assert!(d.iter().all(|&v| v == 0.0 || v == 2.0), "{d:?}");
    let m = k
        .bernoulli_mask_keyed(Shape::new(&[8]), 0.5, seed, 2)
        .unwrap();
    let m = k.value(&m).unwrap();
    let want: Vec<f64> = m.data().iter().map(|v| v * 2.0).collect();
    assert_eq!(d, &want);
    // Another seed, other bits.
    let other = draws(&mut eager(Backend::Cpu, seed + 1), |s| s.reset());
    assert_ne!(cpu[0], other[0]);
}

#[test]
fn the_linked_session_records_the_op_with_its_counter_and_dropout_backprops_the_mask() {
    let mut s = LinkedSession::<f64>::with_seed(7);
    s.set_random_counter(40);
    let x = s
        .input(Tensor::vector(vec![1.0, 2.0, 3.0, 4.0]), true)
        .unwrap();
    let y = s.dropout(&x, 0.25).unwrap();
    let l = s.sum(&y).unwrap();
    assert_eq!(
        s.graph().node(y.id()).unwrap().op(),
        &Op::Dropout {
            keep: 0.25,
            seed: 7,
            counter: 40
        }
    );
    assert_eq!(s.random_counter(), 41);
    let g = s.backward_scalar_dense_all(&l).unwrap();
    let y_val = s.value(&y).unwrap();
    // dy/dx = mask / keep, so y = x · dy/dx.
    let dx = s.grad_of(&g, &x).unwrap();
    for ((xi, yi), gi) in [1.0, 2.0, 3.0, 4.0].iter().zip(y_val.data()).zip(dx.data()) {
        assert!(*gi == 0.0 || *gi == 4.0);
        assert_eq!(xi * gi, *yi);
    }
    // The eager session at the same counter gives the same gradient.
    let mut e = eager(Backend::Cpu, 7);
    e.set_random_counter(40);
    let ex = e
        .input(Tensor::vector(vec![1.0, 2.0, 3.0, 4.0]), true)
        .unwrap();
    let ey = e.dropout(&ex, 0.25).unwrap();
    let el = e.sum(&ey).unwrap();
    e.backward(&el).unwrap();
    assert_eq!(e.grad_of(&ex).unwrap(), dx);
    assert_eq!(e.random_counter(), 41);
}

#[test]
fn bad_keep_and_bad_probabilities_are_clear_errors() {
    let mut s = eager(Backend::Cpu, 0);
    let x = s.input(Tensor::vector(vec![1.0]), false).unwrap();
    let e = s.dropout(&x, 0.0).unwrap_err().to_string();
    assert!(e.contains("dropout") && e.contains("keep"), "{e}");
    let e = s
        .bernoulli_mask(Shape::new(&[2]), 1.5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bernoulliMask"), "{e}");
}
