//! Shared helpers of the integration tests: a seeded generator, leaf values in a domain, the
//! f32-vs-f64 comparison, and "replay a graph on the CUDA tape (sim) and compare forward values
//! and dense gradients with the IR reference".

#![allow(dead_code)]

pub mod autocast;
pub mod optim;

use std::sync::{Mutex, MutexGuard};

use tl_ir::{GraphData, Id};
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice, rng};

/// Held by every test that writes the process-wide deterministic-reductions flag
/// (`tl_tape_cuda::determinism`) or depends on its value: the tests of a binary share one
/// process and run on several threads (docs/verification.md). The simulation device ignores
/// the flag, so only those tests need it.
pub fn flag_lock() -> MutexGuard<'static, ()> {
    static FLAG: Mutex<()> = Mutex::new(());
    // A test that failed while holding the lock has already reported; the flag is still usable.
    FLAG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each value's bits: what the bit-for-bit comparisons compare.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Two dense backwards of `out` from `seed` on `tape`: the first reads the workspace `kept`
/// of the node under test and releases it, the second recomputes it; both give the gradients
/// of `leaves` with the same bits. Returns the launches of each.
pub fn backward_from_workspace_then_recomputed(
    tape: &mut CudaTape<SimDevice>,
    (out, seed): (Id, &AnyBuffer),
    leaves: &[Id],
    kept: &[tl_tape_cuda::device::Buffer],
) -> (u64, u64) {
    let run = |tape: &mut CudaTape<SimDevice>| {
        let before = tape.device().traffic().launches;
        let g = tape.backward_dense(out, seed).unwrap();
        let launches = tape.device().traffic().launches - before;
        let bits: Vec<Vec<u32>> = leaves
            .iter()
            .map(|&i| {
                let t: Tensor<f32> = g[i].download(tape.device()).unwrap();
                bits(t.data())
            })
            .collect();
        tape.release_grads(g);
        (launches, bits)
    };
    let (reused, first) = run(tape);
    assert!(
        kept.iter().all(|&b| !tape.device().is_live(b)),
        "the workspace released after the first backward"
    );
    let (recomputed, second) = run(tape);
    assert_eq!(
        first, second,
        "the same bits from the workspace or recomputed"
    );
    (reused, recomputed)
}

/// A small deterministic generator (SplitMix64 over a counter).
pub struct Gen(u64);

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen(seed)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(1);
        (rng::splitmix64(self.0) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

/// Where a leaf's values are drawn from (kept away from kinks and poles the checks cannot see).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Domain {
    /// [−2, 2).
    Any,
    /// [0.5, 2).
    Positive,
    /// ±[0.3, 2).
    NonZero,
}

/// A tensor of `shape` drawn from `domain`, rounded to f32 so the f64 reference sees exactly the
/// values the device holds.
pub fn draw(g: &mut Gen, shape: &Shape, domain: Domain) -> Tensor<f64> {
    Tensor::from_fn(shape.clone(), |_| {
        let v = match domain {
            Domain::Any => g.range(-2.0, 2.0),
            Domain::Positive => g.range(0.5, 2.0),
            Domain::NonZero => {
                let m = g.range(0.3, 2.0);
                if g.unit() < 0.5 { -m } else { m }
            }
        };
        f64::from(v as f32)
    })
}

/// One leaf per shape on `tape`, each drawn from [`Domain::Any`] and requiring its gradient;
/// their tape ids.
pub fn random_leaves<D: Device>(
    tape: &mut CudaTape<D>,
    g: &mut Gen,
    shapes: &[[usize; 2]],
) -> Vec<usize> {
    shapes
        .iter()
        .map(|s| {
            let t = draw(g, &Shape::new(s), Domain::Any);
            tape.upload_leaf(&t, None, true).unwrap()
        })
        .collect()
}

/// `got` (computed in f32) agrees with the f64 reference `want`: every element within
/// `1e-4 · max(1, ‖want‖∞)`. Returns a description of the first disagreement.
pub fn close(got: &Tensor<f64>, want: &Tensor<f64>) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape {} vs {}", got.shape(), want.shape()));
    }
    let scale = want.data().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let tol = 1e-4 * scale;
    for (i, (&a, &b)) in got.data().iter().zip(want.data()).enumerate() {
        if !((a - b).abs() <= tol || (a.is_nan() && b.is_nan())) {
            return Err(format!(
                "element {i}: got {a}, want {b} (tolerance {tol:e})"
            ));
        }
    }
    Ok(())
}

