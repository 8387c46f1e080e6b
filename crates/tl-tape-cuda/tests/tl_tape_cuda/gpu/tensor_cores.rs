//! The tensor-core GEMM (`tl_gemm_tc`: bf16 / TF32 WMMA fragments, f32 accumulators) on the
//! CUDA device. Everywhere (emulator and GPU): every product kind within the f32 accumulation
//! bound of the reference on rounded operands. On the kernel emulator also the sim twin's bits
//! (both schedules: CI runs `gpu::` with `TL_EMU_SCHEDULE=reverse` too); on a GPU the tensor
//! cores sum in their own order, so only the bound holds there.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cuda::device::TC_TILE;
use tl_tape_cuda::{Device, Gemm, Precision, SimDevice};

use super::gpu;
use crate::autocast::on_cuda_tape;
use crate::common::Gen;
use crate::common::autocast::product_cases;

const AUTOCAST: [Precision; 2] = [Precision::Bf16, Precision::Tf32];

fn bits(v: &[f32]) -> Vec<u32> {
    crate::common::bits(v)
}

/// The products under autocast `p` on the device against the reference in f64 (within `p`'s
/// rounding), and on the emulator bit for bit against the sim. One test per setting, so the
/// two run side by side.
fn tensor_core_products_match_the_reference(p: Precision) {
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let got = product_cases(&mut cuda, p, p).unwrap();
    for case in &got {
        assert_eq!(
            case.miss(),
            None,
            "{p:?} on {}",
            tl_tape_cuda::Device::name(&cuda)
        );
    }
    if cfg!(feature = "cuda-emu") {
        let want = product_cases(&mut sim, p, p).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                bits(&g.got),
                bits(&w.got),
                "{p:?} {}: emulated kernel vs sim",
                g.name
            );
        }
    }
}

#[test]
fn bf16_tensor_core_products_match_the_reference() {
    tensor_core_products_match_the_reference(Precision::Bf16);
}

#[test]
fn tf32_tensor_core_products_match_the_reference() {
    tensor_core_products_match_the_reference(Precision::Tf32);
}

/// `a·b` (`g`) on `dev` under the precision installed on this thread.
fn product<D: Device>(dev: &mut D, a: &Tensor<f32>, b: &Tensor<f32>, g: Gemm) -> Vec<f32> {
    let (x, y) = (dev.upload(a.data()).unwrap(), dev.upload(b.data()).unwrap());
    let c = dev.matmul(x, y, g).unwrap();
    let got = dev.download(c).unwrap();
    dev.release_all([x, y, c]);
    got
}

/// The split-K threshold's override (`gates::force_split_k_tiles`) reaches the device's launch
/// and the sim alike: a one-tile bf16 product with k = 512 splits into 4 runs by default and
/// into none under `Some(0)`, and on the emulator each setting gives the sim's bits (the two
/// settings' bits differ: the override moved the sum order). On a GPU, within the f32 sums'
/// rounding of the sim.
#[test]
fn the_split_threshold_override_splits_the_device_and_the_sim_alike() {
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let mut rng = Gen::new(47);
    let (a, b) = (tensor(&mut rng, &[64, 512]), tensor(&mut rng, &[512, 64]));
    let g = Gemm::nn(64, 512, 64);
    let _bf16 = tl_tape_cuda::precision::install(Precision::Bf16);
    let mut runs = Vec::new();
    for (split, splits) in [(None, 4), (Some(0), 1)] {
        let _gate = tl_tape_cuda::gates::force_split_k_tiles(split);
        assert_eq!(g.k_splits_tiled(1, TC_TILE), splits, "{split:?}");
        let (on_cuda, on_sim) = (product(&mut cuda, &a, &b, g), product(&mut sim, &a, &b, g));
        if cfg!(feature = "cuda-emu") {
            assert_eq!(
                bits(&on_cuda),
                bits(&on_sim),
                "{split:?}: emulated kernel vs sim"
            );
        } else {
            let scale = on_sim.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (c, s) in on_cuda.iter().zip(&on_sim) {
                assert!((c - s).abs() <= 1e-4 * scale, "{split:?}: {c} against {s}");
            }
        }
        runs.push(on_sim);
    }
    assert_ne!(
        bits(&runs[0]),
        bits(&runs[1]),
        "the override changed no sum"
    );
}

fn tensor(rng: &mut Gen, shape: &[usize]) -> Tensor<f32> {
    let n = shape.iter().product();
    Tensor::new(shape, (0..n).map(|_| rng.range(-2.0, 2.0) as f32).collect()).unwrap()
}

/// The CUDA tape under autocast on the device against the same tape on the sim: matmul,
/// linear, conv (the im2col GEMMs) and attention (fused: the projections on the tensor cores,
/// the core on the flash kernels with rounded operands, probabilities and dS), values and
/// gradients, deterministic reductions on; the sim's bits on the emulator, within the
/// setting's rounding on a GPU.
#[test]
fn the_cuda_tape_under_autocast_matches_the_sim_tape() {
    if gpu().is_none() {
        return;
    }
    let mut rng = Gen::new(46);
    let conv = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let attention = Op::MultiHeadAttention {
        heads: 2,
        mask: None,
        fused: true,
    };
    let cases: Vec<(Op, Vec<Tensor<f32>>, Vec<usize>)> = vec![
        (
            Op::Matmul,
            vec![tensor(&mut rng, &[19, 40]), tensor(&mut rng, &[40, 70])],
            vec![19, 70],
        ),
        (
            Op::Linear,
            vec![
                tensor(&mut rng, &[9, 20]),
                tensor(&mut rng, &[9]),
                tensor(&mut rng, &[5, 20]),
            ],
            vec![5, 9],
        ),
        (
            conv,
            vec![
                tensor(&mut rng, &[4, 3, 3, 3]),
                tensor(&mut rng, &[4]),
                tensor(&mut rng, &[2, 3, 7, 6]),
            ],
            vec![2, 4, 7, 6],
        ),
        (
            attention,
            [[8, 8], [8, 8], [8, 8], [8, 8], [6, 8]]
                .iter()
                .map(|s| tensor(&mut rng, s))
                .collect(),
            vec![6, 8],
        ),
    ];
    for p in AUTOCAST {
        for (op, x, shape) in &cases {
            let g = tensor(&mut rng, shape);
            // Deterministic reductions: col2im's fixed order, the sim's.
            let mut cuda = gpu().unwrap();
            cuda.set_deterministic(Some(true));
            let got = on_cuda_tape(cuda, Some(p), op, x, &g);
            let want = on_cuda_tape(SimDevice::new(), Some(p), op, x, &g);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                if cfg!(feature = "cuda-emu") {
                    assert_eq!(
                        bits(a.data()),
                        bits(b.data()),
                        "{p:?} {} output {i}",
                        op.name()
                    );
                    continue;
                }
                let scale = b.data().iter().fold(0.0f32, |s, v| s.max(v.abs()));
                let tol = if p == Precision::Bf16 { 0.03 } else { 0.004 } * scale;
                let dist = a
                    .data()
                    .iter()
                    .zip(b.data())
                    .fold(0.0f32, |s, (x, y)| s.max((x - y).abs()));
                assert!(
                    dist <= tol,
                    "{p:?} {} output {i}: {dist} from the sim's (scale {scale})",
                    op.name()
                );
            }
        }
    }
}
