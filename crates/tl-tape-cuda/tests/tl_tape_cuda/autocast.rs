//! Autocast on the CUDA tape (`tl_tape_cuda::precision`), on the simulation device: every
//! product kind against the f64 reference of the rounded operands within the f32 accumulation
//! bound, a check that sees which rounding ran, and the tape (attention against the CPU tape
//! at the same setting; the default exactly the f32 path; spectral ops left in f32). The
//! tape's matmul, linear and conv against the reference: the conformance suite's `autocast::`
//! (one check for every tape). The kernels' side (emulated or on a GPU): `gpu::tensor_cores::`.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_spec::ops::attention::Mask;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Precision, SimDevice};

use crate::common::Gen;
use crate::common::autocast::product_cases;

const AUTOCAST: [Precision; 2] = [Precision::Bf16, Precision::Tf32];

#[test]
fn every_product_kind_matches_the_reference_on_the_sim() {
    let mut d = SimDevice::new();
    for p in AUTOCAST {
        for case in product_cases(&mut d, p, p).unwrap() {
            assert_eq!(case.miss(), None, "{p:?}");
        }
    }
    assert_eq!(d.memory_usage().live_buffers(), 0);
}

/// The reference check tells the settings apart: the f32 product, and the other rounding,
/// miss each setting's bound on some case.
#[test]
fn the_reference_check_sees_the_rounding() {
    let mut d = SimDevice::new();
    for want in AUTOCAST {
        for run in [Precision::F32, Precision::Bf16, Precision::Tf32] {
            if run == want {
                continue;
            }
            let cases = product_cases(&mut d, run, want).unwrap();
            let misses = cases.iter().filter(|c| c.miss().is_some()).count();
            assert!(misses > 0, "{run:?} passed as {want:?}");
        }
    }
}

fn tensor(rng: &mut Gen, shape: &[usize]) -> Tensor<f32> {
    let n = shape.iter().product();
    Tensor::new(shape, (0..n).map(|_| rng.range(-2.0, 2.0) as f32).collect()).unwrap()
}

/// The value and the parents' gradients of `op` on a CUDA tape over `dev` at `precision`
/// (`None`: as made), seeded with `g`.
pub fn on_cuda_tape<D: Device>(
    dev: D,
    precision: Option<Precision>,
    op: &Op,
    x: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> Vec<Tensor<f32>> {
    let mut t = CudaTape::new(dev);
    if let Some(p) = precision {
        t.set_precision(p);
        assert_eq!(t.precision(), p);
    }
    let ids: Vec<_> = x
        .iter()
        .map(|v| t.upload_leaf(v, None, true).unwrap())
        .collect();
    let y = t.apply(op, &ids).unwrap();
    let seed = AnyBuffer::upload(t.device_mut(), g).unwrap();
    let grads = t.backward_dense(y, &seed).unwrap();
    let mut out = vec![t.read::<f32>(y).unwrap()];
    out.extend(
        ids.iter()
            .map(|&i| grads[i].download::<f32, _>(t.device()).unwrap()),
    );
    t.release_grads(grads);
    seed.release(t.device_mut());
    out
}

fn bits(ts: &[Tensor<f32>]) -> Vec<Vec<u32>> {
    ts.iter().map(|t| crate::common::bits(t.data())).collect()
}

/// Under autocast the implicit-GEMM conv kernels (the tensor-core ones, rounding as they
/// stage) read their operands rounded: with the gate forced on, a conv at `Bf16` / `Tf32` on
/// `dev()` gives the f32 implicit conv of the rounded weight and input seeded with the rounded
/// cotangent, value, dw and dx, bit for bit plus the zero padding's `+ 0.0` (C·K = 27,
/// N·L = 72, A = 4: a `−0` sum becomes `+0`) where `exact` (the sim, the emulator), within the
/// f32 sums' rounding on a GPU (the tensor cores' order); the bias cotangent of the unrounded
/// cotangent; and none of them the f32 kernel's bits on the operands as they are.
/// The tensors: `[y, dw, db, dx]` per precision.
pub fn autocast_conv_rounds_the_implicit_operands<D: Device>(dev: impl Fn() -> D, exact: bool) {
    use tl_tape_cuda::gates::force_conv_implicit_min_tiles;
    let mut rng = Gen::new(45);
    let x = vec![
        tensor(&mut rng, &[4, 3, 3, 3]),
        tensor(&mut rng, &[4]),
        tensor(&mut rng, &[2, 3, 6, 6]),
    ];
    let g = tensor(&mut rng, &[2, 4, 6, 6]);
    let op = Op::conv2d(1, 1);
    let _gate = force_conv_implicit_min_tiles(Some(0));
    let f32_as_is = bits(&on_cuda_tape(dev(), Some(Precision::F32), &op, &x, &g));
    for p in AUTOCAST {
        let round = |t: &Tensor<f32>| t.map(|v| p.round(v));
        let xr = [round(&x[0]), x[1].clone(), round(&x[2])];
        let want = on_cuda_tape(dev(), Some(Precision::F32), &op, &xr, &round(&g));
        let got = on_cuda_tape(dev(), Some(p), &op, &x, &g);
        for (k, what) in [(0, "value"), (1, "dw"), (3, "dx")] {
            let (y, want_y) = (got[k].data(), want[k].data());
            if exact {
                let padded: Vec<f32> = want_y.iter().map(|v| v + 0.0).collect();
                assert_eq!(
                    crate::common::bits(y),
                    crate::common::bits(&padded),
                    "{p:?}: {what}"
                );
            } else {
                let scale = want_y.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                for (a, b) in y.iter().zip(want_y) {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{p:?}: {what} {a} against {b}"
                    );
                }
            }
        }
        let got = bits(&got);
        for (k, what) in [(0, "value"), (1, "dw"), (3, "dx")] {
            assert_ne!(
                got[k], f32_as_is[k],
                "{p:?}: {what} read unrounded operands"
            );
        }
        assert_eq!(got[2], f32_as_is[2], "{p:?}: db sums g as it is");
    }
}

