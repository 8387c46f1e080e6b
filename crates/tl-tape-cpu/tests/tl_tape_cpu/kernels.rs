//! Every CPU kernel, forward and backward, against the reference semantics (tl-spec, reached
//! through `tl_ir::rules`, the reference dispatch) on hand-picked and pseudo-random inputs, in
//! f64 (to 1e-12 relative) and f32. The backward pass gets the kernel's own forward output as `y`,
//! exactly as on the tape.

use crate::common::{Dom, Rng, assert_close, random};
use tl_ir::{Op, rules};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::ops;

/// Compare forward and backward of `op` at `inputs` (given in f64, converted to `T`).
fn check_at<T: Scalar>(op: &Op, inputs: &[Tensor<f64>], rng: &mut Rng) {
    let xs: Vec<Tensor<T>> = inputs.iter().map(|t| t.cast()).collect();
    let refs: Vec<&Tensor<T>> = xs.iter().collect();
    let shapes: Vec<&Shape> = xs.iter().map(|t| t.shape()).collect();
    let out_shape = op
        .infer_shape(&shapes)
        .expect("test inputs satisfy the shape rule");
    let what = format!("{op} {:?} ({})", shapes, T::NAME);

    let y = ops::forward(op, &refs, &[]).unwrap_or_else(|e| panic!("{what}: forward failed: {e}"));
    assert_eq!(y.shape(), &out_shape, "{what}: forward shape");
    let y_ref = rules::value(op, &refs, &[]).unwrap();
    assert_close(&format!("{what} forward"), &y, &y_ref);

    let g: Tensor<T> = random(rng, &out_shape, Dom::Any).cast();
    let grads = ops::backward(op, &refs, &y, &g, &[])
        .unwrap_or_else(|e| panic!("{what}: backward failed: {e}"));
    let grads_ref = rules::vjp(op, &refs, &g, &[]).unwrap();
    assert_eq!(grads.len(), grads_ref.len(), "{what}: number of cotangents");
    for (k, (d, r)) in grads.iter().zip(&grads_ref).enumerate() {
        match (d, r) {
            (Some(d), Some(r)) => assert_close(&format!("{what} d{k}"), d, r),
            (None, None) => {}
            _ => panic!("{what}: operand {k}: gradient presence differs from the reference"),
        }
    }
}

/// Check `op` on explicit inputs and on `n` random draws of operands with `shapes` and `doms`.
fn check(op: &Op, shapes: &[&[usize]], doms: &[Dom], seed: u64) {
    let mut rng = Rng(seed);
    for _ in 0..3 {
        let inputs: Vec<Tensor<f64>> = shapes
            .iter()
            .zip(doms)
            .map(|(s, &d)| random(&mut rng, &Shape::new(s), d))
            .collect();
        check_at::<f64>(op, &inputs, &mut rng);
        check_at::<f32>(op, &inputs, &mut rng);
    }
}

fn check_hand(op: &Op, inputs: &[Vec<f64>]) {
    let mut rng = Rng(7);
    let ts: Vec<Tensor<f64>> = inputs.iter().map(|v| Tensor::vector(v.clone())).collect();
    check_at::<f64>(op, &ts, &mut rng);
    check_at::<f32>(op, &ts, &mut rng);
}

const SHAPES: [&[usize]; 5] = [&[], &[7], &[3, 5], &[2, 3, 4], &[0, 3]];

#[test]
fn elementwise_kernels_match_the_reference() {
    use Dom::*;
    let unary: Vec<(Op, Dom)> = vec![
        (Op::Scale(-1.75), Any),
        (Op::Abs, Any),
        (Op::Sqrt, Any),
        (Op::Exp, Any),
        (Op::Log, Pos),
        (Op::Inv, AwayFromZero),
        (Op::Relu, Any),
        (Op::Clamp { lo: -0.5, hi: 0.7 }, Any),
        (Op::Sigmoid, Wide(40.0)),
        (Op::Tanh, Wide(10.0)),
        (Op::Softplus, Wide(40.0)),
        (Op::SafeLog { eps: 1e-6 }, Wide(40.0)),
        (Op::Detach, Any),
    ];
    let binary: Vec<(Op, Dom)> = vec![
        (Op::Add, Any),
        (Op::Sub, Any),
        (Op::Mul, Any),
        (Op::Div, AwayFromZero),
        (Op::Max, Any),
        (Op::Min, Any),
    ];
    for (i, s) in SHAPES.iter().enumerate() {
        for (k, (op, d)) in unary.iter().enumerate() {
            check(op, &[s], &[*d], (100 * i + k) as u64);
        }
        for (k, (op, d)) in binary.iter().enumerate() {
            check(op, &[s, s], &[Any, *d], (1000 + 100 * i + k) as u64);
        }
    }
    // Kinks and ties, hand-picked: abs/relu/sqrt at 0, clamp at its bounds, max/min ties.
    let kinks = vec![-1.0, 0.0, -0.0, 0.5, 2.0, -0.5, 0.7, 1e-300];
    for op in [
        Op::Abs,
        Op::Relu,
        Op::Sqrt,
        Op::Clamp { lo: -0.5, hi: 0.7 },
        Op::Sigmoid,
        Op::Softplus,
    ] {
        check_hand(&op, std::slice::from_ref(&kinks));
    }
    let a = vec![1.0, 2.0, 3.0, -0.0, 5.0];
    let b = vec![1.0, 5.0, 0.0, 0.0, 5.0];
    check_hand(&Op::Max, &[a.clone(), b.clone()]);
    check_hand(&Op::Min, &[a, b]);
    // constant: no operands, no gradient
    let c = Op::Constant(Tensor::from_fn([2, 3], |i| i as f64 * 0.25 - 0.5));
    check_at::<f64>(&c, &[], &mut Rng(1));
    check_at::<f32>(&c, &[], &mut Rng(1));
}

