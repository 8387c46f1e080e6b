//! Bad input returns an error (never a panic) whose message names the op or API call and the
//! shapes; a failed `apply` leaves the tape unchanged.

use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::{Error, Tape, ops};

fn tape_with(shapes: &[&[usize]]) -> (Tape<f64>, Vec<usize>) {
    let mut t = Tape::new();
    let ids = shapes
        .iter()
        .map(|s| t.leaf(Tensor::ones(*s), None, true))
        .collect();
    (t, ids)
}

/// `apply` fails, the message contains every string of `needles`, and the tape is unchanged.
fn apply_fails(t: &mut Tape<f64>, op: &Op, args: &[usize], needles: &[&str]) {
    let before = t.len();
    let e = t.apply(op, args).unwrap_err().to_string();
    for n in needles {
        assert!(e.contains(n), "{op}: message {e:?} lacks {n:?}");
    }
    assert_eq!(
        t.len(),
        before,
        "{op}: a failed apply must not record a node"
    );
}

#[test]
fn add_with_mismatched_shapes() {
    let (mut t, id) = tape_with(&[&[2], &[3]]);
    apply_fails(&mut t, &Op::Add, &[id[0], id[1]], &["add", "[2]", "[3]"]);
    // The kernel itself rejects it too (the family modules are public).
    let (a, b) = (Tensor::<f64>::zeros([2]), Tensor::<f64>::zeros([3]));
    let e = ops::forward(&Op::Add, &[&a, &b], &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("add") && e.contains("[2]") && e.contains("[3]"),
        "{e}"
    );
}

#[test]
fn unknown_parent_id() {
    let (mut t, id) = tape_with(&[&[2]]);
    apply_fails(&mut t, &Op::Add, &[id[0], 7], &["add", "unknown id 7"]);
}

