//! GraphBuilder, eval, backprop_all and jvp at the IR level: typing by construction, errors for
//! bad input, and hand-worked gradients.

use tl_ir::{Error, GraphBuilder, Op};
use tl_spec::{Shape, Tensor};

fn v(data: &[f64]) -> Tensor<f64> {
    Tensor::vector(data.to_vec())
}

#[test]
fn rejected_nodes_leave_the_graph_unchanged() {
    let mut g = GraphBuilder::new();
    let a = g.leaf([2, 3], Some("a")).unwrap();
    let b = g.leaf([3, 2], Some("b")).unwrap();
    let before = g.graph().clone();
    let e = g.apply(Op::Add, &[a, b]).unwrap_err().to_string();
    assert!(
        e.contains("add") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    let e = g.apply(Op::Matmul, &[a, 7]).unwrap_err();
    assert_eq!(
        e,
        Error::UnknownId {
            op: "matmul",
            id: 7,
            len: 2
        }
    );
    let e = g
        .apply(Op::Reshape(Shape::new(&[5])), &[a])
        .unwrap_err()
        .to_string();
    assert!(e.contains("reshape") && e.contains("[5]"), "{e}");
    let e = g.apply(Op::ReduceSum(2), &[a]).unwrap_err().to_string();
    assert!(e.contains("reduceSum") && e.contains("axis 2"), "{e}");
    let e = g.apply(Op::Add, &[a]).unwrap_err().to_string();
    assert!(e.contains("add") && e.contains("expected 2"), "{e}");
    let e = g
        .apply(Op::Clamp { lo: 1.0, hi: 0.0 }, &[a])
        .unwrap_err()
        .to_string();
    assert!(e.contains("clamp"), "{e}");
    assert_eq!(g.graph(), &before);
    let c = g.apply(Op::Matmul, &[a, b]).unwrap();
    assert_eq!(g.graph().shape(c).unwrap(), &Shape::new(&[2, 2]));
}

#[test]
fn leaves_must_come_before_nodes() {
    let mut g = GraphBuilder::new();
    let a = g.leaf([2], None).unwrap();
    g.apply(Op::Relu, &[a]).unwrap();
    let e = g.leaf([2], Some("late")).unwrap_err();
    assert_eq!(
        e,
        Error::LeafAfterNode {
            name: Some("late".into())
        }
    );
    assert!(e.to_string().contains("before any op"));
}

#[test]
fn eval_and_backprop_check_their_inputs() {
    let mut g = GraphBuilder::new();
    let a = g.leaf([2], None).unwrap();
    let y = g.apply(Op::Log, &[a]).unwrap();
    let graph = g.finish();
    let e = graph.eval::<f64>(&[], &[]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Count {
                expected: 1,
                got: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = graph
        .eval(&[v(&[1.0, 2.0, 3.0])], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2]") && e.contains("[3]"), "{e}");
    let e = graph.eval(&[v(&[1.0, -2.0])], &[]).unwrap_err().to_string();
    assert!(e.contains("log") && e.contains("non-positive"), "{e}");
    let e = graph
        .backprop_all(&[v(&[1.0, 2.0])], &[], y, &Tensor::scalar(1.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("seed") && e.contains("[2]") && e.contains("[]"),
        "{e}"
    );
    let e = graph
        .backprop_all(&[v(&[1.0, 2.0])], &[], 9, &v(&[1.0, 1.0]))
        .unwrap_err();
    assert!(matches!(e, Error::UnknownId { id: 9, .. }), "{e}");
}

#[test]
fn fan_out_accumulates_and_detach_blocks() {
    // y = sum(x*x + detach(x)*w): dy/dx = 2x, dy/dw = x, d detach-branch/dx = 0
    let mut g = GraphBuilder::new();
    let x = g.leaf([2], Some("x")).unwrap();
    let w = g.leaf([2], Some("w")).unwrap();
    let xx = g.apply(Op::Mul, &[x, x]).unwrap();
    let dx = g.apply(Op::Detach, &[x]).unwrap();
    let dw = g.apply(Op::Mul, &[dx, w]).unwrap();
    let s = g.apply(Op::Add, &[xx, dw]).unwrap();
    let y = g.apply(Op::Sum, &[s]).unwrap();
    let graph = g.finish();
    let leaves = [v(&[3.0, -1.0]), v(&[0.5, 2.0])];
    let grads = graph
        .backprop_all(&leaves, &[], y, &Tensor::scalar(1.0))
        .unwrap();
    assert_eq!(grads[x].data(), &[6.0, -2.0]);
    assert_eq!(grads[w].data(), &[3.0, -1.0]);
    // The detach node does not require grad, so it receives nothing (as on the tapes).
    assert_eq!(grads[dx].data(), &[0.0, 0.0]);
    assert!(!graph.requires_grad()[dx]);
    // JVP along x only: d y = Σ 2x·t_x.
    let tangents = [v(&[1.0, 1.0]), v(&[0.0, 0.0])];
    let dots = graph.jvp(&leaves, &[], &tangents).unwrap();
    assert_eq!(dots[y].item().unwrap(), 6.0 - 2.0);
}

#[test]
fn leaves_without_grad_receive_nothing() {
    let mut g = GraphBuilder::new();
    let x = g.leaf_with([2], Some("data"), false).unwrap();
    let w = g.leaf([2], Some("w")).unwrap();
    let p = g.apply(Op::Mul, &[x, w]).unwrap();
    let y = g.apply(Op::Sum, &[p]).unwrap();
    let graph = g.finish();
    let grads = graph
        .backprop_all(
            &[v(&[1.0, 2.0]), v(&[3.0, 4.0])],
            &[],
            y,
            &Tensor::scalar(2.0),
        )
        .unwrap();
    assert_eq!(grads[x].data(), &[0.0, 0.0]);
    assert_eq!(grads[w].data(), &[2.0, 4.0]);
    assert_eq!(grads[y].item().unwrap(), 2.0);
}
