//! The host update ([`Optimizer::update_host`]): a parameter stepped on the host from the
//! sum of its gradients, in f64 from its state stored in the parameter's type, written over
//! its old values where nothing else holds them; plain SGD in one pass, the stateful rules
//! [`HOST_BLOCK`] elements at a time.

use super::*;

impl Optimizer {
    /// Update a host tensor `w` from the sum of `grads` (one per use of the parameter, each of
    /// `w`'s shape), element for element in f64 exactly as [`Optimizer::update`] with
    /// [`HostOps`] computes it, from the state stored in `T` (widened exactly) to the new state
    /// rounded to `T` ([`StateBuf`]). Plain SGD (no momentum, no weight decay) runs as one pass that
    /// writes the new values, without the f64 copies of `w` and the gradient that the stateful
    /// rules need (the training-step hot path, docs/performance.md).
    pub fn update_host<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
    ) -> Result<()> {
        for g in grads {
            if g.shape() != w.shape() {
                return Err(crate::Error::Shape {
                    what: "optimizer step: gradient of a parameter",
                    expected: w.shape().clone(),
                    got: g.shape().clone(),
                });
            }
        }
        self.validate()?;
        if self.finite_check {
            // Transactional: run the step on a copy; commit only finite values.
            let saved = self.state.get(&key).cloned();
            let mut candidate = w.clone();
            let r =
                self.update_host_inner(key, &mut candidate, grads)
                    .and_then(|()| {
                        match candidate
                            .data()
                            .iter()
                            .position(|v| !v.as_f64().is_finite())
                        {
                            None => Ok(()),
                            Some(i) => Err(non_finite(
                                self.name(),
                                key,
                                i,
                                candidate.data()[i].as_f64(),
                            )),
                        }
                    });
            if r.is_err() {
                match saved {
                    Some(st) => self.state.insert(key, st),
                    None => self.state.remove(&key),
                };
                return r;
            }
            *w = candidate;
            return Ok(());
        }
        self.update_host_inner(key, w, grads)
    }

    fn update_host_inner<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
    ) -> Result<()> {
        let plain = matches!(self.kind, Kind::Sgd { momentum, .. } if momentum == 0.0)
            && self.weight_decay == 0.0
            && self.clip_value.is_none();
        if plain {
            // Norm clipping scales the gradient: folded into the coefficient.
            let c = -self.lr_now()? * self.grad_coef();
            self.state.entry(key).or_default().step += 1;
            let sum = |i: usize| grads.iter().fold(0.0, |s, g| s + g.data()[i].as_f64());
            // In place when nothing else holds w's values (a step that ends its pass:
            // `Train::backward_step_and_reset`), else into a new buffer. The loop runs at the
            // CPU's widest instruction set (the mlp step's largest loop).
            match (grads, w.unique_data_mut()) {
                ([g], Some(d)) => tl_tape_cpu::simd::zip_assign(d, g.data(), Axpy(c)),
                (_, Some(d)) => d
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = T::lit(v.as_f64() + c * sum(i))),
                ([g], None) => {
                    let new = tl_tape_cpu::simd::zip("sgd", w.data(), g.data(), Axpy(c))?;
                    *w = Tensor::new(w.shape().clone(), new)?;
                }
                (_, None) => {
                    let new = (w.data().iter().enumerate())
                        .map(|(i, &v)| T::lit(v.as_f64() + c * sum(i)))
                        .collect();
                    *w = Tensor::new(w.shape().clone(), new)?;
                }
            }
            return Ok(());
        }
        self.update_host_blocks(key, w, grads, HOST_BLOCK)
    }

    /// The stateful rules on the host, [`HOST_BLOCK`] elements (`block` here) at a time: each
    /// block's parameter values, gradient sum and state widened to f64, [`HostOps`]' formula
    /// run on them, the new values and state written back in the parameter's type (`w` in
    /// place when nothing else holds it). Every rule is element-wise, so the bits are those of
    /// one whole-vector update; the f64 copies are a block's, not the parameter's. A first step
    /// makes the state for every block (each block sees no state, as a whole-vector first step
    /// does). An error leaves `w` and the state as they were: with [`HostOps`] every error
    /// (the learning rate, state of a device) does not depend on the values, so it comes from
    /// the first block, before anything is written.
    fn update_host_blocks<T: Scalar>(
        &mut self,
        key: (u64, usize),
        w: &mut Tensor<T>,
        grads: &[&Tensor<T>],
        block: usize,
    ) -> Result<()> {
        let (n, block) = (w.numel(), block.max(1));
        let had = self.state.contains_key(&key);
        let mut st = self.state.remove(&key).unwrap_or_default();
        // On an error: the state as it was (none if there was none).
        let restore = |state: &mut HashMap<(u64, usize), ParamState>, st: ParamState| {
            if had {
                state.insert(key, st);
            }
        };
        let fresh = st.bufs.is_empty();
        // What a first step makes, whole (the blocks' parts copied in).
        let mut made: Vec<StateBuf> = Vec::new();
        let mut step;
        // The new values over the old ones when nothing else holds them, else into a new buffer
        // (not into a copy of the old values).
        let mut out = if w.unique_data_mut().is_some() {
            NewValues::InPlace(w.data_mut())
        } else {
            let new = tl_spec::alloc::try_with_capacity("optimizer step", "parameter", n)?;
            NewValues::Fresh {
                old: w.clone(),
                new,
            }
        };
        let mut lo = 0;
        loop {
            let hi = n.min(lo + block);
            let bufs = match fresh {
                true => Ok(Vec::new()),
                false => st.bufs.iter().map(|b| widened(b, lo..hi)).collect(),
            };
            let bufs = match bufs {
                Ok(b) => b,
                Err(e) => {
                    restore(&mut self.state, st);
                    return Err(e);
                }
            };
            self.state.insert(
                key,
                ParamState {
                    step: st.step,
                    bufs,
                },
            );
            let gv: Vec<f64> = (lo..hi)
                .map(|i| grads.iter().fold(0.0, |s, g| s + g.data()[i].as_f64()))
                .collect();
            let old = match &out {
                NewValues::InPlace(d) => &d[lo..hi],
                NewValues::Fresh { old, .. } => &old.data()[lo..hi],
            };
            let mut wv: Vec<f64> = old.iter().map(|v| v.as_f64()).collect();
            let r = self.update_inner(&mut HostOps, key, &mut wv, &gv);
            let mut done = self.state.remove(&key).unwrap_or_default();
            // The new state in the parameter's type, into the whole state.
            vec_ops::store_as::<T>(&mut done.bufs);
            let r = r.and_then(|()| {
                if fresh && lo == 0 {
                    made = done
                        .bufs
                        .iter()
                        .map(|b| zeros_as(b, n))
                        .collect::<Result<_>>()?;
                }
                let whole = if fresh { &mut made } else { &mut st.bufs };
                whole
                    .iter_mut()
                    .zip(&done.bufs)
                    .try_for_each(|(whole, part)| put_block(whole, lo, part))
            });
            if let Err(e) = r {
                restore(&mut self.state, st);
                return Err(e);
            }
            step = done.step;
            match &mut out {
                NewValues::InPlace(d) => (d[lo..hi].iter_mut())
                    .zip(wv)
                    .for_each(|(o, v)| *o = T::lit(v)),
                NewValues::Fresh { new, .. } => new.extend(wv.into_iter().map(T::lit)),
            }
            lo = hi;
            if lo >= n {
                break;
            }
        }
        if let NewValues::Fresh { new, .. } = out {
            *w = Tensor::new(w.shape().clone(), new)?;
        }
        if fresh {
            st.bufs = made;
        }
        st.step = step;
        self.state.insert(key, st);
        Ok(())
    }
}