#[test]
fn seed_of_the_wrong_shape() {
    let (mut t, id) = tape_with(&[&[2, 3]]);
    let y = t.apply(&Op::Exp, &[id[0]]).unwrap();
    let e = t
        .backward_dense(y, &Tensor::ones([3, 2]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("seed") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = t
        .backward_params(y, &Tensor::ones([6]), &[id[0]])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("backward_params seed") && e.contains("[6]"),
        "{e}"
    );
    let e = t.backward_dense(5, &Tensor::ones([2, 3])).unwrap_err();
    assert!(matches!(e, Error::UnknownId { id: 5, .. }), "{e}");
}

#[test]
fn reshape_to_a_different_size() {
    let (mut t, id) = tape_with(&[&[2, 3]]);
    apply_fails(
        &mut t,
        &Op::Reshape(Shape::new(&[4, 2])),
        &[id[0]],
        &["reshape", "[2, 3]", "[4, 2]"],
    );
    let x = Tensor::<f32>::zeros([2, 3]);
    let e = ops::forward(&Op::Reshape(Shape::new(&[5])), &[&x], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("reshape") && e.contains("[5]"), "{e}");
}

#[test]
fn reduce_sum_axis_out_of_range() {
    let (mut t, id) = tape_with(&[&[2, 3, 4]]);
    apply_fails(
        &mut t,
        &Op::ReduceSum(3),
        &[id[0]],
        &["reduceSum", "axis 3", "[2, 3, 4]"],
    );
    let x = Tensor::<f64>::zeros([2, 3]);
    let e = ops::forward(&Op::ReduceMean(2), &[&x], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("reduceMean") && e.contains("axis 2"), "{e}");
}

#[test]
fn log_of_a_non_positive_value() {
    let mut t = Tape::new();
    let x = t.leaf(
        Tensor::<f64>::new([2, 2], vec![1.0, 2.0, -3.0, 4.0]).unwrap(),
        None,
        true,
    );
    apply_fails(&mut t, &Op::Log, &[x], &["log", "[2, 2]", "index 2", "-3"]);
    let z = t.leaf(Tensor::<f64>::vector(vec![0.0]), None, true);
    apply_fails(&mut t, &Op::Log, &[z], &["log", "index 0"]);
    let n = t.leaf(Tensor::<f64>::vector(vec![1.0, f64::NAN]), None, true);
    apply_fails(&mut t, &Op::Log, &[n], &["log", "NaN", "index 1"]);
}

#[test]
fn value_with_the_wrong_shape() {
    let (t, id) = tape_with(&[&[2, 3]]);
    assert_eq!(t.value(id[0], &Shape::new(&[2, 3])).unwrap().numel(), 6);
    let e = t
        .value(id[0], &Shape::new(&[3, 2]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("value") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = t.value(9, &Shape::new(&[2, 3])).unwrap_err().to_string();
    assert!(e.contains("value") && e.contains("unknown id 9"), "{e}");
}

#[test]
fn kernels_reject_inconsistent_operands_instead_of_panicking() {
    // Called directly, bypassing the shape rule: every inconsistency is an Err.
    let m = Tensor::<f64>::zeros([2, 3]);
    let v3 = Tensor::<f64>::zeros([3]);
    let s = Tensor::<f64>::scalar(1.0);
    assert!(ops::forward(&Op::Matmul, &[&m, &m], &[]).is_err());
    assert!(ops::forward(&Op::Bmm, &[&m, &m], &[]).is_err());
    assert!(ops::forward(&Op::Linear, &[&m, &v3, &v3], &[]).is_err());
    assert!(ops::forward(&Op::Transpose2d, &[&v3], &[]).is_err());
    assert!(ops::forward(&Op::PermuteBca, &[&m], &[]).is_err());
    assert!(ops::forward(&Op::MseLoss, &[&m, &v3], &[]).is_err());
    assert!(ops::forward(&Op::BroadcastTo(Shape::new(&[3, 2])), &[&m], &[]).is_err());
    assert!(ops::forward::<f64>(&Op::Sum, &[], &[]).is_err());
    // Wrong cotangent shapes in backward.
    let y = ops::forward(&Op::Sum, &[&m], &[]).unwrap();
    assert!(ops::backward(&Op::Sum, &[&m], &y, &v3, &[]).is_err());
    let y = ops::forward(&Op::Softmax, &[&m], &[]).unwrap();
    let e = ops::backward(&Op::Softmax, &[&m], &y, &v3, &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("softmax") && e.contains("[3]") && e.contains("[2, 3]"),
        "{e}"
    );
    let y = ops::forward(&Op::MseLoss, &[&m, &m], &[]).unwrap();
    assert!(ops::backward(&Op::MseLoss, &[&m, &m], &y, &v3, &[]).is_err());
    let y = ops::forward(&Op::Transpose2d, &[&m], &[]).unwrap();
    assert!(ops::backward(&Op::Transpose2d, &[&m], &y, &m, &[]).is_err());
    let y = ops::forward(&Op::Matmul, &[&m, &m.reshape([3, 2]).unwrap()], &[]).unwrap();
    assert!(ops::backward(&Op::Matmul, &[&m, &m.reshape([3, 2]).unwrap()], &y, &s, &[]).is_err());
    // An empty last axis for softmax.
    let e0 = Tensor::<f64>::zeros([2, 0]);
    assert!(ops::forward(&Op::LogSoftmax, &[&e0], &[]).is_err());
}

/// Issue 14: oversized or wrapping shapes on the CPU tape are errors naming the op, before any
/// kernel allocates; `swapAdjacent(usize::MAX)` is the identity.
#[test]
fn oversized_outputs_are_refused_before_allocating() {
    let mut t = Tape::<f32>::new();
    let a = t.leaf(Tensor::zeros([1 << 32, 0]), Some("a"), true);
    let b = t.leaf(Tensor::zeros([0, 1 << 32]), Some("b"), true);
    let x = t.leaf(Tensor::from_fn([2, 3], |i| i as f32), Some("x"), true);
    let one = t.leaf(Tensor::ones([1]), Some("one"), true);
    let len = t.len();
    let msg = t.apply(&Op::Matmul, &[a, b]).unwrap_err().to_string();
    assert!(msg.contains("matmul") && msg.contains("too large"), "{msg}");
    let big = Shape::new(&[100_000_000_000]);
    let cases = [
        Op::RandUniform {
            shape: Shape::new(&[1 << 62]),
            seed: 0,
            counter: 0,
        },
        Op::RandUniform {
            shape: big.clone(),
            seed: 0,
            counter: 0,
        },
        Op::BernoulliMask {
            shape: big.clone(),
            keep: 0.5,
            seed: 0,
            counter: 0,
        },
    ];
    for op in cases {
        let msg = t.apply(&op, &[]).unwrap_err().to_string();
        assert!(
            msg.contains(op.name()) && msg.contains("too large"),
            "{msg}"
        );
    }
    let msg = t
        .apply(&Op::BroadcastTo(big.clone()), &[one])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("broadcastTo") && msg.contains("allocation cap"),
        "{msg}"
    );
    let msg = t
        .apply(
            &Op::GatherRowsNatVec {
                at: 0,
                k: 100_000_000_000,
            },
            &[x],
        )
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("gather") && msg.contains("allocation cap"),
        "{msg}"
    );
    let e = t.leaf(Tensor::zeros([0, 100_000_000_000]), None, true);
    let msg = t.apply(&Op::ReduceSum(0), &[e]).unwrap_err().to_string();
    assert!(
        msg.contains("reduceSum") && msg.contains("allocation cap"),
        "{msg}"
    );
    assert_eq!(t.len(), len + 1, "only the extra leaf was added");
    // The kernels themselves refuse too, when called directly.
    let msg = tl_tape_cpu::ops::reduce::forward(&Op::ReduceSum(0), &[t.get(e).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("allocation cap"), "{msg}");
    let msg = tl_tape_cpu::ops::random::forward::<f32>(
        &Op::RandUniform {
            shape: big,
            seed: 0,
            counter: 0,
        },
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("allocation cap"), "{msg}");
    // swapAdjacent out of range is the identity, forward and backward.
    let s = t.apply(&Op::SwapAdjacent(usize::MAX), &[x]).unwrap();
    assert_eq!(t.get(s).unwrap(), t.get(x).unwrap());
    let g = t.backward_dense(s, &Tensor::ones([2, 3])).unwrap();
    assert_eq!(g[x], Tensor::ones([2, 3]));
}
