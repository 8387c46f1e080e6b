//! `Op`: the one op vocabulary shared by the IR, both tapes and the sessions, with its shape rule.

use std::fmt;

use tl_spec::ops::{elementwise, linalg, loss, random, reduce, shape, softmax, spectral};
use tl_spec::{Error as SpecError, Shape, Tensor, broadcast};

use crate::{Error, Result};

/// The family an op belongs to; each family's faces live in modules of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Pointwise maps and their binary forms.
    Elementwise,
    /// Views and permutations.
    Shape,
    /// Sums and means.
    Reduce,
    /// Matrix products.
    Linalg,
    /// Row softmax and log-softmax.
    Softmax,
    /// Losses.
    Loss,
    /// FNO spectral convolution.
    Spectral,
    /// Seeded randomness (uniform draws, Bernoulli masks, dropout).
    Random,
}

/// One op, with its static parameters. Operand order follows the seeds (e.g. `Linear` takes
/// `(w, b, x)`); see [`Op::arity`].
///
/// Scalar parameters are stored as `f64` and converted to the graph's scalar type when used.
#[derive(Clone, PartialEq)]
pub enum Op {
    // ---- elementwise ----
    /// `a + b` (same shapes). PyTorch: `torch.add`.
    Add,
    /// `a - b`. PyTorch: `torch.sub`.
    Sub,
    /// `a * b`. PyTorch: `torch.mul`.
    Mul,
    /// `a / b`. PyTorch: `torch.div`.
    Div,
    /// `c · x`. PyTorch: `x * c` with a Python scalar.
    Scale(f64),
    /// `|x|`, derivative sign(x) with sign(0) = 0. PyTorch: `torch.abs`.
    Abs,
    /// `sqrt(max(x, 0))`, derivative 0 where x ≤ 0. PyTorch: `torch.sqrt`.
    Sqrt,
    /// `exp x`. PyTorch: `torch.exp`.
    Exp,
    /// `ln x`; a non-positive input is an error. PyTorch: `torch.log`.
    Log,
    /// `1/x`. PyTorch: `torch.reciprocal`.
    Inv,
    /// `max(x, 0)`, derivative 0 at 0. PyTorch: `torch.relu`.
    Relu,
    /// `min(hi, max(lo, x))`, derivative 1 strictly inside. PyTorch: `torch.clamp`.
    Clamp {
        /// Lower bound.
        lo: f64,
        /// Upper bound (≥ `lo`).
        hi: f64,
    },
    /// Elementwise maximum; a tie splits the gradient in halves. PyTorch: `torch.maximum`.
    Max,
    /// Elementwise minimum; a tie splits the gradient in halves. PyTorch: `torch.minimum`.
    Min,
    /// `1/(1+exp(-x))`. PyTorch: `torch.sigmoid`.
    Sigmoid,
    /// `tanh x`. PyTorch: `torch.tanh`.
    Tanh,
    /// `max(x,0) + log(1+exp(-|x|))`. PyTorch: `F.softplus`.
    Softplus,
    /// `log(softplus(x) + eps)`: a log that never sees 0. No direct PyTorch equivalent.
    SafeLog {
        /// The guard ε (TorchLean's default 1e-6).
        eps: f64,
    },
    /// Identity forward, no gradient. PyTorch: `x.detach()`.
    Detach,
    /// A constant tensor node (no operands, no gradient). PyTorch: `torch.tensor(...)`.
    Constant(Tensor<f64>),

    // ---- shape ----
    /// Same elements, new shape of equal size. PyTorch: `torch.reshape`.
    Reshape(Shape),
    /// Reshape to 1-D. PyTorch: `torch.flatten`.
    Flatten,
    /// (m, n) → (n, m). PyTorch: `x.t()`.
    Transpose2d,
    /// (a, b, c) → (b, c, a). PyTorch: `x.permute(1, 2, 0)`.
    PermuteBca,
    /// (a, b, c) → (c, a, b). PyTorch: `x.permute(2, 0, 1)`.
    PermuteCab,
    /// (a, b, c) → (a, c, b). PyTorch: `x.transpose(1, 2)`.
    SwapLastTwo,
    /// Swap axes `depth` and `depth + 1`; identity when out of range. PyTorch: `x.transpose(d, d+1)`.
    SwapAdjacent(usize),
    /// numpy-style broadcast to a target shape. PyTorch: `x.expand(shape)`.
    BroadcastTo(Shape),

    // ---- reduce ----
    /// Sum of all elements → scalar. PyTorch: `x.sum()`.
    Sum,
    /// Sum along an axis, which is removed. PyTorch: `x.sum(dim=axis)`.
    ReduceSum(usize),
    /// Mean along an axis, which is removed. PyTorch: `x.mean(dim=axis)`.
    ReduceMean(usize),

    // ---- linalg ----
    /// (m, n) · (n, p) → (m, p). PyTorch: `torch.matmul` on 2-D.
    Matmul,
    /// (B, m, n) · (B, n, p) → (B, m, p). PyTorch: `torch.bmm`.
    Bmm,
    /// `(w, b, x) ↦ W·x + b`; x is (in) or batched (B, in). PyTorch: `F.linear(x, w, b)`.
    Linear,

