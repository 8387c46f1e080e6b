//! The fused bias epilogue on the CUDA tape (`CudaTape::apply_then`, reached by
//! `GraphData::replay`): `linear` / `conv` / `convTranspose` followed by `relu` or `gelu` run as
//! one epilogue launch, and the tape they leave is the unfused tape, bit for bit — every
//! node's value and every dense gradient — with one launch fewer per fused pair.

use tl_ir::{GraphBuilder, GraphData, Id, Op, Recorder, Then};
use tl_spec::Tensor;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Error, SimDevice};

use crate::common::Gen;

/// The tape, recorded one op at a time: `Recorder`'s default `apply_then` (two `apply` calls).
struct Unfused<'a>(&'a mut CudaTape<SimDevice>);

impl Recorder<f64> for Unfused<'_> {
    type Error = Error;
    fn leaf(&mut self, v: Tensor<f64>, name: Option<&str>, rg: bool) -> Result<usize, Error> {
        self.0.upload_leaf(&v, name, rg)
    }
    fn apply(&mut self, op: &Op, args: &[usize]) -> Result<usize, Error> {
        self.0.apply(op, args)
    }
    fn set_nats(&mut self, nats: &[usize]) -> Result<(), Error> {
        self.0.set_nats(nats.to_vec());
        Ok(())
    }
}

fn values(dims: &[usize], g: &mut Gen) -> Tensor<f64> {
    Tensor::from_fn(dims, |_| g.range(-1.0, 1.0))
}

/// Every node's value and dense gradient (seed: ones) as bits, and the launches of the replay.
fn run(graph: &GraphData, leaves: &[Tensor<f64>], fused: bool) -> (Vec<Vec<u32>>, u64) {
    let mut tape = CudaTape::new(SimDevice::new());
    let before = tape.device().traffic();
    let ids = if fused {
        graph.replay(&mut tape, leaves, &[]).unwrap()
    } else {
        graph.replay(&mut Unfused(&mut tape), leaves, &[]).unwrap()
    };
    let launches = (tape.device().traffic() - before).launches;
    let out = *ids.last().unwrap();
    let shape = tape.get(out).unwrap().shape().clone();
    let seed = AnyBuffer::full(tape.device_mut(), &shape, 1.0).unwrap();
    let grads = tape.backward_dense(out, &seed).unwrap();
    let bits = |t: Tensor<f32>| crate::common::bits(t.data());
    let mut all: Vec<Vec<u32>> = ids.iter().map(|&i| bits(tape.read(i).unwrap())).collect();
    all.extend(
        ids.iter()
            .map(|&i| bits(grads[i].download(tape.device()).unwrap())),
    );
    tape.release_grads(grads);
    seed.release(tape.device_mut());
    tape.reset();
    assert_eq!(tape.device().live_buffers(), 0, "leaked");
    (all, launches)
}

/// A graph with every fusable pair and some that are not: `linear → relu`, `linear → gelu`,
/// a `conv → relu` on a batch of 3, a `convTranspose → gelu`, a `linear` whose value is also
/// read past its activation, `relu` after `add` (no bias epilogue: unfused), residual adds
/// after a `linear` with the residual first and second, and `linear` followed by `add` of
/// itself twice, `mul` and `sub` (unfused).
fn graph(g: &mut Gen) -> (GraphData, Vec<Tensor<f64>>, u64) {
    let mut b = GraphBuilder::new();
    let mut leaves = Vec::new();
    let mut leaf = |b: &mut GraphBuilder, dims: &[usize]| -> Id {
        leaves.push(values(dims, g));
        b.leaf(dims.to_vec(), None).unwrap()
    };
    let x = leaf(&mut b, &[5, 6]);
    let (w1, b1) = (leaf(&mut b, &[7, 6]), leaf(&mut b, &[7]));
    let (w2, b2) = (leaf(&mut b, &[4, 7]), leaf(&mut b, &[4]));
    let img = leaf(&mut b, &[3, 2, 5, 5]);
    let (wc, bc) = (leaf(&mut b, &[4, 2, 3, 3]), leaf(&mut b, &[4]));
    let (wt, bt) = (leaf(&mut b, &[4, 3, 2, 2]), leaf(&mut b, &[3]));
    let res = leaf(&mut b, &[5, 4]);
    let h = b.apply(Op::Linear, &[w1, b1, x]).unwrap();
    let h = b.apply(Op::Relu, &[h]).unwrap();
    let z = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let a = b.apply(Op::Gelu, &[z]).unwrap();
    let za = b.apply(Op::Add, &[z, a]).unwrap(); // z is read again: its value is kept
    let r = b.apply(Op::Relu, &[za]).unwrap(); // after add: not fusable
    let s1 = b.apply(Op::Sum, &[r]).unwrap();
    let conv = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let c = b.apply(conv, &[wc, bc, img]).unwrap();
    let c = b.apply(Op::Relu, &[c]).unwrap();
    let up = Op::ConvTranspose {
        stride: vec![2, 2],
        padding: vec![0, 0],
    };
    let t = b.apply(up, &[wt, bt, c]).unwrap();
    let t = b.apply(Op::Gelu, &[t]).unwrap();
    let s2 = b.apply(Op::Sum, &[t]).unwrap();
    // Residual adds: `res + linear`, `linear + (that)`; `l + l` and `l − y2` are not residual
    // adds of the bias epilogue (unfused).
    let l = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let y1 = b.apply(Op::Add, &[res, l]).unwrap();
    let l = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let y2 = b.apply(Op::Add, &[l, y1]).unwrap();
    let l = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let y3 = b.apply(Op::Add, &[l, l]).unwrap();
    let l = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let y3 = b.apply(Op::Mul, &[y3, l]).unwrap();
    let l = b.apply(Op::Linear, &[w2, b2, h]).unwrap();
    let y3 = b.apply(Op::Sub, &[l, y3]).unwrap();
    let s3 = b.apply(Op::Sum, &[y2]).unwrap();
    let s4 = b.apply(Op::Sum, &[y3]).unwrap();
    let t = b.apply(Op::Add, &[s1, s2]).unwrap();
    let t = b.apply(Op::Add, &[t, s3]).unwrap();
    b.apply(Op::Add, &[t, s4]).unwrap();
    (b.finish(), leaves, 6)
}

