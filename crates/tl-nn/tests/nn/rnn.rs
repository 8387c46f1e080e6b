//! Recurrent layers, ModuleList and batched embeddings: LSTM and GRU against real PyTorch's
//! outputs and final states (fixtures from make_rnn_fixtures.py, loaded by PyTorch's names) on
//! every backend, their gradients against the IR's backprop and finite differences, eager =
//! linked, and bad input; MultiHeadAttention in PyTorch's fused layout, and its
//! cross-attention (`forward_qkv`) against PyTorch's values and gradients.

use std::path::{Path, PathBuf};

use tl_nn::checkpoint;
use tl_nn::{
    Embedding, Gru, Linear, Lstm, Module, ModuleList, MultiHeadAttention, Parameters, Result,
    RnnConfig, Rope, RopeLayout, Runtime, Scope, Var,
};
use tl_session::{Backend, Optimizer, Param, Train};
use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Tensor};

use crate::{eager, linked, max_diff, tensor};

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The tensors of `<name>_expected.safetensors` as f64 (inputs are stored as f32).
pub(crate) fn expected(name: &str) -> std::collections::BTreeMap<String, Tensor<f64>> {
    let p = fixture(&format!("{name}_expected.safetensors"));
    let f = checkpoint::read(&p).unwrap();
    f.tensors
        .iter()
        .map(|(k, e)| {
            let t = match e.to_tensor::<f64>(&p, k) {
                Ok(t) => t,
                Err(_) => cast(&e.to_tensor::<f32>(&p, k).unwrap()),
            };
            (k.clone(), t)
        })
        .collect()
}

/// `t` in another scalar type.
pub(crate) fn cast<A: Scalar, B: Scalar>(t: &Tensor<A>) -> Tensor<B> {
    let data = t.data().iter().map(|v| B::lit(v.as_f64())).collect();
    Tensor::new(t.shape().clone(), data).unwrap()
}

/// The tensors flattened and joined (one eval pass returns them all).
fn pack<'g, O: Train>(vs: &[&Var<'g, O>]) -> Result<Var<'g, O>> {
    let mut out = vs[0].flatten()?;
    for v in &vs[1..] {
        out = out.concat0(&v.flatten()?)?;
    }
    Ok(out)
}

fn pack_host(ts: &[&Tensor<f64>]) -> Tensor<f64> {
    let data: Vec<f64> = ts.iter().flat_map(|t| t.data().iter().copied()).collect();
    Tensor::vector(data)
}

/// The model of fixture `name` (2 layers, 3 → 4) in `rt`.
enum Rnn {
    Lstm(Lstm),
    Gru(Gru),
}

impl Rnn {
    fn new<O: Train>(rt: &Runtime<O>, name: &str, cfg: RnnConfig) -> Rnn {
        let v = rt.vars();
        if name.starts_with("lstm") {
            Rnn::Lstm(Lstm::new(&v, 3, 4, cfg).unwrap())
        } else {
            Rnn::Gru(Gru::new(&v, 3, 4, cfg).unwrap())
        }
    }

    /// output, h_n (and c_n) packed, from the given initial state or zeros.
    fn run<'g, O: Train>(
        &self,
        g: &Scope<'g, O>,
        x: &Tensor<O::T>,
        h0: Option<&Tensor<O::T>>,
        c0: Option<&Tensor<O::T>>,
    ) -> Result<Var<'g, O>> {
        let x = g.input(x.clone())?;
        let h0 = h0.map(|t| g.input(t.clone())).transpose()?;
        let c0 = c0.map(|t| g.input(t.clone())).transpose()?;
        match self {
            Rnn::Lstm(m) => {
                let state = h0.as_ref().zip(c0.as_ref());
                let (out, (h, c)) = m.forward_state(&x, state)?;
                pack(&[&out, &h, &c])
            }
            Rnn::Gru(m) => {
                let (out, h) = m.forward_state(&x, h0.as_ref())?;
                pack(&[&out, &h])
            }
        }
    }
}

impl Parameters for Rnn {
    fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
        match self {
            Rnn::Lstm(m) => m.visit_params(f),
            Rnn::Gru(m) => m.visit_params(f),
        }
    }
}

const FIXTURES: [&str; 4] = ["lstm", "lstm_bf", "gru", "gru_bf"];

fn config_of(name: &str) -> RnnConfig {
    RnnConfig::default()
        .num_layers(2)
        .batch_first(name.ends_with("_bf"))
}

/// The fixture's expected packed values from the given state and from zeros.
fn want(name: &str, e: &std::collections::BTreeMap<String, Tensor<f64>>) -> [Tensor<f64>; 2] {
    let lstm = name.starts_with("lstm");
    let given: Vec<&Tensor<f64>> = if lstm {
        vec![&e["output"], &e["h_n"], &e["c_n"]]
    } else {
        vec![&e["output"], &e["h_n"]]
    };
    let zero: Vec<&Tensor<f64>> = if lstm {
        vec![&e["output_zero"], &e["h_n_zero"], &e["c_n_zero"]]
    } else {
        vec![&e["output_zero"], &e["h_n_zero"]]
    };
    [pack_host(&given), pack_host(&zero)]
}

/// Load fixture `name` with PyTorch's names into `rt` and compare with PyTorch's outputs and
/// final states, from the fixture's initial state and from zeros (also through
/// `Module::forward`).
fn check_fixture<O: Train>(mut rt: Runtime<O>, name: &str, tol: f64) {
    let m = Rnn::new(&rt, name, config_of(name));
    if O::T::NAME == "f32" {
        rt.load(&m, fixture(&format!("{name}.safetensors")))
            .unwrap();
    } else {
        // The file is float32: set the same values in the f64 session.
        let p = fixture(&format!("{name}.safetensors"));
        let f = checkpoint::read(&p).unwrap();
        for (n, param) in rt.named_params_of(&m) {
            let t = f.tensors[&n].to_tensor::<f32>(&p, &n).unwrap();
            rt.set_value(&param, cast(&t)).unwrap();
        }
    }
    let e = expected(name);
    let [given, zero] = want(name, &e);
    let (x, h0, c0) = (cast(&e["input"]), cast(&e["h0"]), e.get("c0").map(cast));
    let got = rt
        .eval(&m, |g| m.run(g, &x, Some(&h0), c0.as_ref()))
        .unwrap();
    let d = max_diff(&got, &given);
    assert!(d < tol, "{name} ({}): from h0: max diff {d}", O::T::NAME);
    let got = rt.eval(&m, |g| m.run(g, &x, None, None)).unwrap();
    let d = max_diff(&got, &zero);
    assert!(d < tol, "{name} ({}): from zeros: max diff {d}", O::T::NAME);
    let out = rt
        .eval(&m, |g| {
            let x = g.input(x.clone())?;
            match &m {
                Rnn::Lstm(l) => l.forward(&x),
                Rnn::Gru(l) => l.forward(&x),
            }
        })
        .unwrap();
    let d = max_diff(&out, &e["output_zero"]);
    assert!(
        d < tol,
        "{name} ({}): Module::forward: max diff {d}",
        O::T::NAME
    );
}

#[test]
fn lstm_and_gru_give_pytorchs_outputs_and_states_on_every_backend() {
    for name in FIXTURES {
        check_fixture(eager::<f64>(Backend::Cpu, 0), name, 1e-12);
        check_fixture(linked::<f64>(0), name, 1e-12);
        check_fixture(eager::<f32>(Backend::Cpu, 0), name, 2e-6);
        check_fixture(eager::<f32>(Backend::CudaSim, 0), name, 2e-6);
        check_fixture(linked::<f32>(0), name, 2e-6);
    }
}

#[test]
fn parameters_have_pytorchs_names_shapes_and_init() {
    let rt = eager::<f64>(Backend::Cpu, 5);
    let v = rt.vars().pp("rnn");
    let lstm = Lstm::new(&v, 3, 16, RnnConfig::default().num_layers(2)).unwrap();
    let named = rt.named_params_of(&lstm);
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "rnn.weight_ih_l0",
            "rnn.weight_hh_l0",
            "rnn.bias_ih_l0",
            "rnn.bias_hh_l0",
            "rnn.weight_ih_l1",
            "rnn.weight_hh_l1",
            "rnn.bias_ih_l1",
            "rnn.bias_hh_l1"
        ]
    );
    let dims: Vec<&[usize]> = named.iter().map(|(_, p)| p.shape().dims()).collect();
    assert_eq!(dims[0], &[64, 3]);
    assert_eq!(dims[1], &[64, 16]);
    assert_eq!(dims[2], &[64]);
    assert_eq!(dims[4], &[64, 16]);
    // PyTorch: every parameter uniform in ±1/√H = ±0.25, spread over the interval.
    let all: Vec<f64> = named
        .iter()
        .flat_map(|(_, p)| rt.value_of(p).unwrap().into_vec())
        .collect();
    let (lo, hi) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(lo >= -0.25 && hi < 0.25, "{lo} {hi}");
    assert!(lo < -0.24 && hi > 0.24, "{lo} {hi}");

    let gru = Gru::new(&rt.vars().pp("gru"), 5, 2, RnnConfig::default().bias(false)).unwrap();
    let names: Vec<String> = rt.named_params_of(&gru).into_iter().map(|x| x.0).collect();
    assert_eq!(names, ["gru.weight_ih_l0", "gru.weight_hh_l0"]);
    assert_eq!(gru.layers()[0].weight_ih.shape().dims(), &[6, 5]);
    assert_eq!((gru.input_size(), gru.hidden_size()), (5, 2));
    assert_eq!(rt.num_params(&gru).unwrap(), 6 * 5 + 6 * 2);
}