/// Elements a stateful host update widens to f64 at a time ([`Optimizer::update_host`]): for
/// Adam the parameter, the gradient sum, the two moments and a temporary, 16 Ki elements each,
/// about 640 KiB, an L2-sized working set, where whole vectors of a large parameter would
/// stream through memory once per operation of the rule and be the step's largest allocation.
pub const HOST_BLOCK: usize = 1 << 14;

/// Where a host update writes a parameter's new values: over the old ones (nothing else holds
/// them), or into a new buffer beside them.
enum NewValues<'a, T> {
    /// The parameter's own elements.
    InPlace(&'a mut [T]),
    /// A share of the old values, read block by block, and the new buffer.
    Fresh { old: Tensor<T>, new: Vec<T> },
}

/// Elements `r` of a host state buffer, widened to f64 (exact); device state is the error
/// [`HostOps`] gives it.
fn widened(b: &StateBuf, r: std::ops::Range<usize>) -> Result<StateBuf> {
    match b {
        StateBuf::Host(v) => Ok(StateBuf::Host(v[r].to_vec())),
        StateBuf::HostF32(v) => Ok(StateBuf::Host(v[r].iter().map(|&x| f64::from(x)).collect())),
        StateBuf::Device(_) => {
            let mut b = b.clone();
            HostOps::state_mut(&mut b)?;
            Ok(b)
        }
    }
}

