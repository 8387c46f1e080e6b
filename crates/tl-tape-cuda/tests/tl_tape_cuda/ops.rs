//! Every op of `tl_ir::Op` on the CUDA tape over the simulation device: forward values and
//! `backward_dense` against the f64 IR reference (`GraphData::eval` / `backprop_all` on the same
//! graph, replayed into the tape), within f32 tolerance, on several shapes and random draws.

use crate::common::{Domain, Gen, check_graph, draw};
use tl_ir::{GraphBuilder, Op};
use tl_spec::{Shape, Tensor};

/// One test case: an op applied to leaves of the given shapes and domains (leaves listed in
/// `frozen` do not require grad).
struct Case {
    op: Op,
    leaves: Vec<(Shape, Domain)>,
    frozen: Vec<usize>,
}

fn case(op: Op, leaves: &[(&[usize], Domain)]) -> Case {
    Case {
        op,
        leaves: leaves.iter().map(|(s, d)| (Shape::new(s), *d)).collect(),
        frozen: Vec::new(),
    }
}

impl Case {
    fn frozen(mut self, leaves: &[usize]) -> Case {
        self.frozen = leaves.to_vec();
        self
    }
}

use Domain::{Any, NonZero, Positive};

/// The cases of one op. The match is exhaustive, so a new `Op` variant does not compile until
/// it has cases here.
fn cases(op: &Op) -> Vec<Case> {
    use Op::*;
    let m23: &[usize] = &[2, 3];
    let s: &[usize] = &[];
    let unary = |d: Domain| vec![case(op.clone(), &[(m23, d)]), case(op.clone(), &[(s, d)])];
    let binary = |d0: Domain, d1: Domain| {
        vec![
            case(op.clone(), &[(m23, d0), (m23, d1)]),
            case(op.clone(), &[(s, d0), (s, d1)]),
            case(op.clone(), &[(m23, d0), (m23, d1)]).frozen(&[1]),
        ]
    };
    match op {
        Add | Sub | Mul | Max | Min => binary(Any, Any),
        Div => binary(Any, NonZero),
        Scale(_) | Exp | Sigmoid | Tanh | Softplus | SafeLog { .. } | Clamp { .. } => unary(Any),
        Abs | Relu | Inv | LeakyRelu { .. } | Elu { .. } => unary(NonZero),
        GeluErf => unary(Any),
        Sqrt | Log => unary(Positive),
        // The graph wraps these so that gradients flow around them (see `graph_for`).
        Detach | Constant(_) => vec![case(op.clone(), &[(m23, Any)])],
        Reshape(_) => vec![case(op.clone(), &[(&[2, 3, 4], Any)])],
        Flatten => vec![
            case(op.clone(), &[(&[2, 3, 4], Any)]),
            case(op.clone(), &[(s, Any)]),
        ],
        Transpose2d => vec![case(op.clone(), &[(&[3, 5], Any)])],
        PermuteBca | PermuteCab | SwapLastTwo | SwapAdjacent(_) => {
            vec![case(op.clone(), &[(&[2, 3, 4], Any)])]
        }
        BroadcastTo(to) => {
            let from: &[usize] = match to.dims() {
                [_, 3, 4] => &[3, 1],
                [_, 4] => &[4],
                _ => &[],
            };
            vec![case(op.clone(), &[(from, Any)])]
        }
        Sum => vec![
            case(op.clone(), &[(&[2, 3, 4], Any)]),
            case(op.clone(), &[(&[700], Any)]),
            case(op.clone(), &[(s, Any)]),
        ],
        ReduceSum(_) | ReduceMean(_) => vec![case(op.clone(), &[(&[2, 3, 4], Any)])],
        Matmul => vec![case(op.clone(), &[(&[3, 4], Any), (&[4, 5], Any)])],
        Bmm => vec![case(op.clone(), &[(&[2, 3, 4], Any), (&[2, 4, 5], Any)])],
        Linear => vec![
            case(op.clone(), &[(&[3, 4], Any), (&[3], Any), (&[4], Any)]),
            case(op.clone(), &[(&[3, 4], Any), (&[3], Any), (&[5, 4], Any)]),
            case(op.clone(), &[(&[3, 4], Any), (&[3], Any), (&[5, 4], Any)]).frozen(&[2]),
        ],
        Softmax | LogSoftmax => vec![
            case(op.clone(), &[(&[3, 5], Any)]),
            case(op.clone(), &[(&[2, 2, 300], Any)]),
            case(op.clone(), &[(s, Any)]),
        ],
        // Issue-3 families: cases in the modules `norm`, `conv` and `index`, and every
        // op runs checks 1, 2 and 6 of the harness on the sim (tl-conformance, module `cuda_sim`).
        LayerNorm { .. }
        | RmsNorm { .. }
        | BatchNorm { .. }
        | BatchMoments
        | MaskedSoftmax { .. }
        | MultiHeadAttention { .. }
        | ScaledDotProductAttention { .. } => vec![],
        Conv { .. }
        | ConvTranspose { .. }
        | MaxPool { .. }
        | AvgPool { .. }
        | SmoothMaxPool { .. } => vec![],
        // Random ops: module `random` (bit-exact against the CPU tape); spectral: `conv`.
        RandUniform { .. } | BernoulliMask { .. } | Dropout { .. } | SpectralConv1dRfft { .. } => {
            vec![]
        }
        MseLoss => vec![
            case(op.clone(), &[(m23, Any), (m23, Any)]),
            case(op.clone(), &[(s, Any), (s, Any)]),
            case(op.clone(), &[(m23, Any), (m23, Any)]).frozen(&[1]),
        ],
        // Index family: module `index`.
        Gelu
        | Silu
        | Concat
        | Slice { .. }
        | CrossEntropy { .. }
        | tl_ir::gather_ops!()
        | ScatterAddVec { .. }
        | ScatterAddRow { .. } => Vec::new(),
        // User ops: module `user`.
        User(_) => Vec::new(),
    }
}

