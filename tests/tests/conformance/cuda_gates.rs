//! The CUDA tape's size-gated launches that the registry's small cases do not reach at the
//! production thresholds: their norms run one launch, most of their axis sums one thread per
//! output (a batch norm's channel over more than 63 positions aside), and no product of
//! theirs splits its `k`. The sum and norm gates are forced both ways
//! (`tl_tape_cuda::gates`); split-K is reached by fixed products past it.
//!
//! - Sums by block (`force_sums_by_block`: `tl_axis_sum_block`, `tl_norm_bwd_affine_block`;
//!   the two orders give different bits): every entry whose CUDA formula sums along an axis
//!   passes checks 1, 2 and 6 on the sim with every sum by block and with none; under
//!   `cuda-emu`, the emulated kernels give the sim's bits either way.
//! - Split-K (`tl_conformance::checks::split_k`): a matmul, a bmm, a linear layer and a conv
//!   that split in the forward, a matmul's and a linear layer's weight cotangents that split in
//!   the backward, through checks 1, 2 and 6 on the sim; under `cuda-emu`, the emulated
//!   kernels (`tl_gemm` over the runs, `tl_gemm_sum_splits`) give the sim's bits.
//! - The norm forward in one launch or two (`force_norm_fused_max`; documented bit-neutral):
//!   the same values and gradients bit for bit on the sim; under `cuda-emu`, the emulated
//!   kernels give the sim's bits either way.
//! - The norms' group sums split over blocks (`force_norm_split_parts`: the `tl_norm_split_*`
//!   kernels, another order than one block a group): every entry whose CUDA formula takes a
//!   norm's statistics, `dx` or `dγ`/`dβ` passes checks 1, 2 and 6 on the sim with each group
//!   in 3 chunks and in 1; under `cuda-emu`, the emulated kernels give the sim's bits split.

use tl_conformance::checks::sim::check_same_bits_under;
use tl_conformance::verify::sim_cells;
use tl_conformance::{OpInfo, Report, RunConfig, assert_all_passed, registry};
use tl_tape_cuda::SimDevice;
use tl_tape_cuda::gates::{force_norm_fused_max, force_norm_split_parts, force_sums_by_block};

/// Entries whose CUDA formula sums along an axis: the reductions, the bias cotangents of
/// linear and the convolutions, and the norms' statistics and `dγ`/`dβ`.
pub(crate) const SUMMING: [&str; 9] = [
    "reduceSum",
    "reduceMean",
    "linear",
    "conv",
    "convTranspose",
    "layerNorm",
    "rmsNorm",
    "batchnormChannelFirst",
    "batchMoments",
];

/// Entries whose CUDA formula runs `Device::norm_forward`.
const NORMALIZING: [&str; 3] = ["layerNorm", "rmsNorm", "batchnormChannelFirst"];

/// Entries whose CUDA formula takes a norm's group sums (`norm_stats`, `norm_moments`,
/// `norm_bwd_x`, `norm_bwd_affine`), which [`force_norm_split_parts`] splits.
pub(crate) const GROUP_SUMMING: [&str; 4] = [
    "layerNorm",
    "rmsNorm",
    "batchnormChannelFirst",
    "batchMoments",
];

/// The chunks a group's sums take in the split runs below: more than most of the registry's
/// small groups' elements, so empty chunks are reached too.
pub(crate) const FORCED_PARTS: usize = 3;

/// The registry entries named `names`, in that order.
pub(crate) fn entries(names: &[&str]) -> Vec<OpInfo> {
    let entry = |n: &&str| registry::by_name(n).unwrap_or_else(|| panic!("no registry entry {n}"));
    names.iter().map(entry).collect()
}

/// A quarter of the default case count per setting, unless `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

#[test]
fn sums_pass_checks_1_2_and_6_on_the_sim_by_block_and_by_thread() {
    let cfg = cfg();
    let mut reports: Vec<Report> = Vec::new();
    for by_block in [true, false] {
        let _gate = force_sums_by_block(Some(by_block));
        for entry in entries(&SUMMING) {
            reports.extend(sim_cells(&entry, &cfg));
        }
    }
    assert!(reports.len() >= 2 * 3 * SUMMING.len(), "{}", reports.len());
    assert_all_passed(&reports, cfg.cases);
}