/// A scalar loss touching every output: Σ out·r₁ + Σ h_n·r₂ (+ Σ c_n·r₃), with h_0 (and c_0)
/// given.
fn loss<'g, O: Train>(m: &Rnn, g: &Scope<'g, O>, x: &Tensor<O::T>) -> Result<Var<'g, O>> {
    let (t, b, h, l) = (3, 2, 2, 2);
    let h0 = g.input(tensor(&[l, b, h], 11))?;
    let c0 = g.input(tensor(&[l, b, h], 12))?;
    let x = g.input(x.clone())?;
    let (out, states) = match m {
        Rnn::Lstm(m) => {
            let (out, (hn, cn)) = m.forward_state(&x, Some((&h0, &c0)))?;
            (out, vec![hn, cn])
        }
        Rnn::Gru(m) => {
            let (out, hn) = m.forward_state(&x, Some(&h0))?;
            (out, vec![hn])
        }
    };
    let r = g.input(tensor(&[b, t, h], 13))?;
    let mut total = (&out * &r)?.sum()?;
    for (i, s) in states.iter().enumerate() {
        let w = g.input(tensor(&[l, b, h], 14 + i as u64))?;
        total = (&total + &(s * &w)?.sum()?)?;
    }
    Ok(total)
}

fn small(rt: &Runtime<impl Train>, lstm: bool) -> Rnn {
    let cfg = RnnConfig::default().num_layers(2).batch_first(true);
    let v = rt.vars();
    if lstm {
        Rnn::Lstm(Lstm::new(&v, 3, 2, cfg).unwrap())
    } else {
        Rnn::Gru(Gru::new(&v, 3, 2, cfg).unwrap())
    }
}

#[test]
fn gradients_match_the_ir_and_finite_differences() {
    for lstm in [true, false] {
        let rt = linked::<f64>(7);
        let m = small(&rt, lstm);
        let x = tensor::<f64>(&[2, 3, 3], 9);
        let (reference, tape) = rt
            .record(
                &m,
                true,
                |g| loss(&m, g, &x),
                |s, l| {
                    let reference = s.backward_scalar_dense_all(l)?;
                    let tape = s
                        .compile(Backend::Cpu)?
                        .backward_dense(l.id(), &Tensor::scalar(1.0))?;
                    Ok((reference, tape))
                },
            )
            .unwrap();
        for (a, b) in reference.iter().zip(&tape) {
            assert!(max_diff(a, b) < 1e-12);
        }
        // Central differences on every parameter element (the params are the first leaves).
        let h = 1e-6;
        let mut checked = 0;
        for (i, (name, p)) in rt.named_params_of(&m).into_iter().enumerate() {
            let p0 = rt.value_of(&p).unwrap();
            for k in 0..p0.data().len() {
                let at = |delta: f64| {
                    let mut t = p0.clone();
                    t.data_mut()[k] += delta;
                    rt.set_value(&p, t).unwrap();
                    let l = rt.eval(&m, |g| loss(&m, g, &x)).unwrap().item().unwrap();
                    rt.set_value(&p, p0.clone()).unwrap();
                    l
                };
                let numeric = (at(h) - at(-h)) / (2.0 * h);
                let analytic = reference[i].data()[k];
                assert!(
                    (numeric - analytic).abs() < 1e-7 * (1.0 + analytic.abs()),
                    "lstm={lstm} {name}[{k}]: {numeric} vs {analytic}"
                );
                checked += 1;
            }
        }
        assert_eq!(
            checked,
            if lstm {
                8 * 3 + 8 * 2 + 16 + 8 * 2 + 8 * 2 + 16
            } else {
                6 * 3 + 6 * 2 + 12 + 6 * 2 + 6 * 2 + 12
            }
        );
    }
}

/// One SGD step with lr 1 moves each parameter by minus its gradient: eager CPU (f64) and the
/// CUDA simulation (f32) take the linked session's step.
#[test]
fn eager_sessions_take_the_linked_sessions_step() {
    fn step<O: Train>(mut rt: Runtime<O>, lstm: bool) -> Vec<Tensor<f64>> {
        let m = small(&rt, lstm);
        let x = tensor::<O::T>(&[2, 3, 3], 9);
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&m, &mut opt, |g| loss(&m, g, &x)).unwrap();
        rt.state_dict(&m)
            .unwrap()
            .into_iter()
            .map(|(_, t)| cast(&t))
            .collect()
    }
    for lstm in [true, false] {
        let want = step(linked::<f64>(3), lstm);
        let before = {
            let rt = linked::<f64>(3);
            let m = small(&rt, lstm);
            rt.state_dict(&m).unwrap()
        };
        // The step moved every parameter (the loss reaches all of them).
        for ((n, b), w) in before.iter().zip(&want) {
            assert!(max_diff(b, w) > 1e-6, "lstm={lstm}: {n} did not move");
        }
        for (got, tol) in [
            (step(eager::<f64>(Backend::Cpu, 3), lstm), 1e-12),
            (step(eager::<f32>(Backend::CudaSim, 3), lstm), 1e-5),
            (step(eager::<f32>(Backend::Cpu, 3), lstm), 1e-5),
        ] {
            for (a, b) in got.iter().zip(&want) {
                assert!(max_diff(a, b) < tol, "lstm={lstm}: {}", max_diff(a, b));
            }
        }
    }
}

#[test]
fn unbatched_input_is_a_batch_of_one() {
    let rt = eager::<f64>(Backend::Cpu, 2);
    let cfg = RnnConfig::default().num_layers(2);
    let lstm = Lstm::new(&rt.vars().pp("l"), 3, 4, cfg).unwrap();
    let gru = Gru::new(&rt.vars().pp("g"), 3, 4, cfg).unwrap();
    let x = tensor::<f64>(&[5, 3], 1);
    let h0 = tensor::<f64>(&[2, 4], 2);
    let c0 = tensor::<f64>(&[2, 4], 3);
    let models = Pair(&lstm, &gru);
    let run = |batched: bool| {
        rt.eval(&models, |g| {
            let (x, h0, c0) = if batched {
                (
                    g.input(x.reshape([5, 1, 3]).unwrap())?,
                    g.input(h0.reshape([2, 1, 4]).unwrap())?,
                    g.input(c0.reshape([2, 1, 4]).unwrap())?,
                )
            } else {
                (
                    g.input(x.clone())?,
                    g.input(h0.clone())?,
                    g.input(c0.clone())?,
                )
            };
            let (o1, (h1, c1)) = lstm.forward_state(&x, Some((&h0, &c0)))?;
            let (o2, h2) = gru.forward_state(&x, Some(&h0))?;
            if !batched {
                assert_eq!(o1.dims(), &[5, 4]);
                assert_eq!(h1.dims(), &[2, 4]);
                assert_eq!(h2.dims(), &[2, 4]);
            }
            pack(&[&o1, &h1, &c1, &o2, &h2])
        })
        .unwrap()
    };
    assert_eq!(run(true).data(), run(false).data());
}

struct Pair<'a>(&'a Lstm, &'a Gru);

impl Parameters for Pair<'_> {
    fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
        self.0.visit_params(f);
        self.1.visit_params(f);
    }
}

#[test]
fn dropout_between_layers_acts_in_training_passes_only() {
    let rt = eager::<f64>(Backend::Cpu, 4);
    let cfg = RnnConfig::default().num_layers(2).dropout(0.5);
    let m = Lstm::new(&rt.vars(), 3, 8, cfg).unwrap();
    let x = tensor::<f64>(&[4, 2, 3], 1);
    let run = |train: bool| {
        if train {
            rt.forward_train(&m, |g| m.forward(&g.input(x.clone())?))
        } else {
            rt.eval(&m, |g| m.forward(&g.input(x.clone())?))
        }
        .unwrap()
    };
    assert_eq!(run(false).data(), run(false).data());
    assert!(max_diff(&run(true), &run(false)) > 1e-3);
}

