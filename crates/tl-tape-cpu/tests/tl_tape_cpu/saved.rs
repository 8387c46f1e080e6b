//! What a forward keeps for its backward (`ops::forward_saving`, `Node::saved`): attention's
//! Q, K, V, C and probabilities (fused and memory-lean: each row's softmax statistics), the norms' mean and
//! rstd per group, cross-entropy's log-sum-exp per row, gelu's tanh term and safeLog's
//! `softplus(x) + ε`, on the tape give the same
//! values and cotangents, bit for bit, as the kernels that compute them again
//! (`ops::backward`); only nodes that require grad keep anything, and a list that does not fit
//! is an error naming the op.

use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::gates::{Gates, force};
use tl_tape_cpu::{Tape, ops};

use crate::common::{Dom, Rng, kernel_bits, random};

fn mha_inputs(rng: &mut Rng, batch: usize, n: usize, dm: usize) -> Vec<Tensor<f64>> {
    let w = |rng: &mut Rng| random(rng, &Shape::new(&[dm, dm]), Dom::Wide(0.5));
    let mut x = vec![w(rng), w(rng), w(rng), w(rng)];
    let xs = if batch == 1 {
        vec![n, dm]
    } else {
        vec![batch, n, dm]
    };
    x.push(random(rng, &Shape::new(&xs), Dom::Any));
    x
}

/// The tape's value and cotangents (reading what the forward kept) as bits, and the kept
/// buffers' lengths.
fn tape_bits<T: Scalar>(op: &Op, x: &[Tensor<T>], g: &Tensor<T>) -> (Vec<Vec<u64>>, Vec<usize>) {
    let mut tape = Tape::<T>::new();
    let ids: Vec<usize> = x.iter().map(|t| tape.leaf(t.clone(), None, true)).collect();
    let y = tape.apply(op, &ids).unwrap();
    let kept = tape.node(y).unwrap().saved().iter().map(Vec::len).collect();
    let grads = tape.backward_dense(y, g).unwrap();
    let bits = |t: &Tensor<T>| t.data().iter().map(|v| v.as_f64().to_bits()).collect();
    let mut out = vec![bits(tape.get(y).unwrap())];
    out.extend(ids.iter().map(|&i| bits(&grads[i])));
    (out, kept)
}

fn check<T: Scalar>(op: &Op, x: &[Tensor<f64>], expect_kept: &[usize]) {
    let x: Vec<Tensor<T>> = x.iter().map(|t| t.cast()).collect();
    let xr: Vec<&Tensor<T>> = x.iter().collect();
    let y = ops::forward(op, &xr, &[]).unwrap();
    let g = random(&mut Rng(7), y.shape(), Dom::Any).cast::<T>();
    let (tape, kept) = tape_bits(op, &x, &g);
    assert_eq!(kept, expect_kept, "{op:?}: kept buffers");
    assert_eq!(
        tape,
        kernel_bits(op, &x, &g),
        "{op:?}: tape (kept) vs kernels (recomputed)"
    );
}

#[test]
fn attention_reads_what_its_forward_kept_with_the_recomputed_bits() {
    let mut rng = Rng(0x5a7ed);
    // A mask with a row that allows nothing (its probabilities are zeros; the kept max is −∞).
    let holed = |n: usize| Mask::from_fn(n, |i, j| i != 3 && j <= i).unwrap();
    // n = 130 with the fused bound: blocks of 126 and 4 query rows.
    let cases = [
        (1, 9, 3, None),
        (2, 17, 2, Some(Mask::causal(17).unwrap())),
        (1, 11, 2, Some(holed(11))),
        (2, 130, 4, Some(Mask::causal(130).unwrap())),
    ];
    // The fused op memory-lean at every size (forced), and as production decides: at these
    // sizes it keeps the probabilities as the unfused op does.
    let lean_everywhere = Gates {
        fused_keep_max: Some(0),
        ..Gates::DEFAULT
    };
    for (batch, n, heads, mask) in cases {
        let dm = 4 * heads;
        let x = mha_inputs(&mut rng, batch, n, dm);
        for (fused, lean) in [(false, false), (true, false), (true, true)] {
            let op = Op::MultiHeadAttention {
                heads,
                mask: mask.clone(),
                fused,
            };
            let _g = lean.then(|| force(lean_everywhere));
            check::<f32>(&op, &x, &kept_lens(batch, n, heads, lean));
            check::<f64>(&op, &x, &kept_lens(batch, n, heads, lean));
        }
    }
}

