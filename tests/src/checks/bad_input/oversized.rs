//! Check 7's oversized graphs: outputs no machine holds (10¹⁴ random values, a broadcast or a
//! gather of 10¹⁴ rows, a product of 10⁷ × 10⁷ elements from two empty operands, a reduction
//! over an empty axis of 10¹⁴) and pools whose windows no machine can scan (2⁶⁴ cells, almost
//! all padding, over a one-element input) must be refused with an error that names the op, never a panic
//! and never `Ok`, and the backend must still give the IR's values afterwards. The IR builds every one of these graphs (their shapes
//! are valid); no backend can run them. A backend that tries to allocate such an output aborts
//! the process (the allocator's failure is not a panic): the test binary dies, which fails the
//! run too, if less politely. The sizes are checked first and allocations are fallible in the
//! CPU tape, the CUDA tape's caching allocator and the IR (docs/guide.md, "Bad input").

use tl_ir::{GraphBuilder, Op};
use tl_spec::{Shape, Tensor};

use super::{Name, guard, refused};
use crate::checks::forward_case;
use crate::report::run_fixed;
use crate::{Backend, CaseError, GraphCase, Measured, Report, Tol};

/// The element count of the large outputs: 10¹⁴ (400 TB of f32), above any machine's memory
/// (the default allocation cap) and below the IR's limit on a tensor's elements (2⁶⁰), so the
/// graphs build.
pub const BIG: usize = 100_000_000_000_000;

/// The graph `op(leaves…)`, named. Its seed is a scalar, never used: these graphs are only
/// recorded and read, and a seed of the output's shape could not be allocated.
fn one(name: &'static str, op: Op, leaves: Vec<Tensor<f64>>) -> (&'static str, GraphCase) {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).expect("leaves first"))
        .collect();
    let out = b
        .apply(op, &ids)
        .unwrap_or_else(|e| panic!("the IR builds the oversized case {name}: {e}"));
    let case = GraphCase {
        graph: b.finish(),
        leaves,
        out,
        seed: Tensor::zeros(Shape::scalar()),
        nats: Vec::new(),
    };
    (name, case)
}

/// The oversized graphs (see the module documentation).
pub fn oversized_cases() -> Vec<(&'static str, GraphCase)> {
    let big = Shape::new(&[BIG]);
    let random = |shape: Shape| Op::RandUniform {
        shape,
        seed: 0,
        counter: 0,
    };
    vec![
        one("randUniform [1e14]", random(big.clone()), vec![]),
        one(
            "bernoulliMask [1e14]",
            Op::BernoulliMask {
                shape: big.clone(),
                keep: 0.5,
                seed: 0,
                counter: 0,
            },
            vec![],
        ),
        one(
            "broadcastTo [1e14]",
            Op::BroadcastTo(big),
            vec![Tensor::ones([1])],
        ),
        one(
            "matmul [1e7, 0]·[0, 1e7]",
            Op::Matmul,
            vec![
                Tensor::zeros([10_000_000, 0]),
                Tensor::zeros([0, 10_000_000]),
            ],
        ),
        one(
            "reduceSum axis 0 of [0, 1e14]",
            Op::ReduceSum(0),
            vec![Tensor::zeros([0, BIG])],
        ),
        one(
            "gatherRowsNatVec of 1e14 rows",
            Op::GatherRowsNatVec { at: 0, k: BIG },
            vec![Tensor::ones([2, 3])],
        ),
        one(
            "maxPool kernel [2^32, 2^32] of a (1, 1, 1) input",
            huge_window(false),
            vec![Tensor::ones([1, 1, 1])],
        ),
        one(
            "avgPool kernel [2^32, 2^32] of a (1, 1, 1) input",
            huge_window(true),
            vec![Tensor::ones([1, 1, 1])],
        ),
    ]
}

/// A pool whose window holds 2⁶⁴ cells, almost all padding: a valid shape (padding half the
/// kernel, PyTorch's rule), a (1, 2, 2) output, and a kernel volume that overflows `usize`.
fn huge_window(avg: bool) -> Op {
    crate::nn::pool_op(avg, vec![1 << 32; 2], vec![1; 2], vec![1 << 31; 2])
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
    let mut report = run_fixed(label, &oversized_cases(), |case| {
        let op = match case.graph.node(case.out) {
            Some(node) => node.op().name(),
            None => return Err(CaseError::Fail("an oversized case without its op".into())),
        };
        let leaves: Vec<Tensor<B::T>> = case.leaves.iter().map(Tensor::cast).collect();
        let outcome = guard(|| {
            let program = backend.record(&case.graph, &leaves, &[])?;
            backend.values(&program).map(|_| ())
        });
        refused("record and values", outcome, &[Name::Op(op)])
            .map(|()| Measured::ZERO)
            .map_err(CaseError::Fail)
    });
    if report.passed() {
        // A backend without `add` (Backend::supports) is not asked.
        let small = || {
            crate::guard::catch(|| forward_case(backend, &still_works(), &Tol::DEFAULT))
                .unwrap_or_else(|p| Err(format!("panicked: {p}")))
        };
        match crate::backend::partial::unless_lacking(small) {
            Err(_lacks) => {}
            Ok(Ok(m)) => (report.max_err, report.tol) = (m.err, m.tol),
            Ok(Err(msg)) => {
                report.failure = Some(format!(
                    "after refusing the oversized graphs, a small add: {msg}"
                ))
            }
        }
    }
    report
}