/// One sample of every variant (with representative parameters).
fn all_ops() -> Vec<Op> {
    use Op::*;
    vec![
        Add,
        Sub,
        Mul,
        Div,
        Scale(-1.5),
        Abs,
        Sqrt,
        Exp,
        Log,
        Inv,
        Relu,
        Clamp { lo: -0.5, hi: 0.7 },
        Max,
        Min,
        Sigmoid,
        Tanh,
        Softplus,
        SafeLog { eps: 1e-6 },
        GeluErf,
        LeakyRelu {
            negative_slope: 0.2,
        },
        Elu { alpha: 0.7 },
        Detach,
        Constant(Tensor::from_fn([2, 3], |i| i as f64 * 0.5 - 1.0)),
        Reshape(Shape::new(&[6, 4])),
        Flatten,
        Transpose2d,
        PermuteBca,
        PermuteCab,
        SwapLastTwo,
        SwapAdjacent(0),
        SwapAdjacent(1),
        SwapAdjacent(5),
        BroadcastTo(Shape::new(&[2, 3, 4])),
        BroadcastTo(Shape::new(&[3, 4])),
        BroadcastTo(Shape::new(&[2, 2])),
        Sum,
        ReduceSum(0),
        ReduceSum(1),
        ReduceSum(2),
        ReduceMean(0),
        ReduceMean(2),
        Matmul,
        Bmm,
        Linear,
        Softmax,
        LogSoftmax,
        MseLoss,
    ]
}

/// Build the graph of a case: the op on the leaves; `detach` is checked as `detach(x)·x` (the
/// gradient must see only the second factor) and `constant` as `constant + x`.
fn graph_for(c: &Case) -> (tl_ir::GraphData, usize) {
    let mut g = GraphBuilder::new();
    let leaves: Vec<usize> = c
        .leaves
        .iter()
        .enumerate()
        .map(|(k, (s, _))| {
            g.leaf_with(s.clone(), None, !c.frozen.contains(&k))
                .unwrap()
        })
        .collect();
    let out = match &c.op {
        Op::Detach => {
            let d = g.apply(Op::Detach, &[leaves[0]]).unwrap();
            g.apply(Op::Mul, &[d, leaves[0]]).unwrap()
        }
        Op::Constant(_) => {
            let k = g.apply(c.op.clone(), &[]).unwrap();
            g.apply(Op::Add, &[k, leaves[0]]).unwrap()
        }
        op => g.apply(op.clone(), &leaves).unwrap(),
    };
    (g.finish(), out)
}

