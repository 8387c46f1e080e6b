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

/// The eager session's training step runs the tape's sparse backward on every engine: the
/// parameters' gradients, and the parameters after the update, have the bits of a dense
/// `backward` followed by `step`; an intermediate tensor's gradient is not kept (an error
/// naming `backward`), a parameter's still reads.
#[test]
fn an_eager_step_keeps_the_parameters_gradients_only_with_the_dense_bits() {
    use tl_session::{Backend, Options, Session, Train};
    let bits = |t: &tl_spec::Tensor<f32>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for backend in [Backend::Cpu, Backend::CudaSim] {
        let run = |sparse: bool| {
            let mut s = Session::<f32>::new(Options::backend(backend)).unwrap();
            let (x, y) = regression_grid::<f32>(5);
            let mlp = Mlp::new(&mut s, &[2, 8, 1], 3).unwrap();
            let mut opt = Optimizer::adam(0.02).unwrap();
            let mut grads = Vec::new();
            for _ in 0..3 {
                s.reset();
                let loss = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
                if sparse {
                    s.backward_step(&loss, &mut opt).unwrap();
                } else {
                    s.backward(&loss).unwrap();
                    s.step(&mut opt).unwrap();
                }
                grads.extend(mlp.params().iter().map(|p| bits(&s.grad(p).unwrap())));
                let e = s.grad_of(&loss).map(|_| ()).map_err(|e| e.to_string());
                assert_eq!(e.is_err(), sparse, "{backend:?} sparse={sparse}: {e:?}");
                if let Err(e) = e {
                    assert!(e.contains("backward"), "{e}");
                }
            }
            let params: Vec<_> = mlp
                .params()
                .iter()
                .map(|p| bits(&s.param_value(p).unwrap()))
                .collect();
            (grads, params)
        };
        let (sparse, dense) = (run(true), run(false));
        assert_eq!(sparse.0, dense.0, "{backend:?}: gradients");
        assert_eq!(sparse.1, dense.1, "{backend:?}: parameters");
    }
}

/// `Train::backward_grads_then_reset` hands over the gradients a step reads (those of a
/// backward, bit for bit), returns the loss, ends the pass and changes no parameter and no
/// optimizer state, on the eager CPU and sim sessions and the linked session.
#[test]
fn backward_grads_then_reset_hands_over_the_gradients_and_steps_nothing() {
    use tl_session::{Backend, LinkedSession, Options, Session, Train};
    use tl_spec::Tensor;
    fn run<S: Train<T = f32>>(mut s: S, reference: Option<&[Vec<f32>]>) -> Vec<Vec<f32>> {
        let (x, y) = regression_grid::<f32>(4);
        let mlp = Mlp::new(&mut s, &[2, 8, 1], 7).unwrap();
        let before: Vec<Tensor<f32>> = mlp
            .params()
            .iter()
            .map(|p| s.param_value(p).unwrap())
            .collect();
        let mut opt = Optimizer::adam(0.02).unwrap();
        let loss = mlp.loss(&mut s, x, y).unwrap();
        let want = s.read(&loss).unwrap().item().unwrap();
        let mut got = Vec::new();
        let mut sink = |g: &mut [&mut [f32]]| {
            got = g.iter().map(|v| v.to_vec()).collect();
            Ok(())
        };
        let l = s
            .backward_grads_then_reset(&loss, &mut opt, &mut sink)
            .unwrap();
        assert_eq!(l, f64::from(want));
        assert_eq!(opt.steps_done(), 0);
        let after: Vec<Tensor<f32>> = mlp
            .params()
            .iter()
            .map(|p| s.param_value(p).unwrap())
            .collect();
        assert_eq!(before, after);
        // The pass ended: its handles are stale.
        assert!(s.read(&loss).is_err());
        if let Some(r) = reference {
            assert_eq!(got, r);
        }
        got
    }
    let session = |backend| {
        Session::<f32>::new(Options {
            backend,
            ..Options::default()
        })
        .unwrap()
    };
    // The eager CPU session's gradients are its backward's.
    let mut s = session(Backend::Cpu);
    let (x, y) = regression_grid::<f32>(4);
    let mlp = Mlp::new(&mut s, &[2, 8, 1], 7).unwrap();
    let loss = mlp.loss(&mut s, x, y).unwrap();
    s.backward(&loss).unwrap();
    let want: Vec<Vec<f32>> = mlp
        .params()
        .iter()
        .map(|p| s.grad(p).unwrap().data().to_vec())
        .collect();
    let cpu = run(session(Backend::Cpu), Some(&want));
    let sim = run(session(Backend::CudaSim), None);
    assert_eq!(sim.len(), cpu.len());
    run(LinkedSession::<f32>::with_seed(0), None);
    // A loss of an earlier pass is an error, and the open pass ends with it.
    let mut s = session(Backend::Cpu);
    let (x, y) = regression_grid::<f32>(4);
    let mlp = Mlp::new(&mut s, &[2, 8, 1], 7).unwrap();
    let old = mlp.loss(&mut s, x.clone(), y.clone()).unwrap();
    Train::reset(&mut s);
    let open = mlp.loss(&mut s, x, y).unwrap();
    let mut opt = Optimizer::sgd(0.1).unwrap();
    let mut sink = |_: &mut [&mut [f32]]| Ok(());
    assert!(
        s.backward_grads_then_reset(&old, &mut opt, &mut sink)
            .is_err()
    );
    assert!(s.read(&open).is_err(), "the open pass was reset");
}
