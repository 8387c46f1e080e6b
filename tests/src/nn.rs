//! tl-nn's layers under the harness: every layer of `tl_nn` (Linear, Conv, ConvTranspose,
//! MaxPool, AvgPool, AdaptiveAvgPool, LayerNorm, BatchNorm, RmsNorm, GroupNorm, Embedding, Dropout, PRelu, Upsample,
//! MultiHeadAttention and its cross-attention,
//! SpectralConv1d, the activations, Flatten, Sequential) on random sizes, parameters and
//! inputs, on every session: eager CPU (f64, f32), eager CUDA simulation (f32) and linked
//! (f64, f32).
//!
//! For each case the layer's output and the gradients of a random linear functional
//! `⟨seed, output⟩` with respect to every trainable parameter and the input must equal the same
//! computation written with plain catalogue ops ([`LayerSpec::reference`], a `GraphBuilder`
//! graph evaluated and differentiated by the IR in f64: `eval` / `backprop_all`). The
//! reference does not read the layer's fields: it is built from the case's own sizes and
//! settings, so a layer that drops its bias, pads wrongly or swaps operands fails. Every value
//! is f32-representable, so each session sees exactly the reference's inputs; tolerances are
//! [`Tol::DEFAULT`]'s (f64: 1e-10; f32: 1e-4 scaled by the reference's longest reduction).

use std::cell::RefCell;

use proptest::prelude::*;
use tl_ir::{GraphBuilder, GraphData, Id, Op};
use tl_nn::{
    Activation, AdaptiveAvgPool, AvgPool, BatchNorm, Conv, ConvConfig, ConvTranspose, Dropout,
    Embedding, GroupNorm, LayerNorm, Linear, MaxPool, Module, MultiHeadAttention, PRelu,
    Parameters, RmsNorm, Runtime, Sequential, SpectralConv1d, Upsample, Vars,
};
use tl_session::{Backend, LinkedSession, Options, Param, Session, TensorRef, Train};
use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Shape, Tensor};

use crate::checks::reduction_len;
use crate::metric::{tensor_err, worst_index};
use crate::nn_activations::{ACTIVATIONS, activation_ref};
use crate::nn_attention::{CrossSizes, cross_attention_ref};
use crate::nn_cross_entropy::{ce_case, ce_cases};
use crate::{CaseResult, Measured, Report, RunConfig, Tol, run_check};

/// The default number of cases of one (layer, session) cell when `TL_CASES` is not set (the
/// sizes are small: 64 cases of all 85 cells take well under a second in the test profile).
pub const NN_CASES: u32 = 64;

/// The seed of the sessions' random ops (dropout masks), shared with the reference.
pub const NN_SEED: u64 = 7;

/// The sessions every layer runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NnSession {
    /// Eager `Session<f64>` on the CPU tape.
    CpuF64,
    /// Eager `Session<f32>` on the CPU tape.
    CpuF32,
    /// Eager `Session<f32>` on the CUDA tape over the simulation device.
    SimF32,
    /// `LinkedSession<f64>` (values by IR eval, gradients by `backward_dense_all`).
    LinkedF64,
    /// `LinkedSession<f32>`.
    LinkedF32,
}

impl NnSession {
    /// Every session, in report order.
    pub const ALL: [NnSession; 5] = [
        NnSession::CpuF64,
        NnSession::CpuF32,
        NnSession::SimF32,
        NnSession::LinkedF64,
        NnSession::LinkedF32,
    ];

    /// The name in labels and messages.
    pub fn name(self) -> &'static str {
        match self {
            NnSession::CpuF64 => "eager cpu-f64",
            NnSession::CpuF32 => "eager cpu-f32",
            NnSession::SimF32 => "eager cuda-sim-f32",
            NnSession::LinkedF64 => "linked f64",
            NnSession::LinkedF32 => "linked f32",
        }
    }
}

/// A session a layer case can run on: [`Train`] plus the gradients of a seeded backward pass.
pub trait LayerSession: Train {
    /// Backward from `out` with cotangent `seed`, then the gradient of each of `wrt`.
    fn seeded_grads(
        &mut self,
        out: &TensorRef,
        seed: Tensor<Self::T>,
        wrt: &[TensorRef],
    ) -> tl_session::Result<Vec<Tensor<Self::T>>>;
}

impl<T: Scalar> LayerSession for Session<T> {
    fn seeded_grads(
        &mut self,
        out: &TensorRef,
        seed: Tensor<T>,
        wrt: &[TensorRef],
    ) -> tl_session::Result<Vec<Tensor<T>>> {
        self.backward_with_seed(out, seed)?;
        wrt.iter().map(|r| self.grad_of(r)).collect()
    }
}

impl<T: Scalar> LayerSession for LinkedSession<T> {
    fn seeded_grads(
        &mut self,
        out: &TensorRef,
        seed: Tensor<T>,
        wrt: &[TensorRef],
    ) -> tl_session::Result<Vec<Tensor<T>>> {
        let dense = self.backward_dense_all(out, &seed)?;
        wrt.iter().map(|r| self.grad_of(&dense, r)).collect()
    }
}

/// One layer with its sizes and settings (what the case generator draws).
#[derive(Debug, Clone, PartialEq)]
pub enum LayerSpec {
    /// `Linear::with_bias(inputs, outputs, bias)` on x (lead…, inputs).
    Linear {
        /// Input features.
        inputs: usize,
        /// Output features.
        outputs: usize,
        /// Whether the layer has a bias.
        bias: bool,
        /// Leading axes of x (0 to 2 of them).
        lead: Vec<usize>,
    },
    /// `Conv::new` (or `ConvTranspose::new` when `transpose`) on x (\[N,\] inputs, spatial…).
    Conv {
        /// Transposed convolution.
        transpose: bool,
        /// Input channels.
        inputs: usize,
        /// Output channels.
        outputs: usize,
        /// Kernel size per spatial axis.
        kernel: Vec<usize>,
        /// Stride (all axes).
        stride: usize,
        /// Padding (all axes).
        padding: usize,
        /// Batch size, if x has a batch axis.
        batch: Option<usize>,
        /// Spatial sizes of x.
        spatial: Vec<usize>,
    },
    /// `MaxPool` (or `AvgPool` when `avg`) with stride and padding on x (\[N,\] C, spatial…).
    Pool {
        /// Average instead of max.
        avg: bool,
        /// Kernel per spatial axis.
        kernel: Vec<usize>,
        /// Stride (all axes).
        stride: usize,
        /// Padding (all axes; 2·padding ≤ every kernel size).
        padding: usize,
        /// x's leading axes (channels, or batch and channels).
        lead: Vec<usize>,
        /// Spatial sizes of x.
        spatial: Vec<usize>,
    },
    /// `LayerNorm::with_eps(dim, eps)` on x (lead…, dim), or with `over` not empty
    /// `LayerNorm::over(&[over…, dim], eps)` on x (lead…, over…, dim).
    LayerNorm {
        /// Normalised width (the last axis).
        dim: usize,
        /// Normalised axes before the last (none: the last axis alone).
        over: Vec<usize>,
        /// ε.
        eps: f64,
        /// Leading axes of x.
        lead: Vec<usize>,
    },
    /// `BatchNorm::with(channels, eps, momentum 0.1)` on x (n, channels, rest…), in a training
    /// pass (batch statistics) or an eval pass (running statistics).
    BatchNorm {
        /// Channels.
        channels: usize,
        /// Batch size.
        n: usize,
        /// Trailing axes.
        rest: Vec<usize>,
        /// ε.
        eps: f64,
        /// Training pass.
        training: bool,
    },
    /// `RmsNorm::new(dim)` (ε `None`: the element type's machine epsilon) or
    /// `RmsNorm::with_eps(dim, ε)` on x (lead…, dim).
    RmsNorm {
        /// Normalised width.
        dim: usize,
        /// ε, or `None` for the layer's default.
        eps: Option<f64>,
        /// Leading axes of x (none: a 1-D input).
        lead: Vec<usize>,
    },
    /// `GroupNorm::with_eps(groups, channels, eps)` on x (n, channels, rest…).
    GroupNorm {
        /// Groups.
        groups: usize,
        /// Channels (a multiple of `groups`).
        channels: usize,
        /// Batch size.
        n: usize,
        /// Trailing axes.
        rest: Vec<usize>,
        /// ε.
        eps: f64,
    },
    /// `Embedding::new(num, dim)` picking rows `ids`.
    Embedding {
        /// Rows of the table.
        num: usize,
        /// Width of a row.
        dim: usize,
        /// The ids picked.
        ids: Vec<usize>,
    },
    /// `Dropout::new(p)` on x of `shape`, in a training or eval pass.
    Dropout {
        /// Drop probability.
        p: f64,
        /// Training pass.
        training: bool,
        /// x's shape.
        shape: Vec<usize>,
    },
    /// `MultiHeadAttention::grouped(heads·head_dim, heads, kv_heads, causal)` (with rotary
    /// embeddings where `rope` says) on x (\[B,\] n, d).
    Attention {
        /// Heads.
        heads: usize,
        /// Key/value heads (dividing `heads`).
        kv_heads: usize,
        /// Rotary position embeddings (then `head_dim` is even).
        rope: Option<tl_nn::Rope>,
        /// Width per head.
        head_dim: usize,
        /// Causal mask.
        causal: bool,
        /// Sequence length.
        n: usize,
        /// Batch size, if x has a batch axis.
        batch: Option<usize>,
    },
    /// `MultiHeadAttention::forward_qkv` of x (\[B,\] nq, d) over a constant memory (keys =
    /// values), with or without a key mask, or `forward_qkv_masked` with that mask as an
    /// attention mask; grouped (`MultiHeadAttention::grouped`) where `kv_heads` < `heads`.
    CrossAttention {
        /// Heads.
        heads: usize,
        /// Key/value heads (dividing `heads`).
        kv_heads: usize,
        /// Width per head.
        head_dim: usize,
        /// Queries.
        nq: usize,
        /// Keys (the memory's rows).
        nk: usize,
        /// Batch size, if x and the memory have a batch axis.
        batch: Option<usize>,
        /// The memory, (\[B,\] nk, d).
        memory: Tensor<f64>,
        /// The key mask, B·nk values (true = attend), each batch element keeping one at least.
        keep: Option<Vec<bool>>,
        /// The key mask given to `forward_qkv_masked` as an attention mask instead: one
        /// (nq, nk) matrix per batch element (all true without `keep`).
        as_mask: bool,
        /// Rotary position embeddings (then `head_dim` is even).
        rope: Option<tl_nn::Rope>,
    },
    /// `SpectralConv1d::new(width, modes)` on x (\[B,\] grid, width).
    Spectral {
        /// Channels.
        width: usize,
        /// Kept bins.
        modes: usize,
        /// Grid points.
        grid: usize,
        /// Batch size, if x has a batch axis.
        batch: Option<usize>,
    },
    /// `AdaptiveAvgPool::new(output)` on x of `shape` (\[N,\] C, spatial…), one output size
    /// per spatial axis.
    AdaptiveAvgPool {
        /// Output cells per spatial axis.
        output: Vec<usize>,
        /// x's shape.
        shape: Vec<usize>,
    },
    /// `Upsample::per_axis(scale)` (or `Upsample::new(scale[0])` when `scale` has one entry)
    /// on x of `shape` (N, C, spatial…); with `linear` = `Some(align_corners)`, the linear
    /// mode of its spatial axes (`Upsample::linear`, `bilinear`, `trilinear`; one factor).
    Upsample {
        /// Factors: one for every spatial axis, or one per axis.
        scale: Vec<usize>,
        /// `Some(align_corners)`: linear interpolation; `None`: nearest.
        linear: Option<bool>,
        /// x's shape.
        shape: Vec<usize>,
    },
    /// `PRelu::new(slopes)` on x of `shape` (with `slopes` > 1: its axis 1 has `slopes`
    /// channels).
    PRelu {
        /// Slopes: 1, or the channels.
        slopes: usize,
        /// x's shape.
        shape: Vec<usize>,
    },
    /// An [`Activation`] on x of `shape`.
    Activation {
        /// Which.
        act: Activation,
        /// x's shape.
        shape: Vec<usize>,
    },
    /// `Flatten` on x of `shape` (rank ≥ 2).
    Flatten {
        /// x's shape.
        shape: Vec<usize>,
    },
    /// `Sequential`: Linear(inputs, hidden), Tanh, Flatten, Linear(hidden, outputs) on x
    /// (rows, inputs). The Flatten is a view of tanh's value (a no-copy reshape on the CUDA
    /// tape) that the last Linear reads after the Sequential has dropped tanh's `Var`: in an
    /// evaluation pass the session releases tanh's node, and the view must keep its buffer.
    Sequential {
        /// Input features.
        inputs: usize,
        /// Hidden features.
        hidden: usize,
        /// Output features.
        outputs: usize,
        /// Rows of x.
        rows: usize,
    },
}

