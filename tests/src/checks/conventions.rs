//! The conventions at kinks, ties and bounds (SEMANTICS.md "Pointwise"), on every backend:
//! `max`/`min` ties split the gradient in halves (`−0 = +0` is a tie), `relu'(0) = 0`,
//! `sign(0) = 0` for `abs`, `clamp` passes gradient only strictly inside its bounds (none when
//! `lo = hi`), `sqrt` has derivative 0 at `x ≤ 0`, `detach` blocks; and NaN propagates as in
//! PyTorch: `relu`, `sqrt`, `clamp` and `abs` of NaN, and `max`/`min` with a NaN on either
//! side, are NaN, each with gradient 0.
//!
//! Cases are generated *on* the kinks ([`ties`], [`at_exact`], [`clamp_at_bounds`],
//! [`with_nan`]), every value exact in f32 (so an f32 backend sees the same kinks), and their
//! expected values and gradients come from the rules above ([`ConvCase::by_rule`]), written
//! here, not taken from any backend. A fixed list of hand-worked cases ([`hand_worked`]) runs
//! with every check. [`check_conventions`] holds any [`Backend`] to them: the IR itself
//! ([`crate::backend::IrRef`]), the CPU tape in f64 (within [`F64_TOL`]) and f32, the CUDA sim
//! and any other device (within [`F32_TOL`]); a backend that states its own precision
//! ([`Backend::tolerance`]) within what it makes of them ([`CONVENTIONS_TOL`]).
//!
//! The first three generators are also the registry's `kinks` of `max`, `min`, `relu`, `abs`,
//! `sqrt` and `clamp`, from which the sim checks draw a quarter of their cases.

use std::fmt;

use proptest::prelude::*;
use proptest::strategy::Union;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor};

use crate::case::Values;
use crate::generate::{Size, any_shape, direction, elements, tensor};
use crate::metric::tensor_err;
use crate::{
    ANY, Backend, CaseResult, Domain, Measured, OpCase, Report, RunConfig, Tol, run_check,
};

/// Tolerance of an f64 backend against the rules (relative above 1, as [`crate::metric`]).
pub const F64_TOL: f64 = 1e-12;
/// Tolerance of an f32 backend against the rules: the values are exact in f32, so only the
/// rounding of `sqrt` and its derivative shows.
pub const F32_TOL: f64 = 1e-6;

/// `x` rounded to the nearest f32 (so that every backend sees the same value).
fn f32r(x: f64) -> f64 {
    x as f32 as f64
}

/// A tensor of `shape` whose element `i` is `place(choice, t)` with `choice` in `0..choices`
/// and `t` in `[0, 1)`, rounded to f32.
fn placed(
    shape: tl_spec::Shape,
    choices: u64,
    place: fn(u64, f64) -> f64,
) -> BoxedStrategy<Tensor<f64>> {
    let per_element = (0..choices, 0.0f64..1.0)
        .prop_map(move |(c, t)| f32r(place(c, t)))
        .boxed();
    let from_bits = move |bits: u64| f32r(place(bits % choices, crate::domain::unit(bits)));
    elements(shape, per_element, from_bits)
}

/// `op(a, b)` (`max` or `min`) where each element pair is a tie `a = b`, a signed-zero tie
/// (`±0` against `∓0`) or apart by at least 0.1; values exact in f32.
pub fn ties(z: Size, op: Op) -> BoxedStrategy<OpCase> {
    any_shape(z)
        .prop_flat_map(|s| {
            (
                tensor(s.clone(), ANY),
                tensor(s.clone(), Domain::AwayFromZero(0.1, 1.0)),
                placed(s, 4, |c, _| c as f64),
            )
        })
        .prop_map(move |(a, d, mode)| {
            let pick = |i: usize, first: bool| {
                let x = f32r(a.data()[i]);
                // A signed-zero tie puts −0 first where `a` is negative.
                let zero = if (x < 0.0) == first { -0.0 } else { 0.0 };
                match mode.data()[i] as u8 {
                    0 | 1 => x,
                    2 => zero,
                    _ if first => x,
                    _ => f32r(x + d.data()[i]),
                }
            };
            let sh = a.shape().clone();
            let left = Tensor::from_fn(sh.clone(), |i| pick(i, true));
            let right = Tensor::from_fn(sh, |i| pick(i, false));
            OpCase::new(op.clone(), vec![left, right])
        })
        .boxed()
}

