//! The CUDA tape over the kernel emulator's `CudaDevice` (feature `cuda-emu`: kernels/*.cu
//! compiled for the host; docs/cuda.md) against the simulation device: for every registry entry
//! and for random DAGs, deterministic mode on, the values and dense gradients agree bit for bit.
//!
//! The sim is checked against the f64 IR reference by checks 1, 2 and 6 (module `cuda_sim`), so
//! this carries those checks over to the kernels themselves: the emulator runs the same kernel
//! sources as a GPU, with the host's libm (as the sim) where a GPU has CUDA's own `expf`, ...
//!
//! Also: with deterministic reductions **off** (the atomic kernels), every entry, random DAGs
//! and the grid-size cases within the f32 tolerance of the sim; and the grid-size cases (past
//! 2¹⁸ elements) bit for bit in deterministic mode. The conventions and hard inputs run on the
//! emulated kernels in the `conventions` and `hard` modules.
#![cfg(feature = "cuda-emu")]

use tl_conformance::checks::grid::{check_grid_device, grid_cases};
use tl_conformance::checks::sim::{
    check_device_vs_sim, check_device_vs_sim_dag, check_device_vs_sim_within,
    check_device_vs_sim_within_dag,
};
use tl_conformance::{Check, Report, RunConfig, assert_all_passed, registry};
use tl_tape_cuda::{CudaDevice, Device};

/// A quarter of the default case count (two runs per case), unless `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

#[test]
fn the_emulated_device_is_the_kernel_emulator() {
    assert_eq!(CudaDevice::new().unwrap().name(), "cuda-emu");
}

#[test]
fn every_registry_op_on_the_emulated_kernels_equals_the_sim_bit_for_bit() {
    let cfg = cfg();
    let reports: Vec<Report> = registry::all()
        .iter()
        .filter(|e| e.applies.get(Check::CudaVsCpu))
        .map(|e| check_device_vs_sim(e, &cfg, "cuda-emu", CudaDevice::new))
        .collect();
    assert!(reports.len() > 50, "only {} entries", reports.len());
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn random_dags_on_the_emulated_kernels_equal_the_sim_bit_for_bit() {
    let cfg = cfg();
    let report = check_device_vs_sim_dag(&cfg, "cuda-emu", CudaDevice::new);
    assert_all_passed(&[report], cfg.cases);
}

/// The attention entries (`multiHeadAttention`, `scaledDotProductAttention`, fused and
/// composed) with the fused core on the tensor cores (`FlashProducts::Tf32x3`:
/// `tl_flash_fwd_tc` and the backward's two kernels on the emulator, their twins on the sim),
/// in f32 and under bf16 and TF32 autocast (the rounded core's passes and roundings): bit for
/// bit.
#[test]
fn the_attention_entries_on_the_emulated_tensor_core_kernels_equal_the_sim_bit_for_bit() {
    use tl_conformance::checks::sim::check_device_vs_twin;
    use tl_tape_cuda::{FlashProducts, Precision, SimDevice};
    let cfg = cfg();
    let sim = || {
        let mut d = SimDevice::new();
        d.set_flash_products(FlashProducts::Tf32x3);
        Ok(d)
    };
    let emu = || {
        let mut d = CudaDevice::new()?;
        d.set_flash_products(FlashProducts::Tf32x3);
        Ok(d)
    };
    let precisions = [Precision::F32, Precision::Bf16, Precision::Tf32];
    let reports: Vec<Report> = registry::all()
        .iter()
        .filter(|e| e.applies.get(Check::CudaVsCpu) && e.name.contains("ttention"))
        .flat_map(|e| precisions.map(|p| (e, p)))
        .map(|(e, p)| check_device_vs_twin(e, &cfg, "cuda-emu tensor-core flash", (p, sim), emu))
        .collect();
    assert!(reports.len() >= 6, "only {} entries", reports.len());
    assert_all_passed(&reports, cfg.cases);
}

/// An eighth of the default case count for the non-deterministic runs, unless `TL_CASES` is set.
fn nondet_cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 8)
}