#[test]
fn bad_sizes_and_shapes_are_errors_naming_the_layer_and_the_value() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let v = rt.vars().pp("enc");
    let err = |r: Result<Lstm>| r.unwrap_err().to_string();
    let e = err(Lstm::new(&v, 3, 0, RnnConfig::default()));
    assert!(
        e.contains("Lstm::new")
            && e.contains("\"enc\"")
            && e.contains("hidden_size must be ≥ 1, got 0"),
        "{e}"
    );
    let e = err(Lstm::new(&v, 0, 4, RnnConfig::default()));
    assert!(e.contains("input_size must be ≥ 1, got 0"), "{e}");
    let e = err(Lstm::new(&v, 3, 4, RnnConfig::default().num_layers(0)));
    assert!(e.contains("num_layers must be ≥ 1, got 0"), "{e}");
    let e = err(Lstm::new(&v, 3, 4, RnnConfig::default().dropout(1.0)));
    assert!(e.contains("dropout") && e.contains("got 1"), "{e}");
    // A model too large to hold is refused before any parameter is made (not a long loop).
    let e = Gru::new(&v, 3, 4, RnnConfig::default().num_layers(usize::MAX / 2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Gru::new") && (e.contains("too large") || e.contains("usize")),
        "{e}"
    );
    let e = Gru::new(&v, 3, usize::MAX / 2, RnnConfig::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Gru::new") && e.contains("overflow"), "{e}");
    let e = Lstm::new(&v, 3, 1 << 28, RnnConfig::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("LSTM \"enc\"") && e.contains("too large"), "{e}");
    assert!(
        rt.named_params().is_empty(),
        "a refused layer made parameters"
    );

    let m = Lstm::new(&v, 3, 4, RnnConfig::default().num_layers(2)).unwrap();
    let fwd = |x: &[usize], h0: Option<&[usize]>| {
        rt.eval(&m, |g| {
            let x = g.input(Tensor::zeros(x))?;
            let h0 = h0.map(|d| g.input(Tensor::zeros(d))).transpose()?;
            let state = h0.as_ref().map(|h| (h, h));
            Ok(m.forward_state(&x, state)?.0)
        })
        .unwrap_err()
        .to_string()
    };
    let e = fwd(&[5, 2, 7], None);
    assert!(
        e.contains("Lstm::forward")
            && e.contains("\"enc\"")
            && e.contains("3 input features, got 7"),
        "{e}"
    );
    let e = fwd(&[5, 2, 2, 3], None);
    assert!(
        e.contains("(T, B, features)") && e.contains("[5, 2, 2, 3]"),
        "{e}"
    );
    let e = fwd(&[3], None);
    assert!(e.contains("got [3]"), "{e}");
    let e = fwd(&[0, 2, 3], None);
    assert!(e.contains("T = 0"), "{e}");
    let e = fwd(&[5, 2, 3], Some(&[1, 2, 4]));
    assert!(
        e.contains("h_0 must be") && e.contains("[2, 2, 4]") && e.contains("got [1, 2, 4]"),
        "{e}"
    );
    let e = fwd(&[5, 3], Some(&[2, 1, 4]));
    assert!(e.contains("h_0") && e.contains("[2, 4]"), "{e}");
}

/// Each method's errors name the method called: `forward_state`'s say `Lstm::forward_state`
/// (`Gru::forward_state`), `Module::forward`'s say `Lstm::forward` (`Gru::forward`), for a bad
/// input and (`forward_state`) a bad initial state.
#[test]
fn each_method_names_itself_in_its_errors() {
    let rt = eager::<f32>(Backend::Cpu, 0);
    let lstm = Lstm::new(&rt.vars().pp("enc"), 3, 4, RnnConfig::default()).unwrap();
    let gru = Gru::new(&rt.vars().pp("dec"), 3, 4, RnnConfig::default()).unwrap();
    type S = tl_session::Session<f32>;
    let fails = |m: &dyn Parameters, f: &dyn for<'g> Fn(&Scope<'g, S>) -> Result<Var<'g, S>>| {
        rt.eval(m, f).unwrap_err().to_string()
    };
    let bad = [5, 2, 7];
    let prefix = |e: &str| e.split(": ").next().unwrap_or_default().to_owned();
    let e = fails(&lstm, &|g| {
        Ok(lstm.forward_state(&g.input(Tensor::zeros(bad))?, None)?.0)
    });
    assert_eq!(prefix(&e), "Lstm::forward_state", "{e}");
    assert!(e.contains("3 input features, got 7"), "{e}");
    let e = fails(&lstm, &|g| lstm.forward(&g.input(Tensor::zeros(bad))?));
    assert_eq!(prefix(&e), "Lstm::forward", "{e}");
    let e = fails(&lstm, &|g| {
        let x = g.input(Tensor::zeros([5, 2, 3]))?;
        let h = g.input(Tensor::zeros([2, 2, 4]))?;
        Ok(lstm.forward_state(&x, Some((&h, &h)))?.0)
    });
    assert_eq!(prefix(&e), "Lstm::forward_state", "{e}");
    assert!(e.contains("h_0 must be"), "{e}");
    let e = fails(&gru, &|g| {
        Ok(gru.forward_state(&g.input(Tensor::zeros(bad))?, None)?.0)
    });
    assert_eq!(prefix(&e), "Gru::forward_state", "{e}");
    let e = fails(&gru, &|g| gru.forward(&g.input(Tensor::zeros(bad))?));
    assert_eq!(prefix(&e), "Gru::forward", "{e}");
    let e = fails(&gru, &|g| {
        let x = g.input(Tensor::zeros([5, 3]))?;
        let h = g.input(Tensor::zeros([1, 2, 4]))?;
        Ok(gru.forward_state(&x, Some(&h))?.0)
    });
    assert_eq!(prefix(&e), "Gru::forward_state", "{e}");
    assert!(e.contains("h_0 must be") && e.contains("[1, 4]"), "{e}");
}

#[test]
fn a_module_list_names_its_layers_by_position() {
    let rt = eager::<f64>(Backend::Cpu, 1);
    let v = rt.vars().pp("blocks");
    let mut list = ModuleList::from_fn(&v, 2, |v, i| Linear::new(v, 3 + i, 4)).unwrap();
    list.push_with(&v, |v| Linear::new(v, 4, 2)).unwrap();
    list.push(Linear::new(&v.pp(list.len()), 2, 1).unwrap());
    assert_eq!(list.len(), 4);
    assert!(!list.is_empty() && list.get(4).is_none());
    let names: Vec<String> = rt.named_params_of(&list).into_iter().map(|x| x.0).collect();
    assert_eq!(
        names,
        [
            "blocks.0.weight",
            "blocks.0.bias",
            "blocks.1.weight",
            "blocks.1.bias",
            "blocks.2.weight",
            "blocks.2.bias",
            "blocks.3.weight",
            "blocks.3.bias"
        ]
    );
    assert_eq!(list[1].weight.shape().dims(), &[4, 4]);
    let ins: Vec<usize> = list.iter().map(|l| l.weight.shape().dims()[1]).collect();
    assert_eq!(ins, [3, 4, 4, 2]);
    // A layer's own names under the list: the same parameters.
    assert_eq!(rt.named_params_of(&list[2])[0].0, "blocks.2.weight");
    // Used in a forward pass: the layers chained by hand equal a Sequential-like loop.
    let x = tensor::<f64>(&[2, 4], 3);
    let got = rt
        .eval(&list, |g| {
            let mut h = g.input(x.clone())?;
            for l in list.iter().skip(1) {
                h = l.forward(&h)?.tanh()?;
            }
            Ok(h)
        })
        .unwrap();
    assert_eq!(got.shape().dims(), &[2, 1]);
    // Heterogeneous layers behind Box<dyn Module>.
    let mut dyns: ModuleList<Box<dyn Module<tl_session::Session<f64>>>> = ModuleList::new();
    let w = rt.vars().pp("mixed");
    dyns.push_with(&w, |v| {
        Ok(Box::new(Linear::new(v, 2, 2)?) as Box<dyn Module<tl_session::Session<f64>>>)
    })
    .unwrap();
    dyns.push(Box::new(tl_nn::Activation::Relu));
    dyns.push_with(&w, |v| {
        Ok(Box::new(Gru::new(v, 2, 2, RnnConfig::default())?)
            as Box<dyn Module<tl_session::Session<f64>>>)
    })
    .unwrap();
    let names: Vec<String> = rt.named_params_of(&dyns).into_iter().map(|x| x.0).collect();
    assert_eq!(names[0], "mixed.0.weight");
    assert_eq!(names[2], "mixed.2.weight_ih_l0");
}

