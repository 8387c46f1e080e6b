//! Conventions at kinks and ties (SEMANTICS.md), generated on purpose and checked against
//! hand-worked gradients on both the CPU tape (f64 and f32) and the IR:
//! max/min ties split the gradient in halves, relu'(0) = 0, sign(0) = 0 for abs, clamp passes
//! gradient only strictly inside its bounds, sqrt has derivative 0 at x ≤ 0, detach blocks.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tl_conformance::generate::{Size, any_shape, tensor};
use tl_conformance::{ANY, Backend, CpuTape, Domain, RunConfig};
use tl_ir::{GraphBuilder, Op};
use tl_spec::{Scalar, Tensor};

/// Value and leaf gradients of `op(leaves…)` with cotangent `g`, from the IR and from the CPU
/// tape in `T` (converted to f64). Every leaf requires grad.
fn both<T: Scalar>(
    op: &Op,
    leaves: &[Tensor<f64>],
    g: &Tensor<f64>,
) -> [(Tensor<f64>, Vec<Tensor<f64>>); 2] {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).unwrap())
        .collect();
    let out = b.apply(op.clone(), &ids).unwrap();
    let graph = b.finish();
    let ir_v = graph.eval(leaves, &[]).unwrap()[out].clone();
    let ir_g = graph.backprop_all(leaves, &[], out, g).unwrap()[..leaves.len()].to_vec();
    let tape = CpuTape::<T>::new();
    let lt: Vec<Tensor<T>> = leaves.iter().map(Tensor::cast).collect();
    let p = tape.record(&graph, &lt, &[]).unwrap();
    let tv = tape.values(&p).unwrap()[out].cast();
    let tg = tape.backward_dense(&p, out, &g.cast()).unwrap()[..leaves.len()]
        .iter()
        .map(Tensor::cast)
        .collect();
    [(ir_v, ir_g), (tv, tg)]
}

/// Assert that IR, f64 tape and f32 tape all give `value` and `grads` (exactly in f64; to f32
/// rounding in f32).
fn expect(
    op: &Op,
    leaves: &[Tensor<f64>],
    g: &Tensor<f64>,
    value: &Tensor<f64>,
    grads: &[Tensor<f64>],
) {
    let close = |a: &Tensor<f64>, b: &Tensor<f64>, tol: f64| {
        a.shape() == b.shape()
            && a.data()
                .iter()
                .zip(b.data())
                .all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
    };
    let runs = [both::<f64>(op, leaves, g), both::<f32>(op, leaves, g)];
    for (k, [ir, tape]) in runs.iter().enumerate() {
        let tol = if k == 0 { 0.0 } else { 1e-6 };
        for (who, (v, gs)) in [("IR", ir), ("tape", tape)] {
            assert!(
                close(v, value, tol),
                "{op:?} {who}: value {v:?}, expected {value:?}"
            );
            for (i, (got, want)) in gs.iter().zip(grads).enumerate() {
                assert!(
                    close(got, want, tol),
                    "{op:?} {who}: grad of x{i} {got:?}, expected {want:?}"
                );
            }
        }
    }
}

fn v(x: &[f64]) -> Tensor<f64> {
    Tensor::vector(x.to_vec())
}

#[test]
fn hand_worked_kinks_and_ties() {
    let g = v(&[4.0, 4.0, 4.0]);
    let (a, b) = (v(&[1.0, 2.0, 3.0]), v(&[1.0, 5.0, 0.0]));
    expect(
        &Op::Max,
        &[a.clone(), b.clone()],
        &g,
        &v(&[1.0, 5.0, 3.0]),
        &[v(&[2.0, 0.0, 4.0]), v(&[2.0, 4.0, 0.0])],
    );
    expect(
        &Op::Min,
        &[a, b],
        &g,
        &v(&[1.0, 2.0, 0.0]),
        &[v(&[2.0, 4.0, 0.0]), v(&[2.0, 0.0, 4.0])],
    );

    let x = v(&[-1.0, 0.0, 2.0]);
    let ones = v(&[1.0, 1.0, 1.0]);
    expect(
        &Op::Relu,
        std::slice::from_ref(&x),
        &ones,
        &v(&[0.0, 0.0, 2.0]),
        &[v(&[0.0, 0.0, 1.0])],
    );
    expect(
        &Op::Abs,
        std::slice::from_ref(&x),
        &ones,
        &v(&[1.0, 0.0, 2.0]),
        &[v(&[-1.0, 0.0, 1.0])],
    );
    let s = v(&[0.0, -1.0, 4.0]);
    expect(
        &Op::Sqrt,
        &[s],
        &ones,
        &v(&[0.0, 0.0, 2.0]),
        &[v(&[0.0, 0.0, 0.25])],
    );
    expect(
        &Op::Detach,
        std::slice::from_ref(&x),
        &ones,
        &x,
        &[v(&[0.0, 0.0, 0.0])],
    );

    let c = v(&[-1.0, -0.5, 0.0, 1.0, 2.0]);
    let clamp = Op::Clamp { lo: -1.0, hi: 1.0 };
    expect(
        &clamp,
        &[c],
        &v(&[1.0; 5]),
        &v(&[-1.0, -0.5, 0.0, 1.0, 1.0]),
        &[v(&[0.0, 1.0, 1.0, 0.0, 0.0])],
    );
    // A degenerate clamp (lo = hi) passes no gradient anywhere.
    let flat = Op::Clamp { lo: 0.5, hi: 0.5 };
    expect(
        &flat,
        &[v(&[0.0, 0.5, 1.0])],
        &ones,
        &v(&[0.5, 0.5, 0.5]),
        &[v(&[0.0, 0.0, 0.0])],
    );
}