/// What a parameter slot of a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Trainable, values in [-1, 1].
    Weight,
    /// A buffer (no gradient); values in [0.5, 1.5] (a running variance must be positive).
    Buffer,
}

impl LayerSpec {
    /// The layer's name in labels (`Linear`, `Conv`, `ConvTranspose`, …).
    pub fn name(&self) -> &'static str {
        match self {
            LayerSpec::Linear { .. } => "Linear",
            LayerSpec::Conv {
                transpose: false, ..
            } => "Conv",
            LayerSpec::Conv {
                transpose: true, ..
            } => "ConvTranspose",
            LayerSpec::Pool { avg: false, .. } => "MaxPool",
            LayerSpec::Pool { avg: true, .. } => "AvgPool",
            LayerSpec::LayerNorm { .. } => "LayerNorm",
            LayerSpec::BatchNorm { .. } => "BatchNorm",
            LayerSpec::RmsNorm { .. } => "RmsNorm",
            LayerSpec::GroupNorm { .. } => "GroupNorm",
            LayerSpec::Embedding { .. } => "Embedding",
            LayerSpec::Dropout { .. } => "Dropout",
            LayerSpec::Attention { .. } => "MultiHeadAttention",
            LayerSpec::CrossAttention { .. } => "CrossAttention",
            LayerSpec::Spectral { .. } => "SpectralConv1d",
            LayerSpec::PRelu { .. } => "PRelu",
            LayerSpec::Upsample { .. } => "Upsample",
            LayerSpec::AdaptiveAvgPool { .. } => "AdaptiveAvgPool",
            LayerSpec::Activation { .. } => "Activation",
            LayerSpec::Flatten { .. } => "Flatten",
            LayerSpec::Sequential { .. } => "Sequential",
        }
    }

    /// Whether the layer normalises its input over groups (LayerNorm, RmsNorm: rows;
    /// BatchNorm: channels; GroupNorm: a sample's channel groups).
    fn normalises(&self) -> bool {
        matches!(
            self,
            LayerSpec::LayerNorm { .. }
                | LayerSpec::BatchNorm { .. }
                | LayerSpec::RmsNorm { .. }
                | LayerSpec::GroupNorm { .. }
        )
    }

    /// This spec with RmsNorm's default ε (`None`) written out as `machine_eps`, the session's
    /// element type's: what the reference computes with.
    fn with_default_eps(&self, machine_eps: f64) -> LayerSpec {
        match self {
            LayerSpec::RmsNorm {
                dim,
                eps: None,
                lead,
            } => LayerSpec::RmsNorm {
                dim: *dim,
                eps: Some(machine_eps),
                lead: lead.clone(),
            },
            other => other.clone(),
        }
    }

    /// Spread a normalised input as the registry's norm entries do (`entries::norm`): within
    /// each group the elements are a permutation of evenly spaced levels 1 apart plus x's own
    /// value (in ±0.3), so every group of two or more elements has a variance well away from
    /// 0, where f32 is well conditioned. RmsNorm's values move 1 away from 0 instead (|x| in
    /// [1, 1.3]): its mean square is then at least 1 in every row, one element or many.
    fn spread(&self, x: Tensor<f64>) -> Tensor<f64> {
        if let LayerSpec::RmsNorm { .. } = self {
            return x.map(|v| v + v.signum());
        }
        let place = |i: usize| -> (usize, usize, usize) {
            match self {
                LayerSpec::LayerNorm { dim, over, .. } => {
                    let row = dim * over.iter().product::<usize>();
                    (i / row, i % row, row)
                }
                LayerSpec::GroupNorm {
                    groups,
                    channels,
                    rest,
                    ..
                } => {
                    // (sample, group) is the group; its channels' cells in order.
                    let (r, per) = (rest.iter().product::<usize>(), channels / groups);
                    let (b, ch, k) = (i / (channels * r), (i / r) % channels, i % r);
                    (b * groups + ch / per, (ch % per) * r + k, per * r)
                }
                LayerSpec::BatchNorm {
                    channels, n, rest, ..
                } => {
                    let r = rest.iter().product::<usize>();
                    let (b, ch, k) = (i / (channels * r), (i / r) % channels, i % r);
                    (ch, b * r + k, n * r)
                }
                _ => (0, 0, 1),
            }
        };
        let data = x
            .data()
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (g, pos, count) = place(i);
                let level = ((pos + g) % count) as f64 - (count as f64 - 1.0) / 2.0;
                (v + level) as f32 as f64
            })
            .collect();
        Tensor::new(x.shape().clone(), data).unwrap_or(x)
    }

    /// Whether the pass is a training pass.
    fn training(&self) -> bool {
        match self {
            LayerSpec::BatchNorm { training, .. } | LayerSpec::Dropout { training, .. } => {
                *training
            }
            _ => false,
        }
    }

    /// x's shape (`None`: the layer takes ids, not a tensor).
    fn x_shape(&self) -> Option<Vec<usize>> {
        let cat = |a: &[usize], b: &[usize]| a.iter().chain(b).copied().collect::<Vec<_>>();
        let opt = |b: &Option<usize>| b.iter().copied().collect::<Vec<_>>();
        Some(match self {
            LayerSpec::Linear { inputs, lead, .. } => cat(lead, &[*inputs]),
            LayerSpec::Conv {
                inputs,
                batch,
                spatial,
                ..
            } => cat(&cat(&opt(batch), &[*inputs]), spatial),
            LayerSpec::Pool { lead, spatial, .. } => cat(lead, spatial),
            LayerSpec::LayerNorm {
                dim, over, lead, ..
            } => cat(&cat(lead, over), &[*dim]),
            LayerSpec::RmsNorm { dim, lead, .. } => cat(lead, &[*dim]),
            LayerSpec::BatchNorm {
                channels, n, rest, ..
            }
            | LayerSpec::GroupNorm {
                channels, n, rest, ..
            } => cat(&[*n, *channels], rest),
            LayerSpec::Embedding { .. } => return None,
            LayerSpec::Dropout { shape, .. }
            | LayerSpec::PRelu { shape, .. }
            | LayerSpec::Upsample { shape, .. }
            | LayerSpec::AdaptiveAvgPool { shape, .. }
            | LayerSpec::Activation { shape, .. }
            | LayerSpec::Flatten { shape } => shape.clone(),
            LayerSpec::Attention {
                heads,
                head_dim,
                n,
                batch,
                ..
            } => cat(&opt(batch), &[*n, heads * head_dim]),
            LayerSpec::CrossAttention {
                heads,
                head_dim,
                nq,
                batch,
                ..
            } => cat(&opt(batch), &[*nq, heads * head_dim]),
            LayerSpec::Spectral {
                width, grid, batch, ..
            } => cat(&opt(batch), &[*grid, *width]),
            LayerSpec::Sequential { inputs, rows, .. } => vec![*rows, *inputs],
        })
    }

    /// The layer's parameters in `visit_params` order, with their shapes.
    fn slots(&self) -> Vec<(Vec<usize>, Slot)> {
        use Slot::*;
        match self {
            LayerSpec::Linear {
                inputs,
                outputs,
                bias,
                ..
            } => {
                let mut v = vec![(vec![*outputs, *inputs], Weight)];
                if *bias {
                    v.push((vec![*outputs], Weight));
                }
                v
            }
            LayerSpec::Conv {
                transpose,
                inputs,
                outputs,
                kernel,
                ..
            } => {
                let lead = if *transpose {
                    [*inputs, *outputs]
                } else {
                    [*outputs, *inputs]
                };
                let w = lead.iter().chain(kernel).copied().collect();
                vec![(w, Weight), (vec![*outputs], Weight)]
            }
            LayerSpec::LayerNorm { dim, over, .. } => {
                let shape: Vec<usize> = over.iter().copied().chain([*dim]).collect();
                vec![(shape.clone(), Weight), (shape, Weight)]
            }
            LayerSpec::RmsNorm { dim, .. } => vec![(vec![*dim], Weight)],
            LayerSpec::PRelu { slopes, .. } => vec![(vec![*slopes], Weight)],
            LayerSpec::GroupNorm { channels, .. } => {
                vec![(vec![*channels], Weight), (vec![*channels], Weight)]
            }
            LayerSpec::BatchNorm { channels, .. } => vec![
                (vec![*channels], Weight),
                (vec![*channels], Weight),
                (vec![*channels], Buffer),
                (vec![*channels], Buffer),
            ],
            LayerSpec::Embedding { num, dim, .. } => vec![(vec![*num, *dim], Weight)],
            LayerSpec::Attention {
                heads,
                kv_heads,
                head_dim,
                ..
            }
            | LayerSpec::CrossAttention {
                heads,
                kv_heads,
                head_dim,
                ..
            } => {
                let (d, kv) = (heads * head_dim, kv_heads * head_dim);
                vec![
                    (vec![d, d], Weight),
                    (vec![d, kv], Weight),
                    (vec![d, kv], Weight),
                    (vec![d, d], Weight),
                ]
            }
            LayerSpec::Spectral { width, modes, .. } => {
                vec![(vec![*modes, *width, *width], Weight); 2]
            }
            LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                ..
            } => vec![
                (vec![*hidden, *inputs], Weight),
                (vec![*hidden], Weight),
                (vec![*outputs, *hidden], Weight),
                (vec![*outputs], Weight),
            ],
            LayerSpec::Pool { .. }
            | LayerSpec::Upsample { .. }
            | LayerSpec::AdaptiveAvgPool { .. }
            | LayerSpec::Dropout { .. }
            | LayerSpec::Activation { .. }
            | LayerSpec::Flatten { .. } => Vec::new(),
        }
    }

    /// The layer written with plain catalogue ops: `p` are the parameters' leaves (in
    /// `LayerSpec::slots` order), `x` the input's; returns the output id.
    pub fn reference(&self, b: &mut GraphBuilder, p: &[Id], x: Option<Id>) -> tl_ir::Result<Id> {
        let x = || {
            x.ok_or(tl_ir::Error::Count {
                what: "nn reference: the layer's input",
                expected: 1,
                got: 0,
            })
        };
        let reshape = |b: &mut GraphBuilder, v: Id, dims: &[usize]| {
            b.apply(Op::Reshape(Shape::new(dims)), &[v])
        };
        match self {
            LayerSpec::Linear {
                inputs,
                outputs,
                lead,
                ..
            } => {
                let rows = lead.iter().product::<usize>();
                let bias = p.get(1).copied();
                let y = linear_ref(b, p[0], bias, x()?, rows, *inputs, *outputs)?;
                let out: Vec<usize> = lead.iter().chain([outputs]).copied().collect();
                reshape(b, y, &out)
            }
            LayerSpec::Conv {
                transpose,
                kernel,
                stride,
                padding,
                ..
            } => {
                let d = kernel.len();
                let (stride, padding) = (vec![*stride; d], vec![*padding; d]);
                let op = if *transpose {
                    Op::ConvTranspose { stride, padding }
                } else {
                    Op::Conv { stride, padding }
                };
                b.apply(op, &[p[0], p[1], x()?])
            }
            LayerSpec::Pool {
                avg,
                kernel,
                stride,
                padding,
                ..
            } => {
                let d = kernel.len();
                let (kernel, stride, padding) =
                    (kernel.clone(), vec![*stride; d], vec![*padding; d]);
                let op = if *avg {
                    Op::AvgPool {
                        kernel,
                        stride,
                        padding,
                    }
                } else {
                    Op::MaxPool {
                        kernel,
                        stride,
                        padding,
                    }
                };
                b.apply(op, &[x()?])
            }
            LayerSpec::LayerNorm {
                eps,
                dim,
                over,
                lead,
            } if !over.is_empty() => {
                // The normalised axes as one row: (lead…, row), the affine (row), and back.
                let row = dim * over.iter().product::<usize>();
                let rows: Vec<usize> = lead.iter().copied().chain([row]).collect();
                let full: Vec<usize> = lead.iter().chain(over).chain([dim]).copied().collect();
                let xr = reshape(b, x()?, &rows)?;
                let (w, bias) = (reshape(b, p[0], &[row])?, reshape(b, p[1], &[row])?);
                let y = b.apply(Op::LayerNorm { eps: *eps }, &[xr, w, bias])?;
                reshape(b, y, &full)
            }
            LayerSpec::LayerNorm { eps, .. } => {
                b.apply(Op::LayerNorm { eps: *eps }, &[x()?, p[0], p[1]])
            }
            LayerSpec::BatchNorm {
                channels,
                n,
                rest,
                eps,
                training,
            } => {
                let (c, r) = (*channels, rest.iter().product::<usize>());
                let full: Vec<usize> = [*n, c].iter().chain(rest).copied().collect();
                let to = Shape::new(&[*n, c, r, 1]);
                let x4 = reshape(b, x()?, to.dims())?;
                let y = if *training {
                    b.apply(Op::BatchNorm { eps: *eps }, &[x4, p[0], p[1]])?
                } else {
                    // (x − mean)/√(var + ε)·γ + β per channel, the running statistics as given.
                    let per = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                        let v = reshape(b, v, &[c, 1, 1])?;
                        b.apply(Op::BroadcastTo(to.clone()), &[v])
                    };
                    let eps = b.apply(Op::Constant(Tensor::full([c], *eps)), &[])?;
                    let var = b.apply(Op::Add, &[p[3], eps])?;
                    let sd = b.apply(Op::Sqrt, &[var])?;
                    let (mean, sd, gamma, beta) =
                        (per(b, p[2])?, per(b, sd)?, per(b, p[0])?, per(b, p[1])?);
                    let centred = b.apply(Op::Sub, &[x4, mean])?;
                    let xhat = b.apply(Op::Div, &[centred, sd])?;
                    let scaled = b.apply(Op::Mul, &[xhat, gamma])?;
                    b.apply(Op::Add, &[scaled, beta])?
                };
                reshape(b, y, &full)
            }
            LayerSpec::RmsNorm { dim, eps, lead } => {
                // x / √(Σx²/dim + ε) · γ: a sum scaled and a division, where the layer takes a
                // mean and multiplies by the inverse.
                let x = x()?;
                let full: Vec<usize> = lead.iter().chain([dim]).copied().collect();
                let keep: Vec<usize> = lead.iter().copied().chain([1]).collect();
                let to = Shape::new(&full);
                let sq = b.apply(Op::Mul, &[x, x])?;
                let ss = b.apply(Op::ReduceSum(lead.len()), &[sq])?;
                let ms = b.apply(Op::Scale(1.0 / *dim as f64), &[ss])?;
                let lead_shape = Shape::new(lead);
                // `None` only in the shape-only graph of `layer_cases`: `compare` writes it out.
                let eps = eps.unwrap_or(f64::NAN);
                let eps = b.apply(Op::Constant(Tensor::full(lead_shape, eps)), &[])?;
                let rms = b.apply(Op::Add, &[ms, eps])?;
                let rms = b.apply(Op::Sqrt, &[rms])?;
                let rms = reshape(b, rms, &keep)?;
                let rms = b.apply(Op::BroadcastTo(to.clone()), &[rms])?;
                let xn = b.apply(Op::Div, &[x, rms])?;
                let gamma = b.apply(Op::BroadcastTo(to), &[p[0]])?;
                b.apply(Op::Mul, &[xn, gamma])
            }
            LayerSpec::GroupNorm {
                groups,
                channels,
                n,
                rest,
                eps,
            } => {
                // Per (sample, group): (x − mean)/√(mean((x − mean)²) + ε), from reductions,
                // where the layer runs the layerNorm op; then x̂·γ + β per channel.
                let (c, r) = (*channels, rest.iter().product::<usize>());
                let (rows, len) = (n * groups, c / groups * r);
                let full: Vec<usize> = [*n, c].iter().chain(rest).copied().collect();
                let grid = Shape::new(&[rows, len]);
                let xr = reshape(b, x()?, grid.dims())?;
                let per_row = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                    let v = reshape(b, v, &[rows, 1])?;
                    b.apply(Op::BroadcastTo(grid.clone()), &[v])
                };
                let mean = b.apply(Op::ReduceMean(1), &[xr])?;
                let mean = per_row(b, mean)?;
                let centred = b.apply(Op::Sub, &[xr, mean])?;
                let sq = b.apply(Op::Mul, &[centred, centred])?;
                let var = b.apply(Op::ReduceMean(1), &[sq])?;
                let eps = b.apply(Op::Constant(Tensor::full([rows], *eps)), &[])?;
                let sd = b.apply(Op::Add, &[var, eps])?;
                let sd = b.apply(Op::Sqrt, &[sd])?;
                let sd = per_row(b, sd)?;
                let xhat = b.apply(Op::Div, &[centred, sd])?;
                let to = Shape::new(&[*n, c, r]);
                let xhat = reshape(b, xhat, to.dims())?;
                let per_channel = |b: &mut GraphBuilder, v: Id| -> tl_ir::Result<Id> {
                    let v = reshape(b, v, &[c, 1])?;
                    b.apply(Op::BroadcastTo(to.clone()), &[v])
                };
                let (gamma, beta) = (per_channel(b, p[0])?, per_channel(b, p[1])?);
                let scaled = b.apply(Op::Mul, &[xhat, gamma])?;
                let y = b.apply(Op::Add, &[scaled, beta])?;
                reshape(b, y, &full)
            }
            LayerSpec::Embedding { num, ids, .. } => {
                // One-hot rows times the table.
                let k = ids.len();
                let onehot =
                    Tensor::from_fn(
                        [k, *num],
                        |i| {
                            if ids[i / num] == i % num { 1.0 } else { 0.0 }
                        },
                    );
                let oh = b.apply(Op::Constant(onehot), &[])?;
                b.apply(Op::Matmul, &[oh, p[0]])
            }
            LayerSpec::Dropout {
                p: drop, training, ..
            } => {
                if *training && *drop > 0.0 {
                    let op = Op::Dropout {
                        keep: 1.0 - drop,
                        seed: NN_SEED,
                        counter: 0,
                    };
                    b.apply(op, &[x()?])
                } else {
                    x()
                }
            }
            LayerSpec::Attention {
                heads,
                kv_heads,
                rope: None,
                causal,
                n,
                ..
            } if kv_heads == heads => {
                let op = Op::MultiHeadAttention {
                    heads: *heads,
                    mask: causal.then(|| Mask::causal(*n).unwrap()),
                    fused: false,
                };
                b.apply(op, &[p[0], p[1], p[2], p[3], x()?])
            }
            // Rotary or grouped: the cross-attention reference over x itself.
            LayerSpec::Attention {
                heads,
                kv_heads,
                head_dim,
                rope,
                causal,
                n,
                batch,
            } => {
                let sizes = CrossSizes {
                    heads: *heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    nq: *n,
                    nk: *n,
                    batch: *batch,
                    rope: *rope,
                    causal: *causal,
                };
                let x = x()?;
                cross_attention_ref(b, sizes, p, x, x, None)
            }
            LayerSpec::CrossAttention {
                heads,
                kv_heads,
                head_dim,
                nq,
                nk,
                batch,
                memory,
                keep,
                rope,
                // The key flags as an attention mask: the same keys.
                as_mask: _,
            } => {
                let sizes = CrossSizes {
                    heads: *heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    nq: *nq,
                    nk: *nk,
                    batch: *batch,
                    rope: *rope,
                    causal: false,
                };
                let memory = b.apply(Op::Constant(memory.clone()), &[])?;
                cross_attention_ref(b, sizes, p, x()?, memory, keep.as_deref())
            }
            LayerSpec::Spectral { modes, .. } => b.apply(
                Op::SpectralConv1dRfft { modes: *modes },
                &[x()?, p[0], p[1]],
            ),
            LayerSpec::Upsample {
                scale,
                linear,
                shape,
            } => {
                // Along each spatial axis in turn, (pre, d, post) → (pre, d·s, post). Nearest:
                // a 0/1 matrix R (d·s, d) with R[i][i / s] = 1 as a matmul, where the layer
                // reshapes and broadcasts. Linear: each output cell j's two neighbours picked
                // by 0/1 matrices and weighed by (1 − λⱼ, λⱼ) with a broadcast `mul`, where the
                // layer multiplies by one matrix of weights.
                let mut y = x()?;
                let mut dims = shape.clone();
                for k in 2..shape.len() {
                    let s = if scale.len() == 1 {
                        scale[0]
                    } else {
                        scale[k - 2]
                    };
                    let (pre, d) = (dims[..k].iter().product::<usize>(), dims[k]);
                    let post = dims[k + 1..].iter().product::<usize>();
                    let o = d * s;
                    // Output cell j's neighbours (lo, hi) and hi's weight.
                    let cell = |j: usize| -> (usize, usize, f64) {
                        match linear {
                            None => (j / s, j / s, 0.0),
                            Some(true) if o == 1 => (0, 0, 0.0),
                            Some(true) => {
                                let src = (j * (d - 1)) as f64 / (o - 1) as f64;
                                let lo = (j * (d - 1)) / (o - 1);
                                (lo, (lo + 1).min(d - 1), src - lo as f64)
                            }
                            Some(false) => {
                                // src = (2j + 1 − s)/(2s), or 0 where that is negative.
                                let twice = (2 * j + 1) as f64 - s as f64;
                                let src = (twice / (2 * s) as f64).max(0.0);
                                let lo = (src.floor() as usize).min(d - 1);
                                (lo, (lo + 1).min(d - 1), src - lo as f64)
                            }
                        }
                    };
                    let pick = |hi: bool| {
                        Tensor::from_fn([d, o], |e| {
                            let (i, j) = (e / o, e % o);
                            let (lo, up, _) = cell(j);
                            if i == if hi { up } else { lo } {
                                1.0
                            } else {
                                0.0
                            }
                        })
                    };
                    // (pre, d, post) → (pre, post, d) → (pre·post, d)·R → back.
                    let t = reshape(b, y, &[pre, d, post])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    let t = reshape(b, t, &[pre * post, d])?;
                    let lo = b.apply(Op::Constant(pick(false)), &[])?;
                    let t = if linear.is_none() {
                        b.apply(Op::Matmul, &[t, lo])?
                    } else {
                        let hi = b.apply(Op::Constant(pick(true)), &[])?;
                        let weight = |hi: bool| {
                            Tensor::from_fn([pre * post, o], |e| {
                                let lambda = cell(e % o).2;
                                if hi { lambda } else { 1.0 - lambda }
                            })
                        };
                        let (wlo, whi) = (
                            b.apply(Op::Constant(weight(false)), &[])?,
                            b.apply(Op::Constant(weight(true)), &[])?,
                        );
                        let at_lo = b.apply(Op::Matmul, &[t, lo])?;
                        let at_hi = b.apply(Op::Matmul, &[t, hi])?;
                        let at_lo = b.apply(Op::Mul, &[at_lo, wlo])?;
                        let at_hi = b.apply(Op::Mul, &[at_hi, whi])?;
                        b.apply(Op::Add, &[at_lo, at_hi])?
                    };
                    let t = reshape(b, t, &[pre, post, o])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    dims[k] = o;
                    y = reshape(b, t, &dims)?;
                }
                Ok(y)
            }
            LayerSpec::AdaptiveAvgPool { output, shape } => {
                // Along each spatial axis (identity sizes included): the window sums as a
                // matmul by a 0/1 matrix, then a division by each window's count; the layer
                // multiplies by 1/count inside its matrix and skips identity axes.
                let mut y = x()?;
                let mut dims = shape.clone();
                let first = shape.len() - output.len();
                for (k, &o) in (first..).zip(output) {
                    let (pre, d) = (dims[..k].iter().product::<usize>(), dims[k]);
                    let post = dims[k + 1..].iter().product::<usize>();
                    // Output cell i covers [⌊i·d/o⌋, ⌈(i+1)·d/o⌉).
                    let bounds = |i: usize| {
                        let (q, r) = ((i + 1) * d / o, (i + 1) * d % o);
                        (i * d / o, q + usize::from(r != 0))
                    };
                    let sel = Tensor::from_fn([d, o], |e| {
                        let (j, i) = (e / o, e % o);
                        let (lo, hi) = bounds(i);
                        if lo <= j && j < hi { 1.0 } else { 0.0 }
                    });
                    let counts = Tensor::from_fn([pre * post, o], |e| {
                        let (lo, hi) = bounds(e % o);
                        (hi - lo) as f64
                    });
                    let (sel, counts) = (
                        b.apply(Op::Constant(sel), &[])?,
                        b.apply(Op::Constant(counts), &[])?,
                    );
                    let t = reshape(b, y, &[pre, d, post])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    let t = reshape(b, t, &[pre * post, d])?;
                    let t = b.apply(Op::Matmul, &[t, sel])?;
                    let t = b.apply(Op::Div, &[t, counts])?;
                    let t = reshape(b, t, &[pre, post, o])?;
                    let t = b.apply(Op::SwapLastTwo, &[t])?;
                    dims[k] = o;
                    y = reshape(b, t, &dims)?;
                }
                Ok(y)
            }
            LayerSpec::PRelu { slopes, shape } => {
                // max(x, 0) + a·min(x, 0), a broadcast from (C, 1, …) (or a scalar), where the
                // layer takes relu(x) + a·(x − relu(x)).
                let x = x()?;
                let to = Shape::new(shape);
                let slope_dims: Vec<usize> = match *slopes {
                    1 => Vec::new(),
                    c => [c]
                        .into_iter()
                        .chain(shape[2..].iter().map(|_| 1))
                        .collect(),
                };
                let a = reshape(b, p[0], &slope_dims)?;
                let a = b.apply(Op::BroadcastTo(to.clone()), &[a])?;
                let zero = b.apply(Op::Constant(Tensor::zeros(to.dims())), &[])?;
                let pos = b.apply(Op::Max, &[x, zero])?;
                let neg = b.apply(Op::Min, &[x, zero])?;
                let neg = b.apply(Op::Mul, &[a, neg])?;
                b.apply(Op::Add, &[pos, neg])
            }
            LayerSpec::Activation { act, shape } => activation_ref(b, *act, x()?, shape),
            LayerSpec::Flatten { shape } => {
                let rest = shape[1..].iter().product::<usize>();
                reshape(b, x()?, &[shape[0], rest])
            }
            LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                rows,
            } => {
                let h = linear_ref(b, p[0], Some(p[1]), x()?, *rows, *inputs, *hidden)?;
                let h = b.apply(Op::Tanh, &[h])?;
                let h = reshape(b, h, &[*rows, *hidden])?;
                linear_ref(b, p[2], Some(p[3]), h, *rows, *hidden, *outputs)
            }
        }
    }

    /// The layer, made in `vars`.
    fn build<O: Train + 'static>(&self, vars: &Vars<'_, O>) -> tl_nn::Result<Built<O>> {
        let m: Box<dyn Module<O>> = match self {
            LayerSpec::Linear {
                inputs,
                outputs,
                bias,
                ..
            } => Box::new(Linear::with_bias(vars, *inputs, *outputs, *bias)?),
            LayerSpec::Conv {
                transpose,
                inputs,
                outputs,
                kernel,
                stride,
                padding,
                ..
            } => {
                let cfg = ConvConfig::new(*stride, *padding);
                if *transpose {
                    Box::new(ConvTranspose::new(vars, *inputs, *outputs, kernel, cfg)?)
                } else {
                    Box::new(Conv::new(vars, *inputs, *outputs, kernel, cfg)?)
                }
            }
            LayerSpec::Pool {
                avg,
                kernel,
                stride,
                padding,
                ..
            } => {
                if *avg {
                    Box::new(AvgPool::new(kernel)?.stride(*stride).padding(*padding))
                } else {
                    Box::new(MaxPool::new(kernel)?.stride(*stride).padding(*padding))
                }
            }
            LayerSpec::LayerNorm { dim, eps, over, .. } if over.is_empty() => {
                Box::new(LayerNorm::with_eps(vars, *dim, *eps)?)
            }
            LayerSpec::LayerNorm { dim, eps, over, .. } => {
                let shape: Vec<usize> = over.iter().copied().chain([*dim]).collect();
                Box::new(LayerNorm::over(vars, &shape, *eps)?)
            }
            LayerSpec::BatchNorm { channels, eps, .. } => {
                Box::new(BatchNorm::with(vars, *channels, *eps, 0.1)?)
            }
            LayerSpec::RmsNorm { dim, eps, .. } => match eps {
                Some(eps) => Box::new(RmsNorm::with_eps(vars, *dim, *eps)?),
                None => Box::new(RmsNorm::new(vars, *dim)?),
            },
            LayerSpec::GroupNorm {
                groups,
                channels,
                eps,
                ..
            } => Box::new(GroupNorm::with_eps(vars, *groups, *channels, *eps)?),
            LayerSpec::Embedding { num, dim, .. } => {
                return Ok(Built::Embedding(Embedding::new(vars, *num, *dim)?));
            }
            LayerSpec::CrossAttention {
                heads,
                kv_heads,
                head_dim,
                nq,
                nk,
                batch,
                memory,
                keep,
                as_mask,
                rope,
            } => {
                let d = heads * head_dim;
                let mut mha = MultiHeadAttention::grouped(vars, d, *heads, *kv_heads, false)?;
                if let Some(rope) = rope {
                    mha = mha.with_rope(*rope)?;
                }
                let (nq, nk) = (*nq, *nk);
                let keys = match (as_mask, keep) {
                    (false, keep) => Keys::Keep(keep.clone()),
                    // Batch element b's matrix: its keys' flags on every row.
                    (true, keep) => Keys::Mask(Mask::from_fn_batched(
                        batch.unwrap_or(1),
                        nq,
                        nk,
                        |b, _, j| keep.as_ref().is_none_or(|k| k[b * nk + j]),
                    )?),
                };
                return Ok(Built::Cross(Box::new((mha, memory.clone(), keys))));
            }
            LayerSpec::Dropout { p, .. } => Box::new(Dropout::new(*p)?),
            LayerSpec::Attention {
                heads,
                kv_heads,
                head_dim,
                rope,
                causal,
                ..
            } => {
                let d = heads * head_dim;
                let mha = MultiHeadAttention::grouped(vars, d, *heads, *kv_heads, *causal)?;
                match rope {
                    Some(r) => Box::new(mha.with_rope(*r)?),
                    None => Box::new(mha),
                }
            }
            LayerSpec::Spectral { width, modes, .. } => {
                Box::new(SpectralConv1d::new(vars, *width, *modes)?)
            }
            LayerSpec::PRelu { slopes, .. } => Box::new(PRelu::new(vars, *slopes)?),
            LayerSpec::AdaptiveAvgPool { output, .. } => Box::new(AdaptiveAvgPool::new(output)?),
            LayerSpec::Upsample {
                scale,
                linear,
                shape,
            } => match (linear, scale.as_slice(), shape.len() - 2) {
                (Some(ac), [s], 1) => Box::new(Upsample::linear(*s, *ac)?),
                (Some(ac), [s], 2) => Box::new(Upsample::bilinear(*s, *ac)?),
                (Some(ac), [s], _) => Box::new(Upsample::trilinear(*s, *ac)?),
                (_, [s], _) => Box::new(Upsample::new(*s)?),
                (_, per, _) => Box::new(Upsample::per_axis(per)?),
            },
            LayerSpec::Activation { act, .. } => Box::new(*act),
            LayerSpec::Flatten { .. } => Box::new(tl_nn::Flatten),
            LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                ..
            } => Box::new(
                Sequential::new()
                    .add(Linear::new(&vars.pp(0), *inputs, *hidden)?)
                    .add(Activation::Tanh)
                    .add(tl_nn::Flatten)
                    .add(Linear::new(&vars.pp(3), *hidden, *outputs)?),
            ),
        };
        Ok(Built::Module(m))
    }
}

