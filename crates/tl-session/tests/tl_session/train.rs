//! The MLP learns a small fixed regression task on every session kind (a loss threshold, never a
//! time), and the three kinds follow the same trajectory.

use crate::common::{Any, KINDS, Kind};
use tl_session::Optimizer;
use tl_session::models::{Activation, Mlp, regression_grid};

fn train(kind: Kind, epochs: usize) -> Vec<f64> {
    let mut s = Any::<f32>::new(kind);
    let (x, y) = regression_grid::<f32>(6);
    let mlp = Mlp::new(s.ops(), &[2, 16, 1], Activation::Tanh, 7).unwrap();
    let mut opt = Optimizer::adam(0.02).unwrap();
    let mut losses = Vec::new();
    for _ in 0..epochs {
        let loss = mlp.loss(s.ops(), x.clone(), y.clone()).unwrap();
        losses.push(f64::from(s.ops().value(&loss).unwrap().item().unwrap()));
        s.step(&loss, &mut opt).unwrap();
    }
    losses
}

#[test]
fn mlp_reaches_a_low_loss_on_every_session_kind() {
    let runs: Vec<Vec<f64>> = KINDS.iter().map(|&k| train(k, 300)).collect();
    for (kind, losses) in KINDS.iter().zip(&runs) {
        let (first, last) = (losses[0], *losses.last().unwrap());
        eprintln!("{kind:?}: loss {first:.4} -> {last:.5}");
        assert!(first > 0.1, "{kind:?} starts untrained: {first}");
        assert!(last < 0.01, "{kind:?} did not learn: {first} -> {last}");
    }
    // Same model, same data, same optimizer: the trajectories agree closely early on.
    for other in &runs[1..] {
        for (e, (a, b)) in runs[0].iter().zip(other).take(20).enumerate() {
            assert!((a - b).abs() <= 1e-3 * a.max(1.0), "epoch {e}: {a} vs {b}");
        }
    }
}
