//! Layers, names and initialisers: eager = linked, one seed = one model on every backend,
//! PyTorch's initialiser bounds, batch norm's running statistics, dropout and masks.

use tl_nn::{
    AvgPool, BatchNorm, Conv, ConvConfig, ConvTranspose, Dropout, Embedding, GroupNorm,
    InstanceNorm, LayerNorm, Linear, MaxPool, Module, MultiHeadAttention, PRelu, Parameters,
    RmsNorm, Runtime, Sequential,
};
use tl_session::{Backend, Optimizer, Train};
use tl_spec::{Scalar, Tensor};

use crate::{eager, linked, max_diff, mlp, tensor, vals};

/// A small transformer-ish block with nested names, generic over the session.
struct Block {
    norm: LayerNorm,
    attn: MultiHeadAttention,
    ff: Linear,
}

impl Parameters for Block {
    fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
        self.norm.visit_params(f);
        self.attn.visit_params(f);
        self.ff.visit_params(f);
    }
}

impl<O: Train> Module<O> for Block {
    fn forward<'g>(&self, x: &tl_nn::Var<'g, O>) -> tl_nn::Result<tl_nn::Var<'g, O>> {
        let h = (x + &self.attn.forward(&self.norm.forward(x)?)?)?;
        &h + &self.ff.forward(&h)?.gelu()?
    }
}

fn block<O: Train>(rt: &Runtime<O>, i: usize) -> Block {
    let v = rt.vars().pp("blocks").pp(i);
    Block {
        norm: LayerNorm::new(&v.pp("norm"), 8).unwrap(),
        attn: MultiHeadAttention::new(&v.pp("attn"), 8, 2, true).unwrap(),
        ff: Linear::new(&v.pp("ff"), 8, 8).unwrap(),
    }
}

#[test]
fn names_are_hierarchical_and_unique() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let blocks = vec![block(&rt, 0), block(&rt, 1)];
    let names: Vec<String> = rt
        .named_params_of(&blocks)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names.len(), 16);
    assert_eq!(names[0], "blocks.0.norm.weight");
    assert_eq!(names[2], "blocks.0.attn.wq");
    assert_eq!(names[15], "blocks.1.ff.bias");
    // 2 × (8 + 8 + 4·64 + 64 + 8)
    assert_eq!(rt.num_params(&blocks).unwrap(), 2 * (16 + 256 + 72));
    // The same name twice is an error naming it.
    let err = Linear::new(&rt.vars().pp("blocks").pp(0).pp("ff"), 8, 8).unwrap_err();
    assert!(err.to_string().contains("blocks.0.ff.weight"), "{err}");
}

#[test]
fn freezing_a_prefix_stops_its_updates() {
    let mut rt = eager::<f64>(Backend::Cpu, 1);
    let model = mlp(&rt, 4, 6, 3);
    assert_eq!(rt.set_trainable(&model, "0.", false).unwrap(), 2);
    assert_eq!(rt.num_params(&model).unwrap(), 6 * 3 + 3);
    let before = rt.state_dict(&model).unwrap();
    let labels = tl_nn::Labels::new(vec![0, 1, 2, 1], 3).unwrap();
    let x = tensor::<f64>(&[4, 4], 3);
    let mut opt = Optimizer::sgd(0.5).unwrap();
    rt.step(&model, &mut opt, |g| {
        model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
    })
    .unwrap();
    let after = rt.state_dict(&model).unwrap();
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        let changed = max_diff(a, b) > 0.0;
        assert_eq!(changed, name.starts_with("2."), "{name} changed: {changed}");
    }
}

#[test]
fn eager_and_linked_run_the_same_model() {
    // One seed: the same initial parameters; then the same losses and parameters over steps.
    let x = tensor::<f64>(&[5, 8, 8], 7);
    let targets = tensor::<f64>(&[5, 8, 8], 8);
    fn train<O: Train<T = f64>>(
        mut rt: Runtime<O>,
        x: &Tensor<f64>,
        t: &Tensor<f64>,
    ) -> (Vec<f64>, Vec<Tensor<f64>>) {
        let model = Sequential::new().add(block(&rt, 0)).add(block(&rt, 1));
        let mut opt = Optimizer::adam(1e-2).unwrap();
        let losses = (0..3)
            .map(|_| {
                rt.step(&model, &mut opt, |g| {
                    model
                        .forward(&g.input(x.clone())?)?
                        .mse_loss(&g.input(t.clone())?)
                })
                .unwrap()
            })
            .collect();
        let params = rt
            .state_dict(&model)
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        (losses, params)
    }
    let (le, pe) = train(eager::<f64>(Backend::Cpu, 5), &x, &targets);
    let (ll, pl) = train(linked::<f64>(5), &x, &targets);
    assert!(le[2] < le[0], "the loss must fall: {le:?}");
    for (a, b) in le.iter().zip(&ll) {
        assert!((a - b).abs() < 1e-10, "eager {le:?} vs linked {ll:?}");
    }
    for (a, b) in pe.iter().zip(&pl) {
        assert!(max_diff(a, b) < 1e-10);
    }
}

#[test]
fn one_seed_gives_the_same_model_on_every_backend() {
    let cpu = eager::<f32>(Backend::Cpu, 42);
    let sim = eager::<f32>(Backend::CudaSim, 42);
    let lnk = linked::<f32>(42);
    let other = eager::<f32>(Backend::Cpu, 43);
    fn build<O: Train>(vars: tl_nn::Vars<'_, O>) -> Conv {
        Conv::conv2d(&vars.pp("c"), 2, 3, 3, ConvConfig::default()).unwrap()
    }
    let (a, b, c, d) = (
        build(cpu.vars()),
        build(sim.vars()),
        build(lnk.vars()),
        build(other.vars()),
    );
    let sa = cpu.state_dict(&a).unwrap();
    let sb = sim.state_dict(&b).unwrap();
    let sc = lnk.state_dict(&c).unwrap();
    let sd = other.state_dict(&d).unwrap();
    for i in 0..2 {
        assert_eq!(sa[i].1.data(), sb[i].1.data(), "{}", sa[i].0);
        assert_eq!(sa[i].1.data(), sc[i].1.data(), "{}", sa[i].0);
        assert_ne!(
            sa[i].1.data(),
            sd[i].1.data(),
            "another seed, another model"
        );
    }
}

