//! Multi-head attention three ways — the fused (streaming) op, the unfused op and the
//! composition of primitive ops (`tl_ir::compose`) — agree in value and in every leaf gradient,
//! on the IR (eval / backprop_all) and on the CPU tape, with and without a mask, including a
//! mask row with nothing allowed; and in f32 on every backend (CPU f32, the CUDA tape on the
//! sim, and under `cuda-emu` on the emulated kernels: the fused form there is the flash
//! kernels), at lengths that are not multiples of the kernels' tile, the fused form bit-identical
//! across runs. Plus the hard-mask conventions and the errors for bad input.

use tl_conformance::metric::tensor_err;
use tl_conformance::{Backend, CpuTape, CudaSim};
use tl_ir::{GraphBuilder, GraphData, Id, Op, compose};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};

/// Deterministic, irregular values in about [-1.5, 1.5].
fn vals(shape: &[usize], salt: usize) -> Tensor<f64> {
    Tensor::from_fn(Shape::new(shape), |i| {
        ((i * 7 + salt * 13) as f64 * 0.731).sin() * 1.5
    })
}

/// Operands `[wq, wk, wv, wo, x]` for x of `xs` = (…, n, dModel) and projection width `p`.
fn operands(xs: &[usize], p: usize) -> Vec<Tensor<f64>> {
    let dm = *xs.last().unwrap();
    vec![
        vals(&[dm, p], 1),
        vals(&[dm, p], 2),
        vals(&[dm, p], 3),
        vals(&[p, dm], 4),
        vals(xs, 5),
    ]
}

/// The graph of one attention application: the op itself, or the composition when `op` is None.
fn graph(
    leaves: &[Tensor<f64>],
    heads: usize,
    mask: Option<&Mask>,
    op: Option<bool>,
) -> (GraphData, Id) {
    let mut b = GraphBuilder::new();
    let ids: Vec<Id> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).unwrap())
        .collect();
    let out = match op {
        Some(fused) => {
            let op = Op::MultiHeadAttention {
                heads,
                mask: mask.cloned(),
                fused,
            };
            b.apply(op, &ids).unwrap()
        }
        None => compose::multi_head_attention(
            &mut b, ids[0], ids[1], ids[2], ids[3], ids[4], heads, mask,
        )
        .unwrap(),
    };
    (b.finish(), out)
}

/// Value and the five leaf gradients, from the IR and from the CPU tape (f64).
fn run(
    g: &GraphData,
    out: Id,
    leaves: &[Tensor<f64>],
    seed: &Tensor<f64>,
) -> [Vec<Tensor<f64>>; 2] {
    let n = leaves.len();
    let mut ir = vec![g.eval(leaves, &[]).unwrap()[out].clone()];
    ir.extend_from_slice(&g.backprop_all(leaves, &[], out, seed).unwrap()[..n]);
    let tape = CpuTape::<f64>::new();
    let p = tape.record(g, leaves, &[]).unwrap();
    let mut tp = vec![tape.values(&p).unwrap()[out].clone()];
    tp.extend_from_slice(&tape.backward_dense(&p, out, seed).unwrap()[..n]);
    [ir, tp]
}

fn assert_close(what: &str, a: &Tensor<f64>, b: &Tensor<f64>) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (k, (x, y)) in a.data().iter().zip(b.data()).enumerate() {
        assert!(
            (x - y).abs() <= 1e-10 * y.abs().max(1.0),
            "{what}[{k}]: {x} vs {y}"
        );
    }
}

