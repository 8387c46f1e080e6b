//! Checks 1 and 2 on the CPU tape with its size-, shape- and thread-gated fast paths forced
//! ([`tl_tape_cpu::gates`]).
//!
//! The cases the registry and the DAG generator draw are small, so most gated paths of the
//! CPU tape (the GEMM's thread split and layout copies, the threaded element-wise and per-row
//! splits, the fused attention's row blocks, conv's weight-cotangent chunks, the window
//! tables' cache and runs, the element-wise staging, each SIMD level) never run in the plain
//! checks. Here a [`Gated`] backend runs the CPU tape with a [`Gates`] override installed on
//! the checking thread for every call (the tape carries it to its pool threads), and
//! [`settings`] lists the overrides the module runs under: every fast path off, every fast
//! path on (thresholds at 0 or 1) on one and on several threads, with each `x·wᵀ` layout path,
//! and at each SIMD level this CPU has. Overrides are per thread, so these checks run in
//! parallel with the rest of the suite without changing what it computes.
//!
//! - Checks 1 and 2 under each setting ([`check_gated`]): [`check_forward`]/[`check_backward`]
//!   for an entry, [`check_forward_dag`]/[`check_backward_dag`] for random DAGs, against the
//!   f64 IR with the usual tolerances.
//! - Same bits ([`check_same_bits`]): the paths that the crate documents as changing the time
//!   but not the bits (the thread count, the SIMD level, the layout copies) give values and
//!   gradients bit-identical to one thread at the baseline level without copies, with every
//!   split forced. This reaches the GEMM's sum-order guards (`split_matmul` cuts a product
//!   only where both blocks sum over k as the whole does): a wrong guard changes bits, often
//!   within tolerance.
//! - Shapes past the gates ([`check_shape_gates`]): fixed cases large enough for the gates the
//!   registry's small cases never cross (the GEMM's 16-wide kernel), checks 1 and 2 under every
//!   setting and the same bits with each such gate off as on.

use proptest::prelude::*;
use tl_ir::{GraphData, Id};
use tl_spec::{Scalar, Tensor};
use tl_tape_cpu::gates::{self, Gates, GemmLayout};
use tl_tape_cpu::simd::Level;

use crate::checks::{
    backend_inputs, check_backward, check_backward_dag, check_forward, check_forward_dag,
    op_graph_cases,
};
use crate::dag::{DagOptions, dag_cases};
use crate::{Backend, CaseResult, CpuTape, GraphCase, Measured, OpInfo, Report, RunConfig, Tol};

/// The CPU tape in `T` with `gates` installed on the calling thread for each call.
#[derive(Debug, Clone, Copy)]
pub struct Gated<T> {
    /// A short name of the setting, in report labels.
    pub label: &'static str,
    /// The overrides.
    pub gates: Gates,
    tape: CpuTape<T>,
}

impl<T: Scalar> Gated<T> {
    /// The CPU tape under `gates`, named `label` in reports.
    pub fn new(label: &'static str, gates: Gates) -> Self {
        Gated {
            label,
            gates,
            tape: CpuTape::new(),
        }
    }
}

impl<T: Scalar> Backend for Gated<T> {
    type T = T;
    type Program = <CpuTape<T> as Backend>::Program;

    fn name(&self) -> String {
        format!("{} gates={}", self.tape.name(), self.label)
    }

    fn record(
        &self,
        graph: &GraphData,
        leaves: &[Tensor<T>],
        nats: &[usize],
    ) -> Result<Self::Program, String> {
        let _forced = gates::force(self.gates);
        self.tape.record(graph, leaves, nats)
    }

    fn values(&self, program: &Self::Program) -> Result<Vec<Tensor<T>>, String> {
        let _forced = gates::force(self.gates);
        self.tape.values(program)
    }

    fn backward_dense(
        &self,
        program: &Self::Program,
        out: Id,
        seed: &Tensor<T>,
    ) -> Result<Vec<Tensor<T>>, String> {
        let _forced = gates::force(self.gates);
        self.tape.backward_dense(program, out, seed)
    }

    fn tolerance(&self, tol: &Tol, graph: &GraphData) -> f64 {
        self.tape.tolerance(tol, graph)
    }
}

/// The best SIMD level this CPU has.
fn best_level() -> Level {
    Level::available().last().copied().unwrap_or(Level::Scalar)
}

