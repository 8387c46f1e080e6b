//! The reference rules of every op, dispatched to `tl_spec::ops`: value, VJP and JVP.
//!
//! Three matches, one per face, so each op's rules can be audited side by side. Shapes have been
//! checked by [`Op::infer_shape`] before any of these run. `nats` is the Nat environment (runtime
//! indices and labels) that ops such as `gatherNat` read; reads past its end give 0 (totalized).

use tl_spec::ops::attention::{self as att, mha, sdpa};
use tl_spec::ops::conv::{self, ConvParams, ConvTangents};
use tl_spec::ops::index::{self as ix, nat_at, try_nat_vec_at};
use tl_spec::ops::norm::{self, Groups};
use tl_spec::ops::pool::{self, PoolParams};
use tl_spec::ops::{activation as act, concat, cross_entropy as ce};
use tl_spec::ops::{elementwise as ew, linalg, loss, random, reduce, shape, softmax, spectral};
use tl_spec::{Scalar, Tensor, broadcast};

use crate::{Error, Op, Result, user};

/// The operands of one op application, in [`Op`] operand order.
type Args<'a, T> = &'a [&'a Tensor<T>];

fn arity_check(op: &Op, n: usize) -> Result<()> {
    if n != op.arity() {
        return Err(Error::Spec(tl_spec::Error::Arity {
            op: op.name(),
            expected: op.arity(),
            got: n,
        }));
    }
    Ok(())
}

/// The normalization groups of a norm op on `x` (rows for `layerNorm` and `rmsNorm`, channels
/// otherwise).
fn groups<T: Scalar>(op: &Op, x: &Tensor<T>) -> Groups {
    match op {
        Op::LayerNorm { .. } => Groups::layer(x.shape()),
        Op::RmsNorm { .. } => Groups::rms(x.shape()),
        _ => Groups::channels(x.shape()),
    }
}

/// The reference value of `op` applied to `x`.
///
/// The output shape is inferred and checked against the allocation cap ([`tl_spec::alloc`])
/// before anything is computed, so an oversized output is an error, not an abort.
///
/// An output with no element is returned as it is, without running the rule: there is nothing to
/// compute, and a rule's loops over its operands' dims could run for hours (`[2⁶², 0]`).
pub fn value<T: Scalar>(op: &Op, x: Args<'_, T>, nats: &[usize]) -> Result<Tensor<T>> {
    arity_check(op, x.len())?;
    let out = op.infer_shape(&shapes(x))?;
    tl_spec::alloc::check_shape::<T>(op.name(), &out)?;
    if out.checked_numel() == Some(0) {
        return Ok(Tensor::new(out, Vec::new())?);
    }
    if let Some(idx) = gather_indices(op, x, nats)? {
        return Ok(ix::gather(op.name(), x[0], &idx, out)?);
    }
    use Op::*;
    let y = match op {
        Add => ew::add(x[0], x[1]),
        Sub => ew::sub(x[0], x[1]),
        Mul => ew::mul(x[0], x[1]),
        Div => ew::div(x[0], x[1]),
        Scale(c) => ew::scale(x[0], T::lit(*c)),
        Abs => ew::abs(x[0]),
        Sqrt => ew::sqrt(x[0]),
        Exp => ew::exp(x[0]),
        Log => ew::log(x[0]),
        Inv => ew::inv(x[0]),
        Relu => ew::relu(x[0]),
        Clamp { lo, hi } => ew::clamp(x[0], T::lit(*lo), T::lit(*hi)),
        Max => ew::max(x[0], x[1]),
        Min => ew::min(x[0], x[1]),
        Sigmoid => ew::sigmoid(x[0]),
        Tanh => ew::tanh(x[0]),
        Softplus => ew::softplus(x[0]),
        SafeLog { eps } => ew::safe_log(x[0], T::lit(*eps)),
        Detach => Ok(x[0].clone()),
        Constant(t) => t.try_cast(op.name()),
        Reshape(to) => x[0].reshape(to.clone()),
        Flatten => Ok(shape::flatten(x[0])),
        Transpose2d => shape::transpose2d(x[0]),
        PermuteBca => shape::permute_bca(x[0]),
        PermuteCab => shape::permute_cab(x[0]),
        SwapLastTwo => shape::swap_last_two(x[0]),
        SwapAdjacent(d) => shape::swap_adjacent(x[0], *d),
        BroadcastTo(to) => broadcast::broadcast_to(x[0], to),
        Sum => Ok(reduce::sum(x[0])),
        ReduceSum(axis) => reduce::reduce_sum(x[0], *axis),
        ReduceMean(axis) => reduce::reduce_mean(x[0], *axis),
        Matmul => linalg::matmul(x[0], x[1]),
        Bmm => linalg::bmm(x[0], x[1]),
        Linear => linalg::linear(x[0], x[1], x[2]),
        Softmax => softmax::softmax(x[0]),
        LogSoftmax => softmax::log_softmax(x[0]),
        MseLoss => loss::mse_loss(x[0], x[1]),
        Gelu => act::gelu(x[0]),
        Silu => act::silu(x[0]),
        GeluErf => act::gelu_erf(x[0]),
        LeakyRelu { negative_slope } => act::leaky_relu(x[0], T::lit(*negative_slope)),
        Elu { alpha } => act::elu(x[0], T::lit(*alpha)),
        Concat => concat::concat(x[0], x[1]),
        Slice { start, len } => concat::slice(x[0], *start, *len),
        CrossEntropy { labels_at } => {
            ce::cross_entropy(x[0], &ce::labels(x[0].shape(), nats, *labels_at)?)
        }
        ScatterAddVec { index } | ScatterAddRow { index } => {
            op.infer_shape(&shapes(x))?;
            ix::scatter_add(op.name(), x[0], x[1], *index)
        }
        crate::gather_ops!() => Err(gathers_dispatch_first(op)),
        LayerNorm { eps } => norm::layer_norm(x[0], x[1], x[2], T::lit(*eps)),
        RmsNorm { eps } => norm::rms_norm(x[0], x[1], T::lit(*eps)),
        BatchNorm { eps } => norm::batch_norm(x[0], x[1], x[2], T::lit(*eps)),
        BatchMoments => norm::batch_moments(x[0]),
        MaskedSoftmax { mask } => att::masked_softmax(x[0], mask),
        MultiHeadAttention { heads, mask, .. } => {
            mha::multi_head_attention([x[0], x[1], x[2], x[3]], x[4], *heads, mask.as_ref())
        }
        ScaledDotProductAttention { heads, mask, .. } => {
            sdpa::scaled_dot_product_attention([x[0], x[1], x[2]], *heads, mask.as_ref())
        }
        Conv { stride, padding } => conv::conv(x[0], x[1], x[2], ConvParams { stride, padding }),
        ConvTranspose { stride, padding } => {
            conv::conv_transpose(x[0], x[1], x[2], ConvParams { stride, padding })
        }
        MaxPool { .. } => window(op).and_then(|p| pool::max_pool(x[0], p)),
        AvgPool { .. } => window(op).and_then(|p| pool::avg_pool(x[0], p)),
        SmoothMaxPool { beta, .. } => {
            window(op).and_then(|p| pool::smooth_max_pool(x[0], p, *beta))
        }
        SpectralConv1dRfft { modes } => spectral::spectral_conv1d(x[0], x[1], x[2], *modes),
        RandUniform {
            shape,
            seed,
            counter,
        } => random::rand_uniform(shape, *seed, *counter),
        BernoulliMask {
            shape,
            keep,
            seed,
            counter,
        } => random::bernoulli_mask(shape, *keep, *seed, *counter),
        Dropout {
            keep,
            seed,
            counter,
        } => random::dropout(x[0], *keep, *seed, *counter),
        User(u) => u
            .value(x)
            .and_then(|y| user::check_shape(u, "reference value", y, &out)),
    };
    Ok(y?)
}

/// The reference VJP of `op` at `x` for the cotangent `g` of its output: one entry per operand,
/// `None` where no gradient flows (`detach`, `constant`, index operands).
pub fn vjp<T: Scalar>(
    op: &Op,
    x: Args<'_, T>,
    g: &Tensor<T>,
    nats: &[usize],
) -> Result<Vec<Option<Tensor<T>>>> {
    arity_check(op, x.len())?;
    op.infer_shape(&shapes(x))?;
    if let Some(idx) = gather_indices(op, x, nats)? {
        let dx = ix::gather_vjp(op.name(), x[0].shape(), &idx, g)?;
        // The index tensor of `gather` never gets a gradient.
        return Ok(if op.arity() == 2 {
            vec![Some(dx), None]
        } else {
            vec![Some(dx)]
        });
    }
    use Op::*;
    let one = |t: tl_spec::Result<Tensor<T>>| t.map(|t| vec![Some(t)]);
    let two = |t: tl_spec::Result<(Tensor<T>, Tensor<T>)>| t.map(|(a, b)| vec![Some(a), Some(b)]);
    let grads = match op {
        Add => two(ew::add_vjp(x[0], x[1], g)),
        Sub => two(ew::sub_vjp(x[0], x[1], g)),
        Mul => two(ew::mul_vjp(x[0], x[1], g)),
        Div => two(ew::div_vjp(x[0], x[1], g)),
        Scale(c) => one(ew::scale_vjp(x[0], T::lit(*c), g)),
        Abs => one(ew::abs_vjp(x[0], g)),
        Sqrt => one(ew::sqrt_vjp(x[0], g)),
        Exp => one(ew::exp_vjp(x[0], g)),
        Log => one(ew::log_vjp(x[0], g)),
        Inv => one(ew::inv_vjp(x[0], g)),
        Relu => one(ew::relu_vjp(x[0], g)),
        Clamp { lo, hi } => one(ew::clamp_vjp(x[0], T::lit(*lo), T::lit(*hi), g)),
        Max => two(ew::max_vjp(x[0], x[1], g)),
        Min => two(ew::min_vjp(x[0], x[1], g)),
        Sigmoid => one(ew::sigmoid_vjp(x[0], g)),
        Tanh => one(ew::tanh_vjp(x[0], g)),
        Softplus => one(ew::softplus_vjp(x[0], g)),
        SafeLog { eps } => one(ew::safe_log_vjp(x[0], T::lit(*eps), g)),
        Detach => Ok(vec![None]),
        Constant(_) => Ok(vec![]),
        Reshape(_) | Flatten => one(g.reshape(x[0].shape().clone())),
        Transpose2d => one(shape::transpose2d(g)),
        PermuteBca => one(shape::permute_cab(g)),
        PermuteCab => one(shape::permute_bca(g)),
        SwapLastTwo => one(shape::swap_last_two(g)),
        SwapAdjacent(d) => Ok(vec![Some(shape::swap_adjacent(g, *d)?)]),
        BroadcastTo(_) => one(broadcast::reduce_to(g, x[0].shape())),
        Sum => one(reduce::sum_vjp(x[0], g)),
        ReduceSum(axis) => one(reduce::reduce_sum_vjp(x[0], *axis, g)),
        ReduceMean(axis) => one(reduce::reduce_mean_vjp(x[0], *axis, g)),
        Matmul => two(linalg::matmul_vjp(x[0], x[1], g)),
        Bmm => two(linalg::bmm_vjp(x[0], x[1], g)),
        Linear => linalg::linear_vjp(x[0], x[1], x[2], g)
            .map(|(dw, db, dx)| vec![Some(dw), Some(db), Some(dx)]),
        Softmax => one(softmax::softmax_vjp(x[0], g)),
        LogSoftmax => one(softmax::log_softmax_vjp(x[0], g)),
        MseLoss => two(loss::mse_loss_vjp(x[0], x[1], g)),
        Gelu => one(act::gelu_vjp(x[0], g)),
        Silu => one(act::silu_vjp(x[0], g)),
        GeluErf => one(act::gelu_erf_vjp(x[0], g)),
        LeakyRelu { negative_slope } => one(act::leaky_relu_vjp(x[0], T::lit(*negative_slope), g)),
        Elu { alpha } => one(act::elu_vjp(x[0], T::lit(*alpha), g)),
        Concat => two(concat::concat_vjp(x[0], x[1], g)),
        Slice { start, len } => one(concat::slice_vjp(x[0], *start, *len, g)),
        CrossEntropy { labels_at } => ce::labels(x[0].shape(), nats, *labels_at)
            .and_then(|l| ce::cross_entropy_vjp(x[0], &l, g))
            .map(|d| vec![Some(d)]),
        ScatterAddVec { index } | ScatterAddRow { index } => {
            op.infer_shape(&shapes(x))?;
            two(ix::scatter_add_vjp(op.name(), x[0], x[1], *index, g))
        }
        crate::gather_ops!() => Err(gathers_dispatch_first(op)),
        LayerNorm { eps } | BatchNorm { eps } => {
            norm::normalize_vjp(groups(op, x[0]), x[0], x[1], true, T::lit(*eps), g)
                .map(|(dx, dg, db)| vec![Some(dx), Some(dg), db])
        }
        RmsNorm { eps } => {
            norm::normalize_vjp(groups(op, x[0]), x[0], x[1], false, T::lit(*eps), g)
                .map(|(dx, dg, _)| vec![Some(dx), Some(dg)])
        }
        BatchMoments => one(norm::batch_moments_vjp(x[0], g)),
        MaskedSoftmax { mask } => one(att::masked_softmax_vjp(x[0], mask, g)),
        MultiHeadAttention { heads, mask, .. } => {
            let w = [x[0], x[1], x[2], x[3]];
            mha::multi_head_attention_vjp(w, x[4], *heads, mask.as_ref(), g)
                .map(|d| d.into_iter().map(Some).collect())
        }
        ScaledDotProductAttention { heads, mask, .. } => {
            let qkv = [x[0], x[1], x[2]];
            sdpa::scaled_dot_product_attention_vjp(qkv, *heads, mask.as_ref(), g)
                .map(|d| d.into_iter().map(Some).collect())
        }
        Conv { stride, padding } => {
            conv::conv_vjp(x[0], x[1], x[2], ConvParams { stride, padding }, g)
                .map(|(dw, db, dx)| vec![Some(dw), Some(db), Some(dx)])
        }
        ConvTranspose { stride, padding } => {
            conv::conv_transpose_vjp(x[0], x[1], x[2], ConvParams { stride, padding }, g)
                .map(|(dw, db, dx)| vec![Some(dw), Some(db), Some(dx)])
        }
        MaxPool { .. } => one(window(op).and_then(|p| pool::max_pool_vjp(x[0], p, g))),
        AvgPool { .. } => one(window(op).and_then(|p| pool::avg_pool_vjp(x[0], p, g))),
        SmoothMaxPool { beta, .. } => {
            one(window(op).and_then(|p| pool::smooth_max_pool_vjp(x[0], p, *beta, g)))
        }
        SpectralConv1dRfft { modes } => spectral::spectral_conv1d_vjp(x[0], x[1], x[2], *modes, g)
            .map(|(dx, dr, di)| vec![Some(dx), Some(dr), Some(di)]),
        // Operand-free draws: nothing to differentiate.
        RandUniform { .. } | BernoulliMask { .. } => Ok(vec![]),
        Dropout {
            keep,
            seed,
            counter,
        } => one(random::dropout_vjp(x[0], *keep, *seed, *counter, g)),
        User(u) => u
            .vjp(x, g)
            .and_then(|d| user::check_grads(u, "reference VJP", x, d)),
    };
    Ok(grads?)
}

/// The reference JVP of `op` at `x` along the operand tangents `dx` (one per operand, same shapes).
pub fn jvp<T: Scalar>(
    op: &Op,
    x: Args<'_, T>,
    dx: Args<'_, T>,
    nats: &[usize],
) -> Result<Tensor<T>> {
    arity_check(op, x.len())?;
    arity_check(op, dx.len())?;
    let out = op.infer_shape(&shapes(x))?;
    tl_spec::alloc::check_shape::<T>(op.name(), &out)?;
    if out.checked_numel() == Some(0) {
        // No element: nothing to compute (as in `value`).
        return Ok(Tensor::new(out, Vec::new())?);
    }
    if let Some(idx) = gather_indices(op, x, nats)? {
        // Gathers are linear in x; the indices come from x (never from a tangent).
        return Ok(ix::gather(op.name(), dx[0], &idx, out)?);
    }
    use Op::*;
    let t = match op {
        Add => ew::add_jvp(x[0], x[1], dx[0], dx[1]),
        Sub => ew::sub_jvp(x[0], x[1], dx[0], dx[1]),
        Mul => ew::mul_jvp(x[0], x[1], dx[0], dx[1]),
        Div => ew::div_jvp(x[0], x[1], dx[0], dx[1]),
        Scale(c) => ew::scale_jvp(x[0], T::lit(*c), dx[0]),
        Abs => ew::abs_jvp(x[0], dx[0]),
        Sqrt => ew::sqrt_jvp(x[0], dx[0]),
        Exp => ew::exp_jvp(x[0], dx[0]),
        Log => ew::log_jvp(x[0], dx[0]),
        Inv => ew::inv_jvp(x[0], dx[0]),
        Relu => ew::relu_jvp(x[0], dx[0]),
        Clamp { lo, hi } => ew::clamp_jvp(x[0], T::lit(*lo), T::lit(*hi), dx[0]),
        Max => ew::max_jvp(x[0], x[1], dx[0], dx[1]),
        Min => ew::min_jvp(x[0], x[1], dx[0], dx[1]),
        Sigmoid => ew::sigmoid_jvp(x[0], dx[0]),
        Tanh => ew::tanh_jvp(x[0], dx[0]),
        Softplus => ew::softplus_jvp(x[0], dx[0]),
        SafeLog { eps } => ew::safe_log_jvp(x[0], T::lit(*eps), dx[0]),
        Detach => Tensor::try_zeros(op.name(), x[0].shape().clone()),
        Constant(c) => Tensor::try_zeros(op.name(), c.shape().clone()),
        // Linear ops: the JVP is the op applied to the tangent.
        Reshape(_) | Flatten | Transpose2d | PermuteBca | PermuteCab | SwapLastTwo
        | SwapAdjacent(_) | BroadcastTo(_) | Sum | ReduceSum(_) | ReduceMean(_) => {
            return value(op, dx, nats);
        }
        Matmul => linalg::matmul_jvp(x[0], x[1], dx[0], dx[1]),
        Bmm => linalg::bmm_jvp(x[0], x[1], dx[0], dx[1]),
        Linear => linalg::linear_jvp(x[0], x[1], x[2], dx[0], dx[1], dx[2]),
        Softmax => softmax::softmax_jvp(x[0], dx[0]),
        LogSoftmax => softmax::log_softmax_jvp(x[0], dx[0]),
        MseLoss => loss::mse_loss_jvp(x[0], x[1], dx[0], dx[1]),
        Gelu => act::gelu_jvp(x[0], dx[0]),
        Silu => act::silu_jvp(x[0], dx[0]),
        GeluErf => act::gelu_erf_jvp(x[0], dx[0]),
        LeakyRelu { negative_slope } => act::leaky_relu_jvp(x[0], T::lit(*negative_slope), dx[0]),
        Elu { alpha } => act::elu_jvp(x[0], T::lit(*alpha), dx[0]),
        // Linear in all operands: the op applied to the tangents.
        Concat | Slice { .. } | ScatterAddVec { .. } | ScatterAddRow { .. } => {
            return value(op, dx, nats);
        }
        CrossEntropy { labels_at } => ce::labels(x[0].shape(), nats, *labels_at)
            .and_then(|l| ce::cross_entropy_jvp(x[0], &l, dx[0])),
        crate::gather_ops!() => Err(gathers_dispatch_first(op)),
        LayerNorm { eps } | BatchNorm { eps } => {
            let gr = groups(op, x[0]);
            norm::normalize_jvp(gr, x[0], x[1], T::lit(*eps), dx[0], dx[1], Some(dx[2]))
        }
        RmsNorm { eps } => norm::normalize_jvp(
            groups(op, x[0]),
            x[0],
            x[1],
            T::lit(*eps),
            dx[0],
            dx[1],
            None,
        ),
        BatchMoments => norm::batch_moments_jvp(x[0], dx[0]),
        MaskedSoftmax { mask } => att::masked_softmax_jvp(x[0], mask, dx[0]),
        // Forward mode through the composition of primitive ops (`compose`).
        MultiHeadAttention { heads, mask, .. } => {
            return crate::compose::multi_head_attention_jvp(x, dx, *heads, mask.as_ref(), nats);
        }
        ScaledDotProductAttention { heads, mask, .. } => {
            return crate::compose::scaled_dot_product_attention_jvp(x, dx, *heads, mask.as_ref());
        }
        Conv { stride, padding } | ConvTranspose { stride, padding } => {
            let p = ConvParams { stride, padding };
            let t = ConvTangents {
                dw: dx[0],
                db: dx[1],
                dx: dx[2],
            };
            if matches!(op, Conv { .. }) {
                conv::conv_jvp(x[0], x[1], x[2], p, t)
            } else {
                conv::conv_transpose_jvp(x[0], x[1], x[2], p, t)
            }
        }
        MaxPool { .. } => window(op).and_then(|p| pool::max_pool_jvp(x[0], p, dx[0])),
        AvgPool { .. } => window(op).and_then(|p| pool::avg_pool_jvp(x[0], p, dx[0])),
        SmoothMaxPool { beta, .. } => {
            window(op).and_then(|p| pool::smooth_max_pool_jvp(x[0], p, *beta, dx[0]))
        }
        SpectralConv1dRfft { modes } => {
            spectral::spectral_conv1d_jvp(x[0], x[1], x[2], *modes, dx[0], dx[1], dx[2])
        }
        RandUniform { shape, .. } | BernoulliMask { shape, .. } => {
            Tensor::try_zeros(op.name(), shape.clone())
        }
        Dropout {
            keep,
            seed,
            counter,
        } => random::dropout_jvp(x[0], *keep, *seed, *counter, dx[0]),
        User(u) => u
            .jvp(x, dx)
            .and_then(|t| user::check_shape(u, "reference JVP", t, &out)),
    };
    Ok(t?)
}

/// The error of a gather reaching a rule's op match: [`gather_indices`] sends every gather to
/// its own rule before the match (so this does not happen).
fn gathers_dispatch_first(op: &Op) -> tl_spec::Error {
    tl_spec::Error::param(op.name(), "gathers dispatch before this match")
}

/// The window of a pool op ([`Op::pool_params`]); the pool arms of the rule matches call it,
/// so the error (another op) does not happen.
fn window(op: &Op) -> tl_spec::Result<PoolParams<'_>> {
    op.pool_params()
        .ok_or_else(|| tl_spec::Error::param(op.name(), "not a pool op"))
}

