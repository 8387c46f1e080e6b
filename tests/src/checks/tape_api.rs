//! The tape API beyond `backward_dense` ([`TapeApi`]), on random DAGs, against the f64 IR:
//!
//! - `backward_dense_from` with two seeds (at the output and at a random node `m`) equals the
//!   sum of the two `backprop_all`s (reverse accumulation is linear in the seeds);
//! - `backward_first_n(n, ·)` with those seeds, `m < n`, visits only ids below `n`: ids below
//!   `n` get the `backprop_all` of every seed placed below `n`, ids from `n` on keep the seed
//!   array unchanged;
//! - `backward_params(out, seed, wanted)` (every leaf, `m`, and leaf 0 twice) equals the same
//!   backend's `backward_dense` at those ids, bit for bit (the sparse path is the same sweep).

use proptest::prelude::*;
use tl_ir::GraphData;
use tl_spec::Tensor;

use crate::checks::sim::{pending_aware, sim_dag_cases, sim_pending_ops};
use crate::checks::{backend_inputs, compare_ids_floored, reference_floors};
use crate::dag::{DAG_TOL, DagOptions, dag_cases};
use crate::generate::direction;
use crate::metric::tensor_err;
use crate::{
    Backend, CaseResult, CudaSim, GraphCase, Measured, OnPending, Report, RunConfig, TapeApi, With,
    run_check, run_check_pending,
};

/// A DAG case with a second seed at node `m` and a cut `n` (`m < n ≤ len`).
pub type ApiCase = With<(GraphCase, usize, usize)>;

/// Random DAG cases for the tape-API check.
pub fn api_cases(dags: BoxedStrategy<GraphCase>) -> BoxedStrategy<ApiCase> {
    dags.prop_flat_map(|case| {
        let (nl, len) = (case.graph.num_leaves(), case.graph.len());
        (Just(case), nl..len, any::<prop::sample::Index>())
    })
    .prop_flat_map(|(case, m, cut)| {
        let n = m + 1 + cut.index(case.graph.len() - m);
        let shape = case.graph.shape(m).expect("a node of the graph").clone();
        (Just((case, m, n)), direction(shape))
    })
    .prop_map(|(case, s2)| With {
        case,
        extra: vec![("second seed (at node m)", s2)],
    })
    .boxed()
}