/// `op(x)` with each element exactly `at`, `−at` (for `at = 0`: the other zero) or at least
/// 0.1 away from `at` (either side, up to 2.1); values exact in f32.
pub fn at_exact(z: Size, op: Op, at: f64) -> BoxedStrategy<OpCase> {
    any_shape(z)
        .prop_flat_map(move |s| {
            (
                tensor(s.clone(), Domain::AwayFromZero(0.1, 2.0)),
                placed(s, 3, |c, _| c as f64),
            )
        })
        .prop_map(move |(off, mode)| {
            let x = Tensor::from_fn(off.shape().clone(), |i| match mode.data()[i] as u8 {
                0 => at,
                1 if at == 0.0 => -0.0,
                _ => f32r(at + off.data()[i]),
            });
            OpCase::new(op.clone(), vec![x])
        })
        .boxed()
}

/// `clamp(lo, hi)` with bounds exact in f32 (`lo` in {−1, −0.5, −0.25, 0, 0.5}, `hi − lo` in
/// {0, 0.25, 0.5, 1, 1.5}: `lo = hi` included) and each element exactly `lo`, exactly `hi`,
/// below, inside or above.
pub fn clamp_at_bounds(z: Size) -> BoxedStrategy<OpCase> {
    (
        prop::sample::select(vec![-1.0, -0.5, -0.25, 0.0, 0.5]),
        prop::sample::select(vec![0.0, 0.25, 0.5, 1.0, 1.5]),
        any_shape(z),
    )
        .prop_flat_map(|(lo, width, s)| {
            let hi = lo + width;
            (Just((lo, hi)), placed(s, 5 * 1024, |c, t| c as f64 + t))
        })
        .prop_map(|((lo, hi), code)| {
            let x = code.map(|v| {
                let (c, t) = ((v as u64) / 1024, v.fract());
                match c {
                    0 => lo,
                    1 => hi,
                    2 => f32r(lo - 0.1 - t),
                    3 => f32r(lo + (hi - lo) * (0.25 + 0.5 * t)),
                    _ => f32r(hi + 0.1 + t),
                }
            });
            OpCase::new(Op::Clamp { lo, hi }, vec![x])
        })
        .boxed()
}

/// `op(x)` (`relu`, `abs`, `sqrt`, `clamp(−0.5, 0.75)`) or `op(a, b)` (`max`, `min`) with NaN
/// in about a third of each operand's elements, the others in `[−2, 2]`, exact in f32.
pub fn with_nan(z: Size, op: Op) -> BoxedStrategy<OpCase> {
    let arity = if matches!(op, Op::Max | Op::Min) {
        2
    } else {
        1
    };
    let operand = |s: tl_spec::Shape| {
        (tensor(s.clone(), ANY), placed(s, 3, |c, _| c as f64)).prop_map(|(x, mode)| {
            Tensor::from_fn(x.shape().clone(), |i| {
                if mode.data()[i] == 0.0 {
                    f64::NAN
                } else {
                    f32r(x.data()[i])
                }
            })
        })
    };
    any_shape(z)
        .prop_flat_map(move |s| prop::collection::vec(operand(s), arity))
        .prop_map(move |xs| OpCase::new(op.clone(), xs))
        .boxed()
}

/// A case with the value and leaf gradients the conventions prescribe for cotangent `g`.
#[derive(Clone)]
pub struct ConvCase {
    /// The op and its operands.
    pub case: OpCase,
    /// The cotangent of the output (exact in f32).
    pub g: Tensor<f64>,
    /// The prescribed value.
    pub value: Tensor<f64>,
    /// The prescribed gradient of each operand.
    pub grads: Vec<Tensor<f64>>,
}

impl fmt::Debug for ConvCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.case)?;
        writeln!(f, "  g = {}", Values(&self.g))?;
        writeln!(f, "  expected value = {}", Values(&self.value))?;
        for (k, t) in self.grads.iter().enumerate() {
            writeln!(f, "  expected grad of x{k} = {}", Values(t))?;
        }
        Ok(())
    }
}

