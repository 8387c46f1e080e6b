//! `Op`: the one op vocabulary shared by the IR, both tapes and the sessions, with its shape rule.

use std::fmt;

use tl_spec::ops::{
    concat, cross_entropy, elementwise, index, linalg, loss, reduce, shape, softmax,
};
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
    /// Gathers and scatter-adds (indices are never differentiable).
    Index,
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
    /// `0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))`. PyTorch: `F.gelu(x, approximate="tanh")`.
    Gelu,
    /// `x·sigmoid(x)`. PyTorch: `F.silu`.
    Silu,

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
    /// `(a, b)` joined along axis 0 (equal trailing dims); on 1-D operands the seeds'
    /// `concat1d` (see [`Op::concat1d`]). PyTorch: `torch.cat([a, b], 0)`.
    Concat,
    /// `x[start..start+len]` along axis 0, bounds checked at record time; on 1-D the seeds'
    /// `slice1d` (see [`Op::slice1d`]). PyTorch: `x[start:start+len]`.
    Slice {
        /// First row.
        start: usize,
        /// Number of rows.
        len: usize,
    },

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
    /// Mean over rows of `−logSoftmax(logits)[r, label_r]`; logits (rows, classes) or (classes),
    /// labels `natVecAt(nats, labels_at, rows)`; a label ≥ classes gives its row 0 and no
    /// gradient. PyTorch: `F.cross_entropy` (which raises on such a label).
    CrossEntropy {
        /// Position of the first label in the Nat environment.
        labels_at: usize,
    },

    // ---- index (see `tl_spec::ops::index`) ----
    /// `x[index]` of a 1-D x → scalar; index checked at record time. PyTorch: `x[i]`.
    GatherScalar {
        /// The element.
        index: usize,
    },
    /// Row `index` of a 2-D x → (cols); index checked at record time. PyTorch: `x[i]`.
    GatherRow {
        /// The row.
        index: usize,
    },
    /// `x[index]` of a 1-D x with an unchecked raw index: out of range → 0, no gradient.
    GatherScalarRaw {
        /// The element (may be out of range).
        index: usize,
    },
    /// Row `index` of a 2-D x, unchecked: out of range → a zero row, no gradient.
    GatherRowRaw {
        /// The row (may be out of range).
        index: usize,
    },
    /// `x[natAt(nats, at)]` of a 1-D x → scalar; totalized (out of range → 0, no gradient).
    GatherScalarNat {
        /// Position of the index in the Nat environment.
        at: usize,
    },
    /// Row `natAt(nats, at)` of a 2-D x → (cols); totalized (out of range → zero row).
    GatherRowNat {
        /// Position of the index in the Nat environment.
        at: usize,
    },
    /// `k` elements of a 1-D x at `natVecAt(nats, at, k)` → (k); totalized; repeated indices
    /// accumulate in the gradient. PyTorch: `x[idx]` (which raises when out of range).
    GatherScalarsNatVec {
        /// Position of the first index in the Nat environment.
        at: usize,
        /// Number of indices.
        k: usize,
    },
    /// `k` rows of a 2-D x at `natVecAt(nats, at, k)` → (k, cols); totalized.
    /// PyTorch: `torch.index_select(x, 0, idx)`.
    GatherRowsNatVec {
        /// Position of the first index in the Nat environment.
        at: usize,
        /// Number of indices.
        k: usize,
    },
    /// `(x, idx) ↦ x[idx]`: x (n) or (rows, cols), idx a 1-D tensor of indices (non-negative
    /// integral values in range; anything else gives 0 / a zero row); idx gets no gradient.
    /// PyTorch: `torch.index_select(x, 0, idx.long())`.
    GatherIndexTensor,
    /// `(x, v) ↦ x` with `x[index] += v`; x (n), v scalar. PyTorch: `x.index_add(0, i, v)`.
    ScatterAddVec {
        /// The element (checked at record time).
        index: usize,
    },
    /// `(x, v) ↦ x` with row `index` += v; x (rows, cols), v (cols). PyTorch: `x.index_add`.
    ScatterAddRow {
        /// The row (checked at record time).
        index: usize,
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
            Gelu => "gelu",
            Silu => "silu",
            Concat => "concat0",
            Slice { .. } => "sliceRange0",
            CrossEntropy { .. } => "crossEntropy",
            GatherScalar { .. } => "gatherScalar",
            GatherRow { .. } => "gatherRow",
            GatherScalarRaw { .. } => "gatherScalarRaw",
            GatherRowRaw { .. } => "gatherRowRaw",
            GatherScalarNat { .. } => "gatherScalarNat",
            GatherRowNat { .. } => "gatherRowNat",
            GatherScalarsNatVec { .. } => "gatherScalarsNatVec",
            GatherRowsNatVec { .. } => "gatherRowsNatVec",
            GatherIndexTensor => "gather",
            ScatterAddVec { .. } => "scatterAddVec",
            ScatterAddRow { .. } => "scatterAddRow",
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
            | Constant(_)
            | Gelu
            | Silu => Family::Elementwise,
            Reshape(_)
            | Flatten
            | Transpose2d
            | PermuteBca
            | PermuteCab
            | SwapLastTwo
            | SwapAdjacent(_)
            | BroadcastTo(_)
            | Concat
            | Slice { .. } => Family::Shape,
            Sum | ReduceSum(_) | ReduceMean(_) => Family::Reduce,
            Matmul | Bmm | Linear => Family::Linalg,
            Softmax | LogSoftmax => Family::Softmax,
            MseLoss | CrossEntropy { .. } => Family::Loss,
            GatherScalar { .. }
            | GatherRow { .. }
            | GatherScalarRaw { .. }
            | GatherRowRaw { .. }
            | GatherScalarNat { .. }
            | GatherRowNat { .. }
            | GatherScalarsNatVec { .. }
            | GatherRowsNatVec { .. }
            | GatherIndexTensor
            | ScatterAddVec { .. }
            | ScatterAddRow { .. } => Family::Index,
        }
    }

    /// How many tensor operands the op takes.
    pub fn arity(&self) -> usize {
        use Op::*;
        match self {
            Constant(_) => 0,
            Add | Sub | Mul | Div | Max | Min | Matmul | Bmm | MseLoss | Concat => 2,
            GatherIndexTensor | ScatterAddVec { .. } | ScatterAddRow { .. } => 2,
            Linear => 3,
            _ => 1,
        }
    }

    /// Whether the op reads the Nat environment (runtime indices, labels). Tapes snapshot the
    /// environment for such nodes so their backward sees the indices their forward used.
    pub fn reads_nats(&self) -> bool {
        use Op::*;
        matches!(
            self,
            GatherScalarNat { .. }
                | GatherRowNat { .. }
                | GatherScalarsNatVec { .. }
                | GatherRowsNatVec { .. }
                | CrossEntropy { .. }
        )
    }

    /// `concat1d`: [`Op::Concat`] on two 1-D operands (the seeds' name for that case).
    pub fn concat1d() -> Op {
        Op::Concat
    }

    /// `slice1d(start, len)`: [`Op::Slice`] on a 1-D operand (the seeds' name for that case).
    pub fn slice1d(start: usize, len: usize) -> Op {
        Op::Slice { start, len }
    }

    /// Whether gradients flow through the op to its operands (false for `detach`, `constant`).
    pub fn is_differentiable(&self) -> bool {
        !matches!(self, Op::Detach | Op::Constant(_))
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
            Abs | Sqrt | Exp | Log | Inv | Relu | Sigmoid | Tanh | Softplus | Detach | Gelu
            | Silu => Ok(s[0].clone()),
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
            Concat => concat::concat_shape(s[0], s[1]),
            Slice { start, len } => concat::slice_shape(s[0], *start, *len),
            CrossEntropy { .. } => cross_entropy::cross_entropy_shape(s[0]),
            GatherScalar { index } => index::gather_scalar_shape(self.name(), s[0], Some(*index)),
            GatherRow { index } => index::gather_row_shape(self.name(), s[0], Some(*index)),
            GatherScalarRaw { .. } | GatherScalarNat { .. } => {
                index::gather_scalar_shape(self.name(), s[0], None)
            }
            GatherRowRaw { .. } | GatherRowNat { .. } => {
                index::gather_row_shape(self.name(), s[0], None)
            }
            GatherScalarsNatVec { k, .. } => index::gather_scalars_shape(self.name(), s[0], *k),
            GatherRowsNatVec { k, .. } => index::gather_rows_shape(self.name(), s[0], *k),
            GatherIndexTensor => index::gather_index_tensor_shape(s[0], s[1]),
            ScatterAddVec { index } => index::scatter_add_vec_shape(s[0], s[1], *index),
            ScatterAddRow { index } => index::scatter_add_row_shape(s[0], s[1], *index),
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
            Slice { start, len } => write!(f, "sliceRange0(start={start}, len={len})"),
            CrossEntropy { labels_at } => write!(f, "crossEntropy(labels_at={labels_at})"),
            GatherScalar { index }
            | GatherRow { index }
            | GatherScalarRaw { index }
            | GatherRowRaw { index }
            | ScatterAddVec { index }
            | ScatterAddRow { index } => write!(f, "{}({index})", self.name()),
            GatherScalarNat { at } | GatherRowNat { at } => write!(f, "{}(at={at})", self.name()),
            GatherScalarsNatVec { at, k } | GatherRowsNatVec { at, k } => {
                write!(f, "{}(at={at}, k={k})", self.name())
            }
            other => f.write_str(other.name()),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