#[test]
fn fused_pairs_leave_the_unfused_tape_bit_for_bit_with_fewer_launches() {
    let mut g = Gen::new(0xf05e);
    let (graph, leaves, pairs) = graph(&mut g);
    let (fused, fused_launches) = run(&graph, &leaves, true);
    let (plain, plain_launches) = run(&graph, &leaves, false);
    assert_eq!(fused.len(), plain.len());
    for (k, (f, p)) in fused.iter().zip(&plain).enumerate() {
        assert_eq!(f, p, "value or gradient {k} differs");
    }
    assert_eq!(
        plain_launches - fused_launches,
        pairs,
        "one launch fewer per fused pair ({plain_launches} unfused, {fused_launches} fused)"
    );
}

#[test]
fn a_failed_fused_pair_leaves_the_tape_unchanged() {
    let mut tape = CudaTape::new(SimDevice::new());
    let w = tape
        .upload_leaf(&Tensor::<f64>::zeros([3, 2]), None, true)
        .unwrap();
    let b = tape
        .upload_leaf(&Tensor::<f64>::zeros([4]), None, true)
        .unwrap();
    let x = tape
        .upload_leaf(&Tensor::<f64>::zeros([5, 2]), None, true)
        .unwrap();
    let live = tape.device().live_buffers();
    let e = tape
        .apply_then(&Op::Linear, &[w, b, x], &Op::Relu, &[Then::First])
        .unwrap_err();
    assert!(e.to_string().contains("linear"), "{e}");
    assert_eq!((tape.len(), tape.device().live_buffers()), (3, live));
    // An unknown operand id: named, nothing recorded.
    let e = tape
        .apply_then(&Op::Linear, &[w, b, 9], &Op::Gelu, &[Then::First])
        .unwrap_err();
    assert!(e.to_string().contains("linear"), "{e}");
    assert_eq!((tape.len(), tape.device().live_buffers()), (3, live));
}

/// An unfused pair whose second op fails takes its first node back off: the tape and the
/// device are as before the call.
#[test]
fn a_failed_unfused_pair_leaves_the_tape_unchanged() {
    let mut tape = CudaTape::new(SimDevice::new());
    let leaf = |tape: &mut CudaTape<SimDevice>, dims: &[usize]| {
        tape.upload_leaf(&Tensor::<f64>::zeros(dims.to_vec()), None, true)
            .unwrap()
    };
    let (w, b, x) = (
        leaf(&mut tape, &[4, 2]),
        leaf(&mut tape, &[4]),
        leaf(&mut tape, &[5, 2]),
    );
    let odd = leaf(&mut tape, &[7]);
    let live = tape.device().live_buffers();
    let e = tape
        .apply_then(
            &Op::Linear,
            &[w, b, x],
            &Op::Add,
            &[Then::First, Then::Id(odd)],
        )
        .unwrap_err();
    assert!(e.to_string().contains("add"), "{e}");
    assert_eq!((tape.len(), tape.device().live_buffers()), (4, live));
    // The tape still records: the same pair with a fitting operand.
    let ok = leaf(&mut tape, &[5, 4]);
    let (a, c) = tape
        .apply_then(
            &Op::Linear,
            &[w, b, x],
            &Op::Add,
            &[Then::First, Then::Id(ok)],
        )
        .unwrap();
    assert_eq!((a, c), (5, 6));
}
