//! [`Vars`]: a path in a runtime's parameter namespace, where layers create their parameters
//! (`vars.pp("blocks").pp("0").pp("attn")` → `blocks.0.attn.wq`), initialised from the session's
//! counter RNG, so one seed gives the same model on every backend. PyTorch comparison: the
//! attribute path that `state_dict()` names; candle: `VarBuilder::pp`.

use tl_session::{Param, Train};
use tl_spec::Tensor;

use crate::init::Init;
use crate::{Result, Runtime};

/// A prefix in a runtime's parameter namespace.
pub struct Vars<'r, O: Train> {
    rt: &'r Runtime<O>,
    prefix: String,
}

impl<'r, O: Train> Clone for Vars<'r, O> {
    fn clone(&self) -> Self {
        Vars {
            rt: self.rt,
            prefix: self.prefix.clone(),
        }
    }
}

impl<'r, O: Train> Vars<'r, O> {
    pub(crate) fn root(rt: &'r Runtime<O>) -> Self {
        Vars {
            rt,
            prefix: String::new(),
        }
    }

    /// The path one level down: `pp("encoder")`. PyTorch: a submodule attribute.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let name = name.to_string();
        Vars {
            rt: self.rt,
            prefix: if self.prefix.is_empty() {
                name
            } else {
                format!("{}.{name}", self.prefix)
            },
        }
    }

    /// The full name of `name` under this prefix.
    pub fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The runtime the parameters are created in.
    pub fn runtime(&self) -> &'r Runtime<O> {
        self.rt
    }

    /// A trainable parameter `name` of `dims`, drawn from `init`. A full name used twice is
    /// an error. PyTorch: `nn.Parameter(init(torch.empty(dims)))`.
    pub fn param(&self, name: &str, dims: &[usize], init: Init) -> Result<Param> {
        let value = init.sample::<O::T>(dims, || self.rt.next_key())?;
        self.rt.create(self.full_name(name), value, true)
    }

    /// A parameter `name` with the given value.
    pub fn param_from(&self, name: &str, value: Tensor<O::T>, trainable: bool) -> Result<Param> {
        self.rt.create(self.full_name(name), value, trainable)
    }

    /// A buffer: state saved with the model, never trained (batch norm's running statistics).
    /// PyTorch: `register_buffer`.
    pub fn buffer(&self, name: &str, dims: &[usize], init: Init) -> Result<Param> {
        let value = init.sample::<O::T>(dims, || self.rt.next_key())?;
        self.rt.create(self.full_name(name), value, false)
    }
}
