//! `#[derive(Parameters)]` on nested models (a struct with a `Vec` of structs, `Option`s, a
//! `Sequential`, a tuple struct, an enum, generics over the session), and the listed-parameter
//! check: a parameter a pass uses that the model does not list is an error at `step`,
//! `num_params`, `save`, `load` and `summary`, naming it.

use std::path::PathBuf;

use tl_nn::{
    Activation, Error, LayerNorm, Linear, Module, Parameters, Result, Runtime, Sequential, Var,
    Vars,
};
use tl_session::{Backend, Optimizer, Param, Train};
use tl_spec::Tensor;

use crate::{eager, linked, max_diff, tensor};

/// A residual MLP block; `width` is a setting, not a layer.
#[derive(Parameters)]
struct Block {
    ln: LayerNorm,
    up: Linear,
    down: Linear,
    #[parameters(skip)]
    width: usize,
}

impl Block {
    fn new<O: Train>(v: &Vars<'_, O>, width: usize) -> Result<Self> {
        Ok(Block {
            ln: LayerNorm::new(&v.pp("ln"), width)?,
            up: Linear::new(&v.pp("mlp").pp("up"), width, 2 * width)?,
            down: Linear::new(&v.pp("mlp").pp("down"), 2 * width, width)?,
            width,
        })
    }
}

impl<O: Train> Module<O> for Block {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        assert_eq!(x.dims().last(), Some(&self.width));
        let h = self.up.forward(&self.ln.forward(x)?)?.tanh()?;
        x + &self.down.forward(&h)?
    }
}

/// Every shape of field the derive handles: a layer, a `Vec` of derived structs, a present and
/// an absent `Option`, a `Sequential` (generic over the session), a bare parameter, a boxed
/// tuple struct, an enum, and skipped settings.
#[derive(Parameters)]
struct Net<O: Train> {
    embed: Linear,
    blocks: Vec<Block>,
    norm: Option<LayerNorm>,
    absent: Option<Linear>,
    head: Sequential<O>,
    scale: Param,
    pair: Box<Pair>,
    mode: Mode,
    #[parameters(skip)]
    label: &'static str,
    #[parameters(skip)]
    _session: std::marker::PhantomData<O>,
}

/// A tuple struct with a skipped setting between its layers.
#[derive(Parameters)]
struct Pair(Linear, #[parameters(skip)] f64, Linear);

/// An enum: the variant in use is visited.
#[derive(Parameters)]
enum Mode {
    Plain(Linear),
    #[allow(dead_code)]
    Gated {
        gate: Linear,
        #[parameters(skip)]
        bias: f64,
    },
}

const WIDTH: usize = 4;

fn net<O: Train>(rt: &Runtime<O>) -> Net<O> {
    let v = rt.vars();
    Net {
        embed: Linear::new(&v.pp("embed"), 3, WIDTH).unwrap(),
        blocks: (0..2)
            .map(|i| Block::new(&v.pp("blocks").pp(i), WIDTH).unwrap())
            .collect(),
        norm: Some(LayerNorm::new(&v.pp("norm"), WIDTH).unwrap()),
        absent: None,
        head: Sequential::new()
            .add(Linear::new(&v.pp("head").pp(0), WIDTH, WIDTH).unwrap())
            .add(Activation::Relu)
            .add(Linear::new(&v.pp("head").pp(2), WIDTH, 2).unwrap()),
        scale: v
            .param_from(
                "scale",
                Tensor::<f64>::from_fn([2], |i| 1.0 + i as f64).cast(),
                true,
            )
            .unwrap(),
        pair: Box::new(Pair(
            Linear::new(&v.pp("pair").pp(0), 2, 2).unwrap(),
            0.5,
            Linear::new(&v.pp("pair").pp(2), 2, 2).unwrap(),
        )),
        mode: Mode::Plain(Linear::new(&v.pp("mode"), 2, 2).unwrap()),
        label: "net",
        _session: std::marker::PhantomData,
    }
}

impl<O: Train> Module<O> for Net<O> {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        assert_eq!(self.label, "net");
        let mut h = self.embed.forward(x)?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        if let Some(n) = &self.norm {
            h = n.forward(&h)?;
        }
        let y = self.head.forward(&h)?;
        let y = (&y * &x.scope().param(&self.scale)?)?;
        let y = self
            .pair
            .2
            .forward(&self.pair.0.forward(&y)?.scale(self.pair.1)?)?;
        match &self.mode {
            Mode::Plain(l) => l.forward(&y),
            Mode::Gated { gate, bias } => (&y * &gate.forward(&y)?.sigmoid()?)?.scale(*bias),
        }
    }
}

