//! tl-nn's integration tests, one binary: layers and initialisers, the training loop on both
//! sessions, checkpoints (PyTorch fixtures and bad files), labels and expressions, the derive
//! and the listed-parameter check, printed models and summaries, and error messages.

mod boundaries;
mod checkpoint;
mod controls;
mod custom_op;
mod data;
mod derive;
mod display;
mod errors;
mod expr;
mod layers;
mod losses;
mod losses_fixture;
mod models;
mod rnn;
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
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for name in ["digits_mlp.rs", "digits_cnn.rs"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let code = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .count();
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