/// `x2·Wᵀ + b` on (rows, inputs) with plain ops (x reshaped to rows first).
fn linear_ref(
    b: &mut GraphBuilder,
    w: Id,
    bias: Option<Id>,
    x: Id,
    rows: usize,
    inputs: usize,
    outputs: usize,
) -> tl_ir::Result<Id> {
    let x2 = b.apply(Op::Reshape(Shape::new(&[rows, inputs])), &[x])?;
    let wt = b.apply(Op::Transpose2d, &[w])?;
    let y = b.apply(Op::Matmul, &[x2, wt])?;
    match bias {
        Some(bias) => {
            let bb = b.apply(Op::BroadcastTo(Shape::new(&[rows, outputs])), &[bias])?;
            b.apply(Op::Add, &[y, bb])
        }
        None => Ok(y),
    }
}

/// Which keys a built cross-attention attends to: `forward_qkv`'s key flags, or
/// `forward_qkv_masked`'s attention mask.
enum Keys {
    /// B·nk flags (true = attend), or every key.
    Keep(Option<Vec<bool>>),
    /// (nq, nk) matrices, one per batch element.
    Mask(Mask),
}

/// A built layer: a [`Module`], or the embedding (which takes ids).
enum Built<O: Train> {
    Module(Box<dyn Module<O>>),
    Embedding(Embedding),
    /// Cross-attention, its memory and its key mask.
    Cross(Box<(MultiHeadAttention, Tensor<f64>, Keys)>),
}

