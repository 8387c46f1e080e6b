//! GraphBuilder, eval, backprop_all and jvp at the IR level: typing by construction, errors for
//! bad input, and hand-worked gradients.

use tl_ir::{Error, GraphBuilder, GraphData, Op};
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

/// Issue 14: shapes whose element count overflows are errors naming the op, never wrapped
/// counts; `swapAdjacent` out of range (even `usize::MAX`) is the identity.
#[test]
fn oversized_shapes_are_errors_and_swap_adjacent_out_of_range_is_identity() {
    let too_large = |e: Error| matches!(e, Error::Spec(tl_spec::Error::TooLarge { .. }));
    let mut g = GraphBuilder::new();
    let e = g.leaf([1 << 32, 1 << 32], Some("huge")).unwrap_err();
    assert!(too_large(e.clone()), "{e}");
    assert!(g.graph().is_empty(), "the refused leaf was not added");
    // Empty leaves whose product would overflow: [2^32, 0] · [0, 2^32] → [2^32, 2^32].
    let a = g.leaf([1 << 32, 0], Some("a")).unwrap();
    let b = g.leaf([0, 1 << 32], Some("b")).unwrap();
    let x = g.leaf([2, 3, 4], Some("x")).unwrap();
    let e = g.apply(Op::Matmul, &[a, b]).unwrap_err();
    assert!(
        too_large(e.clone()) && e.to_string().contains("matmul"),
        "{e}"
    );
    // 3 · 6148914691236517206 wraps to 2 (and 24 elements are not that anyway).
    let e = g
        .apply(Op::Reshape(Shape::new(&[3, 6148914691236517206])), &[x])
        .unwrap_err();
    assert!(
        too_large(e.clone()) && e.to_string().contains("reshape"),
        "{e}"
    );
    let e = g
        .apply(
            Op::RandUniform {
                shape: Shape::new(&[1 << 62]),
                seed: 1,
                counter: 0,
            },
            &[],
        )
        .unwrap_err();
    assert!(
        too_large(e.clone()) && e.to_string().contains("randUniform"),
        "{e}"
    );
    let s = g.apply(Op::SwapAdjacent(usize::MAX), &[x]).unwrap();
    assert_eq!(g.graph().shape(s).unwrap(), &Shape::new(&[2, 3, 4]));
    let graph = g.finish();
    let xv = Tensor::<f64>::from_fn([2, 3, 4], |i| i as f64);
    let leaves = vec![
        Tensor::zeros([1 << 32, 0]),
        Tensor::zeros([0, 1 << 32]),
        xv.clone(),
    ];
    let values = graph.eval(&leaves, &[]).unwrap();
    assert_eq!(values[s], xv, "identity");
}

/// Issue 14: an output that is representable but larger than the allocation cap is refused by
/// the reference evaluation before anything is allocated (10^11 f64 = 800 GB exceeds any
/// machine's memory, hence the default cap).
#[test]
fn outputs_over_the_allocation_cap_are_errors_not_aborts() {
    let mut g = GraphBuilder::new();
    let p = g.leaf([2], None).unwrap();
    let big = Shape::new(&[100_000_000_000]);
    let r = g
        .apply(
            Op::RandUniform {
                shape: big.clone(),
                seed: 0,
                counter: 0,
            },
            &[],
        )
        .unwrap();
    let graph = g.finish();
    let e = graph.eval(&[Tensor::<f64>::zeros([2])], &[]).unwrap_err();
    assert!(
        e.to_string().contains("randUniform") && e.to_string().contains("allocation cap"),
        "{e}"
    );
    let _ = (p, r);
    for op in [
        Op::GatherScalarsNatVec {
            at: 0,
            k: 100_000_000_000,
        },
        Op::BroadcastTo(big.clone()),
    ] {
        let mut g = GraphBuilder::new();
        let x = g.leaf([1], None).unwrap();
        g.apply(op.clone(), &[x]).unwrap();
        let e = g
            .finish()
            .eval(&[Tensor::<f64>::ones([1])], &[])
            .unwrap_err();
        assert!(
            e.to_string().contains(op.name()) && e.to_string().contains("allocation cap"),
            "{e}"
        );
    }
    // reduceSum of an empty [0, 10^11] input has 10^11 outputs.
    let mut g = GraphBuilder::new();
    let x = g.leaf([0, 100_000_000_000], None).unwrap();
    g.apply(Op::ReduceSum(0), &[x]).unwrap();
    let e = g
        .finish()
        .eval(&[Tensor::<f64>::zeros([0, 100_000_000_000])], &[])
        .unwrap_err();
    assert!(e.to_string().contains("allocation cap"), "{e}");
}