#[test]
fn initialisers_follow_pytorch_defaults() {
    let rt = eager::<f64>(Backend::Cpu, 9);
    let v = rt.vars();
    let lin = Linear::new(&v.pp("lin"), 400, 300).unwrap();
    let w = rt.value_of(&lin.weight).unwrap();
    let bound = 1.0 / 400f64.sqrt(); // kaiming_uniform(a=√5): √(6/((1+5)·fan_in))
    let (mean, var) = moments(w.data());
    assert!(w.data().iter().all(|v| v.abs() <= bound));
    assert!(mean.abs() < 0.01 * bound, "mean {mean}");
    assert!(
        (var / (bound * bound / 3.0) - 1.0).abs() < 0.02,
        "var {var}"
    );
    let b = rt.value_of(lin.bias.as_ref().unwrap()).unwrap();
    assert!(b.data().iter().all(|v| v.abs() <= bound));
    assert!(b.data().iter().any(|v| v.abs() > bound / 2.0));
    let conv = Conv::conv2d(&v.pp("conv"), 3, 8, 5, ConvConfig::default()).unwrap();
    let cb = 1.0 / 75f64.sqrt();
    let cw = rt.value_of(&conv.weight).unwrap();
    assert!(
        cw.data().iter().all(|v| v.abs() <= cb) && cw.data().iter().any(|v| v.abs() > 0.9 * cb)
    );
    let emb = Embedding::new(&v.pp("emb"), 500, 200).unwrap();
    let (m, s2) = moments(rt.value_of(&emb.weight).unwrap().data());
    assert!(
        m.abs() < 0.01 && (s2 - 1.0).abs() < 0.02,
        "N(0,1): mean {m}, var {s2}"
    );
    let ln = LayerNorm::new(&v.pp("ln"), 4).unwrap();
    assert_eq!(rt.value_of(&ln.weight).unwrap().data(), &[1.0; 4]);
    assert_eq!(rt.value_of(&ln.bias).unwrap().data(), &[0.0; 4]);
}

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

#[test]
fn batch_norm_keeps_running_statistics_with_pytorch_momentum() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let bn = BatchNorm::new(&rt.vars().pp("bn"), 2).unwrap();
    // (N=2, C=2, 3): channel 0 holds 1..6 shifted, channel 1 a constant 4.
    let x = Tensor::new(
        [2, 2, 3],
        vec![1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 5.0, 6.0, 7.0, 4.0, 4.0, 4.0],
    )
    .unwrap();
    let y = rt
        .forward_train(&bn, |g| bn.forward(&g.input(x.clone())?))
        .unwrap();
    // Training output: batch statistics (biased variance), so channel 1 is all zeros.
    assert!(y.data()[3..6].iter().all(|v| v.abs() < 1e-9));
    let ch0 = [1.0, 2.0, 3.0, 5.0, 6.0, 7.0];
    let mean = 4.0;
    let unbiased = ch0.iter().map(|v: &f64| (v - mean).powi(2)).sum::<f64>() / 5.0;
    let rm = rt.value_of(&bn.running_mean).unwrap();
    let rv = rt.value_of(&bn.running_var).unwrap();
    assert!((rm.data()[0] - 0.1 * mean).abs() < 1e-12 && (rm.data()[1] - 0.4).abs() < 1e-12);
    assert!((rv.data()[0] - (0.9 + 0.1 * unbiased)).abs() < 1e-12);
    assert!((rv.data()[1] - 0.9).abs() < 1e-12);
    // Eval: the running statistics, not the batch's.
    let ye = rt.eval(&bn, |g| bn.forward(&g.input(x.clone())?)).unwrap();
    let expect = (1.0 - rm.data()[0]) / (rv.data()[0] + 1e-5).sqrt();
    assert!(
        (ye.data()[0] - expect).abs() < 1e-12,
        "{} vs {expect}",
        ye.data()[0]
    );
    // Eval passes leave the statistics alone; the linked session computes the same.
    assert_eq!(rt.value_of(&bn.running_mean).unwrap(), rm);
    let lrt = linked::<f64>(0);
    let lbn = BatchNorm::new(&lrt.vars().pp("bn"), 2).unwrap();
    lrt.forward_train(&lbn, |g| lbn.forward(&g.input(x.clone())?))
        .unwrap();
    let yl = lrt
        .eval(&lbn, |g| lbn.forward(&g.input(x.clone())?))
        .unwrap();
    assert!(max_diff(&ye, &yl) < 1e-12);
}

#[test]
fn dropout_acts_in_training_passes_only() {
    let rt = eager::<f64>(Backend::Cpu, 3);
    let d = Dropout::new(0.5).unwrap();
    let x = Tensor::ones([1000]);
    let train = rt
        .forward_train(&d, |g| d.forward(&g.input(x.clone())?))
        .unwrap();
    let zeros = train.data().iter().filter(|v| **v == 0.0).count();
    assert!(train.data().iter().all(|v| *v == 0.0 || *v == 2.0));
    assert!((400..600).contains(&zeros), "{zeros} of 1000 dropped");
    let eval = rt.eval(&d, |g| d.forward(&g.input(x.clone())?)).unwrap();
    assert_eq!(eval, x);
    assert!(Dropout::new(1.0).is_err() && Dropout::new(-0.1).is_err());
}