/// The overrides checks 1 and 2 run under, each with a short name: every fast path off; every
/// fast path on, on one thread with the row-major copy of `wᵀ`, on three threads with the
/// column-major product, on four with the row-major copy; and on two threads at every other
/// SIMD level this CPU has (the best level is the one the others use).
pub fn settings() -> Vec<(&'static str, Gates)> {
    let best = best_level();
    let mut s = vec![
        ("off", Gates::fast_paths_off()),
        (
            "on-t1-rowmajor",
            Gates::fast_paths_on(1)
                .with_layout(GemmLayout::RowMajorRhs)
                .with_level(best),
        ),
        ("on-t3-colmajor", Gates::fast_paths_on(3).with_level(best)),
        (
            "on-t4-rowmajor",
            Gates::fast_paths_on(4)
                .with_layout(GemmLayout::RowMajorRhs)
                .with_level(best),
        ),
    ];
    for level in Level::available() {
        let label = match level {
            Level::Scalar => "on-t2-scalar",
            Level::Avx2 => "on-t2-avx2",
            Level::Avx512 => "on-t2-avx512",
        };
        if level != best {
            s.push((label, Gates::fast_paths_on(2).with_level(level)));
        }
    }
    s
}

/// A run configuration with `cfg.cases / 4` cases (at least 2): each setting adds a full
/// pass over the registry, so each gets a slice of the usual case count (`TL_CASES` still
/// scales it).
pub fn gated_cfg(cfg: &RunConfig) -> RunConfig {
    RunConfig {
        cases: (cfg.cases / 4).max(2),
        ..*cfg
    }
}

/// Checks 1 and 2 on every applicable registry entry and on random DAGs, in `T`, under every
/// one of [`settings`], with `cfg`'s cases (see [`gated_cfg`]).
pub fn check_gated<T: Scalar>(entries: &[OpInfo], cfg: &RunConfig) -> Vec<Report> {
    let mut reports = Vec::new();
    for (label, gates) in settings() {
        let backend = Gated::<T>::new(label, gates);
        for e in entries {
            if e.applies.forward {
                reports.push(check_forward(&backend, e, cfg));
            }
            if e.applies.backward {
                reports.push(check_backward(&backend, e, cfg));
            }
        }
        reports.push(check_forward_dag(&backend, cfg));
        reports.push(check_backward_dag(&backend, cfg));
    }
    reports
}

/// The groups of settings [`check_same_bits`] compares, each a reference and the settings
/// that must give its bits: every split forced on, one query row per attention block, one
/// batch entry per weight-cotangent chunk, the cache and runs on, one value per stage; per
/// `x·wᵀ` path (strided, row-major copy, column-major product: the paths themselves sum in
/// different orders on small products, so each is its own group), the reference on one thread
/// at the baseline level, the others on 2, 3 and 4 threads at the best level and on two
/// threads at every level this CPU has.
pub fn same_bits_settings() -> Vec<(Gates, Vec<(String, Gates)>)> {
    let on = Gates::fast_paths_on;
    let best = best_level();
    let layouts = [
        GemmLayout::Strided,
        GemmLayout::RowMajorRhs,
        GemmLayout::ColumnMajor,
    ];
    layouts
        .into_iter()
        .map(|layout| {
            let reference = on(1).with_level(Level::Scalar).with_layout(layout);
            let mut others: Vec<(String, Gates)> = [2, 3, 4]
                .into_iter()
                .map(|t| {
                    let g = on(t).with_level(best).with_layout(layout);
                    (format!("{layout:?} on {t} threads at {best:?}"), g)
                })
                .collect();
            for level in Level::available() {
                let g = on(2).with_level(level).with_layout(layout);
                others.push((format!("{layout:?} on 2 threads at {level:?}"), g));
            }
            (reference, others)
        })
        .collect()
}

/// Values and dense gradients of `case` on the CPU tape in `T` under `gates`.
fn run_under<T: Scalar>(gates: Gates, case: &GraphCase) -> Result<Vec<Tensor<T>>, String> {
    let backend = Gated::<T>::new("", gates);
    let (leaves, _) = backend_inputs::<T>(case);
    let seed: Tensor<T> = case.seed.cast();
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let mut all = backend.values(&program)?;
    all.extend(backend.backward_dense(&program, case.out, &seed)?);
    Ok(all)
}

