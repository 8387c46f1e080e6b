//! Normalization conventions with hand-worked values, on the IR and on the CPU tape (f64 and
//! f32): layerNorm of one row (biased variance, ε inside the square root), batchnorm statistics
//! spanning N·H·W, batchMoments (the same statistics, (2, C), and its VJP), and clear errors
//! for bad ε and empty statistics axes.

use tl_conformance::{Backend, CpuTape};
use tl_ir::{GraphBuilder, Op};
use tl_spec::{Scalar, Shape, Tensor};

/// Value and leaf gradients of `op(leaves…)` with cotangent `g` from the IR, the f64 tape and the
/// f32 tape (as f64).
fn all_three(op: &Op, leaves: &[Tensor<f64>], g: &Tensor<f64>) -> Vec<Vec<Tensor<f64>>> {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).unwrap())
        .collect();
    let out = b.apply(op.clone(), &ids).unwrap();
    let graph = b.finish();
    let n = leaves.len();
    let mut ir = vec![graph.eval(leaves, &[]).unwrap()[out].clone()];
    ir.extend_from_slice(&graph.backprop_all(leaves, &[], out, g).unwrap()[..n]);
    fn tape<T: Scalar>(
        graph: &tl_ir::GraphData,
        out: usize,
        leaves: &[Tensor<f64>],
        g: &Tensor<f64>,
    ) -> Vec<Tensor<f64>> {
        let t = CpuTape::<T>::new();
        let lt: Vec<Tensor<T>> = leaves.iter().map(Tensor::cast).collect();
        let p = t.record(graph, &lt, &[]).unwrap();
        let mut r = vec![t.values(&p).unwrap()[out].cast()];
        let gr = t.backward_dense(&p, out, &g.cast()).unwrap();
        r.extend(gr[..leaves.len()].iter().map(Tensor::cast));
        r
    }
    vec![
        ir,
        tape::<f64>(&graph, out, leaves, g),
        tape::<f32>(&graph, out, leaves, g),
    ]
}

fn close(what: &str, got: &Tensor<f64>, want: &[f64], tol: f64) {
    assert_eq!(got.numel(), want.len(), "{what}");
    for (k, (a, w)) in got.data().iter().zip(want).enumerate() {
        assert!(
            (a - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{k}]: {a} vs {w}"
        );
    }
}

#[test]
fn layer_norm_of_a_hand_worked_row() {
    // Row [1, 2, 3, 6]: μ = 3, var = (4 + 1 + 0 + 9)/4 = 3.5 (biased), r = 1/sqrt(3.5 + ε).
    let eps = 1e-6;
    let r = 1.0 / (3.5f64 + eps).sqrt();
    let x = Tensor::new([1, 4], vec![1.0, 2.0, 3.0, 6.0]).unwrap();
    let gamma = Tensor::vector(vec![1.0, 2.0, 1.0, 0.5]);
    let beta = Tensor::vector(vec![0.0, 0.0, 1.0, -1.0]);
    // Cotangent 1 on the third output only: dβ = e₂, dγ = x̂ e₂ = 0 (x̂₂ = 0) and, with
    // ĝ = g·γ = e₂, dx = r/4 (4 e₂ − 1 − x̂·0) = r/4 · [−1, −1, 3, −1].
    let g = Tensor::new([1, 4], vec![0.0, 0.0, 1.0, 0.0]).unwrap();
    let want_y = [-2.0 * r, -2.0 * r, 1.0, 1.5 * r - 1.0];
    let want_dx = [-r / 4.0, -r / 4.0, 3.0 * r / 4.0, -r / 4.0];
    for (k, res) in all_three(&Op::layer_norm(), &[x, gamma, beta], &g)
        .iter()
        .enumerate()
    {
        let tol = if k == 2 { 1e-6 } else { 1e-12 };
        close("y", &res[0], &want_y, tol);
        close("dx", &res[1], &want_dx, tol);
        close("dgamma", &res[2], &[0.0, 0.0, 0.0, 0.0], tol);
        close("dbeta", &res[3], &[0.0, 0.0, 1.0, 0.0], tol);
    }
    assert_eq!(Op::layer_norm(), Op::LayerNorm { eps: 1e-6 });
}