/// The share of the gradient the first operand of `max(a, b)` gets: 1, ½ on a tie, 0.
fn max_weight(a: f64, b: f64) -> f64 {
    if a > b {
        1.0
    } else if a == b {
        0.5
    } else {
        0.0
    }
}

impl ConvCase {
    /// `case` with cotangent `g` (rounded to f32) and the value and gradients the conventions
    /// give. Panics for an op without a rule here (the generators above make only ops with one).
    pub fn by_rule(case: OpCase, g: &Tensor<f64>) -> Self {
        let g = g.map(f32r);
        let x = &case.inputs[0];
        let sh = x.shape().clone();
        let each = |f: &dyn Fn(f64, f64) -> f64| {
            Tensor::from_fn(sh.clone(), |i| f(x.data()[i], g.data()[i]))
        };
        let (value, grads) = match &case.op {
            Op::Max | Op::Min => {
                let y = &case.inputs[1];
                let (a, b) = (x.data(), y.data());
                let max = case.op == Op::Max;
                // min is max with the order reversed.
                let w = |i: usize, first: bool| {
                    let (p, q) = if first { (a[i], b[i]) } else { (b[i], a[i]) };
                    if max {
                        max_weight(p, q)
                    } else {
                        max_weight(q, p)
                    }
                };
                let value = Tensor::from_fn(sh.clone(), |i| {
                    let first = if max { a[i] >= b[i] } else { a[i] <= b[i] };
                    if a[i].is_nan() || b[i].is_nan() {
                        f64::NAN
                    } else if first {
                        a[i]
                    } else {
                        b[i]
                    }
                });
                let da = Tensor::from_fn(sh.clone(), |i| w(i, true) * g.data()[i]);
                let db = Tensor::from_fn(sh.clone(), |i| w(i, false) * g.data()[i]);
                (value, vec![da, db])
            }
            Op::Relu => (
                each(&|v, _| if v > 0.0 || v.is_nan() { v } else { 0.0 }),
                vec![each(&|v, g| if v > 0.0 { g } else { 0.0 })],
            ),
            Op::Abs => (
                each(&|v, _| v.abs()),
                vec![each(&|v, g| {
                    if v > 0.0 {
                        g
                    } else if v < 0.0 {
                        -g
                    } else {
                        0.0
                    }
                })],
            ),
            Op::Sqrt => (
                each(&|v, _| if v > 0.0 || v.is_nan() { v.sqrt() } else { 0.0 }),
                vec![each(&|v, g| {
                    if v > 0.0 { g / (2.0 * v.sqrt()) } else { 0.0 }
                })],
            ),
            &Op::Clamp { lo, hi } => (
                each(&|v, _| {
                    if v < lo {
                        lo
                    } else if v > hi {
                        hi
                    } else {
                        v
                    }
                }),
                vec![each(&|v, g| if v > lo && v < hi { g } else { 0.0 })],
            ),
            Op::Detach => (x.clone(), vec![each(&|_, _| 0.0)]),
            op => panic!("no convention rule for {op:?}"),
        };
        ConvCase {
            case,
            g,
            value,
            grads,
        }
    }
}

/// Generated convention cases: ties of `max`/`min`, exact zeros of `relu`/`abs`/`sqrt`, the
/// bounds of `clamp`, NaN through `relu`/`abs`/`sqrt`/`clamp`/`max`/`min`; small sizes three
/// times in four.
pub fn convention_cases() -> BoxedStrategy<ConvCase> {
    let gens: Vec<fn(Size) -> BoxedStrategy<OpCase>> = vec![
        |z| ties(z, Op::Max),
        |z| ties(z, Op::Min),
        |z| at_exact(z, Op::Relu, 0.0),
        |z| at_exact(z, Op::Abs, 0.0),
        |z| at_exact(z, Op::Sqrt, 0.0),
        clamp_at_bounds,
        |z| with_nan(z, Op::Relu),
        |z| with_nan(z, Op::Abs),
        |z| with_nan(z, Op::Sqrt),
        |z| with_nan(z, Op::Clamp { lo: -0.5, hi: 0.75 }),
        |z| with_nan(z, Op::Max),
        |z| with_nan(z, Op::Min),
    ];
    let arms: Vec<BoxedStrategy<OpCase>> = gens
        .into_iter()
        .map(|f| prop_oneof![3 => f(Size::Small), 1 => f(Size::Large)].boxed())
        .collect();
    Union::new(arms)
        .prop_flat_map(|case| {
            let s = case.out_shape();
            (Just(case), direction(s))
        })
        .prop_map(|(case, g)| ConvCase::by_rule(case, &g))
        .boxed()
}

