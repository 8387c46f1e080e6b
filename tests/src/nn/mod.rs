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

mod build;
mod reference;
pub(crate) use reference::pool_op;
mod strategy;

use build::{Built, Keys};
pub(crate) use strategy::values;
pub use strategy::{layer_cases, spec_strategy};

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
