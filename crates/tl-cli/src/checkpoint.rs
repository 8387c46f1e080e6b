//! Checkpoints: tl-nn's safetensors files ([`tl_nn::checkpoint`], written atomically by
//! `Runtime::save_with`, loaded by `Runtime::load_file`, validated against the model before
//! anything changes): one F32 tensor per parameter under its PyTorch `state_dict()` name
//! (`0.weight`, `blocks.1.attn.wq`, …), the optimizer's state as F64 tensors named
//! `optimizer.<state name>` (`optimizer.adam.m.0.weight`, …; see
//! [`tl_session::optim::StateDict`]), and metadata `model`, `epochs` and `optimizer`. PyTorch
//! comparison: `safetensors.torch.save_file(model.state_dict(), path, metadata)` plus
//! `optimizer.state_dict()` in the same file, so `--resume` continues the exact trajectory.
//!
//! Every way a file can be wrong (missing, truncated, not safetensors, not written by `tl`,
//! another model, a missing or misshapen tensor, optimizer state that does not fit) is a
//! one-line [`CliError`] naming the file.

use std::collections::BTreeMap;
use std::path::Path;

use tl_nn::checkpoint::{FORMAT, File, OPTIMIZER_PREFIX};
use tl_nn::{Parameters, Runtime};
use tl_session::optim::StateDict;
use tl_session::{Optimizer, Train};
use tl_spec::Tensor;

use crate::cli::{ModelName, OptimizerName};
use crate::fno_paper::PaperModel;
use crate::{CliError, Result};

/// A checkpoint's metadata: which model, how many epochs, which optimizer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    /// The model the parameters belong to.
    pub model: ModelName,
    /// Epochs trained so far.
    pub epochs: usize,
    /// The optimizer whose state the file holds (`None`: no optimizer state).
    pub optimizer: Option<OptimizerName>,
    /// A `--preset fno-paper` model: its modes, output scale and training grid.
    pub paper: Option<PaperModel>,
}

impl Header {
    /// The metadata entries `tl` writes (tl-nn adds `format`).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([
            ("model".to_owned(), self.model.as_str().to_owned()),
            ("epochs".to_owned(), self.epochs.to_string()),
        ]);
        if let Some(o) = self.optimizer {
            m.insert("optimizer".to_owned(), o.as_str().to_owned());
        }
        if let Some(p) = &self.paper {
            p.write(&mut m);
        }
        m
    }

    /// Check that the file holds `model`'s parameters.
    pub fn expect_model(&self, path: &Path, model: ModelName) -> Result<()> {
        if self.model != model {
            return Err(CliError::new(format!(
                "checkpoint {} holds a {} model, not {}",
                path.display(),
                self.model.as_str(),
                model.as_str()
            )));
        }
        Ok(())
    }
}

/// A checkpoint's content on the host: what a training run ends with, and what [`load`]
/// reads back from a file (tensors in name order in both).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Model, epochs and optimizer.
    pub header: Header,
    /// `(name, value)` per parameter, in name order.
    pub tensors: Vec<(String, Tensor<f32>)>,
    /// The optimizer's state (empty without one).
    pub optimizer_state: StateDict,
}

/// Read the file at `path` and its metadata (not yet checked against a model).
pub fn read(path: &Path) -> Result<(File, Header)> {
    let shown = path.display();
    let file = tl_nn::checkpoint::read(path).map_err(|e| match e {
        tl_nn::Error::Io { source, .. } => {
            CliError::new(format!("cannot read checkpoint {shown}: {source}"))
        }
        e => e.into(),
    })?;
    let bad = |why: String| CliError::new(format!("checkpoint {shown}: {why}"));
    let meta = &file.metadata;
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(bad(format!(
            "no `format: {FORMAT}` metadata; not written by tl train --save"
        )));
    }
    let model = meta
        .get("model")
        .and_then(|m| ModelName::parse(m))
        .ok_or_else(|| bad("no known `model` in the metadata".into()))?;
    let epochs = match meta.get("epochs") {
        None => return Err(bad("no `epochs` in the metadata".into())),
        Some(e) => e.parse().map_err(|_| {
            bad(format!(
                "`epochs` in the metadata is {e:?}, not a whole number of epochs"
            ))
        })?,
    };
    let optimizer = match meta.get("optimizer") {
        None => None,
        Some(o) => Some(
            OptimizerName::parse(o)
                .ok_or_else(|| bad(format!("unknown optimizer {o:?} in the metadata")))?,
        ),
    };
    let paper = PaperModel::read(meta).map_err(bad)?;
    if paper.is_some() && model != ModelName::Fno {
        return Err(bad(format!(
            "a --preset fno-paper record on a {} model",
            model.as_str()
        )));
    }
    if optimizer.is_none()
        && let Some(name) = file
            .tensors
            .keys()
            .find(|n| n.starts_with(OPTIMIZER_PREFIX))
    {
        return Err(bad(format!(
            "tensor {name:?} is optimizer state, but no `optimizer` in the metadata"
        )));
    }
    Ok((
        file,
        Header {
            model,
            epochs,
            optimizer,
            paper,
        },
    ))
}

/// Read a checkpoint's tensors and metadata to the host (for inspection and tests).
pub fn load(path: &Path) -> Result<Checkpoint> {
    let (file, header) = read(path)?;
    let mut tensors = Vec::new();
    let mut optimizer_state = StateDict::new();
    for (name, e) in &file.tensors {
        match name.strip_prefix(OPTIMIZER_PREFIX) {
            Some(key) => {
                optimizer_state.insert(key.to_owned(), e.to_tensor::<f64>(path, name)?);
            }
            None => tensors.push((name.clone(), e.to_tensor::<f32>(path, name)?)),
        }
    }
    Ok(Checkpoint {
        header,
        tensors,
        optimizer_state,
    })
}

/// `model`'s parameters and `opt`'s state, read back from `rt`.
pub fn snapshot<O: Train<T = f32>, M: Parameters>(
    rt: &Runtime<O>,
    model: &M,
    header: Header,
    opt: &Optimizer,
) -> Result<Checkpoint> {
    let mut tensors = rt.state_dict(model)?;
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let optimizer_state = rt.session().optimizer_state(opt)?;
    Ok(Checkpoint {
        header,
        tensors,
        optimizer_state,
    })
}

/// Save `model`'s parameters, `opt`'s state and `header` to `path` (atomically).
pub fn save<O: Train<T = f32>, M: Parameters>(
    rt: &Runtime<O>,
    model: &M,
    path: &Path,
    header: Header,
    opt: &Optimizer,
) -> Result<()> {
    rt.save_with(model, path, Some(opt), &header.metadata())
        .map_err(|e| match e {
            tl_nn::Error::Io { source, .. } => CliError::new(format!(
                "cannot write checkpoint {}: {source}",
                path.display()
            )),
            e => e.into(),
        })
}

/// Load an already [`read`] file into `model` (which must be the file's model), and into
/// `opt` when given. On any error nothing changes.
pub fn restore<O: Train<T = f32>, M: Parameters>(
    rt: &mut Runtime<O>,
    model: &M,
    name: ModelName,
    path: &Path,
    (file, header): &(File, Header),
    opt: Option<&mut Optimizer>,
) -> Result<()> {
    header.expect_model(path, name)?;
    rt.load_file(model, path, file, opt)?;
    Ok(())
}
