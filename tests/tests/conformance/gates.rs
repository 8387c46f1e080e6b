//! Checks 1 and 2 with the CPU tape's size-, shape- and thread-gated fast paths forced on and
//! off (`tl_tape_cpu::gates`), for every registry op and random DAGs, in f64 and f32; and the
//! paths documented as bit-neutral (thread count, SIMD level, layout copies) bit for bit
//! (`tl_conformance::checks::gates`). Each setting runs `TL_CASES / 4` cases.

use tl_conformance::checks::gates::{check_gated, check_same_bits, gated_cfg, settings};
use tl_conformance::{RunConfig, assert_all_passed, registry};
use tl_spec::Scalar;
use tl_tape_cpu::gates::{Gates, GemmLayout};

fn checks_1_and_2<T: Scalar>() {
    let cfg = gated_cfg(&RunConfig::from_env());
    assert_all_passed(&check_gated::<T>(&registry::all(), &cfg), cfg.cases);
}

#[test]
fn cpu_f64_gated_paths_match_the_ir() {
    checks_1_and_2::<f64>();
}

#[test]
fn cpu_f32_gated_paths_match_the_ir() {
    checks_1_and_2::<f32>();
}

#[test]
fn cpu_f64_bit_neutral_paths_keep_the_bits() {
    let cfg = gated_cfg(&RunConfig::from_env());
    assert_all_passed(&check_same_bits::<f64>(&registry::all(), &cfg), cfg.cases);
}

#[test]
fn cpu_f32_bit_neutral_paths_keep_the_bits() {
    let cfg = gated_cfg(&RunConfig::from_env());
    assert_all_passed(&check_same_bits::<f32>(&registry::all(), &cfg), cfg.cases);
}

/// The settings cover each gate both ways: every threshold at its "always" and its "never"
/// extreme, several thread counts, each layout path.
#[test]
fn the_settings_force_every_gate_both_ways() {
    let s = settings();
    let has = |f: &dyn Fn(&Gates) -> bool| s.iter().any(|(_, g)| f(g));
    let zero_and_max = |get: &dyn Fn(&Gates) -> Option<usize>| {
        has(&|g| get(g) == Some(usize::MAX)) && has(&|g| get(g).is_some_and(|v| v <= 1))
    };
    assert!(zero_and_max(&|g| g.parallel_min_elements));
    assert!(zero_and_max(&|g| g.parallel_min_row_work));
    assert!(zero_and_max(&|g| g.gemm_parallel_min_work));
    assert!(has(&|g| g.narrow_max_k == Some(0)));
    assert!(has(&|g| g
        .narrow_max_k
        .is_some_and(|k| k >= tl_tape_cpu::gemm::NARROW_MAX_K)));
    assert!(zero_and_max(&|g| g.transpose_min_side));
    assert!(zero_and_max(&|g| g.fused_keep_max));
    assert!(zero_and_max(&|g| g.fused_scores));
    assert!(zero_and_max(&|g| g.dw_chunk));
    assert!(zero_and_max(&|g| g.min_mean_run));
    assert!(zero_and_max(&|g| g.stage));
    assert!(has(&|g| g.cached_table_max == Some(0)));
    assert!(has(&|g| g.cached_table_max == Some(usize::MAX)));
    assert!(has(&|g| g.threads == Some(1)) && has(&|g| g.threads.is_some_and(|t| t > 2)));
    for layout in [
        GemmLayout::Strided,
        GemmLayout::RowMajorRhs,
        GemmLayout::ColumnMajor,
    ] {
        assert!(has(&|g| g.gemm_layout == Some(layout)), "{layout:?}");
    }
    for level in tl_tape_cpu::simd::Level::available() {
        assert!(has(&|g| g.level == Some(level)), "{level:?}");
    }
}

/// Shapes past the gates the registry's cases never cross (the GEMM's 16-wide kernel: a
/// product of more than 16 rows, attention with heads 16 wide), checks 1 and 2 under every
/// setting and the same bits with each gate off as on, in f32 and f64.
#[test]
fn shapes_past_the_gates_match_the_ir_and_keep_the_bits() {
    use tl_conformance::checks::gates::check_shape_gates;
    let mut reports = check_shape_gates::<f32>();
    reports.extend(check_shape_gates::<f64>());
    let cases = tl_conformance::checks::gates::shape_gate_cases().len() as u32;
    assert_all_passed(&reports, cases);
}

/// Products whose thread split leaves a one-row or one-column block (faer's matrix-vector
/// paths, another order of the sums over k) keep the bits of one thread, in f32 and f64.
#[test]
fn splits_that_leave_a_vector_keep_the_bits() {
    use tl_conformance::checks::gates::{check_vector_splits, vector_split_cases};
    let reports = vec![check_vector_splits::<f32>(), check_vector_splits::<f64>()];
    assert_all_passed(&reports, vector_split_cases().len() as u32);
}