/// What a `multiHeadAttention` of `dm = 4·heads` keeps: Q, K, V, C, then the row statistics
/// when memory-lean, else the probabilities.
fn kept_lens(batch: usize, n: usize, heads: usize, lean: bool) -> Vec<usize> {
    let mut kept = vec![batch * n * 4 * heads; 4];
    kept.push(match lean {
        true => batch * heads * n * 2,
        false => batch * heads * n * n,
    });
    kept
}

#[test]
fn fused_attention_runs_memory_lean_only_past_the_probabilities_it_keeps() {
    // B·heads·n² just past FUSED_KEEP_MAX: the fused op keeps row statistics; one row fewer
    // and it keeps the probabilities (the unfused op keeps them at every size).
    let max = ops::attention::core::FUSED_KEEP_MAX;
    let (batch, heads) = (2, 2);
    let n_past = (1..).find(|&n| batch * heads * n * n > max).unwrap();
    let mut rng = Rng(0x1ea7);
    for (n, lean) in [(n_past - 1, false), (n_past, true)] {
        let x = mha_inputs(&mut rng, batch, n, 4 * heads);
        let op = Op::MultiHeadAttention {
            heads,
            mask: Some(Mask::causal(n).unwrap()),
            fused: true,
        };
        check::<f32>(&op, &x, &kept_lens(batch, n, heads, lean));
    }
}

#[test]
fn attention_kept_statistics_carry_infinite_and_nan_scores_as_the_forward_made_them() {
    // A token of 1e20 makes f32 scores of ±∞ (rows whose max is +∞: NaN probabilities), and a
    // NaN token NaN scores; the fused backward's rows made from the kept statistics must carry
    // them exactly as the forward made them (a NaN row's masked entries included).
    let mut rng = Rng(0x1f);
    let (n, heads) = (7, 2);
    let mut x = mha_inputs(&mut rng, 1, n, 4 * heads);
    let mut data = x[4].data().to_vec();
    data[2 * 4 * heads + 1] = 1e20;
    data[5 * 4 * heads] = f64::NAN;
    x[4] = Tensor::new(x[4].shape().clone(), data).unwrap();
    for mask in [None, Some(Mask::causal(n).unwrap())] {
        let op = Op::MultiHeadAttention {
            heads,
            mask,
            fused: true,
        };
        let _g = force(Gates {
            fused_keep_max: Some(0),
            ..Gates::DEFAULT
        });
        check::<f32>(&op, &x, &kept_lens(1, n, heads, true));
    }
}

/// `x` with its first elements replaced by `special`.
fn with_first(x: Tensor<f64>, special: &[f64]) -> Tensor<f64> {
    let data = x.data().iter().enumerate();
    let data = data.map(|(i, &v)| special.get(i).copied().unwrap_or(v));
    Tensor::new(x.shape().clone(), data.collect()).unwrap()
}

#[test]
fn gelu_reads_its_kept_tanh_with_the_recomputed_bits() {
    let mut rng = Rng(0x9e1);
    // Values where the tanh switches branch (|u| = 0.625) and saturates (sech² = 0).
    let special = [
        0.0, -0.0, 0.55, -0.55, 0.6, 3.0, -3.0, 9.5, -9.5, 30.0, -30.0, 1e8,
    ];
    let x = with_first(
        random(&mut rng, &Shape::new(&[3, 37]), Dom::Wide(6.0)),
        &special,
    );
    check::<f32>(&Op::Gelu, std::slice::from_ref(&x), &[3 * 37]);
    check::<f64>(&Op::Gelu, &[x], &[3 * 37]);
}