/// A recorder that logs what `replay` asks of it and fuses `linear` followed by `relu` of it
/// or `add` with it (the CUDA tape's bias-epilogue pairs, without a device).
#[derive(Default)]
struct Log {
    ids: usize,
    calls: Vec<String>,
}

impl tl_ir::Recorder<f64> for Log {
    type Error = Error;
    fn leaf(&mut self, _: Tensor<f64>, _: Option<&str>, _: bool) -> Result<usize, Error> {
        self.ids += 1;
        Ok(self.ids - 1)
    }
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Error> {
        self.calls.push(format!("{} {args:?}", op.name()));
        self.ids += 1;
        Ok(self.ids - 1)
    }
    fn set_nats(&mut self, _: &[usize]) -> Result<(), Error> {
        Ok(())
    }
    fn release(&mut self, id: usize) -> Result<bool, Error> {
        self.calls.push(format!("release {id}"));
        Ok(true)
    }
    fn fuses(&self, op: &Op, next: &Op, next_args: &[tl_ir::Then]) -> bool {
        *op == Op::Linear && (*next == Op::Relu || *next == Op::Add) && !next_args.is_empty()
    }
    fn apply_then(
        &mut self,
        op: &Op,
        args: &[usize],
        next: &Op,
        next_args: &[tl_ir::Then],
    ) -> Result<(usize, usize), Error> {
        self.calls.push(format!(
            "{} {args:?} then {} {next_args:?}",
            op.name(),
            next.name()
        ));
        self.ids += 2;
        Ok((self.ids - 2, self.ids - 1))
    }
}

/// Leaves x (2, 3), w (3, 3), bias (3), then `h = relu(x)`, `l = linear(w, bias, h)`: the
/// builder, the ids `[x, w, bias, h, l]` and the leaves' (zero) values.
fn relu_linear() -> (GraphBuilder, [usize; 5], [Tensor<f64>; 3]) {
    let mut b = GraphBuilder::new();
    let x = b.leaf(vec![2, 3], None).unwrap();
    let w = b.leaf(vec![3, 3], None).unwrap();
    let bias = b.leaf(vec![3], None).unwrap();
    let h = b.apply(Op::Relu, &[x]).unwrap();
    let l = b.apply(Op::Linear, &[w, bias, h]).unwrap();
    let leaves = [
        Tensor::<f64>::zeros([2, 3]),
        Tensor::<f64>::zeros([3, 3]),
        Tensor::<f64>::zeros([3]),
    ];
    (b, [x, w, bias, h, l], leaves)
}

/// [`relu_linear`] twice with a residual: `out = h + linear(w, bias, relu(l))`, finished;
/// the ids `[h, l, r, l2, out]` (`r` the second relu, `l2` the second linear) and zero leaves.
fn residual_relu_linear() -> (GraphData, [usize; 5], [Tensor<f64>; 3]) {
    let (mut b, [_, w, bias, h, l], leaves) = relu_linear();
    let r = b.apply(Op::Relu, &[l]).unwrap();
    let l2 = b.apply(Op::Linear, &[w, bias, r]).unwrap();
    let out = b.apply(Op::Add, &[h, l2]).unwrap();
    (b.finish(), [h, l, r, l2, out], leaves)
}

/// `replay` offers a pair only where the recorder's `fuses` accepts it, so an unfusable pair
/// (`relu` → `linear`) does not take the `linear` that the pair after it (`linear` → `relu`)
/// fuses; a residual `add` gets its other operand's recorder id on the right side.
#[test]
fn replay_offers_only_the_pairs_the_recorder_fuses() {
    let (g, _, leaves) = residual_relu_linear();
    let mut rec = Log::default();
    let ids = g.replay(&mut rec, &leaves, &[]).unwrap();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert_eq!(
        rec.calls,
        [
            "relu [0]",
            "linear [1, 2, 3] then relu [First]",
            "linear [1, 2, 5] then add [Id(3), First]",
        ]
    );
}