#[test]
fn causal_attention_does_not_see_the_future() {
    let rt = eager::<f64>(Backend::Cpu, 4);
    let causal = MultiHeadAttention::new(&rt.vars().pp("c"), 4, 2, true).unwrap();
    let full = MultiHeadAttention::new(&rt.vars().pp("f"), 4, 2, false).unwrap();
    let x = tensor::<f64>(&[3, 4], 1);
    let mut x2 = x.clone();
    x2.data_mut()[8] += 1.0; // row 2
    for (m, sees) in [(&causal, false), (&full, true)] {
        let a = rt.eval(m, |g| m.forward(&g.input(x.clone())?)).unwrap();
        let b = rt.eval(m, |g| m.forward(&g.input(x2.clone())?)).unwrap();
        let row0 = max_diff(
            &Tensor::vector(a.data()[..4].to_vec()),
            &Tensor::vector(b.data()[..4].to_vec()),
        );
        assert_eq!(row0 > 1e-9, sees, "row 0 changed by {row0}");
    }
    // Key padding: keys past `len` are invisible; an n whose n·n mask overflows is an error.
    let e = MultiHeadAttention::key_padding_mask(1 << 32, 1).unwrap_err();
    assert!(e.to_string().contains("mask"), "{e}");
    // A length past the padded batch's n (from before the batch was cut) is an error naming
    // the sequence, its length and n, for each of the three masks.
    let e = MultiHeadAttention::key_padding_mask(3, 4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("key_padding_mask") && e.contains("length 4") && e.contains("n = 3"),
        "{e}"
    );
    for e in [
        MultiHeadAttention::key_padding_masks(3, &[2, 4]).unwrap_err(),
        MultiHeadAttention::causal_padding_masks(3, &[2, 4]).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(
            e.contains("sequence 1 has length 4") && e.contains("n = 3"),
            "{e}"
        );
    }
    assert!(MultiHeadAttention::key_padding_masks(3, &[3, 0]).is_ok());
    let pad = MultiHeadAttention::key_padding_mask(3, 2).unwrap();
    let a = rt
        .eval(&full, |g| {
            full.forward_masked(&g.input(x.clone())?, Some(pad.clone()))
        })
        .unwrap();
    let b = rt
        .eval(&full, |g| {
            full.forward_masked(&g.input(x2.clone())?, Some(pad.clone()))
        })
        .unwrap();
    assert!(
        max_diff(
            &Tensor::vector(a.data()[..8].to_vec()),
            &Tensor::vector(b.data()[..8].to_vec())
        ) < 1e-12
    );
}

#[test]
fn convolutions_and_pools_take_pytorch_shapes() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let v = rt.vars();
    let cfg = ConvConfig {
        stride: 2,
        padding: 1,
    };
    let c1 = Conv::conv1d(&v.pp("c1"), 2, 3, 3, cfg).unwrap();
    let c3 = Conv::new(&v.pp("c3"), 1, 2, &[2, 2, 2], ConvConfig::default()).unwrap();
    let ct = ConvTranspose::new(&v.pp("ct"), 3, 2, &[2, 2], cfg).unwrap();
    let out = |m: &dyn Module<tl_session::Session<f32>>, dims: &[usize]| -> Vec<usize> {
        struct Wrap<'a>(&'a dyn Module<tl_session::Session<f32>>);
        impl Parameters for Wrap<'_> {
            fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
                self.0.visit_params(f)
            }
        }
        let w = Wrap(m);
        rt.eval(&w, |g| w.0.forward(&g.input(Tensor::zeros(dims))?))
            .unwrap()
            .shape()
            .dims()
            .to_vec()
    };
    assert_eq!(out(&c1, &[4, 2, 9]), [4, 3, 5]);
    assert_eq!(out(&c3, &[1, 4, 4, 4]), [2, 3, 3, 3]);
    assert_eq!(out(&ct, &[5, 3, 4, 4]), [5, 2, 6, 6]);
    assert_eq!(
        out(&MaxPool::new(&[2, 2]).unwrap(), &[2, 3, 6, 6]),
        [2, 3, 3, 3]
    );
    assert_eq!(
        out(
            &AvgPool::new(&[3])
                .unwrap()
                .stride(1)
                .unwrap()
                .padding(1)
                .unwrap(),
            &[2, 7]
        ),
        [2, 7]
    );
    // A wrong input is an error naming the layer.
    let err = rt
        .eval(&c1, |g| c1.forward(&g.input(Tensor::zeros([4, 5, 9]))?))
        .unwrap_err();
    assert!(err.to_string().contains("conv"), "{err}");
    assert!(MaxPool::new(&[0]).is_err());
    assert!(Conv::conv2d(&v.pp("bad"), 0, 3, 3, cfg).is_err());
}

