//! The linked session on a CUDA backend keeps its parameters on the device between steps (the
//! optimizer updates them there; only the loss comes back). Everything that reads a parameter
//! on the host must see the newest value: parameter reads, pure evaluation and gradients of
//! the graph, host steps, a move to another backend, and optimizer state. Each check runs the
//! same calls on the CPU backend, whose parameters never leave the host, and compares.

use crate::common::mlp::{Mlp, regression_grid};
use tl_session::{Backend, LinkedSession, Ops, Optimizer, Train};
use tl_spec::Tensor;

/// A linked session on `backend` with the MLP 2-16-1 and its momentum-SGD optimizer (its
/// state then lives where the steps run).
fn session(backend: Backend) -> (LinkedSession<f32>, Mlp, Optimizer) {
    let mut s = LinkedSession::<f32>::new();
    s.set_backend(backend).unwrap();
    let mlp = Mlp::new(&mut s, &[2, 16, 1], 7).unwrap();
    let opt = Optimizer::momentum(0.05, 0.9).unwrap();
    (s, mlp, opt)
}

/// `n` training steps; returns the losses.
fn train(s: &mut LinkedSession<f32>, mlp: &Mlp, opt: &mut Optimizer, n: usize) -> Vec<f64> {
    let (x, y) = regression_grid::<f32>(6);
    (0..n)
        .map(|_| {
            Train::reset(s);
            let loss = mlp.loss(s, x.clone(), y.clone()).unwrap();
            s.backward_step(&loss, opt).unwrap()
        })
        .collect()
}

fn close(a: &Tensor<f32>, b: &Tensor<f32>, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (i, (x, y)) in a.data().iter().zip(b.data()).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// The two sessions' losses agree.
fn same_losses(lc: &[f64], ld: &[f64], what: &str) {
    assert_eq!(lc.len(), ld.len(), "{what}");
    for (a, b) in lc.iter().zip(ld) {
        assert!(
            (a - b).abs() <= 1e-5 * a.max(1.0),
            "{what}: {lc:?} vs {ld:?}"
        );
    }
}

/// The two sessions' parameter values (read through `param_value`) agree.
fn same_params(
    cpu: &mut LinkedSession<f32>,
    mlp_c: &Mlp,
    dev: &mut LinkedSession<f32>,
    mlp_d: &Mlp,
    what: &str,
) {
    let read = |s: &mut LinkedSession<f32>, mlp: &Mlp| -> Vec<Tensor<f32>> {
        mlp.params()
            .iter()
            .map(|p| s.param_value(p).unwrap())
            .collect()
    };
    let (pc, pd) = (read(cpu, mlp_c), read(dev, mlp_d));
    assert_eq!(pc.len(), pd.len(), "{what}");
    for (i, (a, b)) in pc.iter().zip(&pd).enumerate() {
        close(a, b, &format!("{what}: param {i}"));
    }
}

#[test]
fn device_steps_keep_parameters_resident_and_host_reads_see_the_newest_values() {
    let (mut cpu, mlp_c, mut opt_c) = session(Backend::Cpu);
    let (mut dev, mlp_d, mut opt_d) = session(Backend::CudaSim);
    let (lc, ld) = (
        train(&mut cpu, &mlp_c, &mut opt_c, 4),
        train(&mut dev, &mlp_d, &mut opt_d, 4),
    );
    same_losses(&lc, &ld, "losses");
    // A graph recorded after device steps evaluates and differentiates purely on the host
    // with the newest parameters (the leaves were recorded stale and are synced).
    let (x, y) = regression_grid::<f32>(6);
    for s in [&mut cpu, &mut dev] {
        Train::reset(s);
    }
    let loss_c = mlp_c.loss(&mut cpu, x.clone(), y.clone()).unwrap();
    let loss_d = mlp_d.loss(&mut dev, x.clone(), y.clone()).unwrap();
    close(
        &cpu.value(&loss_c).unwrap(),
        &dev.value(&loss_d).unwrap(),
        "pure value",
    );
    let (gc, gd) = (
        cpu.backward_scalar_dense_all(&loss_c).unwrap(),
        dev.backward_scalar_dense_all(&loss_d).unwrap(),
    );
    for (i, (a, b)) in gc.iter().zip(&gd).enumerate() {
        close(a, b, &format!("pure gradient of id {i}"));
    }
    // Parameter reads download the device's values.
    same_params(&mut cpu, &mlp_c, &mut dev, &mlp_d, "read");
    // Momentum buffers: exported from the device, the host's values.
    let (sc, sd) = (
        cpu.optimizer_state(&opt_c).unwrap(),
        dev.optimizer_state(&opt_d).unwrap(),
    );
    assert_eq!(sc.keys().collect::<Vec<_>>(), sd.keys().collect::<Vec<_>>());
    assert!(sc.keys().any(|k| k.contains("momentum_buffer")), "{sc:?}");
    for (k, a) in &sc {
        let b = &sd[k];
        for (x, y) in a.data().iter().zip(b.data()) {
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{k}: {x} vs {y}");
        }
    }
}

#[test]
fn host_writes_host_steps_and_backend_moves_follow_the_device_values() {
    let (mut cpu, mlp_c, mut opt_c) = session(Backend::Cpu);
    let (mut dev, mlp_d, mut opt_d) = session(Backend::CudaSim);
    train(&mut cpu, &mlp_c, &mut opt_c, 3);
    train(&mut dev, &mlp_d, &mut opt_d, 3);
    // A host write replaces the resident value: the next device step starts from it.
    let w = Tensor::new([16, 2], (0..32).map(|i| 0.01 * i as f32).collect()).unwrap();
    cpu.set_param(&mlp_c.params()[0], w.clone()).unwrap();
    dev.set_param(&mlp_d.params()[0], w).unwrap();
    let (lc, ld) = (
        train(&mut cpu, &mlp_c, &mut opt_c, 2),
        train(&mut dev, &mlp_d, &mut opt_d, 2),
    );
    same_losses(&lc, &ld, "after set_param");
    // A host step (dense gradients from the pure backprop) starts from the synced values.
    let (x, y) = regression_grid::<f32>(6);
    let mut sgd = Optimizer::sgd(0.05).unwrap();
    for (s, mlp) in [(&mut cpu, &mlp_c), (&mut dev, &mlp_d)] {
        Train::reset(s);
        let loss = mlp.loss(s, x.clone(), y.clone()).unwrap();
        let g = s.backward_scalar_dense_all(&loss).unwrap();
        s.step(&mut sgd, &g).unwrap();
    }
    same_params(&mut cpu, &mlp_c, &mut dev, &mlp_d, "after a host step");
    // A device step after the host step uploads the new host values, not the old mirrors.
    let mut sgd_c = Optimizer::sgd(0.05).unwrap();
    let mut sgd_d = Optimizer::sgd(0.05).unwrap();
    let (lc, ld) = (
        train(&mut cpu, &mlp_c, &mut sgd_c, 2),
        train(&mut dev, &mlp_d, &mut sgd_d, 2),
    );
    same_losses(&lc, &ld, "after a host step");
    // Moving to the CPU brings the parameters home; training goes on from them.
    dev.set_backend(Backend::Cpu).unwrap();
    let (lc, ld) = (
        train(&mut cpu, &mlp_c, &mut sgd_c, 2),
        train(&mut dev, &mlp_d, &mut sgd_d, 2),
    );
    same_losses(&lc, &ld, "after the move");
    assert!(
        dev.memory_usage().is_none(),
        "the CPU backend has no device"
    );
}
