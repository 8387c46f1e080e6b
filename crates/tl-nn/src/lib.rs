//! # tl-nn: layers, named parameters, checkpoints and one training loop
//!
//! What users write models with, above the sessions of `tl-session`. A model is written once,
//! generic over the session, and runs eager (CPU, CUDA simulation, CUDA) and linked (the
//! recorded graph compiled into a tape). A complete training loop:
//!
//! ```
//! use tl_nn::{data, Activation, Linear, Module, Runtime, Sequential, CLASSES, PIXELS};
//! use tl_session::{Optimizer, Options, Session};
//!
//! # fn main() -> tl_nn::Result<()> {
//! let (train, test) = data::digits()?;
//! // Eager on the CPU; `LinkedSession::<f32>::with_seed(0)` runs the same code linked.
//! let mut rt = Runtime::new(Session::<f32>::new(Options::default())?);
//! let vars = rt.vars();
//! let model = Sequential::new()
//!     .add(Linear::new(&vars.pp(0), PIXELS, 32)?)
//!     .add(Activation::Relu)
//!     .add(Linear::new(&vars.pp(2), 32, CLASSES)?);
//! let mut opt = Optimizer::adam(1e-2)?;
//! for epoch in 0..3 {
//!     for (x, labels) in train.batches::<f32>(64, CLASSES, epoch)? {
//!         rt.step(&model, &mut opt, |g| model.forward(&g.input(x)?)?.cross_entropy(&labels))?;
//!     }
//! }
//! let acc = rt.accuracy(&model, &test.features(), &test.labels(CLASSES)?, 128)?;
//! assert!(acc > 0.8, "test accuracy {acc}");
//! let path = std::env::temp_dir().join(format!("tl-nn-doc-{}.safetensors", std::process::id()));
//! rt.save(&model, &path)?;
//! rt.load(&model, &path)?; // back from the file: the same accuracy
//! assert_eq!(rt.accuracy(&model, &test.features(), &test.labels(CLASSES)?, 128)?, acc);
//! # std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```
//!
//! - [`Runtime`]: a session with its named parameter store; [`Runtime::step`] (one training
//!   step, the same for both sessions, the reset inside it), [`Runtime::eval`],
//!   [`Runtime::accuracy`], [`Runtime::save`] / [`Runtime::load`] (safetensors, PyTorch's
//!   `state_dict` names).
//! - [`Var`]: a tensor in a pass, with the ops as methods and `+ - * /` (broadcasting), so
//!   expressions nest: `x.matmul(&w)?.relu()?`. [`Scope`]: where a pass makes its inputs.
//! - [`Module`], [`Parameters`] (write it with `#[derive(Parameters)]`), [`Sequential`],
//!   [`Activation`], [`Flatten`], and the layers:
//!   [`Linear`], [`Conv`], [`ConvTranspose`], [`MaxPool`], [`AvgPool`], [`LayerNorm`],
//!   [`BatchNorm`], [`RmsNorm`], [`GroupNorm`], [`Embedding`], [`MultiHeadAttention`], [`Dropout`], [`SpectralConv1d`],
//!   [`PRelu`] (a learned slope), [`Upsample`] (nearest), [`AdaptiveAvgPool`],
//!   the recurrent [`Lstm`] and [`Gru`] ([`RnnConfig`], [`RnnWeights`]), and [`ModuleList`]
//!   (layers named by position).
//! - Your own ops ([`tl_ir::UserOp`]): [`Var::user`] applies one, [`UserLayer`] makes a
//!   one-operand op a layer (`examples/custom_op`, docs/guide.md "Your own op").
//! - [`Vars`]: hierarchical parameter names (`blocks.0.attn.wq`); [`Init`]: PyTorch's default
//!   initialisers on the project's counter RNG (one seed, the same model on every backend).
//! - Training controls on the optimizer, inside the step: gradient clipping by norm or value, a
//!   learning-rate [`Schedule`], a stop on a non-finite loss; [`Runtime::train_step`] returns
//!   a [`StepReport`] (loss, learning rate, gradient norm).
//! - [`Labels`]: class targets that know their number of classes; a bad label is an error.
//! - [`losses`]: BCE with logits, NLL, L1, Huber and smooth L1 with PyTorch's [`Reduction`]s
//!   (beside [`Var::mse_loss`] and [`Var::cross_entropy`]).
//! - [`tree`] and every layer's `Display`: the model printed as PyTorch prints it;
//!   [`Runtime::summary`]: its layers with parameter shapes and counts.
//! - [`Error`]: every message names the layer, op or value; `?` converts the errors of the
//!   crates below and of I/O and parsing. A parameter a model's pass uses but its
//!   `visit_params` does not list is an error at `step`, `save` and `num_params` (listed
//!   parameters, on [`Runtime`]).
//! - [`checkpoint`]: the file format and atomic writes.
//! - [`dist`]: data-parallel training ([`Runtime::data_parallel`], [`data::DataLoader::shard`]),
//!   one process ([`dist::Local`]) or many under `mpirun` (`dist::Mpi`, feature `mpi`).
//! - [`data`]: [`data::Dataset`] and [`data::DataLoader`] (seeded shuffle, drop-last,
//!   collate), the digits data set, the King James text, character vocabularies and token
//!   windows for language models. [`Rng`]: a seeded random stream on the project's counter
//!   RNG; [`sample()`] / [`argmax`]: the next token from a language model's last logits.