/// `case` under each of `others` gives its values and gradients under `reference` bit for
/// bit (the first differing element is named, with the setting's label).
fn same_bits_as<T: Scalar>(
    case: &GraphCase,
    reference: Gates,
    others: &[(String, Gates)],
) -> CaseResult {
    let want = run_under::<T>(reference, case)?;
    let ids = want.len() / 2;
    for (label, gates) in others {
        let got = run_under::<T>(*gates, case)?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let bits = |t: &Tensor<T>| -> Vec<u64> {
                t.data().iter().map(|x| x.as_f64().to_bits()).collect()
            };
            let (gb, wb) = (bits(g), bits(w));
            if g.shape() == w.shape() && gb == wb {
                continue;
            }
            let id = i % ids.max(1);
            let what = if i < ids { "value" } else { "gradient" };
            let origin = match case.graph.node(id) {
                Some(n) => format!("{:?}", n.op()),
                None => "leaf".to_owned(),
            };
            let at = gb.iter().zip(&wb).position(|(x, y)| x != y).unwrap_or(0);
            let (x, y) = (g.data().get(at), w.data().get(at));
            return Err(format!(
                "{what} of %{id} ({origin}) shapes {} / {}, {label}: at flat index {at} \
                 {x:?}, under the reference setting {y:?}",
                g.shape(),
                w.shape()
            ));
        }
    }
    Ok(Measured::ZERO)
}

/// One case of the same-bits check: every setting of each group of [`same_bits_settings`]
/// gives its reference's values and gradients bit for bit (the first differing element is
/// named; the reference is one thread at the baseline level).
pub fn same_bits_case<T: Scalar>(case: &GraphCase) -> CaseResult {
    for (reference, others) in same_bits_settings() {
        same_bits_as::<T>(case, reference, &others)?;
    }
    Ok(Measured::ZERO)
}

/// Fixed cases whose shapes cross gates that the registry's small cases never reach (see
/// [`check_shape_gates`]): the GEMM's 16-wide kernel (`tl_tape_cpu::gemm::NARROW_MAX_K`: a
/// product 16 wide with more than 16 rows and more than 16³ multiply-adds, at the AVX-512
/// level): a (40, 24)·(24, 16) product, and multi-head attention with heads 16 wide on 24
/// tokens (its `A·V_h`, `dS·K_h`, `Aᵀ·dO_h` and `dSᵀ·Q_h`), fused and unfused, with and
/// without a causal mask.
pub fn shape_gate_cases() -> Vec<(&'static str, GraphCase)> {
    use crate::checks::grid::{one_op, positive};
    use tl_ir::Op;
    let (n, dm) = (24, 32);
    let mha = |mask: Option<tl_spec::ops::attention::Mask>, fused: bool, seed: u64| {
        let op = Op::MultiHeadAttention {
            heads: dm / 16,
            mask,
            fused,
        };
        let w = |s: u64| positive([dm, dm], seed + s).map(|v| (v - 1.0) * 0.5);
        let x = positive([n, dm], seed + 4).map(|v| v - 1.0);
        one_op(op, vec![w(0), w(1), w(2), w(3), x], seed + 5)
    };
    let causal = || Some(tl_spec::ops::attention::Mask::causal(n).expect("a causal mask"));
    vec![
        (
            "matmul 40x24 24x16",
            one_op(
                Op::Matmul,
                vec![positive([40, 24], 1), positive([24, 16], 2)],
                3,
            ),
        ),
        ("mha heads 16 fused", mha(None, true, 10)),
        ("mha heads 16 unfused", mha(None, false, 20)),
        ("mha heads 16 causal fused", mha(causal(), true, 30)),
        ("mha heads 16 causal unfused", mha(causal(), false, 40)),
    ]
}

