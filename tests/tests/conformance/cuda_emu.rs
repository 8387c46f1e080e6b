//! The CUDA tape over the kernel emulator's `CudaDevice` (feature `cuda-emu`: kernels/*.cu
//! compiled for the host; docs/cuda.md) against the simulation device: for every registry entry
//! and for random DAGs, deterministic mode on, the values and dense gradients agree bit for bit.
//!
//! The sim is checked against the f64 IR reference by checks 1, 2 and 6 (module `cuda_sim`), so
//! this carries those checks over to the kernels themselves: the emulator runs the same kernel
//! sources as a GPU, with the host's libm (as the sim) where a GPU has CUDA's own `expf`, ...
#![cfg(feature = "cuda-emu")]

use tl_conformance::checks::sim::{check_device_vs_sim, check_device_vs_sim_dag};
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
