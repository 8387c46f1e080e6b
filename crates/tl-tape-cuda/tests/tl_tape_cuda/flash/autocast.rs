//! The fused attention under autocast (bf16, TF32): the core against the spec's autocast
//! reference with FMA and tensor-core products, and the fused nodes on the tape at that
//! setting (what they keep, the copies they make, the rounded core).

use super::*;

/// `[O, dQ, dK, dV]` of the spec's autocast reference
/// (`tl_spec::ops::attention::sdpa::autocast_reference`) on `case`: q (B, nq, H·d), k and v
/// (B, nk, Hk·d), the cotangent dO.
fn spec_autocast(case: &Case, data: &[Vec<f32>; 4], round: Precision) -> [Vec<f64>; 4] {
    let f = case.dims;
    let t = |shape: [usize; 3], k: usize| Tensor::new(&shape[..], data[k].clone()).unwrap();
    let qs = [f.batch, f.nq, f.heads * f.d];
    let ks = [f.batch, f.nk, f.kv_heads * f.d];
    let [q, k, v, g] = [t(qs, 0), t(ks, 1), t(ks, 2), t(qs, 3)];
    let r = tl_spec::ops::attention::sdpa::autocast_reference(
        round,
        [&q, &k, &v],
        f.heads,
        case.mask.as_ref(),
        &g,
    )
    .unwrap();
    r.map(|x| x.data().to_vec())
}

/// The elements of `got` off `want` by more than `tol` relative to `max(1, ‖want‖∞)` (−∞
/// must match −∞; NaN is off), and how many there are.
fn beyond(got: &[f32], want: &[f64], tol: f64) -> (usize, usize) {
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    let off = got
        .iter()
        .zip(want)
        .filter(|&(&g, &w)| match w == f64::NEG_INFINITY {
            true => g != f32::NEG_INFINITY,
            false => (f64::from(g) - w).abs() / scale > tol || g.is_nan(),
        })
        .count();
    (off, got.len())
}

/// Under autocast (bf16, TF32) the fused core is the composed path's products on rounded
/// operands (`flash_attention_rounded` and its backward, every case: every mask form, nq ≠ nk,
/// masks per batch element, grouped heads, d up to 128): against the spec's f64 reference
/// (`autocast_reference`: Q, K, V, dO rounded, the normalized probabilities where A·V and dV
/// read them and dS where dQ and dK read it), lse (of the rounded operands) within 1e-5
/// everywhere and O, dQ, dK, dV within 1e-5 but where the device's f32
/// probability or dS and the reference's f64 one round to neighbouring values (one term off by
/// one unit of the rounding, at most 2⁻⁷ of its size): at most 2% of the elements, none off by
/// more than 2⁻⁶ of the scale. The reference that rounds the operands but not the
/// probabilities and dS (a core that forgot them, or rounded the online softmax's unnormalized
/// p) is off beyond 1e-5 on more than a fifth of the elements (ten times the flips'
/// allowance; measured: 82% in bf16, 54% in TF32, against 0.1% and 0.3% flips): the check
/// sees the rounding. `flash_attention` (no Ō: its first pass keeps the statistics alone)
/// gives the same O and lse bit for bit.
#[test]
fn under_autocast_the_core_rounds_as_the_composed_products() {
    autocast_check(FlashProducts::Fma, cases());
}

/// [`under_autocast_the_core_rounds_as_the_composed_products`] on the tensor cores
/// (`FlashProducts::Tf32x3` under autocast: the rounded operands' exact products, the sim twins
/// of `tl_flash_fwd_tc` and the backward's two kernels with the pass and rounding bits), every
/// case with d ≤ 64; and not the FMA core's bits: lse differs on most cases (the online
/// softmax over steps of 64 keys, p summed in two halves), so the setting reached the core.
/// (With one exact product a pair, the emulator's `mma_sync` sums a chunk in the FMA chain's
/// order, so O, whose probabilities are rounded, and the backward's sums mostly agree with the
/// FMA core's bits; the f32 first pass's `P·V` keeps its split.)
#[test]
fn under_autocast_on_the_tensor_cores_the_core_rounds_as_the_composed_products() {
    autocast_check(FlashProducts::Tf32x3, tc_cases());
}