    // ---- softmax ----
    /// Softmax along the last axis. PyTorch: `torch.softmax(x, -1)`.
    Softmax,
    /// Log-softmax along the last axis, computed stably. PyTorch: `torch.log_softmax(x, -1)`.
    LogSoftmax,

    // ---- loss ----
    /// `(ŷ, y) ↦ Σ(ŷ−y)²/N`. PyTorch: `F.mse_loss(reduction="mean")`.
    MseLoss,

    // ---- spectral ----
    /// `(x, wRe, wIm) ↦` FNO spectral convolution over the first `modes` real-FFT bins; x is
    /// (grid, width) or batched (B, grid, width), wRe/wIm (modes, width, width). PyTorch: the FNO
    /// reference `SpectralConv1d` (rfft, per-mode complex channel mix, irfft), channels last.
    SpectralConv1dRfft {
        /// Kept bins, `1 ≤ modes ≤ grid/2 + 1`.
        modes: usize,
    },

    // ---- random ----
    /// Uniform values in `[0, 1)` keyed by `(seed, counter)`; no operands, no gradient.
    /// PyTorch: `torch.rand(shape)` (different bits).
    RandUniform {
        /// Output shape.
        shape: Shape,
        /// Seed.
        seed: u64,
        /// Draw counter (`key = splitmix64(seed + counter)`).
        counter: u64,
    },
    /// A 0/1 mask, 1 where `keep > u/2³²`; no operands, no gradient.
    /// PyTorch: `torch.bernoulli(torch.full(shape, keep))` (different bits).
    BernoulliMask {
        /// Output shape.
        shape: Shape,
        /// Keep probability in `[0, 1]`.
        keep: f64,
        /// Seed.
        seed: u64,
        /// Draw counter.
        counter: u64,
    },
    /// `x · mask / keep` with the `bernoulliMask` of x's shape; gradient `g · mask / keep`.
    /// PyTorch: `F.dropout(x, p = 1 − keep, training=True)` (different bits).
    Dropout {
        /// Keep probability in `(0, 1]`.
        keep: f64,
        /// Seed.
        seed: u64,
        /// Draw counter.
        counter: u64,
    },
}

