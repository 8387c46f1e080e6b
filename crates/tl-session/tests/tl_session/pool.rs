//! The CPU tape's buffer pool as the sessions report it (`pool_stats`): between steady-state
//! steps it holds the last step's buffers, the same bytes every step. The byte counting itself
//! is tested in tl-spec (`pool::tests`).

use crate::common::mlp::{Mlp, regression_grid};
use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
use tl_spec::pool::PoolStats;

/// The MLP 2-16-1's parameters (weights and biases).
const PARAM_ELEMENTS: usize = 2 * 16 + 16 + 16 + 1;

/// The pool after each of five SGD steps of the MLP in `s`, each followed by a reset.
fn pools<S: Train<T = f32>>(mut s: S, pool: impl Fn(&S) -> Option<PoolStats>) -> Vec<PoolStats> {
    let (x, y) = regression_grid::<f32>(6);
    let mlp = Mlp::new(&mut s, &[2, 16, 1], 7).unwrap();
    let mut opt = Optimizer::sgd(0.05).unwrap();
    (0..5)
        .map(|_| {
            let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
            s.backward_step(&loss, &mut opt).unwrap();
            // The step's values go to the pool when the tape is cleared.
            Train::reset(&mut s);
            pool(&s).expect("a CPU session has a pool")
        })
        .collect()
}

#[test]
fn steady_steps_hold_the_same_buffers_and_at_least_the_gradients() {
    let eager = pools(Session::<f32>::new(Options::default()).unwrap(), |s| {
        s.pool_stats()
    });
    let linked = pools(LinkedSession::<f32>::new(), |s| s.pool_stats());
    for (name, stats) in [("eager", eager), ("linked", linked)] {
        let last = stats[stats.len() - 1];
        assert_eq!(
            stats[2].held_bytes, last.held_bytes,
            "{name}: steady steps hold the same bytes: {stats:?}"
        );
        assert!(last.reused > stats[2].reused, "{name}: {stats:?}");
        // Every step's gradients of the parameters come back as spares, f32 each.
        assert!(
            last.held_bytes >= 4 * PARAM_ELEMENTS,
            "{name}: {last:?} holds less than the gradients"
        );
        assert!(last.peak_held_bytes >= last.held_bytes, "{name}: {last:?}");
        for s in &stats {
            assert!(
                s.peak_held_bytes <= last.peak_held_bytes,
                "{name}: {stats:?}"
            );
        }
    }
    // The CUDA simulation counts its device's buffers instead.
    let sim = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
    assert_eq!(sim.pool_stats(), None);
    assert_eq!(
        LinkedSession::<f32>::new().pool_stats(),
        None,
        "no step yet"
    );
}