impl<O: Train> Parameters for Built<O> {
    fn visit_params(&self, f: &mut dyn FnMut(&Param)) {
        match self {
            Built::Module(m) => m.visit_params(f),
            Built::Embedding(e) => e.visit_params(f),
            Built::Cross(c) => c.0.visit_params(f),
        }
    }
}

/// One generated case: a layer, its parameters' values (in `LayerSpec::slots` order), the
/// input (if the layer takes one) and the cotangent of the output.
#[derive(Debug, Clone)]
pub struct LayerCase {
    /// The layer.
    pub spec: LayerSpec,
    /// Parameter values.
    pub params: Vec<Tensor<f64>>,
    /// The input.
    pub x: Option<Tensor<f64>>,
    /// The cotangent (the random linear functional of the output).
    pub seed: Tensor<f64>,
}

impl LayerCase {
    /// The reference graph: leaves are the parameters then x; returns it with the output id.
    pub fn reference_graph(&self) -> tl_ir::Result<(GraphData, Id)> {
        let mut b = GraphBuilder::new();
        let p = self
            .spec
            .slots()
            .iter()
            .map(|(s, _)| b.leaf(Shape::new(s), None))
            .collect::<tl_ir::Result<Vec<_>>>()?;
        let x = match self.spec.x_shape() {
            Some(s) => Some(b.leaf(Shape::new(&s), None)?),
            None => None,
        };
        let out = self.spec.reference(&mut b, &p, x)?;
        Ok((b.finish(), out))
    }
}