/// Attention runs fused by default (the seeds' `useFlash := true`): on the CUDA tape the flash
/// kernels, whose value and gradients (through one SGD step) are the composed path's; heads
/// past the kernels' 128 default to the composed path, and forcing them fused is an error
/// naming the op.
#[test]
fn attention_is_fused_by_default_and_agrees_with_the_composed_path() {
    let x = tensor::<f32>(&[2, 19, 8], 2);
    let run = |flash: bool| {
        let mut rt = eager::<f32>(Backend::CudaSim, 3);
        let m = MultiHeadAttention::new(&rt.vars().pp("a"), 8, 2, true).unwrap();
        assert!(m.flash, "fused by default");
        let m = m.with_flash(flash);
        let y = rt.eval(&m, |g| m.forward(&g.input(x.clone())?)).unwrap();
        let mut opt = Optimizer::sgd(1.0).unwrap();
        let loss = rt
            .step(&m, &mut opt, |g| {
                m.forward(&g.input(x.clone())?)?.tanh()?.sum()
            })
            .unwrap();
        let params: Vec<Tensor<f32>> = [&m.wq, &m.wk, &m.wv, &m.wo]
            .iter()
            .map(|p| rt.value_of(p).unwrap())
            .collect();
        (y, loss, params)
    };
    let (yf, lf, pf) = run(true);
    let (yc, lc, pc) = run(false);
    assert!(max_diff(&yf, &yc) < 1e-5, "{}", max_diff(&yf, &yc));
    assert!((lf - lc).abs() < 1e-4 * lc.abs().max(1.0), "{lf} vs {lc}");
    for (a, b) in pf.iter().zip(&pc) {
        // One step of lr 1: the parameters differ by the gradients' difference.
        assert!(max_diff(a, b) < 1e-5, "{}", max_diff(a, b));
    }
    let rt = eager::<f32>(Backend::CudaSim, 3);
    let wide = MultiHeadAttention::new(&rt.vars().pp("w"), 258, 2, false).unwrap();
    assert!(!wide.flash, "head 129: composed by default");
    let forced = wide.clone().with_flash(true);
    let x = tensor::<f32>(&[3, 258], 4);
    let e = rt
        .eval(&forced, |g| forced.forward(&g.input(x.clone())?))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("d = 129"),
        "{e}"
    );
    assert!(
        rt.eval(&wide, |g| wide.forward(&g.input(x.clone())?))
            .is_ok()
    );
}

/// RmsNorm by PyTorch's formula `x / √(mean(x²) + ε) · weight`, ε by default the element
/// type's machine epsilon, on an f32 and an f64 session; the wrong width is an error naming
/// the layer.
#[test]
fn rms_norm_follows_pytorch_and_defaults_to_the_machine_epsilon() {
    fn run<T: tl_spec::Scalar>(eps: Option<f64>, default_eps: f64) {
        let rt = eager::<T>(Backend::Cpu, 0);
        let v = rt.vars().pp("n");
        let norm = match eps {
            Some(e) => RmsNorm::with_eps(&v, 2, e).unwrap(),
            None => RmsNorm::new(&v, 2).unwrap(),
        };
        rt.set_value(
            &norm.weight,
            Tensor::new([2], vec![T::lit(1.0), T::lit(-2.0)]).unwrap(),
        )
        .unwrap();
        let rows = [[3.0, 4.0], [0.5, -0.25]];
        let x = Tensor::from_fn([2, 2], |i| T::lit(rows[i / 2][i % 2]));
        let y = rt
            .eval(&norm, |g| norm.forward(&g.input(x.clone())?))
            .unwrap();
        let eps = eps.unwrap_or(default_eps);
        for (r, row) in rows.iter().enumerate() {
            let rms = ((row[0] * row[0] + row[1] * row[1]) / 2.0 + eps).sqrt();
            for (k, w) in [1.0, -2.0].into_iter().enumerate() {
                let (got, want) = (y.data()[2 * r + k].as_f64(), row[k] / rms * w);
                assert!(
                    (got - want).abs() <= 4.0 * default_eps * want.abs(),
                    "{r},{k}: {got} vs {want}"
                );
            }
        }
        // A 1-D input is one row.
        let y1 = rt
            .eval(&norm, |g| {
                norm.forward(&g.input(Tensor::new([2], vec![T::lit(3.0), T::lit(4.0)]).unwrap())?)
            })
            .unwrap();
        assert!((y1.data()[0].as_f64() - 3.0 / (12.5 + eps).sqrt()).abs() < 1e-6);
        let err = rt
            .eval(&norm, |g| norm.forward(&g.input(Tensor::zeros([2, 3]))?))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("RMSNorm \"n\"") && err.contains("expected 2"),
            "{err}"
        );
    }
    run::<f32>(None, f32::EPSILON.into());
    run::<f64>(None, f64::EPSILON);
    // ε = 0.1 moves the small row: 0.5 / √(0.15625 + 0.1), not 0.5 / √0.15625.
    run::<f64>(Some(0.1), f64::EPSILON);
}

