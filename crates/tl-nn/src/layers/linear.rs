//! [`Linear`]: `y = x·Wᵀ + b`. PyTorch: `nn.Linear`.

use tl_session::{Param, Train};

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
        if inputs == 0 || outputs == 0 {
            return Err(usage(
                "Linear::new",
                format!("need at least one input and one output feature, got {inputs} → {outputs}"),
            ));
        }
        let weight = vars.param("weight", &[outputs, inputs], Init::default_weight(inputs))?;
        let bias = if bias {
            Some(vars.param("bias", &[outputs], Init::default_bias(inputs))?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

impl Parameters for Linear {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
        self.bias.visit_params(f);
    }
    fn extra_repr(&self) -> String {
        let [outputs, inputs] = [0, 1].map(|i| self.weight.shape().dims()[i]);
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
        let (outputs, inputs) = (self.weight.shape().dims()[0], self.weight.shape().dims()[1]);
        let dims = x.dims().to_vec();
        let at = At::new(g.rt, self, &self.weight);
        match dims.last() {
            None => {
                return Err(at.input(format!(
                    "input {} is a scalar, expected (…, {inputs}) features",
                    x.shape()
                )));
            }
            Some(&n) if n != inputs => {
                // An image batch (N, C, H, W) whose C·H·W is the layer's width: not flattened.
                let fix = if dims.len() > 2 && dims[1..].iter().product::<usize>() == inputs {
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
        let rows: usize = dims[..dims.len() - 1].iter().product();
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
