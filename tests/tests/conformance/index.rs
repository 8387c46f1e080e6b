//! Hand-worked values for the index family, concat/slice, gelu/silu and cross-entropy: the
//! conventions finite differences cannot see (totalized out-of-range indices, accumulation of
//! repeated indices, the tanh form of GELU, the mean over all rows of cross-entropy), on the
//! reference rules and on the CPU tape; the bad inputs that must be errors; and the tape's
//! snapshot of the Nat environment.

use tl_ir::{GraphBuilder, Op, rules};
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::Tape;

fn v(d: &[f64]) -> Tensor<f64> {
    Tensor::vector(d.to_vec())
}

fn m(rows: usize, cols: usize, d: &[f64]) -> Tensor<f64> {
    Tensor::new([rows, cols], d.to_vec()).unwrap()
}

/// Value and operand gradients (dense) of `op` on `x` with seed `g`, on the CPU tape, after
/// checking them against the reference rules.
fn both(
    op: &Op,
    x: &[Tensor<f64>],
    nats: &[usize],
    g: &Tensor<f64>,
) -> (Tensor<f64>, Vec<Tensor<f64>>) {
    let args: Vec<&Tensor<f64>> = x.iter().collect();
    let want = rules::value(op, &args, nats).unwrap();
    let want_g = rules::vjp(op, &args, g, nats).unwrap();
    let mut t = Tape::new();
    t.set_nats(nats.to_vec());
    let ids: Vec<usize> = x.iter().map(|x| t.leaf(x.clone(), None, true)).collect();
    let out = t.apply(op, &ids).unwrap();
    let got = t.get(out).unwrap().clone();
    assert_eq!(got, want, "{op:?}: tape and rules disagree");
    let grads = t.backward_dense(out, g).unwrap();
    let dense: Vec<Tensor<f64>> = ids.iter().map(|&i| grads[i].clone()).collect();
    for (k, (d, w)) in dense.iter().zip(&want_g).enumerate() {
        let w = w
            .clone()
            .unwrap_or_else(|| Tensor::zeros(x[k].shape().clone()));
        assert_eq!(d, &w, "{op:?}: gradient of x{k}");
    }
    (got, dense)
}