#[test]
fn embedding_takes_batches_of_id_sequences() {
    let rt = eager::<f64>(Backend::Cpu, 1);
    let emb = Embedding::new(&rt.vars().pp("tok"), 5, 3).unwrap();
    let table = rt.value_of(&emb.weight).unwrap();
    let ids = [[4usize, 0, 2], [1, 1, 3]];
    let got = rt.eval(&emb, |g| emb.forward_batch(g, &ids)).unwrap();
    assert_eq!(got.shape().dims(), &[2, 3, 3]);
    for (b, row) in ids.iter().enumerate() {
        for (i, &id) in row.iter().enumerate() {
            let at = (b * 3 + i) * 3;
            assert_eq!(&got.data()[at..at + 3], &table.data()[id * 3..id * 3 + 3]);
        }
    }
    let flat: Vec<usize> = ids.iter().flatten().copied().collect();
    let shaped = rt
        .eval(&emb, |g| emb.forward_shaped(g, &flat, &[2, 3]))
        .unwrap();
    assert_eq!(shaped.data(), got.data());
    // Gradient: one SGD step adds −(how often each row was picked) to it.
    let mut rt = rt;
    let mut opt = Optimizer::sgd(1.0).unwrap();
    rt.step(&emb, &mut opt, |g| emb.forward_batch(g, &ids)?.sum())
        .unwrap();
    let after = rt.value_of(&emb.weight).unwrap();
    for (id, count) in [(0, 1.0), (1, 2.0), (2, 1.0), (3, 1.0), (4, 1.0)] {
        for k in 0..3 {
            let d = table.data()[id * 3 + k] - after.data()[id * 3 + k];
            assert!((d - count).abs() < 1e-12, "row {id}: moved by {d}");
        }
    }
    let e = rt
        .eval(&emb, |g| emb.forward_batch(g, &[[0, 7], [1, 2]]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("id 7") && e.contains("num_embeddings 5"), "{e}");
    let e = rt
        .eval(&emb, |g| emb.forward_batch(g, &[vec![0, 1], vec![1]]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sequence 1 has 1"), "{e}");
    let e = rt
        .eval(&emb, |g| emb.forward_shaped(g, &[0, 1, 2], &[2, 2]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 2] holds 4 ids, got 3"), "{e}");
}

/// PyTorch's fused `in_proj_weight` / `out_proj.weight` (fixture from real
/// `nn.MultiheadAttention(8, 2, bias=False, batch_first=True)`) load into the layer and give
/// PyTorch's outputs, with and without the causal mask; saved back, they are the same tensors.
#[test]
fn multi_head_attention_loads_and_saves_pytorchs_fused_layout() {
    fn check<O: Train>(rt: Runtime<O>, tol: f64) {
        let mha = MultiHeadAttention::new(&rt.vars().pp("attn"), 8, 2, false).unwrap();
        let causal = MultiHeadAttention {
            causal: true,
            ..mha.clone()
        };
        let p = fixture("mha.safetensors");
        let f = checkpoint::read(&p).unwrap();
        let w = |n: &str| cast::<f32, O::T>(&f.tensors[n].to_tensor::<f32>(&p, n).unwrap());
        let (in_proj, out_proj) = (w("in_proj_weight"), w("out_proj.weight"));
        mha.load_pytorch(&rt, &in_proj, &out_proj).unwrap();
        let e = expected("mha");
        let x: Tensor<O::T> = cast(&e["input"]);
        for (m, key) in [(&mha, "output"), (&causal, "output_causal")] {
            let got = rt.eval(m, |g| m.forward(&g.input(x.clone())?)).unwrap();
            let d = max_diff(&got, &e[key]);
            assert!(d < tol, "{key} ({}): max diff {d}", O::T::NAME);
        }
        let back = mha.pytorch_state(&rt).unwrap();
        assert_eq!(back[0].0, "in_proj_weight");
        assert_eq!(back[1].0, "out_proj.weight");
        assert_eq!(back[0].1.data(), in_proj.data());
        assert_eq!(back[1].1.data(), out_proj.data());
        // A shape that does not fit changes nothing.
        let before = rt.value_of(&mha.wq).unwrap();
        let e = mha
            .load_pytorch(&rt, &out_proj, &out_proj)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in_proj_weight [24, 8]") && e.contains("got [8, 8]"),
            "{e}"
        );
        assert_eq!(rt.value_of(&mha.wq).unwrap().data(), before.data());
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 2e-6);
    check(eager::<f32>(Backend::CudaSim, 0), 2e-6);
    check(linked::<f32>(0), 2e-6);
}

/// The layer (named `prefix`) with PyTorch's weights of the `mha` fixture.
fn mha_from_fixture<O: Train>(rt: &Runtime<O>, prefix: &str, causal: bool) -> MultiHeadAttention {
    let mha = MultiHeadAttention::new(&rt.vars().pp(prefix), 8, 2, causal).unwrap();
    let p = fixture("mha.safetensors");
    let f = checkpoint::read(&p).unwrap();
    let w = |n: &str| cast::<f32, O::T>(&f.tensors[n].to_tensor::<f32>(&p, n).unwrap());
    mha.load_pytorch(rt, &w("in_proj_weight"), &w("out_proj.weight"))
        .unwrap();
    mha
}

/// Queries, memory and the attention's weights, all trained.
struct Cross {
    q: Param,
    m: Param,
    mha: MultiHeadAttention,
}

impl Parameters for Cross {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.q);
        f(&self.m);
        self.mha.visit_params(f);
    }
}

/// The gradients of `loss` with respect to `params` (f64), by one SGD step of lr 1 on `model`:
/// each is the parameter's value before the step minus after.
pub(crate) fn sgd_gradients<O: Train>(
    rt: &mut Runtime<O>,
    model: &impl Parameters,
    params: &[&Param],
    loss: impl for<'g> FnOnce(&Scope<'g, O>) -> Result<Var<'g, O>>,
) -> Vec<Tensor<f64>> {
    let before: Vec<Tensor<O::T>> = params.iter().map(|p| rt.value_of(p).unwrap()).collect();
    let mut opt = Optimizer::sgd(1.0).unwrap();
    rt.step(model, &mut opt, loss).unwrap();
    params
        .iter()
        .zip(&before)
        .map(|(p, b)| {
            let a = rt.value_of(p).unwrap();
            let data = b.data().iter().zip(a.data());
            let data = data.map(|(b, a)| b.as_f64() - a.as_f64()).collect();
            Tensor::new(b.shape().clone(), data).unwrap()
        })
        .collect()
}

/// The gradients of Wq, Wk, Wv, Wo (each (d, d), applied as `x·W`) in PyTorch's fused layout:
/// `in_proj_weight` = [Wqᵀ; Wkᵀ; Wvᵀ] (3d, d) and `out_proj.weight` = Woᵀ.
fn fused_layout(w: &[Tensor<f64>]) -> (Tensor<f64>, Tensor<f64>) {
    let t = |g: &Tensor<f64>| tl_spec::ops::shape::transpose2d(g).unwrap();
    let d = w[0].shape().dims()[0];
    let in_proj = w[..3].iter().flat_map(|g| t(g).data().to_vec()).collect();
    (Tensor::new([3 * d, d], in_proj).unwrap(), t(&w[3]))
}

/// Cross-attention, queries (2, 3, 8) over a memory (2, 5, 8) with PyTorch's weights
/// (`nn.MultiheadAttention(8, 2, bias=False, batch_first=True)`, fixture `mha_cross` from
/// make_rnn_fixtures.py): the output and the gradients of Σ w·out with respect to the queries,
/// the memory and both weights (in PyTorch's fused layout) are PyTorch's, without a mask and
/// with batch element 1's last two keys masked (as `key_keep`, and as an attention mask of
/// one matrix per batch element through `forward_qkv_masked`), on the eager CPU (f64, f32),
/// CUDA-sim and linked sessions.
#[test]
fn cross_attention_gives_pytorchs_values_and_gradients() {
    fn attend<'g, O: Train>(
        model: &Cross,
        g: &Scope<'g, O>,
        (keep, mask): (Option<&[bool]>, Option<&Mask>),
    ) -> Result<Var<'g, O>> {
        let (q, m) = (g.param(&model.q)?, g.param(&model.m)?);
        match mask {
            Some(mask) => model.mha.forward_qkv_masked(&q, &m, &m, mask),
            None => model.mha.forward_qkv(&q, &m, &m, keep),
        }
    }
    fn check<O: Train>(mut rt: Runtime<O>, tol: f64) {
        let e = expected("mha_cross");
        let mha = mha_from_fixture(&rt, "attn", false);
        let start: Vec<Tensor<O::T>> = [&mha.wq, &mha.wk, &mha.wv, &mha.wo]
            .map(|p| rt.value_of(p).unwrap())
            .to_vec();
        let q = rt.vars().param_from("q", cast(&e["query"]), true).unwrap();
        let m = rt.vars().param_from("m", cast(&e["memory"]), true).unwrap();
        let model = Cross { q, m, mha };
        let w: Tensor<O::T> = cast(&e["weight"]);
        let padded: Vec<bool> = (0..10).map(|k| k < 8).collect();
        let padded_mask = Mask::from_fn_batched(2, 3, 5, |b, _, j| b == 0 || j < 3).unwrap();
        for (suffix, keep) in [
            ("", (None, None)),
            ("_padded", (Some(&padded[..]), None)),
            ("_padded", (None, Some(&padded_mask))),
        ] {
            let at = |k: &str| format!("{k}{suffix} ({})", O::T::NAME);
            rt.set_value(&model.q, cast(&e["query"])).unwrap();
            rt.set_value(&model.m, cast(&e["memory"])).unwrap();
            let ws = [&model.mha.wq, &model.mha.wk, &model.mha.wv, &model.mha.wo];
            for (p, v) in ws.iter().zip(&start) {
                rt.set_value(p, v.clone()).unwrap();
            }
            let out = rt.eval(&model, |g| attend(&model, g, keep)).unwrap();
            let d = max_diff(&out, &e[&format!("output{suffix}")]);
            assert!(d < tol, "{}: max diff {d}", at("output"));
            let params = [&model.q, &model.m, ws[0], ws[1], ws[2], ws[3]];
            let grads = sgd_gradients(&mut rt, &model, &params, |g| {
                (&attend(&model, g, keep)? * &g.input(w.clone())?)?.sum()
            });
            let close = |got: &Tensor<f64>, key: &str| {
                let d = max_diff(got, &e[&format!("{key}{suffix}")]);
                assert!(d < tol, "{}: max diff {d}", at(key));
            };
            close(&grads[0], "grad_query");
            close(&grads[1], "grad_memory");
            let (in_proj, out_proj) = fused_layout(&grads[2..]);
            close(&in_proj, "grad_in_proj");
            close(&out_proj, "grad_out_proj");
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 1e-5);
    check(eager::<f32>(Backend::CudaSim, 0), 1e-5);
    check(linked::<f64>(0), 1e-12);
}