/// `replay_more` continues a replay of a graph that grew: the nodes recorded since, with the
/// ids the earlier replay gave; a pair split across the two calls is recorded one op at a
/// time. A map longer than the graph is an error.
#[test]
fn replay_more_records_only_the_nodes_added_since() {
    let (mut b, [_, w, bias, h, l], leaves) = relu_linear();
    let mut rec = Log::default();
    let mut ids = b.graph().replay(&mut rec, &leaves, &[]).unwrap();
    assert_eq!(rec.calls, ["relu [0]", "linear [1, 2, 3]"]);
    let r = b.apply(Op::Relu, &[l]).unwrap();
    let l2 = b.apply(Op::Linear, &[w, bias, r]).unwrap();
    b.apply(Op::Add, &[h, l2]).unwrap();
    b.graph().replay_more(&mut rec, &mut ids).unwrap();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert_eq!(
        rec.calls[2..],
        ["relu [4]", "linear [1, 2, 5] then add [Id(3), First]"]
    );
    // Nothing new: nothing recorded.
    b.graph().replay_more(&mut rec, &mut ids).unwrap();
    assert_eq!(rec.calls.len(), 4);
    ids.push(99);
    let e = b.graph().replay_more(&mut rec, &mut ids).unwrap_err();
    assert!(e.to_string().contains("replay_more"), "{e}");
}

/// `replay_more_releasing` offers a node no handle refers to (`dead`) to the recorder right
/// after its last reader runs, once, never a leaf or a node a handle still reaches; a later
/// call offers the nodes it is told were dropped since.
#[test]
fn replay_more_releasing_offers_each_dead_node_after_its_last_reader() {
    let (g, [h, l, .., out], leaves) = residual_relu_linear();
    let mut rec = Log::default();
    let mut ids = g.replay_leaves(&mut rec, &leaves, &[]).unwrap();
    // Every node but the output has lost its handle; so have the leaves (never offered).
    let dead = |id: usize| id != out;
    g.replay_more_releasing(&mut rec, &mut ids, &dead, &[])
        .unwrap();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert_eq!(
        rec.calls,
        [
            "relu [0]",
            "linear [1, 2, 3] then relu [First]",
            "release 4",
            "linear [1, 2, 5] then add [Id(3), First]",
            "release 5",
            "release 3",
            "release 6",
        ]
    );
    // The output's handle dropped since: a later call offers what it is told was dropped
    // (the output) before recording anything new.
    rec.calls.clear();
    g.replay_more_releasing(&mut rec, &mut ids, &|_| true, &[out])
        .unwrap();
    assert_eq!(rec.calls, ["release 7"]);
    assert_eq!(
        (g.read_until(h), g.read_until(l), g.read_until(out)),
        (8, 6, 0)
    );
}

/// `eval_more_releasing` empties a dead node's value right after its last reader is evaluated
/// (leaves never), keeps every other value as `eval` gives it, and, called again, first
/// empties the nodes it is told were dropped since, once their readers have all run.
#[test]
fn eval_more_releasing_empties_each_dead_value_after_its_last_reader() {
    let (g, [h, l, r, l2, out], _) = residual_relu_linear();
    let leaves = [
        Tensor::from_fn([2, 3], |i| i as f64 * 0.5 - 1.0),
        Tensor::from_fn([3, 3], |i| (i as f64 * 0.7).sin()),
        Tensor::from_fn([3], |i| i as f64 * 0.25),
    ];
    let all = g.eval(&leaves, &[]).unwrap();
    let emptied =
        |v: &[Tensor<f64>]| -> Vec<usize> { (0..v.len()).filter(|&i| v[i].numel() == 0).collect() };
    // Every node but the output has lost its handle; so have the leaves (always kept).
    let mut values = Vec::new();
    g.eval_more_releasing(&mut values, &leaves, &[], &|id| id != out, &[])
        .unwrap();
    assert_eq!(emptied(&values), [h, l, r, l2]);
    assert_eq!(values[..h], all[..h]);
    assert_eq!(values[out], all[out]);
    // The output's handle dropped since: a later call empties it before anything new.
    g.eval_more_releasing(&mut values, &leaves, &[], &|_| true, &[out])
        .unwrap();
    assert_eq!(emptied(&values), [h, l, r, l2, out]);

    // A node evaluated, then read by a node appended after, then dropped: kept until that
    // reader is evaluated, which reads its value.
    let (mut b, [_, _, _, h, l], _) = relu_linear();
    let mut values = Vec::new();
    b.graph().eval_into(&mut values, &leaves, &[]).unwrap();
    let r = b.apply(Op::Relu, &[l]).unwrap();
    let g = b.finish();
    let dead = |id: usize| id == l || id == h;
    g.eval_more_releasing(&mut values, &leaves, &[], &dead, &[l, h])
        .unwrap();
    assert_eq!(emptied(&values), [h, l]);
    assert_eq!(values[r], g.eval(&leaves, &[]).unwrap()[r]);
}
