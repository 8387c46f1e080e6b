//! # tl-cli: the `tl` command
//!
//! - `tl train`: train a model (mlp, cnn: digits classification; fno: Burgers' equation, also as
//!   the FNO paper's benchmark with `--preset fno-paper` ([`fno_paper`]); transformer:
//!   char-level language model), built from tl-nn layers ([`model`]), on data shipped in the
//!   repository (`data/`) or made by a solver in the project, eager or linked, on any session
//!   backend, with one training loop over tl-nn's `Runtime` ([`train`]), a progress bar, a
//!   loss-curve PNG and tl-nn's safetensors checkpoints ([`checkpoint`]);
//! - `tl eval`: a checkpoint's metrics on the test split;
//! - `tl verify`: the conformance harness (`tl-conformance`) on a chosen backend, as a table or
//!   JSON;
//! - `tl graph`: a model's recorded `GraphData` as Graphviz DOT.
//!
//! The library half holds everything the binary does, so tests can drive training directly; the
//! binary (`src/main.rs`) only parses arguments and prints errors as one `error: ...` line,
//! exiting 2 for a usage error and 1 for a runtime one ([`error::Kind`]).

pub mod burgers;
pub mod checkpoint;
pub mod cli;
pub mod dataset;
pub mod dist;
pub mod dot;
pub mod error;
pub mod fno_paper;
pub mod grf;
pub mod metrics;
pub mod model;
pub mod outputs;
pub mod plot;
pub mod text;
pub mod train;
pub mod verify;

pub use error::{CliError, Result};
