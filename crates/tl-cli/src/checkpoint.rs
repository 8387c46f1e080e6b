//! Checkpoints in the safetensors format: one F32 tensor per parameter, named as the model
//! names it (`layer0.weight`, …), the optimizer's state as F64 tensors named
//! `optimizer.<state name>` (`optimizer.adam.m.layer0.weight`, …; see
//! [`tl_session::optim::StateDict`]), and metadata (`model`, `epochs`, `optimizer`). PyTorch
//! comparison: `safetensors.torch.save_file(model.state_dict(), path, metadata)` plus
//! `optimizer.state_dict()` in the same file, so `--resume` continues the exact trajectory.
//!
//! Every way a file can be wrong (missing, truncated, not safetensors, another model, a missing
//! or misshapen tensor) is a one-line [`CliError`] naming the file.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tl_session::optim::StateDict;
use tl_spec::Tensor;

use crate::cli::{ModelName, OptimizerName};
use crate::{CliError, Result};

/// The `format` metadata value this crate writes.
pub const FORMAT: &str = "tl-cli/1";

/// The name prefix of optimizer state tensors.
pub const OPTIMIZER_PREFIX: &str = "optimizer.";

/// A checkpoint's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The model the parameters belong to.
    pub model: ModelName,
    /// Epochs trained so far.
    pub epochs: usize,
    /// `(name, value)` per parameter.
    pub tensors: Vec<(String, Tensor<f32>)>,
    /// The optimizer that trained the parameters and its state (`None` in a checkpoint saved
    /// without one).
    pub optimizer: Option<(OptimizerName, StateDict)>,
}

impl Checkpoint {
    /// The tensor named `name`, with shape `dims`.
    pub fn get(&self, path: &Path, name: &str, dims: &[usize]) -> Result<&Tensor<f32>> {
        let t = self
            .tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                CliError::new(format!(
                    "checkpoint {}: no tensor named {name:?} (it does not hold this {} model's parameters)",
                    path.display(),
                    self.model.as_str()
                ))
            })?;
        if t.shape().dims() != dims {
            return Err(CliError::new(format!(
                "checkpoint {}: tensor {name:?} has shape {}, the model needs {dims:?}",
                path.display(),
                t.shape()
            )));
        }
        Ok(t)
    }
}

/// Write `ckpt` to `path`.
pub fn save(path: &Path, ckpt: &Checkpoint) -> Result<()> {
    // (name, dtype, dims, little-endian bytes) of every tensor: parameters, then optimizer state.
    let mut raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = ckpt
        .tensors
        .iter()
        .map(|(name, t)| {
            let b = t.data().iter().flat_map(|v| v.to_le_bytes()).collect();
            (name.clone(), Dtype::F32, t.shape().dims().to_vec(), b)
        })
        .collect();
    let mut meta = HashMap::from([
        ("format".to_owned(), FORMAT.to_owned()),
        ("model".to_owned(), ckpt.model.as_str().to_owned()),
        ("epochs".to_owned(), ckpt.epochs.to_string()),
    ]);
    if let Some((opt, state)) = &ckpt.optimizer {
        meta.insert("optimizer".to_owned(), opt.as_str().to_owned());
        for (name, t) in state {
            let b = t.data().iter().flat_map(|v| v.to_le_bytes()).collect();
            let full = format!("{OPTIMIZER_PREFIX}{name}");
            raw.push((full, Dtype::F64, t.shape().dims().to_vec(), b));
        }
    }
    let views = raw
        .iter()
        .map(|(name, dtype, dims, b)| {
            Ok((
                name.clone(),
                TensorView::new(*dtype, dims.clone(), b)
                    .map_err(|e| CliError::new(format!("checkpoint tensor {name}: {e}")))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = safetensors::serialize(views, Some(meta))
        .map_err(|e| CliError::new(format!("cannot encode checkpoint: {e}")))?;
    std::fs::write(path, out)
        .map_err(|e| CliError::new(format!("cannot write checkpoint {}: {e}", path.display())))
}

/// Read a checkpoint written by [`save`].
pub fn load(path: &Path) -> Result<Checkpoint> {
    let shown = path.display();
    let bytes = std::fs::read(path)
        .map_err(|e| CliError::new(format!("cannot read checkpoint {shown}: {e}")))?;
    let bad = |why: String| {
        CliError::new(format!(
            "checkpoint {shown} is not a valid safetensors checkpoint ({why}); it may be truncated or corrupt"
        ))
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = meta.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(bad(format!(
            "no `format: {FORMAT}` metadata; not written by tl train --save"
        )));
    }
    let model = meta
        .get("model")
        .and_then(|m| ModelName::parse(m))
        .ok_or_else(|| bad("no known `model` in the metadata".into()))?;
    let epochs = meta
        .get("epochs")
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| bad("no `epochs` in the metadata".into()))?;
    let optimizer = match meta.get("optimizer") {
        None => None,
        Some(o) => Some(
            OptimizerName::parse(o)
                .ok_or_else(|| bad(format!("unknown optimizer {o:?} in the metadata")))?,
        ),
    };
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    let mut state = StateDict::new();
    for name in names {
        let v = st.tensor(&name).map_err(|e| bad(e.to_string()))?;
        if let Some(key) = name.strip_prefix(OPTIMIZER_PREFIX) {
            if optimizer.is_none() {
                return Err(bad(format!(
                    "tensor {name:?} is optimizer state, but no `optimizer` in the metadata"
                )));
            }
            if v.dtype() != Dtype::F64 {
                return Err(bad(format!("tensor {name:?} is {:?}, not F64", v.dtype())));
            }
            let data: Vec<f64> = v
                .data()
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    f64::from_le_bytes(b)
                })
                .collect();
            let t = Tensor::new(v.shape().to_vec(), data).map_err(|e| bad(e.to_string()))?;
            state.insert(key.to_owned(), t);
            continue;
        }
        if v.dtype() != Dtype::F32 {
            return Err(bad(format!("tensor {name:?} is {:?}, not F32", v.dtype())));
        }
        let data: Vec<f32> = v
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let t = Tensor::new(v.shape().to_vec(), data).map_err(|e| bad(e.to_string()))?;
        tensors.push((name, t));
    }
    Ok(Checkpoint {
        model,
        epochs,
        tensors,
        optimizer: optimizer.map(|o| (o, state)),
    })
}
