//! Check 7 (**7 bad input**): a backend refuses bad input with a clear error, never a panic and
//! never an `Ok`, and still works after refusing; and it does not refuse what is not bad input.
//!
//! On each case (the one-node graph of a registry entry's small case, or a random DAG) the
//! backend is called with:
//!
//! - each leaf in turn given a value of the wrong shape: one element more, the dims reversed
//!   (rank 2 and up, where that is another shape), one rank more (a leading 1: the same element
//!   count). `record` must fail, its message naming the expected and the given shape;
//! - one leaf too few and one too many: `record` fails, naming both counts;
//! - `backward_dense` on a good program with a seed of each wrong shape (naming the output's
//!   shape and the seed's) and from an id past the graph's (`len`, `usize::MAX`; naming the id);
//! - once per backend, graphs whose outputs no machine holds ([`check_oversized`]): each an
//!   error naming the op.
//!
//! Every call runs under [`std::panic::catch_unwind`]: a panic fails the case with the panic's
//! message and location. After the refused `record` calls the good case is recorded and checked
//! as check 1 does, and after the refused `backward_dense` calls the same program's values and
//! gradients are checked against the f64 IR as checks 1 and 2 do: a refused call leaves the
//! backend, and the program, as they were.
//!
//! Not bad input, so it must not be refused:
//!
//! - **a short or out-of-range Nat environment** (a graph whose ops read it: the Nat gathers,
//!   crossEntropy's labels): reads are total (SEMANTICS.md: past the end reads 0, an index out of
//!   range gathers a zero row with no gradient). The empty environment, one of huge values
//!   (`usize::MAX`, 2³² + 1: wrong if truncated to 32 bits) and one with extra entries each give
//!   the IR's values and gradients;
//! - **non-finite leaf values** (NaN, +∞, −∞ in every leaf): where the IR evaluates them, the
//!   backend records and returns every value, of the right shapes (IEEE arithmetic, no numeric
//!   comparison: NaN's propagation may differ by order of evaluation); where the IR refuses them
//!   (`log` of NaN), the backend may refuse or compute, but not panic. Its `backward_dense` on
//!   them must not panic either.
//!
//! **Panics.** A panic inside a guarded call is caught and its message and location (`file:line`)
//! are quoted in the report, not printed (`crate::guard`, which every check's cases run under
//! too).

mod oversized;

pub use oversized::{BIG, check_oversized, oversized_cases};

use tl_spec::{Shape, Tensor};

use crate::checks::{backend_inputs, backward_case, compare_ids, forward_case};
use crate::dag::{DagOptions, dag_cases};
use crate::guard::{Guarded, guard};
use crate::{Backend, CaseResult, GraphCase, Measured, OpInfo, Report, RunConfig, Tol, run_check};

/// The label's prefix: reports are `"7 bad input <op> <backend>"` and
/// `"7 bad input dag <backend>"`.
pub const BAD_INPUT: &str = "7 bad input";

/// The case count [`crate::user::check_backend`] runs check 7 with: an eighth of `cfg`'s (at
/// least 1, and 0 for 0, which every check refuses). Each case makes some twenty backend
/// calls, and the entry's small cases reach every refusal already.
pub fn bad_input_cfg(cfg: &RunConfig) -> RunConfig {
    RunConfig {
        cases: cfg.cases.div_ceil(8),
        ..*cfg
    }
}

/// Check 7 on a registry entry's small cases (or a user op's, through
/// [`crate::user::UserEntry::info`]).
pub fn check_bad_input<B: Backend>(backend: &B, entry: &OpInfo, cfg: &RunConfig) -> Report {
    let label = format!("{BAD_INPUT} {} {}", entry.name, backend.name());
    let tol = entry.tol;
    run_check(label, cfg, super::graph_cases(entry.cases()), |c| {
        bad_input_case(backend, c, &tol)
    })
}

/// Check 7 on random DAGs (several leaves, fan-out, Nat reads among the steps).
pub fn check_bad_input_dag<B: Backend>(backend: &B, cfg: &RunConfig) -> Report {
    let label = format!("{BAD_INPUT} dag {}", backend.name());
    let tol = crate::dag::DAG_TOL;
    run_check(label, cfg, dag_cases(DagOptions::default()), |c| {
        bad_input_case(backend, c, &tol)
    })
}