// `#[derive(Parameters)]` names `::tl_nn`, also inside this crate.
extern crate self as tl_nn;

mod activation;
mod display;
mod error;
mod init;
mod labels;
mod layers;
mod listed;
pub mod losses;
mod module;
mod rng;
mod running;
mod runtime;
mod sample;
mod train;
mod user;
mod var;
mod vars;

pub mod checkpoint;
pub mod data;
pub mod dist;
pub mod models;

pub use activation::{Activation, SELU_ALPHA, SELU_SCALE};
pub use data::{CLASSES, PIXELS};
pub use display::{Summary, SummaryRow, Tree, tree};
pub use error::{Error, Result};
pub use init::Init;
pub use labels::Labels;
pub use layers::{
    AdaptiveAvgPool, AvgPool, BatchNorm, Conv, ConvConfig, ConvTranspose, Dropout, Embedding,
    GroupNorm, Gru, InstanceNorm, KvCache, LayerNorm, Linear, Lstm, MaxPool, ModuleList,
    MultiHeadAttention, PRelu, RmsNorm, RnnConfig, RnnWeights, Rope, RopeLayout, SpectralConv1d,
    Upsample,
};
pub use losses::Reduction;
pub use module::{Flatten, Module, Parameters, Sequential};
pub use rng::Rng;
pub use runtime::{Runtime, Scope};
pub use sample::{argmax, sample};
/// `#[derive(Parameters)]`: `visit_params` and the printed children written from the fields
/// (structs, tuple structs, enums; `Vec`, `Option`, `Box` of layers; generic models;
/// `#[parameters(skip)]` for a field without layers). See the `tl-nn-derive` crate.
pub use tl_nn_derive::Parameters;
/// Attention masks (true = allowed) for [`MultiHeadAttention`]'s `forward_masked` and its
/// cross-attention: tl-spec's, here so a model author need not depend on it.
pub use tl_spec::ops::attention::Mask;
/// The CPU kernels' thread count (default: the cores; `TL_NUM_THREADS`), returning the
/// previous one: tl-tape-cpu's `set_threads`, here so a model author need not depend on it.
pub use tl_tape_cpu::{set_threads, threads};
pub use train::{Schedule, StepReport, StepStats};
pub use user::UserLayer;
pub use var::Var;
pub use vars::Vars;

/// What `#[derive(Parameters)]` expands to names; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use tl_session::Param;
}

/// docs/guide.md ("Your first model"): its code blocks run as this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide.md")]
pub struct Guide;
