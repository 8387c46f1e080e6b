//! The layers, one family a file; each names its parameters as PyTorch's module does
//! (`weight`, `bias`, `running_mean`, …) and initialises them with PyTorch's defaults.

mod activation;
mod adaptive;
mod attention;
mod conv;
mod cross_attention;
mod dropout;
mod embedding;
mod instance_norm;
mod inv_std;
mod kv_cache;
mod linear;
mod list;
mod norm;
mod pool;
mod resample;
mod rnn;
mod rope;
mod spectral;
mod upsample;

pub use activation::PRelu;
pub use adaptive::AdaptiveAvgPool;
pub use attention::MultiHeadAttention;
pub use conv::{Conv, ConvConfig, ConvTranspose};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use instance_norm::InstanceNorm;
pub use kv_cache::KvCache;
pub use linear::Linear;
pub use list::ModuleList;
pub use norm::{BatchNorm, GroupNorm, LayerNorm, RmsNorm};
pub use pool::{AvgPool, MaxPool};
pub use rnn::{Gru, Lstm, RnnConfig, RnnWeights};
pub use rope::{Rope, RopeLayout};
pub use spectral::SpectralConv1d;
pub use upsample::Upsample;

use tl_session::{Param, Train};

use crate::{Error, Parameters, Runtime};

/// A layer as its forward errors name it: its printed type and the path its parameter was
/// created under (`Linear "blocks.0.mlp.up"`; the type alone at the root).
pub(crate) struct At<'a, O: Train> {
    rt: &'a Runtime<O>,
    layer: &'a dyn Parameters,
    param: Option<&'a Param>,
}

impl<'a, O: Train> At<'a, O> {
    /// `layer`, whose parameter `param` gives its path in `rt`.
    pub(crate) fn new(rt: &'a Runtime<O>, layer: &'a dyn Parameters, param: &'a Param) -> Self {
        At {
            rt,
            layer,
            param: Some(param),
        }
    }

    /// `layer` without parameters (its errors name its type only).
    pub(crate) fn unnamed(rt: &'a Runtime<O>, layer: &'a dyn Parameters) -> Self {
        At {
            rt,
            layer,
            param: None,
        }
    }

    /// `Linear "blocks.0.mlp.up"`.
    fn label(&self) -> String {
        let name = self.param.map(|p| self.rt.name_of(p)).unwrap_or_default();
        match name.rsplit_once('.') {
            Some((path, _)) => format!("{} {path:?}", self.layer.module_name()),
            None => self.layer.module_name(),
        }
    }

    /// [`Error::Input`]: the input does not fit; `detail` says how and what to do.
    pub(crate) fn input(&self, detail: impl Into<String>) -> Error {
        Error::Input {
            layer: self.label(),
            detail: detail.into(),
        }
    }

    /// The dims of `param`, the layer's parameter `name` (a public field), when it has a rank
    /// in `ranks`; else an error naming the layer, `what`, the parameter's shape and `layout`
    /// (what the layer takes: `(out, in)`), never a panic on an index.
    pub(crate) fn param_dims<'p>(
        &self,
        what: &'static str,
        name: &str,
        param: &'p Param,
        ranks: std::ops::RangeInclusive<usize>,
        layout: &str,
    ) -> Result<&'p [usize], Error> {
        let dims = param.shape().dims();
        if ranks.contains(&dims.len()) {
            return Ok(dims);
        }
        let detail = format!("{name} has shape {}, expected {layout}", param.shape());
        Err(self.op_error(crate::error::usage(what, detail)))
    }

    /// An error of an op inside the layer, as [`Error::Layer`] naming the layer.
    pub(crate) fn op_error(&self, e: Error) -> Error {
        match e {
            e @ (Error::Input { .. } | Error::Layer { .. }) => e,
            e => Error::Layer {
                layer: self.label(),
                source: Box::new(e),
            },
        }
    }
}
