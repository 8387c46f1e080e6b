//! `scaledDotProductAttention` on the CUDA tape with keys of another length (nq ≠ nk), a
//! mask per batch element and keys of fewer heads (grouped queries): value and gradients
//! against the IR, the statistic it keeps, and the errors before launch.

use super::*;

/// `scaledDotProductAttention` of 2 heads of size 3 on q (batch, nq, P) and k, v
/// (batch, nk, P) under `mask`: [`check_sdpa_heads_on_the_tape`].
fn check_sdpa_on_the_tape(g: &mut Gen, batch: usize, nq: usize, nk: usize, mask: Option<Mask>) {
    check_sdpa_heads_on_the_tape(g, (2, 2), batch, (nq, nk), mask);
}

/// `scaledDotProductAttention` of `heads` query heads of size 3 on q (batch, nq, P) and k, v
/// (batch, nk, Pk) of `kv_heads` key heads under `mask`, fused and composed: the CUDA tape
/// (sim) against IR eval and backprop in f64 (check 1 and 2: the spec's reference) and in f32,
/// and fused against composed.
fn check_sdpa_heads_on_the_tape(
    g: &mut Gen,
    (heads, kv_heads): (usize, usize),
    batch: usize,
    (nq, nk): (usize, usize),
    mask: Option<Mask>,
) {
    let d = 3;
    let widths = (heads * d, kv_heads * d);
    let sdpa = |fused| Op::ScaledDotProductAttention {
        heads,
        mask: mask.clone(),
        fused,
    };
    let (graph, out) = sdpa_graph(sdpa(true), batch, (nq, nk), widths);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(g, &l.shape, Domain::Any))
        .collect();
    // IR in f32: the value and the gradients of q, k, v.
    let l32: Vec<Tensor<f32>> = leaves.iter().map(|t| t.cast()).collect();
    let seed = Tensor::scalar(1.0f32);
    let v32 = graph.eval(&l32, &[]).unwrap();
    let g32 = graph.backprop_all(&l32, &[], out, &seed).unwrap();
    let ir32: Vec<Tensor<f64>> = [&v32[out], &g32[0], &g32[1], &g32[2]]
        .iter()
        .map(|t| t.cast())
        .collect();
    let mut runs = Vec::new();
    let heads = format!("H {heads} Hk {kv_heads}");
    for fused in [true, false] {
        let what = format!("sdpa {heads} B {batch} nq {nq} nk {nk} fused {fused} {mask:?}");
        let (graph, out) = sdpa_graph(sdpa(fused), batch, (nq, nk), widths);
        check_graph(&what, &graph, &leaves, out, &Tensor::scalar(1.0));
        let got = sdpa_tape_run(&graph, out, &leaves);
        for (k, (a, b)) in got.iter().zip(&ir32).enumerate() {
            crate::common::close(a, b)
                .unwrap_or_else(|e| panic!("{what}: result {k} against IR f32: {e}"));
        }
        runs.push(got);
    }
    for (k, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        crate::common::close(a, b).unwrap_or_else(|e| {
            panic!(
                "{heads} B {batch} nq {nq} nk {nk} {mask:?}: result {k}, fused against \
                 composed: {e}"
            )
        });
    }
}

/// `scaledDotProductAttention` with keys of another length than the queries (nq = 7 over
/// nk = 23, nq = 19 over nk = 5 and one query row over 37 keys, a KV-cache step), fused and
/// composed, every mask form (none, key padding, causal lower right and upper left, lower
/// right with padding, a dense mask with fully masked rows): [`check_sdpa_on_the_tape`].
#[test]
fn scaled_dot_product_attention_takes_keys_of_another_length() {
    let mut g = Gen::new(31);
    for (nq, nk) in [(7, 23), (19, 5), (1, 37)] {
        let lr_pad = Mask::from_fn_rectangular(nq, nk, |i, j| {
            j as i64 <= i as i64 + nk as i64 - nq as i64 && j % 3 != 1
        })
        .unwrap();
        // Rows 0 and 4 (where there are) see nothing.
        let dense =
            Mask::from_fn_rectangular(nq, nk, |i, j| i != 0 && i != 4 && (i + 2 * j) % 3 != 0)
                .unwrap();
        let masks = [
            None,
            Some(Mask::from_fn_rectangular(nq, nk, |_, j| j % 4 != 2).unwrap()),
            Some(Mask::causal_lower_right(nq, nk).unwrap()),
            Some(Mask::causal_upper_left(nq, nk).unwrap()),
            Some(lr_pad),
            Some(dense),
        ];
        for mask in masks {
            check_sdpa_on_the_tape(&mut g, 2, nq, nk, mask);
        }
    }
}

