//! Tape semantics: fan-out accumulation, dropped contributions, detach, dense and sparse APIs,
//! user ops, and agreement of the whole tape with the IR's pure backprop.

use std::collections::HashSet;

use crate::common::{Dom, Rng, assert_close, random};
use tl_ir::{GraphBuilder, Op, UserOp};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::{Error, Tape};

fn v(d: &[f64]) -> Tensor<f64> {
    Tensor::vector(d.to_vec())
}

fn ones(t: &Tape<f64>, id: usize) -> Tensor<f64> {
    Tensor::ones(t.get(id).unwrap().shape().clone())
}

#[test]
fn fan_out_accumulates_every_use() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[1.0, -2.0, 3.0]), Some("x"), true);
    let sq = t.apply(&Op::Mul, &[x, x]).unwrap(); // x·x: both operands are x
    let out = t.apply(&Op::Add, &[sq, x]).unwrap(); // x² + x
    let g = t.backward_dense(out, &ones(&t, out)).unwrap();
    assert_eq!(g[x].data(), &[3.0, -3.0, 7.0]); // 2x + 1
    assert_eq!(g[sq].data(), &[1.0, 1.0, 1.0]);
    // add(x, x): both contributions share the seed's storage; accumulating must copy, not write
    // through into the caller's seed.
    let twice = t.apply(&Op::Add, &[x, x]).unwrap();
    let seed = v(&[1.0, 2.0, 3.0]);
    let g = t.backward_dense(twice, &seed).unwrap();
    assert_eq!(g[x].data(), &[2.0, 4.0, 6.0]);
    assert_eq!(seed.data(), &[1.0, 2.0, 3.0]);
}

#[test]
fn contributions_to_a_parent_without_grad_are_dropped() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[1.0, 2.0]), None, true);
    let c = t.leaf(v(&[5.0, 7.0]), Some("const"), false);
    let cc = t.apply(&Op::Exp, &[c]).unwrap(); // no parent requires grad
    let y = t.apply(&Op::Mul, &[x, c]).unwrap();
    let out = t.apply(&Op::Add, &[y, cc]).unwrap();
    assert!(!t.node(cc).unwrap().requires_grad());
    assert!(t.node(y).unwrap().requires_grad());
    let g = t.backward_dense(out, &ones(&t, out)).unwrap();
    assert_eq!(g[x].data(), &[5.0, 7.0]);
    assert_eq!(g[c].data(), &[0.0, 0.0]);
    assert_eq!(g[cc].data(), &[0.0, 0.0]);
}

#[test]
fn detach_stops_the_gradient() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[1.5, -0.5]), None, true);
    let d = t.apply(&Op::Detach, &[x]).unwrap();
    let y = t.apply(&Op::Mul, &[d, x]).unwrap(); // gradient only through the second operand
    let g = t.backward_dense(y, &ones(&t, y)).unwrap();
    assert_eq!(g[x].data(), &[1.5, -0.5]); // d, not 2x
    assert!(!t.node(d).unwrap().requires_grad());
}

#[test]
fn backward_dense_gives_zeros_to_untouched_nodes() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[0.0, 1.0]), None, true);
    let w = t.leaf(Tensor::from_fn([2, 3], |i| i as f64), None, true);
    let a = t.apply(&Op::Exp, &[x]).unwrap();
    let b = t.apply(&Op::Transpose2d, &[w]).unwrap(); // not upstream of `a`
    let g = t.backward_dense(a, &v(&[2.0, 3.0])).unwrap();
    assert_eq!(g.len(), t.len());
    assert_eq!(g[x].data(), &[2.0, 3.0 * 1f64.exp()]);
    assert_eq!(g[w], Tensor::zeros([2, 3]));
    assert_eq!(g[b], Tensor::zeros([3, 2]));
}

#[test]
fn backward_dense_from_two_seeded_outputs() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[1.0, 2.0]), None, true);
    let a = t.apply(&Op::Scale(2.0), &[x]).unwrap();
    let b = t.apply(&Op::Scale(3.0), &[x]).unwrap();
    let mut g0: Vec<Tensor<f64>> = (0..t.len())
        .map(|i| Tensor::zeros(t.get(i).unwrap().shape().clone()))
        .collect();
    g0[a] = v(&[1.0, 1.0]);
    g0[b] = v(&[1.0, 10.0]);
    let g = t.backward_dense_from(g0).unwrap();
    assert_eq!(g[x].data(), &[5.0, 32.0]); // 2·1 + 3·1, 2·1 + 3·10
}

