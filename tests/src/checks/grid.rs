//! Sizes past the kernels' grid limits (docs/cuda.md): a kernel launches
//! `clamp(⌈n/256⌉, 1, 1024)` blocks of 256 threads, so past [`ONE_GRID`] = 2¹⁸ elements every
//! thread's grid-stride loop goes round more than once, and the full reductions' first pass
//! folds more than one element per thread. The registry's shapes stop at 4,096 elements; these
//! few fixed cases (one per reduction, scatter and conv family, [`grid_cases`]) have
//! [`GRID_N`] elements or more where it matters, and are run once each:
//!
//! - the sim against the CPU f32 tape, values and gradients ([`check_grid_sim_vs_cpu`]);
//! - deterministic mode bit-identical across runs on the sim ([`check_grid_deterministic`]);
//! - another device (the emulated kernels) equal to the sim bit for bit in deterministic mode
//!   and within [`GRID_TOL`] with deterministic reductions off ([`check_grid_device`]);
//! - any [`Backend`] (a user's, through `check_backend`): values and gradients against the IR's
//!   f64 evaluation within [`GRID_TOL`] in f32 ([`GRID_TOL_F64`] in f64), or what the backend
//!   states for that base ([`check_grid_backend`]).
//!
//! Inputs and cotangents are positive (`U(0.5, 1.5)`), so every sum is well conditioned: two
//! f32 summation orders of 3·10⁵ such terms agree to about 1e-5 relative (the worst of the six
//! cases, sim against the CPU f32 tape: 4.2e-5), while the elements counted twice or dropped
//! past the first grid pass (37,863 of [`GRID_N`]) move a sum by 12 %, and even one block's
//! 256 elements counted twice (a grid stride one block short: `cargo xtask mutants`,
//! `sim-grid-sum-past-one-grid`) by 8.5e-4. [`GRID_TOL`] lies between the two, on
//! [`crate::metric::tensor_err`] (not scaled by length).

use tl_ir::{GraphBuilder, Op};
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::Device;

use crate::checks::sim::{
    determinism_case, device_vs_sim_case, device_vs_sim_within_case, sim_vs_cpu_within,
};
use crate::checks::{backward_case, forward_case, reduction_len};
use crate::config::splitmix64;
use crate::domain::unit;
use crate::{Backend, CaseError, GraphCase, Measured, Report, Tol};

/// Elements one grid covers in one pass: 1024 blocks of 256 threads.
pub const ONE_GRID: usize = 1024 * 256;
/// The element count of the large operands: above [`ONE_GRID`] and not a multiple of 256.
pub const GRID_N: usize = 300_007;
/// The tolerance of the grid cases (see the module docs): about 5× the worst f32 error
/// measured, 4× below one block's elements counted twice. It was 1e-3, which let that bug pass.
pub const GRID_TOL: f64 = 2e-4;
/// The grid cases' tolerance for an f64 backend against the f64 reference: far above f64's
/// rounding of 3·10⁵ positive terms (about 1e-11), far below one block counted twice.
pub const GRID_TOL_F64: f64 = 1e-9;

/// A tensor of `shape` with elements `U(0.5, 1.5)` from `seed`.
pub(crate) fn positive(shape: impl Into<Shape>, seed: u64) -> Tensor<f64> {
    Tensor::from_fn(shape, |i| {
        0.5 + unit(splitmix64(
            seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9)),
        ))
    })
}

/// The one-op graph `op(leaves…)` with every leaf requiring grad and a positive cotangent.
pub(crate) fn one_op(op: Op, leaves: Vec<Tensor<f64>>, seed: u64) -> GraphCase {
    let mut b = GraphBuilder::new();
    let ids: Vec<usize> = leaves
        .iter()
        .map(|t| b.leaf(t.shape().clone(), None).expect("leaves first"))
        .collect();
    let out = b.apply(op, &ids).expect("a valid grid case");
    let graph = b.finish();
    let s = graph.shape(out).expect("the output").clone();
    GraphCase {
        graph,
        leaves,
        out,
        seed: positive(s, seed ^ 0xfeed),
        nats: Vec::new(),
    }
}