fn v(x: &[f64]) -> Tensor<f64> {
    Tensor::vector(x.to_vec())
}

/// One hand-worked case: `op(inputs)` with cotangent `g` must give `value` and `grads`.
fn hand(op: Op, inputs: &[&[f64]], g: &[f64], value: &[f64], grads: &[&[f64]]) -> ConvCase {
    ConvCase {
        case: OpCase::new(op, inputs.iter().map(|x| v(x)).collect()),
        g: v(g),
        value: v(value),
        grads: grads.iter().map(|x| v(x)).collect(),
    }
}

/// The hand-worked cases, values and gradients written out: ties, kinks, bounds, signed zeros
/// and NaN.
pub fn hand_worked() -> Vec<ConvCase> {
    let nan = f64::NAN;
    let (a, b) = (&[1.0, 2.0, 3.0][..], &[1.0, 5.0, 0.0][..]);
    let g4 = &[4.0, 4.0, 4.0][..];
    let g4_4 = &[4.0, 4.0, 4.0, 4.0][..];
    let x = &[-1.0, 0.0, 2.0][..];
    let ones = &[1.0, 1.0, 1.0][..];
    vec![
        hand(
            Op::Max,
            &[a, b],
            g4,
            &[1.0, 5.0, 3.0],
            &[&[2.0, 0.0, 4.0], &[2.0, 4.0, 0.0]],
        ),
        hand(
            Op::Min,
            &[a, b],
            g4,
            &[1.0, 2.0, 0.0],
            &[&[2.0, 4.0, 0.0], &[2.0, 0.0, 4.0]],
        ),
        hand(Op::Relu, &[x], ones, &[0.0, 0.0, 2.0], &[&[0.0, 0.0, 1.0]]),
        hand(Op::Abs, &[x], ones, &[1.0, 0.0, 2.0], &[&[-1.0, 0.0, 1.0]]),
        hand(
            Op::Sqrt,
            &[&[0.0, -1.0, 4.0]],
            ones,
            &[0.0, 0.0, 2.0],
            &[&[0.0, 0.0, 0.25]],
        ),
        hand(Op::Detach, &[x], ones, x, &[&[0.0, 0.0, 0.0]]),
        hand(
            Op::Clamp { lo: -1.0, hi: 1.0 },
            &[&[-1.0, -0.5, 0.0, 1.0, 2.0]],
            &[1.0; 5],
            &[-1.0, -0.5, 0.0, 1.0, 1.0],
            &[&[0.0, 1.0, 1.0, 0.0, 0.0]],
        ),
        // A degenerate clamp (lo = hi) passes no gradient anywhere.
        hand(
            Op::Clamp { lo: 0.5, hi: 0.5 },
            &[&[0.0, 0.5, 1.0]],
            ones,
            &[0.5, 0.5, 0.5],
            &[&[0.0, 0.0, 0.0]],
        ),
        // Signed zeros: −0 is a zero (a kink, a bound) and ties with +0.
        hand(
            Op::Relu,
            &[&[-0.0, 0.0]],
            &[1.0, 1.0],
            &[0.0, 0.0],
            &[&[0.0, 0.0]],
        ),
        hand(Op::Abs, &[&[-0.0]], &[1.0], &[0.0], &[&[0.0]]),
        hand(Op::Sqrt, &[&[-0.0]], &[1.0], &[0.0], &[&[0.0]]),
        hand(
            Op::Max,
            &[&[-0.0, 0.0], &[0.0, -0.0]],
            &[2.0, 2.0],
            &[0.0, 0.0],
            &[&[1.0, 1.0], &[1.0, 1.0]],
        ),
        hand(
            Op::Min,
            &[&[-0.0, 0.0], &[0.0, -0.0]],
            &[2.0, 2.0],
            &[0.0, 0.0],
            &[&[1.0, 1.0], &[1.0, 1.0]],
        ),
        hand(
            Op::Clamp { lo: 0.0, hi: 1.0 },
            &[&[-0.0, 0.0]],
            &[1.0, 1.0],
            &[0.0, 0.0],
            &[&[0.0, 0.0]],
        ),
        // NaN propagates (PyTorch): relu, sqrt, abs, clamp, max and min give NaN; no gradient.
        hand(
            Op::Relu,
            &[&[nan, 1.0]],
            &[1.0, 1.0],
            &[nan, 1.0],
            &[&[0.0, 1.0]],
        ),
        hand(
            Op::Sqrt,
            &[&[nan, 4.0]],
            &[1.0, 1.0],
            &[nan, 2.0],
            &[&[0.0, 0.25]],
        ),
        hand(
            Op::Abs,
            &[&[nan, -2.0]],
            &[1.0, 1.0],
            &[nan, 2.0],
            &[&[0.0, -1.0]],
        ),
        hand(
            Op::Clamp { lo: -1.0, hi: 1.0 },
            &[&[nan, 0.0]],
            &[1.0, 1.0],
            &[nan, 0.0],
            &[&[0.0, 1.0]],
        ),
        hand(
            Op::Max,
            &[&[nan, 1.0, nan, 2.0], &[1.0, nan, nan, 1.0]],
            g4_4,
            &[nan, nan, nan, 2.0],
            &[&[0.0, 0.0, 0.0, 4.0], &[0.0, 0.0, 0.0, 0.0]],
        ),
        hand(
            Op::Min,
            &[&[nan, 1.0, nan, 2.0], &[1.0, nan, nan, 1.0]],
            g4_4,
            &[nan, nan, nan, 1.0],
            &[&[0.0, 0.0, 0.0, 0.0], &[0.0, 0.0, 0.0, 4.0]],
        ),
        // maxPool: a NaN anywhere in a window is its max and takes its gradient, the first NaN
        // where there are two; ties go to the first cell; padding is no cell.
        pooled(
            (&[2], &[2], &[0]),
            &[1.0, nan, 3.0, 3.0, nan, nan],
            &[1.0, 2.0, 4.0],
            &[nan, 3.0, nan],
            &[0.0, 1.0, 2.0, 0.0, 4.0, 0.0],
        ),
        pooled(
            (&[3], &[1], &[1]),
            &[3.0, 1.0, nan, 2.0, 0.0, 5.0, 4.0],
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
            &[3.0, nan, nan, nan, 5.0, 5.0, 5.0],
            &[1.0, 0.0, 14.0, 0.0, 0.0, 112.0, 0.0],
        ),
    ]
}