/// Replay `graph` with `leaves` on a fresh CUDA tape over the simulation device, seed `out`
/// with `seed`, and compare every forward value and every dense gradient with the IR's `eval`
/// and `backprop_all`. Afterwards everything is released and the device must hold nothing.
pub fn check_graph(
    what: &str,
    graph: &GraphData,
    leaves: &[Tensor<f64>],
    out: Id,
    seed: &Tensor<f64>,
) {
    check_graph_on(SimDevice::new(), what, graph, leaves, out, seed);
}

/// [`check_graph`] on a tape over `device` (the simulation device or a real GPU).
pub fn check_graph_on<D: Device>(
    device: D,
    what: &str,
    graph: &GraphData,
    leaves: &[Tensor<f64>],
    out: Id,
    seed: &Tensor<f64>,
) {
    check_graph_on_tape(CudaTape::new(device), what, graph, leaves, out, seed);
}

/// [`check_graph`] on `tape` (empty; set up as the test wants it: its precision, its flash
/// products).
pub fn check_graph_on_tape<D: Device>(
    mut tape: CudaTape<D>,
    what: &str,
    graph: &GraphData,
    leaves: &[Tensor<f64>],
    out: Id,
    seed: &Tensor<f64>,
) {
    let values = graph
        .eval(leaves, &[])
        .unwrap_or_else(|e| panic!("{what}: eval: {e}"));
    let reference = graph
        .backprop_all(leaves, &[], out, seed)
        .unwrap_or_else(|e| panic!("{what}: backprop_all: {e}"));

    let ids = graph
        .replay(&mut tape, leaves, &[])
        .unwrap_or_else(|e| panic!("{what}: replay: {e}"));
    for (k, want) in values.iter().enumerate() {
        let got: Tensor<f64> = tape.read(ids[k]).unwrap();
        close(&got, want).unwrap_or_else(|e| panic!("{what}: forward value of id {k}: {e}"));
    }
    let seed_buf = AnyBuffer::upload(tape.device_mut(), seed).unwrap();
    let grads = tape.backward_dense(ids[out], &seed_buf).unwrap();
    assert_eq!(grads.len(), tape.len());
    for (k, want) in reference.iter().enumerate() {
        let got: Tensor<f64> = grads[ids[k]].download(tape.device()).unwrap();
        close(&got, want).unwrap_or_else(|e| panic!("{what}: gradient of id {k}: {e}"));
    }
    tape.release_grads(grads);
    seed_buf.release(tape.device_mut());
    tape.reset();
    let u = tape.device().memory_usage();
    assert_eq!(u.live_bytes, 0, "{what}: leaked: {u}");
    assert_eq!(u.live_buffers(), 0, "{what}: leaked: {u}");
}

/// The fused launches against the chains of separate launches they replace, on `d`, bit for
/// bit: `add_bias` (and `add_bias_act`) against `broadcast` → `add` (→ `relu` / `gelu`), and
/// the scaled softmax rows (forward and VJP) against `scale` → `softmax_rows` and
/// `softmax_rows_bwd` → `scale`. Inputs include ±0, ±∞, NaN and values where gelu's tanh
/// saturates. Returns the mismatches, by name.
pub fn fused_chain_mismatches<D: Device>(d: &mut D) -> Vec<String> {
    use tl_tape_cuda::device::{Act, BiasLayout};
    let mut g = Gen::new(0xb1a5);
    let mut x: Vec<f32> = (0..1000).map(|_| g.range(-4.0, 4.0) as f32).collect();
    for (k, v) in [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        30.0,
        -30.0,
    ]
    .into_iter()
    .enumerate()
    {
        x[k * 97] = v;
    }
    let b: Vec<f32> = (0..20).map(|_| g.range(-1.0, 1.0) as f32).collect();
    let gr: Vec<f32> = (0..1000).map(|_| g.range(-1.0, 1.0) as f32).collect();
    let mut bad = Vec::new();
    let mut run = || -> tl_tape_cuda::Result<()> {
        let (xb, bb, gb) = (d.upload(&x)?, d.upload(&b)?, d.upload(&gr)?);
        let mut same = |d: &mut D, name: &str, fused: tl_tape_cuda::Buffer, plain| {
            let (f, p) = (d.download(fused), d.download(plain));
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            if f.map(bits).ok() != p.map(bits).ok() {
                bad.push(name.to_owned());
            }
            d.release(fused);
            d.release(plain);
        };
        for (outer, ch, inner) in [(10, 20, 5), (50, 20, 1), (1, 20, 50)] {
            let layout = BiasLayout::new(outer, ch, inner);
            let wide = d.broadcast(bb, &[ch, 1], &[outer, ch, inner])?;
            let sum = d.add(xb, wide)?;
            d.release(wide);
            let fused = d.add_bias(xb, bb, layout)?;
            let plain = d.copy(sum)?;
            same(d, "add_bias", fused, plain);
            for act in [Act::Relu, Act::Gelu] {
                let (pre, post) = d.add_bias_act(xb, bb, layout, act)?;
                let plain = match act {
                    Act::Relu => d.relu(sum)?,
                    Act::Gelu => d.gelu(sum)?,
                };
                let plain_pre = d.copy(sum)?;
                same(d, "add_bias_act (sum)", pre, plain_pre);
                same(d, &format!("add_bias_act ({act:?})"), post, plain);
            }
            for r_first in [true, false] {
                let (pre, out) = d.add_bias_residual(xb, bb, layout, gb, r_first)?;
                let plain = if r_first {
                    d.add(gb, sum)?
                } else {
                    d.add(sum, gb)?
                };
                let plain_pre = d.copy(sum)?;
                same(d, "add_bias_residual (sum)", pre, plain_pre);
                same(
                    d,
                    &format!("add_bias_residual (r_first {r_first})"),
                    out,
                    plain,
                );
            }
            d.release(sum);
        }
        for c in [0.125f32, 0.3, 1.0] {
            let scaled = d.scale(xb, c)?;
            let plain = d.softmax_rows(scaled, 40, 25)?;
            d.release(scaled);
            let fused = d.scaled_softmax_rows(xb, c, 40, 25)?;
            let y = d.copy(fused)?;
            same(d, "scaled_softmax_rows", fused, plain);
            let back = d.softmax_rows_bwd(y, gb, 40, 25)?;
            let plain = d.scale(back, c)?;
            d.release(back);
            let fused = d.scaled_softmax_rows_bwd(y, gb, c, 40, 25)?;
            same(d, "scaled_softmax_rows_bwd", fused, plain);
            d.release(y);
        }
        d.release_all([xb, bb, gb]);
        Ok(())
    };
    if let Err(e) = run() {
        return vec![format!("launch failed: {e}")];
    }
    bad
}

