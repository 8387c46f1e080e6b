//! Sizes past the kernels' grid limits ([`tl_conformance::checks::grid`]): one case per
//! reduction, scatter and conv family above 2¹⁸ elements and above one grid's worth of blocks,
//! the sim against the CPU f32 tape and deterministic across runs. (The emulated kernels run
//! them in the `cuda_emu` module.)

use tl_conformance::checks::grid::{
    GRID_N, ONE_GRID, check_grid_deterministic, check_grid_sim_vs_cpu, grid_cases,
};

#[test]
fn every_grid_case_has_an_operand_or_output_past_one_grid() {
    let cases = grid_cases();
    let names: Vec<&str> = cases.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "sum",
            "mseLoss",
            "reduceMean",
            "logSoftmax",
            "gather",
            "conv"
        ]
    );
    for (name, c) in &cases {
        let largest = (0..c.graph.len())
            .map(|id| c.graph.shape(id).unwrap().numel())
            .max()
            .unwrap();
        // More elements than one grid's 1024 blocks of 256 threads cover in one pass.
        assert!(largest > ONE_GRID, "{name}: {largest}");
        assert!(largest.div_ceil(256) > 1024, "{name}");
    }
    const { assert!(GRID_N > 1 << 18) };
}

#[test]
fn past_one_grid_the_sim_matches_the_cpu_and_is_deterministic() {
    let n = grid_cases().len() as u32;
    let reports = [check_grid_sim_vs_cpu(), check_grid_deterministic()];
    tl_conformance::assert_all_passed(&reports, n);
}