#[test]
fn autocast_rounds_the_implicit_convs_operands_on_the_sim() {
    autocast_conv_rounds_the_implicit_operands(SimDevice::new, true);
}

/// `multiHeadAttention` (`core` false) or `scaledDotProductAttention`, two heads, under `mask`.
fn attention(core: bool, fused: bool, mask: Option<Mask>) -> Op {
    match core {
        false => Op::MultiHeadAttention {
            heads: 2,
            mask,
            fused,
        },
        true => Op::ScaledDotProductAttention {
            heads: 2,
            mask,
            fused,
        },
    }
}

/// The CPU tape's value and gradients of `op` at `p`.
fn on_cpu_tape(p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>) -> Vec<Tensor<f32>> {
    let mut t = tl_tape_cpu::Tape::<f32>::new();
    t.set_precision(p);
    let ids: Vec<_> = x.iter().map(|v| t.leaf(v.clone(), None, true)).collect();
    let y = t.apply(op, &ids).unwrap();
    let grads = t.backward_dense(y, g).unwrap();
    let mut out = vec![t.get(y).unwrap().clone()];
    out.extend(ids.iter().map(|&i| grads[i].clone()));
    out
}

/// Attention rounds the operands of each of its products (the CPU tape's set): under autocast
/// the CUDA tape's value and gradients, composed and fused (the fused core at the same
/// setting: `flash::autocast::under_autocast_the_core_rounds_as_the_composed_products` checks it
/// against its f64 reference), are within the setting's rounding of the CPU tape's at the
/// same setting, not equal to the f32 ones, and fused within a few units of the rounding of
/// composed (their f32 probabilities, computed in another order, may round to neighbours). Both ops:
/// `multiHeadAttention` and its core `scaledDotProductAttention`, unmasked on (6, 8) rows and
/// on a batch of 2 under a causal mask with a key padding per sequence (one matrix per batch
/// element).
#[test]
fn attention_rounds_its_products_as_the_cpu_tape_does() {
    let mut rng = Gen::new(44);
    // (mha operands, sdpa operands, the output's cotangent) of `lead` rows of 8.
    let mut data = |lead: &[usize]| {
        let rows = |rng: &mut Gen| tensor(rng, &[lead, &[8]].concat());
        let w: Vec<_> = (0..4).map(|_| tensor(&mut rng, &[8, 8])).collect();
        let mha: Vec<_> = w.into_iter().chain([rows(&mut rng)]).collect();
        let gy = rows(&mut rng);
        let qkv: Vec<_> = (0..3).map(|_| rows(&mut rng)).collect();
        (mha, qkv, gy)
    };
    let plain = data(&[6]);
    let batched = data(&[2, 6]);
    let padded = Mask::from_fn_batched(2, 6, 6, |b, i, j| j <= i && j < [6, 4][b]).unwrap();
    let settings = [(Precision::Bf16, 0.03f32), (Precision::Tf32, 0.004)];
    let cases = [false, true].into_iter().flat_map(|core| {
        settings
            .into_iter()
            .flat_map(move |(p, tol)| [(core, p, tol, false), (core, p, tol, true)])
    });
    for (core, p, tol, masked) in cases {
        let (mha, qkv, gy) = if masked { &batched } else { &plain };
        let xs = if core { qkv } else { mha };
        let mask = masked.then(|| padded.clone());
        let op = |fused: bool| attention(core, fused, mask.clone());
        let composed = on_cuda_tape(SimDevice::new(), Some(p), &op(false), xs, gy);
        let fused = on_cuda_tape(SimDevice::new(), Some(p), &op(true), xs, gy);
        let f32s = on_cuda_tape(SimDevice::new(), None, &op(false), xs, gy);
        let cpu = on_cpu_tape(p, &op(false), xs, gy);
        let dist = |x: &Tensor<f32>, y: &Tensor<f32>| {
            x.data()
                .iter()
                .zip(y.data())
                .fold(0.0f32, |s, (a, b)| s.max((a - b).abs()))
        };
        for (i, ((h, c), (l, f))) in f32s
            .iter()
            .zip(&cpu)
            .zip(composed.iter().zip(&fused))
            .enumerate()
        {
            let scale = h.data().iter().fold(0.0f32, |s, v| s.max(v.abs()));
            for (path, l) in [("composed", l), ("fused", f)] {
                let op = op(path == "fused");
                assert!(dist(l, h) > 0.0, "{p:?} {op:?} {i}: equals f32");
                assert!(
                    dist(l, c) <= tol * scale,
                    "{p:?} {op:?} {i}: {} from the CPU's, scale {scale}",
                    dist(l, c),
                );
            }
            assert!(
                dist(f, l) <= tol / 4.0 * scale,
                "{p:?} {i}: fused {} from composed, scale {scale}",
                dist(f, l)
            );
        }
    }
}

