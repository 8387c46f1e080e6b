//! Hard inputs: where f32 arithmetic goes wrong unless the formula is the stable one. Each
//! family draws cases the registry's generators keep away from, and an f32 backend (the CPU
//! tape in f32, the CUDA sim, the emulated kernels) must match the f64 IR on the same
//! (f32-rounded) inputs, values and gradients, within the family's documented tolerance
//! (scaled by reduction length as every f32 tolerance; docs/verification.md "Hard inputs"):
//!
//! | family | inputs | what it catches |
//! | --- | --- | --- |
//! | `layerNorm offset` | groups with mean ±1e3–2e3, spread 1–16 (the registry's levels) | a one-pass variance `E[x²] − μ²` (cancels at 1e6), and `x − μ` with μ rounded to f32 (off by up to half an ulp of 1e3 in every normalized value) |
//! | `batchnorm offset` | the same per channel | the same |
//! | `layerNorm tiny variance` | groups `c + 1e-3·levels`, `c` in ±2, ε = 1e-6 | the same, a variance not clamped at 0, and a group centred on its f32 mean (the mean's rounding is ill-conditioned in the gradient) |
//! | `softmax ±80` | logits in [−80, 80] | `exp` without subtracting the row max (overflows at 88.7) |
//! | `logSoftmax ±80` | the same | the same, and `log(softmax)` (underflows to −∞) |
//! | `crossEntropy ±80` | the same | the same |
//! | `exp near overflow` | x in [80, 88.5] | an `exp` that saturates or overflows early |

use std::fmt;

use proptest::prelude::*;
use proptest::strategy::Union;
use tl_ir::Op;
use tl_spec::Tensor;

use crate::checks::{backward_case, forward_case, graph_cases};
use crate::entries::{batch_norm, cross_entropy, layer_norm};
use crate::generate::{Size, capped, shape, tensor};
use crate::{Backend, CaseResult, Domain, GraphCase, OpCase, Report, RunConfig, Tol, run_check};

/// One family of hard inputs: a name, a case generator and the f32 tolerance (before scaling
/// by reduction length) its cases are held to.
#[derive(Clone, Copy)]
pub struct HardFamily {
    /// What the family is (`"layerNorm offset"`).
    pub name: &'static str,
    /// Its cases.
    pub cases: fn(Size) -> BoxedStrategy<OpCase>,
    /// The tolerances (`Tol::f32` is the family's).
    pub tol: Tol,
    /// Whether its gradients are checked too (check 2). Every family here does; a family
    /// whose gradient f32 cannot meet at any fixed tolerance (an ill-conditioned one) would
    /// check values only.
    pub grads: bool,
}

impl fmt::Debug for HardFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (f32 tol {:e})", self.name, self.tol.f32)
    }
}

/// The f32 tolerance of the offset families (before scaling): the default. The backends centre
/// each group on its first element (docs/semantics.md, "Norm"), so `x − μ` carries the
/// rounding of the group's spread, not of its mean: the worst measured over 17 seeds of 1,024
/// cases is 2.7e-6 (docs/verification.md, "Hard inputs"). Centred on the f32 mean, these
/// families miss the f64 gradients by up to 2e-3 (that mean's half-ulp error near 1e3 against
/// a spread down to 0.2).
pub const NORM_OFFSET_TOL: f64 = Tol::DEFAULT.f32;
/// The f32 tolerance of `layerNorm tiny variance`: twice the default, the input gradient's
/// projection term cancelling to a percent of its parts in two-element groups (worst measured
/// 3.8e-5 on the sim over 17 seeds of 1,024 cases). Centred on the f32 mean, the gradients
/// miss by up to 1.5e-2 (its rounding, 2.4e-7 near 2, times rstd up to 1000).
pub const TINY_VAR_TOL: f64 = 2.0 * Tol::DEFAULT.f32;
/// The f32 tolerance of the large-logit and near-overflow families: the default.
pub const LOGIT_TOL: f64 = Tol::DEFAULT.f32;

fn tol(f32: f64) -> Tol {
    Tol {
        f32,
        ..Tol::DEFAULT
    }
}

/// Every element of `x` moved by `m`.
fn offset(x: Tensor<f64>, m: f64) -> Tensor<f64> {
    x.map(|v| m + v)
}

/// The registry's `layerNorm` cases (each row a permutation of levels 1 apart, jittered by at
/// most 0.3: a spread of 1–16 that shrinking cannot collapse) moved by `±[1e3, 2e3)`.
fn layer_norm_offset(z: Size) -> BoxedStrategy<OpCase> {
    (layer_norm(z), prop_oneof![1e3f64..2e3, -2e3f64..-1e3])
        .prop_map(|(mut c, m)| {
            c.inputs[0] = offset(c.inputs[0].clone(), m);
            c
        })
        .boxed()
}

/// The registry's `batchnormChannelFirst` cases (spread as for layerNorm, per channel) moved
/// by `±[1e3, 2e3)`.
fn batch_norm_offset(z: Size) -> BoxedStrategy<OpCase> {
    (batch_norm(z), prop_oneof![1e3f64..2e3, -2e3f64..-1e3])
        .prop_map(|(mut c, m)| {
            c.inputs[0] = offset(c.inputs[0].clone(), m);
            c
        })
        .boxed()
}

