//! Multi-head attention and its core without the projections (`scaledDotProductAttention`),
//! each three ways — the fused (streaming) op, the unfused op and the composition of primitive
//! ops (`tl_ir::compose`) — agree in value and in every leaf gradient,
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

/// Which attention op.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `multiHeadAttention(wq, wk, wv, wo, x)`.
    Mha,
    /// `scaledDotProductAttention(q, k, v)`: the heads merged on the last axis.
    Sdpa,
    /// `scaledDotProductAttention(q, k, v)` with k and v of this many rows (keys of another
    /// length than the queries: cross-attention, a KV cache) of this width (kv_heads·d: fewer
    /// key heads than query heads for grouped-query attention).
    Cross(usize, usize),
}

const FORMS: [Form; 2] = [Form::Mha, Form::Sdpa];

/// A case of the core over keys of another length: the query dims (…, n, P), P, heads, the
/// mask (n, nk), nk.
type Cross<X, M> = (X, usize, usize, Option<M>, usize);

/// A case of grouped-query attention: [`Cross`] and the key heads.
type Grouped<X, M> = (Cross<X, M>, usize);

/// The forms of `cross` (keys of q's width) and `grouped` (keys of kv_heads·d), each with its
/// sizes (the query dims, P, heads, the mask).
fn cross_forms<X, M>(
    cross: Vec<Cross<X, M>>,
    grouped: Vec<Grouped<X, M>>,
) -> impl Iterator<Item = ((X, usize, usize, Option<M>), Form)> {
    let cross = cross
        .into_iter()
        .map(|(xs, p, h, m, nk)| ((xs, p, h, m), Form::Cross(nk, p)));
    let grouped = grouped
        .into_iter()
        .map(|((xs, p, h, m, nk), kv)| ((xs, p, h, m), Form::Cross(nk, p / h * kv)));
    cross.chain(grouped)
}

/// Operands for x of `xs` = (…, n, dModel) and projection width `p`: `[wq, wk, wv, wo, x]`,
/// or for the core `[q, k, v]` of (…, n, p).
fn operands(form: Form, xs: &[usize], p: usize) -> Vec<Tensor<f64>> {
    let dm = *xs.last().unwrap();
    match form {
        Form::Mha => vec![
            vals(&[dm, p], 1),
            vals(&[dm, p], 2),
            vals(&[dm, p], 3),
            vals(&[p, dm], 4),
            vals(xs, 5),
        ],
        Form::Sdpa => {
            let qs = out_shape(form, xs, p);
            vec![vals(&qs, 1), vals(&qs, 2), vals(&qs, 3)]
        }
        Form::Cross(nk, pk) => {
            let qs = out_shape(form, xs, p);
            let mut ks = qs.clone();
            let at = ks.len() - 2;
            ks[at..].copy_from_slice(&[nk, pk]);
            vec![vals(&qs, 1), vals(&ks, 2), vals(&ks, 3)]
        }
    }
}

/// The output's dims: x's (`xs`), or for the core q's.
fn out_shape(form: Form, xs: &[usize], p: usize) -> Vec<usize> {
    match form {
        Form::Mha => xs.to_vec(),
        Form::Sdpa | Form::Cross(..) => {
            let mut qs = xs.to_vec();
            *qs.last_mut().unwrap() = p;
            qs
        }
    }
}