/// A chunk of the last m positions over the whole sequence under
/// `Mask::causal_lower_right(m, n)` (`forward_qkv_masked`) gives the causal layer's outputs at
/// those positions, plain and grouped, fused and composed, on the eager CPU (f64) and the CUDA
/// sim (f32); `causal_upper_left` gives others; a mask of other sizes or batch, or one that
/// leaves a query no key, is an error naming the layer.
#[test]
fn a_chunk_over_its_prefix_attends_as_the_causal_layer() {
    fn check<O: Train>(mut rt: Runtime<O>, tol: f64) {
        let (b, n, m, d) = (2, 9, 4, 16);
        let x = tensor::<O::T>(&[b, n, d], 43);
        let chunk = Tensor::from_fn([b, m, d], |e| {
            let (bi, rest) = (e / (m * d), e % (m * d));
            x.data()[bi * n * d + (n - m) * d + rest]
        });
        for (name, kv) in [("plain", 4), ("grouped", 2)] {
            let mha = MultiHeadAttention::grouped(&rt.vars().pp(name), d, 4, kv, true).unwrap();
            for flash in [true, false] {
                let mha = mha.clone().with_flash(flash);
                let whole = rt
                    .eval(&mha, |g| mha.forward(&g.input(x.clone())?))
                    .unwrap();
                let attend = |rt: &mut Runtime<O>, mask: &Mask| {
                    rt.eval(&mha, |g| {
                        let (q, all) = (g.input(chunk.clone())?, g.input(x.clone())?);
                        mha.forward_qkv_masked(&q, &all, &all, mask)
                    })
                };
                let got = attend(&mut rt, &Mask::causal_lower_right(m, n).unwrap()).unwrap();
                let want = Tensor::from_fn([b, m, d], |e| {
                    let (bi, rest) = (e / (m * d), e % (m * d));
                    whole.data()[bi * n * d + (n - m) * d + rest]
                });
                let diff = max_diff(&got, &want);
                assert!(diff < tol, "{name} flash={flash}: {diff}");
                let upper = attend(&mut rt, &Mask::causal_upper_left(m, n).unwrap()).unwrap();
                assert!(
                    max_diff(&upper, &want) > 1e-3,
                    "{name}: upper-left is another rule"
                );
                let bad = [
                    (
                        Mask::causal_lower_right(m, n - 1).unwrap(),
                        "(nq, nk) = (4, 9)",
                    ),
                    (
                        Mask::from_fn_batched(3, m, n, |_, _, _| true).unwrap(),
                        "3 matrix(es) of 4×9",
                    ),
                    (
                        Mask::from_fn_rectangular(m, n, |i, _| i != 2).unwrap(),
                        "query 2 of batch element 0 has no key",
                    ),
                ];
                for (mask, says) in bad {
                    let e = attend(&mut rt, &mask).unwrap_err().to_string();
                    assert!(e.contains("MultiHeadAttention") && e.contains(says), "{e}");
                }
            }
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::CudaSim, 0), 1e-5);
}

/// With the queries, keys and values one input, `forward_qkv` is the layer's forward (the
/// catalogue's attention op) within rounding, values and the gradients of the input and every
/// weight, with and without the causal mask; its bad inputs are errors naming the layer.
#[test]
fn cross_attention_of_one_input_is_self_attention() {
    let mut rt = eager::<f64>(Backend::Cpu, 0);
    let x = tensor::<f64>(&[2, 5, 8], 41);
    for causal in [false, true] {
        let mha = mha_from_fixture(&rt, &format!("attn{causal}"), causal);
        let p = rt
            .vars()
            .param_from(&format!("x{causal}"), x.clone(), true)
            .unwrap();
        let model = Cross {
            q: p.clone(),
            m: p.clone(),
            mha: mha.clone(),
        };
        let fused = rt.eval(&model, |g| mha.forward(&g.param(&p)?)).unwrap();
        let composed = rt
            .eval(&model, |g| {
                let x = g.param(&p)?;
                mha.forward_qkv(&x, &x, &x, None)
            })
            .unwrap();
        assert!(max_diff(&fused, &composed) < 1e-12, "causal {causal}");
        // One key masked for every query but the first: the same as a key-padding mask.
        let keep: Vec<bool> = (0..5).map(|j| j != 3).collect();
        let padded = rt
            .eval(&model, |g| {
                let x = g.param(&p)?;
                mha.forward_qkv(&x, &x, &x, Some(&keep))
            })
            .unwrap();
        let mask = tl_spec::ops::attention::Mask::from_fn(5, |i, j| keep[j] && (!causal || j <= i))
            .unwrap();
        let want = rt
            .eval(&model, |g| {
                mha.forward_masked(&g.param(&p)?, Some(mask.clone()))
            })
            .unwrap();
        assert!(max_diff(&want, &padded) < 1e-12, "causal {causal}, padded");
        // The gradients of x and of the four weights, each path from the same values.
        let params = [&p, &mha.wq, &mha.wk, &mha.wv, &mha.wo];
        let start: Vec<Tensor<f64>> = params.iter().map(|q| rt.value_of(q).unwrap()).collect();
        let mut grads = |composed: bool| {
            let grads = sgd_gradients(&mut rt, &model, &params, |g| {
                let x = g.param(&p)?;
                let y = if composed {
                    mha.forward_qkv(&x, &x, &x, None)?
                } else {
                    mha.forward(&x)?
                };
                (&y * &y)?.sum()
            });
            for (q, v) in params.iter().zip(&start) {
                rt.set_value(q, v.clone()).unwrap();
            }
            grads
        };
        let (fused, composed) = (grads(false), grads(true));
        for (k, (a, b)) in fused.iter().zip(&composed).enumerate() {
            let d = max_diff(a, b);
            assert!(d < 1e-10, "causal {causal}: gradient {k} differs by {d}");
        }
    }
    // Bad inputs name the layer and what it needs.
    let mha = mha_from_fixture(&rt, "attn", false);
    let causal = mha_from_fixture(&rt, "causal", true);
    let err = |m: &MultiHeadAttention, q: &[usize], kv: &[usize], keep: Option<&[bool]>| {
        rt.eval(m, |g| {
            let q = g.input(Tensor::zeros(q))?;
            let kv = g.input(Tensor::zeros(kv))?;
            m.forward_qkv(&q, &kv, &kv, keep)
        })
        .unwrap_err()
        .to_string()
    };
    let e = err(&mha, &[2, 3, 8], &[3, 5, 8], None);
    assert!(
        e.contains("MultiHeadAttention \"attn\"") && e.contains("key [3, 5, 8]"),
        "{e}"
    );
    let e = err(&mha, &[3, 8], &[5, 6], None);
    assert!(e.contains("(nk, 8)"), "{e}");
    let e = err(&mha, &[3, 8], &[5, 8], Some(&[true; 4]));
    assert!(e.contains("key_keep has 4") && e.contains("need 5"), "{e}");
    let e = err(&mha, &[3, 8], &[5, 8], Some(&[false; 5]));
    assert!(e.contains("query 0 of batch element 0 has no key"), "{e}");
    let e = err(&causal, &[3, 8], &[5, 8], None);
    assert!(
        e.contains("causal") && e.contains("3 queries over 5 keys"),
        "{e}"
    );
}

/// `mha`'s self-attention of the fixture's `input` (a trained parameter): its output checked
/// against `output_{name}` within `tol`, then the gradients of Σ weight·out with respect to x,
/// wq, wk, wv and wo (one SGD step of lr 1).
fn self_attention_on_fixture<O: Train>(
    rt: &mut Runtime<O>,
    mha: &MultiHeadAttention,
    e: &std::collections::BTreeMap<String, Tensor<f64>>,
    name: &str,
    tol: f64,
) -> Vec<Tensor<f64>> {
    let w: Tensor<O::T> = cast(&e["weight"]);
    let x = rt
        .vars()
        .param_from(&format!("x_{name}"), cast(&e["input"]), true)
        .unwrap();
    let model = Cross {
        q: x.clone(),
        m: x.clone(),
        mha: mha.clone(),
    };
    let out = rt.eval(&model, |g| mha.forward(&g.param(&x)?)).unwrap();
    let d = max_diff(&out, &e[&format!("output_{name}")]);
    assert!(d < tol, "output_{name} ({}): max diff {d}", O::T::NAME);
    let params = [&x, &mha.wq, &mha.wk, &mha.wv, &mha.wo];
    sgd_gradients(rt, &model, &params, |g| {
        (&mha.forward(&g.param(&x)?)? * &g.input(w.clone())?)?.sum()
    })
}

