//! Deterministic reductions: with the mode on, gradients of a graph full of reductions,
//! broadcasts and a gather with repeated rows (whose backward is a scatter-add) are
//! bit-identical across runs (fresh devices, and one device whose cached blocks
//! hold stale data from earlier runs).

use crate::common::{self, Domain, Gen, draw};
use tl_ir::{GraphBuilder, GraphData, Op};
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::determinism::{deterministic_reductions, set_deterministic_reductions_checked};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};

/// The Nat environment: the rows the gather reads (with repeats).
const NATS: [usize; 8] = [5, 5, 5, 17, 17, 0, 95, 5];

fn graph() -> (GraphData, usize) {
    let mut g = GraphBuilder::new();
    let x = g.leaf([96, 70], Some("x")).unwrap(); // 6720 elements: a multi-block reduction
    let w = g.leaf([70], Some("w")).unwrap();
    let b = g.leaf([96, 1], Some("b")).unwrap();
    let wb = g
        .apply(Op::BroadcastTo(Shape::new(&[96, 70])), &[w])
        .unwrap();
    let bb = g
        .apply(Op::BroadcastTo(Shape::new(&[96, 70])), &[b])
        .unwrap();
    let xw = g.apply(Op::Mul, &[x, wb]).unwrap();
    let z = g.apply(Op::Add, &[xw, bb]).unwrap();
    let t = g.apply(Op::Tanh, &[z]).unwrap();
    let col = g.apply(Op::ReduceSum(0), &[t]).unwrap();
    let row = g.apply(Op::ReduceMean(1), &[t]).unwrap();
    let sm = g.apply(Op::LogSoftmax, &[t]).unwrap();
    let s1 = g.apply(Op::Sum, &[sm]).unwrap();
    let s2 = g.apply(Op::Sum, &[col]).unwrap();
    let s3 = g.apply(Op::Sum, &[row]).unwrap();
    let s12 = g.apply(Op::Add, &[s1, s2]).unwrap();
    // Rows 5 and 17 gathered several times: the backward scatter-adds into repeated rows.
    let picked = g
        .apply(
            Op::GatherRowsNatVec {
                at: 0,
                k: NATS.len(),
            },
            &[t],
        )
        .unwrap();
    let s4 = g.apply(Op::Sum, &[picked]).unwrap();
    let s123 = g.apply(Op::Add, &[s12, s3]).unwrap();
    let out = g.apply(Op::Add, &[s123, s4]).unwrap();
    (g.finish(), out)
}

/// The bits of every gradient of one run.
fn run(
    tape: &mut CudaTape<SimDevice>,
    graph: &GraphData,
    leaves: &[Tensor<f64>],
    out: usize,
) -> Vec<u32> {
    let ids = graph.replay(tape, leaves, &NATS).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let grads = tape.backward_dense(ids[out], &seed).unwrap();
    let mut bits = Vec::new();
    for g in &grads {
        bits.extend(
            tape.device()
                .download(g.buffer())
                .unwrap()
                .iter()
                .map(|v| v.to_bits()),
        );
    }
    tape.release_grads(grads);
    seed.release(tape.device_mut());
    tape.reset();
    bits
}

#[test]
fn gradients_are_bit_identical_across_ten_runs() {
    // The gpu tests turn the flag off for a while; not while this test asserts it is on.
    let _flag = common::flag_lock();
    assert!(set_deterministic_reductions_checked(true));
    let (graph, out) = graph();
    let mut rnd = Gen::new(3);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(&mut rnd, &l.shape, Domain::Any))
        .collect();
    let first = run(&mut CudaTape::new(SimDevice::new()), &graph, &leaves, out);
    assert!(first.iter().any(|&b| b != 0));
    let mut reused = CudaTape::new(SimDevice::new());
    for k in 0..10 {
        let fresh = run(&mut CudaTape::new(SimDevice::new()), &graph, &leaves, out);
        assert!(fresh == first, "run {k} on a fresh device differs");
        let again = run(&mut reused, &graph, &leaves, out);
        assert!(
            again == first,
            "run {k} on a reused device (stale cached blocks) differs"
        );
    }
    assert!(deterministic_reductions());
    assert!(
        reused.device().memory_usage().device_alloc_count
            < reused.device().memory_usage().alloc_count / 5
    );
}