/// A hand-worked `maxPool(kernel, stride, padding)` case on one channel (1, len).
fn pooled(
    (kernel, stride, padding): (&[usize], &[usize], &[usize]),
    x: &[f64],
    g: &[f64],
    value: &[f64],
    grad: &[f64],
) -> ConvCase {
    let row = |v: &[f64]| Tensor::new([1, v.len()], v.to_vec()).expect("a (1, len) row");
    let op = Op::MaxPool {
        kernel: kernel.to_vec(),
        stride: stride.to_vec(),
        padding: padding.to_vec(),
    };
    ConvCase {
        case: OpCase::new(op, vec![row(x)]),
        g: row(g),
        value: row(value),
        grads: vec![row(grad)],
    }
}

/// The conventions' tolerances as a check's [`Tol`] ([`F64_TOL`], [`F32_TOL`]), which
/// [`Backend::tolerance`] turns into the backend's: by default [`F64_TOL`] or [`F32_TOL`]
/// themselves, since no convention case holds a reduction of more than 64 terms, past which
/// [`Tol::f32_for`] would scale `F32_TOL` (`the_default_tolerance_is_the_conventions_own`).
pub const CONVENTIONS_TOL: Tol = Tol {
    f64: F64_TOL,
    f32: F32_TOL,
    ..Tol::DEFAULT
};