/// The override reaches the tape: a 1,000-term sum on the sim gives different bits by block
/// than by thread (were both settings one path, the checks above would test one of them).
#[test]
fn forcing_the_sums_by_block_changes_a_long_sums_bits() {
    use tl_ir::Op;
    use tl_spec::{Shape, Tensor};
    use tl_tape_cuda::CudaTape;
    let x = Tensor::<f32>::from_fn(Shape::new(&[1000, 1]), |i| {
        (tl_spec::rng::unit(7, i as u64) - 0.5) as f32 * 3.0
    });
    let sum = |by_block: bool| {
        let _gate = force_sums_by_block(Some(by_block));
        let mut t = CudaTape::new(SimDevice::new());
        let id = t.upload_leaf(&x, None, false).unwrap();
        let y = t.apply(&Op::ReduceSum(0), &[id]).unwrap();
        let v = t.value(y, &Shape::new(&[1])).unwrap();
        let v = v.download::<f32, _>(t.device()).unwrap();
        v.data()[0].to_bits()
    };
    assert_ne!(sum(true), sum(false));
}

/// The override reaches the tape: a layerNorm forward on the sim is one launch at its
/// production threshold and two with the gate forced to `Some(0)`.
#[test]
fn forcing_the_norm_forward_to_two_launches_adds_one() {
    use tl_ir::Op;
    use tl_spec::{Shape, Tensor};
    use tl_tape_cuda::{CudaTape, Device};
    let launches = |max: Option<usize>| {
        let _gate = force_norm_fused_max(max);
        let mut t = CudaTape::new(SimDevice::new());
        let fill = |dims: &[usize]| Tensor::<f32>::from_fn(Shape::new(dims), |i| i as f32);
        let ids = [fill(&[3, 8]), fill(&[8]), fill(&[8])]
            .iter()
            .map(|v| t.upload_leaf(v, None, false).unwrap())
            .collect::<Vec<_>>();
        let before = t.device().traffic().launches;
        t.apply(&Op::LayerNorm { eps: 1e-5 }, &ids).unwrap();
        t.device().traffic().launches - before
    };
    assert_eq!(launches(None), 1);
    assert_eq!(launches(Some(0)), 2);
}