/// f32-representable values uniform in `[lo, hi]` of `dims`.
pub(crate) fn values(dims: Vec<usize>, lo: f64, hi: f64) -> BoxedStrategy<Tensor<f64>> {
    let n = dims.iter().product::<usize>();
    prop::collection::vec(lo..=hi, n)
        .prop_map(move |v| {
            let v = v.into_iter().map(|x| x as f32 as f64).collect();
            Tensor::new(dims.clone(), v).expect("n elements")
        })
        .boxed()
}

/// The key/value head count `kv` picks among the divisors of `heads` (fewer than `heads`:
/// grouped-query attention).
fn divisor(heads: usize, kv: prop::sample::Index) -> usize {
    let divisors: Vec<usize> = (1..=heads).filter(|&k| heads.is_multiple_of(k)).collect();
    *kv.get(&divisors)
}

/// Rotary embeddings: the paper's (interleaved, base 10000), or Hugging Face's halves at base
/// 500.
fn rope_of(interleaved: bool) -> tl_nn::Rope {
    match interleaved {
        true => tl_nn::Rope::DEFAULT,
        false => tl_nn::Rope {
            base: 500.0,
            layout: tl_nn::RopeLayout::Halves,
        },
    }
}

fn opt_batch() -> impl Strategy<Value = Option<usize>> {
    prop::option::of(1usize..=2)
}

