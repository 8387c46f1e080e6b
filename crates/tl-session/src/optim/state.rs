//! Optimizer state export and import (PyTorch: `optimizer.state_dict()` /
//! `load_state_dict`): named tensors per parameter, so a resumed run continues the exact
//! trajectory.
//!
//! Names are `<rule>.<what>.<param>`: `<rule>` is `sgd` (plain and momentum SGD), `adam`,
//! `adamw`, `rmsprop` or `adagrad`; `<what>` is `step` (a scalar, shape `[]`: the parameter's step count),
//! `momentum_buffer` (SGD with momentum, RMSprop with momentum), `m` and `v` (Adam's moments),
//! `square_avg` and `grad_avg` (RMSprop; the latter when centered), `sum` (Adagrad);
//! `<param>` is the parameter's name, or its index when it has none. An optimizer with a
//! learning-rate schedule adds `lr_scheduler.last_epoch` (a scalar, shape `[]`: the steps done, the
//! schedule's position). Values are f64 tensors of the parameter's shape. Beside them, every
//! export holds the rule's hyper-parameters as scalars named `<rule>.<name>` (`adamw.lr`,
//! `sgd.momentum`; [`Optimizer::hyper_parameters`]), which an import puts in place of the
//! optimizer's, as PyTorch's `load_state_dict` does with its `param_groups` (set a field after
//! the import to change one on resuming). State is kept in the
//! parameter's type (f32 state for f32 parameters, on the host as on a device): it widens
//! exactly, and an import into an f32 session rounds each value to f32, so a state exported
//! from a session of the same type round-trips bit for bit.
//!
//! Import validates before anything changes: every value finite and of magnitude at most
//! [`STATE_BOUND`] (`f32::MAX`: what a float32 run can hold; a larger moment, 1e300 say, would
//! overflow the next update), second moments and accumulators (`v`, `square_avg`, `sum`) ≥ 0,
//! step counts 0-d tensors (shape `[]`, as PyTorch's `state_dict()` stores `step`) holding
//! whole numbers in `[0, 2^53]`, shapes those of the parameters, the hyper-parameters all of the
//! rule's or none, each valid for it ([`Optimizer::validate`]); the state of another rule (an
//! Adam state into an SGD optimizer) is refused naming both.

use std::collections::BTreeMap;

use tl_spec::alloc::{try_collect, try_copy};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cuda::Device;

use super::{Kind, Optimizer, ParamState, StateBuf};
use crate::params::ParamStore;
use crate::{Error, Result};

/// Named optimizer state tensors (PyTorch: `optimizer.state_dict()`), in name order.
pub type StateDict = BTreeMap<String, Tensor<f64>>;

/// The largest magnitude an imported state value may have: `f32::MAX` (≈ 3.4e38).
pub const STATE_BOUND: f64 = f32::MAX as f64;

/// The largest imported step count: 2^53, beyond which f64 no longer counts whole numbers.
const MAX_STEP: f64 = 9_007_199_254_740_992.0;

/// The name of the schedule's position in a state dict.
const SCHEDULE_KEY: &str = "lr_scheduler.last_epoch";

impl Optimizer {
    /// The rule's name in state names: `sgd`, `adam`, `adamw`, `rmsprop` or `adagrad`.
    pub fn rule_name(&self) -> &'static str {
        match self.kind {
            Kind::Sgd { .. } => "sgd",
            Kind::Adam {
                decoupled: false, ..
            } => "adam",
            Kind::Adam {
                decoupled: true, ..
            } => "adamw",
            Kind::RmsProp { .. } => "rmsprop",
            Kind::Adagrad { .. } => "adagrad",
        }
    }

    /// The names of the per-parameter buffers, in the order the update keeps them, each with
    /// whether its values must be ≥ 0 (second moments, accumulators).
    fn buffer_names(&self) -> &'static [(&'static str, bool)] {
        buffer_names(self.kind)
    }
}

/// [`Optimizer::buffer_names`] of a rule.
fn buffer_names(kind: Kind) -> &'static [(&'static str, bool)] {
    const SQ: (&str, bool) = ("square_avg", true);
    const MOM: (&str, bool) = ("momentum_buffer", false);
    const AVG: (&str, bool) = ("grad_avg", false);
    match kind {
        Kind::Sgd { momentum, .. } if momentum != 0.0 => &[MOM],
        Kind::Sgd { .. } => &[],
        Kind::Adam { .. } => &[("m", false), ("v", true)],
        Kind::RmsProp {
            momentum, centered, ..
        } => match (momentum > 0.0, centered) {
            (false, false) => &[SQ],
            (true, false) => &[SQ, MOM],
            (false, true) => &[SQ, AVG],
            (true, true) => &[SQ, MOM, AVG],
        },
        Kind::Adagrad { .. } => &[("sum", true)],
    }
}