#[test]
fn backward_first_n_visits_only_the_first_n_nodes() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[1.0]), None, true);
    let a = t.apply(&Op::Scale(2.0), &[x]).unwrap();
    let b = t.apply(&Op::Scale(3.0), &[a]).unwrap();
    let seeds = || vec![v(&[0.0]), v(&[1.0]), v(&[1.0])];
    let g = t.backward_first_n(2, seeds()).unwrap(); // b (id 2) is not visited
    assert_eq!(
        (g[x].data()[0], g[a].data()[0], g[b].data()[0]),
        (2.0, 1.0, 1.0)
    );
    let g = t.backward_first_n(3, seeds()).unwrap();
    assert_eq!((g[x].data()[0], g[a].data()[0]), (8.0, 4.0));
    assert!(matches!(
        t.backward_first_n(4, seeds()),
        Err(Error::Count { .. })
    ));
}

#[test]
fn backward_params_returns_exactly_the_wanted_leaves() {
    let mut t = Tape::new();
    let w = t.leaf(Tensor::from_fn([2, 3], |i| i as f64 * 0.1), Some("w"), true);
    let b = t.leaf(v(&[0.5, -0.5]), Some("b"), true);
    let x = t.leaf(v(&[1.0, 2.0, 3.0]), Some("x"), true);
    let unused = t.leaf(v(&[9.0]), Some("unused"), true);
    let y = t.apply(&Op::Linear, &[w, b, x]).unwrap();
    let loss = t.apply(&Op::Sum, &[y]).unwrap();
    let seed = Tensor::scalar(1.0);
    let sparse = t.backward_params(loss, &seed, &[w, b, unused, b]).unwrap();
    let keys: HashSet<usize> = sparse.keys().copied().collect();
    assert_eq!(keys, HashSet::from([w, b, unused]));
    let dense = t.backward_dense(loss, &seed).unwrap();
    assert_eq!(sparse[&w], dense[w]);
    assert_eq!(sparse[&b].data(), &[1.0, 1.0]); // listed twice: still the gradient
    assert_eq!(sparse[&w].data(), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    assert_eq!(sparse[&unused].data(), &[0.0]);
    let e = t
        .backward_params(loss, &seed, &[w, 99])
        .unwrap_err()
        .to_string();
    assert!(e.contains("backward_params") && e.contains("99"), "{e}");
}

/// `x²` with a correct VJP, or (`bad`) a VJP that returns a cotangent of the wrong shape.
struct Square {
    bad: bool,
}

impl UserOp for Square {
    fn name(&self) -> &'static str {
        if self.bad { "badGrad" } else { "square" }
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, s: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(s[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(x[0].map(|v| v * v))
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        if self.bad {
            return Ok(vec![Some(Tensor::zeros([3]))]);
        }
        Ok(vec![Some(
            x[0].zip_map("square", g, |x, g| T::lit(2.0) * x * g)?,
        )])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map("square", dx[0], |x, d| T::lit(2.0) * x * d)
    }
}

#[test]
fn user_op_gradient_and_shape_checks() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[3.0, -1.0]), None, true);
    let s = t.apply(&Op::user(Square { bad: false }), &[x]).unwrap();
    let g = t.backward_dense(s, &v(&[1.0, 1.0])).unwrap();
    assert_eq!(g[x].data(), &[6.0, -2.0]);

    let y = t.apply(&Op::user(Square { bad: true }), &[x]).unwrap();
    let e = t
        .backward_dense(y, &v(&[1.0, 1.0]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("badGrad") && e.contains("[2]") && e.contains("[3]"),
        "{e}"
    );
    // The tape stays usable after the error.
    let g = t.backward_dense(s, &v(&[1.0, 1.0])).unwrap();
    assert_eq!(g[x].data(), &[6.0, -2.0]);
}