/// The layer specs of the layer named `name` ([`LAYERS`]).
pub fn spec_strategy(name: &str) -> BoxedStrategy<LayerSpec> {
    let lead = || prop::collection::vec(1usize..=3, 0..=2);
    match name {
        "Linear" => (1usize..=4, 1usize..=4, any::<bool>(), lead())
            .prop_map(|(inputs, outputs, bias, lead)| LayerSpec::Linear {
                inputs,
                outputs,
                bias,
                lead,
            })
            .boxed(),
        "Conv" | "ConvTranspose" => {
            let transpose = name == "ConvTranspose";
            (1usize..=2, 1usize..=3, 1usize..=3, 1usize..=2, opt_batch())
                .prop_flat_map(move |(d, inputs, outputs, stride, batch)| {
                    (
                        prop::collection::vec(1usize..=3, d),
                        Just((inputs, outputs, stride, batch)),
                    )
                })
                .prop_flat_map(move |(kernel, (inputs, outputs, stride, batch))| {
                    let kmin = kernel.iter().copied().min().unwrap_or(1);
                    let d = kernel.len();
                    (
                        Just(kernel.clone()),
                        0..kmin,
                        prop::collection::vec(0usize..=3, d),
                        Just((inputs, outputs, stride, batch)),
                    )
                })
                .prop_map(
                    move |(kernel, padding, extra, (inputs, outputs, stride, batch))| {
                        // Conv: size ≥ kernel; transposed: any size ≥ 1 whose output is ≥ 1.
                        let spatial = kernel
                            .iter()
                            .zip(&extra)
                            .map(|(k, e)| if transpose { 1 + e + padding } else { k + e })
                            .collect();
                        LayerSpec::Conv {
                            transpose,
                            inputs,
                            outputs,
                            kernel,
                            stride,
                            padding,
                            batch,
                            spatial,
                        }
                    },
                )
                .boxed()
        }
        "MaxPool" | "AvgPool" => {
            let avg = name == "AvgPool";
            (
                prop::collection::vec(1usize..=3, 1..=2),
                1usize..=3,
                prop::collection::vec(1usize..=2, 1..=2),
            )
                .prop_flat_map(|(kernel, stride, lead)| {
                    let kmin = kernel.iter().copied().min().unwrap_or(1);
                    let d = kernel.len();
                    (
                        Just(kernel),
                        Just(stride),
                        0..=kmin / 2,
                        Just(lead),
                        prop::collection::vec(0usize..=3, d),
                    )
                })
                .prop_map(move |(kernel, stride, padding, lead, extra)| {
                    let spatial = kernel.iter().zip(&extra).map(|(k, e)| k + e).collect();
                    LayerSpec::Pool {
                        avg,
                        kernel,
                        stride,
                        padding,
                        lead,
                        spatial,
                    }
                })
                .boxed()
        }
        "LayerNorm" => (
            1usize..=5,
            prop::sample::select(vec![1e-5, 0.1]),
            prop::collection::vec(1usize..=3, 1..=2),
            prop::collection::vec(1usize..=3, 0..=2),
        )
            .prop_map(|(dim, eps, lead, over)| LayerSpec::LayerNorm {
                dim,
                over,
                eps,
                lead,
            })
            .boxed(),
        "BatchNorm" => (
            1usize..=3,
            2usize..=3,
            prop::collection::vec(1usize..=3, 0..=2),
            prop::sample::select(vec![1e-5, 0.1]),
            any::<bool>(),
        )
            .prop_map(|(channels, n, rest, eps, training)| LayerSpec::BatchNorm {
                channels,
                n,
                rest,
                eps,
                training,
            })
            .boxed(),
        "RmsNorm" => (
            1usize..=5,
            prop::sample::select(vec![None, Some(1e-5), Some(0.1)]),
            prop::collection::vec(1usize..=3, 0..=2),
        )
            .prop_map(|(dim, eps, lead)| LayerSpec::RmsNorm { dim, eps, lead })
            .boxed(),
        "GroupNorm" => (
            1usize..=3,
            1usize..=2,
            1usize..=3,
            prop::collection::vec(1usize..=3, 0..=2),
            prop::sample::select(vec![1e-5, 0.1]),
        )
            .prop_map(|(groups, per, n, rest, eps)| LayerSpec::GroupNorm {
                groups,
                channels: groups * per,
                n,
                rest,
                eps,
            })
            .boxed(),
        "Embedding" => (1usize..=5, 1usize..=3)
            .prop_flat_map(|(num, dim)| {
                (Just(num), Just(dim), prop::collection::vec(0..num, 1..=5))
            })
            .prop_map(|(num, dim, ids)| LayerSpec::Embedding { num, dim, ids })
            .boxed(),
        "Dropout" => (
            prop::sample::select(vec![0.0, 0.25, 0.5]),
            any::<bool>(),
            prop::collection::vec(1usize..=4, 1..=3),
        )
            .prop_map(|(p, training, shape)| LayerSpec::Dropout { p, training, shape })
            .boxed(),
        // Plain (the op multiHeadAttention), rotary or grouped (scaledDotProductAttention
        // behind the projections): 1–4 heads over a drawn divisor of key/value heads.
        "MultiHeadAttention" => (
            (1usize..=4, 1usize..=3, any::<bool>(), 1usize..=4),
            opt_batch(),
            prop::option::of(any::<bool>()),
            any::<prop::sample::Index>(),
        )
            .prop_map(|((heads, head_dim, causal, n), batch, rope, kv)| {
                let rope = rope.map(rope_of);
                LayerSpec::Attention {
                    heads,
                    kv_heads: divisor(heads, kv),
                    rope,
                    // With rotary embeddings the head size is even: 1 → 2, 3 → 4.
                    head_dim: head_dim + usize::from(rope.is_some()) * (head_dim % 2),
                    causal,
                    n,
                    batch,
                }
            })
            .boxed(),
        "CrossAttention" => (
            (1usize..=4, 1usize..=3, 1usize..=3, 1usize..=4),
            opt_batch(),
            prop::option::of(any::<bool>()),
            (any::<prop::sample::Index>(), any::<bool>()),
        )
            .prop_flat_map(|((heads, head_dim, nq, nk), batch, rope, (kv, as_mask))| {
                let kv_heads = divisor(heads, kv);
                // With rotary embeddings the head size is even: 1 → 2, 3 → 4.
                let rope = rope.map(rope_of);
                let head_dim = if rope.is_some() {
                    head_dim + head_dim % 2
                } else {
                    head_dim
                };
                let d = heads * head_dim;
                let b = batch.unwrap_or(1);
                let mem: Vec<usize> = batch.iter().copied().chain([nk, d]).collect();
                (
                    Just((heads, kv_heads, head_dim, nq, nk, batch, rope, as_mask)),
                    values(mem, -1.5, 1.5),
                    prop::option::of(prop::collection::vec(any::<bool>(), b * nk)),
                )
            })
            .prop_map(
                |((heads, kv_heads, head_dim, nq, nk, batch, rope, as_mask), memory, keep)| {
                    // Each batch element keeps one key at least (else the layer refuses it).
                    let keep = keep.map(|mut k| {
                        for row in k.chunks_mut(nk) {
                            if !row.iter().any(|&v| v) {
                                row[0] = true;
                            }
                        }
                        k
                    });
                    LayerSpec::CrossAttention {
                        heads,
                        kv_heads,
                        head_dim,
                        nq,
                        nk,
                        batch,
                        memory,
                        keep,
                        as_mask,
                        rope,
                    }
                },
            )
            .boxed(),
        "SpectralConv1d" => (1usize..=3, 1usize..=3, 0usize..=3, opt_batch())
            .prop_map(|(width, modes, extra, batch)| LayerSpec::Spectral {
                width,
                modes,
                // modes ≤ grid/2 + 1.
                grid: (2 * modes).saturating_sub(2).max(1) + extra,
                batch,
            })
            .boxed(),
        // x ([N,] C, spatial…), 1–3 spatial axes of 1–7 cells, outputs 1–4 (smaller, equal
        // or larger: overlapping windows).
        "AdaptiveAvgPool" => (
            prop::option::of(1usize..=2),
            1usize..=2,
            prop::collection::vec((1usize..=7, 1usize..=4), 1..=3),
        )
            .prop_map(|(n, c, axes)| {
                let shape = n.into_iter().chain([c]).chain(axes.iter().map(|a| a.0));
                LayerSpec::AdaptiveAvgPool {
                    output: axes.iter().map(|a| a.1).collect(),
                    shape: shape.collect(),
                }
            })
            .boxed(),
        // x (N, C, spatial…), 1–3 spatial axes, one factor or one per axis.
        "Upsample" => (
            1usize..=2,
            1usize..=2,
            prop::collection::vec(1usize..=3, 1..=3),
        )
            .prop_flat_map(|(n, c, spatial)| {
                // Nearest with one factor or one per axis; linear (either align_corners) with
                // one.
                let k = spatial.len();
                let shape: Vec<usize> = [n, c].into_iter().chain(spatial).collect();
                let one = prop::collection::vec(1usize..=3, 1);
                let per = prop::collection::vec(1usize..=3, k);
                let nearest = prop_oneof![one.clone(), per].prop_map(|s| (s, None));
                let linear = (one, any::<bool>()).prop_map(|(s, ac)| (s, Some(ac)));
                (Just(shape), prop_oneof![nearest, linear])
            })
            .prop_map(|(shape, (scale, linear))| LayerSpec::Upsample {
                scale,
                linear,
                shape,
            })
            .boxed(),
        // x (N, C, rest…) with C slopes, or x of rank 0–3 with one slope.
        "PRelu" => prop_oneof![
            (
                1usize..=3,
                1usize..=3,
                prop::collection::vec(1usize..=3, 0..=2)
            )
                .prop_map(|(n, c, rest)| LayerSpec::PRelu {
                    slopes: c,
                    shape: [n, c].into_iter().chain(rest).collect(),
                }),
            prop::collection::vec(1usize..=4, 0..=3)
                .prop_map(|shape| LayerSpec::PRelu { slopes: 1, shape }),
        ]
        .boxed(),
        "Activation" => (
            prop::sample::select(ACTIVATIONS.to_vec()),
            prop::collection::vec(1usize..=4, 1..=3),
        )
            .prop_map(|(act, mut shape)| {
                // GLU halves the last axis: draw it even.
                if act == Activation::Glu {
                    let last = shape.len() - 1;
                    shape[last] *= 2;
                }
                LayerSpec::Activation { act, shape }
            })
            .boxed(),
        "Flatten" => prop::collection::vec(1usize..=3, 2..=4)
            .prop_map(|shape| LayerSpec::Flatten { shape })
            .boxed(),
        _ => (1usize..=4, 1usize..=4, 1usize..=4, 1usize..=3)
            .prop_map(|(inputs, hidden, outputs, rows)| LayerSpec::Sequential {
                inputs,
                hidden,
                outputs,
                rows,
            })
            .boxed(),
    }
}

