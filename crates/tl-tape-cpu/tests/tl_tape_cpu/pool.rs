//! Buffer reuse (`tl_spec::pool`): a tape cleared between passes runs the next pass in the last
//! one's buffers, with the same bits as a fresh tape, and never hands out storage that is still
//! readable elsewhere.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cpu::Tape;

use crate::common::{Rng, pool2d};

/// The f32 values of a small conv → gelu → linear → mul/add/exp → sum network.
struct Inputs {
    w_conv: Tensor<f32>,
    b_conv: Tensor<f32>,
    x: Tensor<f32>,
    w_lin: Tensor<f32>,
    b_lin: Tensor<f32>,
}

fn uniform(rng: &mut Rng, dims: &[usize]) -> Tensor<f32> {
    Tensor::from_fn(dims, |_| rng.uniform(-1.0, 1.0) as f32)
}

fn inputs(seed: u64) -> Inputs {
    let mut rng = Rng(seed);
    Inputs {
        w_conv: uniform(&mut rng, &[4, 2, 3, 3]),
        b_conv: uniform(&mut rng, &[4]),
        x: uniform(&mut rng, &[3, 2, 9, 9]),
        w_lin: uniform(&mut rng, &[5, 4 * 9 * 9]),
        b_lin: uniform(&mut rng, &[5]),
    }
}

/// Record the network on `t` (cleared first), run sparse backward for the weights; every value
/// and the weights' gradients, as bits.
fn pass(t: &mut Tape<f32>, i: &Inputs) -> Vec<Vec<u32>> {
    let (loss, wanted) = record(t, i);
    let grads = t
        .backward_params(loss, &Tensor::scalar(1.0), &wanted)
        .unwrap();
    let bits = |v: &Tensor<f32>| v.data().iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut out: Vec<Vec<u32>> = (0..t.len()).map(|id| bits(t.get(id).unwrap())).collect();
    out.extend(wanted.iter().map(|w| bits(&grads[w])));
    out
}

#[test]
fn a_cleared_tape_reruns_in_its_own_buffers_with_the_same_bits() {
    let mut kept = Tape::new();
    let mut held = Vec::new();
    for step in 0..8 {
        let i = inputs(step);
        let before = kept.pool_stats();
        let reused = pass(&mut kept, &i);
        let fresh = pass(&mut Tape::new(), &i);
        assert_eq!(reused, fresh, "step {step}: a reused buffer changed a bit");
        let after = kept.pool_stats();
        if step >= 1 {
            // Every buffer of the pass (8 op outputs, the backward pass's cotangents and
            // workspaces) comes from the last pass's: no request goes to the system allocator.
            assert_eq!(after.missed, before.missed, "step {step}: {after:?}");
            assert!(after.reused - before.reused > 8, "step {step}: {after:?}");
        }
        held.push(after.held);
    }
    // What the pool keeps stops growing once the idle buffers start being trimmed.
    let steady = held[tl_spec::pool::IDLE_TRIMS as usize + 1];
    assert!(held.iter().all(|&h| h <= steady), "{held:?}");
}

#[test]
fn storage_still_read_elsewhere_is_never_reused() {
    let mut t = Tape::new();
    let first = pass(&mut t, &inputs(1));
    // Hold every value of the first pass, as a caller reading them would.
    let held: Vec<Tensor<f32>> = (0..t.len()).map(|id| t.get(id).unwrap().clone()).collect();
    for seed in 2..5 {
        pass(&mut t, &inputs(seed));
    }
    let now: Vec<Vec<u32>> = held
        .iter()
        .map(|v| v.data().iter().map(|f| f.to_bits()).collect())
        .collect();
    assert_eq!(now, first[..held.len()], "a held value was overwritten");
}

#[test]
fn gradients_handed_back_are_reused_and_a_clone_keeps_its_pool_empty() {
    let mut t = Tape::new();
    let x = t.leaf(Tensor::vector(vec![1.0f32; 1000]), None, true);
    let y = t.apply(&Op::Exp, &[x]).unwrap();
    let s = t.apply(&Op::Sum, &[y]).unwrap();
    let g = t.backward_dense(s, &Tensor::scalar(1.0)).unwrap();
    let held = t.pool_stats().held;
    g.into_iter().for_each(|g| t.recycle(g));
    assert!(t.pool_stats().held > held, "the gradients became spares");
    assert_eq!(
        t.clone().pool_stats().held,
        0,
        "a clone shares values, not spares"
    );
}

#[test]
fn clearing_an_empty_tape_counts_no_pass() {
    // A session may clear a tape that recorded nothing (a compile cleared by its recycle, then
    // cleared again); the spares of the last real pass must survive that.
    let mut t = Tape::new();
    pass(&mut t, &inputs(1));
    t.clear();
    let held = t.pool_stats().held;
    assert!(held > 0);
    for _ in 0..2 * tl_spec::pool::IDLE_TRIMS {
        t.clear();
    }
    assert_eq!(t.pool_stats().held, held);
}

