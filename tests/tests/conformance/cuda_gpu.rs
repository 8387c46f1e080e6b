//! The conformance suite on a real GPU (feature `cuda`: `CudaDevice` over the driver; run by the
//! GPU bundle, `cargo xtask gpu-bundle`, docs/cuda.md "Running on a GPU"). Without a device (the
//! stub libcuda of `cargo xtask cuda-stub`, as in CI) each test prints "no CUDA device:
//! skipping" and passes.
//!
//! The kernel emulator (module `cuda_emu`) holds the kernel sources to the sim bit for bit; what
//! only hardware shows is nvcc's code, the driver, true concurrency between blocks and warps,
//! and CUDA's own `expf`, `tanhf`, ... (a few ulp from the host's libm). So the GPU is held to
//! what every f32 backend is held to, with deterministic reductions on and then off (the atomic
//! kernels, any summation order):
//! - checks 1 and 2 against the f64 IR, for every registry entry and for random DAGs, at the
//!   f32 tolerance scaled by reduction length;
//! - the hand-worked conventions (kinks, ties, NaN) and the hard inputs (large offsets, tiny
//!   variances, logits of ±80, `exp` near overflow);
//! - the past-one-grid cases within the grid tolerance of the sim;
//! - check 6 (det) on the GPU itself: deterministic mode on, three runs (a fresh device twice,
//!   then the second again, its pool's cached blocks holding stale data) bit for bit;
//! - check 5: the eager session on `Backend::Cuda` against the linked session (f64, on the same
//!   f32-rounded inputs), every registry entry and random DAGs;
//! - the ops whose kernels are `kernels/approx.cuh`'s twins of `tl_spec::approx` (tanh, sigmoid,
//!   gelu, silu, softplus, safeLog, geluErf: `registry::SAME_BITS`) equal the sim bit for bit, values and gradients, as
//!   they do on the emulator: nothing in them is CUDA's libm, and each fused multiply-add is
//!   written out, so what this adds is nvcc's code generation and the hardware's FMA.
//!
//! - autocast (bf16, TF32) on the GPU's own products (the tensor-core GEMM, the flash kernels
//!   on rounded operands), deterministic reductions on: every product op's registry cases and
//!   the fixed products within the f32 accumulation bound of the f64 reference (any summation
//!   order), attention's core against the spec's reference within the rounding flips'
//!   allowance, and `multiHeadAttention` against its pieces (the same kernels, so bit for bit
//!   but x's gradient) (`checks::autocast`).
//!
//! Otherwise it is not held to the sim's bits or to the sim within the f32 tolerance: two f32
//! backends each within `tol` of the reference may be `2·tol` apart, and were (a random DAG
//! through a batch norm over two elements, the atomic kernels 1.1e-4 from the sim, first H100
//! run).
//! Each check's largest error is printed as `GPU-SUMMARY conformance-<check> <max_err>
//! pass|FAIL`, which the bundle's run.sh collects into its table.
#![cfg(feature = "cuda")]

use tl_conformance::backend::OnDevice;
use tl_conformance::checks::conventions::check_conventions;
use tl_conformance::checks::grid::{check_grid_device_within, grid_cases};
use tl_conformance::checks::hard::{check_hard, check_hard_families, families};
use tl_conformance::checks::sim::{
    check_deterministic_dag_on, check_deterministic_on, check_device_vs_sim,
};
use tl_conformance::checks::{
    check_backward, check_backward_dag, check_forward, check_forward_dag, check_session_dag_on,
    check_session_on,
};
use tl_conformance::{Check, OpInfo, Report, RunConfig, assert_all_passed, registry};
use tl_ir::Op;
use tl_session::Backend;
use tl_spec::Tensor;
use tl_spec::precision::Precision;
use tl_tape_cuda::{CudaDevice, Device};

/// Whether a GPU answers; prints the skip line the bundle's run.sh looks for when not.
fn gpu() -> bool {
    match CudaDevice::new() {
        Ok(d) => {
            assert_eq!(d.name(), "cuda", "feature cuda must drive the real device");
            true
        }
        Err(e) => {
            println!("no CUDA device: skipping ({e})");
            false
        }
    }
}