impl Op {
    /// The op's name as the seeds spell it (`"logSoftmax"`, `"broadcastTo"`, ...).
    pub fn name(&self) -> &'static str {
        use Op::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Scale(_) => "scale",
            Abs => "abs",
            Sqrt => "sqrt",
            Exp => "exp",
            Log => "log",
            Inv => "inv",
            Relu => "relu",
            Clamp { .. } => "clamp",
            Max => "max",
            Min => "min",
            Sigmoid => "sigmoid",
            Tanh => "tanh",
            Softplus => "softplus",
            SafeLog { .. } => "safeLog",
            Detach => "detach",
            Constant(_) => "constant",
            Reshape(_) => "reshape",
            Flatten => "flatten",
            Transpose2d => "transpose2d",
            PermuteBca => "permuteBCA",
            PermuteCab => "permuteCAB",
            SwapLastTwo => "swapLastTwo",
            SwapAdjacent(_) => "swapAdjacent",
            BroadcastTo(_) => "broadcastTo",
            Sum => "sum",
            ReduceSum(_) => "reduceSum",
            ReduceMean(_) => "reduceMean",
            Matmul => "matmul",
            Bmm => "bmm",
            Linear => "linear",
            Softmax => "softmax",
            LogSoftmax => "logSoftmax",
            MseLoss => "mseLoss",
            SpectralConv1dRfft { .. } => "spectralConv1dRfft",
            RandUniform { .. } => "randUniform",
            BernoulliMask { .. } => "bernoulliMask",
            Dropout { .. } => "dropout",
        }
    }

    /// The op's family.
    pub fn family(&self) -> Family {
        use Op::*;
        match self {
            Add
            | Sub
            | Mul
            | Div
            | Scale(_)
            | Abs
            | Sqrt
            | Exp
            | Log
            | Inv
            | Relu
            | Clamp { .. }
            | Max
            | Min
            | Sigmoid
            | Tanh
            | Softplus
            | SafeLog { .. }
            | Detach
            | Constant(_) => Family::Elementwise,
            Reshape(_) | Flatten | Transpose2d | PermuteBca | PermuteCab | SwapLastTwo
            | SwapAdjacent(_) | BroadcastTo(_) => Family::Shape,
            Sum | ReduceSum(_) | ReduceMean(_) => Family::Reduce,
            Matmul | Bmm | Linear => Family::Linalg,
            Softmax | LogSoftmax => Family::Softmax,
            MseLoss => Family::Loss,
            SpectralConv1dRfft { .. } => Family::Spectral,
            RandUniform { .. } | BernoulliMask { .. } | Dropout { .. } => Family::Random,
        }
    }

    /// How many tensor operands the op takes.
    pub fn arity(&self) -> usize {
        use Op::*;
        match self {
            Constant(_) | RandUniform { .. } | BernoulliMask { .. } => 0,
            Add | Sub | Mul | Div | Max | Min | Matmul | Bmm | MseLoss => 2,
            Linear | SpectralConv1dRfft { .. } => 3,
            _ => 1,
        }
    }

    /// Whether the op reads the Nat environment (runtime indices, labels). Tapes snapshot the
    /// environment for such nodes so their backward sees the indices their forward used.
    pub fn reads_nats(&self) -> bool {
        false
    }

    /// Whether gradients flow through the op to its operands (false for `detach`, `constant`
    /// and the operand-free random draws).
    pub fn is_differentiable(&self) -> bool {
        !matches!(
            self,
            Op::Detach | Op::Constant(_) | Op::RandUniform { .. } | Op::BernoulliMask { .. }
        )
    }

    /// The shape rule: the output shape for operands of `shapes`, or an error naming the op and
    /// the shapes. Parameters are validated here too, so a recorded op is always well formed.
    pub fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape> {
        if shapes.len() != self.arity() {
            return Err(Error::Spec(SpecError::Arity {
                op: self.name(),
                expected: self.arity(),
                got: shapes.len(),
            }));
        }
        use Op::*;
        let s = shapes;
        let out = match self {
            Add | Sub | Mul | Div | Max | Min => elementwise::binary_shape(self.name(), s[0], s[1]),
            Scale(c) => elementwise::scale_params(*c).map(|()| s[0].clone()),
            Clamp { lo, hi } => elementwise::clamp_params(*lo, *hi).map(|()| s[0].clone()),
            SafeLog { eps } => elementwise::safe_log_params(*eps).map(|()| s[0].clone()),
            Abs | Sqrt | Exp | Log | Inv | Relu | Sigmoid | Tanh | Softplus | Detach => {
                Ok(s[0].clone())
            }
            Constant(t) => Ok(t.shape().clone()),
            Reshape(to) => shape::reshape_shape(s[0], to),
            Flatten => Ok(shape::flatten_shape(s[0])),
            Transpose2d => shape::transpose2d_shape(s[0]),
            PermuteBca => shape::permute_bca_shape(s[0]),
            PermuteCab => shape::permute_cab_shape(s[0]),
            SwapLastTwo => shape::swap_last_two_shape(s[0]),
            SwapAdjacent(depth) => Ok(shape::swap_adjacent_shape(s[0], *depth)),
            BroadcastTo(to) => broadcast::broadcast_shape(s[0], to),
            Sum => Ok(Shape::scalar()),
            ReduceSum(axis) => reduce::reduce_axis_shape("reduceSum", s[0], *axis),
            ReduceMean(axis) => reduce::reduce_axis_shape("reduceMean", s[0], *axis),
            Matmul => linalg::matmul_shape(s[0], s[1]),
            Bmm => linalg::bmm_shape(s[0], s[1]),
            Linear => linalg::linear_shape(s[0], s[1], s[2]),
            Softmax => softmax::softmax_shape("softmax", s[0]),
            LogSoftmax => softmax::softmax_shape("logSoftmax", s[0]),
            MseLoss => loss::mse_loss_shape(s[0], s[1]),
            SpectralConv1dRfft { modes } => {
                spectral::spectral_conv1d_shape(s[0], s[1], s[2], *modes)
            }
            RandUniform { shape, .. } => Ok(shape.clone()),
            BernoulliMask { shape, keep, .. } => {
                random::bernoulli_params(*keep).map(|()| shape.clone())
            }
            Dropout { keep, .. } => random::dropout_params(*keep).map(|()| s[0].clone()),
        };
        Ok(out?)
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Op::*;
        match self {
            Scale(c) => write!(f, "scale({c})"),
            Clamp { lo, hi } => write!(f, "clamp({lo}, {hi})"),
            SafeLog { eps } => write!(f, "safeLog(eps={eps})"),
            Constant(t) => write!(f, "constant{}", t.shape()),
            Reshape(s) => write!(f, "reshape{s}"),
            SwapAdjacent(d) => write!(f, "swapAdjacent({d})"),
            BroadcastTo(s) => write!(f, "broadcastTo{s}"),
            ReduceSum(a) => write!(f, "reduceSum(axis={a})"),
            ReduceMean(a) => write!(f, "reduceMean(axis={a})"),
            SpectralConv1dRfft { modes } => write!(f, "spectralConv1dRfft(modes={modes})"),
            RandUniform {
                shape,
                seed,
                counter,
            } => write!(f, "randUniform{shape}(seed={seed}, counter={counter})"),
            BernoulliMask {
                shape,
                keep,
                seed,
                counter,
            } => write!(
                f,
                "bernoulliMask{shape}(keep={keep}, seed={seed}, counter={counter})"
            ),
            Dropout {
                keep,
                seed,
                counter,
            } => write!(f, "dropout(keep={keep}, seed={seed}, counter={counter})"),
            other => f.write_str(other.name()),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