/// GroupNorm normalises each (sample, group) over its channels and trailing axes (biased
/// variance), then scales and shifts per channel; `groups` = 1 and `groups` = C are layer
/// norm and instance norm with a per-channel affine; eager = linked; a wrong input names
/// the layer.
#[test]
fn group_norm_normalises_each_sample_s_channel_groups() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let v = rt.vars();
    let gn = GroupNorm::new(&v.pp("gn"), 2, 4).unwrap();
    rt.set_value(&gn.weight, Tensor::vector(vec![1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    rt.set_value(&gn.bias, Tensor::vector(vec![0.0, 0.5, 0.0, -1.0]))
        .unwrap();
    // (N=1, C=4, 2): group 0 = channels 0, 1 = [1, 3, 5, 7] (mean 4, variance 5); group 1 =
    // channels 2, 3 = [10, 10, 14, 14] (mean 12, variance 4).
    let x = Tensor::new([1, 4, 2], vec![1.0, 3.0, 5.0, 7.0, 10.0, 10.0, 14.0, 14.0]).unwrap();
    let y = rt.eval(&gn, |g| gn.forward(&g.input(x.clone())?)).unwrap();
    let (s0, s1) = ((5.0f64 + 1e-5).sqrt(), (4.0f64 + 1e-5).sqrt());
    let want = [
        -3.0 / s0,
        -1.0 / s0,
        2.0 * 1.0 / s0 + 0.5,
        2.0 * 3.0 / s0 + 0.5,
        3.0 * -2.0 / s1,
        3.0 * -2.0 / s1,
        4.0 * 2.0 / s1 - 1.0,
        4.0 * 2.0 / s1 - 1.0,
    ];
    let got = y.data();
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-12, "{k}: {g} vs {w}");
    }
    // One group: each sample normalised as a whole; as many groups as channels: instance norm.
    let x = tensor::<f64>(&[3, 4, 5], 11);
    let per_sample = |groups: usize, name: &str| {
        let m = GroupNorm::new(&v.pp(name), groups, 4).unwrap();
        rt.eval(&m, |g| m.forward(&g.input(x.clone())?)).unwrap()
    };
    let (whole, instance) = (per_sample(1, "g1"), per_sample(4, "g4"));
    let normalised = |y: &Tensor<f64>, stride: usize| {
        y.data().chunks(stride).all(|c| {
            let m = c.iter().sum::<f64>() / c.len() as f64;
            let var = c.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / c.len() as f64;
            m.abs() < 1e-12 && (var - 1.0).abs() < 1e-3
        })
    };
    assert!(normalised(&whole, 20) && !normalised(&whole, 5));
    assert!(normalised(&instance, 5));
    // Eager = linked.
    let lrt = linked::<f64>(0);
    let lgn = GroupNorm::new(&lrt.vars().pp("gn"), 2, 4).unwrap();
    lrt.set_value(&lgn.weight, Tensor::vector(vec![1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    lrt.set_value(&lgn.bias, Tensor::vector(vec![0.0, 0.5, 0.0, -1.0]))
        .unwrap();
    let x = Tensor::new([1, 4, 2], vec![1.0, 3.0, 5.0, 7.0, 10.0, 10.0, 14.0, 14.0]).unwrap();
    let yl = lrt
        .eval(&lgn, |g| lgn.forward(&g.input(x.clone())?))
        .unwrap();
    assert!(max_diff(&y, &yl) < 1e-12);
    let err = rt
        .eval(&gn, |g| gn.forward(&g.input(Tensor::zeros([2, 3, 2]))?))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GroupNorm \"gn\"") && err.contains("(N, 4, …)") && err.contains("has 3"),
        "{err}"
    );
}

/// InstanceNorm is GroupNorm with one group per channel, bit for bit in values and in the
/// input's gradient (with the affine: the same weights; without: GroupNorm's defaults, 1 and
/// 0), on the eager CPU session and the linked one; without the affine it has no parameters;
/// it prints as PyTorch's; an unbatched input and a bad setting are errors naming it.
#[test]
fn instance_norm_is_group_norm_with_a_group_per_channel() {
    fn run<O: Train>(rt: &mut Runtime<O>, affine: bool) {
        let v = rt.vars();
        let inst = InstanceNorm::with(&v.pp("inst"), 3, 1e-3, affine).unwrap();
        let group = GroupNorm::with_eps(&v.pp("group"), 3, 3, 1e-3).unwrap();
        if let (Some(w), Some(b)) = (&inst.weight, &inst.bias) {
            for (p, q, vals) in [
                (w, &group.weight, vec![0.5, 2.0, -1.0]),
                (b, &group.bias, vec![0.25, 0.0, -2.0]),
            ] {
                rt.set_value(p, Tensor::vector(vals.clone()).cast())
                    .unwrap();
                rt.set_value(q, Tensor::vector(vals).cast()).unwrap();
            }
        }
        let x = tensor::<f64>(&[2, 3, 4, 5], 29);
        let eval = |m: &dyn Module<O>| {
            rt.eval(m, |g| m.forward(&g.input(x.cast())?))
                .unwrap()
                .data()
                .iter()
                .map(|v| v.as_f64())
                .collect::<Vec<_>>()
        };
        assert_eq!(eval(&inst), eval(&group), "affine {affine}");
        // The input's gradient under Σ w·y, w a fixed pattern.
        let mut grad = |m: &dyn Module<O>, name: &str| {
            let p = rt.vars().param_from(name, x.cast(), true).unwrap();
            let before = rt.value_of(&p).unwrap();
            let mut opt = Optimizer::sgd(1.0).unwrap();
            let w = Tensor::from_fn(x.shape().clone(), |i| 1.0 - 0.25 * (i % 7) as f64);
            let model = WithInput {
                x: p.clone(),
                layer: m,
            };
            rt.step(&model, &mut opt, |g| {
                (&m.forward(&g.param(&p)?)? * &g.input(w.cast())?)?.sum()
            })
            .unwrap();
            let after = rt.value_of(&p).unwrap();
            let d: Vec<f64> = before
                .data()
                .iter()
                .zip(after.data())
                .map(|(a, b)| a.as_f64() - b.as_f64())
                .collect();
            d
        };
        assert_eq!(
            grad(&inst, "x_inst"),
            grad(&group, "x_group"),
            "affine {affine}"
        );
    }
    for affine in [false, true] {
        run(&mut eager::<f64>(Backend::Cpu, 0), affine);
        run(&mut linked::<f64>(0), affine);
    }
    let rt = eager::<f64>(Backend::Cpu, 0);
    let plain = InstanceNorm::new(&rt.vars().pp("in"), 3).unwrap();
    let mut n = 0;
    plain.visit_params(&mut |_| n += 1);
    assert_eq!(n, 0);
    assert_eq!(
        tl_nn::tree(&plain).to_string(),
        "InstanceNorm(3, eps=1e-05, affine=False, track_running_stats=False)"
    );
    let affine = InstanceNorm::with(&rt.vars().pp("ia"), 3, 1e-5, true).unwrap();
    let err = rt
        .eval(&affine, |g| {
            affine.forward(&g.input(Tensor::zeros([3, 4, 4]))?)
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("InstanceNorm \"ia\"") && err.contains("(N, 3, …)"),
        "{err}"
    );
    let err = rt
        .eval(&plain, |g| plain.forward(&g.input(Tensor::zeros([2, 4]))?))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("InstanceNorm") && err.contains("(N, 3, …)"),
        "{err}"
    );
    for (c, eps) in [(0, 1e-5), (3, 0.0), (3, f64::NAN)] {
        let err = InstanceNorm::with(&rt.vars().pp("bad"), c, eps, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("InstanceNorm::new"), "{err}");
    }
}

/// x as a trainable parameter beside a layer, so one SGD step of lr 1 gives x's gradient too.
struct WithInput<'a, M: ?Sized> {
    x: tl_session::Param,
    layer: &'a M,
}