/// Fixed products whose thread split (forced on at every size by [`same_bits_settings`]) leaves
/// a block one row or one column wide, which faer and the gemm crate sum over k another way
/// (their matrix-vector paths): rows of 33 and 17 outputs, a column of 33, two rows and two
/// columns of 17, as `matmul` (`b` row-major) and as `linear` (`x·wᵀ`, `w` read column-major),
/// each just past nano-gemm's reach (which is never split) and deep enough (k > 16³) that a
/// one-wide block is past it too. The registry's random shapes reach such a split rarely (a
/// 17-key attention row under one seed of 256 cases did).
pub fn vector_split_cases() -> Vec<(String, GraphCase)> {
    use crate::checks::grid::{one_op, positive};
    use tl_ir::Op;
    // faer hands a product of at most 16³ multiply-adds to nano-gemm.
    let nano = 16 * 16 * 16;
    let mut cases = Vec::new();
    let mut seed = 0;
    for (m, n) in [(1, 33), (1, 17), (33, 1), (2, 17), (17, 2)] {
        for k in [nano / (m * n) + 1, nano + 5] {
            seed += 8;
            let (a, b) = (positive([m, k], seed), positive([k, n], seed + 1));
            let name = format!("matmul {m}x{k} {k}x{n}");
            cases.push((name, one_op(Op::Matmul, vec![a, b], seed + 2)));
            let (w, bias) = (positive([n, k], seed + 3), positive([n], seed + 4));
            let x = positive([m, k], seed + 5);
            let name = format!("linear x {m}x{k} w {n}x{k}");
            cases.push((name, one_op(Op::Linear, vec![w, bias, x], seed + 6)));
        }
    }
    cases
}

/// [`vector_split_cases`] in `T`: the same bits under every thread count and level, each
/// layout path ([`same_bits_case`]).
pub fn check_vector_splits<T: Scalar>() -> Report {
    let label = format!("gates same bits vector splits {}", T::NAME);
    let cases = vector_split_cases();
    let named: Vec<(&str, GraphCase)> =
        cases.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    crate::report::run_fixed(label, &named, |c| {
        same_bits_case::<T>(c).map_err(crate::CaseError::Fail)
    })
}

/// [`shape_gate_cases`] in `T`: checks 1 and 2 (against the f64 IR, [`crate::dag::DAG_TOL`])
/// under the production decisions and under every one of [`settings`]; and the same bits with
/// each of those gates off as on (production's, and every fast path on two threads at the best
/// level), which a bug in a gated path changes even within tolerance.
pub fn check_shape_gates<T: Scalar>() -> Vec<Report> {
    use crate::checks::{backward_case, forward_case};
    use crate::report::run_fixed;
    let cases = shape_gate_cases();
    let tol = crate::dag::DAG_TOL;
    let mut all = vec![("default", Gates::DEFAULT)];
    all.extend(settings());
    let mut reports = Vec::new();
    for (label, gates) in all {
        let backend = Gated::<T>::new(label, gates);
        let name = backend.name();
        reports.push(run_fixed(
            format!("1 fwd shape gates {name}"),
            &cases,
            |c| forward_case(&backend, c, &tol).map_err(crate::CaseError::Fail),
        ));
        reports.push(run_fixed(
            format!("2 bwd shape gates {name}"),
            &cases,
            |c| backward_case(&backend, c, &tol).map_err(crate::CaseError::Fail),
        ));
    }
    let off = Gates {
        narrow_max_k: Some(0),
        ..Gates::DEFAULT
    };
    let on2 = Gates::fast_paths_on(2).with_level(best_level());
    let pairs = [
        (
            off,
            (
                "the 16-wide kernel on (production)".to_owned(),
                Gates::DEFAULT,
            ),
        ),
        (
            Gates {
                narrow_max_k: Some(0),
                ..on2
            },
            (
                "the 16-wide kernel on (every fast path, 2 threads)".to_owned(),
                on2,
            ),
        ),
    ];
    for (reference, other) in pairs {
        let label = format!("gates same bits shape gates {} ({})", T::NAME, other.0);
        let others = [other];
        reports.push(run_fixed(label, &cases, |c| {
            same_bits_as::<T>(c, reference, &others).map_err(crate::CaseError::Fail)
        }));
    }
    reports
}

/// The same-bits check in `T` on every registry entry that has checks 1 and 2, and on random
/// DAGs.
pub fn check_same_bits<T: Scalar>(entries: &[OpInfo], cfg: &RunConfig) -> Vec<Report> {
    let mut reports: Vec<Report> = entries
        .iter()
        .filter(|e| e.applies.forward && e.applies.backward)
        .map(|e| {
            let label = format!("gates same bits {} {}", e.name, T::NAME);
            crate::run_check(label, cfg, op_graph_cases(e), same_bits_case::<T>)
        })
        .collect();
    let label = format!("gates same bits dag {}", T::NAME);
    let dags = dag_cases(DagOptions::default()).boxed();
    reports.push(crate::run_check(label, cfg, dags, same_bits_case::<T>));
    reports
}
