//! Bad input never panics: graph building, IR evaluation/differentiation and the CPU tape
//! return errors that name the op (or call) and the shapes, and leave state unchanged. And
//! check 7 ([`tl_conformance::checks::bad_input`], part of `check_backend`) on every backend of
//! the project: the IR reference, the CPU tape in f64 and f32, the CUDA sim and (feature
//! `cuda-emu`) the emulated device, for every registry op, a user op and random DAGs.

use proptest::prelude::*;
use tl_conformance::backend::IrRef;
use tl_conformance::checks::bad_input::{
    bad_input_cfg, check_bad_input, check_bad_input_dag, check_oversized, oversized_cases,
    wrong_shapes,
};
use tl_conformance::user::UserEntry;
use tl_conformance::{Backend, CpuTape, CudaSim, Report, RunConfig, assert_all_passed, registry};
use tl_ir::{Error as IrError, GraphBuilder, GraphData, Op, UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::Tape;

fn err_text<T: std::fmt::Debug, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

fn contains_all(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} should mention {p:?}");
    }
}

/// Leaves x: [2, 3], y: [3, 2], p: [2] and the node n = x + x.
fn small() -> (GraphBuilder, [usize; 4]) {
    let mut b = GraphBuilder::new();
    let x = b.leaf([2, 3], Some("x")).unwrap();
    let y = b.leaf([3, 2], Some("y")).unwrap();
    let p = b.leaf([2], Some("p")).unwrap();
    let n = b.apply(Op::Add, &[x, x]).unwrap();
    (b, [x, y, p, n])
}

#[test]
fn graph_builder_rejects_bad_nodes_and_stays_unchanged() {
    let (mut b, [x, y, p, _]) = small();
    let before = b.graph().clone();
    contains_all(
        &err_text(b.apply(Op::Add, &[x, y])),
        &["add", "[2, 3]", "[3, 2]"],
    );
    contains_all(&err_text(b.apply(Op::Mul, &[x, 99])), &["mul", "99"]);
    contains_all(
        &err_text(b.apply(Op::Reshape(Shape::new(&[7])), &[x])),
        &["reshape", "[2, 3]", "[7]"],
    );
    contains_all(
        &err_text(b.apply(Op::ReduceSum(2), &[x])),
        &["reduceSum", "axis 2"],
    );
    contains_all(
        &err_text(b.apply(Op::ReduceMean(1), &[p])),
        &["reduceMean", "axis 1"],
    );
    contains_all(
        &err_text(b.apply(Op::Matmul, &[x, x])),
        &["matmul", "[2, 3]"],
    );
    contains_all(
        &err_text(b.apply(Op::Transpose2d, &[p])),
        &["transpose2d", "[2]"],
    );
    contains_all(
        &err_text(b.apply(Op::BroadcastTo(Shape::new(&[3, 3])), &[x])),
        &["broadcastTo", "[2, 3]", "[3, 3]"],
    );
    contains_all(&err_text(b.apply(Op::Add, &[x])), &["add", "2", "1"]);
    contains_all(
        &err_text(b.apply(Op::Clamp { lo: 1.0, hi: 0.0 }, &[x])),
        &["clamp"],
    );
    contains_all(
        &err_text(b.apply(Op::SafeLog { eps: 0.0 }, &[x])),
        &["safeLog", "eps"],
    );
    contains_all(&err_text(b.apply(Op::Scale(f64::NAN), &[x])), &["scale"]);
    contains_all(&err_text(b.apply(Op::Linear, &[x, p, p])), &["linear"]);
    contains_all(&err_text(b.leaf([1], Some("late"))), &["late"]);
    assert_eq!(b.graph(), &before, "failed calls leave the graph unchanged");
}

#[test]
fn ir_eval_backprop_and_jvp_reject_bad_values_ids_and_seeds() {
    let (mut b, [x, y, p, n]) = small();
    let l = b.apply(Op::Log, &[p]).unwrap();
    let g: GraphData = b.finish();
    let ok = vec![
        Tensor::<f64>::ones([2, 3]),
        Tensor::ones([3, 2]),
        Tensor::ones([2]),
    ];
    assert!(g.eval(&ok, &[]).is_ok());
    // Wrong leaf count and shape.
    contains_all(&err_text(g.eval(&ok[..2], &[])), &["eval", "3", "2"]);
    let mut wrong = ok.clone();
    wrong[y] = Tensor::ones([2, 3]);
    contains_all(
        &err_text(g.eval(&wrong, &[])),
        &["eval", "[3, 2]", "[2, 3]"],
    );
    // log of a non-positive value.
    let mut nonpos = ok.clone();
    nonpos[p] = Tensor::vector(vec![1.0, 0.0]);
    contains_all(&err_text(g.eval(&nonpos, &[])), &["log", "index 1"]);
    nonpos[p] = Tensor::vector(vec![-2.0, 1.0]);
    assert!(matches!(
        g.backprop_all(&nonpos, &[], l, &Tensor::ones([2])),
        Err(IrError::Spec(_))
    ));
    // Unknown output id and a seed of the wrong shape.
    contains_all(
        &err_text(g.backprop_all(&ok, &[], 42, &Tensor::ones([2]))),
        &["backprop_all", "42"],
    );
    contains_all(
        &err_text(g.backprop_all(&ok, &[], n, &Tensor::ones([3, 2]))),
        &["seed", "[2, 3]", "[3, 2]"],
    );
    contains_all(
        &err_text(g.backprop_all(&ok, &[], x, &Tensor::scalar(1.0))),
        &["seed"],
    );
    // Tangents of the wrong count or shape.
    assert!(g.jvp(&ok, &[], &ok[..1]).is_err());
    let mut tangents = ok.clone();
    tangents[p] = Tensor::ones([3]);
    contains_all(
        &err_text(g.jvp(&ok, &[], &tangents)),
        &["jvp", "[2]", "[3]"],
    );
    assert!(g.shape(99).is_err());
    assert!(g.node(99).is_none() && g.node(x).is_none());
}

