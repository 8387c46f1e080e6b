//! Optimizer state export and import (PyTorch: `optimizer.state_dict()` /
//! `load_state_dict`): named tensors per parameter, so a resumed run continues the exact
//! trajectory.
//!
//! Names are `<rule>.<what>.<param>`: `<rule>` is `sgd` (plain and momentum SGD), `adam` or
//! `adamw`; `<what>` is `step` (a scalar: the parameter's step count), `momentum_buffer` (SGD
//! with momentum), `m` and `v` (Adam's moments); `<param>` is the parameter's name, or its index
//! when it has none. Values are f64 tensors of the parameter's shape: host state (CPU and linked
//! sessions) round-trips bit for bit; device state is f32 and widens exactly.

use std::collections::BTreeMap;

use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::Device;

use super::{Kind, Optimizer, ParamState, StateBuf};
use crate::params::ParamStore;
use crate::{Error, Result};

/// Named optimizer state tensors (PyTorch: `optimizer.state_dict()`), in name order.
pub type StateDict = BTreeMap<String, Tensor<f64>>;

impl Optimizer {
    /// The rule's name in state names: `sgd`, `adam` or `adamw`.
    pub fn rule_name(&self) -> &'static str {
        match self.kind {
            Kind::Sgd { .. } => "sgd",
            Kind::Adam {
                decoupled: false, ..
            } => "adam",
            Kind::Adam {
                decoupled: true, ..
            } => "adamw",
        }
    }

    /// The names of the per-parameter buffers, in the order the update keeps them.
    fn buffer_names(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Sgd { momentum, .. } if momentum != 0.0 => &["momentum_buffer"],
            Kind::Sgd { .. } => &[],
            Kind::Adam { .. } => &["m", "v"],
        }
    }
}

/// How a parameter is named in state names: its name, or its index when it has none.
fn labels<T: Scalar>(params: &ParamStore<T>) -> Result<Vec<String>> {
    let labels: Vec<String> = params
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| s.name.clone().unwrap_or_else(|| i.to_string()))
        .collect();
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = labels.iter().find(|l| !seen.insert(l.as_str())) {
        return Err(Error::Usage {
            what: "optimizer state",
            detail: format!("two parameters are named {dup:?}: state names would collide"),
        });
    }
    Ok(labels)
}

/// Export `opt`'s state for the parameters of `params` (device state read from `dev`).
pub(crate) fn export<T: Scalar, D: Device>(
    opt: &Optimizer,
    params: &ParamStore<T>,
    dev: Option<&D>,
) -> Result<StateDict> {
    let rule = opt.rule_name();
    let mut out = StateDict::new();
    for (index, label) in labels(params)?.into_iter().enumerate() {
        let Some(st) = opt.state.get(&(params.session, index)) else {
            continue;
        };
        let shape = params.shape(index).clone();
        out.insert(
            format!("{rule}.step.{label}"),
            Tensor::scalar(st.step as f64),
        );
        for (name, buf) in opt.buffer_names().iter().zip(&st.bufs) {
            let data = match (buf, dev) {
                (StateBuf::Host(v), _) => v.clone(),
                (StateBuf::Device(b), Some(dev)) => {
                    dev.download(*b)?.into_iter().map(f64::from).collect()
                }
                (StateBuf::Device(_), None) => {
                    return Err(Error::Usage {
                        what: "optimizer state export",
                        detail: "the state is on a device, but this session has none".into(),
                    });
                }
            };
            out.insert(
                format!("{rule}.{name}.{label}"),
                Tensor::new(shape.clone(), data)?,
            );
        }
    }
    Ok(out)
}

/// Replace `opt`'s state for the parameters of `params` with `state` (uploaded to `dev` when
/// given). Every entry must be used: a name for another rule or an unknown parameter is an
/// error, as is a missing buffer or a wrong shape; on error `opt` is unchanged.
pub(crate) fn import<T: Scalar, D: Device>(
    opt: &mut Optimizer,
    params: &ParamStore<T>,
    state: &StateDict,
    mut dev: Option<&mut D>,
) -> Result<()> {
    let rule = opt.rule_name();
    let mut used = std::collections::HashSet::new();
    let mut host: Vec<(usize, u64, Vec<Vec<f64>>)> = Vec::new();
    for (index, label) in labels(params)?.into_iter().enumerate() {
        let step_key = format!("{rule}.step.{label}");
        let Some(step) = state.get(&step_key) else {
            continue;
        };
        used.insert(step_key);
        let step = step.item()?;
        if !(step >= 0.0 && step.fract() == 0.0) {
            return Err(Error::Usage {
                what: "optimizer state import",
                detail: format!("{rule}.step.{label} = {step} is not a step count"),
            });
        }
        let shape: &Shape = params.shape(index);
        let mut bufs = Vec::new();
        for name in opt.buffer_names() {
            let key = format!("{rule}.{name}.{label}");
            let t = state.get(&key).ok_or_else(|| Error::Usage {
                what: "optimizer state import",
                detail: format!("{key} is missing (the state has {rule}.step.{label})"),
            })?;
            if t.shape() != shape {
                return Err(Error::Shape {
                    what: "optimizer state import",
                    expected: shape.clone(),
                    got: t.shape().clone(),
                });
            }
            bufs.push(t.data().to_vec());
            used.insert(key);
        }
        host.push((index, step as u64, bufs));
    }
    if used.len() != state.len() {
        let unknown: Vec<&String> = state.keys().filter(|k| !used.contains(*k)).collect();
        return Err(Error::Usage {
            what: "optimizer state import",
            detail: format!(
                "entries not for this {rule} optimizer or these parameters: {unknown:?}"
            ),
        });
    }
    let mut fresh = Vec::with_capacity(host.len());
    for (index, step, bufs) in host {
        let mut st = ParamState {
            step,
            bufs: Vec::new(),
        };
        for b in bufs {
            st.bufs.push(match dev.as_deref_mut() {
                None => StateBuf::Host(b),
                Some(dev) => {
                    let f: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                    match dev.upload(&f) {
                        Ok(buf) => StateBuf::Device(buf),
                        Err(e) => {
                            // Nothing was installed: free what this import uploaded.
                            let done = fresh.iter().map(|(_, s): &(_, ParamState)| s);
                            for s in done.chain(std::iter::once(&st)) {
                                release(&s.bufs, dev);
                            }
                            return Err(e.into());
                        }
                    }
                }
            });
        }
        fresh.push(((params.session, index), st));
    }
    for (key, st) in fresh {
        if let (Some(old), Some(dev)) = (opt.state.insert(key, st), dev.as_deref_mut()) {
            release(&old.bufs, dev);
        }
    }
    Ok(())
}

fn release<D: Device>(bufs: &[StateBuf], dev: &mut D) {
    for b in bufs {
        if let StateBuf::Device(b) = b {
            dev.release(*b);
        }
    }
}