/// The autocast checks above for the core with `products`, on `cases`.
fn autocast_check(products: FlashProducts, cases: Vec<Case>) {
    for round in [Precision::Bf16, Precision::Tf32] {
        let (mut off, mut unrounded_off, mut total) = (0, 0, 0);
        let (mut differ, mut differ_dq) = (0, 0);
        for (k, case) in cases.iter().enumerate() {
            let data = inputs(&case.dims, 300 + k as u64);
            let mut dev = SimDevice::new();
            let got = run_core_with(&mut dev, case, &data, (round, products)).unwrap();
            let fma = run_core_at(&mut dev, case, &data, round).unwrap();
            differ += usize::from(bits_of(&got[1]) != bits_of(&fma[1]));
            differ_dq += usize::from(bits_of(&got[2]) != bits_of(&fma[2]));
            // Without Ō (a first pass of statistics alone): the same O and lse.
            let value = value_with(&mut dev, case, &data, (round, products)).unwrap();
            assert_eq!(value[0], got[0], "{round:?} {}: O", case.name);
            assert_eq!(value[1], got[1], "{round:?} {}: lse", case.name);
            let want = spec_autocast(case, &data, round);
            let unrounded = reference_at(case, &data, round);
            let e = max_err(&got[1], &unrounded[1]);
            assert!(e <= 1e-5, "{round:?} {}: lse off by {e:e}", case.name);
            let results = [(0, "O"), (2, "dQ"), (3, "dK"), (4, "dV")];
            for (w, (r, name)) in results.into_iter().enumerate() {
                let e = max_err(&got[r], &want[w]);
                assert!(
                    e <= 1.0 / 64.0,
                    "{round:?} {}: {name} off by {e:e}",
                    case.name
                );
                let (n, len) = beyond(&got[r], &want[w], 1e-5);
                off += n;
                total += len;
                unrounded_off += beyond(&got[r], &unrounded[r], 1e-5).0;
            }
            let u = dev.memory_usage();
            assert_eq!(u.live_bytes, 0, "{round:?} {}: leaked {u}", case.name);
        }
        assert!(
            off * 50 <= total,
            "{round:?}: {off} of {total} elements beyond 1e-5 of the reference"
        );
        assert!(
            unrounded_off * 5 > total,
            "{round:?}: only {unrounded_off} of {total} elements tell the probabilities' \
             rounding apart"
        );
        if products != FlashProducts::Fma {
            let n = cases.len();
            assert!(
                differ * 2 > n,
                "{round:?}: the FMA core's lse on {} of {n}",
                n - differ
            );
        }
        println!(
            "{products:?} {round:?}: {off} of {total} off by a flip; {unrounded_off} tell the \
             rounding; {differ} lse and {differ_dq} dQ not the FMA core's of {}",
            cases.len()
        );
    }
}

/// Under autocast (bf16) the fused nodes keep O(n·P) floats too: `scaledDotProductAttention`
/// its log-sum-exp and Ō (the output of the unrounded probabilities, which the backward's
/// delta reads) beside its value, `multiHeadAttention` Q, K, V, C, lse and Ō; a core forward
/// is Q, K, V rounded into copies and two passes over the keys; the backward reads the
/// workspace or recomputes it, with the same bits. Over n = 512 keys the fused core op's peak
/// (forward and backward) stays below one (heads, n, n) score matrix, where the composed core
/// at the same setting holds three.
#[test]
fn under_autocast_the_fused_nodes_keep_o_n_floats() {
    let mut rnd = Gen::new(31);
    let (heads, d, n) = (2, 3, 37);
    let p = heads * d;
    let causal = || Some(Mask::causal(n).unwrap());
    let mut tape = CudaTape::new(SimDevice::new());
    tape.set_precision(Precision::Bf16);
    let leaves = random_leaves(&mut tape, &mut rnd, &[[n, p]; 3]);
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: causal(),
        fused: true,
    };
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    let launches = (tape.device().traffic() - before).launches;
    assert_eq!(launches, 5, "Q, K, V rounded, then the core's two passes");
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * n, n * p], "lse, Ō");
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(grown, 4 * (2 * n * p + heads * n), "y + lse + Ō, bytes");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 5, "the rounded core again");

    let dm = 6;
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [n, dm]];
    let leaves = random_leaves(&mut tape, &mut rnd, &shapes);
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&mha(heads, causal(), true), &leaves).unwrap();
    let launches = (tape.device().traffic() - before).launches;
    assert_eq!(
        launches, 9,
        "three projections, the rounded core, the output projection"
    );
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(
        lens,
        [n * p, n * p, n * p, n * p, heads * n, n * p],
        "Q, K, V, C, lse, Ō"
    );
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(
        grown,
        4 * (5 * n * p + heads * n + n * dm),
        "kept + y, bytes"
    );
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(
        recomputed - reused,
        8,
        "three projections and the rounded core"
    );

    // The peak of a forward and backward over n = 512, fused and composed.
    let (n, d) = (512, 8);
    let p = heads * d;
    let peak = |fused: bool| {
        let mut tape = CudaTape::new(SimDevice::new());
        tape.set_precision(Precision::Bf16);
        let leaves = random_leaves(&mut tape, &mut Gen::new(32), &[[n, p]; 3]);
        let base = tape.device().memory_usage().live_bytes;
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: Some(Mask::causal(n).unwrap()),
            fused,
        };
        let y = tape.apply(&op, &leaves).unwrap();
        let loss = tape.apply(&Op::Sum, &[y]).unwrap();
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let g = tape.backward_dense(loss, &seed).unwrap();
        let peak = tape.device().memory_usage().peak_bytes - base;
        tape.release_grads(g);
        peak
    };
    let scores = 4 * heads * n * n;
    let (fused, composed) = (peak(true), peak(false));
    assert!(
        fused < scores,
        "fused peak {fused} B, one score matrix {scores} B"
    );
    assert!(composed >= 3 * scores, "composed peak {composed} B");
}

