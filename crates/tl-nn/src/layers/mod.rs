//! The layers, one family a file; each names its parameters as PyTorch's module does
//! (`weight`, `bias`, `running_mean`, …) and initialises them with PyTorch's defaults.

mod attention;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod list;
mod norm;
mod pool;
mod rnn;
mod spectral;

pub use attention::MultiHeadAttention;
pub use conv::{Conv, ConvConfig, ConvTranspose};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use linear::Linear;
pub use list::ModuleList;
pub use norm::{BatchNorm, LayerNorm};
pub use pool::{AvgPool, MaxPool};
pub use rnn::{Gru, Lstm, RnnConfig, RnnWeights};
pub use spectral::SpectralConv1d;
