//! Passes recorded with gradients off (`Ops::set_grad_enabled(false)`, PyTorch's
//! `torch.no_grad()`): the same values, bit for bit, as with gradients on, without the
//! workspaces only a backward reads (the CPU tape hands fewer bytes to its pool at the reset),
//! and no gradient reaches a parameter: a step of such a pass changes nothing.

use tl_session::{LinkedSession, Optimizer, Options, Session, Train};
use tl_spec::Tensor;
use tl_spec::pool::PoolStats;

/// One pass of a linear layer, gelu and layerNorm over 32 rows of 8 (gradients on or off):
/// its output's bits, the pool's bytes after the reset, and whether an SGD step of its sum
/// changed the weight.
fn pass<S: Train<T = f32>>(
    mut s: S,
    grad: bool,
    pool: impl Fn(&S) -> Option<PoolStats>,
) -> (Vec<u32>, usize, bool) {
    assert!(s.is_grad_enabled(), "on by default");
    let w0 = Tensor::from_fn([16, 8], |i| (i as f32 * 0.37).sin());
    let pw = s.param(w0.clone(), Some("w"), true).unwrap();
    let pb = s.param(Tensor::from_fn([16], |i| i as f32 * 0.01), Some("b"), true);
    let (gamma, beta) = (Tensor::ones([16]), Tensor::zeros([16]));
    s.set_grad_enabled(grad);
    let (w, b) = (
        s.use_param(&pw).unwrap(),
        s.use_param(&pb.unwrap()).unwrap(),
    );
    let x = s.input(Tensor::from_fn([32, 8], |i| (i as f32 * 0.11).cos()), true);
    let (gamma, beta) = (s.input(gamma, true).unwrap(), s.input(beta, true).unwrap());
    let h = s.linear(&w, &b, &x.unwrap()).unwrap();
    let h = s.gelu(&h).unwrap();
    let y = s.layer_norm(&h, &gamma, &beta, 1e-5).unwrap();
    let bits = s
        .read(&y)
        .unwrap()
        .data()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let loss = s.sum(&y).unwrap();
    let mut sgd = Optimizer::sgd(0.1).unwrap();
    s.backward_step(&loss, &mut sgd).unwrap();
    Train::reset(&mut s);
    assert_eq!(s.is_grad_enabled(), grad, "a reset keeps the setting");
    let stepped = s.param_value(&pw).unwrap() != w0;
    (bits, pool(&s).expect("a CPU pool").held_bytes, stepped)
}

#[test]
fn a_pass_without_gradients_gives_the_same_bits_and_keeps_no_workspace() {
    let eager = |grad| {
        pass(
            Session::<f32>::new(Options::default()).unwrap(),
            grad,
            |s| s.pool_stats(),
        )
    };
    let linked = |grad| pass(LinkedSession::<f32>::new(), grad, |s| s.pool_stats());
    for (name, run) in [("eager", &eager as &dyn Fn(bool) -> _), ("linked", &linked)] {
        let (with_bits, with_bytes, with_stepped) = run(true);
        let (bits, bytes, stepped) = run(false);
        assert_eq!(bits, with_bits, "{name}: the same values");
        assert!(
            bytes < with_bytes,
            "{name}: gelu's and layerNorm's workspaces are not kept: {bytes} vs {with_bytes} bytes"
        );
        assert!(
            with_stepped,
            "{name}: with gradients the step moves the weight"
        );
        assert!(!stepped, "{name}: without, no gradient reaches it");
        println!("{name}: pool after the pass {bytes} bytes without gradients, {with_bytes} with");
    }
}