#[test]
fn every_registry_op_on_the_atomic_kernels_is_within_tolerance_of_the_sim() {
    let cfg = nondet_cfg();
    let reports: Vec<Report> = registry::all()
        .iter()
        .filter(|e| e.applies.get(Check::CudaVsCpu))
        .map(|e| check_device_vs_sim_within(e, &cfg, "cuda-emu", false, CudaDevice::new))
        .collect();
    assert!(reports.len() > 50, "only {} entries", reports.len());
    assert_all_passed(&reports, cfg.cases);
    // The flag is back on for the checks that need it.
    let _flag = tl_conformance::checks::sim::flag_lock();
    assert!(tl_tape_cuda::determinism::deterministic_reductions());
}

#[test]
fn random_dags_on_the_atomic_kernels_are_within_tolerance_of_the_sim() {
    let cfg = nondet_cfg();
    let report = check_device_vs_sim_within_dag(&cfg, "cuda-emu", false, CudaDevice::new);
    assert_all_passed(&[report], cfg.cases);
}

#[test]
fn past_one_grid_the_emulated_kernels_equal_the_sim_or_are_within_tolerance_without_determinism() {
    let reports = check_grid_device("cuda-emu", CudaDevice::new);
    assert_all_passed(&reports, grid_cases().len() as u32);
}

/// BatchNorm's running-statistics update (`running_update_moments`, `tl_running_update_moments`:
/// both statistics in one launch) on the emulated kernel: each element the reference rule
/// `tl_spec::ops::norm::running_update` in f64 rounded once, the mean from the moments' first
/// row, the variance from the second made unbiased with `count`, bit for bit and equal to the
/// sim; NaN and one-element variances keep the running value.
#[test]
fn the_running_statistics_update_on_the_emulated_kernel_is_the_reference_rule() {
    use tl_spec::ops::norm::{RunningStat, running_update};
    use tl_tape_cuda::SimDevice;
    const C: usize = 37;
    let wave = |k: usize, a: f32, b: f32| a * ((k * 7 + 3) % 11) as f32 / 11.0 + b;
    let mean: Vec<f32> = (0..C).map(|k| wave(k, 3.0, -1.5)).collect();
    let var: Vec<f32> = (0..C).map(|k| wave(k, 2.0, 0.25)).collect();
    // The batch means, then the biased batch variances (every ninth NaN).
    let moments: Vec<f32> = (0..C)
        .map(|k| wave(k + 5, 4.0, -2.0))
        .chain((0..C).map(|k| {
            if k % 9 == 4 {
                f32::NAN
            } else {
                wave(k + 2, 1.5, 0.1)
            }
        }))
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut emu = CudaDevice::new().unwrap();
    let mut sim = SimDevice::new();
    fn on<D: Device>(d: &mut D, ins: [&[f32]; 3], m: f64, count: usize) -> (Vec<f32>, Vec<f32>) {
        let [a, b, c] = ins.map(|v| d.upload(v).unwrap());
        let before = d.traffic().launches;
        let (nm, nv) = d.running_update_moments(a, b, c, m, count).unwrap();
        assert_eq!(d.traffic().launches, before + 1, "{}: one launch", d.name());
        (d.download(nm).unwrap(), d.download(nv).unwrap())
    }
    let ins = [&mean[..], &var[..], &moments[..]];
    for count in [1, 2, 120] {
        for m in [0.1, 1.0 / 3.0, 1.0] {
            let (gm, gv) = on(&mut emu, ins, m, count);
            let (sm, sv) = on(&mut sim, ins, m, count);
            let rule = |old: f32, s: f32, kind| {
                running_update(f64::from(old), f64::from(s), m, kind) as f32
            };
            let var_kind = RunningStat::Variance { count };
            let want_m: Vec<f32> = (0..C)
                .map(|k| rule(mean[k], moments[k], RunningStat::Mean))
                .collect();
            let want_v: Vec<f32> = (0..C)
                .map(|k| rule(var[k], moments[C + k], var_kind))
                .collect();
            let at = format!("count {count}, momentum {m}");
            assert_eq!(bits(&gm), bits(&want_m), "{at}: emulated mean");
            assert_eq!(bits(&gv), bits(&want_v), "{at}: emulated variance");
            assert_eq!((bits(&sm), bits(&sv)), (bits(&gm), bits(&gv)), "{at}: sim");
        }
    }
}
