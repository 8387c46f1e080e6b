//! `tl_nn::models` (the models `tl` trains and the benchmarks time): each learns a tiny
//! synthetic task (loss thresholds, never a time) on the eager CPU session and on the linked
//! session, the two following the same trajectory (same seed, same initial parameters);
//! parameter names are PyTorch's; bad configurations are errors that name the model.

use tl_nn::models::{
    self, BasicBlock, BlockConfig, CnnConfig, Fno1d, FnoConfig, LmConfig, ResNet, ResNetConfig,
    TransformerBlock, TransformerLm,
};
use tl_nn::{Activation, Labels, Module, Parameters, Runtime};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::Tensor;

use crate::rnn::{cast, expected, join_positions, narrow_positions, sgd_gradients};
use crate::{eager, linked, max_diff};

/// `n` values uniform in ±`scale` from the counter RNG keyed by `key`.
fn uniform(n: usize, key: u64, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|i| ((2.0 * tl_spec::rng::unit(key, i as u64) - 1.0) * scale) as f32)
        .collect()
}

/// The first loss is above `start`, the last below `end`, and the eager and linked runs agree
/// over their first ten steps.
fn check(runs: [Vec<f64>; 2], start: f64, end: f64) {
    for losses in &runs {
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(first > start, "starts untrained: {first}");
        assert!(last < end, "did not learn: {first} -> {last}");
    }
    for (e, (a, b)) in runs[0].iter().zip(&runs[1]).take(10).enumerate() {
        assert!((a - b).abs() <= 1e-4 * a.max(1.0), "step {e}: {a} vs {b}");
    }
}

/// The full names of `model`'s parameters, in its order.
fn names<O: Train, M: tl_nn::Parameters>(rt: &Runtime<O>, model: &M) -> Vec<String> {
    rt.named_params_of(model)
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn mlp_names_its_layers_as_nn_sequential_does() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let net = models::mlp(&rt.vars(), &[4, 8, 8, 3], Activation::Tanh).unwrap();
    assert_eq!(net.len(), 5, "three linear layers, two activations");
    assert_eq!(
        names(&rt, &net),
        [
            "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"
        ]
    );
    let e = models::mlp(&rt.vars().pp("b"), &[4], Activation::Relu)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("models::mlp") && e.contains("[4]"), "{e}");
}

/// 6×6 images of a horizontal (class 0) or vertical (class 1) bar at a random place, plus noise.
fn bars(n: usize) -> (Tensor<f32>, Labels) {
    let noise = uniform(n * 36, 11, 0.2);
    let mut x = vec![0f32; n * 36];
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let bits = tl_spec::rng::bits(12, i as u64);
        let (class, at) = ((bits % 2) as usize, (bits / 2 % 6) as usize);
        for k in 0..6 {
            let (r, c) = if class == 0 { (at, k) } else { (k, at) };
            x[i * 36 + r * 6 + c] = 1.0;
        }
        for (v, e) in x[i * 36..(i + 1) * 36].iter_mut().zip(&noise[i * 36..]) {
            *v += e;
        }
        y.push(class);
    }
    (
        Tensor::new([n, 1, 6, 6], x).unwrap(),
        Labels::new(y, 2).unwrap(),
    )
}