/// `axpy_assign_list` against `axpy_assign` pair by pair on `d`, bit for bit, and its launches:
/// eleven disjoint pairs of different lengths (an empty one, one of a single element, one over
/// many blocks, one whose `y` is its own `x`, ±∞ and NaN among the values) take two launches;
/// pairs sharing a buffer (a `y` twice, a `y` read as another pair's `x`) take one launch each
/// and still give the sequential result; a length mismatch anywhere is an error before any
/// `y` changes. Returns the mismatches, by name.
pub fn axpy_list_mismatches<D: Device>(d: &mut D) -> Vec<String> {
    let mut g = Gen::new(0xa3);
    let lens = [5, 0, 1, 300, 17, 70_000, 8, 33, 2, 64, 5];
    let mut data = |n: usize, k: usize| -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|_| g.range(-3.0, 3.0) as f32).collect();
        if n > 3 && k.is_multiple_of(3) {
            v[1] = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY][k % 9 / 3];
        }
        v
    };
    let ys: Vec<Vec<f32>> = lens.iter().enumerate().map(|(k, &n)| data(n, k)).collect();
    let xs: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(k, &n)| data(n, k + 1))
        .collect();
    let c = -0.37f32;
    let mut bad = Vec::new();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let mut run = || -> tl_tape_cuda::Result<()> {
        let up = |d: &mut D, v: &[Vec<f32>]| -> tl_tape_cuda::Result<Vec<_>> {
            v.iter().map(|v| d.upload(v)).collect()
        };
        let (y1, x1, y2, x2) = (up(d, &ys)?, up(d, &xs)?, up(d, &ys)?, up(d, &xs)?);
        // Pair 3 reads its own y.
        let pairs = |y: &[tl_tape_cuda::Buffer], x: &[tl_tape_cuda::Buffer]| -> Vec<_> {
            (0..lens.len())
                .map(|k| (y[k], if k == 3 { y[k] } else { x[k] }))
                .collect()
        };
        let (list, one) = (pairs(&y1, &x1), pairs(&y2, &x2));
        let before = d.traffic().launches;
        d.axpy_assign_list(c, &list)?;
        if d.traffic().launches - before != 2 {
            bad.push(format!("{} launches", d.traffic().launches - before));
        }
        for &(y, x) in &one {
            d.axpy_assign(y, c, x)?;
        }
        for k in 0..lens.len() {
            if bits(d.download(y1[k])?) != bits(d.download(y2[k])?) {
                bad.push(format!("pair {k} of {}", lens[k]));
            }
        }
        // Shared buffers: y0 twice, then y0 read by the pair that follows.
        let shared = [(y1[0], x1[0]), (y1[0], x1[0]), (y1[10], y1[0])];
        let before = d.traffic().launches;
        d.axpy_assign_list(c, &shared)?;
        if d.traffic().launches - before != 3 {
            bad.push("shared pairs: not one launch each".into());
        }
        for &(y, x) in &[(y2[0], x2[0]), (y2[0], x2[0]), (y2[10], y2[0])] {
            d.axpy_assign(y, c, x)?;
        }
        for k in [0, 10] {
            if bits(d.download(y1[k])?) != bits(d.download(y2[k])?) {
                bad.push(format!("shared pair {k}"));
            }
        }
        // Only crossed (no y twice): pair 0 reads pair 1's y before pair 1 updates it.
        let before = d.traffic().launches;
        d.axpy_assign_list(c, &[(y1[10], y1[0]), (y1[0], x1[0])])?;
        if d.traffic().launches - before != 2 {
            bad.push("crossed pairs: not one launch each".into());
        }
        for &(y, x) in &[(y2[10], y2[0]), (y2[0], x2[0])] {
            d.axpy_assign(y, c, x)?;
        }
        for k in [0, 10] {
            if bits(d.download(y1[k])?) != bits(d.download(y2[k])?) {
                bad.push(format!("crossed pair {k}"));
            }
        }
        // A length mismatch in the last pair: an error naming the primitive, nothing written.
        let before = d.download(y1[3])?;
        let wrong = [(y1[3], x1[3]), (y1[6], x1[7])];
        match d.axpy_assign_list(c, &wrong) {
            Err(e) if e.to_string().contains("axpy_assign_list") => {}
            other => bad.push(format!("mismatch accepted: {other:?}")),
        }
        if bits(d.download(y1[3])?) != bits(before) {
            bad.push("a y changed before the error".into());
        }
        d.release_all(y1.into_iter().chain(x1).chain(y2).chain(x2));
        Ok(())
    };
    if let Err(e) = run() {
        bad.push(format!("error: {e}"));
    }
    bad
}

