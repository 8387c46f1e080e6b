//! tl-nn's integration tests, one binary: layers and initialisers, the training loop on both
//! sessions, checkpoints (PyTorch fixtures and bad files), labels and expressions, the derive
//! and the listed-parameter check, printed models and summaries, error messages, and generated
//! corruptions of every reader's input (`fuzz`).

mod accumulate;
mod activations;
mod activations_fixture;
mod autocast;
mod boundaries;
mod checkpoint;
mod controls;
mod custom_op;
mod data;
mod derive;
mod display;
mod dist;
mod errors;
mod expr;
mod fuzz;
mod layers;
mod losses;
mod losses_fixture;
mod models;
mod rnn;
mod running_stats;
mod training;

use tl_nn::{Activation, Linear, Runtime, Sequential};
use tl_session::{Backend, LinkedSession, Options, Session, Train};
use tl_spec::{Scalar, Tensor};

/// An eager session on `backend` with `seed`.
pub fn eager<T: Scalar>(backend: Backend, seed: u64) -> Runtime<Session<T>> {
    Runtime::new(
        Session::new(Options {
            backend,
            seed,
            ..Options::default()
        })
        .unwrap(),
    )
}

/// A linked session with `seed`.
pub fn linked<T: Scalar>(seed: u64) -> Runtime<LinkedSession<T>> {
    Runtime::new(LinkedSession::with_seed(seed))
}

/// A linked f32 session with `seed` that compiles onto `backend`.
pub fn linked_on(backend: Backend, seed: u64) -> Runtime<LinkedSession<f32>> {
    let mut rt = linked::<f32>(seed);
    rt.session_mut().set_backend(backend).unwrap();
    rt
}

/// The MLP `inputs → hidden → classes` with PyTorch's `nn.Sequential` names (0, 2).
pub fn mlp<O: Train>(
    rt: &Runtime<O>,
    inputs: usize,
    hidden: usize,
    classes: usize,
) -> Sequential<O> {
    let v = rt.vars();
    Sequential::new()
        .add(Linear::new(&v.pp(0), inputs, hidden).unwrap())
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), hidden, classes).unwrap())
}

/// `v` as a tensor of `dims` in the element type `T`.
pub fn vals<T: Scalar>(v: &[f64], dims: &[usize]) -> Tensor<T> {
    Tensor::new(
        tl_spec::Shape::new(dims),
        v.iter().map(|&x| T::lit(x)).collect(),
    )
    .unwrap()
}

/// A deterministic test tensor.
pub fn tensor<T: Scalar>(dims: &[usize], salt: u64) -> Tensor<T> {
    Tensor::from_fn(dims, |i| {
        T::lit((tl_spec::rng::unit(salt, i as u64) - 0.5) * 2.0)
    })
}

/// The largest absolute difference between two tensors of the same shape.
pub fn max_diff<A: Scalar, B: Scalar>(a: &Tensor<A>, b: &Tensor<B>) -> f64 {
    assert_eq!(a.shape().dims(), b.shape().dims(), "shapes differ");
    a.data()
        .iter()
        .zip(b.data())
        .map(|(x, y)| (x.as_f64() - y.as_f64()).abs())
        .fold(0.0, f64::max)
}

/// The examples stay what the docs promise: model, loop, accuracy, save and reload in at most
/// 40 lines of code (blank lines and comments not counted), switchable to the linked session
/// by their first line.
#[test]
fn examples_stay_within_40_lines() {
    for name in ["digits_mlp.rs", "digits_cnn.rs"] {
        let (text, code) = example(name);
        assert!(code <= 40, "{name}: {code} lines of code");
        for step in ["rt.step(", "rt.accuracy(", "rt.save(", "rt.load("] {
            assert!(text.contains(step), "{name} lacks {step}");
        }
        let first = "let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);";
        assert!(
            text.contains(first),
            "{name}: the session line the docs tell users to change"
        );
    }
}

/// An example's text and its lines of code (blank lines and comments not counted).
fn example(name: &str) -> (String, usize) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    let code = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count();
    (text, code)
}

/// Issue 38's proof stays true: the batched character-level transformer LM (AdamW, cosine
/// schedule with warm-up, clipping, validation loss against the unigram baseline, sampled
/// text) in at most 80 lines of code, its LLaMA-style twin too, the LSTM one in at most 60.
/// That the default runs beat the baseline (by 1 nat for the transformers) is the examples'
/// own exit status.
#[test]
fn language_model_examples_stay_within_80_and_60_lines() {
    for name in ["char_lm.rs", "char_llama.rs"] {
        let (lm, code) = example(name);
        assert!(code <= 80, "{name}: {code} lines of code");
        for piece in [
            "Optimizer::adamw(",
            "Schedule::cosine_warmup(",
            ".clip_grad_norm(",
            "unigram_nll(",
            "sample(&logits",
            "train.sample(",
            "assert!(base - loss > margin",
        ] {
            assert!(lm.contains(piece), "{name} lacks {piece}");
        }
    }
    assert!(example("char_llama.rs").0.contains("LlamaBlock::new("));
    let (lstm, code) = example("char_lstm.rs");
    assert!(code <= 60, "char_lstm.rs: {code} lines of code");
    for piece in [
        "Lstm::new(",
        "unigram_nll(",
        "sample(&logits",
        "assert!(loss < base",
    ] {
        assert!(lstm.contains(piece), "char_lstm.rs lacks {piece}");
    }
}

/// A model of one parameter: the input a test differentiates by.
pub struct Input(pub tl_session::Param);

impl tl_nn::Parameters for Input {
    fn visit_params(&self, f: &mut dyn FnMut(&tl_session::Param)) {
        f(&self.0)
    }
}

/// The largest difference of `got` from `want`, relative where `|want|` > 1.
pub fn rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}