/// The core claim on a small program: the tape's dense backward equals the IR's pure
/// `backprop_all` (reference rules) for every id, with fan-out and a non-grad leaf.
#[test]
fn replayed_graph_matches_ir_backprop() {
    let mut gb = GraphBuilder::new();
    let w1 = gb.leaf([5, 4], Some("w1")).unwrap();
    let b1 = gb.leaf([5], Some("b1")).unwrap();
    let w2 = gb.leaf([3, 5], Some("w2")).unwrap();
    let b2 = gb.leaf([3], Some("b2")).unwrap();
    let x = gb.leaf_with([6, 4], Some("x"), false).unwrap();
    let target = gb.leaf_with([6, 3], Some("target"), false).unwrap();
    let h = gb.apply(Op::Linear, &[w1, b1, x]).unwrap();
    let h = gb.apply(Op::Tanh, &[h]).unwrap();
    let hh = gb.apply(Op::Mul, &[h, h]).unwrap(); // fan-out
    let h = gb.apply(Op::Add, &[h, hh]).unwrap();
    let y = gb.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let p = gb.apply(Op::LogSoftmax, &[y]).unwrap();
    let m = gb.apply(Op::ReduceMean(0), &[p]).unwrap();
    let m = gb
        .apply(Op::BroadcastTo(Shape::new(&[6, 3])), &[m])
        .unwrap();
    let q = gb.apply(Op::Sub, &[p, m]).unwrap();
    let loss = gb.apply(Op::MseLoss, &[q, target]).unwrap();
    let graph = gb.finish();

    let mut rng = Rng(42);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| random(&mut rng, &l.shape, Dom::Any))
        .collect();
    let mut tape = Tape::new();
    let ids = graph.replay(&mut tape, &leaves, &[]).unwrap();
    let seed = Tensor::scalar(1.0);
    let got = tape.backward_dense(ids[loss], &seed).unwrap();
    let want = graph.backprop_all(&leaves, &[], loss, &seed).unwrap();
    for (id, w) in want.iter().enumerate() {
        assert_close(&format!("id {id}"), &got[ids[id]], w);
    }
    // And the values agree too.
    let values = graph.eval(&leaves, &[]).unwrap();
    for (id, w) in values.iter().enumerate() {
        assert_close(&format!("value {id}"), tape.get(ids[id]).unwrap(), w);
    }
}

#[test]
fn nat_environment_is_copy_on_write_and_checked() {
    let mut tape = Tape::<f64>::new();
    let p = tape.push_nats(&[4, 5]);
    assert_eq!(p, 0);
    assert_eq!(tape.push_nats(&[6]), 2);
    tape.write_nats(1, &[9, 7]).unwrap();
    assert_eq!(tape.nats(), &[4, 9, 7]);
    let e = tape.write_nats(2, &[1, 1]).unwrap_err().to_string();
    assert!(e.contains("write_nats") && e.contains("2..4"), "{e}");
    // A position near usize::MAX: the end overflows, and is refused, not wrapped.
    let e = tape
        .write_nats(usize::MAX, &[1, 2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("write_nats") && e.contains("past usize::MAX"),
        "{e}"
    );
    assert_eq!(tape.nats(), &[4, 9, 7]);
    tape.clear();
    assert!(tape.nats().is_empty());
}

#[test]
fn release_gives_back_only_what_no_backward_reads() {
    let mut t = Tape::new();
    let x = t.leaf(v(&[0.5, -1.0]), Some("x"), true);
    let c = t.leaf(v(&[2.0, 3.0]), None, false);
    let e = t.apply(&Op::Exp, &[c]).unwrap(); // no grad; read by `m`'s backward
    let d = t.apply(&Op::Tanh, &[c]).unwrap(); // no grad; read by `f` only, which has none
    let f = t.apply(&Op::Scale(2.0), &[d]).unwrap();
    let m = t.apply(&Op::Mul, &[x, e]).unwrap();
    assert!(!t.release(x).unwrap(), "a leaf keeps its value");
    assert!(!t.release(c).unwrap(), "a leaf without grad too");
    assert!(!t.release(m).unwrap(), "a node that requires grad keeps it");
    assert!(!t.release(e).unwrap(), "so does an operand of one");
    assert!(t.release(d).unwrap());
    assert!(!t.release(d).unwrap(), "released once");
    assert!(t.node(d).unwrap().is_released() && t.node(d).unwrap().value().is_none());
    assert_eq!(t.node(d).unwrap().shape(), &Shape::new(&[2]));
    assert_eq!(t.pool_stats().held, 1, "its buffer went to the pool");
    // Reading it, or applying an op to it, names the node and its op.
    let err = t.get(d).unwrap_err();
    assert!(matches!(&err, Error::ReleasedValue { id, op, .. } if *id == d && op == "tanh"));
    assert!(err.to_string().contains("released"), "{err}");
    assert!(matches!(
        t.apply(&Op::Exp, &[d]),
        Err(Error::ReleasedValue { .. })
    ));
    // The backward runs as before: the gradient of m, zeros (of d's shape) where none flows.
    let g = t.backward_dense(m, &ones(&t, m)).unwrap();
    assert_eq!(g[x].data(), &[2.0f64.exp(), 3.0f64.exp()]);
    assert_eq!(g[d].data(), &[0.0, 0.0]);
    assert_eq!(
        t.get(f).unwrap().data(),
        &[2.0 * 2.0f64.tanh(), 2.0 * 3.0f64.tanh()]
    );
    assert!(t.release(f).unwrap());
    t.clear();
    assert!(t.is_empty());
}