/// The CUDA tape on the GPU with deterministic reductions, then with the atomic kernels.
fn backends() -> [(&'static str, OnDevice<CudaDevice>); 2] {
    [
        ("det", OnDevice::new("cuda", CudaDevice::new)),
        (
            "atomic",
            OnDevice::nondeterministic("cuda", CudaDevice::new),
        ),
    ]
}

/// A quarter of the default case count per check, unless `TL_CASES` is set.
fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 4)
}

/// One `GPU-SUMMARY` line for `check` (the worst error of `reports`), then every report held to
/// `cases` passing cases.
fn summarise(check: &str, reports: &[Report], cases: u32) {
    let worst = reports.iter().fold(0.0f64, |m, r| m.max(r.max_err));
    let ok = reports.iter().all(|r| r.passed() && r.cases == cases);
    let verdict = if ok { "pass" } else { "FAIL" };
    // On its own line: `--nocapture` prints the test's name without a newline first.
    println!("\nGPU-SUMMARY conformance-{check} {worst:.3e} {verdict}");
    assert_all_passed(reports, cases);
}

/// Every entry the CUDA tape is checked on.
fn entries() -> Vec<OpInfo> {
    let all: Vec<OpInfo> = registry::all()
        .into_iter()
        .filter(|e| e.applies.get(Check::CudaVsCpu))
        .collect();
    assert!(all.len() > 50, "only {} entries", all.len());
    all
}

#[test]
fn checks_1_and_2_hold_on_the_gpu_for_every_registry_op() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    for (mode, gpu) in backends() {
        let mut reports = Vec::new();
        for e in entries() {
            reports.push(check_forward(&gpu, &e, &cfg));
            if e.applies.backward {
                reports.push(check_backward(&gpu, &e, &cfg));
            }
        }
        summarise(&format!("ops-{mode}"), &reports, cfg.cases);
    }
}

/// The block kernels of the sums (`tl_axis_sum_block`, `tl_norm_bwd_affine_block`), the
/// norm forward's two launches and the norms' split group sums (`tl_norm_split_*`), which the
/// registry's small cases reach only with their gates forced, and split-K products (module
/// `cuda_gates`): checks 1 and 2 on the GPU for the entries that take them and for the
/// split-K cases.
#[test]
fn checks_1_and_2_hold_on_the_gpu_past_the_sum_norm_and_split_k_gates() {
    use crate::cuda_gates::{FORCED_PARTS, GROUP_SUMMING, SUMMING, entries};
    use tl_tape_cuda::gates::{force_norm_fused_max, force_norm_split_parts, force_sums_by_block};
    if !gpu() {
        return;
    }
    let cfg = cfg();
    let split_k_cases = tl_conformance::checks::split_k::split_k_cases().len() as u32;
    let _by_block = force_sums_by_block(Some(true));
    let _two_launches = force_norm_fused_max(Some(0));
    for (mode, gpu) in backends() {
        let mut reports = Vec::new();
        for e in entries(&SUMMING) {
            reports.push(check_forward(&gpu, &e, &cfg));
            if e.applies.backward {
                reports.push(check_backward(&gpu, &e, &cfg));
            }
        }
        summarise(&format!("gated-{mode}"), &reports, cfg.cases);
        let mut reports = Vec::new();
        {
            let _split = force_norm_split_parts(Some(FORCED_PARTS));
            for e in entries(&GROUP_SUMMING) {
                reports.push(check_forward(&gpu, &e, &cfg));
                if e.applies.backward {
                    reports.push(check_backward(&gpu, &e, &cfg));
                }
            }
        }
        summarise(&format!("norm-split-{mode}"), &reports, cfg.cases);
        let split_k = tl_conformance::checks::split_k::check_split_k_on(&gpu);
        summarise(&format!("split-k-{mode}"), &split_k, split_k_cases);
    }
}

#[test]
fn checks_1_and_2_hold_on_the_gpu_for_random_dags() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    for (mode, gpu) in backends() {
        let reports = [
            check_forward_dag(&gpu, &cfg),
            check_backward_dag(&gpu, &cfg),
        ];
        summarise(&format!("dags-{mode}"), &reports, cfg.cases);
    }
}