/// The graph of one attention application: the op itself, or the composition when `op` is None.
fn graph(
    form: Form,
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
    let mask_ = mask.cloned();
    let out = match (form, op) {
        (Form::Mha, Some(fused)) => {
            let op = Op::MultiHeadAttention {
                heads,
                mask: mask_,
                fused,
            };
            b.apply(op, &ids).unwrap()
        }
        (Form::Mha, None) => compose::multi_head_attention(
            &mut b, ids[0], ids[1], ids[2], ids[3], ids[4], heads, mask,
        )
        .unwrap(),
        (Form::Sdpa | Form::Cross(..), Some(fused)) => {
            let op = Op::ScaledDotProductAttention {
                heads,
                mask: mask_,
                fused,
            };
            b.apply(op, &ids).unwrap()
        }
        (Form::Sdpa | Form::Cross(..), None) => {
            let qkv = [ids[0], ids[1], ids[2]];
            compose::scaled_dot_product_attention(&mut b, qkv, heads, mask).unwrap()
        }
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
    // One matrix per batch element: element 1's row 3 has nothing allowed, element 0's none.
    let per_element =
        Mask::from_fn_batched(2, 4, 4, |b, i, j| (b, i) != (1, 3) && (i + j + b) % 3 != 2).unwrap();
    let setups: [(&[usize], usize, usize, Option<&Mask>); 6] = [
        (&[4, 5], 6, 2, None),
        (&[4, 5], 6, 3, Some(&causal)),
        (&[4, 3], 4, 2, Some(&holes)),
        (&[2, 4, 3], 4, 1, Some(&holes)),
        (&[3, 4, 2], 2, 2, None),
        (&[2, 4, 3], 4, 2, Some(&per_element)),
    ];
    // Keys of another length: one query over a cache of 5, three over 2 at the bottom right
    // (the first query sees nothing), four over 6 with a hole row.
    let over_cache = Mask::causal_lower_right(1, 5).unwrap();
    let tall = Mask::causal_lower_right(3, 2).unwrap();
    let wide_holes = Mask::from_fn_rectangular(4, 6, |i, j| i != 1 && (i + j) % 4 != 0).unwrap();
    // A padded batch of three: 5, 2 and 4 of the 5 keys.
    let lens = [5, 2, 4];
    let padded = Mask::from_fn_batched(3, 2, 5, |b, _, j| j < lens[b]).unwrap();
    let cross: Vec<Cross<&[usize], &Mask>> = vec![
        (&[1, 5], 6, 2, Some(&over_cache), 5),
        (&[2, 3, 3], 4, 2, Some(&tall), 2),
        (&[4, 3], 4, 1, Some(&wide_holes), 6),
        (&[2, 3, 2], 6, 3, None, 7),
        (&[3, 2, 3], 4, 2, Some(&padded), 5),
    ];
    // Grouped-query attention: four query heads over two key heads (self-attention), three
    // over one (multi-query) over a cache, four over two on the padded batch.
    let causal_over_cache = Mask::causal_lower_right(3, 5).unwrap();
    let grouped: Vec<Grouped<&[usize], &Mask>> = vec![
        ((&[4, 6], 8, 4, None, 4), 2),
        ((&[2, 3, 2], 6, 3, Some(&causal_over_cache), 5), 1),
        ((&[3, 2, 3], 8, 4, Some(&padded), 5), 2),
    ];
    let cases = setups
        .into_iter()
        .flat_map(|s| FORMS.map(|f| (s, f)))
        .chain(cross_forms(cross, grouped));
    for ((xs, p, heads, mask), form) in cases {
        let leaves = operands(form, xs, p);
        let os = out_shape(form, xs, p);
        let seed = vals(&os, 9);
        let (gc, oc) = graph(form, &leaves, heads, mask, None);
        let reference = run(&gc, oc, &leaves, &seed);
        // The composed graph itself: IR and tape agree.
        for (k, (a, b)) in reference[0].iter().zip(&reference[1]).enumerate() {
            assert_close(
                &format!("{form:?} composed IR vs tape, {xs:?} item {k}"),
                b,
                a,
            );
        }
        for fused in [false, true] {
            let (g, o) = graph(form, &leaves, heads, mask, Some(fused));
            for (who, got) in ["IR", "tape"].iter().zip(run(&g, o, &leaves, &seed)) {
                for (k, (a, b)) in got.iter().zip(&reference[0]).enumerate() {
                    let what = format!(
                        "{form:?} {who} fused={fused} {xs:?} heads={heads} {mask:?} item {k}"
                    );
                    assert_close(&what, a, b);
                }
            }
        }
        // A masked row with nothing allowed outputs zeros (in its batch element).
        if let Some(m) = mask {
            let y = &reference[0][0];
            let (n, dm) = (os[os.len() - 2], os[os.len() - 1]);
            for (r, row) in y.data().chunks(dm).enumerate() {
                let (b, i) = (r / n, r % n);
                if m.row_in(b, i).iter().all(|a| !a) {
                    assert!(row.iter().all(|&v| v == 0.0), "row {i} of {b} in {y:?}");
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
/// The core also with keys of another length: one query over 37 cached keys, 20 over 70 and 19
/// over 17 at the bottom right (the first two rows see nothing), 33 over 5 padded keys, 17 over
/// 40 with a hole row, 3 over 50 unmasked, and the head of 66 over 21; and with fewer key heads
/// than query heads (grouped-query attention, groups of 2 to 4, multi-query).
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
        // Key padding per batch element: 33 and 20 of 33 keys.
        (
            vec![2, 33, 3],
            4,
            2,
            Some(Mask::from_fn_batched(2, 33, 33, |b, _, j| j < 33 - 13 * b).unwrap()),
        ),
        // A head of 66 (> 64): the flash backward's other kernels.
        (vec![17, 4], 66, 1, Some(Mask::causal(17).unwrap())),
    ];
    let lower_right = |n, nk| Some(Mask::causal_lower_right(n, nk).unwrap());
    let rect =
        |n, nk, f: fn(usize, usize) -> bool| Some(Mask::from_fn_rectangular(n, nk, f).unwrap());
    let batched = |b, n, nk, f: fn(usize, usize, usize) -> bool| {
        Some(Mask::from_fn_batched(b, n, nk, f).unwrap())
    };
    let cross: Vec<Cross<Vec<usize>, Mask>> = vec![
        (vec![1, 6], 6, 2, lower_right(1, 37), 37),
        (vec![2, 20, 3], 4, 2, lower_right(20, 70), 70),
        (vec![2, 19, 3], 4, 1, lower_right(19, 17), 17),
        (vec![33, 4], 6, 3, rect(33, 5, |_, j| j != 2), 5),
        (
            vec![17, 3],
            4,
            2,
            rect(17, 40, |i, j| i != 3 && (i + 2 * j) % 5 != 1),
            40,
        ),
        (vec![3, 5], 6, 2, None, 50),
        (vec![5, 4], 66, 1, lower_right(5, 21), 21),
        // A padded batch: a key mask per batch element (40, 23 and 7 keys), and causal at the
        // bottom right with it.
        (
            vec![3, 17, 4],
            6,
            3,
            batched(3, 17, 40, |b, _, j| j < [40, 23, 7][b]),
            40,
        ),
        (
            vec![2, 20, 3],
            4,
            2,
            batched(2, 20, 70, |b, i, j| j <= i + 50 && j < 70 - 30 * b),
            70,
        ),
    ];
    // Grouped-query attention past the tiles: 4 query heads over 2 (causal), 6 over 3 over a
    // long cache, 8 over 2 on a padded batch, 2 over 1 with heads of 66, 4 over 1 unmasked.
    let grouped: Vec<Grouped<Vec<usize>, Mask>> = vec![
        (
            (vec![2, 17, 3], 8, 4, Some(Mask::causal(17).unwrap()), 17),
            2,
        ),
        ((vec![20, 3], 12, 6, lower_right(20, 70), 70), 3),
        (
            (
                vec![3, 17, 4],
                16,
                8,
                batched(3, 17, 40, |b, _, j| j < [40, 23, 7][b]),
                40,
            ),
            2,
        ),
        ((vec![5, 4], 132, 2, lower_right(5, 21), 21), 1),
        ((vec![2, 33, 3], 8, 4, None, 33), 1),
    ];
    let cases = setups
        .into_iter()
        .flat_map(|s| FORMS.map(|f| (s.clone(), f)))
        .chain(cross_forms(cross, grouped));
    for ((xs, p, heads, mask), form) in cases {
        let leaves = operands(form, &xs, p);
        let seed = vals(&out_shape(form, &xs, p), 9);
        let (gc, oc) = graph(form, &leaves, heads, mask.as_ref(), None);
        let reference = run(&gc, oc, &leaves, &seed)[0].clone();
        let (gf, of) = graph(form, &leaves, heads, mask.as_ref(), Some(true));
        let fused = run_f32(be, &gf, of, &leaves, &seed);
        let again = run_f32(be, &gf, of, &leaves, &seed);
        for kind in [Some(false), None] {
            let (g, o) = graph(form, &leaves, heads, mask.as_ref(), kind);
            let composed = run_f32(be, &g, o, &leaves, &seed);
            for (k, ((f, c), r)) in fused.iter().zip(&composed).zip(&reference).enumerate() {
                let what = format!(
                    "{} {form:?} {xs:?} heads={heads} {mask:?} {kind:?} item {k}",
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
                "{} {form:?} {xs:?} {mask:?} item {k}: two runs",
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

/// The same on the emulated kernels with each flash tiling the default (`FlashTiles::Auto`:
/// narrow up to heads of 64, wide past them) leaves: `Narrow` (tiles of 16 in the backward of
/// larger heads) and `Wide` (64 keys a forward step for heads up to 64).
#[cfg(feature = "cuda-emu")]
#[test]
fn fused_equals_composed_in_f32_on_the_emulated_kernels_with_each_flash_tiling() {
    use tl_conformance::backend::OnDevice;
    use tl_tape_cuda::{CudaDevice, FlashTiles};
    fn tiled(tiles: FlashTiles) -> tl_tape_cuda::Result<CudaDevice> {
        let mut d = CudaDevice::new()?;
        d.set_flash_tiles(tiles);
        Ok(d)
    }
    fused_equals_composed_on(&OnDevice::new("cuda-emu narrow flash tiles", || {
        tiled(FlashTiles::Narrow)
    }));
    fused_equals_composed_on(&OnDevice::new("cuda-emu wide flash tiles", || {
        tiled(FlashTiles::Wide)
    }));
}

/// The same with the fused forward on the tensor cores (`FlashProducts::Tf32x3`: 3xTF32
/// products, `tl_flash_fwd_tc`'s sim twin) for the heads up to 64 (the head of 66 takes the
/// FMA forward): on the CUDA sim.
#[test]
fn fused_equals_composed_in_f32_on_the_cuda_sim_with_tensor_core_flash() {
    use tl_conformance::backend::OnDevice;
    use tl_tape_cuda::{FlashProducts, SimDevice};
    let tc = || {
        let mut d = SimDevice::new();
        d.set_flash_products(FlashProducts::Tf32x3);
        Ok(d)
    };
    fused_equals_composed_on(&OnDevice::new("cuda-sim tensor-core flash", tc));
}

/// The same on the emulated kernels (`tl_flash_fwd_tc`, WMMA fragments on the emulator).
#[cfg(feature = "cuda-emu")]
#[test]
fn fused_equals_composed_in_f32_on_the_emulated_kernels_with_tensor_core_flash() {
    use tl_conformance::backend::OnDevice;
    use tl_tape_cuda::{CudaDevice, FlashProducts};
    let tc = || {
        let mut d = CudaDevice::new()?;
        d.set_flash_products(FlashProducts::Tf32x3);
        Ok(d)
    };
    fused_equals_composed_on(&OnDevice::new("cuda-emu tensor-core flash", tc));
}

#[test]
fn jvp_of_the_fused_op_matches_the_composition() {
    let square = Mask::from_fn(3, |i, j| i != 1 || j == 2).unwrap();
    let wide = Mask::from_fn_rectangular(3, 5, |i, j| i != 1 || j == 4).unwrap();
    let forms = [
        (Form::Mha, [3, 4], &square),
        (Form::Sdpa, [3, 6], &square),
        (Form::Cross(5, 4), [3, 6], &wide),
        // Grouped-query: both heads read one key head.
        (Form::Cross(5, 2), [3, 6], &wide),
    ];
    for (form, xs, mask) in forms {
        let leaves = operands(form, &xs, 4);
        let tangents: Vec<Tensor<f64>> = leaves
            .iter()
            .enumerate()
            .map(|(k, t)| vals(t.shape().dims(), 20 + k))
            .collect();
        let (gc, oc) = graph(form, &leaves, 2, Some(mask), None);
        let want = gc.jvp(&leaves, &[], &tangents).unwrap()[oc].clone();
        let (g, o) = graph(form, &leaves, 2, Some(mask), Some(true));
        let got = g.jvp(&leaves, &[], &tangents).unwrap()[o].clone();
        assert_close(&format!("{form:?} jvp"), &got, &want);
        // And ⟨jvp, g⟩ = Σ ⟨vjp_k, tangent_k⟩ (the adjoint identity) for the fused op's VJP.
        let seed = vals(&out_shape(form, &xs, 4), 30);
        let grads = g.backprop_all(&leaves, &[], o, &seed).unwrap();
        let lhs = got.dot_f64(&seed).unwrap();
        let rhs: f64 = (0..leaves.len())
            .map(|k| grads[k].dot_f64(&tangents[k]).unwrap())
            .sum();
        assert!(
            (lhs - rhs).abs() < 1e-10 * lhs.abs().max(1.0),
            "{form:?}: {lhs} vs {rhs}"
        );
    }
}

/// The core is the attention inside `multiHeadAttention`: the op on `x·wq`, `x·wk`, `x·wv`,
/// then `·wo`, gives the op's value and every gradient (f64, IR and CPU tape), fused or not.
#[test]
fn the_core_between_the_projections_is_multi_head_attention() {
    let causal = Mask::causal(5).unwrap();
    for (xs, p, heads, mask) in [
        (vec![5, 3], 4, 2, None),
        (vec![2, 5, 3], 6, 3, Some(&causal)),
    ] {
        let leaves = operands(Form::Mha, &xs, p);
        let seed = vals(&xs, 9);
        for fused in [false, true] {
            let (gm, om) = graph(Form::Mha, &leaves, heads, mask, Some(fused));
            let want = run(&gm, om, &leaves, &seed);
            let mut b = GraphBuilder::new();
            let ids: Vec<Id> = leaves
                .iter()
                .map(|t| b.leaf(t.shape().clone(), None).unwrap())
                .collect();
            let rows = b
                .apply(
                    Op::Reshape(Shape::new(&[
                        xs.iter().product::<usize>() / xs[xs.len() - 1],
                        xs[xs.len() - 1],
                    ])),
                    &[ids[4]],
                )
                .unwrap();
            let mut qs = xs.clone();
            *qs.last_mut().unwrap() = p;
            let mut project = |w: Id| {
                let t = b.apply(Op::Matmul, &[rows, w]).unwrap();
                b.apply(Op::Reshape(Shape::new(&qs)), &[t]).unwrap()
            };
            let qkv = [project(ids[0]), project(ids[1]), project(ids[2])];
            let op = Op::ScaledDotProductAttention {
                heads,
                mask: mask.cloned(),
                fused,
            };
            let c = b.apply(op, &qkv).unwrap();
            let c = b
                .apply(
                    Op::Reshape(Shape::new(&[qs.iter().product::<usize>() / p, p])),
                    &[c],
                )
                .unwrap();
            let y = b.apply(Op::Matmul, &[c, ids[3]]).unwrap();
            let y = b.apply(Op::Reshape(Shape::new(&xs)), &[y]).unwrap();
            let got = run(&b.finish(), y, &leaves, &seed);
            for (who, (g, w)) in ["IR", "tape"].iter().zip(got.iter().zip(&want)) {
                for (k, (a, b)) in g.iter().zip(w).enumerate() {
                    assert_close(&format!("{who} fused={fused} {xs:?} item {k}"), a, b);
                }
            }
        }
    }
}

#[test]
fn a_masked_out_value_does_not_change_the_output_at_all() {
    // Key 2 is masked for every query, so changing x's row 2 only changes V's row 2 (and Q's
    // row 2, whose own output row we skip): the other output rows must be bit-identical.
    let mask = Mask::from_fn(3, |i, j| j != 2 || i == 2).unwrap();
    for fused in [false, true] {
        let mut leaves = operands(Form::Mha, &[3, 4], 4);
        let (g, o) = graph(Form::Mha, &leaves, 2, Some(&mask), Some(fused));
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
    // The core: q (n, P) or (B, n, P), k and v one shape of q's batch and a width of
    // kv_heads·d with kv_heads dividing heads, heads dividing P, the mask (n, nk).
    let sdpa = |heads, mask: Option<Mask>, sh: [&[usize]; 3]| {
        let op = Op::ScaledDotProductAttention {
            heads,
            mask,
            fused: true,
        };
        let sh = sh.map(s);
        op.infer_shape(&[&sh[0], &sh[1], &sh[2]])
            .unwrap_err()
            .to_string()
    };
    let e = sdpa(4, None, [&[3, 6], &[3, 6], &[3, 6]]);
    assert!(
        e.contains("scaledDotProductAttention") && e.contains("heads = 4"),
        "{e}"
    );
    for k in [&[2, 3, 6][..], &[2, 3, 6, 1]] {
        let e = sdpa(2, None, [&[3, 6], k, k]);
        assert!(
            e.contains("k must be (nk, Pk)") && e.contains("[3, 6]"),
            "{e}"
        );
    }
    let e = sdpa(2, None, [&[2, 3, 6], &[1, 3, 6], &[1, 3, 6]]);
    assert!(
        e.contains("same batch as q") && e.contains("[1, 3, 6]"),
        "{e}"
    );
    // Grouped-query attention: k's width a whole number of heads, which divides q's heads.
    let e = sdpa(2, None, [&[3, 6], &[3, 4], &[3, 4]]);
    assert!(
        e.contains("width Pk = 4")
            && e.contains("kv_heads·d for a kv_heads dividing heads = 2")
            && e.contains("d = P/heads = 3"),
        "{e}"
    );
    for (k, heads) in [(&[3, 6][..], 4), (&[3, 0], 2), (&[3, 12], 2)] {
        let e = sdpa(heads, None, [&[3, 8], k, k]);
        assert!(
            e.contains(&format!("heads = {heads}")) && e.contains("Pk"),
            "{e}"
        );
    }
    let e = sdpa(2, None, [&[2, 3, 6], &[2, 3, 6], &[2, 4, 6]]);
    assert!(e.contains("v must have k's shape [2, 3, 6]"), "{e}");
    let e = sdpa(
        1,
        Some(Mask::causal(4).unwrap()),
        [&[3, 6], &[3, 6], &[3, 6]],
    );
    assert!(e.contains("mask is (4, 4)") && e.contains("(3, 3)"), "{e}");
    let e = sdpa(
        1,
        Some(Mask::causal_lower_right(5, 3).unwrap()),
        [&[3, 6], &[5, 6], &[5, 6]],
    );
    assert!(e.contains("mask is (5, 3)") && e.contains("(3, 5)"), "{e}");
    let e = sdpa(
        1,
        Some(Mask::from_fn_batched(2, 3, 3, |_, _, _| true).unwrap()),
        [&[3, 3, 6], &[3, 3, 6], &[3, 3, 6]],
    );
    assert!(
        e.contains("2 batch elements") && e.contains("batch 3"),
        "{e}"
    );
    let e = sdpa(1, None, [&[6], &[6], &[6]]);
    assert!(e.contains("q must be (nq, P) or (B, nq, P)"), "{e}");
    let e = sdpa(1, None, [&[0, 6], &[0, 6], &[0, 6]]);
    assert!(e.contains("empty"), "{e}");
    let e = sdpa(1, None, [&[2, 6], &[0, 6], &[0, 6]]);
    assert!(e.contains("empty") && e.contains("no key"), "{e}");
    let mut b = GraphBuilder::new();
    let q = b.leaf([3, 6], None).unwrap();
    let e = compose::scaled_dot_product_attention(&mut b, [q, q, q], 4, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("heads = 4"), "{e}");
    assert_eq!(b.graph().nodes().len(), 0, "nothing recorded on error");
}
