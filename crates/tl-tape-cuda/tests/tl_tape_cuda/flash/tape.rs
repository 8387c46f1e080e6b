//! `multiHeadAttention { fused: true }` on the CUDA tape: value and gradients against IR
//! eval and backprop and the composed path, the memory a node keeps, its launches, and a head
//! past the kernels.

use super::*;

/// The fused op on the CUDA tape (sim) against the IR (check 1 and 2), for lengths that are
/// not multiples of the tile, every mask form, a fully masked row; under masks of one matrix
/// per batch element, fused and composed.
#[test]
fn the_fused_op_on_the_tape_matches_ir_eval_and_backprop() {
    let mut g = Gen::new(5);
    let odd = Mask::from_fn(19, |i, j| i != 4 && (i + 2 * j) % 3 != 0).unwrap();
    let pad = Mask::from_fn(19, |_, j| j != 0 && j != 11).unwrap();
    let both = Mask::from_fn(19, |i, j| j <= i && j != 3).unwrap();
    for mask in [
        None,
        Some(Mask::causal(19).unwrap()),
        Some(pad),
        Some(both),
        Some(odd),
    ] {
        let (graph, out) = mha_graph(mha(2, mask.clone(), true), 2, 19, 5, 6);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        check_graph(
            &format!("fused attention {mask:?}"),
            &graph,
            &leaves,
            out,
            &Tensor::scalar(1.0),
        );
    }
    // One mask per sequence: causal with a key padding (element 1 keeps 11 of 19 positions),
    // and dense with row 5 fully masked in element 1 only; fused and composed.
    for mask in [padded(19, 19, &[19, 11], Some(0)), dense_batched(2, 19, 19)] {
        for fused in [true, false] {
            let (graph, out) = mha_graph(mha(2, Some(mask.clone()), fused), 2, 19, 5, 6);
            let leaves: Vec<Tensor<f64>> = graph
                .leaves()
                .iter()
                .map(|l| draw(&mut g, &l.shape, Domain::Any))
                .collect();
            check_graph(
                &format!("attention fused {fused} {mask:?}"),
                &graph,
                &leaves,
                out,
                &Tensor::scalar(1.0),
            );
        }
    }
}

/// The fused op on a tape whose device runs the f32 forward on the tensor cores
/// (`SimDevice::set_flash_products(FlashProducts::Tf32x3)`): value and every gradient against
/// the IR's eval and backprop, for `multiHeadAttention` (masks of every form, a fully masked
/// row, lengths of several steps of 64 keys) and `scaledDotProductAttention` with keys of
/// another length and fewer heads; a head past 64 takes the FMA forward (the same bits as a
/// tape without the setting). And the setting reaches the node: the value differs from the
/// FMA tape's in its bits.
#[test]
fn on_the_tensor_cores_the_fused_op_matches_ir_eval_and_backprop() {
    use crate::common::check_graph_on_tape;
    let tc_tape = || {
        let mut d = SimDevice::new();
        d.set_flash_products(FlashProducts::Tf32x3);
        CudaTape::new(d)
    };
    let mut g = Gen::new(11);
    let n = 70;
    let both = Mask::from_fn(n, |i, j| j <= i && j % 9 != 4 && i != 6).unwrap();
    for mask in [None, Some(Mask::causal(n).unwrap()), Some(both)] {
        let (graph, out) = mha_graph(mha(2, mask.clone(), true), 2, n, 5, 8);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        let what = format!("tensor-core attention {mask:?}");
        check_graph_on_tape(tc_tape(), &what, &graph, &leaves, out, &Tensor::scalar(1.0));
        // The setting reaches the node: O's bits differ from the FMA forward's.
        let value = |tape| node_bits(tape, &graph, &leaves, out - 2);
        assert_ne!(
            value(tc_tape()),
            value(CudaTape::new(SimDevice::new())),
            "{what}: the tensor-core tape gave the FMA forward's bits"
        );
    }
    // A head of 72 (past 64): the FMA forward, bit for bit.
    let (graph, out) = mha_graph(mha(1, None, true), 1, 20, 5, 72);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(&mut g, &l.shape, Domain::Any))
        .collect();
    let value = |tape| node_bits(tape, &graph, &leaves, out - 2);
    assert_eq!(value(tc_tape()), value(CudaTape::new(SimDevice::new())));
    let op = Op::ScaledDotProductAttention {
        heads: 4,
        mask: Some(Mask::causal_lower_right(20, 70).unwrap()),
        fused: true,
    };
    // 4 query heads of 16 over 2 key heads.
    let (graph, out) = sdpa_graph(op, 2, (20, 70), (64, 32));
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(&mut g, &l.shape, Domain::Any))
        .collect();
    check_graph_on_tape(
        tc_tape(),
        "tensor-core sdpa",
        &graph,
        &leaves,
        out,
        &Tensor::scalar(1.0),
    );
}

