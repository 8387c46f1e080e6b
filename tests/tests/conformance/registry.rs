//! The registry covers every `Op` variant exactly once, and its generators produce valid cases
//! that keep the promises the checks rely on (well typed, in the domain, off the kinks).

use std::collections::BTreeSet;

use proptest::strategy::{Strategy, ValueTree};
use tl_conformance::entries::{CLAMP_MARGIN, TIE_MARGIN};
use tl_conformance::generate::{LARGE_NUMEL, Size};
use tl_conformance::{Check, OpCase, OpInfo, RunConfig, kink_margin, registry};
use tl_ir::rules;

fn samples(entry: &OpInfo, n: usize) -> Vec<OpCase> {
    sized(entry, Size::Small, n)
}

fn sized(entry: &OpInfo, size: Size, n: usize) -> Vec<OpCase> {
    let mut runner = RunConfig::default().runner(entry.name);
    let strategy = (entry.generate)(size);
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("generates").current())
        .collect()
}

#[test]
fn every_entry_round_trips_through_the_exhaustive_match() {
    let all = registry::all();
    let names: BTreeSet<&str> = all.iter().map(|e| e.name).collect();
    assert_eq!(names.len(), all.len(), "registry names are unique");
    for entry in &all {
        for case in samples(entry, 16) {
            assert_eq!(
                case.op.name(),
                entry.name,
                "entry {} generated {:?}",
                entry.name,
                case.op
            );
            let back = registry::entry_of(&case.op).expect("a catalogue op");
            assert_eq!(back.name, entry.name, "entry_of({:?})", case.op);
            assert_eq!(back.applies, entry.applies);
            assert_eq!(
                registry::by_name(entry.name).map(|e| e.name),
                Some(entry.name)
            );
        }
    }
}

#[test]
fn generated_cases_are_well_typed_and_evaluate() {
    for entry in registry::all() {
        let small = sized(&entry, Size::Small, 24);
        let large = sized(&entry, Size::Large, 8);
        for (case, limit) in small
            .iter()
            .map(|c| (c, 128))
            .chain(large.iter().map(|c| (c, LARGE_NUMEL)))
        {
            assert_eq!(case.inputs.len(), case.op.arity(), "{case:?}");
            let out = case.out_shape();
            let y = rules::value(&case.op, &case.args(), &[]).unwrap_or_else(|e| {
                panic!("{}: reference value failed: {e}\n{case:?}", entry.name)
            });
            assert_eq!(y.shape(), &out, "{case:?}");
            assert!(y.data().iter().all(|v| v.is_finite()), "{case:?}");
            assert!(
                case.inputs.iter().all(|t| t.numel() <= limit),
                "{}: an operand has more than {limit} elements",
                entry.name
            );
        }
    }
}

#[test]
fn smooth_checks_only_see_points_away_from_kinks_and_poles() {
    for entry in registry::all()
        .iter()
        .filter(|e| e.applies.get(Check::FiniteDiff))
    {
        let mut cases = samples(entry, 32);
        cases.extend(sized(entry, Size::Large, 4));
        for case in cases {
            if let Some(m) = kink_margin(&case.op, &case.args()) {
                assert!(
                    m >= CLAMP_MARGIN.min(TIE_MARGIN) - 1e-12,
                    "{}: margin {m} too small\n{case:?}",
                    entry.name
                );
            }
        }
    }
}

#[test]
fn only_gradient_free_ops_skip_finite_differences() {
    let skipped: Vec<&str> = registry::all()
        .iter()
        .filter(|e| !e.applies.finite_diff)
        .map(|e| e.name)
        .collect();
    assert_eq!(
        skipped,
        ["detach", "constant", "randUniform", "bernoulliMask"]
    );
    for e in registry::all() {
        assert!(
            e.applies.forward && e.applies.backward && e.applies.adjoint,
            "{}",
            e.name
        );
        assert_eq!(
            e.note.is_empty(),
            e.applies.finite_diff,
            "{}: a skipped check says why",
            e.name
        );
    }
}

#[test]
fn generators_explore_shapes_and_parameters() {
    // A generator stuck on one shape would leave most of an op untested.
    for entry in registry::all() {
        let cases = samples(&entry, 40);
        let shapes: BTreeSet<String> = cases
            .iter()
            .map(|c| {
                format!(
                    "{:?} {:?}",
                    c.op,
                    c.inputs
                        .iter()
                        .map(|t| t.shape().clone())
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        assert!(
            shapes.len() >= 8,
            "{}: only {} distinct op/shape combinations",
            entry.name,
            shapes.len()
        );
    }
}

#[test]
fn large_cases_reach_past_small_kernel_blocks() {
    // Fast kernels switch paths on size (32 × 32 transpose tiles, GEMM micro-kernel edges, long
    // reductions): every op's large cases must include operands well beyond the small range.
    for entry in registry::all() {
        // The largest operand or output (the output of broadcastTo or a constant is the big one).
        let biggest = sized(&entry, Size::Large, 64)
            .iter()
            .flat_map(|c| {
                let inputs = c.inputs.iter().map(|t| t.numel());
                inputs.chain(std::iter::once(c.out_shape().numel()))
            })
            .max()
            .unwrap_or(0);
        assert!(
            biggest > 200,
            "{}: largest operand of 64 large cases has {biggest} elements",
            entry.name
        );
    }
}
