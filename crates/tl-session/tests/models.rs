//! The model builders learn tiny synthetic tasks (loss thresholds, never a time) in the eager
//! CPU session and the linked session, and both follow the same trajectory.

use tl_session::models::{Cnn, CnnConfig, SplitMix};
use tl_session::{Backend, LinkedSession, Ops, Optimizer, Options, Session, TensorRef};
use tl_spec::Tensor;

/// Either session kind, for a loop that records labels in the Nat environment.
enum Kind {
    Eager(Session<f32>),
    Linked(LinkedSession<f32>),
}

impl Kind {
    fn all() -> [Kind; 2] {
        [
            Kind::Eager(Session::new(Options::backend(Backend::Cpu)).unwrap()),
            Kind::Linked(LinkedSession::new()),
        ]
    }
    fn ops(&mut self) -> &mut dyn Ops<T = f32> {
        match self {
            Kind::Eager(s) => s,
            Kind::Linked(s) => s,
        }
    }
    fn nat_vec(&mut self, v: &[usize]) -> usize {
        match self {
            Kind::Eager(s) => s.record_nat_vec(v).pos(),
            Kind::Linked(s) => s.record_nat_vec(v).pos(),
        }
    }
    /// The loss value, backward, one step, reset.
    fn step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> f32 {
        let l = self.ops().value(loss).unwrap().item().unwrap();
        match self {
            Kind::Eager(s) => {
                s.backward(loss).unwrap();
                s.step(opt).unwrap();
                s.reset();
            }
            Kind::Linked(s) => {
                let g = s.backward_scalar_dense_all(loss).unwrap();
                s.step(opt, &g).unwrap();
                s.reset();
            }
        }
        l
    }
}

/// 6×6 images of a horizontal (class 0) or vertical (class 1) bar at a random place, plus noise.
fn bars(n: usize, seed: u64) -> (Tensor<f32>, Vec<usize>) {
    let mut rng = SplitMix::new(seed);
    let mut x = vec![0f32; n * 36];
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = (rng.next_u64() % 2) as usize;
        let at = (rng.next_u64() % 6) as usize;
        for k in 0..6 {
            let (r, c) = if class == 0 { (at, k) } else { (k, at) };
            x[i * 36 + r * 6 + c] = 1.0;
        }
        for v in &mut x[i * 36..(i + 1) * 36] {
            *v += rng.uniform(-0.2, 0.2) as f32;
        }
        y.push(class);
    }
    (Tensor::new([n, 1, 6, 6], x).unwrap(), y)
}

#[test]
fn cnn_learns_bars_eager_and_linked() {
    let cfg = CnnConfig {
        in_channels: 1,
        height: 6,
        width: 6,
        channels: vec![4],
        classes: 2,
    };
    let (x, y) = bars(32, 1);
    let mut runs = Vec::new();
    for mut k in Kind::all() {
        let cnn = Cnn::new(k.ops(), &cfg, 3).unwrap();
        assert_eq!(cnn.params().len(), 4);
        assert_eq!(
            cnn.param_names(),
            ["conv0.weight", "conv0.bias", "fc.weight", "fc.bias"]
        );
        let mut opt = Optimizer::adam(0.03);
        let mut losses = Vec::new();
        for _ in 0..40 {
            let at = k.nat_vec(&y);
            let leaves = cnn.use_params(k.ops()).unwrap();
            let xr = k.ops().input(x.clone(), false).unwrap();
            let logits = cnn.forward(k.ops(), &leaves, &xr).unwrap();
            assert_eq!(logits.shape().dims(), [32, 2]);
            let loss = k.ops().cross_entropy(&logits, at).unwrap();
            losses.push(k.step(&loss, &mut opt));
        }
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(first > 0.5, "starts untrained: {first}");
        assert!(last < 0.05, "did not learn: {first} -> {last}");
        runs.push(losses);
    }
    for (e, (a, b)) in runs[0].iter().zip(&runs[1]).take(10).enumerate() {
        assert!((a - b).abs() <= 1e-4 * a.max(1.0), "step {e}: {a} vs {b}");
    }
}

#[test]
fn cnn_rejects_a_config_without_features() {
    let mut s = Session::<f32>::new(Options::backend(Backend::Cpu)).unwrap();
    let cfg = CnnConfig {
        in_channels: 1,
        height: 2,
        width: 2,
        channels: vec![4, 4],
        classes: 2,
    };
    let e = Cnn::new(&mut s, &cfg, 0).unwrap_err().to_string();
    assert!(e.contains("Cnn::new") && e.contains("no features"), "{e}");
}