/// fused = composed on the CUDA tape, value and every gradient (both within the f32
/// tolerance of each other; the summation orders differ).
#[test]
fn the_fused_and_composed_paths_agree_on_the_tape() {
    let mut g = Gen::new(9);
    for mask in [None, Some(Mask::causal(21).unwrap())] {
        let (graph, _) = mha_graph(mha(2, None, true), 2, 21, 6, 8);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        let fused = tape_run(&mha(2, mask.clone(), true), &leaves);
        let composed = tape_run(&mha(2, mask.clone(), false), &leaves);
        for (k, (a, b)) in fused.iter().zip(&composed).enumerate() {
            crate::common::close(a, b).unwrap_or_else(|e| panic!("{mask:?} result {k}: {e}"));
        }
        // Deterministic: a second run gives the same bits.
        let again = tape_run(&mha(2, mask.clone(), true), &leaves);
        for (a, b) in fused.iter().zip(&again) {
            assert_eq!(
                a.data(),
                b.data(),
                "{mask:?}: not bit-identical across runs"
            );
        }
    }
}

/// The fused node keeps Q, K, V, C and one log-sum-exp per row (no (n, n) buffer), runs one
/// core launch forward and two backward, and its backward recomputes only Q, K, V, C and the
/// statistics once the workspace is gone.
#[test]
fn the_fused_node_keeps_o_n_floats_and_runs_three_core_launches() {
    let mut rnd = Gen::new(23);
    let (dm, p, heads, n) = (6, 4, 2, 37);
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [n, dm]];
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &shapes);
    let op = mha(heads, Some(Mask::causal(n).unwrap()), true);
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    // Three projections, the fused core, the output projection.
    assert_eq!((tape.device().traffic() - before).launches, 5);
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(
        lens,
        [n * p, n * p, n * p, n * p, heads * n],
        "Q, K, V, C, lse"
    );
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(
        grown,
        4 * (4 * n * p + heads * n + n * dm),
        "kept + y, bytes"
    );
    assert!(
        grown < 4 * heads * n * n,
        "less than one (heads, n, n) score matrix"
    );
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(
        recomputed - reused,
        4,
        "three projections and the fused core"
    );
}

/// A head the kernels do not take is an error naming the op before anything runs; the
/// composed path takes it.
#[test]
fn a_head_past_the_kernel_is_an_error_and_the_composed_path_runs_it() {
    let (dm, heads, p) = (3, 1, FLASH_MAX_HEAD + 1);
    let mut g = Gen::new(4);
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [2, dm]];
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves: Vec<usize> = shapes
        .iter()
        .map(|s| {
            tape.upload_leaf(&draw(&mut g, &Shape::new(s), Domain::Any), None, true)
                .unwrap()
        })
        .collect();
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let nodes = tape.len();
    let e = tape
        .apply(&mha(heads, None, true), &leaves)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("d = 129") && e.contains("fused = false"),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
    assert_eq!(tape.len(), nodes);
    assert!(tape.apply(&mha(heads, None, false), &leaves).is_ok());
}

/// `scaledDotProductAttention`, fused: one launch forward (no projection around the core),
/// the node keeps each row's log-sum-exp only (q, k, v are its operands, C its value: no (n, n)
/// buffer), the backward gives the same bits from that workspace or with the core run again
/// (one launch more); a head past the kernels is an error naming the op before anything is
/// allocated or launched, which the composed path takes.
#[test]
fn the_fused_core_op_keeps_the_log_sum_exp_only() {
    let mut rnd = Gen::new(29);
    let (heads, d, n) = (2, 3, 37);
    let p = heads * d;
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &[[n, p]; 3]);
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal(n).unwrap()),
        fused: true,
    };
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    assert_eq!(
        (tape.device().traffic() - before).launches,
        1,
        "the core alone"
    );
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * n], "lse");
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(grown, 4 * (n * p + heads * n), "y + lse, bytes");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 1, "the fused core again");

    let wide = |fused: bool| Op::ScaledDotProductAttention {
        heads: 1,
        mask: None,
        fused,
    };
    let q = random_leaves(&mut tape, &mut rnd, &[[3, FLASH_MAX_HEAD + 1]; 3]);
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let e = tape.apply(&wide(true), &q).unwrap_err().to_string();
    assert!(
        e.contains("scaledDotProductAttention") && e.contains("d = 129"),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
    assert!(tape.apply(&wide(false), &q).is_ok());
}