#[test]
fn max_of_an_id_with_itself_passes_the_whole_gradient() {
    // max(x, x): a tie at every element; the halves accumulate back to g on the one leaf.
    let mut b = GraphBuilder::new();
    let x = b.leaf([3], None).unwrap();
    let m = b.apply(Op::Max, &[x, x]).unwrap();
    let graph = b.finish();
    let leaves = [v(&[-1.0, 0.0, 3.0])];
    let g = v(&[1.0, 2.0, 3.0]);
    let ir = graph.backprop_all(&leaves, &[], m, &g).unwrap();
    let tape = CpuTape::<f64>::new();
    let p = tape.record(&graph, &leaves, &[]).unwrap();
    let tg = tape.backward_dense(&p, m, &g).unwrap();
    assert_eq!(ir[x], g);
    assert_eq!(tg[x], g);
}

/// Small and large shapes (fast kernels take other paths on large inputs).
fn shapes() -> BoxedStrategy<tl_spec::Shape> {
    prop_oneof![any_shape(Size::Small), any_shape(Size::Large)].boxed()
}

/// Each element of `a` paired with `b` equal to it (a tie) or apart by at least 0.1, by a mask.
fn tied_pairs() -> impl Strategy<Value = (Tensor<f64>, Tensor<f64>, Tensor<f64>)> {
    shapes().prop_flat_map(|s| {
        let n = s.numel();
        (
            tensor(s.clone(), ANY),
            tensor(s.clone(), Domain::AwayFromZero(0.1, 1.0)),
            prop::collection::vec(any::<bool>(), n),
            tensor(s, Domain::Any(1.0)),
        )
            .prop_map(|(a, d, tie, g)| {
                let b = Tensor::from_fn(a.shape().clone(), |i| {
                    if tie[i] {
                        a.data()[i]
                    } else {
                        a.data()[i] + d.data()[i]
                    }
                });
                (a, b, g)
            })
    })
}

/// Each element either exactly `at` or at least 0.1 away from it, and a cotangent.
fn with_exact(at: f64) -> impl Strategy<Value = (Tensor<f64>, Tensor<f64>)> {
    shapes().prop_flat_map(move |s| {
        let n = s.numel();
        (
            tensor(s.clone(), Domain::AwayFromZero(0.1, 2.0)),
            prop::collection::vec(any::<bool>(), n),
            tensor(s, Domain::Any(1.0)),
        )
            .prop_map(move |(x, hit, g)| {
                (
                    Tensor::from_fn(x.shape().clone(), |i| {
                        if hit[i] { at } else { at + x.data()[i] }
                    }),
                    g,
                )
            })
    })
}

fn run<S: Strategy>(label: &str, s: S, f: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let mut runner = RunConfig::from_env().runner(label);
    if let Err(e) = runner.run(&s, f) {
        panic!("{label}: {e}");
    }
}

fn weight(cmp: std::cmp::Ordering) -> f64 {
    match cmp {
        std::cmp::Ordering::Greater => 1.0,
        std::cmp::Ordering::Equal => 0.5,
        std::cmp::Ordering::Less => 0.0,
    }
}

#[test]
fn generated_ties_split_max_and_min_gradients_in_halves() {
    run("ties", tied_pairs(), |(a, b, g)| {
        let order = |i: usize| a.data()[i].partial_cmp(&b.data()[i]).unwrap();
        let sh = a.shape().clone();
        let max_da = Tensor::from_fn(sh.clone(), |i| weight(order(i)) * g.data()[i]);
        let max_db = Tensor::from_fn(sh.clone(), |i| weight(order(i).reverse()) * g.data()[i]);
        let max_v = Tensor::from_fn(sh.clone(), |i| a.data()[i].max(b.data()[i]));
        let min_v = Tensor::from_fn(sh, |i| a.data()[i].min(b.data()[i]));
        expect(
            &Op::Max,
            &[a.clone(), b.clone()],
            &g,
            &max_v,
            &[max_da.clone(), max_db.clone()],
        );
        // min is max with the roles of the operands swapped.
        expect(
            &Op::Min,
            &[a.clone(), b.clone()],
            &g,
            &min_v,
            &[max_db, max_da],
        );
        Ok(())
    });
}

#[test]
fn generated_zeros_and_bounds_follow_the_kink_conventions() {
    run("relu-abs-at-0", with_exact(0.0), |(x, g)| {
        let sh = x.shape().clone();
        let relu_g = Tensor::from_fn(sh.clone(), |i| {
            if x.data()[i] > 0.0 { g.data()[i] } else { 0.0 }
        });
        let abs_g = Tensor::from_fn(sh, |i| {
            x.data()[i].signum() * if x.data()[i] == 0.0 { 0.0 } else { g.data()[i] }
        });
        expect(
            &Op::Relu,
            std::slice::from_ref(&x),
            &g,
            &x.map(|v| v.max(0.0)),
            &[relu_g],
        );
        expect(
            &Op::Abs,
            std::slice::from_ref(&x),
            &g,
            &x.map(f64::abs),
            &[abs_g],
        );
        Ok(())
    });
    for (label, at) in [("clamp-at-lo", -0.5), ("clamp-at-hi", 0.75)] {
        run(label, with_exact(at), |(x, g)| {
            let (lo, hi) = (-0.5, 0.75);
            let grad = Tensor::from_fn(x.shape().clone(), |i| {
                let v = x.data()[i];
                if v > lo && v < hi { g.data()[i] } else { 0.0 }
            });
            expect(
                &Op::Clamp { lo, hi },
                std::slice::from_ref(&x),
                &g,
                &x.map(|v| v.clamp(lo, hi)),
                &[grad],
            );
            Ok(())
        });
    }
}
