//! # tl-session: the sessions a user writes models against
//!
//! - [`Session`] (eager, seed 000): ops run as they are called on the CPU tape or the CUDA tape
//!   ([`Backend`]); parameters ([`Param`]) stay resident on the device between steps.
//! - [`LinkedSession`] (seed 004): the same calls record a `GraphData`; values by pure
//!   evaluation, gradients by `backprop_all`, tangents by `jvp`, and
//!   [`LinkedSession::compile`] replays the graph into either tape.
//! - [`Ops`]: the one op surface both implement, so a model ([`models`]) is written once.
//! - [`Optimizer`]: SGD, momentum SGD, Adam, AdamW with PyTorch's formulas, on host or device.
//! - Handles ([`TensorRef`], [`Param`], [`NatRef`], [`NatVecRef`]) carry their session's id and
//!   epoch, so misuse across sessions or after `reset` is an [`Error`], never a wrong answer.
//!
//! ```
//! use tl_session::{Backend, Ops, Options, Optimizer, Session};
//! use tl_spec::Tensor;
//!
//! let mut s = Session::<f32>::new(Options::backend(Backend::Cpu))?;
//! let w = s.param(Tensor::vector(vec![2.0]), Some("w"), true)?;
//! let wr = s.use_param(&w)?;
//! let x = s.input(Tensor::vector(vec![3.0]), false)?;
//! let y = s.mul(&wr, &x)?;
//! let loss = s.sum(&y)?;
//! s.backward(&loss)?;
//! assert_eq!(s.grad(&w)?.data(), &[3.0]);
//! s.step(&mut Optimizer::sgd(0.5)?)?;
//! assert_eq!(s.param_value(&w)?.data(), &[0.5]);
//! # Ok::<(), tl_session::Error>(())
//! ```

mod eager;
mod error;
mod handle;
mod linked;
pub mod models;
mod ops;
pub mod optim;
mod params;

pub use eager::{Backend, Options, Session};
pub use error::{Error, Result};
pub use handle::{NatRef, NatVecRef, Param, Stamp, TensorRef};
pub use linked::{Compiled, CompiledTape, LinkedSession};
pub use ops::Ops;
pub use optim::Optimizer;