/// One case of check 7 (see the module documentation): every refusal, the good case after
/// them, the total Nat reads and the non-finite leaves. The measurement is the worst error of
/// the good runs against the IR.
pub fn bad_input_case<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    let graph = &case.graph;
    let (leaves, _) = backend_inputs::<B::T>(case);
    let nats = &case.nats;

    // Leaves of the wrong shape, each in turn.
    for (k, leaf) in graph.leaves().iter().enumerate() {
        for (how, shape) in wrong_shapes(&leaf.shape) {
            let mut bad = leaves.clone();
            bad[k] = Tensor::ones(shape.clone());
            let what = format!(
                "record with leaf %{k} of shape {shape} ({how}) where the graph has {}",
                leaf.shape
            );
            refused(
                &what,
                guard(|| backend.record(graph, &bad, nats).map(|_| ())),
                &[Name::Shape(&leaf.shape), Name::Shape(&shape)],
            )?;
        }
    }
    // One leaf too few, one too many.
    let n = leaves.len();
    if let Some(few) = n.checked_sub(1) {
        let what = format!("record with {few} leaf value(s) for a graph of {n} leaves");
        refused(
            &what,
            guard(|| backend.record(graph, &leaves[..few], nats).map(|_| ())),
            &[Name::Count(n), Name::Count(few)],
        )?;
    }
    let mut many = leaves.clone();
    many.push(
        leaves
            .last()
            .cloned()
            .unwrap_or_else(|| Tensor::ones(Shape::scalar())),
    );
    let what = format!(
        "record with {} leaf value(s) for a graph of {n} leaves",
        n + 1
    );
    refused(
        &what,
        guard(|| backend.record(graph, &many, nats).map(|_| ())),
        &[Name::Count(n), Name::Count(n + 1)],
    )?;

    // The backend still works: the good case, as check 1.
    let mut worst = guard(|| forward_case(backend, case, tol))
        .map_err(|p| panicked("the good case after the refused records", &p))?
        .map_err(|e| {
            format!("the good case after the refused records: {e} (or the backend is wrong on it whatever came before: see checks 1 and 2)")
        })?;

    worst = worst.max(backward_refusals(backend, case, tol)?);
    if graph.nodes().iter().any(|node| node.op().reads_nats()) {
        worst = worst.max(total_nat_reads(backend, case, tol)?);
    }
    non_finite_leaves(backend, case)?;
    Ok(worst)
}

/// `backward_dense` with seeds of the wrong shape and ids past the graph's on a good program;
/// then the same program's values and gradients against the IR (checks 1 and 2).
fn backward_refusals<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    let graph = &case.graph;
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let seed: Tensor<B::T> = case.seed.cast();
    let program = guard(|| backend.record(graph, &leaves, &case.nats))
        .map_err(|p| panicked("record of the good case", &p))?
        .map_err(|e| format!("record of the good case: {e}"))?;
    for (how, shape) in wrong_shapes(seed.shape()) {
        let bad = Tensor::<B::T>::ones(shape.clone());
        let what = format!(
            "backward_dense from %{} (shape {}) with a seed of shape {shape} ({how})",
            case.out,
            seed.shape()
        );
        refused(
            &what,
            guard(|| backend.backward_dense(&program, case.out, &bad).map(|_| ())),
            &[Name::Shape(seed.shape()), Name::Shape(&shape)],
        )?;
    }
    for id in [graph.len(), usize::MAX] {
        let what = format!(
            "backward_dense from %{id} on a graph of {} ids",
            graph.len()
        );
        refused(
            &what,
            guard(|| backend.backward_dense(&program, id, &seed).map(|_| ())),
            &[Name::Count(id)],
        )?;
    }
    // The program is as it was.
    let after = "after the refused backward_dense calls";
    let tol = backend.tolerance(tol, graph);
    let want = graph
        .eval(&reference, &case.nats)
        .map_err(|e| format!("IR eval rejected a generated case: {e}"))?;
    let got = guard(|| backend.values(&program))
        .map_err(|p| panicked(&format!("values {after}"), &p))?
        .map_err(|e| format!("values {after}: {e}"))?;
    // A backend wrong on this case anyway fails here too; checks 1 and 2 tell the two apart.
    let unless = "(or the backend is wrong on this case whatever came before: see checks 1 and 2)";
    let values = compare_ids(graph, &got, &want, tol, "value")
        .map_err(|e| format!("{after}, {e} {unless}"))?;
    let want = graph
        .backprop_all(&reference, &case.nats, case.out, &seed.cast())
        .map_err(|e| format!("IR backprop_all rejected a generated case: {e}"))?;
    let got = guard(|| backend.backward_dense(&program, case.out, &seed))
        .map_err(|p| panicked(&format!("backward_dense {after}"), &p))?
        .map_err(|e| format!("backward_dense {after}: {e}"))?;
    let grads = compare_ids(graph, &got, &want, tol, "gradient")
        .map_err(|e| format!("{after}, {e} {unless}"))?;
    Ok(values.max(grads))
}

