//! [`Linear`]: `y = x·Wᵀ + b`. PyTorch: `nn.Linear`.

use tl_session::{Param, Train};
use tl_spec::Shape;

use super::At;
use crate::display::py_bool;
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// `y = x·Wᵀ + b` over the last axis: weight (out, in), bias (out), x (…, in) → (…, out).
/// Initialised as PyTorch does: `kaiming_uniform(a=√5)` weight, bias uniform in ±1/√in.
/// PyTorch: `nn.Linear(in, out, bias)`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// Weight (out, in), named `weight`.
    pub weight: Param,
    /// Bias (out), named `bias`, when the layer has one.
    pub bias: Option<Param>,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features with a bias.
    pub fn new<O: Train>(vars: &Vars<'_, O>, inputs: usize, outputs: usize) -> Result<Self> {
        Self::with_bias(vars, inputs, outputs, true)
    }

    /// A layer with or without a bias. PyTorch: `nn.Linear(in, out, bias=bias)`.
    pub fn with_bias<O: Train>(
        vars: &Vars<'_, O>,
        inputs: usize,
        outputs: usize,
        bias: bool,
    ) -> Result<Self> {
        check("Linear::new", inputs, outputs)?;
        let weight = vars.param("weight", &[outputs, inputs], Init::default_weight(inputs))?;
        let bias = if bias {
            Some(vars.param("bias", &[outputs], Init::default_bias(inputs))?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

/// An error naming `what` unless the layer has at least one input and one output feature.
fn check(what: &'static str, inputs: usize, outputs: usize) -> Result<()> {
    if inputs == 0 || outputs == 0 {
        return Err(usage(
            what,
            format!("need at least one input and one output feature, got {inputs} → {outputs}"),
        ));
    }
    Ok(())
}

impl Parameters for Linear {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        self.bias.visit_params(f);
    }
    fn extra_repr(&self) -> String {
        // A weight of another rank (a public field) prints as 0 features, not a panic.
        let dims = self.weight.shape().dims();
        let [outputs, inputs] = [0, 1].map(|i| dims.get(i).copied().unwrap_or(0));
        format!(
            "in_features={inputs}, out_features={outputs}, bias={}",
            py_bool(self.bias.is_some())
        )
    }
}

impl<O: Train> Module<O> for Linear {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let w = g.param(&self.weight)?;
        let at = At::new(g.rt, self, &self.weight);
        // The weight is a public field: checked as the constructor checks its sizes.
        const WHAT: &str = "Linear::forward";
        let d = at.param_dims(WHAT, "weight", &self.weight, 2..=2, "(out, in)")?;
        let (outputs, inputs) = (d[0], d[1]);
        check(WHAT, inputs, outputs).map_err(|e| at.op_error(e))?;
        let dims = x.dims().to_vec();
        match dims.last() {
            None => {
                return Err(at.input(format!(
                    "input {} is a scalar, expected (…, {inputs}) features",
                    x.shape()
                )));
            }
            Some(&n) if n != inputs => {
                // An image batch (N, C, H, W) whose C·H·W is the layer's width: not flattened.
                // (Saturating: an empty input's other axes may have a product past usize.)
                let fix = if dims.len() > 2 && Shape::saturating_product(&dims[1..]) == inputs {
                    format!(
                        "; flatten it to ({}, {inputs}) first (a Flatten layer, or x.flatten_batch())",
                        dims[0]
                    )
                } else {
                    String::new()
                };
                return Err(at.input(format!(
                    "input {} has {n} features, expected {inputs}{fix}",
                    x.shape()
                )));
            }
            Some(_) => {}
        }
        // The op takes (in) or (B, in); other ranks fold their leading axes into rows.
        // Exact: the last axis is `inputs` ≥ 1, so an empty input has its zero among these
        // axes (saturating only past a zero, never to a wrong count).
        let rows = Shape::saturating_product(&dims[..dims.len() - 1]);
        let x2 = if dims.len() <= 2 {
            x.clone()
        } else {
            x.reshape(&[rows, inputs])?
        };
        let y = match &self.bias {
            Some(b) => {
                let b = g.param(b)?;
                w.op("Linear::forward", &[&b, &x2], |s| {
                    s.linear(w.tensor_ref(), b.tensor_ref(), x2.tensor_ref())
                })
                .map_err(|e| at.op_error(e))?
            }
            None => {
                let x2 = if dims.len() == 1 {
                    x2.reshape(&[1, inputs])?
                } else {
                    x2
                };
                let y = x2.matmul(&w.transpose2d()?)?;
                if dims.len() == 1 {
                    y.reshape(&[outputs])?
                } else {
                    y
                }
            }
        };
        if dims.len() <= 2 {
            return Ok(y);
        }
        let mut out = dims;
        *out.last_mut().expect("rank > 2") = outputs;
        y.reshape(&out)
    }
}