/// On the tensor cores under autocast the kernels round Q, K, V and dO as they stage them
/// (`Flash::rounds_on_read`): a fused core's forward is its two passes alone and its backward
/// the two kernels (three and four rounding launches fewer than the FMA core's), and neither
/// holds rounded copies: the forward's peak is three operands' bytes below the FMA core's,
/// the backward's four. The same kept buffers (lse, Ō).
#[test]
fn on_the_tensor_cores_under_autocast_the_core_makes_no_rounded_copies() {
    let (heads, d, n) = (2, 8, 96);
    let p = heads * d;
    // (forward launches, forward peak growth, backward launches, backward peak growth, kept).
    let run = |products| {
        let mut dev = SimDevice::new();
        dev.set_flash_products(products);
        let mut tape = CudaTape::new(dev);
        tape.set_precision(Precision::Bf16);
        let leaves = random_leaves(&mut tape, &mut Gen::new(34), &[[n, p]; 3]);
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: Some(Mask::causal(n).unwrap()),
            fused: true,
        };
        let (before, base) = (tape.device().traffic(), tape.device().memory_usage());
        let y = tape.apply(&op, &leaves).unwrap();
        let forward = (tape.device().traffic() - before).launches;
        let forward_peak = tape.device().memory_usage().peak_bytes - base.live_bytes;
        let kept: Vec<usize> = tape
            .node(y)
            .unwrap()
            .cleanup()
            .iter()
            .map(|b| b.len())
            .collect();
        let seed = Tensor::new(&[n, p][..], vec![0.5; n * p]).unwrap();
        let seed = AnyBuffer::upload(tape.device_mut(), &seed).unwrap();
        let (before, live) = (
            tape.device().traffic(),
            tape.device().memory_usage().live_bytes,
        );
        let g = tape.backward_dense(y, &seed).unwrap();
        let backward = (tape.device().traffic() - before).launches;
        let backward_peak = tape.device().memory_usage().peak_bytes.saturating_sub(live);
        tape.release_grads(g);
        (forward, forward_peak, backward, backward_peak, kept)
    };
    let (fma, tc) = (run(FlashProducts::Fma), run(FlashProducts::Tf32x3));
    assert_eq!(tc.0, 2, "the two passes");
    assert_eq!(fma.0 - tc.0, 3, "three rounding launches fewer forward");
    assert_eq!(fma.2 - tc.2, 4, "four rounding launches fewer backward");
    let operand = 4 * n * p;
    assert_eq!(
        fma.1 - tc.1,
        3 * operand,
        "forward peak: the copies of Q, K, V"
    );
    assert!(
        fma.3 >= tc.3 + 4 * operand,
        "backward peak {} against {}",
        tc.3,
        fma.3
    );
    assert_eq!(tc.4, fma.4, "kept: lse, Ō");
    assert_eq!(tc.4, [heads * n, n * p]);
}