/// The Nat environments that are not bad input: empty, huge values, extra entries. Each gives
/// the IR's values and gradients (checks 1 and 2 on the case with that environment).
fn total_nat_reads<B: Backend>(backend: &B, case: &GraphCase, tol: &Tol) -> CaseResult {
    // 2³² + 1: an index truncated to 32 bits would read row 1.
    let past_u32 = usize::try_from(u64::from(u32::MAX) + 2).unwrap_or(usize::MAX);
    let len = case.nats.len() + 1;
    let huge: Vec<usize> = (0..len)
        .map(|i| if i % 2 == 0 { usize::MAX } else { past_u32 })
        .collect();
    let mut longer = case.nats.clone();
    longer.extend([3, 7]);
    let mut worst = Measured::ZERO;
    for nats in [Vec::new(), huge, longer] {
        let with = GraphCase {
            nats: nats.clone(),
            ..case.clone()
        };
        let what = format!(
            "the Nat environment {nats:?} (reads are total: past the end reads 0, an index out of \
             range gathers zero; not bad input)"
        );
        for (check, run) in [
            (
                "values",
                forward_case::<B> as fn(&B, &GraphCase, &Tol) -> CaseResult,
            ),
            ("gradients", backward_case::<B>),
        ] {
            let m = guard(|| run(backend, &with, tol))
                .map_err(|p| panicked(&format!("{check} with {what}"), &p))?
                .map_err(|e| format!("{check} with {what}: {e}"))?;
            worst = worst.max(m);
        }
    }
    Ok(worst)
}

/// NaN, +∞ and −∞ in every leaf (first, last and middle element): computed where the IR
/// computes them, never a panic.
fn non_finite_leaves<B: Backend>(backend: &B, case: &GraphCase) -> Result<(), String> {
    let graph = &case.graph;
    let poisoned: Vec<Tensor<f64>> = case.leaves.iter().map(poison).collect();
    if poisoned.is_empty() {
        return Ok(());
    }
    let with = GraphCase {
        leaves: poisoned,
        ..case.clone()
    };
    let (leaves, reference) = backend_inputs::<B::T>(&with);
    let what = "record and values with NaN, +inf and -inf in every leaf";
    let want = guard(|| {
        graph
            .eval(&reference, &case.nats)
            .map_err(|e| e.to_string())
    })
    .map_err(|p| format!("{what}: the IR reference's eval panicked: {p}"))?;
    let recorded = guard(|| {
        let program = backend.record(graph, &leaves, &case.nats)?;
        let values = backend.values(&program)?;
        Ok((program, values))
    })
    .map_err(|p| panicked(what, &p))?;
    let program = match (want, recorded) {
        (Ok(want), Ok((program, got))) => {
            if got.len() != want.len() {
                return Err(format!(
                    "{what}: {} values for a graph of {} ids",
                    got.len(),
                    want.len()
                ));
            }
            for (id, (g, w)) in got.iter().zip(&want).enumerate() {
                if g.shape() != w.shape() {
                    return Err(format!(
                        "{what}: the value of %{id} has shape {}, the IR's {}",
                        g.shape(),
                        w.shape()
                    ));
                }
            }
            program
        }
        (Ok(_), Err(e)) => {
            return Err(format!(
                "{what}: refused ({e:?}), but non-finite values are not bad input (IEEE \
                 arithmetic; the IR computes this case)"
            ));
        }
        (Err(_), Ok((program, _))) => program,
        // Both refuse (a domain-checked op: log of NaN).
        (Err(_), Err(_)) => return Ok(()),
    };
    let seed: Tensor<B::T> = case.seed.cast();
    guard(|| {
        backend
            .backward_dense(&program, case.out, &seed)
            .map(|_| ())
    })
    .map_err(|p| panicked(&format!("backward_dense after {what}"), &p))?
    .ok();
    Ok(())
}