#[test]
fn the_norm_forward_gives_the_same_bits_in_one_launch_and_in_two_on_the_sim() {
    let cfg = cfg();
    let (never, always) = (
        || force_norm_fused_max(Some(0)),
        || force_norm_fused_max(Some(usize::MAX)),
    );
    let settings: [(&str, &dyn Fn() -> _); 2] = [("two launches", &never), ("one", &always)];
    let reports: Vec<Report> = entries(&NORMALIZING)
        .iter()
        .map(|e| {
            check_same_bits_under(
                e,
                &cfg,
                ("cuda-sim", || Ok(SimDevice::new())),
                "norm",
                &settings,
            )
        })
        .collect();
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn split_norm_sums_pass_checks_1_2_and_6_on_the_sim() {
    let cfg = cfg();
    let mut reports: Vec<Report> = Vec::new();
    for parts in [FORCED_PARTS, 1] {
        let _gate = force_norm_split_parts(Some(parts));
        for entry in entries(&GROUP_SUMMING) {
            reports.extend(sim_cells(&entry, &cfg));
        }
    }
    assert!(
        reports.len() >= 2 * 3 * GROUP_SUMMING.len(),
        "{}",
        reports.len()
    );
    assert_all_passed(&reports, cfg.cases);
}

/// The override reaches the tape: a batch norm over 2 × 3 × 50 on the sim, forward and
/// backward, takes the split launches (the statistics in three, `dx` and `dγ`/`dβ` in two
/// each, the apply one where the forward was one launch) and other bits than one block a
/// channel (were both settings one path, the checks above would test one of them).
#[test]
fn forcing_the_norm_split_changes_a_batch_norms_launches_and_bits() {
    use tl_ir::Op;
    use tl_spec::{Shape, Tensor};
    use tl_tape_cuda::{AnyBuffer, CudaTape, Device};
    let dims = [2, 3, 5, 10];
    let vals = |dims: &[usize], seed: u64| {
        Tensor::<f32>::from_fn(Shape::new(dims), |i| {
            (tl_spec::rng::unit(seed, i as u64) - 0.5) as f32 * 3.0 + 0.7
        })
    };
    let run = |parts: usize| {
        let _gate = force_norm_split_parts(Some(parts));
        let mut t = CudaTape::new(SimDevice::new());
        let ids = [vals(&dims, 1), vals(&[3], 2), vals(&[3], 3)]
            .iter()
            .map(|v| t.upload_leaf(v, None, true).unwrap())
            .collect::<Vec<_>>();
        let before = t.device().traffic().launches;
        let y = t.apply(&Op::BatchNorm { eps: 1e-5 }, &ids).unwrap();
        let forward = t.device().traffic().launches - before;
        let seed = AnyBuffer::upload(t.device_mut(), &vals(&dims, 4)).unwrap();
        let before = t.device().traffic().launches;
        let grads = t.backward_dense(y, &seed).unwrap();
        let backward = t.device().traffic().launches - before;
        let mut values = t.read::<f32>(y).unwrap().data().to_vec();
        for &i in &ids {
            values.extend(grads[i].download::<f32, _>(t.device()).unwrap().data());
        }
        let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        (forward, backward, bits)
    };
    let (f1, b1, whole) = run(1);
    let (f3, b3, split) = run(FORCED_PARTS);
    assert_eq!((f1, f3), (1, 4), "forward launches");
    assert_eq!(
        b3,
        b1 + 2,
        "backward launches: one more for dx, one for dγ/dβ"
    );
    assert_eq!(whole.len(), split.len());
    assert_ne!(whole, split, "three chunks a channel sum in another order");
}

/// The split-K cases split at the production thresholds (were they one run each, the checks
/// below would test the plain GEMM again), and pass checks 1, 2 and 6 on the sim.
#[test]
fn products_past_the_split_k_gate_pass_checks_1_2_and_6_on_the_sim() {
    use tl_conformance::checks::split_k::{check_split_k_sim, split_k_cases};
    use tl_tape_cuda::device::Gemm;
    // (m, k, n, batch) of the product that splits in each case, in order.
    let splitting = [
        (16, 600, 20, 1),
        (12, 600, 10, 1),
        (12, 300, 10, 2),
        (6, 500, 10, 1),
        (5, 700, 6, 1),
        (4, 288, 30, 1),
    ];
    assert_eq!(splitting.len(), split_k_cases().len());
    for (m, k, n, batch) in splitting {
        let splits = Gemm::nn(m, k, n).k_splits(batch);
        assert!(splits > 1, "{m}x{k}x{n} (batch {batch}): {splits} run");
    }
    assert_all_passed(&check_split_k_sim(), split_k_cases().len() as u32);
}

#[cfg(feature = "cuda-emu")]
mod emu {
    use super::*;
    use tl_conformance::checks::sim::check_device_vs_sim;
    use tl_tape_cuda::CudaDevice;

    #[test]
    fn emulated_sums_equal_the_sim_bit_for_bit_by_block_and_by_thread() {
        let cfg = cfg();
        let mut reports = Vec::new();
        for by_block in [true, false] {
            let _gate = force_sums_by_block(Some(by_block));
            for e in entries(&SUMMING) {
                reports.push(check_device_vs_sim(&e, &cfg, "cuda-emu", CudaDevice::new));
            }
        }
        assert_all_passed(&reports, cfg.cases);
    }

    #[test]
    fn emulated_split_k_products_equal_the_sim_bit_for_bit() {
        use tl_conformance::checks::split_k::{check_split_k_device, split_k_cases};
        let r = check_split_k_device("cuda-emu", CudaDevice::new);
        assert_all_passed(&[r], split_k_cases().len() as u32);
    }

    #[test]
    fn the_emulated_split_norm_sums_equal_the_sim_bit_for_bit() {
        let cfg = cfg();
        let _gate = force_norm_split_parts(Some(FORCED_PARTS));
        let reports: Vec<Report> = entries(&GROUP_SUMMING)
            .iter()
            .map(|e| check_device_vs_sim(e, &cfg, "cuda-emu", CudaDevice::new))
            .collect();
        assert_all_passed(&reports, cfg.cases);
    }

    #[test]
    fn the_emulated_norm_forward_equals_the_sim_in_one_launch_and_in_two() {
        let cfg = cfg();
        let mut reports = Vec::new();
        for max in [0, usize::MAX] {
            let _gate = force_norm_fused_max(Some(max));
            for e in entries(&NORMALIZING) {
                reports.push(check_device_vs_sim(&e, &cfg, "cuda-emu", CudaDevice::new));
            }
        }
        assert_all_passed(&reports, cfg.cases);
    }
}