impl<M: Parameters + ?Sized> Parameters for WithInput<'_, M> {
    fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
        f(&self.x);
        self.layer.visit_params(f);
    }
}

#[test]
fn prelu_follows_pytorch_at_zero_and_per_channel() {
    // PyTorch: y = x for x > 0 else a·x; dy/dx = 1 for x > 0 else a (x = 0 included); the
    // slope's gradient Σ g·x over x ≤ 0 (its channel's). Loss Σ y·c.
    fn run<O: Train>(mut rt: Runtime<O>, tol: f64) {
        use tl_spec::Scalar;
        let xs = [1.5, -2.0, 0.0, -0.5, 3.0, -1.0];
        let c = [1.0, 2.0, -1.0, 0.5, 1.0, 3.0];
        // x (1, 2, 3): channel 0 holds 1.5, -2, 0; channel 1 holds -0.5, 3, -1.
        let x = rt
            .vars()
            .param_from("x", vals(&xs, &[1, 2, 3]), true)
            .unwrap();
        let layer = PRelu::new(&rt.vars().pp("act"), 2).unwrap();
        let slopes = [0.25, -0.5];
        rt.set_value(&layer.weight, vals(&slopes, &[2])).unwrap();
        let model = WithInput {
            x: x.clone(),
            layer: &layer,
        };
        let y = rt.eval(&model, |g| layer.forward(&g.param(&x)?)).unwrap();
        let a = |i: usize| slopes[i / 3];
        for (i, &v) in xs.iter().enumerate() {
            let want = if v > 0.0 { v } else { a(i) * v };
            assert!((y.data()[i].as_f64() - want).abs() <= tol, "y[{i}]");
        }
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| {
            let y = layer.forward(&g.param(&x)?)?;
            (&y * &g.input(vals(&c, &[1, 2, 3]))?)?.sum()
        })
        .unwrap();
        let (x1, a1) = (
            rt.value_of(&x).unwrap(),
            rt.value_of(&layer.weight).unwrap(),
        );
        for (i, &v) in xs.iter().enumerate() {
            let want = if v > 0.0 { c[i] } else { a(i) * c[i] };
            let got = v - x1.data()[i].as_f64();
            assert!((got - want).abs() <= tol, "dx[{i}]: {got} vs {want}");
        }
        for (k, &s) in slopes.iter().enumerate() {
            let want: f64 = (3 * k..3 * k + 3).map(|i| c[i] * xs[i].min(0.0)).sum();
            let got = s - a1.data()[k].as_f64();
            assert!((got - want).abs() <= tol, "da[{k}]: {got} vs {want}");
        }
    }
    run(eager::<f64>(Backend::Cpu, 0), 1e-15);
    run(linked::<f64>(0), 1e-15);
    run(eager::<f32>(Backend::CudaSim, 0), 1e-6);
}

#[test]
fn prelu_shares_one_slope_and_checks_its_channels() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let one = PRelu::new(&rt.vars().pp("one"), 1).unwrap();
    // PyTorch's defaults and names.
    assert_eq!(rt.value_of(&one.weight).unwrap().data(), [0.25]);
    let names: Vec<String> = rt
        .named_params_of(&one)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["one.weight"]);
    assert_eq!(
        tl_nn::tree(&one).to_string().trim(),
        "PReLU(num_parameters=1)"
    );
    // One slope on any rank, a scalar included.
    for dims in [&[][..], &[3], &[2, 3, 2]] {
        let n = dims.iter().product::<usize>();
        let xs: Vec<f64> = (0..n).map(|i| i as f64 - 2.0).collect();
        let y = rt
            .eval(&one, |g| one.forward(&g.input(vals(&xs, dims))?))
            .unwrap();
        assert_eq!(y.shape().dims(), dims);
        for (v, &x) in y.data().iter().zip(&xs) {
            assert_eq!(*v, if x > 0.0 { x } else { 0.25 * x });
        }
    }
    // C slopes need the channels on axis 1.
    let three = PRelu::with_init(&rt.vars().pp("three"), 3, 0.1).unwrap();
    for dims in [&[3][..], &[2, 4], &[]] {
        let e = rt
            .eval(&three, |g| three.forward(&g.input(Tensor::zeros(dims))?))
            .unwrap_err()
            .to_string();
        assert!(e.contains("PReLU") && e.contains("3 slopes"), "{e}");
    }
    let y = rt
        .eval(&three, |g| {
            three.forward(&g.input(Tensor::full([2, 3], -1.0))?)
        })
        .unwrap();
    assert_eq!(y.data(), [-0.1; 6]);
    // Bad sizes and inits are errors naming the constructor.
    for (n, init) in [(0, 0.25), (2, f64::NAN), (2, f64::INFINITY)] {
        let e = PRelu::with_init(&rt.vars().pp("bad"), n, init)
            .unwrap_err()
            .to_string();
        assert!(e.contains("PRelu::new"), "{e}");
    }
}