/// Zeros of `n` elements of `like`'s host kind (fallible: a first step's whole state).
fn zeros_as(like: &StateBuf, n: usize) -> Result<StateBuf> {
    const WHAT: &str = "optimizer state";
    Ok(match like {
        StateBuf::HostF32(_) => {
            StateBuf::HostF32(tl_spec::alloc::try_zeroed("optimizer step", WHAT, n)?)
        }
        _ => StateBuf::Host(tl_spec::alloc::try_zeroed("optimizer step", WHAT, n)?),
    })
}

/// Copy the block `part` into `whole` from element `lo` (the same host kind: the block was
/// stored as the whole is).
fn put_block(whole: &mut StateBuf, lo: usize, part: &StateBuf) -> Result<()> {
    match (whole, part) {
        (StateBuf::Host(w), StateBuf::Host(p)) => w[lo..lo + p.len()].copy_from_slice(p),
        (StateBuf::HostF32(w), StateBuf::HostF32(p)) => w[lo..lo + p.len()].copy_from_slice(p),
        _ => {
            return Err(Error::Usage {
                what: "optimizer step",
                detail: "a state block of another kind than the parameter's state".into(),
            });
        }
    }
    Ok(())
}

/// `w + c·g` in f64, rounded once to `T`: plain SGD's update of one element (`c = −lr`).
#[derive(Clone, Copy)]
struct Axpy(f64);