/// One case on `backend`: the output value (and, with `grads`, every operand's gradient) equal
/// the prescribed ones within the backend's tolerance; NaN must meet NaN.
pub fn convention_case<B: Backend>(backend: &B, c: &ConvCase, grads: bool) -> CaseResult {
    let (graph, out) = c.case.graph(&[]);
    let leaves: Vec<Tensor<B::T>> = c.case.inputs.iter().map(Tensor::cast).collect();
    let tol = backend.tolerance(&CONVENTIONS_TOL, &graph);
    let op = &c.case.op;
    let program = backend.record(&graph, &leaves, &c.case.nats)?;
    let values = backend.values(&program)?;
    let got = values
        .get(out)
        .ok_or_else(|| format!("{op:?}: no value for the output"))?;
    let compare = |got: &Tensor<B::T>, want: &Tensor<f64>, what: &str| {
        if got.shape() != want.shape() {
            return Err(format!(
                "{op:?}: {what} has shape {}, expected {}",
                got.shape(),
                want.shape()
            ));
        }
        Measured::check(tensor_err(got, want), tol, || {
            let at = got
                .data()
                .iter()
                .zip(want.data())
                .position(|(g, w)| tensor_err(&Tensor::scalar(*g), &Tensor::scalar(*w)) > tol)
                .unwrap_or(0);
            format!(
                "{op:?} on {}: {what} at flat index {at} is {}, the convention gives {}",
                backend.name(),
                got.data()[at].as_f64(),
                want.data()[at]
            )
        })
    };
    let mut m = compare(got, &c.value, "the value")?;
    if grads {
        let gs = backend.backward_dense(&program, out, &c.g.cast())?;
        for (k, want) in c.grads.iter().enumerate() {
            let got = gs
                .get(k)
                .ok_or_else(|| format!("{op:?}: no gradient for x{k}"))?;
            m = m.max(compare(got, want, &format!("the gradient of x{k}"))?);
        }
    }
    Ok(m)
}

/// The conventions on `backend`: every [`hand_worked`] case, then `cfg.cases` generated ones
/// ([`convention_cases`]); values only, or values and gradients (`grads`). The label says
/// which (`"1 fwd conventions cpu-f32"`, `"2 bwd conventions cuda-sim"`).
pub fn check_conventions<B: Backend>(backend: &B, cfg: &RunConfig, grads: bool) -> Report {
    let check = if grads { "2 bwd" } else { "1 fwd" };
    let label = format!("{check} conventions {}", backend.name());
    let mut report = run_check(label, cfg, convention_cases(), |c| {
        convention_case(backend, c, grads)
    });
    for c in hand_worked() {
        // A case holding an op the backend does not support is not judged.
        let case = || convention_case(backend, &c, grads);
        let outcome = match crate::backend::partial::unless_lacking(case) {
            Ok(outcome) => outcome,
            Err(lacks) => {
                for op in lacks {
                    if !report.pending.contains(&op) {
                        report.pending.push(op);
                    }
                }
                continue;
            }
        };
        match outcome {
            Ok(m) => {
                report.max_err = report.max_err.max(m.err);
                report.tol = report.tol.max(m.tol);
            }
            Err(e) => {
                if report.failure.is_none() {
                    report.failure = Some(format!("hand-worked case: {e}\n{c:?}"));
                }
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use proptest::strategy::{Strategy, ValueTree};

    use super::{CONVENTIONS_TOL, F32_TOL, F64_TOL, convention_cases, hand_worked};
    use crate::RunConfig;
    use crate::checks::backend_tol;

    /// `Backend::tolerance`'s default on the conventions' cases (every hand-worked one, 256
    /// drawn) is `F64_TOL` or `F32_TOL` exactly: none reduces over more than 64 terms.
    #[test]
    fn the_default_tolerance_is_the_conventions_own() {
        let mut runner = RunConfig::default().runner("conventions tolerance");
        let drawn = (0..256).map(|_| {
            let tree = convention_cases().new_tree(&mut runner);
            tree.expect("the conventions' generators draw").current()
        });
        for c in hand_worked().into_iter().chain(drawn) {
            let (graph, _) = c.case.graph(&[]);
            assert_eq!(
                backend_tol::<f64>(&CONVENTIONS_TOL, &graph),
                F64_TOL,
                "{c:?}"
            );
            assert_eq!(
                backend_tol::<f32>(&CONVENTIONS_TOL, &graph),
                F32_TOL,
                "{c:?}"
            );
        }
    }
}