/// The grid cases, named: `sum`, `mseLoss` (full reductions), `reduceMean` (one axis of
/// [`GRID_N`]), `logSoftmax` (a row of [`GRID_N`]), `gather` (its backward scatter-adds
/// 320,000 rows of 8 into 64 rows) and `conv` (1×1×600×500 input, 2 output channels of 3×3:
/// 600,000 outputs; the weight gradient sums over 300,000 positions, `col2im` scatters back).
pub fn grid_cases() -> Vec<(&'static str, GraphCase)> {
    let n = GRID_N;
    let idx = Tensor::from_fn([40_000], |i| (splitmix64(i as u64) % 64) as f64);
    vec![
        ("sum", one_op(Op::Sum, vec![positive([n], 1)], 11)),
        (
            "mseLoss",
            one_op(Op::MseLoss, vec![positive([n], 2), positive([n], 3)], 12),
        ),
        (
            "reduceMean",
            one_op(Op::ReduceMean(0), vec![positive([n], 4)], 13),
        ),
        (
            "logSoftmax",
            one_op(Op::LogSoftmax, vec![positive([n], 5)], 14),
        ),
        (
            "gather",
            one_op(Op::GatherIndexTensor, vec![positive([64, 8], 6), idx], 15),
        ),
        (
            "conv",
            one_op(
                Op::conv2d(1, 1),
                vec![
                    positive([2, 1, 3, 3], 7),
                    positive([2], 8),
                    positive([1, 1, 600, 500], 9),
                ],
                16,
            ),
        ),
    ]
}

/// Run `check` on every grid case; the report counts the cases run and keeps the first
/// failure (with the case's name).
pub fn run_grid(
    label: String,
    check: impl Fn(&GraphCase) -> Result<Measured, CaseError>,
) -> Report {
    crate::report::run_fixed(label, &grid_cases(), check)
}

/// Check 6 (≈cpu) on the grid cases: the sim and the CPU f32 tape, values and gradients,
/// within [`GRID_TOL`].
pub fn check_grid_sim_vs_cpu() -> Report {
    run_grid("6 ≈cpu grid cuda-sim".into(), |c| {
        sim_vs_cpu_within(c, GRID_TOL, true)
    })
}

/// Check 6 (det) on the grid cases: three sim runs bit-identical.
pub fn check_grid_deterministic() -> Report {
    run_grid("6 det grid cuda-sim".into(), |c| determinism_case(c, true))
}

/// The grid cases on another device (`name`, made by `device`): equal to the sim bit for bit
/// in deterministic mode, and within [`GRID_TOL`] with deterministic reductions off.
pub fn check_grid_device<D: Device>(
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> [Report; 2] {
    [
        run_grid(format!("= sim grid {name}"), |c| {
            device_vs_sim_case(c, true, device)
        }),
        run_grid(format!("≈ sim nondet grid {name}"), |c| {
            device_vs_sim_within_case(c, GRID_TOL, true, false, device)
        }),
    ]
}

/// The grid cases on `backend` (`check_backend`'s `grid` check): each case's values and
/// gradients against the IR's f64 evaluation of the same (backend-precision) leaves, within
/// [`GRID_TOL`] in f32 and [`GRID_TOL_F64`] in f64. The suite's usual rule, f32's tolerance
/// scaled by the longest reduction, would allow thousands of times more at these lengths and let
/// a grid-stride bug through; so the check hands [`Backend::tolerance`] a base that the default
/// rule scales back to exactly [`GRID_TOL`], and a backend that widens its products' tolerance
/// (TF32, bf16) widens these cases as it does the others. A case holding an op the backend does
/// not support (`Backend::supports`) is skipped.
pub fn check_grid_backend<B: Backend>(backend: &B) -> Report {
    run_grid(format!("grid {}", backend.name()), |c| {
        let len = reduction_len(&c.graph) as f64;
        let tol = Tol {
            f64: GRID_TOL_F64,
            f32: GRID_TOL / (len / 64.0).max(1.0),
            ..Tol::DEFAULT
        };
        let values = forward_case(backend, c, &tol).map_err(CaseError::Fail)?;
        let grads = backward_case(backend, c, &tol).map_err(CaseError::Fail)?;
        Ok(values.max(grads))
    })
}

/// The grid cases on a device whose transcendental functions are not the host's (a real GPU):
/// within [`GRID_TOL`] of the sim with deterministic reductions on, then off.
pub fn check_grid_device_within<D: Device>(
    name: &str,
    device: fn() -> tl_tape_cuda::Result<D>,
) -> [Report; 2] {
    [true, false].map(|det| {
        let mode = if det { "det" } else { "nondet" };
        run_grid(format!("≈ sim {mode} grid {name}"), |c| {
            device_vs_sim_within_case(c, GRID_TOL, true, det, device)
        })
    })
}
