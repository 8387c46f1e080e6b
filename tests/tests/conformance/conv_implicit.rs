//! The CUDA tape's conv forward with the implicit-GEMM kernel's gate
//! (`tl_tape_cuda::gates::force_conv_implicit_min_tiles`) forced on and off: the registry's
//! `conv` entry (ranks 1–4, strides, padding, with and without a batch, no size a multiple of
//! the kernel's tiles) passes checks 1, 2 and 6 on the sim either way (check 5 runs it in `session`); under `cuda-emu`, the
//! emulated kernels give the sim's values and gradients bit for bit with the gate forced on.
//! (The registry's cases are small, so the production threshold sends them all to im2col.)

use tl_conformance::verify::{COLUMNS, op_cell};
use tl_conformance::{Check, OpInfo, Report, RunConfig, assert_all_passed, registry};
use tl_tape_cuda::gates::force_conv_implicit_min_tiles;

fn conv_entry() -> OpInfo {
    let mut e = registry::all();
    e.retain(|e| e.name == "conv");
    assert_eq!(e.len(), 1);
    e.remove(0)
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
        for col in COLUMNS
            .iter()
            .filter(|c| c.dtype == Some("sim") && c.check != Check::Session)
            .filter(|c| entry.applies.get(c.check))
        {
            let r = op_cell(&entry, *col, &cfg);
            assert!(!r.is_pending(), "{r}");
            reports.push(r);
        }
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