#[test]
fn nat_vec_gathers_totalize_and_accumulate() {
    // nats[1..5] = [2, 5, 2, 0]: 5 is out of range, 2 repeats.
    let nats = [9, 2, 5, 2, 0];
    let op = Op::GatherScalarsNatVec { at: 1, k: 4 };
    let (y, d) = both(
        &op,
        &[v(&[10.0, 20.0, 30.0])],
        &nats,
        &v(&[1.0, 2.0, 3.0, 4.0]),
    );
    assert_eq!(y.data(), &[30.0, 0.0, 30.0, 10.0]);
    assert_eq!(d[0].data(), &[4.0, 0.0, 4.0]);

    let op = Op::GatherRowsNatVec { at: 1, k: 4 };
    let x = m(3, 2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let g = Tensor::from_fn([4, 2], |i| i as f64 + 1.0);
    let (y, d) = both(&op, &[x], &nats, &g);
    assert_eq!(y.shape(), &Shape::new(&[4, 2]));
    assert_eq!(y.data(), &[5.0, 6.0, 0.0, 0.0, 5.0, 6.0, 1.0, 2.0]);
    assert_eq!(d[0].data(), &[7.0, 8.0, 0.0, 0.0, 1.0 + 5.0, 2.0 + 6.0]);

    // Reads past the end of the environment give index 0.
    let (y, _) = both(
        &Op::GatherScalarNat { at: 7 },
        &[v(&[4.0, 5.0])],
        &nats,
        &Tensor::scalar(1.0),
    );
    assert_eq!(y.item().unwrap(), 4.0);
    let (y, d) = both(
        &Op::GatherRowNat { at: 2 },
        &[m(2, 2, &[1.0, 2.0, 3.0, 4.0])],
        &nats,
        &v(&[1.0, 1.0]),
    );
    assert_eq!(y.data(), &[0.0, 0.0], "index 5 of 2 rows is a zero row");
    assert_eq!(d[0].data(), &[0.0; 4], "and gets no gradient");
}

#[test]
fn static_and_raw_gathers() {
    let x = v(&[1.0, 2.0, 3.0]);
    let (y, d) = both(
        &Op::GatherScalar { index: 1 },
        std::slice::from_ref(&x),
        &[],
        &Tensor::scalar(2.0),
    );
    assert_eq!(
        (y.item().unwrap(), d[0].data()),
        (2.0, &[0.0, 2.0, 0.0][..])
    );
    let (y, d) = both(
        &Op::GatherScalarRaw { index: 3 },
        &[x],
        &[],
        &Tensor::scalar(2.0),
    );
    assert_eq!((y.item().unwrap(), d[0].data()), (0.0, &[0.0; 3][..]));
    let x = m(2, 2, &[1.0, 2.0, 3.0, 4.0]);
    let (y, _) = both(
        &Op::GatherRow { index: 1 },
        std::slice::from_ref(&x),
        &[],
        &v(&[1.0, 1.0]),
    );
    assert_eq!(y.data(), &[3.0, 4.0]);
    let (y, d) = both(&Op::GatherRowRaw { index: 9 }, &[x], &[], &v(&[1.0, 1.0]));
    assert_eq!((y.data(), d[0].data()), (&[0.0, 0.0][..], &[0.0; 4][..]));
}

#[test]
fn index_tensor_gather_totalizes_non_naturals_and_gives_idx_no_gradient() {
    let x = v(&[1.0, 2.0, 3.0]);
    let idx = v(&[2.0, -1.0, 0.5, f64::NAN, 3.0, 2.0, 0.0]);
    let g = v(&[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0]);
    let args = [&x, &idx];
    let y = rules::value(&Op::GatherIndexTensor, &args, &[]).unwrap();
    assert_eq!(y.data(), &[3.0, 0.0, 0.0, 0.0, 0.0, 3.0, 1.0]);
    let grads = rules::vjp(&Op::GatherIndexTensor, &args, &g, &[]).unwrap();
    assert_eq!(grads[0].as_ref().unwrap().data(), &[5.0, 0.0, 2.0]);
    assert!(grads[1].is_none(), "the index tensor never gets a gradient");
    let idx = v(&[1.0, 4.0, 1.0]);
    let (y, d) = both(
        &Op::GatherIndexTensor,
        &[m(2, 2, &[1.0, 2.0, 3.0, 4.0]), idx],
        &[],
        &Tensor::ones([3, 2]),
    );
    assert_eq!(y.data(), &[3.0, 4.0, 0.0, 0.0, 3.0, 4.0]);
    assert_eq!(d[0].data(), &[0.0, 0.0, 2.0, 2.0]);
    assert_eq!(d[1].data(), &[0.0; 3]);
}

#[test]
fn scatter_adds_by_hand() {
    let (y, d) = both(
        &Op::ScatterAddVec { index: 1 },
        &[v(&[1.0, 2.0, 3.0]), Tensor::scalar(10.0)],
        &[],
        &v(&[1.0, 2.0, 3.0]),
    );
    assert_eq!(y.data(), &[1.0, 12.0, 3.0]);
    assert_eq!(
        (d[0].data(), d[1].item().unwrap()),
        (&[1.0, 2.0, 3.0][..], 2.0)
    );
    let x = m(2, 2, &[1.0, 2.0, 3.0, 4.0]);
    let g = m(2, 2, &[1.0, 2.0, 3.0, 4.0]);
    let (y, d) = both(
        &Op::ScatterAddRow { index: 0 },
        &[x, v(&[10.0, 20.0])],
        &[],
        &g,
    );
    assert_eq!(y.data(), &[11.0, 22.0, 3.0, 4.0]);
    assert_eq!((d[0].data(), d[1].data()), (g.data(), &[1.0, 2.0][..]));
}

#[test]
fn concat_then_slice_round_trips_on_the_tape() {
    let a = m(2, 2, &[1.0, 2.0, 3.0, 4.0]);
    let b = m(1, 2, &[5.0, 6.0]);
    let mut t = Tape::new();
    let (ia, ib) = (t.leaf(a.clone(), None, true), t.leaf(b.clone(), None, true));
    let c = t.apply(&Op::Concat, &[ia, ib]).unwrap();
    assert_eq!(t.get(c).unwrap().data(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let sa = t.apply(&Op::Slice { start: 0, len: 2 }, &[c]).unwrap();
    let sb = t.apply(&Op::Slice { start: 2, len: 1 }, &[c]).unwrap();
    assert_eq!((t.get(sa).unwrap(), t.get(sb).unwrap()), (&a, &b));
    // d/d(a, b) of slice(concat(a, b), 1, 2) with seed [[1, 2], [3, 4]]: row 1 of a, row 0 of b.
    let mid = t.apply(&Op::Slice { start: 1, len: 2 }, &[c]).unwrap();
    let g = t
        .backward_dense(mid, &m(2, 2, &[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    assert_eq!(g[ia].data(), &[0.0, 0.0, 1.0, 2.0]);
    assert_eq!(g[ib].data(), &[3.0, 4.0]);
    // The seeds' 1-D names map to the same ops.
    assert_eq!(Op::concat1d(), Op::Concat);
    assert_eq!(Op::slice1d(1, 2), Op::Slice { start: 1, len: 2 });
    let y = rules::value(&Op::slice1d(1, 2), &[&v(&[1.0, 2.0, 3.0, 4.0])], &[]).unwrap();
    assert_eq!(y.data(), &[2.0, 3.0]);
}

#[test]
fn gelu_and_silu_at_known_points() {
    let x = v(&[1.0, 0.0, -40.0, 40.0, -800.0]);
    let (y, d) = both(&Op::Gelu, std::slice::from_ref(&x), &[], &Tensor::ones([5]));
    assert!(
        (y.data()[0] - 0.841_191_990_608_276_8).abs() < 1e-15,
        "{}",
        y.data()[0]
    );
    assert_eq!(&y.data()[1..], &[0.0, 0.0, 40.0, 0.0]);
    assert_eq!(&d[0].data()[1..], &[0.5, 0.0, 1.0, 0.0]);
    let (y, d) = both(&Op::Silu, &[x], &[], &Tensor::ones([5]));
    let s1 = 1.0 / (1.0 + (-1.0f64).exp());
    assert!((y.data()[0] - s1).abs() < 1e-15);
    assert!((d[0].data()[0] - s1 * (1.0 + (1.0 - s1))).abs() < 1e-15);
    assert_eq!(d[0].data()[1], 0.5);
    assert!(y.data().iter().chain(d[0].data()).all(|v| v.is_finite()));
    assert_eq!(y.data()[3], 40.0);
}

#[test]
fn cross_entropy_two_by_three_by_hand() {
    let x = m(2, 3, &[1.0, 2.0, 3.0, 1.0, 0.0, 0.0]);
    let e = |v: f64| v.exp();
    let (s0, s1) = (1.0 + e(-1.0) + e(-2.0), 1.0 + 2.0 * e(-1.0));
    // labels [2, 0] at nats[1..3]
    let (y, d) = both(
        &Op::CrossEntropy { labels_at: 1 },
        std::slice::from_ref(&x),
        &[7, 2, 0],
        &Tensor::scalar(1.0),
    );
    assert!((y.item().unwrap() - 0.479_525_339_188_215_7).abs() < 1e-15);
    assert!((y.item().unwrap() - (s0.ln() + s1.ln()) / 2.0).abs() < 1e-15);
    let want = [
        e(-2.0) / s0 / 2.0,
        e(-1.0) / s0 / 2.0,
        (1.0 / s0 - 1.0) / 2.0,
        (1.0 / s1 - 1.0) / 2.0,
        e(-1.0) / s1 / 2.0,
        e(-1.0) / s1 / 2.0,
    ];
    for (a, b) in d[0].data().iter().zip(want) {
        assert!((a - b).abs() < 1e-15, "{:?}", d[0].data());
    }
    // A label ≥ classes: that row contributes 0 but is still counted in the mean; no gradient.
    let (y, d) = both(
        &Op::CrossEntropy { labels_at: 0 },
        &[x],
        &[2, 3],
        &Tensor::scalar(1.0),
    );
    assert!((y.item().unwrap() - s0.ln() / 2.0).abs() < 1e-15);
    assert_eq!(&d[0].data()[3..], &[0.0; 3]);
    // One row of logits (1-D).
    let (y, _) = both(
        &Op::CrossEntropy { labels_at: 0 },
        &[v(&[1.0, 2.0, 3.0])],
        &[2],
        &Tensor::scalar(1.0),
    );
    assert!((y.item().unwrap() - s0.ln()).abs() < 1e-15);
}

#[test]
fn bad_inputs_are_errors_naming_the_op() {
    let cases: Vec<(Op, Vec<Shape>, &str)> = vec![
        (
            Op::Slice { start: 2, len: 2 },
            vec![Shape::new(&[3])],
            "sliceRange0",
        ),
        (
            Op::Slice { start: 0, len: 1 },
            vec![Shape::scalar()],
            "sliceRange0",
        ),
        (
            Op::Concat,
            vec![Shape::new(&[2, 3]), Shape::new(&[2, 4])],
            "concat0",
        ),
        (
            Op::Concat,
            vec![Shape::scalar(), Shape::new(&[2])],
            "concat0",
        ),
        (
            Op::GatherScalar { index: 3 },
            vec![Shape::new(&[3])],
            "gatherScalar",
        ),
        (
            Op::GatherRow { index: 2 },
            vec![Shape::new(&[2, 3])],
            "gatherRow",
        ),
        (
            Op::GatherRow { index: 0 },
            vec![Shape::new(&[3])],
            "gatherRow",
        ),
        (
            Op::GatherScalarNat { at: 0 },
            vec![Shape::new(&[2, 2])],
            "gatherScalarNat",
        ),
        (
            Op::GatherRowsNatVec { at: 0, k: 2 },
            vec![Shape::new(&[2, 2, 2])],
            "gatherRowsNatVec",
        ),
        (
            Op::GatherIndexTensor,
            vec![Shape::new(&[3]), Shape::new(&[2, 2])],
            "gather",
        ),
        (
            Op::GatherIndexTensor,
            vec![Shape::new(&[2, 2, 2]), Shape::new(&[2])],
            "gather",
        ),
        (
            Op::ScatterAddVec { index: 3 },
            vec![Shape::new(&[3]), Shape::scalar()],
            "scatterAddVec",
        ),
        (
            Op::ScatterAddVec { index: 0 },
            vec![Shape::new(&[3]), Shape::new(&[1])],
            "scatterAddVec",
        ),
        (
            Op::ScatterAddRow { index: 0 },
            vec![Shape::new(&[2, 3]), Shape::new(&[2])],
            "scatterAddRow",
        ),
        (
            Op::CrossEntropy { labels_at: 0 },
            vec![Shape::new(&[2, 0])],
            "crossEntropy",
        ),
    ];
    for (op, shapes, name) in cases {
        let refs: Vec<&Shape> = shapes.iter().collect();
        let e = op.infer_shape(&refs).unwrap_err().to_string();
        assert!(e.contains(name), "{op:?}: {e}");
        // The same error at record time, on the IR and on the tape.
        let mut b = GraphBuilder::new();
        let ids: Vec<usize> = shapes
            .iter()
            .map(|s| b.leaf(s.clone(), None).unwrap())
            .collect();
        assert!(b.apply(op.clone(), &ids).is_err(), "{op:?}");
        let mut t = Tape::<f64>::new();
        let ids: Vec<usize> = shapes
            .iter()
            .map(|s| t.leaf(Tensor::zeros(s.clone()), None, true))
            .collect();
        let e = t.apply(&op, &ids).unwrap_err().to_string();
        assert!(e.contains(name), "{op:?}: {e}");
    }
}

#[test]
fn tape_backward_uses_the_nats_its_gather_was_recorded_with() {
    let mut t = Tape::new();
    t.set_nats(vec![2, 0, 2]);
    let x = t.leaf(v(&[1.0, 2.0, 3.0]), None, true);
    let y = t
        .apply(&Op::GatherScalarsNatVec { at: 0, k: 3 }, &[x])
        .unwrap();
    let l = t.apply(&Op::CrossEntropy { labels_at: 1 }, &[x]).unwrap();
    let g0 = t.backward_dense(y, &v(&[1.0, 2.0, 3.0])).unwrap()[x].clone();
    let c0 = t.backward_dense(l, &Tensor::scalar(1.0)).unwrap()[x].clone();
    assert_eq!(g0.data(), &[2.0, 0.0, 4.0]);
    // Rewrite the environment in place and replace it: the recorded nodes keep their snapshot.
    t.write_nats(0, &[1, 1, 1]).unwrap();
    assert_eq!(t.backward_dense(y, &v(&[1.0, 2.0, 3.0])).unwrap()[x], g0);
    t.set_nats(vec![0, 2]);
    assert_eq!(t.backward_dense(y, &v(&[1.0, 2.0, 3.0])).unwrap()[x], g0);
    assert_eq!(t.backward_dense(l, &Tensor::scalar(1.0)).unwrap()[x], c0);
    // A gather recorded now reads the new environment.
    let y2 = t
        .apply(&Op::GatherScalarsNatVec { at: 0, k: 3 }, &[x])
        .unwrap();
    assert_eq!(t.get(y2).unwrap().data(), &[1.0, 3.0, 1.0]);
}