/// Under autocast a fused node that will not be differentiated (no operand requires grad)
/// computes no Ō: its first pass keeps each row's statistics alone. Its value is the
/// differentiated node's bit for bit, and its forward's peak is at least Ō's bytes lower.
#[test]
fn under_autocast_a_node_without_gradients_keeps_no_exact_output() {
    let (heads, d, n) = (2, 8, 96);
    let p = heads * d;
    let data: Vec<Tensor<f32>> = (0..3)
        .map(|k| {
            let v = inputs(&rect(1, n, n, heads, d), 40 + k)[0].clone();
            Tensor::new(&[n, p][..], v).unwrap()
        })
        .collect();
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal(n).unwrap()),
        fused: true,
    };
    let run = |requires_grad: bool| {
        let mut tape = CudaTape::new(SimDevice::new());
        tape.set_precision(Precision::Bf16);
        let ids: Vec<usize> = data
            .iter()
            .map(|t| tape.upload_leaf(t, None, requires_grad).unwrap())
            .collect();
        let base = tape.device().memory_usage().live_bytes;
        let y = tape.apply(&op, &ids).unwrap();
        let peak = tape.device().memory_usage().peak_bytes - base;
        let value: Tensor<f32> = tape.get(y).unwrap().download(tape.device()).unwrap();
        let kept = tape.node(y).unwrap().cleanup().len();
        (bits_of(value.data()), peak, kept)
    };
    let (with, peak_with, kept_with) = run(true);
    let (without, peak_without, kept_without) = run(false);
    assert_eq!(without, with, "the same value");
    assert_eq!((kept_with, kept_without), (2, 0), "lse and Ō, then nothing");
    assert!(
        peak_without + 4 * n * p <= peak_with,
        "peak {peak_without} B without gradients, {peak_with} B with"
    );
}

/// On the tape under autocast the fused core op is the rounded core bit for bit
/// (`flash_attention_rounded`, then the backward from its Ō, not from C), both from the
/// node's workspace and recomputed once the tape released it; a causal, grouped (4 query heads
/// over 2) case over keys of another length. With the device's `FlashProducts::Tf32x3` the
/// tape's core is the tensor cores' (in TF32 other bits than the FMA core's in the value or a
/// gradient: the setting reaches the autocast core).
#[test]
fn under_autocast_the_fused_core_op_on_the_tape_is_the_rounded_core() {
    let (nq, nk, heads, kv_heads, d) = (21, 37, 4, 2, 3);
    let case = case(
        "lower right 21 over 37, 4 over 2",
        grouped(1, nq, nk, heads, kv_heads, d),
        Some(Mask::causal_lower_right(nq, nk).unwrap()),
    );
    let data = inputs(&case.dims, 33);
    let settings = [
        (Precision::Bf16, FlashProducts::Fma),
        (Precision::Bf16, FlashProducts::Tf32x3),
        (Precision::Tf32, FlashProducts::Tf32x3),
    ];
    for (round, products) in settings {
        let how = (round, products);
        let want = run_core_with(&mut SimDevice::new(), &case, &data, how).unwrap();
        let fma = run_core_at(&mut SimDevice::new(), &case, &data, round).unwrap();
        if round == Precision::Tf32 {
            let seen = |x: &[Vec<f32>; 5]| [0, 2, 3, 4].map(|k| bits_of(&x[k]));
            assert_ne!(seen(&want), seen(&fma), "{how:?}: the FMA core's bits");
        }
        let mut dev = SimDevice::new();
        dev.set_flash_products(products);
        let mut tape = CudaTape::new(dev);
        tape.set_precision(round);
        let shapes = [
            [1, nq, heads * d],
            [1, nk, kv_heads * d],
            [1, nk, kv_heads * d],
        ];
        let ids: Vec<usize> = (0..3)
            .map(|k| {
                let t = Tensor::new(&shapes[k][..], data[k].clone()).unwrap();
                tape.upload_leaf(&t, None, true).unwrap()
            })
            .collect();
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: case.mask.clone(),
            fused: true,
        };
        let y = tape.apply(&op, &ids).unwrap();
        let value: Tensor<f32> = tape.get(y).unwrap().download(tape.device()).unwrap();
        assert_eq!(bits_of(value.data()), bits_of(&want[0]), "{how:?}: O");
        let seed = Tensor::new(&shapes[0][..], data[3].clone()).unwrap();
        for pass in ["workspace", "recomputed"] {
            let seed = AnyBuffer::upload(tape.device_mut(), &seed).unwrap();
            let g = tape.backward_dense(y, &seed).unwrap();
            for (k, name) in ["dQ", "dK", "dV"].into_iter().enumerate() {
                let got: Tensor<f32> = g[ids[k]].download(tape.device()).unwrap();
                let want = bits_of(&want[2 + k]);
                assert_eq!(bits_of(got.data()), want, "{how:?} {pass}: {name}");
            }
            tape.release_grads(g);
            seed.release(tape.device_mut());
        }
    }
}