#[test]
fn upsample_repeats_cells_and_sums_their_gradients() {
    use tl_nn::Upsample;
    fn run<O: Train>(mut rt: Runtime<O>) {
        use tl_spec::Scalar;
        // x (1, 1, 2, 2) = [[1, 2], [3, 4]], scaled 2 × 3: PyTorch's
        // F.interpolate(x, scale_factor=(2, 3)) (nearest).
        let x = rt
            .vars()
            .param_from("x", vals(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]), true)
            .unwrap();
        let up = Upsample::per_axis(&[2, 3]).unwrap();
        let model = WithInput {
            x: x.clone(),
            layer: &up,
        };
        let y = rt.eval(&model, |g| up.forward(&g.param(&x)?)).unwrap();
        assert_eq!(y.shape().dims(), [1, 1, 4, 6]);
        let got: Vec<f64> = y.data().iter().map(|v| v.as_f64()).collect();
        let row = |a: f64, b: f64| [a, a, a, b, b, b];
        let want: Vec<f64> = [row(1.0, 2.0), row(1.0, 2.0), row(3.0, 4.0), row(3.0, 4.0)].concat();
        assert_eq!(got, want);
        // Loss Σ y·c: each input cell's gradient is the sum of c over its six copies.
        let c: Vec<f64> = (0..24).map(|i| i as f64).collect();
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&model, &mut opt, |g| {
            let y = up.forward(&g.param(&x)?)?;
            (&y * &g.input(vals(&c, &[1, 1, 4, 6]))?)?.sum()
        })
        .unwrap();
        let after = rt.value_of(&x).unwrap();
        for (cell, (before, a)) in [1.0, 2.0, 3.0, 4.0].iter().zip(after.data()).enumerate() {
            let (r, k) = (cell / 2, cell % 2);
            let want: f64 = (2 * r..2 * r + 2)
                .flat_map(|i| (3 * k..3 * k + 3).map(move |j| (i * 6 + j) as f64))
                .sum();
            assert_eq!(before - a.as_f64(), want, "cell {cell}");
        }
    }
    run(eager::<f64>(Backend::Cpu, 0));
    run(linked::<f64>(0));
    run(eager::<f32>(Backend::CudaSim, 0));

    // PyTorch's printing; one factor for every axis of 1-D to 3-D inputs.
    assert_eq!(
        tl_nn::tree(&Upsample::new(2).unwrap()).to_string().trim(),
        "Upsample(scale_factor=2.0, mode='nearest')"
    );
    assert_eq!(
        tl_nn::tree(&Upsample::per_axis(&[2, 1]).unwrap())
            .to_string()
            .trim(),
        "Upsample(scale_factor=(2.0, 1.0), mode='nearest')"
    );
    let rt = eager::<f64>(Backend::Cpu, 0);
    let up = Upsample::new(2).unwrap();
    for (dims, out) in [
        (&[1, 2, 3][..], &[1, 2, 6][..]),
        (&[2, 1, 1, 2, 3], &[2, 1, 2, 4, 6]),
    ] {
        let y = rt
            .eval(&up, |g| up.forward(&g.input(Tensor::zeros(dims))?))
            .unwrap();
        assert_eq!(y.shape().dims(), out);
    }
    // Bad factors and inputs are errors naming the call and the value.
    for bad in [&[][..], &[0], &[1, 2, 3, 4]] {
        let e = Upsample::per_axis(bad).unwrap_err().to_string();
        assert!(e.contains("Upsample::new"), "{e}");
    }
    let two = Upsample::per_axis(&[2, 2]).unwrap();
    for dims in [&[4][..], &[1, 2], &[1, 1, 2, 2, 2, 2, 2], &[1, 1, 4]] {
        let e = rt
            .eval(&two, |g| two.forward(&g.input(Tensor::zeros(dims))?))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Upsample::forward") && e.contains(&format!("{dims:?}")),
            "{e}"
        );
    }
}

#[test]
fn adaptive_avg_pool_takes_pytorchs_windows() {
    use tl_nn::AdaptiveAvgPool;
    let rt = eager::<f64>(Backend::Cpu, 0);
    let run = |p: &AdaptiveAvgPool, x: Tensor<f64>| rt.eval(p, |g| p.forward(&g.input(x)?));
    // PyTorch: F.adaptive_avg_pool1d(torch.tensor([[[1., 2, 4, 8, 16]]]), 3) = [1.5, 14/3, 12]:
    // windows [0, 2), [1, 4), [3, 5).
    let p3 = AdaptiveAvgPool::new(&[3]).unwrap();
    let y = run(&p3, vals(&[1.0, 2.0, 4.0, 8.0, 16.0], &[1, 1, 5])).unwrap();
    assert_eq!(y.shape().dims(), [1, 1, 3]);
    for (got, want) in y.data().iter().zip([1.5, 14.0 / 3.0, 12.0]) {
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");
    }
    // Larger than the input: cells repeat ([0, 1), [0, 2), [1, 2) of two cells).
    let y = run(&p3, vals(&[2.0, 4.0], &[1, 2])).unwrap();
    assert_eq!(y.data(), [2.0, 3.0, 4.0]);
    // (1, 1, 4, 4) to (2, 2): 2×2 average pooling; to (1, 1): the mean.
    let xs: Vec<f64> = (0..16).map(f64::from).collect();
    let p22 = AdaptiveAvgPool::new(&[2, 2]).unwrap();
    let y = run(&p22, vals(&xs, &[1, 1, 4, 4])).unwrap();
    assert_eq!(y.data(), [2.5, 4.5, 10.5, 12.5]);
    let y = run(
        &AdaptiveAvgPool::new(&[1, 1]).unwrap(),
        vals(&xs, &[1, 1, 4, 4]),
    )
    .unwrap();
    assert_eq!(
        (y.shape().dims(), y.data()),
        (&[1, 1, 1, 1][..], &[7.5][..])
    );
    // PyTorch's printing.
    assert_eq!(
        tl_nn::tree(&p22).to_string().trim(),
        "AdaptiveAvgPool2d(output_size=(2, 2))"
    );
    assert_eq!(
        tl_nn::tree(&p3).to_string().trim(),
        "AdaptiveAvgPool1d(output_size=3)"
    );
    // Bad sizes are errors naming the call and the value, bad inputs the layer and the input.
    for bad in [&[][..], &[0, 1], &[1, 1, 1, 1]] {
        let e = AdaptiveAvgPool::new(bad).unwrap_err().to_string();
        assert!(e.contains("AdaptiveAvgPool::new"), "{e}");
    }
    for dims in [&[4][..], &[1, 1, 1, 4, 4], &[1, 0, 4]] {
        let e = run(&p22, Tensor::zeros(dims)).unwrap_err().to_string();
        assert!(
            e.starts_with("AdaptiveAvgPool2d: ") && e.contains(&format!("{dims:?}")),
            "{e}"
        );
    }
}

