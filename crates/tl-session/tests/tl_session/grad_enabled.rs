//! Passes recorded with gradients off (`Ops::set_grad_enabled(false)`, PyTorch's
//! `torch.no_grad()`): the same values, bit for bit, as with gradients on, without the
//! workspaces only a backward reads (the CPU tape hands fewer bytes to its pool at the reset;
//! the CUDA tape holds fewer live device bytes during the pass), and no gradient reaches a
//! parameter: a step of such a pass is an error that changes nothing.

use tl_session::{Backend, LinkedSession, Optimizer, Options, Session, Train};
use tl_spec::Tensor;

/// What one pass left: its output's bits, the bytes `held` measured after the read
/// (`during`) and after the reset, and whether an SGD step of its sum moved the weight.
pub(crate) struct Pass {
    pub(crate) bits: Vec<u32>,
    pub(crate) during: usize,
    pub(crate) after: usize,
    pub(crate) stepped: bool,
}

/// One pass of a linear layer, gelu and layerNorm over 32 rows of 8, with gradients on or off
/// (also run on the real device or the kernel emulator: `cuda::`).
pub(crate) fn pass<S: Train<T = f32>>(mut s: S, grad: bool, held: impl Fn(&S) -> usize) -> Pass {
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
    let during = held(&s);
    let loss = s.sum(&y).unwrap();
    let mut sgd = Optimizer::sgd(0.1).unwrap();
    match (grad, s.backward_step(&loss, &mut sgd)) {
        (true, r) => {
            r.unwrap();
        }
        // PyTorch raises at `loss.backward()` here too: nothing would step.
        (false, r) => {
            let e = r.expect_err("a step from a loss without grad is an error");
            assert!(e.to_string().contains("does not require grad"), "{e}");
        }
    }
    Train::reset(&mut s);
    assert_eq!(s.is_grad_enabled(), grad, "a reset keeps the setting");
    let after = held(&s);
    let stepped = s.param_value(&pw).unwrap() != w0;
    Pass {
        bits,
        during,
        after,
        stepped,
    }
}

#[test]
fn a_pass_without_gradients_gives_the_same_bits_and_keeps_no_workspace() {
    let cpu = || Session::<f32>::new(Options::default()).unwrap();
    let sim = || {
        let opts = Options {
            backend: Backend::CudaSim,
            ..Options::default()
        };
        Session::<f32>::new(opts).unwrap()
    };
    let pool = |s: &Session<f32>| s.pool_stats().map_or(0, |p| p.held_bytes);
    let device = |s: &Session<f32>| s.memory_usage().map_or(0, |m| m.live_bytes);
    let linked_pool = |s: &LinkedSession<f32>| s.pool_stats().map_or(0, |p| p.held_bytes);
    let runs: [(&str, Pass, Pass); 3] = [
        (
            "eager cpu",
            pass(cpu(), true, pool),
            pass(cpu(), false, pool),
        ),
        (
            "eager cuda-sim",
            pass(sim(), true, device),
            pass(sim(), false, device),
        ),
        (
            "linked cpu",
            pass(LinkedSession::new(), true, linked_pool),
            pass(LinkedSession::new(), false, linked_pool),
        ),
    ];
    for (name, with, without) in runs {
        assert_eq!(without.bits, with.bits, "{name}: the same values");
        // The CPU pool receives the pass's buffers at the reset; the device holds them live.
        let (held, held_with) = match name {
            "eager cuda-sim" => (without.during, with.during),
            _ => (without.after, with.after),
        };
        assert!(
            held < held_with,
            "{name}: no backward workspace kept: {held} vs {held_with} bytes"
        );
        println!("{name}: {held} bytes without gradients, {held_with} with");
        assert!(
            with.stepped,
            "{name}: with gradients the step moves the weight"
        );
        assert!(!without.stepped, "{name}: without, no gradient reaches it");
    }
}
