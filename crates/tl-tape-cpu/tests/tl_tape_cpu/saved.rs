//! What a forward keeps for its backward (`ops::forward_saving`, `Node::saved`): attention's
//! Q, K, V, C and (unfused) probabilities, and gelu's tanh term, on the tape give the same
//! values and cotangents, bit for bit, as the kernels that compute them again
//! (`ops::backward`); only nodes that require grad keep anything, and a list that does not fit
//! is an error naming the op.

use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Shape, Tensor};
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
    // n = 130 with the fused bound: blocks of 126 and 4 query rows.
    for (batch, n, heads, masked) in [(1, 9, 3, false), (2, 17, 2, true), (2, 130, 4, true)] {
        let dm = 4 * heads;
        let x = mha_inputs(&mut rng, batch, n, dm);
        for fused in [false, true] {
            let mask = masked.then(|| Mask::causal(n));
            let op = Op::MultiHeadAttention { heads, mask, fused };
            let qkvc = vec![batch * n * dm; 4];
            let mut kept = qkvc.clone();
            if !fused {
                kept.push(batch * heads * n * n);
            }
            check::<f32>(&op, &x, &kept);
            check::<f64>(&op, &x, &kept);
        }
    }
}

#[test]
fn gelu_reads_its_kept_tanh_with_the_recomputed_bits() {
    let mut rng = Rng(0x9e1);
    // Values where the tanh switches branch (|u| = 0.625) and saturates (sech² = 0).
    let special = [
        0.0, -0.0, 0.55, -0.55, 0.6, 3.0, -3.0, 9.5, -9.5, 30.0, -30.0, 1e8,
    ];
    let mut x = random(&mut rng, &Shape::new(&[3, 37]), Dom::Wide(6.0));
    let data: Vec<f64> = x
        .data()
        .iter()
        .enumerate()
        .map(|(i, &v)| special.get(i).copied().unwrap_or(v))
        .collect();
    x = Tensor::new(x.shape().clone(), data).unwrap();
    check::<f32>(&Op::Gelu, std::slice::from_ref(&x), &[3 * 37]);
    check::<f64>(&Op::Gelu, &[x], &[3 * 37]);
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
    let short = &saved[..4]; // the fused form's list for an unfused op
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