/// `t` with NaN at its first element, +∞ at its last and −∞ in the middle (as many as fit).
fn poison(t: &Tensor<f64>) -> Tensor<f64> {
    let mut data = t.data().to_vec();
    let n = data.len();
    for (i, v) in [
        (n / 2, f64::NEG_INFINITY),
        (n.wrapping_sub(1), f64::INFINITY),
        (0, f64::NAN),
    ] {
        if let Some(d) = data.get_mut(i) {
            *d = v;
        }
    }
    Tensor::new(t.shape().clone(), data).expect("same length as the shape")
}

/// The wrong shapes for a value of `shape`, with how each is wrong: one element more, the dims
/// reversed (where that is another shape), one rank more with the same element count.
pub fn wrong_shapes(shape: &Shape) -> Vec<(&'static str, Shape)> {
    let dims = shape.dims();
    let mut out = Vec::new();
    let mut more = dims.to_vec();
    match more.last_mut() {
        Some(d) => *d += 1,
        None => more.push(2),
    }
    out.push(("one element more", Shape::from(more)));
    let reversed: Vec<usize> = dims.iter().rev().copied().collect();
    if reversed != dims {
        out.push(("transposed", Shape::from(reversed)));
    }
    let mut ranked = vec![1];
    ranked.extend_from_slice(dims);
    out.push(("one rank more", Shape::from(ranked)));
    out
}

/// What a refusal's message must name.
enum Name<'a> {
    /// A shape, as `Shape`'s `Display` writes it (`[2, 3]`).
    Shape(&'a Shape),
    /// A count or an id, as a whole number in the text.
    Count(usize),
    /// An op, by its name.
    Op(&'a str),
}

impl Name<'_> {
    fn text(&self) -> String {
        match self {
            Name::Shape(s) => s.to_string(),
            Name::Count(n) => n.to_string(),
            Name::Op(op) => format!("the op {op}"),
        }
    }

    fn in_message(&self, msg: &str) -> bool {
        match self {
            Name::Shape(s) => msg.contains(&s.to_string()),
            Name::Count(n) => {
                let n = n.to_string();
                msg.split(|c: char| !c.is_ascii_digit()).any(|w| w == n)
            }
            Name::Op(op) => msg.contains(op),
        }
    }
}

fn panicked(what: &str, msg: &str) -> String {
    format!("{what}: the backend panicked: {msg}; bad input must be an error, never a panic")
}

/// A bad call's outcome: an error whose message is not empty and names each of `names`.
fn refused(what: &str, outcome: Guarded<()>, names: &[Name<'_>]) -> Result<(), String> {
    match outcome {
        Err(p) => Err(panicked(what, &p)),
        Ok(Ok(())) => Err(format!(
            "{what}: the backend accepted it (returned Ok); bad input must be an error"
        )),
        Ok(Err(msg)) if msg.trim().is_empty() => Err(format!(
            "{what}: the backend refused it with an empty message; the error must say what is \
             wrong"
        )),
        Ok(Err(msg)) => {
            let missing: Vec<String> = names
                .iter()
                .filter(|n| !n.in_message(&msg))
                .map(Name::text)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{what}: the error {msg:?} does not name {}",
                    missing.join(" and ")
                ))
            }
        }
    }
}
