//! [`Runner`]: the few calls a training loop needs beyond [`Ops`], for the eager [`Session`]
//! and for a [`LinkedSession`] compiled into a backend's tape at every step.

use tl_session::optim::StateDict;
use tl_session::{
    Backend, Error, LinkedSession, Ops, Optimizer, Options, Param, Result, Session, TensorRef,
};
use tl_spec::Tensor;

/// A session a training loop can drive: one step from a recorded loss, reads, parameter I/O.
pub trait Runner: Ops<T = f32> {
    /// The loss value, then backward from it and one optimizer step.
    fn train_step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> Result<f32>;
    /// The value of a recorded tensor (for the linked session, read from the compiled tape).
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<f32>>;
    /// Drop the recorded step (parameters stay).
    fn end_step(&mut self);
    /// A parameter's current value.
    fn read_param(&mut self, p: &Param) -> Result<Tensor<f32>>;
    /// Overwrite a parameter's value.
    fn write_param(&mut self, p: &Param, v: Tensor<f32>) -> Result<()>;
    /// Record labels in the Nat environment; returns the position of the first.
    fn record_labels(&mut self, labels: &[usize]) -> usize;
    /// `opt`'s state for the session's parameters (PyTorch: `optimizer.state_dict()`).
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict>;
    /// Load `state` into `opt` (PyTorch: `optimizer.load_state_dict(...)`).
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()>;
    /// The recorded graph (linked sessions only).
    fn graph(&self) -> Option<&tl_ir::GraphData>;
}

/// Build the session for `backend`: eager, or linked (recording a `GraphData` compiled into
/// `backend`'s tape).
pub fn session(
    backend: Backend,
    linked: bool,
    deterministic: bool,
) -> crate::Result<Box<dyn Runner>> {
    make(backend, linked, deterministic).map_err(|e| match e {
        // The session speaks of `Backend::CudaSim`; on the command line it is a flag.
        Error::BackendUnavailable { backend, detail } => crate::CliError::new(format!(
            "backend {backend} is not available: {}",
            detail.replace("Backend::CudaSim", "--backend cuda-sim")
        )),
        e => e.into(),
    })
}

fn make(backend: Backend, linked: bool, deterministic: bool) -> Result<Box<dyn Runner>> {
    let opts = Options {
        backend,
        deterministic,
        seed: 0,
    };
    if linked {
        // Fail now, not at the first step, when the backend cannot be had.
        Session::<f32>::new(opts)?;
        Ok(Box::new(Linked {
            s: LinkedSession::new(),
            backend,
        }))
    } else {
        Ok(Box::new(Session::<f32>::new(opts)?))
    }
}

impl Runner for Session<f32> {
    fn train_step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> Result<f32> {
        let l = self.value(loss)?.item()?;
        self.backward(loss)?;
        self.step(opt)?;
        Ok(l)
    }
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<f32>> {
        self.value(r)
    }
    fn end_step(&mut self) {
        self.reset();
    }
    fn read_param(&mut self, p: &Param) -> Result<Tensor<f32>> {
        self.param_value(p)
    }
    fn write_param(&mut self, p: &Param, v: Tensor<f32>) -> Result<()> {
        self.set_param(p, v)
    }
    fn record_labels(&mut self, labels: &[usize]) -> usize {
        self.record_nat_vec(labels).pos()
    }
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict> {
        Session::optimizer_state(self, opt)
    }
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()> {
        Session::load_optimizer_state(self, opt, state)
    }
    fn graph(&self) -> Option<&tl_ir::GraphData> {
        None
    }
}

/// A linked session and the backend its graph is compiled into.
pub struct Linked {
    s: LinkedSession<f32>,
    backend: Backend,
}

impl Ops for Linked {
    type T = f32;
    fn apply(&mut self, op: tl_ir::Op, args: &[&TensorRef]) -> Result<TensorRef> {
        self.s.apply(op, args)
    }
    fn param(&mut self, init: Tensor<f32>, name: Option<&str>, rg: bool) -> Result<Param> {
        self.s.param(init, name, rg)
    }
    fn use_param(&mut self, p: &Param) -> Result<TensorRef> {
        self.s.use_param(p)
    }
    fn input_named(
        &mut self,
        value: Tensor<f32>,
        name: Option<&str>,
        requires_grad: bool,
    ) -> Result<TensorRef> {
        self.s.input_named(value, name, requires_grad)
    }
    fn constant(&mut self, value: Tensor<f32>) -> Result<TensorRef> {
        self.s.constant(value)
    }
    fn value(&mut self, r: &TensorRef) -> Result<Tensor<f32>> {
        self.s.value(r)
    }
    fn next_random_key(&mut self) -> tl_session::Result<(u64, u64)> {
        self.s.next_random_key()
    }
}

impl Runner for Linked {
    fn train_step(&mut self, loss: &TensorRef, opt: &mut Optimizer) -> Result<f32> {
        let mut compiled = self.s.compile(self.backend)?;
        let l = compiled.value(loss.id())?.item()?;
        let grads = compiled.backward_dense(loss.id(), &Tensor::scalar(1.0))?;
        self.s.step(opt, &grads)?;
        Ok(l)
    }
    fn read(&mut self, r: &TensorRef) -> Result<Tensor<f32>> {
        self.s.compile(self.backend)?.value(r.id())
    }
    fn end_step(&mut self) {
        self.s.reset();
    }
    fn read_param(&mut self, p: &Param) -> Result<Tensor<f32>> {
        self.s.param_value(p)
    }
    fn write_param(&mut self, p: &Param, v: Tensor<f32>) -> Result<()> {
        self.s.set_param(p, v)
    }
    fn record_labels(&mut self, labels: &[usize]) -> usize {
        self.s.record_nat_vec(labels).pos()
    }
    fn optimizer_state(&self, opt: &Optimizer) -> Result<StateDict> {
        self.s.optimizer_state(opt)
    }
    fn load_optimizer_state(&mut self, opt: &mut Optimizer, state: &StateDict) -> Result<()> {
        self.s.load_optimizer_state(opt, state)
    }
    fn graph(&self) -> Option<&tl_ir::GraphData> {
        Some(self.s.graph())
    }
}