/// `scaledDotProductAttention` under a mask of one (nq, nk) matrix per batch element (a padded
/// batch's key padding, PyTorch's `attn_mask` (B, 1, L, S)), B = 2 and 3, square and
/// rectangular: a key padding per sequence (one sequence of no keys), lower right causal with
/// it, and a dense mask whose row 5 sees nothing in element 1 only: [`check_sdpa_on_the_tape`]
/// (the IR's reference takes each element's matrix).
#[test]
fn scaled_dot_product_attention_takes_a_mask_per_batch_element() {
    let mut g = Gen::new(41);
    for (batch, nq, nk, lens) in [(3, 7, 23, &[23, 9, 0][..]), (2, 19, 19, &[19, 4][..])] {
        let lower = Some(nk as i64 - nq as i64);
        let masks = [
            padded(nq, nk, lens, None),
            padded(nq, nk, lens, lower),
            dense_batched(batch, nq, nk),
        ];
        for mask in masks {
            check_sdpa_on_the_tape(&mut g, batch, nq, nk, Some(mask));
        }
    }
}

/// A mask of 2 batch elements for operands of batch 3 is an error naming the op and both
/// batch sizes, fused or not, before anything is allocated or launched.
#[test]
fn a_mask_of_another_batch_is_an_error_naming_both_sizes() {
    let mut rnd = Gen::new(43);
    let mut tape = CudaTape::new(SimDevice::new());
    let (n, p) = (4, 6);
    let mut leaves = |shapes: &[&[usize]]| -> Vec<usize> {
        shapes
            .iter()
            .map(|s| {
                let t = draw(&mut rnd, &Shape::new(s), Domain::Any);
                tape.upload_leaf(&t, None, true).unwrap()
            })
            .collect()
    };
    let qkv = leaves(&[&[3, n, p][..]; 3]);
    let w = leaves(&[&[5, p], &[5, p], &[5, p], &[p, 5], &[3, n, 5]]);
    let mask = padded(n, n, &[4, 2], None);
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    for fused in [true, false] {
        let sdpa = Op::ScaledDotProductAttention {
            heads: 2,
            mask: Some(mask.clone()),
            fused,
        };
        for (op, leaves) in [(sdpa, &qkv), (mha(2, Some(mask.clone()), fused), &w)] {
            let e = tape.apply(&op, leaves).unwrap_err().to_string();
            assert!(
                e.contains(op.name()) && e.contains("2 batch") && e.contains("batch 3"),
                "{e}"
            );
        }
    }
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
}

/// A fused `scaledDotProductAttention` of nq queries over nk keys keeps one log-sum-exp per
/// query row (B·H·nq floats), its backward gives dK and dV of k's shape, with the same bits
/// from that workspace or recomputed; a mask made for other sizes is an error naming the op
/// and the sizes before anything is allocated or launched.
#[test]
fn the_fused_core_op_over_other_keys_keeps_one_statistic_per_query_row() {
    let mut rnd = Gen::new(37);
    let (heads, d, nq, nk) = (2, 3, 5, 41);
    let p = heads * d;
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &[[nq, p], [nk, p], [nk, p]]);
    let op = |mask| Op::ScaledDotProductAttention {
        heads,
        mask: Some(mask),
        fused: true,
    };
    let y = tape
        .apply(&op(Mask::causal_lower_right(nq, nk).unwrap()), &leaves)
        .unwrap();
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * nq], "lse");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 1, "the fused core again");

    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let e = tape
        .apply(&op(Mask::causal_lower_right(nk, nq).unwrap()), &leaves)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scaledDotProductAttention")
            && e.contains(&format!("({nk}, {nq})"))
            && e.contains(&nq.to_string())
            && e.contains(&nk.to_string()),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
}

/// `scaledDotProductAttention` with keys and values of fewer heads than the queries
/// (grouped-query attention: query head h reads key head h / (heads / kv_heads)): multi-query
/// (4 query heads over 1 key head) and groups of 2 and 3 (4 over 2, 6 over 3, 8 over 2), keys
/// of another length (7 over 23, 19 over 5) and the same (17, past the tile), with no mask, the
/// causal lower right and upper left, and a causal key padding per sequence (one sequence of no
/// keys): [`check_sdpa_heads_on_the_tape`], fused and composed against the IR (the spec's
/// reference) and each other.
#[test]
fn scaled_dot_product_attention_takes_keys_of_fewer_heads() {
    let mut g = Gen::new(47);
    for heads in [(4, 1), (4, 2), (6, 3), (8, 2)] {
        let runs = [
            (2, (7, 23), None),
            (2, (19, 5), Some(Mask::causal_lower_right(19, 5).unwrap())),
            (1, (17, 17), Some(Mask::causal(17).unwrap())),
            (3, (7, 23), Some(padded(7, 23, &[23, 9, 0], Some(16)))),
        ];
        for (batch, sizes, mask) in runs {
            check_sdpa_heads_on_the_tape(&mut g, heads, batch, sizes, mask);
        }
    }
}