/// Every layer the check covers, by name (one per type of `tl_nn`'s layers and modules).
pub const LAYERS: [&str; 21] = [
    "Linear",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AvgPool",
    "LayerNorm",
    "BatchNorm",
    "RmsNorm",
    "GroupNorm",
    "Embedding",
    "Dropout",
    "MultiHeadAttention",
    "CrossAttention",
    "SpectralConv1d",
    "PRelu",
    "Upsample",
    "AdaptiveAvgPool",
    "Activation",
    "Flatten",
    "Sequential",
    // The classification loss on a Linear's logits, with labels (tl-nn's `Labels`).
    "CrossEntropy",
];

/// Cases of the layer named `name`: sizes, parameter values, input and cotangent.
pub fn layer_cases(name: &str) -> BoxedStrategy<LayerCase> {
    spec_strategy(name)
        .prop_flat_map(|spec| {
            let params: Vec<BoxedStrategy<Tensor<f64>>> = spec
                .slots()
                .into_iter()
                .map(|(dims, slot)| match slot {
                    Slot::Weight => values(dims, -1.0, 1.0),
                    Slot::Buffer => values(dims, 0.5, 1.5),
                })
                .collect();
            let x = match spec.x_shape() {
                Some(s) if spec.normalises() => {
                    let spec = spec.clone();
                    values(s, -0.3, 0.3)
                        .prop_map(move |x| Some(spec.spread(x)))
                        .boxed()
                }
                Some(s) => values(s, -1.5, 1.5).prop_map(Some).boxed(),
                None => Just(None).boxed(),
            };
            let out = LayerCase {
                spec: spec.clone(),
                params: Vec::new(),
                x: None,
                seed: Tensor::scalar(0.0),
            }
            .reference_graph()
            .ok()
            .and_then(|(g, out)| g.shape(out).ok().map(|s| s.dims().to_vec()))
            .unwrap_or_default();
            (Just(spec), params, x, values(out, -1.0, 1.0))
        })
        .prop_map(|(spec, params, x, seed)| LayerCase {
            spec,
            params,
            x,
            seed,
        })
        .boxed()
}

/// The output, the gradients (params in slot order, buffers `None`, then x) and the buffers'
/// values after the pass, of `case` run through tl-nn on `session`.
type Run<T> = (Tensor<T>, Vec<Option<Tensor<T>>>, Vec<Tensor<T>>);