#[test]
fn fused_unfused_and_composed_agree_in_value_and_every_gradient() {
    let causal = Mask::causal(4).unwrap();
    // Row 2 has nothing allowed; row 0 sees only key 3.
    let holes = Mask::from_fn(4, |i, j| match i {
        0 => j == 3,
        2 => false,
        _ => (i + j) % 3 != 0,
    })
    .unwrap();
    let setups: [(&[usize], usize, usize, Option<&Mask>); 5] = [
        (&[4, 5], 6, 2, None),
        (&[4, 5], 6, 3, Some(&causal)),
        (&[4, 3], 4, 2, Some(&holes)),
        (&[2, 4, 3], 4, 1, Some(&holes)),
        (&[3, 4, 2], 2, 2, None),
    ];
    for (xs, p, heads, mask) in setups {
        let leaves = operands(xs, p);
        let seed = vals(xs, 9);
        let (gc, oc) = graph(&leaves, heads, mask, None);
        let reference = run(&gc, oc, &leaves, &seed);
        // The composed graph itself: IR and tape agree.
        for (k, (a, b)) in reference[0].iter().zip(&reference[1]).enumerate() {
            assert_close(&format!("composed IR vs tape, {xs:?} item {k}"), b, a);
        }
        for fused in [false, true] {
            let (g, o) = graph(&leaves, heads, mask, Some(fused));
            for (who, got) in ["IR", "tape"].iter().zip(run(&g, o, &leaves, &seed)) {
                for (k, (a, b)) in got.iter().zip(&reference[0]).enumerate() {
                    let what =
                        format!("{who} fused={fused} {xs:?} heads={heads} {mask:?} item {k}");
                    assert_close(&what, a, b);
                }
            }
        }
        // A masked row with nothing allowed outputs zeros.
        if let Some(m) = mask {
            let y = &reference[0][0];
            let (n, dm) = (xs[xs.len() - 2], xs[xs.len() - 1]);
            for i in (0..n).filter(|&i| m.row(i).iter().all(|a| !a)) {
                for r in y.data().chunks(dm).skip(i).step_by(n) {
                    assert!(r.iter().all(|&v| v == 0.0), "row {i} of {y:?}");
                }
            }
        }
    }
}

/// Value and the five leaf gradients of `g` on the f32 backend `be`.
fn run_f32<B: Backend<T = f32>>(
    be: &B,
    g: &GraphData,
    out: Id,
    leaves: &[Tensor<f64>],
    seed: &Tensor<f64>,
) -> Vec<Tensor<f32>> {
    let leaves: Vec<Tensor<f32>> = leaves.iter().map(Tensor::cast).collect();
    let p = be.record(g, &leaves, &[]).unwrap();
    let mut r = vec![be.values(&p).unwrap()[out].clone()];
    r.extend_from_slice(&be.backward_dense(&p, out, &seed.cast()).unwrap()[..leaves.len()]);
    r
}

/// fused = composed (the unfused op and the composition of primitives) on `be`, value and
/// every gradient within the f32 tolerance (1e-4 of the f64 reference's scale); the fused
/// form bit-identical on a second run. Lengths 17 and 33 cross the flash kernels' tiles of
/// 16, 70 their blocks of 64 (the one-pass backward adds dQ over two key blocks); the masks
/// are causal, key padding, both, and one with a fully masked row; heads of 1–3 and one of 66.
fn fused_equals_composed_on<B: Backend<T = f32>>(be: &B) {
    let holes = |n: usize| Mask::from_fn(n, |i, j| i != 2 && (i + 2 * j) % 5 != 1).unwrap();
    let pad = |n: usize| Mask::from_fn(n, |_, j| j % 4 != 3).unwrap();
    let both = |n: usize| Mask::from_fn(n, |i, j| j <= i && j != 1).unwrap();
    let setups: Vec<(Vec<usize>, usize, usize, Option<Mask>)> = vec![
        (vec![17, 5], 6, 2, None),
        (vec![2, 17, 3], 4, 2, Some(Mask::causal(17).unwrap())),
        (vec![33, 4], 6, 3, Some(pad(33))),
        (vec![2, 70, 3], 6, 2, Some(pad(70))),
        (vec![2, 19, 3], 4, 1, Some(both(19))),
        (vec![17, 3], 4, 2, Some(holes(17))),
        // A head of 66 (> 64): the flash backward's other kernels.
        (vec![17, 4], 66, 1, Some(Mask::causal(17).unwrap())),
    ];
    for (xs, p, heads, mask) in setups {
        let leaves = operands(&xs, p);
        let seed = vals(&xs, 9);
        let (gc, oc) = graph(&leaves, heads, mask.as_ref(), None);
        let reference = run(&gc, oc, &leaves, &seed)[0].clone();
        let (gf, of) = graph(&leaves, heads, mask.as_ref(), Some(true));
        let fused = run_f32(be, &gf, of, &leaves, &seed);
        let again = run_f32(be, &gf, of, &leaves, &seed);
        for kind in [Some(false), None] {
            let (g, o) = graph(&leaves, heads, mask.as_ref(), kind);
            let composed = run_f32(be, &g, o, &leaves, &seed);
            for (k, ((f, c), r)) in fused.iter().zip(&composed).zip(&reference).enumerate() {
                let what = format!(
                    "{} {xs:?} heads={heads} {mask:?} {kind:?} item {k}",
                    be.name()
                );
                assert!(
                    tensor_err(f, r) <= 1e-4,
                    "{what}: fused {:e}",
                    tensor_err(f, r)
                );
                assert!(
                    tensor_err(c, r) <= 1e-4,
                    "{what}: composed {:e}",
                    tensor_err(c, r)
                );
            }
        }
        for (k, (a, b)) in fused.iter().zip(&again).enumerate() {
            let bits = |t: &Tensor<f32>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(a),
                bits(b),
                "{} {xs:?} {mask:?} item {k}: two runs",
                be.name()
            );
        }
    }
}

