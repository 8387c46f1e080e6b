//! Helpers shared by the integration tests: run a forward/backward/step loop on any session kind.

#![allow(dead_code)]

pub mod grid;
pub mod mlp;

use tl_session::{
    Backend, LinkedSession, Ops, Optimizer, Options, Param, Result, Session, TensorRef,
};
use tl_spec::{Scalar, Tensor};

/// The three ways to run a model: eager CPU, eager CUDA-sim, linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cpu,
    CudaSim,
    Linked,
}

pub const KINDS: [Kind; 3] = [Kind::Cpu, Kind::CudaSim, Kind::Linked];

/// A session of either kind behind one interface for training loops.
#[allow(clippy::large_enum_variant)] // one per test
pub enum Any<T: Scalar> {
    Eager(Session<T>),
    Linked(LinkedSession<T>),
}

impl<T: Scalar> Any<T> {
    pub fn new(kind: Kind) -> Self {
        match kind {
            Kind::Cpu => Any::Eager(Session::new(Options::backend(Backend::Cpu)).unwrap()),
            Kind::CudaSim => Any::Eager(Session::new(Options::backend(Backend::CudaSim)).unwrap()),
            Kind::Linked => Any::Linked(LinkedSession::new()),
        }
    }

    pub fn ops(&mut self) -> &mut dyn OpsT<T> {
        match self {
            Any::Eager(s) => s,
            Any::Linked(s) => s,
        }
    }

    /// Backward from a scalar loss, one optimizer step, reset.
    pub fn step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> Result<()> {
        match self {
            Any::Eager(s) => {
                s.backward(loss)?;
                s.step(opt)?;
                s.reset();
            }
            Any::Linked(s) => {
                let g = s.backward_scalar_dense_all(loss)?;
                s.step(opt, &g)?;
                s.reset();
            }
        }
        Ok(())
    }

    pub fn param_value(&mut self, p: &Param) -> Result<Tensor<T>> {
        match self {
            Any::Eager(s) => s.param_value(p),
            Any::Linked(s) => s.param_value(p),
        }
    }
}

/// `Ops` as a trait object with a fixed scalar type.
pub trait OpsT<T: Scalar>: Ops<T = T> {}
impl<T: Scalar, S: Ops<T = T>> OpsT<T> for S {}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: got {g}, want {w} (tol {tol})\n got {got:?}\nwant {want:?}"
        );
    }
}

pub fn f64s<T: Scalar>(t: &Tensor<T>) -> Vec<f64> {
    t.data().iter().map(|v| v.as_f64()).collect()
}