/// The names `net` lists, in the derive's order (field order; `Vec` elements in order; the
/// absent `Option` and the skipped fields contribute nothing).
const NAMES: [&str; 25] = [
    "embed.weight",
    "embed.bias",
    "blocks.0.ln.weight",
    "blocks.0.ln.bias",
    "blocks.0.mlp.up.weight",
    "blocks.0.mlp.up.bias",
    "blocks.0.mlp.down.weight",
    "blocks.0.mlp.down.bias",
    "blocks.1.ln.weight",
    "blocks.1.ln.bias",
    "blocks.1.mlp.up.weight",
    "blocks.1.mlp.up.bias",
    "blocks.1.mlp.down.weight",
    "blocks.1.mlp.down.bias",
    "norm.weight",
    "norm.bias",
    "head.0.weight",
    "head.0.bias",
    "head.2.weight",
    "head.2.bias",
    "scale",
    "pair.0.weight",
    "pair.0.bias",
    "pair.2.weight",
    "pair.2.bias",
];

/// The number of values of `NAMES` plus `mode`'s layer, by hand.
fn expected_count() -> usize {
    let linear = |i: usize, o: usize| i * o + o;
    let block = 2 * WIDTH + linear(WIDTH, 2 * WIDTH) + linear(2 * WIDTH, WIDTH);
    linear(3, WIDTH)
        + 2 * block
        + 2 * WIDTH
        + linear(WIDTH, WIDTH)
        + linear(WIDTH, 2)
        + 2
        + 2 * linear(2, 2)
        + linear(2, 2)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tl-nn-derive-{}-{name}", std::process::id()))
}

#[test]
fn the_derive_lists_every_field_in_order_and_counts_them() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let model = net(&rt);
    let names: Vec<String> = rt
        .named_params_of(&model)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut expected: Vec<&str> = NAMES.to_vec();
    expected.extend(["mode.weight", "mode.bias"]);
    assert_eq!(names, expected);
    // Every parameter the runtime made is listed once: nothing is left out.
    assert_eq!(names.len(), rt.named_params().len());
    assert_eq!(rt.num_params(&model).unwrap(), expected_count());
    // The other enum variant lists its own field.
    let gated = Mode::Gated {
        gate: Linear::new(&rt.vars().pp("gate"), 2, 2).unwrap(),
        bias: 0.0,
    };
    let gated_names: Vec<String> = rt
        .named_params_of(&gated)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(gated_names, ["gate.weight", "gate.bias"]);
}

#[test]
fn a_derived_model_trains_on_both_sessions_and_round_trips_through_a_file() {
    fn run<O: Train<T = f64>>(mut rt: Runtime<O>, path: &std::path::Path) -> Tensor<f64> {
        let model = net(&rt);
        let x = tensor::<f64>(&[5, 3], 1);
        let target = tensor::<f64>(&[5, 2], 2);
        let before: Vec<Tensor<f64>> = rt
            .named_params_of(&model)
            .iter()
            .map(|(_, p)| rt.value_of(p).unwrap())
            .collect();
        let mut opt = Optimizer::sgd(0.05).unwrap();
        for _ in 0..3 {
            rt.step(&model, &mut opt, |g| {
                let d = (model.forward(&g.input(x.clone())?)? - g.input(target.clone())?)?;
                (&d * &d)?.mean()
            })
            .unwrap();
        }
        // Every listed parameter got a gradient and moved (none trains unlisted).
        for ((name, p), b) in rt.named_params_of(&model).iter().zip(&before) {
            let diff = max_diff(&rt.value_of(p).unwrap(), b);
            assert!(diff > 0.0, "{name} did not train");
        }
        let y = rt
            .eval(&model, |g| model.forward(&g.input(x.clone())?))
            .unwrap();
        rt.save(&model, path).unwrap();
        y
    }
    let (p1, p2) = (temp("eager.safetensors"), temp("linked.safetensors"));
    let eager_y = run(eager::<f64>(Backend::Cpu, 3), &p1);
    let linked_y = run(linked::<f64>(3), &p2);
    assert!(max_diff(&eager_y, &linked_y) < 1e-12);

    // A fresh model of another seed, loaded from the file, gives the trained outputs.
    let mut fresh = eager::<f64>(Backend::Cpu, 99);
    let model = net(&fresh);
    let x = tensor::<f64>(&[5, 3], 1);
    let y0 = fresh
        .eval(&model, |g| model.forward(&g.input(x.clone())?))
        .unwrap();
    assert!(max_diff(&y0, &eager_y) > 1e-3);
    fresh.load(&model, &p1).unwrap();
    let y1 = fresh
        .eval(&model, |g| model.forward(&g.input(x.clone())?))
        .unwrap();
    assert_eq!(y1.data(), eager_y.data());
    let file = tl_nn::checkpoint::read(&p1).unwrap();
    assert_eq!(file.tensors.len(), NAMES.len() + 2);
    for p in [p1, p2] {
        std::fs::remove_file(p).unwrap();
    }
}

/// The hand-written mistake the check catches: `visit_params` forgets `head`.
struct Forgetful {
    body: Linear,
    mid: Linear,
    head: Linear,
}

impl Parameters for Forgetful {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        self.body.visit_params(f);
        self.mid.visit_params(f);
    }
}

impl<O: Train> Module<O> for Forgetful {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let h = self.mid.forward(&self.body.forward(x)?.relu()?)?;
        self.head.forward(&h.relu()?)
    }
}

/// The same model with the derive.
#[derive(Parameters)]
struct Fixed {
    body: Linear,
    mid: Linear,
    head: Linear,
}