fn shapes<'a, T: Scalar>(x: Args<'a, T>) -> Vec<&'a tl_spec::Shape> {
    x.iter().map(|t| t.shape()).collect()
}

/// The row indices a gather reads (static, raw, from the Nat environment or from its index
/// tensor), or `None` for an op that is not a gather. Out-of-range indices are kept as they are;
/// `tl_spec::ops::index::gather` gives them a zero row (and its VJP no gradient). An index
/// count too large to allocate is an error.
pub fn gather_indices<T: Scalar>(
    op: &Op,
    x: Args<'_, T>,
    nats: &[usize],
) -> Result<Option<Vec<usize>>> {
    use Op::*;
    let rows = || {
        x.first()
            .and_then(|t| t.shape().dims().first().copied())
            .unwrap_or(0)
    };
    Ok(Some(match op {
        GatherScalar { index }
        | GatherRow { index }
        | GatherScalarRaw { index }
        | GatherRowRaw { index } => vec![*index],
        GatherScalarNat { at } | GatherRowNat { at } => vec![nat_at(nats, *at)],
        GatherScalarsNatVec { at, k } | GatherRowsNatVec { at, k } => {
            try_nat_vec_at(op.name(), nats, *at, *k)?
        }
        GatherIndexTensor => match x.get(1) {
            Some(idx) => ix::index_tensor_values(op.name(), idx, rows())?,
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}
