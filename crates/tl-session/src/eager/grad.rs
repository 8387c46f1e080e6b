//! Backward, gradient reads and optimizer steps of the eager session.

use std::collections::HashMap;

use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::{AnyBuffer, Buffer};

use super::{Engine, Grads, Session, on_engine};
use crate::grad_reduce::ReduceOn;
use crate::{Error, GradReducer, Optimizer, Param, Result, TensorRef};

impl<T: Scalar> Session<T> {
    /// Drop the last backward's gradients: device buffers go back to the device's pool, host
    /// ones to the CPU tape's (its kernels reuse them in the next pass).
    pub(crate) fn release_grads(&mut self) {
        match self.grads.take() {
            Some(Grads::Device(g)) => on_engine!(&mut self.engine, cpu(_) => {}, cuda(t) => {
                t.release_grads(g);
            }),
            Some(Grads::DeviceParams(g)) => {
                on_engine!(&mut self.engine, cpu(_) => {}, cuda(t) => {
                    t.release_grad_map(g);
                })
            }
            Some(Grads::Cpu(g)) => {
                if let Engine::Cpu(t) = &self.engine {
                    g.into_iter().for_each(|x| t.recycle(x));
                }
            }
            Some(Grads::CpuParams(g)) => {
                if let Engine::Cpu(t) = &self.engine {
                    g.into_values().for_each(|x| t.recycle(x));
                }
            }
            None => {}
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
        let grads = on_engine!(&mut self.engine,
            cpu(t) => Grads::Cpu(t.backward_dense(out.id, &seed)?),
            cuda(t) => {
                // The 1 of `backward(loss)` is filled on the device and becomes the loss's
                // gradient slot (not copied).
                let s = AnyBuffer::upload_or_fill(t.device_mut(), &seed)?;
                Grads::Device(t.backward_dense_owned(out.id, s)?)
            },
        );
        self.grads = Some(grads);
        Ok(())
    }

    /// The training loop's backward (from [`Train::backward_step`]): the tape's sparse sweep
    /// from the scalar `loss`, which keeps the gradients of the trainable parameters' leaves
    /// only and releases every other node's as soon as it has passed it (on a device an
    /// identity cotangent moves, or is shared, instead of being copied; on the CPU the others
    /// go to the tape's pool, so a step holds about half the ResNet's gradient buffers a dense
    /// backward would). The same parameter gradients, bit for bit, as
    /// [`backward`](Self::backward); reading a non-parameter tensor's gradient afterwards is an
    /// error (PyTorch keeps `.grad` for leaves only, too).
    ///
    /// [`Train::backward_step`]: crate::Train::backward_step
    ///
    /// With `ends_pass` (a step after which nothing reads the pass) the tape lets go of each
    /// forward value as the sweep passes it ([`tl_tape_cpu::Tape::backward_params_releasing`],
    /// [`tl_tape_cuda::CudaTape::backward_params_releasing`]).
    pub(crate) fn backward_params(&mut self, loss: &TensorRef, ends_pass: bool) -> Result<()> {
        self.check("backward", loss)?;
        if !loss.shape.is_scalar() {
            return Err(Error::Shape {
                what: "backward_step (the loss must be a scalar)",
                expected: Shape::scalar(),
                got: loss.shape.clone(),
            });
        }
        self.release_grads();
        let wanted: Vec<usize> = self
            .trainable_uses()
            .into_iter()
            .flat_map(|(_, leaves)| leaves)
            .collect();
        let grads = on_engine!(&mut self.engine,
            cpu(t) => {
                let seed = Tensor::scalar(T::one());
                Grads::CpuParams(match ends_pass {
                    true => t.backward_params_releasing(loss.id, &seed, &wanted)?,
                    false => t.backward_params(loss.id, &seed, &wanted)?,
                })
            },
            cuda(t) => {
                let s = AnyBuffer::upload_or_fill(t.device_mut(), &Tensor::scalar(T::one()))?;
                Grads::DeviceParams(match ends_pass {
                    true => t.backward_params_releasing(loss.id, s, &wanted)?,
                    false => t.backward_params_owned(loss.id, s, &wanted)?,
                })
            },
        );
        self.grads = Some(grads);
        Ok(())
    }

    /// Hand the last backward's trainable parameter gradients (one per leaf, in
    /// [`Train::backward_step_reduced`]'s order) to `reduce`. On the CUDA device (after
    /// [`backward_params`](Self::backward_params)) they stay there when `reduce` works on the
    /// device (`GradReducer::reduce_on_device`, features `cuda`, `cuda-emu`: NCCL); otherwise
    /// (and on the simulation device) they go through the host: each downloaded, the host
    /// slices reduced, each uploaded back in place of its buffer, so that a data-parallel
    /// group's mean (its engine: MPI, NCCL) applies on every backend.
    ///
    /// [`Train::backward_step_reduced`]: crate::Train::backward_step_reduced
    pub(crate) fn reduce_grads(&mut self, reduce: &mut dyn GradReducer<T>) -> Result<()> {
        let uses = self.trainable_uses();
        let leaves: Vec<usize> = uses.iter().flat_map(|(_, l)| l.iter().copied()).collect();
        match &mut self.grads {
            Some(Grads::Cpu(g)) => crate::train::reduce_leaves(g, &leaves, reduce),
            Some(Grads::CpuParams(g)) => reduce_map(g, &leaves, reduce),
            Some(Grads::DeviceParams(g)) => on_engine!(&mut self.engine,
                cpu(_) => Err(crate::train::no_step_gradients()),
                cuda(t) => t.device_mut().reduce_grads(g, &leaves, reduce),
            ),
            _ => Err(crate::train::no_step_gradients()),
        }
    }

    /// Every trainable parameter used in this pass with its tape leaves, by parameter index.
    fn trainable_uses(&self) -> Vec<(usize, Vec<usize>)> {
        let mut used: Vec<usize> = self.leaf_param.values().copied().collect();
        used.sort_unstable();
        used.dedup();
        used.retain(|&index| self.params.slots[index].requires_grad);
        used.into_iter()
            .map(|index| (index, self.leaves_of(index)))
            .collect()
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
        match &self.grads {
            Some(Grads::Cpu(g)) if r.id < g.len() => Ok(g[r.id].clone()),
            Some(Grads::Device(g)) if r.id < g.len() => on_engine!(&self.engine,
                cpu(_) => Err(Self::no_backward("grad")),
                cuda(t) => Ok(g[r.id].download(t.device())?),
            ),
            Some(Grads::DeviceParams(g)) => match g.get(&r.id) {
                Some(b) => on_engine!(&self.engine,
                    cpu(_) => Err(Self::no_backward("grad")),
                    cuda(t) => Ok(b.download(t.device())?),
                ),
                None => self.not_a_step_gradient(r),
            },
            Some(Grads::CpuParams(g)) => match g.get(&r.id) {
                Some(t) => Ok(t.clone()),
                None => self.not_a_step_gradient(r),
            },
            Some(_) => Ok(Tensor::try_zeros("grad", r.shape.clone())?),
            None => Err(Self::no_backward("grad")),
        }
    }

    /// [`grad_of`](Self::grad_of) of a tensor a training step's sparse backward kept no
    /// gradient for: zeros for a frozen parameter's leaf (nothing flows into it), else an error.
    fn not_a_step_gradient(&self, r: &TensorRef) -> Result<Tensor<T>> {
        if self.leaf_param.contains_key(&r.id) {
            return Ok(Tensor::try_zeros("grad", r.shape.clone())?);
        }
        Err(Error::Usage {
            what: "grad",
            detail: "the training step (backward_step) keeps the parameters' gradients only; \
                     call backward to read every tensor's"
                .into(),
        })
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
        let mut acc = Tensor::try_zeros("grad", p.shape.clone())?;
        for id in self.leaves_of(p.index) {
            let r = TensorRef {
                stamp: self.stamp,
                id,
                shape: p.shape.clone(),
                watch: None,
            };
            acc.add_assign(&self.grad_of(&r)?)?;
        }
        Ok(acc)
    }

    /// Plain SGD on every parameter used in this forward pass: `w ← w − lr·grad`.
    pub fn sgd_step(&mut self, lr: f64) -> Result<()> {
        self.step(&mut Optimizer::sgd(lr)?)
    }

    /// One optimizer step on every trainable parameter used in this forward pass, from the last
    /// backward's gradients. On CUDA the update runs on the device, on the resident mirrors
    /// (the host copy is marked stale and synced on read). PyTorch: `optimizer.step()`.
    pub fn step(&mut self, opt: &mut Optimizer) -> Result<()> {
        if self.grads.is_none() {
            return Err(Self::no_backward("step"));
        }
        let uses = self.trainable_uses();
        let Some(grads) = &self.grads else {
            return Err(Self::no_backward("step"));
        };
        on_engine!(&mut self.engine,
            cpu(t) => {
                let grad = |l: usize| match grads {
                    Grads::Cpu(g) => g.get(l),
                    Grads::CpuParams(g) => g.get(&l),
                    Grads::Device(_) | Grads::DeviceParams(_) => None,
                };
                let all = uses
                    .iter()
                    .map(|(_, leaves)| leaves.iter().map(|&l| grad(l)).collect::<Option<Vec<_>>>())
                    .collect::<Option<Vec<Vec<&Tensor<T>>>>>()
                    .ok_or_else(|| Self::no_backward("step"))?;
                // The step's learning rate and clipping, from every gradient, before any update.
                let r = opt.begin_step_host(&all).and_then(|()| {
                    for ((index, _), gs) in uses.iter().zip(&all) {
                        let key = (self.params.session, *index);
                        let slot = &mut self.params.slots[*index];
                        // The new values over the old ones when the tape let go of them (a
                        // step that ends the pass), else in the tape's spare buffers (the old
                        // ones go there when the tape is cleared).
                        t.with_pool(|| opt.update_host(key, &mut slot.host, gs))
                            .map_err(|e| e.with_param_name(slot.name.as_deref()))?;
                    }
                    Ok(())
                });
                opt.end_step(r.is_ok());
                r?;
            },
            cuda(t) => {
                let grad = |l: usize| match grads {
                    Grads::Device(g) => g.get(l).map(AnyBuffer::buffer),
                    Grads::DeviceParams(g) => g.get(&l).map(AnyBuffer::buffer),
                    Grads::Cpu(_) | Grads::CpuParams(_) => None,
                };
                // The whole update runs on the device, on the resident mirrors.
                let items = uses
                    .iter()
                    .map(|(index, leaves)| {
                        let gs = leaves.iter().map(|&l| grad(l)).collect::<Option<Vec<Buffer>>>();
                        gs.map(|gs| (*index, gs)).ok_or_else(|| Self::no_backward("step"))
                    })
                    .collect::<Result<Vec<(usize, Vec<Buffer>)>>>()?;
                self.params.step_all_on_device(t.device_mut(), opt, &items)?;
            },
        );
        Ok(())
    }

    /// `opt`'s state for this session's parameters as named tensors (see
    /// [`StateDict`](crate::optim::StateDict); device state is read back). PyTorch:
    /// `optimizer.state_dict()`.
    pub fn optimizer_state(&self, opt: &Optimizer) -> Result<crate::optim::StateDict> {
        on_engine!(&self.engine,
            cpu(_) => crate::optim::export_state::<T, tl_tape_cuda::SimDevice>(opt, &self.params, None),
            cuda(t) => crate::optim::export_state(opt, &self.params, Some(t.device())),
        )
    }

    /// Load `state` (from [`Session::optimizer_state`], possibly of another session with the
    /// same parameter names) into `opt` for this session's parameters; on CUDA the buffers are
    /// uploaded. PyTorch: `optimizer.load_state_dict(...)`.
    pub fn load_optimizer_state(
        &mut self,
        opt: &mut Optimizer,
        state: &crate::optim::StateDict,
    ) -> Result<()> {
        on_engine!(&mut self.engine,
            cpu(_) => crate::optim::import_state::<T, tl_tape_cuda::SimDevice>(opt, &self.params, state, None),
            cuda(t) => crate::optim::import_state(opt, &self.params, state, Some(t.device_mut())),
        )
    }

    /// Release the optimizer's device state held on this session's device (CUDA only).
    pub fn release_optimizer_state(&mut self, opt: &mut Optimizer) -> usize {
        on_engine!(&mut self.engine, cpu(_) => 0, cuda(t) => opt.release_device_state(t.device_mut()))
    }
}

/// [`crate::train::reduce_leaves`] over a sparse backward's gradients (which hold every leaf
/// of `leaves`): moved into a slice indexed by leaf for the call, and back after it.
fn reduce_map<T: Scalar>(
    grads: &mut HashMap<usize, Tensor<T>>,
    leaves: &[usize],
    reduce: &mut dyn GradReducer<T>,
) -> Result<()> {
    let len = leaves.iter().max().map_or(0, |&l| l + 1);
    let mut dense = vec![Tensor::vector(Vec::new()); len];
    for &l in leaves {
        if let Some(g) = grads.remove(&l) {
            dense[l] = g;
        }
    }
    let r = crate::train::reduce_leaves(&mut dense, leaves, reduce);
    for (l, g) in dense.into_iter().enumerate() {
        if leaves.contains(&l) {
            grads.insert(l, g);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use tl_spec::Tensor;

    use crate::{Backend, Ops, Optimizer, Options, Session};

    /// On the CUDA tape the optimizer step never touches the host copy: it runs on the
    /// resident mirror (device primitives) and only marks the host copy stale.
    #[test]
    fn cuda_sim_steps_run_on_the_device_mirror_not_the_host() {
        let mut s = Session::<f32>::new(Options::backend(Backend::CudaSim)).unwrap();
        let p = s.param(Tensor::vector(vec![1.0, 2.0]), None, true).unwrap();
        let mut opt = Optimizer::adamw(0.1).unwrap();
        for _ in 0..2 {
            let w = s.use_param(&p).unwrap();
            let w2 = s.use_param(&p).unwrap();
            let y = s.mul(&w, &w2).unwrap();
            let l = s.sum(&y).unwrap();
            s.backward(&l).unwrap();
            s.step(&mut opt).unwrap();
            assert!(s.params.slots[0].host_stale);
            assert_eq!(s.params.slots[0].host.data(), &[1.0, 2.0], "host untouched");
            s.reset();
        }
        assert!(opt.state.values().all(|st| {
            st.bufs
                .iter()
                .all(|b| matches!(b, crate::optim::StateBuf::Device(_)))
        }));
        let v = s.param_value(&p).unwrap();
        assert_ne!(
            v.data(),
            &[1.0, 2.0],
            "the read synced the device's update back"
        );
        assert!(!s.params.slots[0].host_stale);
        s.release_optimizer_state(&mut opt);
    }
}
