//! [`UserLayer`]: a user op ([`tl_ir::UserOp`]) of one operand as a layer, so a model can
//! put its own activation or stencil in a [`crate::Sequential`].

use tl_ir::UserOpRef;
use tl_session::{Param, Train};

use crate::{Module, Parameters, Result, Var};

/// A parameter-free layer applying a one-operand user op to its input. PyTorch: an
/// `nn.Module` whose `forward` calls a `torch.library.custom_op`.
#[derive(Clone, Debug)]
pub struct UserLayer(pub UserOpRef);

impl Parameters for UserLayer {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn extra_repr(&self) -> String {
        format!("{:?}", self.0)
    }
}

impl<O: Train> Module<O> for UserLayer {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        x.user(&self.0, &[])
    }
}
