//! `Op`: the one op vocabulary shared by the IR, both tapes and the sessions.
//!
//! This file holds the variants (with their parameters and docs) and the small constructors;
//! [`info`] what each op is (name, family, arity, Nat reads, differentiability) and
//! [`shape_rule`] the shape rule ([`Op::infer_shape`]).

mod info;
mod shape_rule;

use std::fmt;

use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};

use crate::UserOpRef;

/// The pattern of every gather op (the variants `gather_indices` in [`rules`](crate::rules)
/// reads indices for), for the matches that treat them alike:
/// `match op { tl_ir::gather_ops!() => ..., _ => ... }`.
#[macro_export]
macro_rules! gather_ops {
    () => {
        $crate::Op::GatherScalar { .. }
            | $crate::Op::GatherRow { .. }
            | $crate::Op::GatherScalarRaw { .. }
            | $crate::Op::GatherRowRaw { .. }
            | $crate::Op::GatherScalarNat { .. }
            | $crate::Op::GatherRowNat { .. }
            | $crate::Op::GatherScalarsNatVec { .. }
            | $crate::Op::GatherRowsNatVec { .. }
            | $crate::Op::GatherIndexTensor
    };
}

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
    /// Layer and batch normalization.
    Norm,
    /// Masked softmax and multi-head attention.
    Attention,
    /// N-D convolution and transposed convolution.
    Conv,
    /// N-D max, average and smooth-max pooling.
    Pool,
    /// FNO spectral convolution.
    Spectral,
    /// Seeded randomness (uniform draws, Bernoulli masks, dropout).
    Random,
    /// Ops defined outside the catalogue ([`crate::user`]).
    User,
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
    /// The exact GELU `x·Φ(x) = ½·x·(1 + erf(x/√2))`. PyTorch: `F.gelu(x)`
    /// (`approximate="none"`, its default).
    GeluErf,
    /// `x` for x > 0, else `negative_slope·x`; derivative `negative_slope` at x = 0 (as
    /// PyTorch's autograd). PyTorch: `F.leaky_relu(x, negative_slope)` (default 0.01).
    LeakyRelu {
        /// The slope for x ≤ 0 (finite; PyTorch's default 0.01).
        negative_slope: f64,
    },
    /// `x` for x > 0, else `alpha·(eˣ − 1)`; derivative `alpha·eˣ` for x ≤ 0 (so `alpha` at
    /// x = 0, as PyTorch's autograd). PyTorch: `F.elu(x, alpha)` (default 1.0).
    Elu {
        /// The scale of the negative branch (finite; PyTorch's default 1.0).
        alpha: f64,
    },

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
    /// labels at positions `labels_at..labels_at + rows` of the Nat environment; a label ≥ classes gives its row 0 and no
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
    /// `x[i]` of a 1-D x, `i` the Nat at position `at` of the environment, → scalar; totalized (out of range → 0, no gradient).
    GatherScalarNat {
        /// Position of the index in the Nat environment.
        at: usize,
    },
    /// Row `i` of a 2-D x, `i` the Nat at position `at` of the environment, → (cols); totalized (out of range → zero row).
    GatherRowNat {
        /// Position of the index in the Nat environment.
        at: usize,
    },
    /// `k` elements of a 1-D x at positions `at..at + k` of the Nat environment → (k); totalized; repeated indices
    /// accumulate in the gradient. PyTorch: `x[idx]` (which raises when out of range).
    GatherScalarsNatVec {
        /// Position of the first index in the Nat environment.
        at: usize,
        /// Number of indices.
        k: usize,
    },
    /// `k` rows of a 2-D x at positions `at..at + k` of the Nat environment → (k, cols); totalized.
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

    // ---- norm ----
    /// `(x, γ, β) ↦ (x−μ)/sqrt(var+ε)·γ + β` over the last axis (biased variance), x of any
    /// rank ≥ 1, γ and β (D). PyTorch: `F.layer_norm(x, (D,), γ, β, eps)` (default ε 1e-5 there,
    /// [`Op::DEFAULT_EPS`] = 1e-6 here).
    LayerNorm {
        /// ε > 0, finite.
        eps: f64,
    },
    /// `(x, γ) ↦ x/sqrt(mean(x²)+ε)·γ` over the last axis, x of any rank ≥ 1, γ (D): layer
    /// norm without centring or β. PyTorch: `F.rms_norm(x, (D,), γ, eps)` (its default ε,
    /// `None`, is the dtype's machine epsilon; tl-nn's `RmsNorm` passes that).
    RmsNorm {
        /// ε > 0, finite.
        eps: f64,
    },
    /// `(x, γ, β)` with x (C, H, W) or (N, C, H, W): per-channel batch statistics over N·H·W,
    /// biased variance, no running statistics. PyTorch: `F.batch_norm(x, None, None, γ, β,
    /// training=True, eps=eps)`.
    BatchNorm {
        /// ε > 0, finite.
        eps: f64,
    },
    /// `x ↦ (2, C)`: the per-channel batch mean (row 0) and biased variance (row 1) of x
    /// (C, H, W) or (N, C, H, W), over N·H·W elements: the statistics `batchnormChannelFirst`
    /// normalizes with, computed where x lives so that a running-statistics update reads 2·C
    /// values. Differentiable (`dx = (gμ + 2·gv·(x − μ))/m`). PyTorch: `torch.var_mean(x,
    /// dim=(0, 2, 3), unbiased=False)`.
    BatchMoments,

    // ---- attention ----
    /// Softmax along the last axis with a static hard mask (n, n) broadcast over leading axes;
    /// masked entries are exactly 0, a row with nothing allowed is 0. PyTorch:
    /// `softmax(x.masked_fill(~mask, -inf), -1)` without its NaN rows.
    MaskedSoftmax {
        /// The mask (true = allowed).
        mask: Mask,
    },
    /// `(wq, wk, wv, wo, x) ↦ concat_h(softmax(Q_h K_hᵀ/√d) V_h)·wo` with Q, K, V = x·W; x (n,
    /// dModel) or (B, n, dModel). PyTorch: `nn.MultiheadAttention(bias=False)` self-attention.
    MultiHeadAttention {
        /// Number of heads (divides the projection width).
        heads: usize,
        /// Optional hard mask (n, n), true = allowed.
        mask: Option<Mask>,
        /// `true`: the streaming (flash-style) kernel that never holds more than one row of
        /// scores; `false`: the kernel that materializes the (heads, n, n) scores. Same value.
        fused: bool,
    },
    /// `(q, k, v) ↦ concat_h(softmax(Q_h K_hᵀ/√d) V_h)`: [`Op::MultiHeadAttention`]'s core
    /// without its projections. q (n, P) or (B, n, P), k and v one shape (nk, P) or (B, nk,
    /// P) (keys of q's length in self-attention, of another in cross-attention or over a KV
    /// cache), the heads side by side in each row (head h: columns h·d..(h+1)·d, P =
    /// heads·d); the output has q's shape. PyTorch: `F.scaled_dot_product_attention(attn_mask
    /// = mask)` on the heads split out and transposed to (B, heads, n, d), transposed back.
    ScaledDotProductAttention {
        /// Number of heads (divides P).
        heads: usize,
        /// Optional hard mask (n, nk), true = allowed.
        mask: Option<Mask>,
        /// As [`Op::MultiHeadAttention`]'s: the fused core (flash kernels on CUDA) or the
        /// materialized scores. Same value.
        fused: bool,
    },

    // ---- conv ----
    /// `(w, b, x) ↦ b + w ⋆ x`: N-D cross-correlation, channels-first, zero padding, groups 1,
    /// dilation 1. w (outC, inC, k1..kd), b (outC), x (inC, s1..sd) or (N, inC, s1..sd), d in
    /// 1..=8. PyTorch: `F.conv1d/2d/3d(x, w, b, stride, padding)`. See [`Op::conv2d`].
    Conv {
        /// Stride per spatial axis (≥ 1).
        stride: Vec<usize>,
        /// Zero padding per spatial axis, both sides.
        padding: Vec<usize>,
    },
    /// `(w, b, x) ↦` transposed convolution (the adjoint of conv w.r.t. its input, plus b);
    /// w (inC, outC, k1..kd), no output_padding. PyTorch: `F.conv_transpose1d/2d/3d`.
    ConvTranspose {
        /// Stride per spatial axis (≥ 1).
        stride: Vec<usize>,
        /// Padding per spatial axis (trimmed from both sides of the output).
        padding: Vec<usize>,
    },

    // ---- pool ----
    /// Max over each window, padded cells ignored, ties to the first cell in row-major window
    /// order. PyTorch: `F.max_pool1d/2d/3d`. See [`Op::max_pool2d`].
    MaxPool {
        /// Window extent per spatial axis (≥ 1).
        kernel: Vec<usize>,
        /// Stride per spatial axis (≥ 1).
        stride: Vec<usize>,
        /// Padding per spatial axis (2·padding ≤ kernel).
        padding: Vec<usize>,
    },
    /// Mean over each window, padded cells counted as 0, divisor the kernel volume. PyTorch:
    /// `F.avg_pool1d/2d/3d(count_include_pad=True)`.
    AvgPool {
        /// Window extent per spatial axis (≥ 1).
        kernel: Vec<usize>,
        /// Stride per spatial axis (≥ 1).
        stride: Vec<usize>,
        /// Padding per spatial axis (2·padding ≤ kernel).
        padding: Vec<usize>,
    },
    /// Log-sum-exp surrogate of max-pool, `p + log(Σ exp(β(x − p)))/β` per window (padded cells
    /// are the value 0). No PyTorch equivalent.
    SmoothMaxPool {
        /// Window extent per spatial axis (≥ 1).
        kernel: Vec<usize>,
        /// Stride per spatial axis (≥ 1).
        stride: Vec<usize>,
        /// Padding per spatial axis (2·padding ≤ kernel).
        padding: Vec<usize>,
        /// Sharpness β (finite, non-zero; negative gives a smooth min).
        beta: f64,
    },

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

    // ---- user ----
    /// An op defined outside the catalogue ([`crate::UserOp`]): its name, parameters, shape
    /// rule and faces are the user's. PyTorch: an op of `torch.library.custom_op`.
    User(UserOpRef),
}

