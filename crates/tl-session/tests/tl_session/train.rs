//! The MLP learns a small fixed regression task on every session kind (a loss threshold, never a
//! time), and the three kinds follow the same trajectory.

use crate::common::mlp::{Mlp, regression_grid};
use crate::common::{Any, KINDS, Kind};
use tl_session::Optimizer;

fn train(kind: Kind, epochs: usize) -> Vec<f64> {
    let mut s = Any::<f32>::new(kind);
    let (x, y) = regression_grid::<f32>(6);
    let mlp = Mlp::new(s.ops(), &[2, 16, 1], 7).unwrap();
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

/// The linked session's steps on a CUDA backend reuse one device between compiles: after the
/// first step, no step makes a raw device allocation and nothing but the parameters' resident
/// mirrors stays live between steps; the losses are the CPU linked session's.
#[test]
fn linked_cuda_steps_reuse_the_device_pools() {
    use tl_session::{Backend, LinkedSession, Train};
    let run = |backend: Backend| {
        let mut s = LinkedSession::<f32>::new();
        s.set_backend(backend).unwrap();
        let (x, y) = regression_grid::<f32>(6);
        let mlp = Mlp::new(&mut s, &[2, 16, 1], 7).unwrap();
        let mut opt = Optimizer::sgd(0.05).unwrap();
        let mut out = Vec::new();
        for _ in 0..12 {
            Train::reset(&mut s);
            let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
            let l = s.backward_step(&loss, &mut opt).unwrap();
            out.push((l, s.memory_usage()));
        }
        out
    };
    let (cpu, sim) = (run(Backend::Cpu), run(Backend::CudaSim));
    assert!(cpu.iter().all(|(_, m)| m.is_none()));
    let first = sim[0].1.expect("the sim device's counters after a step");
    assert!(first.device_alloc_count > 0);
    let mut handed_out = 0;
    for (step, ((lc, _), (ls, m))) in cpu.iter().zip(&sim).enumerate() {
        let m = m.expect("counters");
        // One device all along: its count of buffers handed out keeps growing.
        assert!(
            m.alloc_count > handed_out,
            "step {step}: a fresh device? {m:?}"
        );
        handed_out = m.alloc_count;
        assert!(
            (lc - ls).abs() <= 1e-4 * lc.abs().max(1.0),
            "step {step}: {lc} vs {ls}"
        );
        assert_eq!(
            m.device_alloc_count, first.device_alloc_count,
            "step {step}: {m:?}"
        );
        // The MLP 2-16-1's four parameters (65 values) stay on the device, nothing else.
        assert_eq!(
            (m.live_buffers(), m.live_bytes),
            (4, 4 * 65),
            "step {step}: {m:?}"
        );
        assert_eq!(m.alloc_count - m.free_count, m.live_buffers());
    }
    assert!(sim[11].0 < sim[0].0, "the sim run learns");
}