fn cnn_run<O: Train<T = f32>>(mut rt: Runtime<O>) -> Vec<f64> {
    let cfg = CnnConfig {
        in_channels: 1,
        height: 6,
        width: 6,
        channels: vec![4],
        classes: 2,
    };
    let net = models::cnn(&rt.vars(), &cfg).unwrap();
    // conv (0), relu, maxPool, flatten, linear (4): nn.Sequential's positions.
    assert_eq!(
        names(&rt, &net),
        ["0.weight", "0.bias", "4.weight", "4.bias"]
    );
    let (x, y) = bars(32);
    let mut opt = Optimizer::adam(0.03).unwrap();
    (0..40)
        .map(|_| {
            rt.step(&net, &mut opt, |g| {
                let logits = net.forward(&g.input(x.clone())?)?;
                assert_eq!(logits.dims(), [32, 2]);
                logits.cross_entropy(&y)
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn cnn_learns_bars_eager_and_linked() {
    check(
        [cnn_run(eager(Backend::Cpu, 3)), cnn_run(linked(3))],
        0.5,
        0.05,
    );
}

#[test]
fn cnn_rejects_a_config_without_features() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let cfg = CnnConfig {
        in_channels: 1,
        height: 2,
        width: 2,
        channels: vec![4, 4],
        classes: 2,
    };
    assert_eq!(cfg.features(), 0);
    let e = models::cnn(&rt.vars(), &cfg).err().unwrap().to_string();
    assert!(
        e.contains("models::cnn") && e.contains("no features"),
        "{e}"
    );
    let two = CnnConfig {
        height: 28,
        width: 28,
        channels: vec![8, 16],
        classes: 10,
        ..cfg
    };
    assert_eq!(two.features(), 16 * 7 * 7);
}

fn fno_run<O: Train<T = f32>>(mut rt: Runtime<O>) -> Vec<f64> {
    // Target: y(t) = (u(t−1) + 2u(t) + u(t+1))/4 on a periodic grid of 16 (a spectral filter).
    let (b, n) = (8, 16);
    let u = uniform(b * n, 5, 1.0);
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
        exact_gelu: false,
    };
    let fno = Fno1d::new(&rt.vars(), &cfg).unwrap();
    let n_names = names(&rt, &fno);
    assert_eq!(n_names.len(), 2 + 2 * (2 + 2) + 4);
    assert_eq!(
        n_names[..4],
        [
            "lift.weight",
            "lift.bias",
            "spectral.0.weight_re",
            "spectral.0.weight_im"
        ]
    );
    assert_eq!(n_names[n_names.len() - 1], "proj.2.bias");
    let mut opt = Optimizer::adam(0.01).unwrap();
    (0..150)
        .map(|_| {
            rt.step(&fno, &mut opt, |g| {
                let pred = fno.forward(&g.input(x.clone())?)?;
                assert_eq!(pred.dims(), [b, n, 1]);
                pred.mse_loss(&g.input(y.clone())?)
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn fno_learns_a_smoothing_operator_eager_and_linked() {
    let runs = [fno_run(eager(Backend::Cpu, 2)), fno_run(linked(2))];
    let first = runs[0][0];
    check(runs, 0.0, first / 20.0);
    let rt = eager::<f32>(Backend::Cpu, 0);
    let bad = FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: 0,
        modes: 4,
        layers: 1,
        proj_hidden: 4,
        exact_gelu: true,
    };
    let e = Fno1d::new(&rt.vars(), &bad).err().unwrap().to_string();
    assert!(e.contains("Fno1d::new") && e.contains("width: 0"), "{e}");
}

#[test]
fn fno_output_scale_multiplies_the_output_and_its_gradients() {
    // Runtimes with the same seed hold the same parameters; one model scales its output by c.
    let cfg = FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: 4,
        modes: 3,
        layers: 2,
        proj_hidden: 8,
        exact_gelu: true,
    };
    let c = 0.01;
    let x = Tensor::new([2, 8, 1], uniform(16, 3, 1.0)).unwrap();
    // The output, and every parameter after one SGD step at rate `lr` on the output's sum.
    let run = |scale: Option<f64>, lr: f64| {
        let mut rt = eager::<f32>(Backend::Cpu, 7);
        let fno = Fno1d::new(&rt.vars(), &cfg).unwrap();
        let fno = match scale {
            Some(c) => fno.with_output_scale(c).unwrap(),
            None => fno,
        };
        let out = rt
            .eval(&fno, |g| fno.forward(&g.input(x.clone())?))
            .unwrap();
        let mut before = Vec::new();
        fno.visit_params(&mut |p| before.extend(rt.value_of(p).unwrap().into_vec()));
        rt.step(&fno, &mut Optimizer::sgd(lr).unwrap(), |g| {
            fno.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap();
        let mut after = Vec::new();
        fno.visit_params(&mut |p| after.extend(rt.value_of(p).unwrap().into_vec()));
        assert!(before.iter().zip(&after).filter(|(a, b)| a != b).count() > after.len() / 2);
        (out.into_vec(), after)
    };
    let (plain, plain_after) = run(None, 1.0);
    let (scaled, scaled_after) = run(Some(c), 1.0 / c);
    assert_eq!(run(Some(1.0), 1.0), (plain.clone(), plain_after.clone()));
    for (a, b) in plain.iter().zip(&scaled) {
        assert!(
            (b - c as f32 * a).abs() <= 1e-6 * a.abs().max(1e-3),
            "{b} vs c·{a}"
        );
    }
    // Each gradient is c times the plain one, so a step at rate 1/c moves as the plain step.
    for (a, b) in plain_after.iter().zip(&scaled_after) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-2), "{b} vs {a}");
    }
    let rt = eager::<f32>(Backend::Cpu, 0);
    for (k, bad) in [0.0, -1.0, f64::NAN, f64::INFINITY].into_iter().enumerate() {
        let e = Fno1d::new(&rt.vars().pp(k), &cfg)
            .unwrap()
            .with_output_scale(bad);
        let e = e.err().unwrap().to_string();
        assert!(e.contains("Fno1d::with_output_scale"), "{e}");
    }
}

fn lm_run<O: Train<T = f32>>(mut rt: Runtime<O>) -> Vec<f64> {
    // Windows of the period-3 pattern 0 1 2 0 1 2 … at every phase: after the first token the
    // next one is determined, so the loss can fall far below ln 3.
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
    let next = Labels::new(next, 3).unwrap();
    let lm = TransformerLm::new(&rt.vars(), &cfg).unwrap();
    let n = names(&rt, &lm);
    assert_eq!(n[..2], ["tok_emb.weight", "pos_emb"]);
    assert!(n.contains(&"blocks.0.attn.wq".to_owned()), "{n:?}");
    assert_eq!(n[n.len() - 1], "head.bias");
    let e = rt
        .eval(&lm, |g| lm.logits(g, &tokens[..5], 1))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("TransformerLm::logits") && e.contains("got 5"),
        "{e}"
    );
    let mut opt = Optimizer::adam(0.01).unwrap();
    (0..60)
        .map(|_| {
            rt.step(&lm, &mut opt, |g| {
                let logits = lm.logits(g, &tokens, batch)?;
                assert_eq!(logits.dims(), [batch, 6, 3]);
                logits.cross_entropy(&next)
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn transformer_lm_learns_a_periodic_sequence_eager_and_linked() {
    check(
        [lm_run(eager(Backend::Cpu, 4)), lm_run(linked(4))],
        0.8,
        0.1,
    );
}

/// With a causal mask, changing the last position's input changes no earlier output; without
/// one it changes every output. A head count that does not divide the width is an error.
#[test]
fn transformer_block_is_causal_when_asked() {
    let a = uniform(32, 9, 1.0);
    let mut b = a.clone();
    b[31] += 1.0;
    for causal in [true, false] {
        let rt = eager::<f32>(Backend::Cpu, 1);
        let cfg = BlockConfig {
            d_model: 8,
            heads: 2,
            d_ff: 16,
            causal,
        };
        let blk = TransformerBlock::new(&rt.vars(), &cfg).unwrap();
        let out: Vec<Vec<f32>> = [&a, &b]
            .iter()
            .map(|v| {
                let x = Tensor::new([1, 4, 8], v.to_vec()).unwrap();
                let y = rt.eval(&blk, |g| blk.forward(&g.input(x)?)).unwrap();
                y.data().to_vec()
            })
            .collect();
        assert_ne!(out[0][24..], out[1][24..], "the changed position");
        if causal {
            assert_eq!(out[0][..24], out[1][..24]);
        } else {
            assert_ne!(out[0][..8], out[1][..8]);
        }
    }
    let rt = eager::<f32>(Backend::Cpu, 1);
    let bad = BlockConfig {
        d_model: 8,
        heads: 3,
        d_ff: 16,
        causal: true,
    };
    let e = TransformerBlock::new(&rt.vars(), &bad)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("dividing"), "{e}");
}

/// 40 steps of momentum SGD of a two-block ResNet (width 4) telling images whose left half is
/// brighter from the others; the losses.
fn resnet_run<O: Train<T = f32>>(mut rt: Runtime<O>) -> Vec<f64> {
    let cfg = ResNetConfig {
        in_channels: 1,
        channels: 4,
        blocks: 2,
        classes: 2,
    };
    let net = ResNet::new(&rt.vars(), &cfg).unwrap();
    let (b, side) = (8, 6);
    let mut x = uniform(b * side * side, 21, 0.5);
    for (k, v) in x.iter_mut().enumerate() {
        let (img, col) = (k / (side * side), k % side);
        if (img % 2 == 0) == (col < side / 2) {
            *v += 1.0;
        }
    }
    let x = Tensor::new([b, 1, side, side], x).unwrap();
    let labels = Labels::new((0..b).map(|i| i % 2).collect(), 2).unwrap();
    let mut opt = Optimizer::momentum(0.05, 0.9).unwrap();
    (0..40)
        .map(|_| {
            rt.step(&net, &mut opt, |g| {
                let out = net.forward(&g.input(x.clone())?)?;
                assert_eq!(out.dims(), [b, 2]);
                out.cross_entropy(&labels)
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn resnet_learns_eager_and_linked() {
    check(
        [resnet_run(eager(Backend::Cpu, 5)), resnet_run(linked(5))],
        0.5,
        0.1,
    );
}

#[test]
fn resnet_names_its_parameters_as_pytorch_and_refuses_zero_sizes() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let cfg = ResNetConfig {
        in_channels: 3,
        channels: 8,
        blocks: 2,
        classes: 10,
    };
    let net = ResNet::new(&rt.vars(), &cfg).unwrap();
    let n = names(&rt, &net);
    assert_eq!(n[..2], ["stem.weight", "stem.bias"]);
    for want in ["bn.weight", "blocks.0.conv1.weight", "blocks.1.bn2.bias"] {
        assert!(n.contains(&want.to_owned()), "{want} in {n:?}");
    }
    assert_eq!(n[n.len() - 2..], ["head.weight", "head.bias"]);
    let e = ResNet::new(&rt.vars().pp("z"), &ResNetConfig { channels: 0, ..cfg })
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("ResNet::new") && e.contains("channels: 0"),
        "{e}"
    );
}

/// A basic block is `relu(x + bn2(conv2(…)))`: with bn2's scale and shift at zero it is
/// `relu(x)` for any x (the skip and the last ReLU), and not otherwise.
#[test]
fn a_basic_block_adds_its_input_back() {
    let rt = eager::<f32>(Backend::Cpu, 2);
    let blk = BasicBlock::new(&rt.vars(), 2).unwrap();
    let x = Tensor::new([2, 2, 3, 3], uniform(36, 8, 1.0)).unwrap();
    let relu: Vec<f32> = x.data().iter().map(|v| v.max(0.0)).collect();
    let run = || {
        rt.eval(&blk, |g| blk.forward(&g.input(x.clone())?))
            .unwrap()
            .data()
            .to_vec()
    };
    assert_ne!(run(), relu, "bn2's default scale is 1");
    for (name, p) in rt.named_params_of(&blk) {
        if name == "bn2.weight" {
            rt.set_value(&p, Tensor::new([2], vec![0.0, 0.0]).unwrap())
                .unwrap();
        }
    }
    assert_eq!(run(), relu);
}

/// A LLaMA-style block (`models::LlamaBlock`: RMSNorm, causal rotary attention of 4 query heads
/// over 2 key/value heads, a SwiGLU MLP) against PyTorch's (fixture `llama_block`, written out
/// in `make_attention_fixtures.py`): the output and the gradients of x and every parameter on
/// the eager CPU (f64, f32), CUDA-sim and linked sessions; a d_ff of 0 names the block.
#[test]
fn a_llama_block_gives_pytorchs_values_and_gradients() {
    use tl_nn::models::{LlamaBlock, LlamaConfig};
    /// The fixture's block: width 16, 4 heads over 2, d_ff 24, interleaved rotation, ε 1e-5.
    const LLAMA: LlamaConfig = LlamaConfig {
        d_model: 16,
        heads: 4,
        kv_heads: 2,
        d_ff: 24,
        rope: tl_nn::Rope::DEFAULT,
        eps: 1e-5,
    };
    fn check<O: Train>(mut rt: Runtime<O>, tol: f64) {
        let e = expected("llama_block");
        let block = LlamaBlock::new(&rt.vars().pp("b"), &LLAMA).unwrap();
        let names = [
            "attn_norm",
            "wq",
            "wk",
            "wv",
            "wo",
            "mlp_norm",
            "w1",
            "w2",
            "w3",
        ];
        let mut params = Vec::new();
        block.visit_params(&mut |p| params.push(p.clone()));
        assert_eq!(params.len(), names.len());
        for (p, k) in params.iter().zip(names) {
            rt.set_value(p, cast(&e[k])).unwrap();
        }
        let x = rt.vars().param_from("x", cast(&e["input"]), true).unwrap();
        let w: Tensor<O::T> = cast(&e["weight"]);
        let y = rt.eval(&block, |g| block.forward(&g.param(&x)?)).unwrap();
        let d = max_diff(&y, &e["output"]);
        assert!(
            d < tol,
            "output ({}): max diff {d}",
            <O::T as tl_spec::Scalar>::NAME
        );
        /// The block and its input, both trained.
        struct WithInput<'a>(tl_session::Param, &'a LlamaBlock);
        impl Parameters for WithInput<'_> {
            fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
                f(&self.0);
                self.1.visit_params(f);
            }
        }
        let model = WithInput(x.clone(), &block);
        let mut all = vec![&x];
        all.extend(params.iter());
        let grads = sgd_gradients(&mut rt, &model, &all, |g| {
            (&block.forward(&g.param(&x)?)? * &g.input(w.clone())?)?.sum()
        });
        for (got, key) in grads.iter().zip(std::iter::once("input").chain(names)) {
            let d = max_diff(got, &e[&format!("grad_{key}")]);
            assert!(
                d < tol,
                "grad_{key} ({}): max diff {d}",
                <O::T as tl_spec::Scalar>::NAME
            );
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 2e-5);
    check(eager::<f32>(Backend::CudaSim, 0), 2e-5);
    check(linked::<f64>(0), 1e-12);
    // The fixture's x in chunks of 2 and 3 positions through a KvCache: the whole output.
    let e = expected("llama_block");
    let rt = eager::<f64>(Backend::Cpu, 0);
    let block = LlamaBlock::new(&rt.vars().pp("c"), &LLAMA).unwrap();
    let whole = rt
        .eval(&block, |g| block.forward(&g.input(e["input"].clone())?))
        .unwrap();
    let mut cache = tl_nn::KvCache::new();
    let parts: Vec<Tensor<f64>> = [(0, 2), (2, 3)]
        .into_iter()
        .map(|(at, len)| {
            let chunk = narrow_positions(&e["input"], at, len);
            rt.eval(&block, |g| {
                block.forward_cached(&g.input(chunk)?, &mut cache)
            })
            .unwrap()
        })
        .collect();
    let d = max_diff(&join_positions(&parts), &whole);
    assert!(d < 1e-12, "chunked through the cache: {d}");
    let bad = LlamaConfig { d_ff: 0, ..LLAMA };
    let e = LlamaBlock::new(&rt.vars(), &bad).err().unwrap().to_string();
    assert!(e.contains("LlamaBlock") && e.contains("d_ff"), "{e}");
}