#[test]
fn fused_equals_composed_in_f32_on_the_cpu_and_the_cuda_sim() {
    fused_equals_composed_on(&CpuTape::<f32>::new());
    fused_equals_composed_on(&CudaSim::new());
}

/// The same on the emulated kernels (kernels/attention.cu for the fused form).
#[cfg(feature = "cuda-emu")]
#[test]
fn fused_equals_composed_in_f32_on_the_emulated_kernels() {
    use tl_conformance::backend::OnDevice;
    fused_equals_composed_on(&OnDevice::new("cuda-emu", tl_tape_cuda::CudaDevice::new));
}

/// The same on the emulated kernels with deterministic reductions off: the one-pass flash
/// backward (`tl_flash_bwd_atomic`: dQ added over blocks of 64 keys with `atomicAdd`) for the
/// heads up to 64, the two kernels for the head of 66.
#[cfg(feature = "cuda-emu")]
#[test]
fn fused_equals_composed_in_f32_on_the_emulated_atomic_kernels() {
    use tl_conformance::backend::OnDevice;
    fused_equals_composed_on(&OnDevice::nondeterministic(
        "cuda-emu",
        tl_tape_cuda::CudaDevice::new,
    ));
}

/// The same on the emulated kernels with the wide flash tilings (`FlashTiles::Wide`: 64 keys a
/// forward step for heads up to 64, register tiles for the backward of larger heads).
#[cfg(feature = "cuda-emu")]
#[test]
fn fused_equals_composed_in_f32_on_the_emulated_kernels_with_wide_flash_tiles() {
    use tl_conformance::backend::OnDevice;
    use tl_tape_cuda::{CudaDevice, FlashTiles};
    let wide = || {
        let mut d = CudaDevice::new()?;
        d.set_flash_tiles(FlashTiles::Wide);
        Ok(d)
    };
    fused_equals_composed_on(&OnDevice::new("cuda-emu wide flash tiles", wide));
}

#[test]
fn jvp_of_the_fused_op_matches_the_composition() {
    let mask = Mask::from_fn(3, |i, j| i != 1 || j == 2).unwrap();
    let leaves = operands(&[3, 4], 4);
    let tangents: Vec<Tensor<f64>> = leaves
        .iter()
        .enumerate()
        .map(|(k, t)| vals(t.shape().dims(), 20 + k))
        .collect();
    let (gc, oc) = graph(&leaves, 2, Some(&mask), None);
    let want = gc.jvp(&leaves, &[], &tangents).unwrap()[oc].clone();
    let (g, o) = graph(&leaves, 2, Some(&mask), Some(true));
    let got = g.jvp(&leaves, &[], &tangents).unwrap()[o].clone();
    assert_close("jvp", &got, &want);
    // And ⟨jvp, g⟩ = Σ ⟨vjp_k, tangent_k⟩ (the adjoint identity) for the fused op's VJP.
    let seed = vals(&[3, 4], 30);
    let grads = g.backprop_all(&leaves, &[], o, &seed).unwrap();
    let lhs = got.dot_f64(&seed).unwrap();
    let rhs: f64 = (0..5)
        .map(|k| grads[k].dot_f64(&tangents[k]).unwrap())
        .sum();
    assert!(
        (lhs - rhs).abs() < 1e-10 * lhs.abs().max(1.0),
        "{lhs} vs {rhs}"
    );
}