#[test]
fn safe_log_reads_its_kept_softplus_with_the_recomputed_bits() {
    let mut rng = Rng(0x5af);
    // Where softplus switches branch (e^{−|x|} = √2 − 1 near |x| = 0.88), underflows to
    // e^{−|x|} (x = −30), is x itself (x = 30) and where softplus + ε is ε alone (x = −120).
    let special = [
        0.0, -0.0, 0.88, -0.88, 0.881, -30.0, 30.0, -120.0, 1e8, -1e8,
    ];
    let x = with_first(
        random(&mut rng, &Shape::new(&[4, 29]), Dom::Wide(8.0)),
        &special,
    );
    for eps in [1e-6, 0.5] {
        let op = Op::SafeLog { eps };
        check::<f32>(&op, std::slice::from_ref(&x), &[4 * 29]);
        check::<f64>(&op, std::slice::from_ref(&x), &[4 * 29]);
    }
}

#[test]
fn norms_read_their_kept_mean_and_rstd_with_the_recomputed_bits() {
    let mut rng = Rng(0x1a7);
    // layerNorm over rows of 64 (the row kernels) and of 5 (a ragged tail), batch norm over
    // 3 channels of a (2, 3, 4, 5) batch; a constant row (variance 0) and a wide one.
    for (dims, c, batch) in [
        (vec![6, 64], 64, false),
        (vec![3, 2, 5], 5, false),
        (vec![2, 3, 4, 5], 3, true),
    ] {
        let mut x = random(&mut rng, &Shape::new(&dims), Dom::Wide(40.0));
        let mut data = x.data().to_vec();
        data[..c].fill(0.75);
        x = Tensor::new(x.shape().clone(), data).unwrap();
        let gamma = random(&mut rng, &Shape::new(&[c]), Dom::Any);
        let beta = random(&mut rng, &Shape::new(&[c]), Dom::Any);
        let (op, groups) = match batch {
            true => (Op::BatchNorm { eps: 1e-5 }, c),
            false => (Op::LayerNorm { eps: 1e-5 }, x.numel() / c),
        };
        let inputs = [x, gamma, beta];
        check::<f32>(&op, &inputs, &[2 * groups]);
        check::<f64>(&op, &inputs, &[2 * groups]);
    }
}