#[test]
fn batchnorm_statistics_span_n_h_w() {
    // N = 2, C = 2, H = 1, W = 2. Channel 0: [0, 2] and [4, 6] → μ = 3, var = 5.
    // Channel 1: [1, 1] and [1, 5] → μ = 2, var = (1 + 1 + 1 + 9)/4 = 3.
    let x = Tensor::new([2, 2, 1, 2], vec![0.0, 2.0, 1.0, 1.0, 4.0, 6.0, 1.0, 5.0]).unwrap();
    let gamma = Tensor::vector(vec![2.0, 1.0]);
    let beta = Tensor::vector(vec![0.0, 10.0]);
    let g = Tensor::ones([2, 2, 1, 2]);
    let (r0, r1) = (1.0 / (5.0f64 + 1e-6).sqrt(), 1.0 / (3.0f64 + 1e-6).sqrt());
    let want = [
        -6.0 * r0,
        -2.0 * r0,
        10.0 - r1,
        10.0 - r1,
        2.0 * r0,
        6.0 * r0,
        10.0 - r1,
        10.0 + 3.0 * r1,
    ];
    for (k, res) in all_three(
        &Op::batch_norm(),
        &[x.clone(), gamma.clone(), beta.clone()],
        &g,
    )
    .iter()
    .enumerate()
    {
        let tol = if k == 2 { 1e-6 } else { 1e-12 };
        close("y", &res[0], &want, tol);
        // A constant cotangent: dx = 0 (normalization removes shifts), dβ = N·H·W = 4 per
        // channel, dγ = Σ x̂ = 0.
        close("dx", &res[1], &[0.0; 8], tol);
        close("dgamma", &res[2], &[0.0, 0.0], tol);
        close("dbeta", &res[3], &[4.0, 4.0], tol);
    }
    // N = 1 equals the unbatched (C, H, W) op.
    let one = Tensor::new([1, 2, 1, 2], x.data()[..4].to_vec()).unwrap();
    let unb = Tensor::new([2, 1, 2], x.data()[..4].to_vec()).unwrap();
    let gs = Tensor::new([1, 2, 1, 2], vec![0.5, -1.0, 2.0, 0.25]).unwrap();
    let gu = Tensor::new([2, 1, 2], gs.data().to_vec()).unwrap();
    let a = all_three(&Op::batch_norm(), &[one, gamma.clone(), beta.clone()], &gs);
    let b = all_three(&Op::batch_norm(), &[unb, gamma, beta], &gu);
    for (ra, rb) in a.iter().zip(&b) {
        for (ta, tb) in ra.iter().zip(rb) {
            assert_eq!(ta.data(), tb.data());
        }
    }
}

#[test]
fn batch_moments_are_batchnorms_statistics() {
    // The x of `batchnorm_statistics_span_n_h_w`: channel 0 μ = 3, var = 5; channel 1 μ = 2,
    // var = 3 (biased, over N·H·W = 4).
    let x = Tensor::new([2, 2, 1, 2], vec![0.0, 2.0, 1.0, 1.0, 4.0, 6.0, 1.0, 5.0]).unwrap();
    // Cotangent (gμ, gv) = ((1, 0), (0, 1)): channel 0 gets 1/4, channel 1 2·(x − 2)/4.
    let g = Tensor::new([2, 2], vec![1.0, 0.0, 0.0, 1.0]).unwrap();
    let want_dx = [0.25, 0.25, -0.5, -0.5, 0.25, 0.25, -0.5, 1.5];
    for (k, res) in all_three(&Op::BatchMoments, std::slice::from_ref(&x), &g)
        .iter()
        .enumerate()
    {
        let tol = if k == 2 { 1e-6 } else { 1e-12 };
        assert_eq!(res[0].shape().dims(), [2, 2]);
        close("moments", &res[0], &[3.0, 2.0, 5.0, 3.0], tol);
        close("dx", &res[1], &want_dx, tol);
    }
    // Unbatched (C, H, W): the first sample alone. Channel 0: [0, 2] (μ 1, var 1); channel 1:
    // [1, 1] (μ 1, var 0).
    let unb = Tensor::new([2, 1, 2], x.data()[..4].to_vec()).unwrap();
    for res in all_three(&Op::BatchMoments, &[unb], &g) {
        close("moments", &res[0], &[1.0, 1.0, 1.0, 0.0], 1e-6);
    }
    let s = |d: &[usize]| Shape::new(d);
    for bad in [&[2, 3][..], &[2, 0, 3], &[0, 2, 1, 1], &[1, 2, 3, 4, 5]] {
        let e = Op::BatchMoments
            .infer_shape(&[&s(bad)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("batchMoments") && e.contains(&s(bad).to_string()),
            "{e}"
        );
    }
    let e = Op::BatchMoments
        .infer_shape(&[&s(&[2, 2, 1, 2]), &s(&[2])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("batchMoments"), "{e}");
}

#[test]
fn bad_norm_input_is_a_clear_error() {
    let s = |d: &[usize]| Shape::new(d);
    let err = |op: Op, x: &[usize], a: &[usize]| {
        op.infer_shape(&[&s(x), &s(a), &s(a)])
            .unwrap_err()
            .to_string()
    };
    for eps in [0.0, -1e-6, f64::NAN, f64::INFINITY] {
        let e = err(Op::LayerNorm { eps }, &[2, 3], &[3]);
        assert!(e.contains("layerNorm") && e.contains("eps"), "{e}");
        let e = err(Op::BatchNorm { eps }, &[2, 3, 3], &[2]);
        assert!(
            e.contains("batchnormChannelFirst") && e.contains("eps"),
            "{e}"
        );
    }
    let e = err(Op::layer_norm(), &[2, 0], &[0]);
    assert!(e.contains("non-empty"), "{e}");
    let e = err(Op::layer_norm(), &[2, 3], &[2]);
    assert!(e.contains("[2, 3]") && e.contains("(3)"), "{e}");
    let e = err(Op::layer_norm(), &[], &[1]);
    assert!(e.contains("rank"), "{e}");
    let e = err(Op::batch_norm(), &[2, 0, 3], &[2]);
    assert!(e.contains("N·H·W"), "{e}");
    let e = err(Op::batch_norm(), &[0, 2, 3, 3], &[2]);
    assert!(e.contains("N·H·W"), "{e}");
    let e = err(Op::batch_norm(), &[2, 3], &[2]);
    assert!(e.contains("(C, H, W)"), "{e}");
    let e = err(Op::batch_norm(), &[2, 3, 3], &[3]);
    assert!(e.contains("2 channels"), "{e}");
}