#[test]
fn upsample_interpolates_as_pytorch() {
    use tl_nn::Upsample;
    let rt = eager::<f64>(Backend::Cpu, 0);
    let run = |u: &Upsample, x: Tensor<f64>| rt.eval(u, |g| u.forward(&g.input(x)?));
    let close = |got: &[f64], want: &[f64]| {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-14, "{got:?} vs {want:?}");
        }
    };
    // PyTorch: F.interpolate(torch.tensor([[[1., 2, 4]]]), scale_factor=2, mode='linear',
    // align_corners=False / True).
    let x = vals(&[1.0, 2.0, 4.0], &[1, 1, 3]);
    let y = run(&Upsample::linear(2, false).unwrap(), x.clone()).unwrap();
    close(y.data(), &[1.0, 1.25, 1.75, 2.5, 3.5, 4.0]);
    let y = run(&Upsample::linear(2, true).unwrap(), x).unwrap();
    close(y.data(), &[1.0, 1.4, 1.8, 2.4, 3.2, 4.0]);
    // mode='bilinear' on [[1, 2], [3, 4]].
    let y = run(
        &Upsample::bilinear(2, false).unwrap(),
        vals(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]),
    )
    .unwrap();
    assert_eq!(y.shape().dims(), [1, 1, 4, 4]);
    #[rustfmt::skip]
    close(y.data(), &[
        1.0, 1.25, 1.75, 2.0,
        1.5, 1.75, 2.25, 2.5,
        2.5, 2.75, 3.25, 3.5,
        3.0, 3.25, 3.75, 4.0,
    ]);
    // Printing, and a mode given the wrong number of spatial axes.
    assert_eq!(
        tl_nn::tree(&Upsample::trilinear(2, true).unwrap())
            .to_string()
            .trim(),
        "Upsample(scale_factor=2.0, mode='trilinear')"
    );
    let bi = Upsample::bilinear(2, false).unwrap();
    let e = run(&bi, Tensor::zeros([1, 1, 3])).unwrap_err().to_string();
    assert!(e.contains("'bilinear'") && e.contains("[1, 1, 3]"), "{e}");
}

#[test]
fn layer_norm_over_several_trailing_axes() {
    // PyTorch: nn.LayerNorm([2, 3]) on x (2, 2, 3) normalises each sample's six values as one
    // group, weight and bias shaped (2, 3).
    let rt = eager::<f64>(Backend::Cpu, 0);
    let ln = LayerNorm::over(&rt.vars().pp("ln"), &[2, 3], 1e-5).unwrap();
    assert_eq!(rt.value_of(&ln.weight).unwrap().shape().dims(), [2, 3]);
    assert_eq!(
        tl_nn::tree(&ln).to_string().trim(),
        "LayerNorm((2, 3), eps=1e-05, elementwise_affine=True)"
    );
    let w: Vec<f64> = (0..6).map(|i| 1.0 + 0.5 * i as f64).collect();
    let b: Vec<f64> = (0..6).map(|i| 0.25 * i as f64 - 1.0).collect();
    rt.set_value(&ln.weight, vals(&w, &[2, 3])).unwrap();
    rt.set_value(&ln.bias, vals(&b, &[2, 3])).unwrap();
    let xs: Vec<f64> = (0..12).map(|i| ((i * 7) % 12) as f64 * 0.5 - 1.0).collect();
    let y = rt
        .eval(&ln, |g| ln.forward(&g.input(vals(&xs, &[2, 2, 3]))?))
        .unwrap();
    assert_eq!(y.shape().dims(), [2, 2, 3]);
    for (s, sample) in xs.chunks(6).enumerate() {
        let mean = sample.iter().sum::<f64>() / 6.0;
        let var = sample.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 6.0;
        for (k, v) in sample.iter().enumerate() {
            let want = (v - mean) / (var + 1e-5).sqrt() * w[k] + b[k];
            let got = y.data()[6 * s + k];
            assert!((got - want).abs() < 1e-12, "{s},{k}: {got} vs {want}");
        }
    }
    // x must end in the normalised shape; bad shapes are errors.
    let e = rt
        .eval(&ln, |g| ln.forward(&g.input(Tensor::zeros([2, 3, 2]))?))
        .unwrap_err()
        .to_string();
    assert!(e.contains("LayerNorm") && e.contains("[2, 3]"), "{e}");
    for bad in [&[][..], &[2, 0]] {
        let e = LayerNorm::over(&rt.vars().pp("bad"), bad, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("LayerNorm::new"), "{e}");
    }
}