fn add_at(grads: &mut [Tensor<f64>], id: usize, t: &Tensor<f64>) -> Result<(), String> {
    grads[id] = grads[id]
        .zip_map("add", t, |a, b| a + b)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// One case of the tape-API check on `backend`.
pub fn tape_api_case<B: TapeApi>(backend: &B, c: &ApiCase) -> CaseResult {
    let (case, m, n) = (&c.case.0, c.case.1, c.case.2);
    let (leaves, reference) = backend_inputs::<B::T>(case);
    let seed: Tensor<B::T> = case.seed.cast();
    let s2: Tensor<B::T> = c.extra[0].1.cast();
    let tol = backend.tolerance(&DAG_TOL, &case.graph);
    let ir = |at: usize, s: &Tensor<B::T>| {
        case.graph
            .backprop_all(&reference, &case.nats, at, &s.cast())
            .map_err(|e| format!("IR backprop_all failed: {e}"))
    };
    let zeros: Vec<Tensor<f64>> = (0..case.graph.len())
        .map(|id| Tensor::zeros(case.graph.shape(id).expect("id").clone()))
        .collect();
    let mut grads0 = zeros.clone();
    add_at(&mut grads0, case.out, &seed.cast())?;
    add_at(&mut grads0, m, &s2.cast())?;
    let grads0_t: Vec<Tensor<B::T>> = grads0.iter().map(Tensor::cast).collect();
    let (from_out, from_m) = (ir(case.out, &seed)?, ir(m, &s2)?);
    // The IR's own error in the backend's precision, for each seed's backprop: an id's
    // tolerance is at least the floors of the backprops summed there
    // (`checks::reference_floors`, as checks 1 and 2 on DAGs).
    let floors = |at: usize, s: &Tensor<B::T>, want: &[Tensor<f64>]| {
        let own = |g: &GraphData, l: &[Tensor<B::T>], id: &dyn Fn(usize) -> usize| {
            g.backprop_all(l, &case.nats, id(at), s).ok()
        };
        reference_floors(&case.graph, &leaves, own, want)
    };
    let (floor_out, floor_m) = (floors(case.out, &seed, &from_out), floors(m, &s2, &from_m));
    let floor = |id: usize, both: bool| {
        let at = |f: &[f64]| f.get(id).copied().unwrap_or(0.0);
        at(&floor_m) + if both { at(&floor_out) } else { 0.0 }
    };
    let floors_from: Vec<f64> = (0..case.graph.len()).map(|id| floor(id, true)).collect();
    let floors_first_n: Vec<f64> = (0..case.graph.len())
        .map(|id| floor(id, case.out < n))
        .collect();

    // backward_dense_from: the sum of both backprops.
    let mut want = from_out.clone();
    for (id, g) in from_m.iter().enumerate() {
        add_at(&mut want, id, g)?;
    }
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.backward_dense_from(&program, &grads0_t)?;
    let mut worst = compare_ids_floored(
        &case.graph,
        &got,
        &want,
        tol,
        &floors_from,
        "backward_dense_from gradient",
    )
    .map_err(|e| format!("seeds at %{} and %{m}: {e}", case.out))?;

    // backward_first_n: seeds below n propagate, the rest of the array is left as given.
    let mut want = from_m;
    if case.out < n {
        for (id, g) in from_out.iter().enumerate() {
            add_at(&mut want, id, g)?;
        }
    } else {
        add_at(&mut want, case.out, &seed.cast())?;
    }
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let got = backend.backward_first_n(&program, n, &grads0_t)?;
    worst = worst.max(
        compare_ids_floored(
            &case.graph,
            &got,
            &want,
            tol,
            &floors_first_n,
            "backward_first_n gradient",
        )
        .map_err(|e| format!("n = {n}, seeds at %{} and %{m}: {e}", case.out))?,
    );

    // backward_params: the dense result at the wanted ids, exactly.
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let dense = backend.backward_dense(&program, case.out, &seed)?;
    let program = backend.record(&case.graph, &leaves, &case.nats)?;
    let mut wanted: Vec<usize> = (0..case.graph.num_leaves()).collect();
    wanted.extend([m, 0]);
    let sparse = backend.backward_params(&program, case.out, &seed, &wanted)?;
    for &w in &wanted {
        let g = sparse
            .get(&w)
            .ok_or_else(|| format!("backward_params left out id %{w}"))?;
        if g.shape() != dense[w].shape() {
            return Err(format!(
                "backward_params: %{w} has shape {}, dense {}",
                g.shape(),
                dense[w].shape()
            ));
        }
        let err = tensor_err(g, &dense[w].cast());
        Measured::check(err, 0.0, || {
            format!("backward_params differs from backward_dense at %{w}")
        })?;
    }
    Ok(worst)
}

fn label<B: Backend>(backend: &B) -> String {
    format!("tape api dag {}", backend.name())
}

/// The tape-API check on random DAGs for a CPU-like backend (every op supported).
pub fn check_tape_api_dag<B: TapeApi>(backend: &B, cfg: &RunConfig) -> Report {
    let cases = api_cases(dag_cases(DagOptions::default()));
    run_check(label(backend), cfg, cases, |c| tape_api_case(backend, c))
}

/// The tape-API check on random DAGs on the CUDA sim (DAGs needing a pending op are skipped).
pub fn check_tape_api_sim_dag(cfg: &RunConfig) -> Report {
    let sim = CudaSim::new();
    let known: Vec<&'static str> = sim_pending_ops().iter().copied().collect();
    let cases = api_cases(sim_dag_cases(DagOptions::default()));
    run_check_pending(label(&sim), cfg, cases, OnPending::SkipCase, &known, |c| {
        pending_aware(&sim, tape_api_case(&sim, c))
    })
}
