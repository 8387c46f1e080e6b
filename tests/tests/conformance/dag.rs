//! The random-DAG generator: it composes every op, reuses ids (fan-out), and only yields
//! well-typed, bounded, kink-free cases.

use std::collections::{BTreeMap, BTreeSet};

use proptest::strategy::{Strategy, ValueTree};
use tl_conformance::dag::{
    DagOptions, KINK_MARGIN, VALUE_BOUND, dag_cases, well_conditioned, well_conditioned_with,
};
use tl_conformance::{GraphCase, RunConfig, registry};

fn sample(opts: DagOptions, n: usize) -> Vec<GraphCase> {
    let mut runner = RunConfig::default().runner("dag-sample");
    let strategy = dag_cases(opts);
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("generates").current())
        .collect()
}

#[test]
fn dags_cover_every_op_and_reuse_ids() {
    let cases = sample(DagOptions::default(), 300);
    let mut seen = BTreeSet::new();
    let mut fan_out = 0;
    let mut nodes = 0;
    let mut partial_grad = 0;
    for c in &cases {
        let mut uses: BTreeMap<usize, usize> = BTreeMap::new();
        for n in c.graph.nodes() {
            seen.insert(n.op().name());
            for &a in n.args() {
                *uses.entry(a).or_default() += 1;
            }
        }
        nodes += c.graph.nodes().len();
        if uses.values().any(|&u| u >= 2) {
            fan_out += 1;
        }
        if c.graph.leaves().iter().any(|l| !l.requires_grad) {
            partial_grad += 1;
        }
        assert_eq!(c.seed.shape(), c.graph.shape(c.out).unwrap());
        assert!(c.out >= c.graph.num_leaves() && c.out < c.graph.len());
    }
    let missing: Vec<&str> = registry::all()
        .iter()
        .map(|e| e.name)
        .filter(|n| !seen.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "ops never generated in DAGs: {missing:?}"
    );
    eprintln!(
        "{} cases, {} nodes on average, fan-out in {fan_out}, partial grad in {partial_grad}",
        cases.len(),
        nodes / cases.len()
    );
    assert!(
        fan_out * 10 >= cases.len() * 8,
        "fan-out in only {fan_out} of {}",
        cases.len()
    );
    assert!(partial_grad > 0 && partial_grad < cases.len());
}

#[test]
fn dag_options_are_honoured_and_cases_are_well_conditioned() {
    let opts = DagOptions {
        all_grad: true,
        detach: false,
        max_steps: 6,
    };
    for c in sample(opts, 100) {
        assert!(c.graph.leaves().iter().all(|l| l.requires_grad));
        assert!(c.graph.nodes().iter().all(|n| n.op().name() != "detach"));
        assert!(well_conditioned_with(&c.graph, &c.leaves, &c.nats), "{c:?}");
        let values = c.graph.eval(&c.leaves, &[]).unwrap();
        let biggest = values
            .iter()
            .flat_map(|t| t.data().iter().map(|v| v.abs()))
            .fold(0.0, f64::max);
        assert!(biggest <= VALUE_BOUND, "{biggest}\n{c:?}");
    }
    // The filter rejects values near a kink: relu of a leaf at KINK_MARGIN / 2.
    let mut b = tl_ir::GraphBuilder::new();
    let x = b.leaf([1], None).unwrap();
    b.apply(tl_ir::Op::Relu, &[x]).unwrap();
    let g = b.finish();
    let near = tl_spec::Tensor::vector(vec![KINK_MARGIN / 2.0]);
    assert!(!well_conditioned(&g, &[near]));
    assert!(well_conditioned(&g, &[tl_spec::Tensor::vector(vec![0.5])]));
    assert!(!well_conditioned(
        &g,
        &[tl_spec::Tensor::vector(vec![2.0 * VALUE_BOUND])]
    ));
}