/// The default tape is the f32 path bit for bit (`F32` set explicitly too), autocast changes
/// every product's value; the spectral op (DFT matrices, an FFT on the CPU) stays f32 under
/// autocast.
#[test]
fn the_default_is_the_f32_path_and_spectral_stays_f32() {
    let mut rng = Gen::new(45);
    let cases: Vec<(Op, Vec<Tensor<f32>>, Vec<usize>)> = vec![
        (
            Op::Matmul,
            vec![tensor(&mut rng, &[5, 40]), tensor(&mut rng, &[40, 7])],
            vec![5, 7],
        ),
        (
            Op::Bmm,
            vec![tensor(&mut rng, &[2, 5, 33]), tensor(&mut rng, &[2, 33, 6])],
            vec![2, 5, 6],
        ),
        (
            Op::conv2d(1, 1),
            vec![
                tensor(&mut rng, &[4, 3, 3, 3]),
                tensor(&mut rng, &[4]),
                tensor(&mut rng, &[2, 3, 6, 6]),
            ],
            vec![2, 4, 6, 6],
        ),
    ];
    assert_eq!(CudaTape::new(SimDevice::new()).precision(), Precision::F32);
    for (op, x, shape) in &cases {
        let g = tensor(&mut rng, shape);
        let default = bits(&on_cuda_tape(SimDevice::new(), None, op, x, &g));
        let explicit = bits(&on_cuda_tape(
            SimDevice::new(),
            Some(Precision::F32),
            op,
            x,
            &g,
        ));
        assert_eq!(default, explicit, "{}", op.name());
        for p in AUTOCAST {
            let auto = bits(&on_cuda_tape(SimDevice::new(), Some(p), op, x, &g));
            assert_ne!(auto[0], default[0], "{} at {p:?}", op.name());
        }
    }
    let spectral = Op::SpectralConv1dRfft { modes: 4 };
    let x: Vec<_> = [[2, 6, 3], [4, 3, 3], [4, 3, 3]]
        .iter()
        .map(|s| tensor(&mut rng, s))
        .collect();
    let g = tensor(&mut rng, &[2, 6, 3]);
    let plain = bits(&on_cuda_tape(SimDevice::new(), None, &spectral, &x, &g));
    for p in AUTOCAST {
        assert_eq!(
            bits(&on_cuda_tape(SimDevice::new(), Some(p), &spectral, &x, &g)),
            plain,
            "{p:?}"
        );
    }
}