#[test]
fn cross_entropy_reads_its_kept_log_sum_exp_with_the_recomputed_bits() {
    // 5 rows of 7 classes (one label out of range: no loss, no gradient), labels at 2.. in the
    // Nat environment; a row with a large logit (the max shift matters).
    let mut rng = Rng(0xce);
    let mut x = random(&mut rng, &Shape::new(&[5, 7]), Dom::Wide(8.0));
    let mut data = x.data().to_vec();
    data[9] = 80.0;
    x = Tensor::new(x.shape().clone(), data).unwrap();
    let nats = vec![9, 9, 3, 0, 6, 7, 1];
    let op = Op::CrossEntropy { labels_at: 2 };
    fn bits<T: Scalar>(op: &Op, x: &Tensor<f64>, nats: &[usize]) {
        let x: Tensor<T> = x.cast();
        let g = Tensor::scalar(T::lit(0.7));
        let mut tape = Tape::<T>::new();
        tape.set_nats(nats.to_vec());
        let id = tape.leaf(x.clone(), None, true);
        let y = tape.apply(op, &[id]).unwrap();
        let kept: Vec<usize> = tape.node(y).unwrap().saved().iter().map(Vec::len).collect();
        assert_eq!(kept, [5]);
        let taped = tape.backward_dense(y, &g).unwrap().swap_remove(id);
        let yk = ops::forward(op, &[&x], nats).unwrap();
        let recomputed = ops::backward(op, &[&x], &yk, &g, nats).unwrap();
        let b = |t: &Tensor<T>| {
            t.data()
                .iter()
                .map(|v| v.as_f64().to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(b(tape.get(y).unwrap()), b(&yk));
        assert_eq!(b(&taped), b(recomputed[0].as_ref().unwrap()));
        // A list that does not fit is an error naming the op.
        let e = ops::backward_needed(op, &[&x], &yk, &g, &[true], nats, &[vec![T::zero(); 4]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("crossEntropy") && e.contains("saved"), "{e}");
    }
    bits::<f32>(&op, &x, &nats);
    bits::<f64>(&op, &x, &nats);
}

#[test]
fn only_nodes_that_require_grad_keep_anything() {
    let mut rng = Rng(0x5a7);
    let x: Vec<Tensor<f32>> = mha_inputs(&mut rng, 1, 8, 8)
        .iter()
        .map(|t| t.cast())
        .collect();
    let op = Op::MultiHeadAttention {
        heads: 2,
        mask: None,
        fused: false,
    };
    let mut tape = Tape::<f32>::new();
    let frozen: Vec<usize> = x
        .iter()
        .map(|t| tape.leaf(t.clone(), None, false))
        .collect();
    let y = tape.apply(&op, &frozen).unwrap();
    assert!(tape.node(y).unwrap().saved().is_empty());
    let live: Vec<usize> = x.iter().map(|t| tape.leaf(t.clone(), None, true)).collect();
    let y2 = tape.apply(&op, &live).unwrap();
    assert_eq!(tape.node(y2).unwrap().saved().len(), 5);
    // Another op keeps nothing.
    let s = tape.apply(&Op::Sum, &[y2]).unwrap();
    assert!(tape.node(s).unwrap().saved().is_empty());
    // The values of both nodes agree (the kept form computes the same forward).
    assert_eq!(tape.get(y).unwrap().data(), tape.get(y2).unwrap().data());
}

#[test]
fn a_kept_list_that_does_not_fit_is_an_error_naming_the_op() {
    let mut rng = Rng(0xbad);
    let x: Vec<Tensor<f64>> = mha_inputs(&mut rng, 1, 6, 4);
    let xr: Vec<&Tensor<f64>> = x.iter().collect();
    let op = Op::MultiHeadAttention {
        heads: 2,
        mask: None,
        fused: false,
    };
    let (y, saved) = ops::forward_saving(&op, &xr, &[]).unwrap();
    assert_eq!(saved.len(), 5);
    let g = Tensor::<f64>::zeros(y.shape().clone());
    let short = &saved[..4]; // one buffer short
    let e = ops::backward_needed(&op, &xr, &y, &g, &[true; 5], &[], short)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("saved"),
        "{e}"
    );
    let xg = Tensor::<f64>::zeros([4]);
    let e = ops::backward_needed(&Op::Gelu, &[&xg], &xg, &xg, &[true], &[], &saved[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("gelu") && e.contains("saved"), "{e}");
    let x = Tensor::<f64>::zeros([3, 4]);
    let gb = Tensor::<f64>::zeros([4]);
    let ln = Op::LayerNorm { eps: 1e-5 };
    let e = ops::backward_needed(&ln, &[&x, &gb, &gb], &x, &x, &[true; 3], &[], &saved[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("layerNorm") && e.contains("saved"), "{e}");
    // saved[0] has the attention input's length (24), not the safeLog operand's (4).
    let sl = Op::SafeLog { eps: 1e-6 };
    let e = ops::backward_needed(&sl, &[&xg], &xg, &xg, &[true], &[], &saved[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("safeLog") && e.contains("saved"), "{e}");
    // An elementwise op that keeps nothing refuses a kept list rather than ignoring it.
    let e = ops::elementwise::backward_saved(&Op::Exp, &[&xg], &xg, &xg, &[vec![0.0; 4]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("exp") && e.contains("saved"), "{e}");
}

#[test]
fn scores_beyond_the_allocation_cap_are_an_error_before_any_is_allocated() {
    // 200 000 tokens of one 1-wide head: the value is 200 000 floats, but the unfused scores
    // (and the kept probabilities) are 4·10¹⁰ floats, 160 GB: refused, not aborted.
    let n = 200_000;
    let w = Tensor::<f32>::new([1, 1], vec![0.5]).unwrap();
    let x = Tensor::<f32>::new([n, 1], vec![0.25; n]).unwrap();
    let op = Op::MultiHeadAttention {
        heads: 1,
        mask: None,
        fused: false,
    };
    let args = [&w, &w, &w, &w, &x];
    let e = ops::forward(&op, &args, &[]).unwrap_err().to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("allocation cap"),
        "{e}"
    );
    let mut tape = Tape::<f32>::new();
    let ids: Vec<usize> = args
        .iter()
        .map(|t| tape.leaf((*t).clone(), None, true))
        .collect();
    let e = tape.apply(&op, &ids).unwrap_err().to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("allocation cap"),
        "{e}"
    );
    assert_eq!(tape.len(), 5, "a failed apply leaves the tape unchanged");
}
