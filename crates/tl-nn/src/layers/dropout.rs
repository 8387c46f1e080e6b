//! [`Dropout`]. PyTorch: `nn.Dropout`.

use tl_session::{Param, Train};

use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// Zeroes each element with probability `p` and scales the rest by `1/(1−p)` in training
/// passes; the identity in eval passes. Masks come from the session's seed and counter.
/// PyTorch: `nn.Dropout(p)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    /// Dropout with drop probability `p` in `[0, 1)`.
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(usage(
                "Dropout::new",
                format!("the drop probability must be in [0, 1), got {p}"),
            ));
        }
        Ok(Dropout { p })
    }
}

impl Parameters for Dropout {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn extra_repr(&self) -> String {
        format!("p={}, inplace=False", crate::display::py_float(self.p))
    }
}

impl<O: Train> Module<O> for Dropout {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        if self.p == 0.0 || !x.scope().training() {
            return Ok(x.clone());
        }
        x.dropout(1.0 - self.p)
    }
}