/// An import error naming the entry and what is wrong with it.
fn refuse(key: &str, detail: String) -> Error {
    Error::Usage {
        what: "optimizer state import",
        detail: format!("{key}: {detail}"),
    }
}

/// A step count: a 0-d tensor (shape `[]`, as PyTorch's `state_dict()` stores `step` and as
/// [`export`] writes it) holding a whole number in `[0, 2^53]`.
fn step_count(key: &str, t: &Tensor<f64>) -> Result<u64> {
    if t.shape().rank() != 0 {
        return Err(refuse(
            key,
            format!(
                "shape {} is not a step count's: it must be a scalar (shape [])",
                t.shape()
            ),
        ));
    }
    let v = t.data()[0];
    if !(v.is_finite() && (0.0..=MAX_STEP).contains(&v) && v.fract() == 0.0) {
        return Err(refuse(
            key,
            format!(
                "{} is not a step count (a whole number in [0, 2^53])",
                shown(v)
            ),
        ));
    }
    Ok(v as u64)
}

/// `v` as a message prints it: `1e300` rather than 301 digits.
fn shown(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-6..1e16).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// A state buffer's values: finite, |x| ≤ [`STATE_BOUND`], and ≥ 0 when `non_negative`.
fn check_values(key: &str, data: &[f64], non_negative: bool) -> Result<()> {
    for (i, &v) in data.iter().enumerate() {
        if !v.is_finite() || v.abs() > STATE_BOUND {
            return Err(refuse(
                key,
                format!(
                    "element {i} is {}: state values must be finite with magnitude ≤ {STATE_BOUND:e}",
                    shown(v)
                ),
            ));
        }
        if non_negative && v < 0.0 {
            return Err(refuse(
                key,
                format!(
                    "element {i} is {}: this running sum of squares must be ≥ 0",
                    shown(v)
                ),
            ));
        }
    }
    Ok(())
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

/// What an export's allocation errors name.
const WHAT: &str = "optimizer state export";

/// Export `opt`'s state for the parameters of `params` (device state read from `dev`).
pub(crate) fn export<T: Scalar, D: Device>(
    opt: &Optimizer,
    params: &ParamStore<T>,
    dev: Option<&D>,
) -> Result<StateDict> {
    let rule = opt.rule_name();
    let mut out = StateDict::new();
    for (name, v) in opt.hyper_parameters() {
        out.insert(format!("{rule}.{name}"), Tensor::scalar(v));
    }
    for (index, label) in labels(params)?.into_iter().enumerate() {
        let Some(st) = opt.state.get(&(params.session, index)) else {
            continue;
        };
        let shape = params.shape(index).clone();
        out.insert(
            format!("{rule}.step.{label}"),
            Tensor::scalar(st.step as f64),
        );
        for ((name, _), buf) in opt.buffer_names().iter().zip(&st.bufs) {
            let data = match (buf, dev) {
                (StateBuf::Host(v), _) => try_copy(WHAT, name, v)?,
                (StateBuf::HostF32(v), _) => {
                    try_collect(WHAT, name, v.len(), v.iter().map(|&x| f64::from(x)))?
                }
                (StateBuf::Device(b), Some(dev)) => {
                    let v = dev.download(*b)?;
                    try_collect(WHAT, name, v.len(), v.into_iter().map(f64::from))?
                }
                (StateBuf::Device(_), None) => {
                    return Err(Error::Usage {
                        what: WHAT,
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
    if opt.schedule.is_some() {
        out.insert(SCHEDULE_KEY.into(), Tensor::scalar(opt.steps as f64));
    }
    Ok(out)
}

/// Replace `opt`'s hyper-parameters ([`super::hyper`]) and its state for the parameters of
/// `params` with `state`'s (uploaded to `dev` when given). Every entry must be used: a state
/// for another rule, a name for an unknown parameter, a missing buffer or a wrong shape is an
/// error; on error `opt` is unchanged.
pub(crate) fn import<T: Scalar, D: Device>(
    opt: &mut Optimizer,
    params: &ParamStore<T>,
    state: &StateDict,
    mut dev: Option<&mut D>,
) -> Result<()> {
    let rule = opt.rule_name();
    other_rule(rule, state)?;
    let mut used = std::collections::HashSet::new();
    let hyper = super::hyper::read(opt, state, &mut used)?;
    // The buffers are those of the rule with the state's hyper-parameters (SGD's and
    // RMSprop's momentum, RMSprop's centering decide which it keeps).
    let kind = hyper.map_or(opt.kind, |(_, _, kind)| kind);
    let names = buffer_names(kind);
    let mut host: Vec<(usize, u64, Vec<Vec<f64>>)> = Vec::new();
    for (index, label) in labels(params)?.into_iter().enumerate() {
        let step_key = format!("{rule}.step.{label}");
        let Some(step) = state.get(&step_key) else {
            continue;
        };
        let step = step_count(&step_key, step)?;
        used.insert(step_key);
        let shape: &Shape = params.shape(index);
        let mut bufs = Vec::new();
        for &(name, non_negative) in names {
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
            check_values(&key, t.data(), non_negative)?;
            bufs.push(t.data().to_vec());
            used.insert(key);
        }
        host.push((index, step, bufs));
    }
    let schedule_steps = match state.get(SCHEDULE_KEY) {
        None => None,
        Some(_) if opt.schedule.is_none() => {
            return Err(refuse(
                SCHEDULE_KEY,
                "the state has a learning-rate schedule's position, but this optimizer has no schedule".into(),
            ));
        }
        Some(t) => {
            used.insert(SCHEDULE_KEY.to_owned());
            Some(step_count(SCHEDULE_KEY, t)?)
        }
    };
    if used.len() != state.len() {
        let unknown: Vec<&String> = state.keys().filter(|k| !used.contains(*k)).collect();
        return Err(Error::Usage {
            what: "optimizer state import",
            detail: format!(
                "entries not for this {rule} optimizer or these parameters: {unknown:?}"
            ),
        });
    }
    if names != opt.buffer_names()
        && let Some(index) = (opt.state.keys())
            .filter(|(session, _)| *session == params.session)
            .map(|&(_, index)| index)
            .find(|i| !host.iter().any(|(h, ..)| h == i))
    {
        return Err(Error::Usage {
            what: "optimizer state import",
            detail: format!(
                "the state's hyper-parameters change which buffers this {rule} optimizer keeps \
                 ({:?} -> {:?}), but it holds state for parameter {index}, which the state does \
                 not cover: load into an optimizer without state",
                opt.buffer_names().iter().map(|b| b.0).collect::<Vec<_>>(),
                names.iter().map(|b| b.0).collect::<Vec<_>>(),
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
        super::vec_ops::store_as::<T>(&mut st.bufs);
        fresh.push(((params.session, index), st));
    }
    for (key, st) in fresh {
        if let (Some(old), Some(dev)) = (opt.state.insert(key, st), dev.as_deref_mut()) {
            release(&old.bufs, dev);
        }
    }
    if let Some(n) = schedule_steps {
        opt.steps = n;
    }
    if let Some((lr, weight_decay, kind)) = hyper {
        opt.lr = lr;
        opt.weight_decay = weight_decay;
        opt.kind = kind;
    }
    Ok(())
}

/// The rules' names in state names.
const RULES: [&str; 5] = ["sgd", "adam", "adamw", "rmsprop", "adagrad"];

/// An error when `state` holds another rule's entries and none of `rule`'s: the state of an
/// Adam optimizer loaded into an SGD one, say.
fn other_rule(rule: &str, state: &StateDict) -> Result<()> {
    fn rule_of(k: &str) -> Option<&str> {
        k.split('.').next().filter(|r| RULES.contains(r))
    }
    if state.keys().any(|k| rule_of(k) == Some(rule)) {
        return Ok(());
    }
    match state.keys().find_map(|k| rule_of(k)) {
        None => Ok(()),
        Some(other) => Err(Error::Usage {
            what: "optimizer state import",
            detail: format!(
                "the state is for the {other} rule, not this optimizer's {rule} (entries {:?})",
                state.keys().take(4).collect::<Vec<_>>()
            ),
        }),
    }
}

fn release<D: Device>(bufs: &[StateBuf], dev: &mut D) {
    for b in bufs {
        if let StateBuf::Device(b) = b {
            dev.release(*b);
        }
    }
}
