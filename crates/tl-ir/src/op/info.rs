//! What an op is: its name as the seeds spell it, family, arity, whether it reads the Nat
//! environment, whether gradients flow through it.

use super::{Family, Op};

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
            GeluErf => "geluErf",
            LeakyRelu { .. } => "leakyRelu",
            Elu { .. } => "elu",
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
            LayerNorm { .. } => "layerNorm",
            RmsNorm { .. } => "rmsNorm",
            BatchNorm { .. } => "batchnormChannelFirst",
            BatchMoments => "batchMoments",
            MaskedSoftmax { .. } => "maskedSoftmax",
            MultiHeadAttention { .. } => "multiHeadAttention",
            ScaledDotProductAttention { .. } => "scaledDotProductAttention",
            Conv { .. } => "conv",
            ConvTranspose { .. } => "convTranspose",
            MaxPool { .. } => "maxPool",
            AvgPool { .. } => "avgPool",
            SmoothMaxPool { .. } => "smoothMaxPool",
            SpectralConv1dRfft { .. } => "spectralConv1dRfft",
            RandUniform { .. } => "randUniform",
            BernoulliMask { .. } => "bernoulliMask",
            Dropout { .. } => "dropout",
            User(u) => u.name(),
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
            | Silu
            | GeluErf
            | LeakyRelu { .. }
            | Elu { .. } => Family::Elementwise,
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
            crate::gather_ops!() | ScatterAddVec { .. } | ScatterAddRow { .. } => Family::Index,
            LayerNorm { .. } | RmsNorm { .. } | BatchNorm { .. } | BatchMoments => Family::Norm,
            MaskedSoftmax { .. } | MultiHeadAttention { .. } | ScaledDotProductAttention { .. } => {
                Family::Attention
            }
            Conv { .. } | ConvTranspose { .. } => Family::Conv,
            MaxPool { .. } | AvgPool { .. } | SmoothMaxPool { .. } => Family::Pool,
            SpectralConv1dRfft { .. } => Family::Spectral,
            RandUniform { .. } | BernoulliMask { .. } | Dropout { .. } => Family::Random,
            User(_) => Family::User,
        }
    }

    /// How many tensor operands the op takes.
    pub fn arity(&self) -> usize {
        use Op::*;
        match self {
            Constant(_) | RandUniform { .. } | BernoulliMask { .. } => 0,
            Add | Sub | Mul | Div | Max | Min | Matmul | Bmm | MseLoss | Concat => 2,
            RmsNorm { .. } => 2,
            GatherIndexTensor | ScatterAddVec { .. } | ScatterAddRow { .. } => 2,
            Linear
            | LayerNorm { .. }
            | BatchNorm { .. }
            | Conv { .. }
            | ConvTranspose { .. }
            | SpectralConv1dRfft { .. }
            | ScaledDotProductAttention { .. } => 3,
            MultiHeadAttention { .. } => 5,
            User(u) => u.arity(),
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

    /// Whether gradients flow through the op to its operands (false for `detach`, `constant`
    /// and the operand-free random draws).
    pub fn is_differentiable(&self) -> bool {
        if let Op::User(u) = self {
            return u.is_differentiable();
        }
        !matches!(
            self,
            Op::Detach | Op::Constant(_) | Op::RandUniform { .. } | Op::BernoulliMask { .. }
        )
    }
}
