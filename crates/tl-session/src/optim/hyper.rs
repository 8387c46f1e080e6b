//! An optimizer's hyper-parameters by name (PyTorch: the `param_groups` of
//! `optimizer.state_dict()`), which the exported state holds beside the per-parameter buffers
//! so that a run resumed from it takes the same steps whatever optimizer it was loaded into.
//!
//! Names are `<rule>.<name>` (`adamw.lr`, `sgd.momentum`): the rule's `lr` and `weight_decay`,
//! then its own ([`Optimizer::hyper_parameters`]); each a 0-d f64 tensor, a flag (`nesterov`,
//! `centered`) as 0 or 1. An import that holds them replaces the optimizer's, as PyTorch's
//! `load_state_dict` replaces its `param_groups`: all of the rule's or none (a state without
//! them, from before they were exported, keeps the optimizer's own), each a scalar, a flag 0
//! or 1, the whole set valid for the rule ([`Optimizer::validate`]'s ranges). The training
//! controls that travel with the optimizer (clipping, the schedule, the finite checks) are
//! not hyper-parameters of the rule and stay as the optimizer was built; the schedule's
//! position is state (`lr_scheduler.last_epoch`).

use std::collections::HashSet;

use super::{Kind, Optimizer, StateDict};
use crate::{Error, Result};

/// The hyper-parameters that are flags (0 or 1).
const FLAGS: [&str; 2] = ["nesterov", "centered"];

/// A flag as a hyper-parameter value.
fn flag(on: bool) -> f64 {
    if on { 1.0 } else { 0.0 }
}

/// `kind`'s own hyper-parameters (besides `lr` and `weight_decay`), by name, in a fixed order.
fn of_kind(kind: Kind) -> Vec<(&'static str, f64)> {
    match kind {
        Kind::Sgd {
            momentum,
            dampening,
            nesterov,
        } => vec![
            ("momentum", momentum),
            ("dampening", dampening),
            ("nesterov", flag(nesterov)),
        ],
        Kind::Adam {
            beta1, beta2, eps, ..
        } => vec![("beta1", beta1), ("beta2", beta2), ("eps", eps)],
        Kind::RmsProp {
            alpha,
            eps,
            momentum,
            centered,
        } => vec![
            ("alpha", alpha),
            ("eps", eps),
            ("momentum", momentum),
            ("centered", flag(centered)),
        ],
        Kind::Adagrad {
            lr_decay,
            eps,
            initial_accumulator_value,
        } => vec![
            ("lr_decay", lr_decay),
            ("eps", eps),
            ("initial_accumulator_value", initial_accumulator_value),
        ],
    }
}

/// `kind` with its own hyper-parameters replaced by `v`, in [`of_kind`]'s order (`kind`
/// itself when `v` has another length: not reached, the caller reads every name).
fn with_values(kind: Kind, v: &[f64]) -> Kind {
    match (kind, v) {
        (Kind::Sgd { .. }, &[momentum, dampening, nesterov]) => Kind::Sgd {
            momentum,
            dampening,
            nesterov: nesterov == 1.0,
        },
        (Kind::Adam { decoupled, .. }, &[beta1, beta2, eps]) => Kind::Adam {
            beta1,
            beta2,
            eps,
            decoupled,
        },
        (Kind::RmsProp { .. }, &[alpha, eps, momentum, centered]) => Kind::RmsProp {
            alpha,
            eps,
            momentum,
            centered: centered == 1.0,
        },
        (Kind::Adagrad { .. }, &[lr_decay, eps, initial_accumulator_value]) => Kind::Adagrad {
            lr_decay,
            eps,
            initial_accumulator_value,
        },
        _ => kind,
    }
}

impl Optimizer {
    /// The rule's hyper-parameters by name, as the exported state names them after
    /// `<rule>.`: `lr`, `weight_decay`, then SGD's `momentum`, `dampening`, `nesterov`; Adam's
    /// and AdamW's `beta1`, `beta2`, `eps`; RMSprop's `alpha`, `eps`, `momentum`, `centered`;
    /// Adagrad's `lr_decay`, `eps`, `initial_accumulator_value`. Flags are 0 or 1. PyTorch:
    /// `optimizer.param_groups[0]`.
    pub fn hyper_parameters(&self) -> Vec<(&'static str, f64)> {
        let mut v = vec![("lr", self.lr), ("weight_decay", self.weight_decay)];
        v.extend(of_kind(self.kind));
        v
    }
}

/// The hyper-parameters a state holds for `opt`'s rule: `None` when it holds none of them,
/// else the learning rate, the weight decay and the rule with the state's values, checked
/// (every one present, a scalar, a flag 0 or 1, the set valid for the rule). Each name read
/// goes into `used`.
pub(crate) fn read(
    opt: &Optimizer,
    state: &StateDict,
    used: &mut HashSet<String>,
) -> Result<Option<(f64, f64, Kind)>> {
    let rule = opt.rule_name();
    let names = opt.hyper_parameters();
    let key = |name: &str| format!("{rule}.{name}");
    let Some(present) = names.iter().find(|(n, _)| state.contains_key(&key(n))) else {
        return Ok(None);
    };
    let refuse = |k: &str, detail: String| Error::Usage {
        what: "optimizer state import",
        detail: format!("{k}: {detail}"),
    };
    let mut values = Vec::with_capacity(names.len());
    for &(name, _) in &names {
        let k = key(name);
        let t = state.get(&k).ok_or_else(|| Error::Usage {
            what: "optimizer state import",
            detail: format!(
                "{k} is missing (the state has {}: a rule's hyper-parameters come all or none)",
                key(present.0)
            ),
        })?;
        if t.shape().rank() != 0 {
            return Err(refuse(
                &k,
                format!(
                    "shape {} is not a hyper-parameter's: it must be a scalar (shape [])",
                    t.shape()
                ),
            ));
        }
        let v = t.data()[0];
        if FLAGS.contains(&name) && v != 0.0 && v != 1.0 {
            return Err(refuse(&k, format!("{v} is not a flag (0 or 1)")));
        }
        values.push(v);
        used.insert(k);
    }
    let (lr, weight_decay) = (values[0], values[1]);
    let kind = with_values(opt.kind, &values[2..]);
    // The rule's ranges: the same checks as building the optimizer.
    Optimizer::with(lr, weight_decay, kind).map_err(|e| Error::Usage {
        what: "optimizer state import",
        detail: format!("the state's hyper-parameters: {e}"),
    })?;
    Ok(Some((lr, weight_decay, kind)))
}