#[test]
fn shape_kernels_match_the_reference() {
    use Dom::Any;
    let s = |d: &[usize]| Shape::new(d);
    check(&Op::Reshape(s(&[4, 6])), &[&[2, 3, 4]], &[Any], 1);
    check(&Op::Reshape(s(&[])), &[&[1, 1]], &[Any], 2);
    check(&Op::Flatten, &[&[2, 3, 4]], &[Any], 3);
    for (i, d) in [[1, 5], [5, 1], [37, 45], [64, 32], [0, 4]]
        .iter()
        .enumerate()
    {
        check(&Op::Transpose2d, &[d], &[Any], 10 + i as u64);
    }
    for (i, d) in [[3, 4, 5], [1, 4, 5], [3, 1, 5], [3, 4, 1], [2, 40, 3]]
        .iter()
        .enumerate()
    {
        for (k, op) in [Op::PermuteBca, Op::PermuteCab, Op::SwapLastTwo]
            .iter()
            .enumerate()
        {
            check(op, &[d], &[Any], 20 + 10 * i as u64 + k as u64);
        }
    }
    for depth in [0, 1, 2, 3, 7] {
        check(
            &Op::SwapAdjacent(depth),
            &[&[2, 3, 4, 5]],
            &[Any],
            50 + depth as u64,
        );
        check(
            &Op::SwapAdjacent(depth),
            &[&[3, 1, 4]],
            &[Any],
            60 + depth as u64,
        );
    }
    check(&Op::SwapAdjacent(0), &[&[]], &[Any], 70);
    let bcasts: [(&[usize], &[usize]); 9] = [
        (&[3], &[2, 3]),
        (&[2, 1], &[3, 2, 4]),
        (&[], &[2, 2]),
        (&[1, 3, 1], &[2, 3, 4]),
        (&[4], &[4]),
        (&[2, 1, 3], &[5, 2, 4, 3]),
        (&[], &[]),
        (&[3, 1], &[3, 0]),
        (&[1, 1], &[6, 1]),
    ];
    for (i, (from, to)) in bcasts.iter().enumerate() {
        check(&Op::BroadcastTo(s(to)), &[from], &[Any], 80 + i as u64);
    }
}

#[test]
fn reduce_kernels_match_the_reference() {
    use Dom::Any;
    for (i, d) in [&[][..], &[13], &[3, 4, 5], &[0, 2], &[100]]
        .iter()
        .enumerate()
    {
        check(&Op::Sum, &[d], &[Any], i as u64);
    }
    for axis in 0..3 {
        check(
            &Op::ReduceSum(axis),
            &[&[3, 4, 5]],
            &[Any],
            10 + axis as u64,
        );
        check(
            &Op::ReduceMean(axis),
            &[&[3, 4, 5]],
            &[Any],
            20 + axis as u64,
        );
        check(
            &Op::ReduceSum(axis),
            &[&[2, 1, 37]],
            &[Any],
            30 + axis as u64,
        );
        check(
            &Op::ReduceMean(axis),
            &[&[2, 1, 37]],
            &[Any],
            40 + axis as u64,
        );
    }
    check(&Op::ReduceSum(0), &[&[7]], &[Any], 50);
    check(&Op::ReduceMean(0), &[&[7]], &[Any], 51);
    check(&Op::ReduceSum(1), &[&[3, 0]], &[Any], 52);
}

#[test]
fn linalg_kernels_match_the_reference() {
    use Dom::Any;
    let mm: [(&[usize], &[usize]); 5] = [
        (&[5, 7], &[7, 3]),
        (&[1, 1], &[1, 1]),
        (&[33, 17], &[17, 40]),
        (&[4, 0], &[0, 3]),
        (&[1, 9], &[9, 1]),
    ];
    for (i, (a, b)) in mm.iter().enumerate() {
        check(&Op::Matmul, &[a, b], &[Any, Any], i as u64);
    }
    check(&Op::Bmm, &[&[3, 4, 5], &[3, 5, 2]], &[Any, Any], 10);
    check(&Op::Bmm, &[&[2, 1, 9], &[2, 9, 17]], &[Any, Any], 11);
    check(&Op::Bmm, &[&[0, 2, 2], &[0, 2, 2]], &[Any, Any], 12);
    for (i, x) in [&[6][..], &[5, 6], &[1, 6], &[0, 6]].iter().enumerate() {
        check(&Op::Linear, &[&[4, 6], &[4], x], &[Any; 3], 20 + i as u64);
    }
    check(&Op::Linear, &[&[70, 33], &[70], &[9, 33]], &[Any; 3], 30);
}

#[test]
fn softmax_kernels_match_the_reference() {
    for (i, d) in [&[][..], &[5], &[3, 7], &[2, 3, 4], &[0, 4]]
        .iter()
        .enumerate()
    {
        for (k, dom) in [Dom::Any, Dom::Wide(50.0)].into_iter().enumerate() {
            let seed = 10 * i as u64 + k as u64;
            check(&Op::Softmax, &[d], &[dom], seed);
            check(&Op::LogSoftmax, &[d], &[dom], seed + 100);
        }
    }
}

#[test]
fn loss_kernels_match_the_reference() {
    for (i, d) in [&[][..], &[6], &[3, 4], &[17, 3]].iter().enumerate() {
        check(&Op::MseLoss, &[d, d], &[Dom::Any, Dom::Any], i as u64);
    }
}
