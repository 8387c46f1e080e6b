//! The model builders learn tiny synthetic tasks (loss thresholds, never a time) in the eager
//! CPU session and the linked session, and both follow the same trajectory.

use tl_session::models::{Cnn, CnnConfig, SplitMix};
use tl_session::{Backend, LinkedSession, Ops, Optimizer, Options, Session, TensorRef};
use tl_spec::Tensor;

/// Either session kind, for a loop that records labels in the Nat environment.
#[allow(clippy::large_enum_variant)] // one per test
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
        let mut opt = Optimizer::adam(0.03).unwrap();
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

#[test]
fn fno_learns_a_smoothing_operator_eager_and_linked() {
    use tl_session::models::{Fno1d, FnoConfig};
    // Target: y(t) = (u(t−1) + 2u(t) + u(t+1))/4 on a periodic grid of 16 (a spectral filter).
    let (b, n) = (8, 16);
    let mut rng = SplitMix::new(5);
    let u: Vec<f32> = (0..b * n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let y: Vec<f32> = (0..b * n)
        .map(|i| {
            let (e, t) = (i / n, i % n);
            let at = |k: usize| u[e * n + (t + n + k - 1) % n];
            (at(0) + 2.0 * at(1) + at(2)) / 4.0
        })
        .collect();
    let x = Tensor::new([b, n, 1], u).unwrap();
    let y = Tensor::new([b, n, 1], y).unwrap();
    let cfg = FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: 8,
        modes: 9,
        layers: 2,
        proj_hidden: 16,
    };
    let mut runs = Vec::new();
    for mut k in Kind::all() {
        let fno = Fno1d::new(k.ops(), &cfg, 2).unwrap();
        assert_eq!(fno.params().len(), fno.param_names().len());
        assert_eq!(fno.param_names()[2], "spectral0.re");
        let mut opt = Optimizer::adam(0.01).unwrap();
        let mut losses = Vec::new();
        for _ in 0..150 {
            let leaves = fno.use_params(k.ops()).unwrap();
            let xr = k.ops().input(x.clone(), false).unwrap();
            let yr = k.ops().input(y.clone(), false).unwrap();
            let pred = fno.forward(k.ops(), &leaves, &xr).unwrap();
            assert_eq!(pred.shape().dims(), [b, n, 1]);
            let loss = k.ops().mse_loss(&pred, &yr).unwrap();
            losses.push(k.step(&loss, &mut opt));
        }
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(last < first / 20.0, "did not learn: {first} -> {last}");
        runs.push(losses);
    }
    for (e, (a, b)) in runs[0].iter().zip(&runs[1]).take(10).enumerate() {
        assert!((a - b).abs() <= 1e-4 * a.max(1.0), "step {e}: {a} vs {b}");
    }
}

#[test]
fn transformer_lm_learns_a_periodic_sequence_eager_and_linked() {
    use tl_session::models::{LmConfig, TransformerLm};
    // Sequences of the period-3 pattern 0 1 2 0 1 2 … at random phases: after the first token
    // the next one is determined, so the loss can fall far below ln 3.
    let cfg = LmConfig {
        vocab: 3,
        context: 6,
        d_model: 16,
        heads: 2,
        d_ff: 32,
        blocks: 1,
    };
    let batch = 3;
    let seq = |phase: usize, k: usize| (phase + k) % 3;
    let tokens: Vec<usize> = (0..batch)
        .flat_map(|p| (0..6).map(move |k| seq(p, k)))
        .collect();
    let next: Vec<usize> = (0..batch)
        .flat_map(|p| (0..6).map(move |k| seq(p, k + 1)))
        .collect();
    let mut runs = Vec::new();
    for mut k in Kind::all() {
        let lm = TransformerLm::new(k.ops(), &cfg, 4).unwrap();
        assert_eq!(lm.params().len(), lm.param_names().len());
        assert!(lm.param_names().contains(&"block0.attn.wq".to_owned()));
        let mut opt = Optimizer::adam(0.01).unwrap();
        let mut losses = Vec::new();
        for _ in 0..60 {
            let at = k.nat_vec(&tokens);
            let labels = k.nat_vec(&next);
            let leaves = lm.use_params(k.ops()).unwrap();
            let logits = lm.forward(k.ops(), &leaves, at, batch).unwrap();
            assert_eq!(logits.shape().dims(), [batch * 6, 3]);
            let loss = k.ops().cross_entropy(&logits, labels).unwrap();
            losses.push(k.step(&loss, &mut opt));
        }
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(first > 0.8, "starts near ln 3: {first}");
        assert!(last < 0.1, "did not learn: {first} -> {last}");
        runs.push(losses);
    }
    for (e, (a, b)) in runs[0].iter().zip(&runs[1]).take(10).enumerate() {
        assert!((a - b).abs() <= 1e-4 * a.max(1.0), "step {e}: {a} vs {b}");
    }
}

#[test]
fn transformer_block_is_causal() {
    use tl_session::models::TransformerBlock;
    use tl_spec::ops::attention::Mask;
    // Changing the last position's input changes no earlier output under a causal mask.
    let mut s = Session::<f32>::new(Options::backend(Backend::Cpu)).unwrap();
    let blk = TransformerBlock::new(&mut s, "b", 8, 2, 16, 1).unwrap();
    let mut rng = SplitMix::new(9);
    let a: Vec<f32> = (0..32).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let mut b = a.clone();
    b[31] += 1.0;
    let mut out = Vec::new();
    for v in [a, b] {
        let l = blk.use_params(&mut s).unwrap();
        let x = s.input(Tensor::new([1, 4, 8], v).unwrap(), false).unwrap();
        let y = blk
            .forward(&mut s, &l, &x, Some(&Mask::causal(4).unwrap()))
            .unwrap();
        out.push(s.value(&y).unwrap().data().to_vec());
    }
    assert_eq!(out[0][..24], out[1][..24]);
    assert_ne!(out[0][24..], out[1][24..]);
    assert!(
        TransformerBlock::new(&mut s, "b", 8, 3, 16, 1)
            .unwrap_err()
            .to_string()
            .contains("dividing")
    );
}
