//! Conventions at kinks and ties (SEMANTICS.md), generated on purpose and checked against
//! hand-worked and rule-given values and gradients ([`tl_conformance::checks::conventions`]) on
//! every backend: the IR, the CPU tape in f64 and f32, the CUDA sim and (feature `cuda-emu`)
//! the emulated kernels. max/min ties split the gradient in halves (±0 ties too), relu'(0) = 0,
//! sign(0) = 0 for abs, clamp passes gradient only strictly inside its bounds, sqrt has
//! derivative 0 at x ≤ 0, detach blocks, and NaN propagates (relu, sqrt, clamp, abs, max, min,
//! maxPool: PyTorch's) with no gradient (maxPool's goes to the window's first NaN).

use proptest::strategy::{Strategy, ValueTree};
use tl_conformance::backend::IrRef;
use tl_conformance::checks::conventions::{
    at_exact, check_conventions, clamp_at_bounds, hand_worked, ties, with_nan,
};
use tl_conformance::generate::Size;
use tl_conformance::{Backend, CpuTape, CudaSim, RunConfig, assert_all_passed};
use tl_ir::{GraphBuilder, Op};
use tl_spec::Tensor;

fn cfg() -> RunConfig {
    RunConfig::from_env_or(tl_conformance::config::DEFAULT_CASES / 2)
}

/// Values, then values and gradients, on `backend`.
fn on<B: Backend>(backend: &B) {
    let cfg = cfg();
    let reports = [
        check_conventions(backend, &cfg, false),
        check_conventions(backend, &cfg, true),
    ];
    assert_all_passed(&reports, cfg.cases);
}

#[test]
fn the_ir_follows_the_conventions() {
    on(&IrRef);
}

#[test]
fn the_cpu_tape_follows_the_conventions_in_f64_and_f32() {
    on(&CpuTape::<f64>::new());
    on(&CpuTape::<f32>::new());
}

#[test]
fn the_cuda_sim_follows_the_conventions() {
    on(&CudaSim::new());
}

#[cfg(feature = "cuda-emu")]
#[test]
fn the_emulated_kernels_follow_the_conventions() {
    use tl_conformance::backend::OnDevice;
    // Deterministic (the sim's twin) and not (the atomic kernels).
    on(&OnDevice::new("cuda-emu", tl_tape_cuda::CudaDevice::new));
    on(&OnDevice::nondeterministic(
        "cuda-emu",
        tl_tape_cuda::CudaDevice::new,
    ));
}

/// The first `n` values of a strategy from a fixed runner.
fn draw<S: Strategy>(s: S, n: usize) -> Vec<S::Value> {
    let mut runner = RunConfig::default().runner("conventions draw");
    (0..n)
        .map(|_| s.new_tree(&mut runner).unwrap().current())
        .collect()
}

/// The element pairs `(a_i, b_i)` of binary cases.
fn element_pairs(cases: &[tl_conformance::OpCase]) -> Vec<(f64, f64)> {
    let pair = |c: &tl_conformance::OpCase| {
        let b = c.inputs[1].data().to_vec();
        c.inputs[0]
            .data()
            .iter()
            .copied()
            .zip(b)
            .collect::<Vec<_>>()
    };
    cases.iter().flat_map(pair).collect()
}

#[test]
fn the_generators_land_on_the_kinks_with_both_zeros_and_nan() {
    let zero_signs = |x: &[f64]| {
        (
            x.iter().any(|v| *v == 0.0 && v.is_sign_positive()),
            x.iter().any(|v| *v == 0.0 && v.is_sign_negative()),
        )
    };
    let cases = draw(ties(Size::Small, Op::Max), 64);
    let pairs = element_pairs(&cases);
    assert!(pairs.iter().any(|(a, b)| a == b && *a != 0.0), "plain ties");
    assert!(
        pairs
            .iter()
            .any(|(a, b)| *a == 0.0 && *b == 0.0 && a.is_sign_negative() != b.is_sign_negative()),
        "±0 ties"
    );
    assert!(pairs.iter().all(|(a, b)| a == b || (a - b).abs() >= 0.09));
    for op in [Op::Relu, Op::Abs, Op::Sqrt] {
        let xs: Vec<f64> = draw(at_exact(Size::Small, op, 0.0), 64)
            .iter()
            .flat_map(|c| c.inputs[0].data().to_vec())
            .collect();
        assert_eq!(zero_signs(&xs), (true, true));
        assert!(xs.iter().all(|v| *v == 0.0 || v.abs() >= 0.09));
    }
    let clamps = draw(clamp_at_bounds(Size::Small), 64);
    let (mut at_lo, mut at_hi, mut flat) = (false, false, false);
    for c in &clamps {
        let Op::Clamp { lo, hi } = c.op else {
            panic!("{:?}", c.op)
        };
        flat |= lo == hi;
        at_lo |= c.inputs[0].data().contains(&lo);
        at_hi |= lo != hi && c.inputs[0].data().contains(&hi);
        assert_eq!((lo as f32 as f64, hi as f32 as f64), (lo, hi));
    }
    assert!(at_lo && at_hi && flat);
    let nans = draw(with_nan(Size::Small, Op::Relu), 16);
    assert!(
        nans.iter()
            .any(|c| c.inputs[0].data().iter().any(|v| v.is_nan()))
    );
    // max/min: NaN on each side, alone and together.
    let nans = draw(with_nan(Size::Small, Op::Max), 32);
    let pairs = element_pairs(&nans);
    assert!(pairs.iter().any(|(a, b)| a.is_nan() && !b.is_nan()));
    assert!(pairs.iter().any(|(a, b)| !a.is_nan() && b.is_nan()));
    assert!(pairs.iter().any(|(a, b)| a.is_nan() && b.is_nan()));
    // Every value is exact in f32, so an f32 backend meets the same kinks.
    for c in cases.iter().chain(&clamps) {
        for x in &c.inputs {
            assert!(x.data().iter().all(|v| *v as f32 as f64 == *v));
        }
    }
    assert!(hand_worked().len() >= 22);
}

#[test]
fn max_of_an_id_with_itself_passes_the_whole_gradient() {
    // max(x, x): a tie at every element; the halves accumulate back to g on the one leaf.
    let mut b = GraphBuilder::new();
    let x = b.leaf([3], None).unwrap();
    let m = b.apply(Op::Max, &[x, x]).unwrap();
    let graph = b.finish();
    let leaves = [Tensor::vector(vec![-1.0, 0.0, 3.0])];
    let g = Tensor::vector(vec![1.0, 2.0, 3.0]);
    let ir = graph.backprop_all(&leaves, &[], m, &g).unwrap();
    assert_eq!(ir[x], g);
    let tape = CpuTape::<f64>::new();
    let p = tape.record(&graph, &leaves, &[]).unwrap();
    assert_eq!(tape.backward_dense(&p, m, &g).unwrap()[x], g);
    let sim = CudaSim::new();
    let leaves32 = [leaves[0].cast::<f32>()];
    let p = sim.record(&graph, &leaves32, &[]).unwrap();
    let got = sim.backward_dense(&p, m, &g.cast()).unwrap();
    assert_eq!(got[x].cast::<f64>(), g);
}
