//! [`PRelu`], the activation with a learned slope. PyTorch: `nn.PReLU`.
//!
//! The parameter-free activations are [`Activation`](crate::Activation).

use tl_session::{Param, Train};

use super::At;
use crate::error::usage;
use crate::{Init, Module, Parameters, Result, Var, Vars};

/// `x` for x > 0, else `a·x`, with a learned slope `a` named `weight`: one slope shared by
/// every element (`num_parameters` = 1) or one per channel (axis 1 of an input of rank ≥ 2),
/// initialised to `init` (PyTorch's default 0.25). PyTorch: `nn.PReLU(num_parameters=1,
/// init=0.25)`.
///
/// Computed as `relu(x) + a·(x − relu(x))`: the value and both gradients are PyTorch's,
/// x = 0 included (the input's gradient is `a·g` there, relu's derivative at 0 being 0; the
/// slope's `Σ g·min(x, 0)`), each op's gradient checked by the harness, the layer against
/// `max(x, 0) + a·min(x, 0)` (tl-conformance's `nn_layers::`).
#[derive(Debug, Clone)]
pub struct PRelu {
    /// The slopes (num_parameters), named `weight`.
    pub weight: Param,
}

impl PRelu {
    /// `num_parameters` slopes (1, or the input's channels), each 0.25 (PyTorch's default).
    pub fn new<O: Train>(vars: &Vars<'_, O>, num_parameters: usize) -> Result<Self> {
        Self::with_init(vars, num_parameters, 0.25)
    }

    /// `num_parameters` slopes, each `init` (finite).
    pub fn with_init<O: Train>(
        vars: &Vars<'_, O>,
        num_parameters: usize,
        init: f64,
    ) -> Result<Self> {
        if num_parameters == 0 || !init.is_finite() {
            return Err(usage(
                "PRelu::new",
                format!(
                    "need num_parameters ≥ 1 and a finite init, got num_parameters \
                     {num_parameters}, init {init}"
                ),
            ));
        }
        Ok(PRelu {
            weight: vars.param("weight", &[num_parameters], Init::Const(init))?,
        })
    }

    /// The number of slopes (0 for a weight of another rank, a public field: refused at use).
    fn slopes(&self) -> usize {
        match self.weight.shape().dims() {
            &[c] => c,
            _ => 0,
        }
    }
}

impl Parameters for PRelu {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        f(&self.weight);
    }
    fn module_name(&self) -> String {
        "PReLU".into()
    }
    fn extra_repr(&self) -> String {
        format!("num_parameters={}", self.slopes())
    }
}

impl<O: Train> Module<O> for PRelu {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let g = x.scope();
        let w = g.param(&self.weight)?;
        let at = At::new(g.rt, self, &self.weight);
        // The weight is a public field: one slope or one per channel, as the constructor makes.
        let c = at.param_dims(
            "PRelu::forward",
            "weight",
            &self.weight,
            1..=1,
            "(num_parameters)",
        )?[0];
        if c == 0 {
            let e = usage(
                "PRelu::forward",
                "need num_parameters ≥ 1, got a weight of 0 slopes",
            );
            return Err(at.op_error(e));
        }
        let dims = x.dims();
        // One slope: a scalar, broadcast to any x. Per channel: (C, 1, …) against (N, C, …).
        let slope_dims: Vec<usize> = match (c, dims) {
            (1, _) => Vec::new(),
            (_, [_, ch, rest @ ..]) if *ch == c => {
                [c].into_iter().chain(rest.iter().map(|_| 1)).collect()
            }
            _ => {
                return Err(at.input(format!(
                    "{c} slopes need x (N, {c}, …) (the channels on axis 1), got {:?}",
                    dims
                )));
            }
        };
        let y = || -> Result<Var<'g, O>> {
            let a = w.reshape(&slope_dims)?;
            let pos = x.relu()?;
            let neg = (x - &pos)?;
            &pos + &(&neg * &a)?
        };
        y().map_err(|e| at.op_error(e))
    }
}