#[test]
fn kernels_that_skip_the_zero_fill_write_every_value_they_return() {
    // Kernels take output and cotangent buffers "for overwrite" (a spare buffer keeps its old
    // values: tl_spec::pool::for_overwrite) and zero scatter targets on their own threads. A
    // pool full of NaN buffers of every operand's and the output's size gives the bits of no
    // pool at all, at one thread and split across two, or a kernel read a value it never wrote.
    let mut rng = Rng(0x0f11);
    let mut t = |dims: &[usize]| uniform(&mut rng, dims);
    // Sizes past the thresholds of tl_tape_cpu::par, so two threads split every kernel.
    let big = [33, 8, 40, 40];
    let cases: Vec<(Op, Vec<Tensor<f32>>)> = vec![
        (
            Op::conv2d(1, 1),
            vec![t(&[8, 3, 3, 3]), t(&[8]), t(&[33, 3, 20, 20])],
        ),
        (
            Op::conv_transpose2d(1, 1),
            vec![t(&[3, 8, 3, 3]), t(&[8]), t(&[33, 3, 20, 20])],
        ),
        (pool2d(2, 2, 0, false), vec![t(&big)]),
        (pool2d(3, 2, 1, false), vec![t(&big)]),
        (pool2d(3, 1, 1, true), vec![t(&big)]),
        (Op::Relu, vec![t(&big)]),
        (Op::Exp, vec![t(&big)]),
        (Op::Gelu, vec![t(&big)]),
        (Op::Mul, vec![t(&big), t(&big)]),
        (Op::Max, vec![t(&big), t(&big)]),
        (Op::Relu, vec![t(&[7, 5])]),
    ];
    let g_of = |op: &Op, x: &[Tensor<f32>]| {
        let refs: Vec<&Tensor<f32>> = x.iter().collect();
        let y = tl_tape_cpu::ops::forward(op, &refs, &[]).unwrap();
        let mut k = 0usize;
        Tensor::from_fn(y.shape().dims(), |_| {
            k += 1;
            ((k * 7 + 3) % 11) as f32 - 5.0
        })
    };
    for (op, x) in &cases {
        let g = g_of(op, x);
        let want = crate::common::at_threads(1, || crate::common::kernel_bits(op, x, &g));
        for threads in [1, 2] {
            let mut nan = tl_spec::pool::Pool::<f32>::new();
            let sizes = x.iter().map(Tensor::numel).chain([g.numel()]);
            for n in sizes {
                for _ in 0..4 {
                    nan.put(vec![f32::NAN; n]);
                }
            }
            let got = crate::common::at_threads(threads, || {
                let _installed = tl_spec::pool::install(&mut nan);
                crate::common::kernel_bits(op, x, &g)
            });
            assert!(
                got == want,
                "{op} at {threads} thread(s) read a stale value"
            );
        }
    }
}

/// The network of [`pass`] recorded on `t` (cleared first); returns the loss's id and the
/// weights' ids.
fn record(t: &mut Tape<f32>, i: &Inputs) -> (usize, [usize; 4]) {
    t.clear();
    let wc = t.leaf(i.w_conv.clone(), Some("w_conv"), true);
    let bc = t.leaf(i.b_conv.clone(), Some("b_conv"), true);
    let x = t.leaf(i.x.clone(), Some("x"), false);
    let wl = t.leaf(i.w_lin.clone(), Some("w_lin"), true);
    let bl = t.leaf(i.b_lin.clone(), Some("b_lin"), true);
    let conv = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let y = t.apply(&conv, &[wc, bc, x]).unwrap();
    let y = t.apply(&Op::Gelu, &[y]).unwrap();
    let y = t.apply(&Op::Reshape([3, 4 * 9 * 9].into()), &[y]).unwrap();
    let y = t.apply(&Op::Linear, &[wl, bl, y]).unwrap();
    let e = t.apply(&Op::Exp, &[y]).unwrap();
    let y = t.apply(&Op::Mul, &[y, e]).unwrap();
    let y = t.apply(&Op::Add, &[y, e]).unwrap();
    (t.apply(&Op::Sum, &[y]).unwrap(), [wc, bc, wl, bl])
}

#[test]
fn the_releasing_backward_gives_the_same_gradients_and_lets_the_values_go() {
    let i = inputs(3);
    let bits = |v: &Tensor<f32>| v.data().iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let (mut kept, mut freed) = (Tape::new(), Tape::new());
    let (loss, wanted) = record(&mut kept, &i);
    let plain = kept
        .backward_params(loss, &Tensor::scalar(1.0), &wanted)
        .unwrap();
    let (loss, _) = record(&mut freed, &i);
    let before = freed.pool_stats();
    let released = freed
        .backward_params_releasing(loss, &Tensor::scalar(1.0), &wanted)
        .unwrap();
    for w in wanted {
        assert_eq!(
            bits(&released[&w]),
            bits(&plain[&w]),
            "gradient of leaf {w}"
        );
    }
    // Each op's value, and gelu's kept tanh term, went to the pool as the sweep passed it:
    // the backward drew its buffers from them instead of the system allocator.
    let after = freed.pool_stats();
    let plain_stats = kept.pool_stats();
    assert!(
        after.missed - before.missed < plain_stats.missed,
        "fewer fresh buffers: {after:?} against {plain_stats:?}"
    );
    for id in 0..freed.len() {
        let node = freed.node(id).unwrap();
        let is_leaf = node.kind().name() == "leaf";
        assert_eq!(
            node.is_released(),
            !is_leaf,
            "node {id} ({})",
            node.kind().name()
        );
        assert_eq!(freed.get(id).is_ok(), is_leaf);
    }
    // The tape clears and records the next pass as usual.
    let (loss, wanted2) = record(&mut freed, &i);
    let again = freed
        .backward_params_releasing(loss, &Tensor::scalar(1.0), &wanted2)
        .unwrap();
    assert_eq!(bits(&again[&wanted2[0]]), bits(&plain[&wanted[0]]));
}
