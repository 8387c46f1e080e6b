//! Backward, gradient reads and optimizer steps of the eager session.

use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, Device};

use super::{Engine, Grads, Session};
use crate::optim::DeviceOps;
use crate::{Error, Optimizer, Param, Result, TensorRef};

impl<T: Scalar> Session<T> {
    pub(crate) fn release_grads(&mut self) {
        if let Some(Grads::Sim(g)) = self.grads.take()
            && let Engine::Sim(t) = &mut self.engine
        {
            t.release_grads(g);
        }
    }

    /// Reverse accumulation from a scalar `loss` (seed 1). PyTorch: `loss.backward()`.
    pub fn backward(&mut self, loss: &TensorRef) -> Result<()> {
        if !loss.shape.is_scalar() {
            return Err(Error::Shape {
                what: "backward (use backward_with_seed for a non-scalar output)",
                expected: Shape::scalar(),
                got: loss.shape.clone(),
            });
        }
        self.backward_with_seed(loss, Tensor::scalar(T::one()))
    }

    /// Reverse accumulation from `out` with cotangent `seed` (same shape). Gradients of every
    /// recorded tensor are kept until the next backward or reset.
    /// PyTorch: `out.backward(seed)`.
    pub fn backward_with_seed(&mut self, out: &TensorRef, seed: Tensor<T>) -> Result<()> {
        self.check("backward", out)?;
        if seed.shape() != &out.shape {
            return Err(Error::Shape {
                what: "backward seed",
                expected: out.shape.clone(),
                got: seed.shape().clone(),
            });
        }
        self.release_grads();
        let grads = match &mut self.engine {
            Engine::Cpu(t) => Grads::Cpu(t.backward_dense(out.id, &seed)?),
            Engine::Sim(t) => {
                let s = AnyBuffer::upload(t.device_mut(), &seed)?;
                let g = t.backward_dense(out.id, &s);
                s.release(t.device_mut());
                Grads::Sim(g?)
            }
        };
        self.grads = Some(grads);
        Ok(())
    }

    fn no_backward(what: &'static str) -> Error {
        Error::Usage {
            what,
            detail: "no gradients: call backward first (gradients are dropped by reset)".into(),
        }
    }

    /// The gradient of a recorded tensor from the last backward (zeros where nothing flowed).
    pub fn grad_of(&mut self, r: &TensorRef) -> Result<Tensor<T>> {
        self.check("grad", r)?;
        match (&self.grads, &self.engine) {
            (Some(Grads::Cpu(g)), _) if r.id < g.len() => Ok(g[r.id].clone()),
            (Some(Grads::Sim(g)), Engine::Sim(t)) if r.id < g.len() => {
                Ok(g[r.id].download(t.device())?)
            }
            (Some(_), _) => Ok(Tensor::zeros(r.shape.clone())),
            (None, _) => Err(Self::no_backward("grad")),
        }
    }

    fn leaves_of(&self, index: usize) -> Vec<usize> {
        let mut ids: Vec<usize> = self
            .leaf_param
            .iter()
            .filter(|&(_, &p)| p == index)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// A parameter's gradient from the last backward: the sum over every use of it in this
    /// forward pass (zeros if unused). PyTorch: `p.grad`.
    pub fn grad(&mut self, p: &Param) -> Result<Tensor<T>> {
        self.params.slot("grad", p)?;
        if self.grads.is_none() {
            return Err(Self::no_backward("grad"));
        }
        let mut acc = Tensor::zeros(p.shape.clone());
        for id in self.leaves_of(p.index) {
            let r = TensorRef {
                stamp: self.stamp,
                id,
                shape: p.shape.clone(),
            };
            acc.add_assign(&self.grad_of(&r)?)?;
        }
        Ok(acc)
    }

    /// Plain SGD on every parameter used in this forward pass: `w ← w − lr·grad`.
    pub fn sgd_step(&mut self, lr: f64) -> Result<()> {
        self.step(&mut Optimizer::sgd(lr))
    }

    /// One optimizer step on every trainable parameter used in this forward pass, from the last
    /// backward's gradients. On CUDA the update runs on the device, on the resident mirrors
    /// (the host copy is marked stale and synced on read). PyTorch: `optimizer.step()`.
    pub fn step(&mut self, opt: &mut Optimizer) -> Result<()> {
        if self.grads.is_none() {
            return Err(Self::no_backward("step"));
        }
        let mut used: Vec<usize> = self.leaf_param.values().copied().collect();
        used.sort_unstable();
        used.dedup();
        for index in used {
            if !self.params.slots[index].requires_grad {
                continue;
            }
            let key = (self.params.session, index);
            let leaves = self.leaves_of(index);
            match (&mut self.engine, &self.grads) {
                (Engine::Sim(t), Some(Grads::Sim(g))) => {
                    let dev = t.device_mut();
                    let mirror = self.params.mirror(index, dev)?.buffer();
                    let gsum = dev.copy(g[leaves[0]].buffer())?;
                    let mut r = Ok(());
                    for &l in &leaves[1..] {
                        r = r.and_then(|()| Ok(dev.axpy_assign(gsum, 1.0, g[l].buffer())?));
                    }
                    let mut w = mirror;
                    let r = r.and_then(|()| opt.update(&mut DeviceOps(dev), key, &mut w, &gsum));
                    dev.release(gsum);
                    r?;
                    self.params.slots[index].host_stale = true;
                }
                (Engine::Cpu(_), Some(Grads::Cpu(g))) => {
                    let gs: Vec<&Tensor<T>> = leaves.iter().map(|&l| &g[l]).collect();
                    opt.update_host(key, &mut self.params.slots[index].host, &gs)?;
                }
                _ => return Err(Self::no_backward("step")),
            }
        }
        Ok(())
    }

    /// Release the optimizer's device state held on this session's device (CUDA only).
    pub fn release_optimizer_state(&mut self, opt: &mut Optimizer) -> usize {
        match &mut self.engine {
            Engine::Sim(t) => opt.release_device_state(t.device_mut()),
            Engine::Cpu(_) => 0,
        }
    }
}
