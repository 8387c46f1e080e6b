//! Check 7's oversized graphs: outputs no machine holds (10¹¹ random values, a broadcast or a
//! gather of 10¹¹ rows, a product of 10⁶ × 10⁶ elements from two empty operands, a reduction
//! over an empty axis of 10¹¹) must be
//! refused with an error that names the op, never a panic and never `Ok`, and the backend must
//! still give the IR's values afterwards. The IR builds every one of these graphs (their shapes
//! are valid); no backend can run them. A backend that tries to allocate such an output aborts
//! the process (the allocator's failure is not a panic): the test binary dies, which fails the
//! run too, if less politely. The sizes are checked first and allocations are fallible in the
//! CPU tape, the CUDA tape's caching allocator and the IR (docs/guide.md, "Bad input").

use tl_ir::{GraphBuilder, GraphData, Op};
use tl_spec::{Shape, Tensor};

use super::{Name, guard, refused};
use crate::checks::forward_case;
use crate::{Backend, GraphCase, Measured, Report, Tol};

/// The element count of the large outputs: 10¹¹ (400 GB of f32), above any allocation cap and
/// below the IR's limit on a tensor's elements (2⁶⁰), so the graphs build.
pub const BIG: usize = 100_000_000_000;

/// One oversized graph: its name, the graph, its leaf values and the op that must be named.
pub struct Oversized {
    /// A short name for reports.
    pub name: &'static str,
    /// The graph: leaves, then the one oversized op.
    pub graph: GraphData,
    /// One small value per leaf.
    pub leaves: Vec<Tensor<f64>>,
    /// The op's name, which the refusal must contain.
    pub op: &'static str,
}

/// The graph `op(leaves…)`.
fn one(name: &'static str, op: Op, leaves: Vec<Tensor<f64>>) -> Oversized {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).expect("leaves first"))
        .collect();
    let op_name = op.name();
    b.apply(op, &ids)
        .unwrap_or_else(|e| panic!("the IR builds the oversized case {name}: {e}"));
    Oversized {
        name,
        graph: b.finish(),
        leaves,
        op: op_name,
    }
}

/// The oversized graphs (see the module documentation).
pub fn oversized_cases() -> Vec<Oversized> {
    let big = Shape::new(&[BIG]);
    let random = |shape: Shape| Op::RandUniform {
        shape,
        seed: 0,
        counter: 0,
    };
    vec![
        one("randUniform [1e11]", random(big.clone()), vec![]),
        one(
            "bernoulliMask [1e11]",
            Op::BernoulliMask {
                shape: big.clone(),
                keep: 0.5,
                seed: 0,
                counter: 0,
            },
            vec![],
        ),
        one(
            "broadcastTo [1e11]",
            Op::BroadcastTo(big),
            vec![Tensor::ones([1])],
        ),
        one(
            "matmul [1e6, 0]·[0, 1e6]",
            Op::Matmul,
            vec![Tensor::zeros([1_000_000, 0]), Tensor::zeros([0, 1_000_000])],
        ),
        one(
            "reduceSum axis 0 of [0, 1e11]",
            Op::ReduceSum(0),
            vec![Tensor::zeros([0, BIG])],
        ),
        one(
            "gatherRowsNatVec of 1e11 rows",
            Op::GatherRowsNatVec { at: 0, k: BIG },
            vec![Tensor::ones([2, 3])],
        ),
    ]
}

/// A small good case run after the refusals: `add` of two (2, 3) leaves.
fn still_works() -> GraphCase {
    let mut b = GraphBuilder::new();
    let x = b.leaf(Shape::new(&[2, 3]), None).expect("a leaf");
    let y = b.leaf(Shape::new(&[2, 3]), None).expect("a leaf");
    let out = b.apply(Op::Add, &[x, y]).expect("add");
    GraphCase {
        graph: b.finish(),
        leaves: vec![
            Tensor::from_fn([2, 3], |i| i as f64 - 2.5),
            Tensor::from_fn([2, 3], |i| 0.25 * i as f64),
        ],
        out,
        seed: Tensor::ones([2, 3]),
        nats: Vec::new(),
    }
}

/// Check 7 on the oversized graphs: each refused (by `record` or by `values`) with an error
/// naming its op, never a panic or `Ok`; then a small graph still gives the IR's values. The
/// report's cases are the oversized graphs refused as required.
pub fn check_oversized<B: Backend>(backend: &B) -> Report {
    let label = format!("{} oversized {}", super::BAD_INPUT, backend.name());
    let cases = oversized_cases();
    let mut report = Report {
        label,
        cases: 0,
        max_err: 0.0,
        tol: 0.0,
        failure: None,
        pending: Vec::new(),
    };
    for case in &cases {
        let leaves: Vec<Tensor<B::T>> = case.leaves.iter().map(Tensor::cast).collect();
        let what = format!("record and values of {}", case.name);
        let outcome = guard(|| {
            let program = backend.record(&case.graph, &leaves, &[])?;
            backend.values(&program).map(|_| ())
        });
        match refused(&what, outcome, &[Name::Op(case.op)]) {
            Ok(()) => report.cases += 1,
            Err(msg) => {
                report.failure = Some(msg);
                return report;
            }
        }
    }
    match forward_case(backend, &still_works(), &Tol::DEFAULT) {
        Ok(Measured { err, tol }) => {
            report.max_err = err;
            report.tol = tol;
        }
        Err(msg) => {
            report.failure = Some(format!(
                "after refusing the oversized graphs, a small add: {msg}"
            ))
        }
    }
    report
}