impl<O: Train> Module<O> for Fixed {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let h = self.mid.forward(&self.body.forward(x)?.relu()?)?;
        self.head.forward(&h.relu()?)
    }
}

fn forgetful<O: Train>(rt: &Runtime<O>) -> Forgetful {
    let v = rt.vars().pp("model");
    Forgetful {
        body: Linear::new(&v.pp("body"), 3, 4).unwrap(),
        mid: Linear::new(&v.pp("mid"), 4, 4).unwrap(),
        head: Linear::new(&v.pp("head"), 4, 2).unwrap(),
    }
}

const HEAD: [&str; 2] = [r#""model.head.weight" [2, 4]"#, r#""model.head.bias" [2]"#];

/// Assert `r` is the unlisted-parameter error of `call` naming the head's parameters (the
/// first `n` of them).
#[track_caller]
fn unlisted_n<T: std::fmt::Debug>(r: Result<T>, call: &str, n: usize) {
    match r {
        Err(Error::Unlisted { call: c, names }) => {
            assert_eq!(c, call);
            assert_eq!(names, HEAD[..n]);
        }
        other => panic!("{call}: expected Error::Unlisted, got {other:?}"),
    }
}

#[track_caller]
fn unlisted<T: std::fmt::Debug>(r: Result<T>, call: &str) {
    unlisted_n(r, call, 2);
}

#[test]
fn a_parameter_used_but_not_listed_is_an_error_at_step_save_num_params_load_and_summary() {
    check_unlisted(eager::<f64>(Backend::Cpu, 0), 2);
    // The linked session cannot record the head's weight as a leaf after the body's ops, so
    // its pass stops there: the step reports the weight (the cause, not the failed leaf), and
    // the later calls know of the weight only.
    check_unlisted(linked::<f64>(0), 1);
}

/// The checks on `rt`; its passes see the first `n` of the head's parameters.
fn check_unlisted<O: Train<T = f64>>(mut rt: Runtime<O>, n: usize) {
    {
        let rt = &mut rt;
        let model = forgetful(rt);
        let x = tensor::<f64>(&[2, 3], 5);
        // Before any pass nothing says what the model uses: the count misses the head.
        assert_eq!(rt.num_params(&model).unwrap(), 16 + 20);
        let values = |rt: &Runtime<O>| -> Vec<Tensor<f64>> {
            rt.named_params()
                .iter()
                .map(|(_, p)| rt.value_of(p).unwrap())
                .collect()
        };
        let before = values(rt);
        let mut opt = Optimizer::adam(0.1).unwrap();
        let step = rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.sum()
        });
        unlisted_n(step, "Runtime::step", n);
        // Nothing trained.
        for (a, b) in values(rt).iter().zip(&before) {
            assert_eq!(a.data(), b.data());
        }
        let path = temp("forgetful.safetensors");
        unlisted_n(rt.num_params(&model), "Runtime::num_params", n);
        unlisted_n(rt.save(&model, &path), "Runtime::save", n);
        assert!(!path.exists(), "no file is written");
        unlisted_n(rt.state_dict(&model), "Runtime::state_dict", n);
        unlisted_n(rt.load(&model, &path), "Runtime::load", n);
        unlisted_n(rt.summary(&model), "Runtime::summary", n);
        // A part of it, and a model of unrelated parameters, are fine. (A part that lists
        // exactly what the model lists is the same model to the check: the runtime knows a
        // model by the set of parameters it lists.)
        assert_eq!(rt.num_params(&model.body).unwrap(), 16);
        let other = Linear::new(&rt.vars().pp("other"), 2, 2).unwrap();
        assert_eq!(rt.num_params(&other).unwrap(), 6);
        // A model that contains the forgetful one's layers and still lacks the head is not.
        let outer = vec![model.body.clone(), model.mid.clone(), other];
        unlisted_n(rt.num_params(&outer), "Runtime::num_params", n);

        // The same layers with the derive: every call works and counts the head.
        let fixed = Fixed {
            body: model.body.clone(),
            mid: model.mid.clone(),
            head: model.head.clone(),
        };
        rt.step(&fixed, &mut opt, |g| {
            fixed.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap();
        assert_eq!(rt.num_params(&fixed).unwrap(), 16 + 20 + 10);
        rt.save(&fixed, &path).unwrap();
        rt.load(&fixed, &path).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn an_eval_pass_succeeds_but_remembers_the_gap() {
    let rt = eager::<f64>(Backend::Cpu, 0);
    let model = forgetful(&rt);
    let y = rt
        .eval(&model, |g| model.forward(&g.input(tensor(&[2, 3], 1))?))
        .unwrap();
    assert_eq!(y.shape().dims(), [2, 2]);
    unlisted(rt.num_params(&model), "Runtime::num_params");
    let e = rt.num_params(&model).unwrap_err().to_string();
    assert!(
        e.contains("Runtime::num_params: the model does not list 2 parameter(s) its forward pass uses: \"model.head.weight\" [2, 4], \"model.head.bias\" [2]; list every layer in visit_params, or write it with #[derive(Parameters)]"),
        "{e}"
    );
}
