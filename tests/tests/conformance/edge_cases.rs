//! Edge cases the random generators avoid on purpose: non-finite values off the differentiated
//! path, empty tensors, scalars, outputs that are leaves or precede other nodes.

use tl_conformance::{Backend, CpuTape};
use tl_ir::{GraphBuilder, Op};
use tl_spec::Tensor;

/// IR and tape gradients of `out` for a graph built by `build` from `leaves`.
fn grads(
    leaves: &[Tensor<f64>],
    build: impl Fn(&mut GraphBuilder, &[usize]) -> usize,
    seed: f64,
) -> (Vec<Tensor<f64>>, Vec<Tensor<f64>>) {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).unwrap())
        .collect();
    let out = build(&mut b, &ids);
    let g = b.finish();
    let seed = Tensor::full(g.shape(out).unwrap().clone(), seed);
    let ir = g.backprop_all(leaves, &[], out, &seed).unwrap();
    let backend = CpuTape::<f64>::new();
    let p = backend.record(&g, leaves, &[]).unwrap();
    let tape = backend.backward_dense(&p, out, &seed).unwrap();
    (ir, tape)
}

#[test]
fn an_infinite_value_off_the_path_to_the_output_does_not_poison_gradients() {
    // x = 0; i = 1/x = inf is computed but `out = 2x` does not depend on it. Its cotangent is
    // zero, and 0 · (−1/x²) would be NaN: neither the IR nor the tape may propagate it.
    let leaves = [Tensor::vector(vec![0.0, 1.0])];
    let (ir, tape) = grads(
        &leaves,
        |b, x| {
            b.apply(Op::Inv, &[x[0]]).unwrap();
            b.apply(Op::Scale(2.0), &[x[0]]).unwrap()
        },
        1.0,
    );
    assert_eq!(tape[0].data(), &[2.0, 2.0]);
    assert_eq!(ir[0].data(), &[2.0, 2.0], "IR: {:?}", ir[0]);
}

#[test]
fn empty_tensors_flow_through_forward_and_backward() {
    // (2, 0) · (0, 3) = zeros (2, 3); sum of an empty tensor is 0; gradients are empty.
    let leaves = [Tensor::<f64>::zeros([2, 0]), Tensor::zeros([0, 3])];
    let (ir, tape) = grads(
        &leaves,
        |b, x| {
            let m = b.apply(Op::Matmul, &[x[0], x[1]]).unwrap();
            b.apply(Op::Sum, &[m]).unwrap()
        },
        1.0,
    );
    assert_eq!(ir, tape);
    assert_eq!(ir[0].shape().dims(), &[2, 0]);
    assert_eq!(ir[2].data(), &[1.0; 6], "d sum / d matmul is all ones");
    let (ir, tape) = grads(
        &[Tensor::<f64>::zeros([0])],
        |b, x| b.apply(Op::Sum, &[x[0]]).unwrap(),
        3.0,
    );
    assert_eq!(ir, tape);
    assert_eq!(ir[1].data(), &[3.0]);
}

#[test]
fn outputs_before_later_nodes_and_leaf_outputs() {
    let leaves = [Tensor::vector(vec![1.0, -2.0])];
    // out = the leaf itself: its gradient is the seed, nothing else flows.
    let (ir, tape) = grads(
        &leaves,
        |b, x| {
            b.apply(Op::Exp, &[x[0]]).unwrap();
            x[0]
        },
        5.0,
    );
    assert_eq!(ir, tape);
    assert_eq!(ir[0].data(), &[5.0, 5.0]);
    assert_eq!(ir[1].data(), &[0.0, 0.0]);
    // out = an early node: later nodes get zero gradient.
    let (ir, tape) = grads(
        &leaves,
        |b, x| {
            let t = b.apply(Op::Tanh, &[x[0]]).unwrap();
            b.apply(Op::Mul, &[t, t]).unwrap();
            t
        },
        1.0,
    );
    assert_eq!(ir, tape);
    assert_eq!(ir[2].data(), &[0.0, 0.0]);
    let d = |v: f64| 1.0 - v.tanh().powi(2);
    assert_eq!(ir[0].data(), &[d(1.0), d(-2.0)]);
}