impl<T: Scalar> tl_tape_cpu::simd::Map2<T> for Axpy {
    #[inline(always)]
    fn at(self, w: T, g: T) -> T {
        T::lit(w.as_f64() + self.0 * g.as_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass SGD path of `update_host` gives bit for bit what the f64 `HostOps` path
    /// gives, for one gradient and for a parameter used twice; stateful rules still work.
    #[test]
    fn update_host_matches_the_f64_path() {
        let w = Tensor::<f32>::from_fn([5], |i| 0.3 * i as f32 - 0.71);
        let g1 = Tensor::<f32>::from_fn([5], |i| 0.17 - 0.09 * i as f32);
        let g2 = Tensor::<f32>::from_fn([5], |i| 1.0 / (i as f32 + 3.0));
        let reference = |grads: &[&Tensor<f32>], opt: &mut Optimizer| {
            let mut gv = vec![0.0f64; 5];
            for g in grads {
                gv.iter_mut()
                    .zip(g.data())
                    .for_each(|(a, b)| *a += f64::from(*b));
            }
            let mut wv: Vec<f64> = w.data().iter().map(|&v| f64::from(v)).collect();
            opt.update(&mut HostOps, (1, 0), &mut wv, &gv).unwrap();
            wv.into_iter().map(|v| v as f32).collect::<Vec<f32>>()
        };
        for grads in [vec![&g1], vec![&g1, &g2]] {
            for make in [
                || Optimizer::sgd(0.37).unwrap(),
                || Optimizer::momentum(0.1, 0.9).unwrap(),
            ] {
                let mut fast = w.clone();
                make().update_host((1, 0), &mut fast, &grads).unwrap();
                assert_eq!(fast.data(), reference(&grads, &mut make()).as_slice());
                assert_ne!(fast.data(), w.data(), "the step moved nothing");
            }
        }
        let mut bad = w.clone();
        let e = Optimizer::sgd(0.1)
            .unwrap()
            .update_host((1, 0), &mut bad, &[&Tensor::zeros([4])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("[5]") && e.contains("[4]"), "{e}");
    }

    /// The stateful rules updated a block at a time give the whole-vector update's bits, in
    /// f32 and f64, over several steps (the first one making the state), with one gradient and
    /// two, with weight decay and clipping; blocks of 1, 3 and 7 of 10 elements (a short last
    /// block) against one block of all.
    #[test]
    fn blocked_host_updates_give_the_whole_updates_bits() {
        type Make = fn() -> Optimizer;
        let rules: [Make; 8] = [
            || Optimizer::momentum(0.1, 0.9).unwrap(),
            || {
                Optimizer::momentum(0.1, 0.9)
                    .unwrap()
                    .dampening_nesterov(0.0, true)
                    .unwrap()
            },
            || {
                Optimizer::momentum(0.1, 0.8)
                    .unwrap()
                    .dampening_nesterov(0.3, false)
                    .unwrap()
                    .weight_decay(0.01)
                    .unwrap()
            },
            || Optimizer::adam(0.05).unwrap().clip_grad_value(0.4).unwrap(),
            || Optimizer::adamw(0.05).unwrap().weight_decay(0.1).unwrap(),
            || {
                Optimizer::rmsprop(0.01)
                    .unwrap()
                    .rmsprop_options(0.9, 1e-6, 0.5, true)
                    .unwrap()
            },
            || {
                Optimizer::adagrad(0.1)
                    .unwrap()
                    .adagrad_options(0.01, 1e-10, 0.1)
                    .unwrap()
            },
            || Optimizer::sgd(0.1).unwrap().weight_decay(0.02).unwrap(),
        ];
        type Run = (Vec<u64>, u64, Vec<StateBuf>);
        // `shared`: a share of w held across each update (as a pass's leaf holds it), so the
        // new values go to a new buffer and the share keeps the old ones.
        fn run<T: Scalar>(make: Make, block: usize, two: bool, shared: bool) -> Run {
            let mut w = Tensor::<T>::from_fn([10], |i| T::lit(0.3 * i as f64 - 1.1));
            let mut opt = make();
            for k in 0..3 {
                let held = shared.then(|| (w.clone(), w.data().to_vec()));
                let g1 = Tensor::<T>::from_fn([10], |i| {
                    T::lit(((i * 7 + k * 3) % 11) as f64 * 0.13 - 0.6)
                });
                let g2 = Tensor::<T>::from_fn([10], |i| T::lit(0.05 * i as f64 - 0.2));
                let grads: Vec<&Tensor<T>> = if two { vec![&g1, &g2] } else { vec![&g1] };
                opt.update_host_blocks((1, 0), &mut w, &grads, block)
                    .unwrap();
                if let Some((share, before)) = held {
                    assert_eq!(share.data(), &before[..], "the held share moved");
                    assert!(!w.shares_storage_with(&share));
                }
            }
            let st = &opt.state[&(1, 0)];
            let w = w.data().iter().map(|v| v.as_f64().to_bits()).collect();
            (w, st.step, st.bufs.clone())
        }
        for make in rules {
            for two in [false, true] {
                let (whole32, whole64) = (
                    run::<f32>(make, 10, two, false),
                    run::<f64>(make, 10, two, false),
                );
                assert_eq!(whole32.1, 3);
                assert!(matches!(whole32.2[..], [StateBuf::HostF32(_), ..] | []));
                assert!(matches!(whole64.2[..], [StateBuf::Host(_), ..] | []));
                for block in [1, 3, 7] {
                    let what = format!("{} block {block} two {two}", make().rule_name());
                    for shared in [false, true] {
                        assert_eq!(run::<f32>(make, block, two, shared), whole32, "{what}");
                        assert_eq!(run::<f64>(make, block, two, shared), whole64, "{what}");
                    }
                }
            }
        }
        // An error (device state on the host) leaves the parameter and the state as they were.
        let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
        let mut sim = tl_tape_cuda::SimDevice::default();
        let dev = StateBuf::Device(tl_tape_cuda::Device::zeros(&mut sim, 10).unwrap());
        opt.state.insert(
            (1, 0),
            ParamState {
                step: 4,
                bufs: vec![dev.clone()],
            },
        );
        let mut w = Tensor::<f32>::from_fn([10], |i| i as f32);
        let g = Tensor::<f32>::zeros([10]);
        assert!(opt.update_host_blocks((1, 0), &mut w, &[&g], 3).is_err());
        assert_eq!(w.data(), Tensor::<f32>::from_fn([10], |i| i as f32).data());
        assert_eq!(opt.state[&(1, 0)].step, 4);
        assert_eq!(opt.state[&(1, 0)].bufs, vec![dev]);
    }

    /// The host state of an f32 parameter is f32 (PyTorch's and the device's type): each step
    /// is the f64 formula from the widened state, the new state rounded once to f32; an f64
    /// parameter keeps f64 state. Several steps, so a state kept in f64 would drift from it.
    #[test]
    fn f32_parameters_keep_f32_state() {
        let w0 = Tensor::<f32>::from_fn([7], |i| 0.3 * i as f32 - 0.71);
        let grad =
            |k: usize| Tensor::<f32>::from_fn([7], |i| ((i * 5 + k * 3) % 11) as f32 * 0.13 - 0.6);
        for make in [
            || Optimizer::adamw(0.05).unwrap(),
            || Optimizer::momentum(0.1, 0.9).unwrap(),
            || Optimizer::rmsprop(0.01).unwrap(),
        ] {
            let (mut opt, mut w) = (make(), w0.clone());
            // The reference: HostOps on f64 vectors, the state rounded to f32 after each step.
            let (mut reference, mut wr) = (make(), w0.clone());
            for k in 0..4 {
                let g = grad(k);
                opt.update_host((1, 0), &mut w, &[&g]).unwrap();
                let mut wv: Vec<f64> = wr.data().iter().map(|&v| f64::from(v)).collect();
                let gv: Vec<f64> = g.data().iter().map(|&v| f64::from(v)).collect();
                reference
                    .update(&mut HostOps, (1, 0), &mut wv, &gv)
                    .unwrap();
                for b in &mut reference.state.get_mut(&(1, 0)).unwrap().bufs {
                    let StateBuf::Host(v) = b else {
                        panic!("f64 state")
                    };
                    v.iter_mut().for_each(|x| *x = f64::from(*x as f32));
                }
                wr = Tensor::new(wr.shape().clone(), wv.iter().map(|&v| v as f32).collect())
                    .unwrap();
                assert_eq!(w.data(), wr.data(), "{} step {k}", opt.rule_name());
            }
            let st = &opt.state[&(1, 0)];
            assert!(!st.bufs.is_empty());
            for (b, r) in st.bufs.iter().zip(&reference.state[&(1, 0)].bufs) {
                let (StateBuf::HostF32(v), StateBuf::Host(r)) = (b, r) else {
                    panic!("{}: an f32 parameter's state is {b:?}", opt.rule_name())
                };
                assert!(v.iter().zip(r).all(|(&a, &b)| f64::from(a) == b));
            }
            // An f64 parameter's state stays f64.
            let mut w64 = Tensor::<f64>::from_fn([7], |i| 0.3 * i as f64 - 0.71);
            let g64 = Tensor::<f64>::from_fn([7], |i| 0.1 * i as f64 - 0.2);
            let mut opt64 = make();
            opt64.update_host((1, 0), &mut w64, &[&g64]).unwrap();
            opt64.update_host((1, 0), &mut w64, &[&g64]).unwrap();
            assert!(
                opt64.state[&(1, 0)]
                    .bufs
                    .iter()
                    .all(|b| matches!(b, StateBuf::Host(_)))
            );
        }
    }
}