/// Grouped-query attention (`MultiHeadAttention::grouped`: 4 query heads over 2 key/value
/// heads, width 16) against PyTorch's `F.scaled_dot_product_attention(..., enable_gqa=True)` on
/// the projections (fixture `mha_gqa`): outputs and the gradients of x and every weight, causal
/// and with rotary embeddings, on the eager CPU (f64, f32), CUDA-sim and linked sessions; one
/// key/value head per query head is the plain layer; bad head counts and PyTorch's fused
/// layout are errors naming the layer, and the layer prints its key/value heads.
#[test]
fn grouped_query_attention_gives_pytorchs_values_and_gradients() {
    fn check<O: Train>(mut rt: Runtime<O>, tol: f64) {
        let e = expected("mha_gqa");
        for (name, causal, rope) in [("causal", true, None), ("rope", false, Some(Rope::DEFAULT))] {
            let mut mha =
                MultiHeadAttention::grouped(&rt.vars().pp(name), 16, 4, 2, causal).unwrap();
            if let Some(r) = rope {
                mha = mha.with_rope(r).unwrap();
            }
            for (p, k) in [
                (&mha.wq, "wq"),
                (&mha.wk, "wk"),
                (&mha.wv, "wv"),
                (&mha.wo, "wo"),
            ] {
                rt.set_value(p, cast(&e[k])).unwrap();
            }
            let grads = self_attention_on_fixture(&mut rt, &mha, &e, name, tol);
            let at = |k: &str| format!("{k}_{name} ({})", O::T::NAME);
            for (got, key) in grads.iter().zip(["input", "wq", "wk", "wv", "wo"]) {
                let d = max_diff(got, &e[&format!("grad_{key}_{name}")]);
                assert!(d < tol, "{}: max diff {d}", at(&format!("grad_{key}")));
            }
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 1e-5);
    check(eager::<f32>(Backend::CudaSim, 0), 1e-5);
    check(linked::<f64>(0), 1e-12);
    // As many key/value heads as query heads: the plain layer, value and gradients.
    let x = tensor::<f64>(&[2, 6, 8], 7);
    let run = |grouped: bool| {
        let mut rt = eager::<f64>(Backend::Cpu, 9);
        let v = rt.vars().pp("a");
        let mha = match grouped {
            true => MultiHeadAttention::grouped(&v, 8, 2, 2, true).unwrap(),
            false => MultiHeadAttention::new(&v, 8, 2, true).unwrap(),
        };
        let y = rt
            .eval(&mha, |g| mha.forward(&g.input(x.clone())?))
            .unwrap();
        let params = [&mha.wq, &mha.wk, &mha.wv, &mha.wo];
        let grads = sgd_gradients(&mut rt, &mha, &params, |g| {
            mha.forward(&g.input(x.clone())?)?.tanh()?.sum()
        });
        (y, grads)
    };
    let ((yg, gg), (yp, gp)) = (run(true), run(false));
    assert!(max_diff(&yg, &yp) < 1e-12, "{}", max_diff(&yg, &yp));
    for (a, b) in gg.iter().zip(&gp) {
        assert!(max_diff(a, b) < 1e-12, "{}", max_diff(a, b));
    }
    let rt = eager::<f64>(Backend::Cpu, 0);
    for (heads, kv) in [(4, 3), (4, 0), (4, 8)] {
        let e = MultiHeadAttention::grouped(&rt.vars().pp("bad"), 16, heads, kv, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("grouped") && e.contains(&format!("kv_heads {kv}")),
            "{e}"
        );
    }
    let mha = MultiHeadAttention::grouped(&rt.vars().pp("g"), 16, 4, 2, true).unwrap();
    assert_eq!(mha.wk.shape().dims(), &[16, 8]);
    let e = mha.pytorch_state(&rt).unwrap_err().to_string();
    assert!(
        e.contains("pytorch_state") && e.contains("grouped-query"),
        "{e}"
    );
    assert_eq!(
        tl_nn::tree(&mha).to_string(),
        "MultiHeadAttention(embed_dim=16, num_heads=4, num_kv_heads=2, bias=False, causal=True)"
    );
}

/// A causal layer fed a sequence in chunks through a `KvCache` (3, 1, 2 and 1 positions) gives
/// the outputs of `forward` on the whole sequence: plain, rotary and grouped-rotary layers,
/// batched and not, on the eager CPU (f64, f32), CUDA-sim and linked sessions; the cache counts
/// its positions, `clear` starts over; a layer that is not causal, the wrong width and a cache
/// of another batch size are errors naming the layer.
#[test]
fn cached_chunks_give_the_whole_sequence() {
    fn check<O: Train>(rt: Runtime<O>, tol: f64) {
        let layers = [
            (
                "plain",
                MultiHeadAttention::new(&rt.vars().pp("p"), 8, 2, true).unwrap(),
            ),
            (
                "rotary",
                MultiHeadAttention::new(&rt.vars().pp("r"), 8, 2, true)
                    .unwrap()
                    .with_rope(Rope::DEFAULT)
                    .unwrap(),
            ),
            (
                "grouped",
                MultiHeadAttention::grouped(&rt.vars().pp("g"), 16, 4, 2, true)
                    .unwrap()
                    .with_rope(Rope {
                        base: 500.0,
                        layout: RopeLayout::Halves,
                    })
                    .unwrap(),
            ),
        ];
        for (name, mha) in &layers {
            let d = mha.wq.shape().dims()[0];
            for dims in [vec![7, d], vec![2, 7, d]] {
                let x: Tensor<O::T> = tensor(&dims, 3);
                let whole = rt.eval(mha, |g| mha.forward(&g.input(x.clone())?)).unwrap();
                let mut cache = tl_nn::KvCache::new();
                let mut parts = Vec::new();
                let mut at = 0;
                for len in [3, 1, 2, 1] {
                    assert_eq!(cache.len(), at);
                    let chunk = narrow_positions(&x, at, len);
                    let y = rt
                        .eval(mha, |g| {
                            mha.forward_cached(&g.input(chunk.clone())?, &mut cache)
                        })
                        .unwrap();
                    parts.push(y);
                    at += len;
                }
                assert_eq!(cache.len(), 7);
                let joined = join_positions(&parts);
                let diff = max_diff(&joined, &cast::<O::T, f64>(&whole));
                assert!(diff < tol, "{name} {dims:?} ({}): {diff}", O::T::NAME);
                cache.clear();
                assert!(cache.is_empty());
            }
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 1e-5);
    check(eager::<f32>(Backend::CudaSim, 0), 1e-5);
    check(linked::<f64>(0), 1e-12);
    let rt = eager::<f64>(Backend::Cpu, 0);
    let causal = MultiHeadAttention::new(&rt.vars().pp("c"), 8, 2, true).unwrap();
    let open = MultiHeadAttention::new(&rt.vars().pp("o"), 8, 2, false).unwrap();
    let mut cache = tl_nn::KvCache::new();
    let run = |m: &MultiHeadAttention, x: Tensor<f64>, cache: &mut tl_nn::KvCache<f64>| {
        rt.eval(m, |g| m.forward_cached(&g.input(x)?, cache))
            .unwrap_err()
            .to_string()
    };
    let e = run(&open, tensor(&[2, 8], 1), &mut cache);
    assert!(
        e.contains("MultiHeadAttention") && e.contains("causal"),
        "{e}"
    );
    let e = run(&causal, tensor(&[2, 6], 1), &mut cache);
    assert!(
        e.contains("forward_cached: input [2, 6] must be (n, 8) or (B, n, 8)"),
        "{e}"
    );
    rt.eval(&causal, |g| {
        causal.forward_cached(&g.input(tensor(&[2, 2, 8], 1))?, &mut cache)
    })
    .unwrap();
    let e = run(&causal, tensor(&[3, 1, 8], 1), &mut cache);
    assert!(e.contains("the cache holds keys [2, 2, 2, 4]"), "{e}");
}

/// A `KvCache` takes chunks of one layout: after a batched (B, m, d) chunk an unbatched (m, d)
/// one is an error saying what the cache holds and what was given (also for B = 1, whose keys
/// have the same shape), and the reverse; the refused chunk leaves the cache as it was, and a
/// cleared cache takes either layout.
#[test]
fn a_kv_cache_refuses_to_mix_batched_and_unbatched_chunks() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let mha = MultiHeadAttention::new(&rt.vars().pp("c"), 8, 2, true).unwrap();
    let mut cache = tl_nn::KvCache::new();
    let run = |x: Tensor<f64>, cache: &mut tl_nn::KvCache<f64>| {
        rt.eval(&mha, |g| mha.forward_cached(&g.input(x)?, cache))
    };
    run(tensor(&[1, 2, 8], 1), &mut cache).unwrap();
    let e = run(tensor(&[3, 8], 2), &mut cache).unwrap_err().to_string();
    assert_eq!(
        e,
        r#"MultiHeadAttention "c": forward_cached: the cache holds 2 position(s) of batched (B, n, 8) chunks (keys [1, 2, 2, 4]), this input [3, 8] is unbatched (n, 8): one cache takes chunks of one layout (clear it, or use a cache per layout)"#
    );
    assert_eq!(cache.len(), 2, "a refused chunk changed the cache");
    run(tensor(&[1, 1, 8], 3), &mut cache).unwrap();
    assert_eq!(cache.len(), 3);
    cache.clear();
    run(tensor(&[2, 8], 4), &mut cache).unwrap();
    for dims in [[1, 1, 8], [2, 1, 8]] {
        let e = run(tensor(&dims, 5), &mut cache).unwrap_err().to_string();
        assert!(
            e.contains("the cache holds 2 position(s) of unbatched (n, 8) chunks")
                && e.contains(&format!("this input {dims:?} is batched (B, n, 8)")),
            "{e}"
        );
    }
    assert_eq!(cache.len(), 2, "a refused chunk changed the cache");
    run(tensor(&[1, 8], 6), &mut cache).unwrap();
    assert_eq!(cache.len(), 3);
}

/// Positions `at..at + len` (the second-to-last axis) of `x`.
pub(crate) fn narrow_positions<T: Scalar>(x: &Tensor<T>, at: usize, len: usize) -> Tensor<T> {
    let dims = x.shape().dims();
    let (n, w) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let batches = x.numel() / (n * w);
    let data = (0..batches)
        .flat_map(|b| x.data()[(b * n + at) * w..(b * n + at + len) * w].to_vec())
        .collect();
    let mut out = dims.to_vec();
    out[dims.len() - 2] = len;
    Tensor::new(out.as_slice(), data).unwrap()
}

/// `parts` joined along their positions (the second-to-last axis), as f64.
pub(crate) fn join_positions<T: Scalar>(parts: &[Tensor<T>]) -> Tensor<f64> {
    let dims = parts[0].shape().dims();
    let w = dims[dims.len() - 1];
    let batches = parts[0].numel() / (dims[dims.len() - 2] * w);
    let mut data = Vec::new();
    for b in 0..batches {
        for p in parts {
            let n = p.shape().dims()[dims.len() - 2];
            data.extend(
                p.data()[b * n * w..(b + 1) * n * w]
                    .iter()
                    .map(|v| v.as_f64()),
            );
        }
    }
    let mut out = dims.to_vec();
    out[dims.len() - 2] = parts.iter().map(|p| p.shape().dims()[dims.len() - 2]).sum();
    Tensor::new(out.as_slice(), data).unwrap()
}

/// `forward` (on the CUDA sim) of the layer `make` builds, fused and then composed
/// (`with_flash(false)`): the output, the session's peak device bytes over it and one SGD step
/// of `tanh(forward).sum()`, and the parameters after that step.
fn fused_and_composed_on_the_sim(
    make: impl Fn(&Runtime<tl_session::Session<f32>>) -> MultiHeadAttention,
    forward: impl for<'g> Fn(
        &MultiHeadAttention,
        &Scope<'g, tl_session::Session<f32>>,
    ) -> Result<Var<'g, tl_session::Session<f32>>>,
) -> [(Tensor<f32>, usize, Vec<Tensor<f32>>); 2] {
    fused_and_composed_on_the_sim_at(tl_session::Precision::F32, make, forward)
}

