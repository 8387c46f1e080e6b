//! Products whose `k` the CUDA tape splits (split-K, docs/cuda.md: fewer than 64 output tiles
//! of 64×64 and `k` at least two runs of 128; each run summed by its own block, then the runs
//! added in order by `tl_gemm_sum_splits`, the sim alike). The registry's and the random DAGs'
//! products are too small to split, so these fixed cases cross the gate at the production
//! thresholds: a matmul, a bmm, a linear layer and a conv (its im2col GEMM, k = C·3·3) split in
//! the forward; a matmul's and a linear layer's weight cotangent (k = the rows) in the backward.
//! Inputs are `U(0.5, 1.5)` (the grid cases' `positive`), so every sum is well conditioned.
//!
//! - checks 1 and 2 on the sim against the f64 IR, at the DAG tolerance scaled by the longest
//!   reduction ([`check_split_k_sim`]), and check 6 (≈cpu: the sim within that tolerance of the
//!   CPU f32 tape) and 6 (det);
//! - another device (the emulated kernels) equal to the sim bit for bit
//!   ([`check_split_k_device`]).

use tl_ir::Op;
use tl_tape_cuda::Device;

use super::grid::{one_op, positive};
use super::sim::{determinism_case, device_vs_sim_case, sim_vs_cpu_case};
use super::{backward_case, forward_case};
use crate::report::run_fixed;
use crate::{Backend, CaseError, CudaSim, GraphCase, Report};

/// The split-K cases, named by what splits (module docs).
pub fn split_k_cases() -> Vec<(&'static str, GraphCase)> {
    vec![
        (
            "matmul 16x600 600x20 (forward)",
            one_op(
                Op::Matmul,
                vec![positive([16, 600], 1), positive([600, 20], 2)],
                3,
            ),
        ),
        (
            "matmul 600x12 12x10 (dB = Aᵀ·g)",
            one_op(
                Op::Matmul,
                vec![positive([600, 12], 4), positive([12, 10], 5)],
                6,
            ),
        ),
        (
            "bmm 2x12x300 2x300x10 (forward)",
            one_op(
                Op::Bmm,
                vec![positive([2, 12, 300], 7), positive([2, 300, 10], 8)],
                9,
            ),
        ),
        (
            "linear w 10x500 x 6x500 (forward)",
            one_op(
                Op::Linear,
                vec![
                    positive([10, 500], 10),
                    positive([10], 11),
                    positive([6, 500], 12),
                ],
                13,
            ),
        ),
        (
            "linear w 5x6 x 700x6 (dW = gᵀ·x)",
            one_op(
                Op::Linear,
                vec![
                    positive([5, 6], 14),
                    positive([5], 15),
                    positive([700, 6], 16),
                ],
                17,
            ),
        ),
        (
            "conv 32 channels 3x3 (k = 288)",
            one_op(
                Op::conv2d(1, 1),
                vec![
                    positive([4, 32, 3, 3], 18),
                    positive([4], 19),
                    positive([1, 32, 6, 5], 20),
                ],
                21,
            ),
        ),
    ]
}

/// Checks 1 and 2 (against the f64 IR) on `backend` for the split-K cases, at the DAG
/// tolerance scaled by each case's longest reduction.
pub fn check_split_k_on<B: Backend>(backend: &B) -> [Report; 2] {
    let (cases, tol, name) = (split_k_cases(), crate::dag::DAG_TOL, backend.name());
    [
        run_fixed(format!("1 fwd split-k {name}"), &cases, |c| {
            forward_case(backend, c, &tol).map_err(CaseError::Fail)
        }),
        run_fixed(format!("2 bwd split-k {name}"), &cases, |c| {
            backward_case(backend, c, &tol).map_err(CaseError::Fail)
        }),
    ]
}

/// [`check_split_k_on`] the sim, and check 6 (≈cpu: within the same tolerance of the CPU f32
/// tape; det: three runs bit for bit).
pub fn check_split_k_sim() -> Vec<Report> {
    let (cases, tol) = (split_k_cases(), crate::dag::DAG_TOL);
    let mut reports = check_split_k_on(&CudaSim::new()).to_vec();
    reports.push(run_fixed("6 ≈cpu split-k cuda-sim".into(), &cases, |c| {
        sim_vs_cpu_case(c, &tol, true)
    }));
    reports.push(run_fixed("6 det split-k cuda-sim".into(), &cases, |c| {
        determinism_case(c, true)
    }));
    reports
}

/// The split-K cases on another device (`name`, made by `device`): equal to the sim bit for
/// bit, values and gradients, in deterministic mode.
pub fn check_split_k_device<D: Device>(
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> Report {
    run_fixed(format!("= sim split-k {name}"), &split_k_cases(), |c| {
        device_vs_sim_case(c, true, device)
    })
}