/// The registry's `layerNorm` cases scaled by 1e-3 (levels 1e-3 apart: variances 1e-7 to
/// 1e-5, next to ε) around `c` in [−2, 2], with ε = 1e-6.
fn layer_norm_tiny_variance(z: Size) -> BoxedStrategy<OpCase> {
    (layer_norm(z), -2.0f64..=2.0)
        .prop_map(|(mut c, m)| {
            c.op = Op::LayerNorm { eps: 1e-6 };
            c.inputs[0] = c.inputs[0].map(|v| m + 1e-3 * v);
            c
        })
        .boxed()
}

/// `op(x)` on rows of 1–40 (large: up to 512) logits in [−80, 80].
fn large_logits(z: Size, op: Op) -> BoxedStrategy<OpCase> {
    capped(shape(1..=2, 1..=z.pick(40, 512)))
        .prop_flat_map(move |s| {
            let op = op.clone();
            tensor(s, Domain::Any(80.0)).prop_map(move |x| OpCase::new(op.clone(), vec![x]))
        })
        .boxed()
}

/// The registry's `crossEntropy` cases with logits scaled from [−3, 3] to [−80, 80].
fn cross_entropy_large(z: Size) -> BoxedStrategy<OpCase> {
    cross_entropy(z)
        .prop_map(|mut c| {
            c.inputs[0] = c.inputs[0].map(|v| v * 80.0 / 3.0);
            c
        })
        .boxed()
}

/// `exp(x)` with x in [80, 88.5] (f32 overflows above 88.72).
fn exp_near_overflow(z: Size) -> BoxedStrategy<OpCase> {
    capped(shape(1..=2, 1..=z.pick(8, 64)))
        .prop_flat_map(|s| tensor(s, Domain::Positive(80.0, 88.5)))
        .prop_map(|x| OpCase::new(Op::Exp, vec![x]))
        .boxed()
}

/// Every family.
pub fn families() -> Vec<HardFamily> {
    let fam = |name, cases, f32| HardFamily {
        name,
        cases,
        tol: tol(f32),
        grads: true,
    };
    vec![
        fam("layerNorm offset", layer_norm_offset, NORM_OFFSET_TOL),
        fam("batchnorm offset", batch_norm_offset, NORM_OFFSET_TOL),
        fam(
            "layerNorm tiny variance",
            layer_norm_tiny_variance,
            TINY_VAR_TOL,
        ),
        fam("softmax ±80", |z| large_logits(z, Op::Softmax), LOGIT_TOL),
        fam(
            "logSoftmax ±80",
            |z| large_logits(z, Op::LogSoftmax),
            LOGIT_TOL,
        ),
        fam("crossEntropy ±80", cross_entropy_large, LOGIT_TOL),
        fam("exp near overflow", exp_near_overflow, LOGIT_TOL),
    ]
}

/// A hard case: the family it comes from and the graph case.
#[derive(Clone)]
pub struct HardCase {
    /// The family.
    pub family: HardFamily,
    /// The one-op graph, leaves, seed.
    pub case: GraphCase,
}

impl fmt::Debug for HardCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "hard inputs: {:?}", self.family)?;
        write!(f, "{:?}", self.case)
    }
}

/// Cases of `families` (each equally likely; small sizes three times in four).
pub fn hard_cases(families: Vec<HardFamily>) -> BoxedStrategy<HardCase> {
    let arms: Vec<BoxedStrategy<HardCase>> = families
        .into_iter()
        .map(|fam| {
            let ops = prop_oneof![3 => (fam.cases)(Size::Small), 1 => (fam.cases)(Size::Large)];
            graph_cases(ops.boxed())
                .prop_map(move |case| HardCase { family: fam, case })
                .boxed()
        })
        .collect();
    Union::new(arms).boxed()
}

/// One hard case on `backend`: values (check 1) and, with `grads` where its family checks
/// them ([`HardFamily::grads`]), gradients (check 2) against the f64 IR, within the family's
/// tolerance.
pub fn hard_case<B: Backend>(backend: &B, c: &HardCase, grads: bool) -> CaseResult {
    let tag = |e: String| format!("{}: {e}", c.family.name);
    let m = forward_case(backend, &c.case, &c.family.tol).map_err(tag)?;
    if !grads || !c.family.grads {
        return Ok(m);
    }
    Ok(m.max(backward_case(backend, &c.case, &c.family.tol).map_err(tag)?))
}

/// The hard inputs on `backend`, `cfg.cases` cases over every family; values only or values
/// and gradients (`grads`).
pub fn check_hard<B: Backend>(backend: &B, cfg: &RunConfig, grads: bool) -> Report {
    check_hard_families(backend, cfg, grads, families())
}

/// [`check_hard`] over the given families only (labelled with the family's name when there
/// is one).
pub fn check_hard_families<B: Backend>(
    backend: &B,
    cfg: &RunConfig,
    grads: bool,
    families: Vec<HardFamily>,
) -> Report {
    let grads = grads && families.iter().any(|f| f.grads);
    let check = if grads { "2 bwd" } else { "1 fwd" };
    let what = match families.as_slice() {
        [one] => one.name,
        _ => "hard inputs",
    };
    let label = format!("{check} {what} {}", backend.name());
    run_check(label, cfg, hard_cases(families), |c| {
        hard_case(backend, c, grads)
    })
}
