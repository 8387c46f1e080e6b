//! The CUDA tape's conv with the implicit-GEMM kernels' gate
//! (`tl_tape_cuda::gates::force_conv_implicit_min_tiles`) forced on and off: the registry's
//! `conv` entry (ranks 1–4, strides, padding, with and without a batch, no size a multiple of
//! the kernel's tiles) passes checks 1, 2 and 6 on the sim either way (check 5 runs it in `session`); under `cuda-emu`, the
//! emulated kernels give the sim's values and gradients bit for bit with the gate forced on.
//! (The registry's cases are small, so the production threshold sends them all to im2col, and
//! no weight cotangent of theirs is split along `N·L`: a split one is checked on its own.)

use tl_conformance::verify::sim_cells;
use tl_conformance::{OpInfo, Report, RunConfig, assert_all_passed, registry};
use tl_tape_cuda::gates::force_conv_implicit_min_tiles;

fn conv_entry() -> OpInfo {
    registry::by_name("conv").expect("the registry's conv entry")
}

/// A quarter of the default case count per setting, unless `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

#[test]
fn conv_passes_checks_1_2_and_6_on_the_sim_with_the_implicit_kernel_forced_on_and_off() {
    let (cfg, entry) = (cfg(), conv_entry());
    let mut reports: Vec<Report> = Vec::new();
    for min_tiles in [0, usize::MAX] {
        let _gate = force_conv_implicit_min_tiles(Some(min_tiles));
        reports.extend(sim_cells(&entry, &cfg));
    }
    assert!(reports.len() >= 6, "{} reports", reports.len());
    assert_all_passed(&reports, cfg.cases);
}

#[cfg(feature = "cuda-emu")]
#[test]
fn conv_on_the_emulated_implicit_kernel_equals_the_sim_bit_for_bit() {
    use tl_conformance::checks::sim::check_device_vs_sim;
    let (cfg, entry) = (cfg(), conv_entry());
    let _gate = force_conv_implicit_min_tiles(Some(0));
    let r = check_device_vs_sim(&entry, &cfg, "cuda-emu", tl_tape_cuda::CudaDevice::new);
    assert_all_passed(&[r], cfg.cases);
}

/// The weight cotangent of a conv whose im2col GEMM splits its `k = N·L` (429 in runs of 144,
/// 144, 141; the registry's cases are too small to split): on the tape with the gate forced on,
/// the emulated `tl_conv_implicit_dw` (one block per tile and run, the runs added by
/// `tl_gemm_sum_splits`) gives the sim's bits, and with the gate off (im2col and the GEMM) the
/// same bits again.
#[cfg(feature = "cuda-emu")]
#[test]
fn a_split_weight_cotangent_on_the_emulated_kernel_equals_the_sim_bit_for_bit() {
    use tl_ir::Op;
    use tl_spec::{Shape, Tensor};
    use tl_tape_cuda::{AnyBuffer, CudaDevice, CudaTape, Device, SimDevice};
    fn dw<D: Device>(dev: D, min_tiles: usize) -> Vec<u32> {
        let fill = |dims: &[usize], salt: u64| {
            Tensor::<f32>::from_fn(Shape::new(dims), |i| {
                ((tl_spec::rng::unit(salt, i as u64) - 0.5) * 4.0) as f32
            })
        };
        let op = Op::Conv {
            stride: vec![1, 1],
            padding: vec![1, 1],
        };
        let _gate = force_conv_implicit_min_tiles(Some(min_tiles));
        let mut t = CudaTape::new(dev);
        let leaves = [
            fill(&[6, 5, 3, 3], 1),
            fill(&[6], 2),
            fill(&[3, 5, 13, 11], 3),
        ];
        let ids: Vec<_> = leaves
            .iter()
            .enumerate()
            .map(|(k, v)| t.upload_leaf(v, None, k == 0).unwrap())
            .collect();
        let y = t.apply(&op, &ids).unwrap();
        let seed = AnyBuffer::upload(t.device_mut(), &fill(&[3, 6, 13, 11], 4)).unwrap();
        let grads = t.backward_dense(y, &seed).unwrap();
        let g = grads[ids[0]].download::<f32, _>(t.device()).unwrap();
        g.data().iter().map(|v| v.to_bits()).collect()
    }
    let win = tl_tape_cuda::device::Windows {
        batch: 3,
        channels: 5,
        big: vec![13, 11],
        small: vec![13, 11],
        kernel: vec![3, 3],
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    assert_eq!(win.dw_gemm(6).k_splits(1), 3);
    let sim = dw(SimDevice::new(), 0);
    let differ = |got: Vec<u32>| got.iter().zip(&sim).filter(|(a, b)| a != b).count();
    assert_eq!(
        differ(dw(CudaDevice::new().unwrap(), 0)),
        0,
        "emulated kernel vs sim"
    );
    assert_eq!(
        differ(dw(SimDevice::new(), usize::MAX)),
        0,
        "im2col path vs kernel"
    );
    assert_eq!(sim.len(), 6 * 5 * 9);
}