/// [`fused_and_composed_on_the_sim`] in a session at `precision` (autocast).
fn fused_and_composed_on_the_sim_at(
    precision: tl_session::Precision,
    make: impl Fn(&Runtime<tl_session::Session<f32>>) -> MultiHeadAttention,
    forward: impl for<'g> Fn(
        &MultiHeadAttention,
        &Scope<'g, tl_session::Session<f32>>,
    ) -> Result<Var<'g, tl_session::Session<f32>>>,
) -> [(Tensor<f32>, usize, Vec<Tensor<f32>>); 2] {
    [true, false].map(|flash| {
        let opts = tl_session::Options {
            backend: Backend::CudaSim,
            seed: 3,
            precision,
            ..tl_session::Options::default()
        };
        let mut rt = Runtime::new(tl_session::Session::new(opts).unwrap());
        let mha = make(&rt);
        assert!(mha.flash, "fused by default");
        let mha = mha.with_flash(flash);
        let y = rt.eval(&mha, |g| forward(&mha, g)).unwrap();
        let mut opt = Optimizer::sgd(1.0).unwrap();
        rt.step(&mha, &mut opt, |g| forward(&mha, g)?.tanh()?.sum())
            .unwrap();
        let peak = rt
            .session()
            .memory_usage()
            .expect("a CUDA backend")
            .peak_bytes;
        let params: Vec<Tensor<f32>> = [&mha.wq, &mha.wk, &mha.wv, &mha.wo]
            .iter()
            .map(|p| rt.value_of(p).unwrap())
            .collect();
        (y, peak, params)
    })
}

/// The fused run of [`fused_and_composed_on_the_sim`] holds less than one head's scores of
/// `head_scores` bytes at its peak, the composed one at least both heads' more; outputs and
/// parameters after the step agree within f32 rounding.
fn assert_fused_keeps_no_scores(
    runs: [(Tensor<f32>, usize, Vec<Tensor<f32>>); 2],
    head_scores: usize,
) {
    let [(yf, fused_peak, pf), (yc, composed_peak, pc)] = runs;
    assert!(max_diff(&yf, &yc) < 1e-5, "{}", max_diff(&yf, &yc));
    for (a, b) in pf.iter().zip(&pc) {
        assert!(max_diff(a, b) < 1e-4, "{}", max_diff(a, b));
    }
    assert_no_scores_held(fused_peak, composed_peak, head_scores);
}

/// The fused peak below one head's scores of `head_scores` bytes, the composed one at least
/// both heads' above it.
fn assert_no_scores_held(fused_peak: usize, composed_peak: usize, head_scores: usize) {
    assert!(
        fused_peak < head_scores,
        "fused peak {fused_peak} bytes ≥ one head's scores {head_scores}"
    );
    assert!(
        composed_peak >= fused_peak + 2 * head_scores,
        "composed peak {composed_peak}, fused {fused_peak}"
    );
}

/// Rotary attention runs its core as the op `scaledDotProductAttention`, fused by default: on
/// the CUDA sim (the flash kernels' twins) a causal layer of 2 heads over n = 512 positions
/// never holds one head's (n, n) probabilities (1 MiB), where the composed core
/// (`with_flash(false)`) keeps both heads' (2 MiB) from the forward to the backward; the
/// output and one SGD step's parameters agree within f32 rounding.
#[test]
fn rotary_attention_keeps_no_scores_when_fused() {
    let n = 512;
    let x = tensor::<f32>(&[1, n, 16], 5);
    let runs = fused_and_composed_on_the_sim(
        |rt| {
            MultiHeadAttention::new(&rt.vars().pp("a"), 16, 2, true)
                .unwrap()
                .with_rope(Rope::DEFAULT)
                .unwrap()
        },
        |mha, g| mha.forward(&g.input(x.clone())?),
    );
    assert_fused_keeps_no_scores(runs, n * n * 4);
}

/// Under bf16 autocast the fused layer keeps flash attention's memory: on the CUDA sim a causal
/// layer of 2 heads over n = 512 positions (the session at `Precision::Bf16`: its core runs
/// the flash kernels' twins on rounded operands, probabilities and dS) never holds one head's
/// (n, n) probabilities over a forward and an SGD step, where the composed core holds both
/// heads'; the two agree within the rounding of the probabilities (2⁻⁸ relative: one bf16
/// unit on a term where their f32 probabilities round to neighbours), and differ from f32.
#[test]
fn attention_under_bf16_keeps_no_scores_when_fused() {
    let n = 512;
    let x = tensor::<f32>(&[1, n, 16], 5);
    let run = |p| {
        fused_and_composed_on_the_sim_at(
            p,
            |rt| MultiHeadAttention::new(&rt.vars().pp("a"), 16, 2, true).unwrap(),
            |mha, g| mha.forward(&g.input(x.clone())?),
        )
    };
    let [(yf, fused_peak, pf), (yc, composed_peak, pc)] = run(tl_session::Precision::Bf16);
    let scale = |t: &Tensor<f32>| f64::from(t.data().iter().fold(1.0f32, |m, v| m.max(v.abs())));
    assert!(
        max_diff(&yf, &yc) < scale(&yc) / 256.0,
        "{}",
        max_diff(&yf, &yc)
    );
    for (a, b) in pf.iter().zip(&pc) {
        assert!(max_diff(a, b) < scale(b) / 256.0, "{}", max_diff(a, b));
    }
    assert_no_scores_held(fused_peak, composed_peak, n * n * 4);
    let [(y32, ..), _] = run(tl_session::Precision::F32);
    assert!(max_diff(&yf, &y32) > 0.0, "bf16 ran as f32");
}

/// Three Adam steps of a causal grouped layer (4 query heads over 2) on `x`, on the CUDA
/// sim at `precision`: the eval output before them, the losses, and the projections after.
fn attention_steps<O: Train<T = f32>>(
    mut rt: Runtime<O>,
    x: &Tensor<f32>,
) -> (Tensor<f32>, Vec<f64>, Vec<Tensor<f32>>) {
    let mha = MultiHeadAttention::grouped(&rt.vars().pp("a"), 16, 4, 2, true).unwrap();
    let y = rt
        .eval(&mha, |g| mha.forward(&g.input(x.clone())?))
        .unwrap();
    let mut opt = Optimizer::adam(0.01).unwrap();
    let losses = (0..3)
        .map(|_| {
            rt.step(&mha, &mut opt, |g| {
                mha.forward(&g.input(x.clone())?)?.tanh()?.sum()
            })
            .unwrap()
        })
        .collect();
    let params = [&mha.wq, &mha.wk, &mha.wv, &mha.wo]
        .iter()
        .map(|p| rt.value_of(p).unwrap())
        .collect();
    (y, losses, params)
}

/// A linked session runs the fused attention under bf16 as the eager session does (its
/// compiled tape keeps the node's six buffers, Ō among them, for the backward): on the CUDA
/// sim the same eval output, losses and parameters bit for bit over three Adam steps; f32
/// gives other values.
#[test]
fn a_linked_session_runs_attention_under_bf16_as_the_eager_one() {
    use tl_session::Precision;
    let x = tensor::<f32>(&[2, 24, 16], 9);
    let eager_at = |precision| {
        let opts = tl_session::Options {
            backend: Backend::CudaSim,
            seed: 3,
            precision,
            ..tl_session::Options::default()
        };
        attention_steps(Runtime::new(tl_session::Session::new(opts).unwrap()), &x)
    };
    let mut rt = crate::linked_on(Backend::CudaSim, 3);
    rt.session_mut().set_precision(Precision::Bf16).unwrap();
    let linked = attention_steps(rt, &x);
    let eager = eager_at(Precision::Bf16);
    let bits = |t: &Tensor<f32>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&linked.0), bits(&eager.0), "eval output");
    assert_eq!(linked.1, eager.1, "losses");
    for (a, b) in linked.2.iter().zip(&eager.2) {
        assert_eq!(bits(a), bits(b), "parameters");
    }
    let f32s = eager_at(Precision::F32);
    assert_ne!(bits(&f32s.0), bits(&eager.0), "bf16 ran as f32");
}

/// Cross-attention over keys of another length runs the same op: 256 queries over a memory
/// of 512 with keys 500.. padded out, 2 heads, on the CUDA sim: the fused core never holds
/// one head's (256, 512) probabilities (512 KiB), the composed one keeps both heads'.
#[test]
fn cross_attention_keeps_no_scores_when_fused() {
    let (nq, nk) = (256, 512);
    let (query, memory) = (
        tensor::<f32>(&[1, nq, 16], 6),
        tensor::<f32>(&[1, nk, 16], 7),
    );
    let keep: Vec<bool> = (0..nk).map(|j| j < 500).collect();
    let runs = fused_and_composed_on_the_sim(
        |rt| MultiHeadAttention::new(&rt.vars().pp("a"), 16, 2, false).unwrap(),
        |mha, g| {
            let (q, m) = (g.input(query.clone())?, g.input(memory.clone())?);
            mha.forward_qkv(&q, &m, &m, Some(&keep))
        },
    );
    assert_fused_keeps_no_scores(runs, nq * nk * 4);
}