#[test]
fn a_masked_out_value_does_not_change_the_output_at_all() {
    // Key 2 is masked for every query, so changing x's row 2 only changes V's row 2 (and Q's
    // row 2, whose own output row we skip): the other output rows must be bit-identical.
    let mask = Mask::from_fn(3, |i, j| j != 2 || i == 2).unwrap();
    for fused in [false, true] {
        let mut leaves = operands(&[3, 4], 4);
        let (g, o) = graph(&leaves, 2, Some(&mask), Some(fused));
        let tape = CpuTape::<f64>::new();
        let before = tape
            .values(&tape.record(&g, &leaves, &[]).unwrap())
            .unwrap()[o]
            .clone();
        let mut x = leaves[4].data().to_vec();
        for v in &mut x[8..12] {
            *v += 1000.0;
        }
        leaves[4] = Tensor::new([3, 4], x).unwrap();
        let after = tape
            .values(&tape.record(&g, &leaves, &[]).unwrap())
            .unwrap()[o]
            .clone();
        assert_eq!(before.data()[..8], after.data()[..8], "fused={fused}");
        assert_ne!(before.data()[8..], after.data()[8..]);
    }
}

#[test]
fn masked_softmax_gives_exact_zeros_and_zero_gradient_on_empty_rows() {
    let mask = Mask::new(2, vec![true, false, false, false]).unwrap();
    let x = Tensor::new([2, 2, 2], vec![0.5, 7.0, -1.0, 3.0, 2.0, -9.0, 4.0, 4.0]).unwrap();
    let seed = Tensor::new([2, 2, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
    let mut b = GraphBuilder::new();
    let l = b.leaf([2, 2, 2], None).unwrap();
    let out = b.apply(Op::MaskedSoftmax { mask }, &[l]).unwrap();
    let g = b.finish();
    let [ir, tape] = run(&g, out, std::slice::from_ref(&x), &seed);
    for r in [ir, tape] {
        assert_eq!(r[0].data(), &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        // A row with one allowed entry is constant (1): its gradient is 0, as is an empty row's.
        assert_eq!(r[1].data(), &[0.0; 8]);
    }
}

#[test]
fn bad_attention_input_is_a_clear_error() {
    let s = |d: &[usize]| Shape::new(d);
    let shapes = |w: &[usize], wo: &[usize], x: &[usize]| [s(w), s(w), s(w), s(wo), s(x)];
    let err = |op: Op, sh: [Shape; 5]| {
        let r: Vec<&Shape> = sh.iter().collect();
        op.infer_shape(&r).unwrap_err().to_string()
    };
    let mha = |heads, mask: Option<Mask>| Op::MultiHeadAttention {
        heads,
        mask,
        fused: true,
    };
    let e = err(mha(4, None), shapes(&[3, 6], &[6, 3], &[2, 3]));
    assert!(
        e.contains("multiHeadAttention") && e.contains("heads = 4"),
        "{e}"
    );
    let e = err(mha(0, None), shapes(&[3, 6], &[6, 3], &[2, 3]));
    assert!(e.contains("heads = 0"), "{e}");
    let e = err(
        mha(1, Some(Mask::causal(3).unwrap())),
        shapes(&[3, 6], &[6, 3], &[2, 3]),
    );
    assert!(e.contains("mask is (3, 3)") && e.contains("(2, 2)"), "{e}");
    let e = err(mha(1, None), shapes(&[3, 6], &[6, 4], &[2, 3]));
    assert!(e.contains("wo") && e.contains("[6, 4]"), "{e}");
    let e = err(mha(1, None), shapes(&[4, 6], &[6, 3], &[2, 3]));
    assert!(e.contains("wq") && e.contains("[4, 6]"), "{e}");
    let e = err(mha(1, None), shapes(&[3, 6], &[6, 3], &[0, 3]));
    assert!(e.contains("empty"), "{e}");
    let e = Op::MaskedSoftmax {
        mask: Mask::causal(2).unwrap(),
    }
    .infer_shape(&[&s(&[3, 3])])
    .unwrap_err()
    .to_string();
    assert!(e.contains("maskedSoftmax") && e.contains("(2, 2)"), "{e}");
    assert!(Mask::new(3, vec![true; 8]).is_err());
    // The composition reports the fused op's errors.
    let mut b = GraphBuilder::new();
    let w = b.leaf([3, 6], None).unwrap();
    let wo = b.leaf([6, 3], None).unwrap();
    let x = b.leaf([2, 3], None).unwrap();
    let e = compose::multi_head_attention(&mut b, w, w, w, wo, x, 4, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("heads = 4"), "{e}");
    assert_eq!(b.graph().nodes().len(), 0, "nothing recorded on error");
}