#[test]
fn the_approx_kernels_equal_the_sim_bit_for_bit_on_the_gpu() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    let reports: Vec<Report> = entries()
        .iter()
        .filter(|e| e.ulps == Some(registry::SAME_BITS))
        .map(|e| check_device_vs_sim(e, &cfg, "cuda", CudaDevice::new))
        .collect();
    assert_eq!(
        reports.len(),
        7,
        "tanh, sigmoid, gelu, silu, softplus, safeLog, geluErf"
    );
    summarise("approx-bits", &reports, cfg.cases);
}

#[test]
fn the_gpu_follows_the_conventions_and_meets_the_reference_on_hard_inputs() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    for (mode, gpu) in backends() {
        let mut reports = vec![
            check_conventions(&gpu, &cfg, false),
            check_conventions(&gpu, &cfg, true),
            check_hard(&gpu, &cfg, false),
        ];
        reports.extend(
            families()
                .into_iter()
                .map(|f| check_hard_families(&gpu, &cfg, true, vec![f])),
        );
        summarise(&format!("conventions-hard-{mode}"), &reports, cfg.cases);
    }
}

#[test]
fn deterministic_mode_on_the_gpu_repeats_bit_for_bit() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    let mut reports: Vec<Report> = entries()
        .iter()
        .map(|e| check_deterministic_on(e, &cfg, "cuda", CudaDevice::new))
        .collect();
    reports.push(check_deterministic_dag_on(&cfg, "cuda", CudaDevice::new));
    summarise("repeat-bits", &reports, cfg.cases);
}

#[test]
fn past_one_grid_the_gpu_is_within_tolerance_of_the_sim() {
    if !gpu() {
        return;
    }
    let reports = check_grid_device_within("cuda", CudaDevice::new);
    summarise("grid", &reports, grid_cases().len() as u32);
}

#[test]
fn check_5_the_eager_session_on_the_gpu_agrees_with_the_linked_session() {
    if !gpu() {
        return;
    }
    let cfg = cfg();
    let session_cases = tl_conformance::checks::session_cfg(&cfg).cases;
    let mut reports: Vec<Report> = entries()
        .iter()
        .map(|e| check_session_on(e, &cfg, Backend::Cuda, "cuda"))
        .collect();
    reports.push(check_session_dag_on(&cfg, Backend::Cuda, "cuda"));
    summarise("session", &reports, session_cases);
}

/// Autocast on the GPU (`checks::autocast`), at bf16 and TF32, deterministic reductions on:
/// `check_products` on every product op's registry cases (a `GPU-SUMMARY` line, the worst
/// error over its element's bound), then the fixed products, attention's core and
/// `multiHeadAttention` against its pieces (a line each, `pass` or `FAIL` with the miss
/// printed above it).
#[test]
fn autocast_holds_on_the_gpu() {
    use tl_conformance::checks::autocast::mha::tape_mha_matches_its_composition;
    use tl_conformance::checks::autocast::{
        check_products, product_entries, tape_attention_matches_the_reference,
        tape_products_match_the_reference,
    };
    if !gpu() {
        return;
    }
    let cfg = cfg();
    let mut run = |p: Precision, op: &Op, x: &[Tensor<f32>], g: &Tensor<f32>| {
        let dev = CudaDevice::new().map_err(|e| e.to_string())?;
        crate::autocast::on_device(dev, p, op, x, g)
    };
    let mut reports = Vec::new();
    let mut missed = Vec::new();
    for p in [Precision::Bf16, Precision::Tf32] {
        for e in product_entries() {
            reports.push(check_products(&e, &cfg, p, "cuda", &mut run));
        }
        let fixed = [
            (
                "products",
                tape_products_match_the_reference(&mut run, p, 43),
            ),
            (
                "attention",
                tape_attention_matches_the_reference(&mut run, p, 47),
            ),
            ("mha", tape_mha_matches_its_composition(&mut run, p, 53)),
        ];
        for (what, r) in fixed {
            let verdict = match &r {
                Ok(()) => "pass",
                Err(e) => {
                    println!("{what} at {}: {e}", p.name());
                    missed.push(format!("{what} at {}", p.name()));
                    "FAIL"
                }
            };
            println!(
                "\nGPU-SUMMARY conformance-autocast-{what}-{} - {verdict}",
                p.name()
            );
        }
    }
    summarise("autocast-products", &reports, cfg.cases);
    assert!(missed.is_empty(), "missed: {missed:?}");
}