/// `matmul_acc` against `add(c, matmul(a, b))` on `d`, bit for bit, over every transpose
/// pair and shapes that do and do not fill the kernel's 64×64 tiles (a 0-wide one included),
/// with one launch and no buffer of its own; an accumulator of the wrong length or one that
/// is also an operand is an error that leaves it unchanged. Returns the mismatches, by name.
pub fn matmul_acc_mismatches<D: Device>(d: &mut D) -> Vec<String> {
    use tl_tape_cuda::device::Gemm;
    let mut rnd = Gen::new(0x3acc);
    let mut bad = Vec::new();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let mut run = || -> tl_tape_cuda::Result<()> {
        for (m, k, n) in [
            (3, 5, 2),
            (70, 13, 75),
            (64, 64, 64),
            (1, 129, 17),
            (4, 0, 3),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let g = Gemm::nn(m, k, n).with_t(ta, tb);
                let mut data = |len: usize| -> Vec<f32> {
                    (0..len).map(|_| rnd.range(-2.0, 2.0) as f32).collect()
                };
                let (av, bv, cv) = (data(m * k), data(k * n), data(m * n));
                let (a, b, c) = (d.upload(&av)?, d.upload(&bv)?, d.upload(&cv)?);
                let p = d.matmul(a, b, g)?;
                let want = d.add(c, p)?;
                let live = d.memory_usage().live_buffers();
                let before = d.traffic().launches;
                d.matmul_acc(c, a, b, g)?;
                let name = format!("{m}x{k}x{n} ta={ta} tb={tb}");
                if d.traffic().launches - before != 1 || d.memory_usage().live_buffers() != live {
                    bad.push(format!("{name}: not one launch without a buffer"));
                }
                if bits(d.download(c)?) != bits(d.download(want)?) {
                    bad.push(name);
                }
                d.release_all([a, b, c, p, want]);
            }
        }
        let (a, c) = (d.upload(&[1.0; 4])?, d.upload(&[0.5; 3])?);
        let g = Gemm::nn(2, 2, 2);
        for (what, r) in [
            ("short accumulator", d.matmul_acc(c, a, a, g)),
            ("accumulator is an operand", d.matmul_acc(a, a, a, g)),
        ] {
            match r {
                Err(e) if e.to_string().contains("matmul_acc") => {}
                other => bad.push(format!("{what} accepted: {other:?}")),
            }
        }
        if d.download(a)? != [1.0; 4] || d.download(c)? != [0.5; 3] {
            bad.push("a refused accumulation wrote".into());
        }
        d.release_all([a, c]);
        Ok(())
    };
    if let Err(e) = run() {
        bad.push(format!("error: {e}"));
    }
    bad
}