#[test]
fn cpu_tape_rejects_bad_calls_and_stays_unchanged() {
    let mut t = Tape::<f64>::new();
    let x = t.leaf(Tensor::ones([2, 3]), Some("x"), true);
    let y = t.leaf(Tensor::ones([3, 2]), Some("y"), true);
    let p = t.leaf(Tensor::vector(vec![1.0, -1.0]), Some("p"), true);
    let n = t.apply(&Op::Add, &[x, x]).unwrap();
    let len = t.len();
    contains_all(
        &err_text(t.apply(&Op::Add, &[x, y])),
        &["add", "[2, 3]", "[3, 2]"],
    );
    contains_all(&err_text(t.apply(&Op::Add, &[x, 17])), &["17"]);
    contains_all(
        &err_text(t.apply(&Op::Reshape(Shape::new(&[5])), &[x])),
        &["reshape", "[5]"],
    );
    contains_all(
        &err_text(t.apply(&Op::ReduceSum(3), &[x])),
        &["reduceSum", "axis 3"],
    );
    contains_all(&err_text(t.apply(&Op::Log, &[p])), &["log", "index 1"]);
    contains_all(&err_text(t.apply(&Op::Exp, &[])), &["exp"]);
    assert_eq!(t.len(), len, "failed applies record nothing");
    contains_all(
        &err_text(t.backward_dense(n, &Tensor::ones([3, 2]))),
        &["seed", "[2, 3]", "[3, 2]"],
    );
    contains_all(
        &err_text(t.backward_dense(99, &Tensor::ones([2, 3]))),
        &["99"],
    );
    contains_all(&err_text(t.value(n, &Shape::new(&[6]))), &["[2, 3]", "[6]"]);
    assert!(t.get(99).is_err());
    assert!(t.backward_dense_from(vec![Tensor::ones([2, 3])]).is_err());
    assert!(
        t.backward_params(n, &Tensor::ones([2, 3]), &[x, 1234])
            .is_err()
    );
    // Replaying a graph with wrong leaf values fails before recording anything.
    let mut b = GraphBuilder::new();
    b.leaf([2], None).unwrap();
    let g = b.finish();
    let mut fresh = Tape::<f64>::new();
    assert!(g.replay(&mut fresh, &[Tensor::ones([3])], &[]).is_err());
    assert!(fresh.is_empty());
}