impl Op {
    /// The user op `op` ([`Op::User`]).
    pub fn user(op: impl crate::UserOp) -> Op {
        Op::User(UserOpRef::new(op))
    }

    /// The default ε of the normalization ops (TorchLean's 1e-6; PyTorch's is 1e-5).
    pub const DEFAULT_EPS: f64 = 1e-6;

    /// `layerNorm` with the default ε.
    pub fn layer_norm() -> Op {
        Op::LayerNorm {
            eps: Op::DEFAULT_EPS,
        }
    }

    /// `batchnormChannelFirst` with the default ε.
    pub fn batch_norm() -> Op {
        Op::BatchNorm {
            eps: Op::DEFAULT_EPS,
        }
    }

    /// `concat1d`: [`Op::Concat`] on two 1-D operands (the seeds' name for that case).
    pub fn concat1d() -> Op {
        Op::Concat
    }

    /// `leakyRelu` with PyTorch's default slope, 0.01.
    pub fn leaky_relu() -> Op {
        Op::LeakyRelu {
            negative_slope: 0.01,
        }
    }

    /// `elu` with PyTorch's default alpha, 1.0.
    pub fn elu() -> Op {
        Op::Elu { alpha: 1.0 }
    }

    /// `slice1d(start, len)`: [`Op::Slice`] on a 1-D operand (the seeds' name for that case).
    pub fn slice1d(start: usize, len: usize) -> Op {
        Op::Slice { start, len }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Op::*;
        match self {
            Scale(c) => write!(f, "scale({c})"),
            Clamp { lo, hi } => write!(f, "clamp({lo}, {hi})"),
            SafeLog { eps } => write!(f, "safeLog(eps={eps})"),
            LeakyRelu { negative_slope } => write!(f, "leakyRelu(negative_slope={negative_slope})"),
            Elu { alpha } => write!(f, "elu(alpha={alpha})"),
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
            LayerNorm { eps } => write!(f, "layerNorm(eps={eps})"),
            RmsNorm { eps } => write!(f, "rmsNorm(eps={eps})"),
            BatchNorm { eps } => write!(f, "batchnormChannelFirst(eps={eps})"),
            BatchMoments => f.write_str("batchMoments"),
            MaskedSoftmax { mask } => write!(f, "maskedSoftmax({mask:?})"),
            MultiHeadAttention { heads, mask, fused }
            | ScaledDotProductAttention { heads, mask, fused } => {
                write!(f, "{}(heads={heads}, fused={fused}", self.name())?;
                match mask {
                    Some(m) => write!(f, ", {m:?})"),
                    None => f.write_str(")"),
                }
            }
            Conv { stride, padding } | ConvTranspose { stride, padding } => {
                write!(f, "{}(stride={stride:?}, padding={padding:?})", self.name())
            }
            MaxPool {
                kernel,
                stride,
                padding,
            }
            | AvgPool {
                kernel,
                stride,
                padding,
            } => write!(
                f,
                "{}(kernel={kernel:?}, stride={stride:?}, padding={padding:?})",
                self.name()
            ),
            SmoothMaxPool {
                kernel,
                stride,
                padding,
                beta,
            } => write!(
                f,
                "smoothMaxPool(kernel={kernel:?}, stride={stride:?}, padding={padding:?}, beta={beta})"
            ),
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
            User(u) => write!(f, "{u:?}"),
            other => f.write_str(other.name()),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