/// A grouped `scaledDotProductAttention` node (6 query heads over 2 key heads, 5 queries over
/// 41 keys): fused, it keeps one log-sum-exp per query row (H·nq floats) and the backward gives
/// the same bits from it or with the core run again (one launch more); composed, it keeps the
/// (H, nq, nk) probabilities and its backward adds the two group sums (dK, dV) to the launches
/// of one key head per query head. Either way dK and dV have k's (nk, Pk) shape.
#[test]
fn a_grouped_node_keeps_what_the_ungrouped_keeps_and_gives_keys_their_shape() {
    let mut rnd = Gen::new(53);
    let (heads, kv_heads, d, nq, nk) = (6, 2, 3, 5, 41);
    let (p, pk) = (heads * d, kv_heads * d);
    let op = |fused| Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal_lower_right(nq, nk).unwrap()),
        fused,
    };
    // The launches of a backward from the workspace: grouped fused, grouped composed, then
    // composed with a key head per query head.
    let mut launches = Vec::new();
    for (fused, kv) in [(true, pk), (false, pk), (false, p)] {
        let mut tape = CudaTape::new(SimDevice::new());
        let leaves = random_leaves(&mut tape, &mut rnd, &[[nq, p], [nk, kv], [nk, kv]]);
        let y = tape.apply(&op(fused), &leaves).unwrap();
        let kept = tape.node(y).unwrap().cleanup().to_vec();
        let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
        let want = if fused { heads * nq } else { heads * nq * nk };
        assert_eq!(lens, [want], "fused {fused}: lse or the probabilities");
        let (reused, recomputed) =
            backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
        if fused {
            assert_eq!(recomputed - reused, 1, "the fused core again");
        }
        launches.push(reused);
        let loss = tape.apply(&Op::Sum, &[y]).unwrap();
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let grads = tape.backward_dense(loss, &seed).unwrap();
        for (&id, shape) in leaves.iter().zip([[nq, p], [nk, kv], [nk, kv]]) {
            assert_eq!(grads[id].shape(), &Shape::new(&shape), "fused {fused}");
        }
        tape.release_grads(grads);
    }
    assert_eq!(launches[1], launches[2] + 2, "the group sums of dK and dV");
}

/// k (and v) whose width is not kv_heads·d for a kv_heads dividing heads (P = 12 of 4 heads,
/// d = 3: a width of 9 is 3 key heads, which do not divide 4; 4 is not a multiple of d) is the
/// spec's shape error naming the op and the width, fused or not, before anything is allocated
/// or launched; on the device, sizes whose kv_heads do not divide heads, and K or V of another
/// length than B·nk·Hk·d, are errors naming the primitive before launch.
#[test]
fn keys_of_a_width_no_group_of_heads_has_are_refused_before_launch() {
    let mut rnd = Gen::new(59);
    let mut tape = CudaTape::new(SimDevice::new());
    let (heads, n) = (4, 5);
    let q = random_leaves(&mut tape, &mut rnd, &[[n, 12]])[0];
    for pk in [9, 4] {
        let kv = random_leaves(&mut tape, &mut rnd, &[[n, pk], [n, pk]]);
        let live = tape.device().memory_usage().live_bytes;
        let launches = tape.device().traffic().launches;
        let nodes = tape.len();
        for fused in [true, false] {
            let op = Op::ScaledDotProductAttention {
                heads,
                mask: None,
                fused,
            };
            let e = tape.apply(&op, &[q, kv[0], kv[1]]).unwrap_err().to_string();
            assert!(
                e.contains("scaledDotProductAttention")
                    && e.contains(&format!("Pk = {pk}"))
                    && e.contains("kv_heads"),
                "{e}"
            );
        }
        assert_eq!(tape.device().memory_usage().live_bytes, live);
        assert_eq!(tape.device().traffic().launches, launches);
        assert_eq!(tape.len(), nodes);
    }
    // The device's own checks.
    let mut dev = SimDevice::new();
    let dims = grouped(1, 5, 7, 6, 4, 2);
    let q = dev.upload(&vec![0.5; dims.q_len()]).unwrap();
    let k = dev.upload(&[0.5; 7 * 2 * 2]).unwrap();
    let live = dev.memory_usage().live_bytes;
    let launches = dev.traffic().launches;
    let flash = |dims| Flash::new(dims, FlashMask::none());
    let e = dev
        .flash_attention([q, k, k], &flash(dims))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flash_attention") && e.contains("kv_heads = 4") && e.contains("heads = 6"),
        "{e}"
    );
    // 3 key heads of 2: K must have 7·3·2 = 42 elements, not the 28 of 2 key heads.
    let e = dev
        .flash_attention([q, k, k], &flash(grouped(1, 5, 7, 6, 3, 2)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 28 element(s), expected 42"), "{e}");
    let e = dev
        .flash_attention_bwd([q, k, k], q, q, q, &flash(grouped(1, 5, 7, 6, 1, 2)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 28 element(s), expected 14"), "{e}");
    assert_eq!(dev.memory_usage().live_bytes, live, "nothing allocated");
    assert_eq!(dev.traffic().launches, launches, "nothing launched");
}