/// Random ops from the registry applied to arbitrary shapes (zero-sized dims and wrong ranks
/// included): the builder and the tape accept exactly what the shape rule accepts, never panic,
/// and when they accept, the value has the inferred shape on both the IR and the tape.
#[test]
fn shape_rules_agree_with_values_on_arbitrary_shapes() {
    let entries = registry::all();
    let ops = prop::sample::select(entries.iter().map(|e| e.cases()).collect::<Vec<_>>())
        .prop_flat_map(|s| s)
        .prop_map(|case| case.op);
    let shapes = prop::collection::vec(prop::collection::vec(0usize..=3, 0..=3), 0..=3);
    let mut runner = RunConfig::from_env().runner("shape-fuzz");
    let strategy = (ops, shapes, 0usize..=3);
    let result = runner.run(&strategy, |(op, dims, extra)| {
        // Either the registry's own operand count or a wrong one.
        let n = if extra == 0 { dims.len() } else { op.arity() };
        let shapes: Vec<Shape> = (0..n)
            .map(|k| Shape::from(dims.get(k).cloned().unwrap_or_default()))
            .collect();
        let refs: Vec<&Shape> = shapes.iter().collect();
        let rule = op.infer_shape(&refs);
        let mut b = GraphBuilder::new();
        let ids: Vec<usize> = shapes
            .iter()
            .map(|s| b.leaf(s.clone(), None).unwrap())
            .collect();
        let built = b.apply(op.clone(), &ids);
        prop_assert_eq!(
            rule.is_ok(),
            built.is_ok(),
            "builder disagrees with the shape rule"
        );
        let mut tape = Tape::<f64>::new();
        let leaves: Vec<Tensor<f64>> = shapes
            .iter()
            .map(|s| Tensor::from_fn(s.clone(), |i| 0.5 + i as f64 * 0.25))
            .collect();
        let tids: Vec<usize> = leaves
            .iter()
            .map(|t| tape.leaf(t.clone(), None, true))
            .collect();
        let applied = tape.apply(&op, &tids);
        let Ok(shape) = rule else {
            prop_assert!(
                applied.is_err(),
                "tape accepted what the shape rule rejects"
            );
            return Ok(());
        };
        let g = b.finish();
        let values = g.eval(&leaves, &[]).map_err(|e| {
            TestCaseError::fail(format!("IR eval failed on a well-typed node: {e}"))
        })?;
        prop_assert_eq!(values.last().unwrap().shape(), &shape);
        let id = applied
            .map_err(|e| TestCaseError::fail(format!("tape rejected a well-typed node: {e}")))?;
        prop_assert_eq!(tape.get(id).unwrap().shape(), &shape);
        let grads = tape.backward_dense(id, &Tensor::ones(shape.clone()));
        prop_assert!(grads.is_ok(), "tape backward failed: {:?}", grads.err());
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `a·b − a` elementwise (∂/∂a = b − 1, ∂/∂b = a): a two-operand user op for check 7.
struct MulSub;

impl UserOp for MulSub {
    fn name(&self) -> &'static str {
        "mulSub"
    }
    fn arity(&self) -> usize {
        2
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        match s {
            [a, b] if a == b => Ok((*a).clone()),
            _ => Err(tl_spec::Error::shape(
                "mulSub",
                format!("two operands of one shape, got {s:?}"),
            )),
        }
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("mulSub", x[1], |a, b| a * b - a)
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let da = x[1].zip_map("mulSub", g, |b, g| (b - T::one()) * g)?;
        let db = x[0].zip_map("mulSub", g, |a, g| a * g)?;
        Ok(vec![Some(da), Some(db)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        let t = x[1].zip_map("mulSub", dx[0], |b, d| (b - T::one()) * d)?;
        t.add(&x[0].zip_map("mulSub", dx[1], |a, d| a * d)?)
    }
}

/// Check 7's case count here: an eighth of the default (or of `TL_CASES`), as `check_backend`.
fn cfg7() -> RunConfig {
    bad_input_cfg(&RunConfig::from_env())
}

/// Check 7 for every registry entry, the user op and random DAGs on `backend`.
fn check_7<B: Backend>(backend: &B, cfg: &RunConfig) {
    let user = UserEntry::elementwise(UserOpRef::new(MulSub)).info();
    let mut reports: Vec<Report> = registry::all()
        .iter()
        .chain([&user])
        .map(|e| check_bad_input(backend, e, cfg))
        .collect();
    reports.push(check_bad_input_dag(backend, cfg));
    assert!(
        reports.iter().all(|r| r.label.starts_with("7 bad input ")),
        "{reports:?}"
    );
    assert_all_passed(&reports, cfg.cases);
    let oversized = check_oversized(backend);
    assert_all_passed(&[oversized], oversized_cases().len() as u32);
}

#[test]
fn the_ir_reference_refuses_bad_input_clearly() {
    check_7(&IrRef, &cfg7());
}

#[test]
fn the_cpu_tape_refuses_bad_input_clearly_in_f64_and_f32() {
    check_7(&CpuTape::<f64>::new(), &cfg7());
    check_7(&CpuTape::<f32>::new(), &cfg7());
}

#[test]
fn the_cuda_sim_refuses_bad_input_clearly() {
    check_7(&CudaSim::new(), &cfg7());
}

#[cfg(feature = "cuda-emu")]
#[test]
fn the_emulated_kernels_refuse_bad_input_clearly() {
    use tl_conformance::backend::OnDevice;
    // The emulator runs every thread as a fiber: half of check 7's cases (at least one).
    let cfg = cfg7();
    let cfg = RunConfig {
        cases: (cfg.cases / 2).max(1),
        ..cfg
    };
    check_7(
        &OnDevice::new("cuda-emu", tl_tape_cuda::CudaDevice::new),
        &cfg,
    );
}

#[test]
fn the_wrong_shapes_are_wrong_in_each_way() {
    let shapes = |dims: &[usize]| -> Vec<(&str, String)> {
        wrong_shapes(&Shape::new(dims))
            .into_iter()
            .map(|(how, s)| (how, s.to_string()))
            .collect()
    };
    assert_eq!(
        shapes(&[2, 3]),
        [
            ("one element more", "[2, 4]".to_owned()),
            ("transposed", "[3, 2]".to_owned()),
            ("one rank more", "[1, 2, 3]".to_owned()),
        ]
    );
    // A scalar has no transpose; nor has a square matrix.
    assert_eq!(
        shapes(&[]),
        [
            ("one element more", "[2]".to_owned()),
            ("one rank more", "[1]".to_owned()),
        ]
    );
    assert_eq!(shapes(&[3, 3]).len(), 2);
}
