//! tl-nn's integration tests, one binary: layers and initialisers, the training loop on both
//! sessions, checkpoints (PyTorch fixtures and bad files), labels and expressions.

mod checkpoint;
mod expr;
mod layers;
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