fn run_layer<O: LayerSession + 'static>(case: &LayerCase, session: O) -> Result<Run<O::T>, String> {
    let rt = Runtime::new(session);
    let layer = case
        .spec
        .build(&rt.vars().pp("layer"))
        .map_err(|e| format!("building the layer: {e}"))?;
    let mut params = Vec::new();
    layer.visit_params(&mut |p| params.push(p.clone()));
    let slots = case.spec.slots();
    if params.len() != slots.len() {
        return Err(format!(
            "the layer has {} parameters, the spec {}",
            params.len(),
            slots.len()
        ));
    }
    for (p, v) in params.iter().zip(&case.params) {
        rt.set_value(p, v.cast())
            .map_err(|e| format!("set_value: {e}"))?;
    }
    let refs: RefCell<Vec<TensorRef>> = RefCell::new(Vec::new());
    let seed: Tensor<O::T> = case.seed.cast();
    let out = rt.record(
        &layer,
        case.spec.training(),
        |g| {
            let x = match &case.x {
                Some(x) => Some(g.input_grad(x.cast())?),
                None => None,
            };
            let mut r = refs.borrow_mut();
            for p in &params {
                r.push(g.param(p)?.tensor_ref().clone());
            }
            if let Some(x) = &x {
                r.push(x.tensor_ref().clone());
            }
            drop(r);
            forward_layer(&layer, &case.spec, g, x.as_ref())
        },
        |s, out| {
            let value = s.read(out)?;
            if value.shape() != seed.shape() {
                return Err(tl_nn::Error::Usage {
                    what: "nn check",
                    detail: format!(
                        "the layer's output has shape {}, the reference's {}",
                        value.shape(),
                        seed.shape()
                    ),
                });
            }
            let wrt = refs.borrow().clone();
            let grads = s.seeded_grads(out, seed, &wrt)?;
            Ok((value, grads))
        },
    );
    let (value, grads) = out.map_err(|e| format!("the pass failed: {e}"))?;
    if !case.spec.training() {
        // The same pass through `Runtime::eval`, recorded without gradients (no op keeps a
        // backward's workspace): the recorded pass's bits.
        let evaluated = rt
            .eval(&layer, |g| {
                let x = match &case.x {
                    Some(x) => Some(g.input(x.cast())?),
                    None => None,
                };
                forward_layer(&layer, &case.spec, g, x.as_ref())
            })
            .map_err(|e| format!("the eval pass failed: {e}"))?;
        let bits = |t: &Tensor<O::T>| -> Vec<u64> {
            t.data().iter().map(|v| v.as_f64().to_bits()).collect()
        };
        if bits(&evaluated) != bits(&value) {
            return Err(format!(
                "Runtime::eval (without gradients) gave other values than the recorded pass: {:?} vs {:?}",
                evaluated.data(),
                value.data()
            ));
        }
    }
    let mut buffers = Vec::new();
    for (p, (_, slot)) in params.iter().zip(&slots) {
        if *slot == Slot::Buffer {
            buffers.push(rt.value_of(p).map_err(|e| format!("buffer value: {e}"))?);
        }
    }
    let grads = grads
        .into_iter()
        .enumerate()
        .map(|(i, g)| match slots.get(i) {
            Some((_, Slot::Buffer)) => None,
            _ => Some(g),
        })
        .collect();
    Ok((value, grads, buffers))
}

/// The layer's forward on `x` (an embedding reads its ids instead).
fn forward_layer<'g, O: Train>(
    layer: &Built<O>,
    spec: &LayerSpec,
    g: &tl_nn::Scope<'g, O>,
    x: Option<&tl_nn::Var<'g, O>>,
) -> tl_nn::Result<tl_nn::Var<'g, O>> {
    match (layer, x, spec) {
        (Built::Module(m), Some(x), _) => m.forward(x),
        (Built::Embedding(e), None, LayerSpec::Embedding { ids, .. }) => e.forward(g, ids),
        (Built::Cross(c), Some(x), _) => {
            let (m, memory, keys) = &**c;
            let memory = g.input(memory.cast())?;
            match keys {
                Keys::Keep(keep) => m.forward_qkv(x, &memory, &memory, keep.as_deref()),
                Keys::Mask(mask) => m.forward_qkv_masked(x, &memory, &memory, mask),
            }
        }
        _ => Err(tl_nn::Error::Usage {
            what: "nn check",
            detail: "a module takes x, the embedding ids".into(),
        }),
    }
}

/// Compare one run with the f64 reference.
fn compare<T: Scalar>(case: &LayerCase, got: Run<T>) -> CaseResult {
    // RmsNorm's default ε is the element type's machine epsilon.
    let machine_eps = if T::NAME == "f64" {
        f64::EPSILON
    } else {
        f32::EPSILON.into()
    };
    let resolved = LayerCase {
        spec: case.spec.with_default_eps(machine_eps),
        ..case.clone()
    };
    let (graph, out) = resolved
        .reference_graph()
        .map_err(|e| format!("reference graph: {e}"))?;
    let mut leaves = case.params.clone();
    leaves.extend(case.x.iter().cloned());
    let want_v = graph
        .eval(&leaves, &[])
        .map_err(|e| format!("reference eval: {e}"))?;
    let want_g = graph
        .backprop_all(&leaves, &[], out, &case.seed)
        .map_err(|e| format!("reference backprop_all: {e}"))?;
    let tol = if T::NAME == "f64" {
        Tol::DEFAULT.f64
    } else {
        Tol::DEFAULT.f32_for(reduction_len(&graph))
    };
    let mut worst = close(&got.0, &want_v[out], tol, "output")?;
    for (i, g) in got.1.iter().enumerate() {
        if let Some(g) = g {
            let what = if i < case.params.len() {
                format!("gradient of parameter {i}")
            } else {
                "gradient of the input".to_owned()
            };
            worst = worst.max(close(g, &want_g[i], tol, &what)?);
        }
    }
    let want_b = buffers_after(case);
    if got.2.len() != want_b.len() {
        return Err(format!(
            "{} buffers after the pass, {} expected",
            got.2.len(),
            want_b.len()
        ));
    }
    for (k, (g, w)) in got.2.iter().zip(&want_b).enumerate() {
        worst = worst.max(close(g, w, tol, &format!("buffer {k} after the pass"))?);
    }
    Ok(worst)
}

/// The buffers' values after the pass: batch norm's running statistics move by PyTorch's rule
/// in a training pass, `(1 − 0.1)·old + 0.1·batch` (mean; unbiased variance, the old one kept
/// when the batch has one element per channel), and stay in an eval pass.
fn buffers_after(case: &LayerCase) -> Vec<Tensor<f64>> {
    let LayerSpec::BatchNorm {
        channels,
        n,
        rest,
        training,
        ..
    } = &case.spec
    else {
        return Vec::new();
    };
    let (old_m, old_v) = (&case.params[2], &case.params[3]);
    let Some(x) = case.x.as_ref().filter(|_| *training) else {
        return vec![old_m.clone(), old_v.clone()];
    };
    let (c, r) = (*channels, rest.iter().product::<usize>());
    let count = n * r;
    let group =
        |ch: usize| (0..*n).flat_map(move |b| (0..r).map(move |k| x.data()[(b * c + ch) * r + k]));
    let mom = 0.1;
    let mean = Tensor::from_fn([c], |ch| {
        let m = group(ch).sum::<f64>() / count as f64;
        (1.0 - mom) * old_m.data()[ch] + mom * m
    });
    let var = Tensor::from_fn([c], |ch| {
        let m = group(ch).sum::<f64>() / count as f64;
        if count > 1 {
            let v = group(ch).map(|v| (v - m) * (v - m)).sum::<f64>() / (count - 1) as f64;
            (1.0 - mom) * old_v.data()[ch] + mom * v
        } else {
            old_v.data()[ch]
        }
    });
    vec![mean, var]
}

pub(crate) fn close<T: Scalar>(
    got: &Tensor<T>,
    want: &Tensor<f64>,
    tol: f64,
    what: &str,
) -> CaseResult {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} from tl-nn, {} from the reference",
            got.shape(),
            want.shape()
        ));
    }
    Measured::check(tensor_err(got, want), tol, || {
        let i = worst_index(got, want).unwrap_or(0);
        format!(
            "{what} differs: at flat index {i} tl-nn {} vs reference {}",
            got.data()[i],
            want.data()[i]
        )
    })
}

/// A check that runs on any [`LayerSession`]; [`on_session`] gives it the session.
pub trait SessionCheck {
    /// The check on `session`.
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult;
}

/// `check` on a fresh session of kind `on` (seed [`NN_SEED`], deterministic reductions off).
pub fn on_session(on: NnSession, check: &impl SessionCheck) -> CaseResult {
    let opts = |backend| Options {
        backend,
        deterministic: false,
        seed: NN_SEED,
        ..Options::default()
    };
    let eager = |e: tl_session::Error| e.to_string();
    match on {
        NnSession::CpuF64 => check.run(Session::<f64>::new(opts(Backend::Cpu)).map_err(eager)?),
        NnSession::CpuF32 => check.run(Session::<f32>::new(opts(Backend::Cpu)).map_err(eager)?),
        NnSession::SimF32 => check.run(Session::<f32>::new(opts(Backend::CudaSim)).map_err(eager)?),
        NnSession::LinkedF64 => check.run(LinkedSession::<f64>::with_seed(NN_SEED)),
        NnSession::LinkedF32 => check.run(LinkedSession::<f32>::with_seed(NN_SEED)),
    }
}

impl SessionCheck for LayerCase {
    fn run<O: LayerSession + 'static>(&self, session: O) -> CaseResult {
        compare(self, run_layer(self, session)?)
    }
}

/// One case of a layer on one session: value and gradients equal the reference.
pub fn layer_case(case: &LayerCase, on: NnSession) -> CaseResult {
    on_session(on, case).map_err(|e| format!("{} {}: {e}", case.spec.name(), on.name()))
}

/// The check for the layer `name` on session `on`: `cfg.cases` cases, labelled
/// `nn <layer> <session>`.
pub fn check_layer(name: &str, on: NnSession, cfg: &RunConfig) -> Report {
    let label = format!("nn {name} {}", on.name());
    if name == "CrossEntropy" {
        return run_check(label, cfg, ce_cases(), move |c| ce_case(c, on));
    }
    run_check(label, cfg, layer_cases(name), move |c| layer_case(c, on))
}

/// Every layer on every session.
pub fn check_all_layers(cfg: &RunConfig) -> Vec<Report> {
    let mut out = Vec::new();
    for name in LAYERS {
        for on in NnSession::ALL {
            out.push(check_layer(name, on, cfg));
        }
    }
    out
}