/// Grouped-query attention hands the op its key and value heads as they are: on the CUDA sim
/// a causal layer of 8 query heads over one key head (multi-query; d = 64, n = 512) peaks, over
/// a forward and an SGD step, at least four (n, d − d/8) f32 buffers below the plain layer of 8
/// key heads: its K and V and their cotangents are an eighth as wide (1.00 against 1.59 MB;
/// with K and V copied to every query head before the core, `broadcastTo`, the layer peaks at
/// 1.30, 2.5 such buffers below). Fused and composed, each layer's outputs and stepped parameters agree
/// within f32 rounding.
#[test]
fn grouped_attention_copies_no_key_per_query_head() {
    let (n, d) = (512, 64);
    let x = tensor::<f32>(&[1, n, d], 8);
    let peak = |kv_heads: usize| {
        let [fused, composed] = fused_and_composed_on_the_sim(
            |rt| MultiHeadAttention::grouped(&rt.vars().pp("a"), d, 8, kv_heads, true).unwrap(),
            |mha, g| mha.forward(&g.input(x.clone())?),
        );
        assert!(max_diff(&fused.0, &composed.0) < 1e-5);
        // The step moves wv to about 100 here (a sum over 512 positions and 8 heads).
        for (a, b) in fused.2.iter().zip(&composed.2) {
            let scale = b.data().iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert!(
                max_diff(a, b) < 1e-5 * f64::from(scale),
                "{}",
                max_diff(a, b)
            );
        }
        fused.1
    };
    let (grouped, plain) = (peak(1), peak(8));
    let narrower = n * (d - d / 8) * 4;
    assert!(
        grouped + 4 * narrower <= plain,
        "grouped peak {grouped} bytes, plain {plain}: less than 4·{narrower} apart"
    );
}

/// Rotary position embeddings (`with_rope`) on the `mha` fixture's self-attention of x (2, 5,
/// 8): PyTorch's outputs and gradients (x, both weights in the fused layout) for the
/// interleaved pairs with the causal mask (base 10000, torchtune's complex rotation) and for
/// the halves without a mask (base 500, Hugging Face's `rotate_half`), fixture `mha_rope`, on
/// the eager CPU (f64, f32), CUDA-sim and linked sessions; an odd head size or a bad base is
/// an error, and the layer prints its rotation.
#[test]
fn rotary_attention_gives_pytorchs_values_and_gradients() {
    fn check<O: Train>(mut rt: Runtime<O>, tol: f64) {
        let e = expected("mha_rope");
        let cases = [
            ("interleaved", true, Rope::DEFAULT),
            (
                "halves",
                false,
                Rope {
                    base: 500.0,
                    layout: RopeLayout::Halves,
                },
            ),
        ];
        for (name, causal, rope) in cases {
            let mha = mha_from_fixture(&rt, name, causal).with_rope(rope).unwrap();
            let grads = self_attention_on_fixture(&mut rt, &mha, &e, name, tol);
            let at = |k: &str| format!("{k}_{name} ({})", O::T::NAME);
            let close = |got: &Tensor<f64>, key: &str| {
                let d = max_diff(got, &e[&format!("{key}_{name}")]);
                assert!(d < tol, "{}: max diff {d}", at(key));
            };
            close(&grads[0], "grad_input");
            let (in_proj, out_proj) = fused_layout(&grads[1..]);
            close(&in_proj, "grad_in_proj");
            close(&out_proj, "grad_out_proj");
        }
    }
    check(eager::<f64>(Backend::Cpu, 0), 1e-12);
    check(eager::<f32>(Backend::Cpu, 0), 1e-5);
    check(eager::<f32>(Backend::CudaSim, 0), 1e-5);
    check(linked::<f64>(0), 1e-12);
    // Bad settings name the layer; the rotation prints.
    let rt = eager::<f64>(Backend::Cpu, 0);
    let odd = MultiHeadAttention::new(&rt.vars().pp("odd"), 6, 2, false).unwrap();
    let e = odd.with_rope(Rope::DEFAULT).unwrap_err().to_string();
    assert!(e.contains("with_rope") && e.contains("head size 3"), "{e}");
    let even = MultiHeadAttention::new(&rt.vars().pp("even"), 8, 2, false).unwrap();
    for base in [1.0, f64::NAN] {
        let rope = Rope {
            base,
            layout: RopeLayout::Interleaved,
        };
        let e = even.clone().with_rope(rope).unwrap_err().to_string();
        assert!(e.contains("base"), "{e}");
    }
    let roped = even.with_rope(Rope::DEFAULT).unwrap();
    assert_eq!(
        tl_nn::tree(&roped).to_string(),
        "MultiHeadAttention(embed_dim=8, num_heads=2, bias=False, causal=False, rope=(base=10000.0, Interleaved))"
    );
}

/// A padded batch through `forward_masked` with `key_padding_masks` (one key mask per
/// sequence: the op under a batched mask) gives each sequence's real rows as the layer gives
/// that sequence alone, unpadded and unmasked, and the weights' gradients of a loss over the
/// real rows are the sum of the sequences' own: plain, rotary and grouped layers (fused and
/// composed), on the eager CPU (f64, f32), CUDA-sim and linked sessions. The same for causal
/// layers with `causal_padding_masks` against each sequence through the causal layer's
/// `forward`.
#[test]
fn a_padded_batch_attends_as_each_sequence_alone() {
    const N: usize = 6;
    const D: usize = 8;
    let (n, d, lens) = (N, D, [6usize, 3, 1]);
    let x = tensor::<f64>(&[3, n, d], 51);
    let w = tensor::<f64>(&[3, n, d], 52);
    /// The first `len` rows of batch element `b` of a (3, N, D) tensor.
    fn rows(t: &Tensor<f64>, b: usize, len: usize) -> Tensor<f64> {
        Tensor::new([len, D], t.data()[b * N * D..][..len * D].to_vec()).unwrap()
    }
    // The loss's weights, zero on the padded rows.
    let w_real = Tensor::from_fn(tl_spec::Shape::new(&[3, n, d]), |e| {
        let (b, i) = (e / (n * d), e / d % n);
        if i < lens[b] { w.data()[e] } else { 0.0 }
    });
    fn layer<O: Train>(
        rt: &Runtime<O>,
        kind: usize,
        flash: bool,
        causal: bool,
    ) -> MultiHeadAttention {
        let vars = rt.vars().pp("a");
        let mha = match kind {
            0 => MultiHeadAttention::new(&vars, 8, 2, causal),
            1 => MultiHeadAttention::new(&vars, 8, 2, causal)
                .and_then(|m| m.with_rope(Rope::DEFAULT)),
            _ => MultiHeadAttention::grouped(&vars, 8, 4, 2, causal),
        };
        mha.unwrap().with_flash(flash)
    }
    fn check<O: Train>(
        make: impl Fn() -> Runtime<O>,
        (x, w_real, w): (&Tensor<f64>, &Tensor<f64>, &Tensor<f64>),
        (n, lens): (usize, [usize; 3]),
        tol: f64,
    ) {
        let settings = (0..3).flat_map(|k| [(k, true), (k, false)]);
        for ((kind, flash), causal) in settings.flat_map(|s| [(s, false), (s, true)]) {
            let what = format!(
                "layer {kind} flash {flash} causal {causal} ({})",
                O::T::NAME
            );
            let mut rt = make();
            let mha = layer(&rt, kind, flash, causal);
            let masks = match causal {
                true => MultiHeadAttention::causal_padding_masks(n, &lens),
                false => MultiHeadAttention::key_padding_masks(n, &lens),
            };
            let masks = masks.unwrap();
            let y = rt
                .eval(&mha, |g| {
                    mha.forward_masked(&g.input(cast(x))?, Some(masks.clone()))
                })
                .unwrap();
            for (b, &len) in lens.iter().enumerate() {
                let alone = rt
                    .eval(&mha, |g| mha.forward(&g.input(cast(&rows(x, b, len)))?))
                    .unwrap();
                let d = max_diff(&rows(&cast(&y), b, len), &alone);
                assert!(d < tol, "{what}: sequence {b} max diff {d}");
            }
            let params = [&mha.wq, &mha.wk, &mha.wv, &mha.wo];
            let got = sgd_gradients(&mut rt, &mha, &params, |g| {
                let y = mha.forward_masked(&g.input(cast(x))?, Some(masks.clone()))?;
                (&y * &g.input(cast(w_real))?)?.sum()
            });
            let mut rt = make();
            let mha = layer(&rt, kind, flash, causal);
            let params = [&mha.wq, &mha.wk, &mha.wv, &mha.wo];
            let want = sgd_gradients(&mut rt, &mha, &params, |g| {
                let mut total: Option<Var<'_, O>> = None;
                for (b, &len) in lens.iter().enumerate() {
                    let y = mha.forward(&g.input(cast(&rows(x, b, len)))?)?;
                    let l = (&y * &g.input(cast(&rows(w, b, len)))?)?.sum()?;
                    total = Some(match total {
                        Some(t) => (&t + &l)?,
                        None => l,
                    });
                }
                Ok(total.expect("three sequences"))
            });
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                let d = max_diff(a, b);
                assert!(d < tol, "{what}: weight {k} gradient max diff {d}");
            }
        }
    }
    let data = (&x, &w_real, &w);
    check(|| eager::<f64>(Backend::Cpu, 4), data, (n, lens), 1e-12);
    check(|| eager::<f32>(Backend::Cpu, 4), data, (n, lens), 1e-5);
    check(|| eager::<f32>(Backend::CudaSim, 4), data, (n, lens), 1e-5);
    check(|| linked::<f64>(4), data, (n, lens), 1e-12);
}
