//! The shape rule of every op: output shape from operand shapes, static parameters validated.

use tl_spec::ops::attention::{masked_softmax_shape, mha, sdpa};
use tl_spec::ops::conv::ConvParams;
use tl_spec::ops::pool::{self, PoolParams};
use tl_spec::ops::{
    activation, concat, conv, cross_entropy, elementwise, index, linalg, loss, norm, random,
    reduce, shape, softmax, spectral,
};
use tl_spec::{Error as SpecError, Shape, broadcast};

use crate::{Error, Result};

use super::Op;

impl Op {
    /// The shape rule: the output shape for operands of `shapes`, or an error naming the op and
    /// the shapes. Parameters are validated here too, so a recorded op is always well formed.
    /// Every output shape is size-checked: an element count that overflows (or exceeds
    /// [`Shape::MAX_NUMEL`]) is a `TooLarge` error, never a wrapped count.
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
            | Silu | GeluErf => Ok(s[0].clone()),
            LeakyRelu { negative_slope } => {
                activation::leaky_relu_params(*negative_slope).map(|()| s[0].clone())
            }
            Elu { alpha } => activation::elu_params(*alpha).map(|()| s[0].clone()),
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
            LayerNorm { eps } => norm::norm_params(self.name(), *eps)
                .and_then(|()| norm::layer_norm_shape(s[0], s[1], s[2])),
            RmsNorm { eps } => {
                norm::norm_params(self.name(), *eps).and_then(|()| norm::rms_norm_shape(s[0], s[1]))
            }
            BatchNorm { eps } => norm::norm_params(self.name(), *eps)
                .and_then(|()| norm::batch_norm_shape(s[0], s[1], s[2])),
            BatchMoments => norm::batch_moments_shape(s[0]),
            MaskedSoftmax { mask } => masked_softmax_shape(s[0], mask),
            MultiHeadAttention { heads, mask, .. } => {
                mha::mha_dims([s[0], s[1], s[2], s[3]], s[4], *heads, mask.as_ref())
                    .map(|(_, out)| out)
            }
            ScaledDotProductAttention { heads, mask, .. } => {
                sdpa::sdpa_dims([s[0], s[1], s[2]], *heads, mask.as_ref()).map(|(_, out)| out)
            }
            Conv { stride, padding } | ConvTranspose { stride, padding } => {
                let p = ConvParams { stride, padding };
                conv::conv_shape(matches!(self, ConvTranspose { .. }), s[0], s[1], s[2], p)
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
            } => pool::pool_shape(
                self.name(),
                s[0],
                PoolParams {
                    kernel,
                    stride,
                    padding,
                },
            ),
            SmoothMaxPool {
                kernel,
                stride,
                padding,
                beta,
            } => pool::smooth_max_params(*beta).and_then(|()| {
                pool::pool_shape(
                    self.name(),
                    s[0],
                    PoolParams {
                        kernel,
                        stride,
                        padding,
                    },
                )
            }),
            SpectralConv1dRfft { modes } => {
                spectral::spectral_conv1d_shape(s[0], s[1], s[2], *modes)
            }
            RandUniform { shape, .. } => Ok(shape.clone()),
            BernoulliMask { shape, keep, .. } => {
                random::bernoulli_params(*keep).map(|()| shape.clone())
            }
            Dropout { keep, .. } => random::dropout_params(*keep).map(|()| s[0].clone()),
            User(u) => u.infer_shape(s),
        };
        let out = out?;
        out.check_size(self.name())?;
        Ok(out)
    }
}
