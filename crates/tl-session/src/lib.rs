//! # tl-session: the sessions a user writes models against
//!
//! A complete training loop, written once and run on both sessions: the eager [`Session`]
//! (every op runs as it is called) and the [`LinkedSession`] (the pass is recorded as a graph
//! and compiled into a tape). The layers, labels and checkpoints come from `tl-nn`, the crate
//! above this one; [`Train`] is what lets one loop drive either session.
//!
//! ```
//! use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential, data};
//! use tl_session::{LinkedSession, Optimizer, Options, Session, Train};
//!
//! fn train<O: Train<T = f32>>(session: O) -> tl_nn::Result<f64> {
//!     let mut rt = Runtime::new(session);
//!     let v = rt.vars();
//!     let model = Sequential::new()
//!         .add(Linear::new(&v.pp(0), PIXELS, 32)?)
//!         .add(Activation::Relu)
//!         .add(Linear::new(&v.pp(2), 32, CLASSES)?);
//!     let (train, test) = data::digits()?; // data
//!     let mut opt = Optimizer::adam(1e-2)?; // optimizer
//!     for epoch in 0..3 {
//!         for (x, labels) in train.batches::<f32>(64, CLASSES, epoch)? {
//!             // One step: forward, loss, backward, update; the session is reset inside.
//!             rt.step(&model, &mut opt, |g| model.forward(&g.input(x)?)?.cross_entropy(&labels))?;
//!         }
//!     }
//!     let (x_test, y_test) = (test.features(), test.labels(CLASSES)?);
//!     let acc = rt.accuracy(&model, &x_test, &y_test, 120)?;
//!     let path = std::env::temp_dir().join(format!("tl-session-doc-{}.st", std::process::id()));
//!     rt.save(&model, &path)?; // safetensors, PyTorch state_dict names
//!     rt.load(&model, &path)?;
//!     assert_eq!(rt.accuracy(&model, &x_test, &y_test, 120)?, acc);
//!     std::fs::remove_file(&path).ok();
//!     Ok(acc)
//! }
//!
//! let eager = train(Session::<f32>::new(Options::default())?)?;
//! let linked = train(LinkedSession::<f32>::with_seed(0))?;
//! assert!(eager > 0.85, "test accuracy {eager}");
//! assert!((eager - linked).abs() < 0.02, "eager {eager} vs linked {linked}");
//! # Ok::<(), tl_nn::Error>(())
//! ```
//!
//! What this crate holds:
//! - [`Session`] (eager): ops run as they are called on the CPU tape or the CUDA tape
//!   ([`Backend`]); parameters ([`Param`]) stay resident on the device between steps.
//! - [`LinkedSession`]: the same calls record a `GraphData`; values by pure evaluation,
//!   gradients by `backprop_all`, tangents by `jvp`, and [`LinkedSession::compile`] replays the
//!   graph into either tape.
//! - [`Ops`]: the one op surface both implement, so a model is written once (tl-nn's layers
//!   and models are written on it).
//! - [`Train`]: what a training loop needs beyond [`Ops`] (reset, backward + optimizer step,
//!   parameter I/O), implemented by both sessions.
//! - [`Optimizer`]: SGD, momentum SGD, Adam, AdamW with PyTorch's formulas, on host or device.
//! - Handles ([`TensorRef`], [`Param`], [`NatRef`], [`NatVecRef`]) carry their session's id and
//!   pass (the number of resets), so misuse across sessions or after `reset` is an [`Error`],
//!   never a wrong answer.
//!
//! The same at the level of single ops, without tl-nn:
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
mod grad_reduce;
mod handle;
// Compiled only where rustc shares generics between crates (the dev and test profiles).
#[cfg(debug_assertions)]
#[doc(hidden)]
pub mod instances;
mod linked;
mod liveness;
mod ops;
pub mod optim;
mod params;
mod running;
mod train;

pub use eager::{Backend, Options, Session};
pub use error::{Error, Result};
pub use handle::{NatRef, NatVecRef, Param, Stamp, TensorRef};
pub use linked::{Compiled, CompiledTape, LinkedSession};
pub use ops::Ops;
pub use optim::{Optimizer, Schedule, StepStats};
pub use tl_tape_cpu::Precision;
pub use tl_tape_cuda::FlashProducts;
pub use train::{GradReducer, StepPass, Train};