#[test]
fn every_op_forward_and_backward_match_the_ir_reference() {
    let mut checked = std::collections::BTreeSet::new();
    let mut rnd = Gen::new(0x5eed);
    for op in all_ops() {
        for (ci, c) in cases(&op).iter().enumerate() {
            let (graph, out) = graph_for(c);
            for draw_no in 0..3 {
                let leaves: Vec<Tensor<f64>> = c
                    .leaves
                    .iter()
                    .map(|(s, d)| draw(&mut rnd, s, *d))
                    .collect();
                let seed = draw(&mut rnd, graph.shape(out).unwrap(), Domain::Any);
                let what = format!("{op:?} case {ci} draw {draw_no}");
                check_graph(&what, &graph, &leaves, out, &seed);
            }
        }
        checked.insert(op.name());
    }
    assert_eq!(
        checked.len(),
        40,
        "every variant of the first op set: {checked:?}"
    );
}

#[test]
fn conventions_at_kinks_and_ties_match_the_reference() {
    // Values exactly at the kinks: abs/relu/sqrt at 0, clamp at its bounds, max/min ties.
    let at = Tensor::<f64>::vector(vec![0.0, -0.5, 0.7, 1.0, -2.0, 0.0]);
    let other = Tensor::<f64>::vector(vec![0.0, -0.5, 0.5, 2.0, -2.0, 1.0]);
    let seed = Tensor::<f64>::vector(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let unary = [Op::Abs, Op::Relu, Op::Sqrt, Op::Clamp { lo: -0.5, hi: 0.7 }];
    for op in unary {
        let mut g = GraphBuilder::new();
        let x = g.leaf([6], None).unwrap();
        let y = g.apply(op.clone(), &[x]).unwrap();
        check_graph(
            &format!("{op:?} at kinks"),
            &g.finish(),
            std::slice::from_ref(&at),
            y,
            &seed,
        );
    }
    for op in [Op::Max, Op::Min] {
        let mut g = GraphBuilder::new();
        let a = g.leaf([6], None).unwrap();
        let b = g.leaf([6], None).unwrap();
        let y = g.apply(op.clone(), &[a, b]).unwrap();
        let leaves = [at.clone(), other.clone()];
        check_graph(&format!("{op:?} with ties"), &g.finish(), &leaves, y, &seed);
    }
}

#[test]
fn a_dag_with_fan_out_accumulates_like_the_reference() {
    // A two-layer MLP with a softmax head, a residual use of the hidden layer and shared
    // parameters, so several gradients are sums of contributions.
    let mut g = GraphBuilder::new();
    let w1 = g.leaf([6, 4], Some("w1")).unwrap();
    let b1 = g.leaf([6], Some("b1")).unwrap();
    let w2 = g.leaf([3, 6], Some("w2")).unwrap();
    let b2 = g.leaf([3], Some("b2")).unwrap();
    let x = g.leaf_with([5, 4], Some("x"), false).unwrap();
    let t = g.leaf_with([5, 3], Some("target"), false).unwrap();
    let h = g.apply(Op::Linear, &[w1, b1, x]).unwrap();
    let a = g.apply(Op::Tanh, &[h]).unwrap();
    let r = g.apply(Op::Add, &[a, h]).unwrap();
    let o = g.apply(Op::Linear, &[w2, b2, r]).unwrap();
    let p = g.apply(Op::LogSoftmax, &[o]).unwrap();
    let m = g.apply(Op::ReduceMean(0), &[p]).unwrap();
    let mb = g.apply(Op::BroadcastTo(Shape::new(&[5, 3])), &[m]).unwrap();
    let q = g.apply(Op::Mul, &[p, mb]).unwrap();
    let l1 = g.apply(Op::MseLoss, &[q, t]).unwrap();
    let l2 = g.apply(Op::Sum, &[w1]).unwrap();
    let sq = g.apply(Op::Mul, &[l2, l2]).unwrap();
    let loss = g.apply(Op::Add, &[l1, sq]).unwrap();
    let graph = g.finish();
    let mut rnd = Gen::new(7);
    for _ in 0..3 {
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut rnd, &l.shape, Domain::Any))
            .collect();
        check_graph("mlp dag", &graph, &leaves, loss, &Tensor::scalar(1.0));
    }
}
