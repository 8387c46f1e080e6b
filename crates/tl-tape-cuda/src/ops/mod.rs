//! The CUDA tape's ops: each op of [`tl_ir::Op`] composed from device primitives, forward and
//! backward, one module per op family. The two matches below are the whole dispatch, so every
//! op's rules can be audited side by side (and a new `Op` variant does not compile until it has
//! both faces here).
//!
//! Ownership rules every formula follows:
//! - a forward returns a fresh buffer (or, for `reshape`, `flatten` and `detach`, a view of its
//!   operand that the tape does not own), plus any *workspace* the backward may reuse;
//! - a backward returns fresh buffers only (never an operand, never the cotangent itself), and
//!   computes nothing for an operand that does not require grad;
//! - temporaries are released before returning, on success and on error ([`with_scratch`]).

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod index;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod spectral;

use smallvec::SmallVec;
use tl_ir::{Op, Then};
use tl_spec::Shape;

use crate::device::{Act, Buffer, Device, PointAct};
use crate::{AnyBuffer, Result};

/// The result of a forward formula.
#[derive(Debug)]
pub struct Forward {
    /// The op's value.
    pub value: AnyBuffer,
    /// Whether the value is a fresh buffer the tape owns (false for views of an operand).
    pub owned: bool,
    /// Buffers kept for the backward (released after backprop, or at once if no gradient will
    /// flow through the node).
    pub workspace: Vec<Buffer>,
}

/// One operand's cotangent from a backward formula.
#[derive(Debug)]
pub enum Cotangent {
    /// A buffer of its own, which the caller owns.
    Owned(AnyBuffer),
    /// The output cotangent itself, read with this operand's shape (the same element count):
    /// the VJP is the identity (`add`, `sub`'s first operand, `reshape`), so no copy is made.
    /// It is not a new buffer: the caller copies it, accumulates from it or, where the output
    /// cotangent is not needed afterwards, takes it over.
    Same(Shape),
}

impl Cotangent {
    /// The operand shape it is read with.
    pub fn shape(&self) -> &Shape {
        match self {
            Cotangent::Owned(a) => a.shape(),
            Cotangent::Same(s) => s,
        }
    }
}

/// Operand cotangents of one node: one entry per operand, `None` where none is computed.
pub type Grads = SmallVec<[Option<Cotangent>; 3]>;

/// Temporaries of one formula, released by [`with_scratch`] whatever the outcome.
#[derive(Debug, Default)]
pub struct Scratch(Vec<Buffer>);

impl Scratch {
    /// Register `b` as a temporary; returns it.
    pub fn tmp(&mut self, b: Buffer) -> Buffer {
        self.0.push(b);
        b
    }

    /// Take `keep` back from the temporaries: they outlive the formula (a forward's workspace).
    pub fn keep(&mut self, keep: &[Buffer]) {
        self.0.retain(|b| !keep.contains(b));
    }
}

/// Run `f` with a scratch list, then release every temporary it registered.
pub fn with_scratch<D: Device, R>(
    dev: &mut D,
    f: impl FnOnce(&mut D, &mut Scratch) -> Result<R>,
) -> Result<R> {
    let mut s = Scratch::default();
    let r = f(dev, &mut s);
    dev.release_all(s.0);
    r
}

/// Pair a fresh buffer with the op's output shape, releasing it if they disagree.
pub fn wrap<D: Device>(dev: &mut D, op: &Op, shape: &Shape, b: Buffer) -> Result<AnyBuffer> {
    AnyBuffer::new(op.name(), shape.clone(), b).inspect_err(|_| {
        dev.release(b);
    })
}

/// The [`PointAct`] of `geluErf`, `leakyRelu` and `elu` (the GELU for any other op; callers
/// match those three first).
fn point_act(op: &Op) -> PointAct {
    match op {
        Op::LeakyRelu { negative_slope } => PointAct::LeakyRelu {
            negative_slope: *negative_slope as f32,
        },
        Op::Elu { alpha } => PointAct::Elu {
            alpha: *alpha as f32,
        },
        _ => PointAct::GeluErf,
    }
}

/// A forward's fresh value `y` with the `workspace` its backward reuses; both released if `y`
/// does not fit the op's output shape.
fn kept<D: Device>(
    dev: &mut D,
    op: &Op,
    shape: &Shape,
    y: Buffer,
    workspace: Vec<Buffer>,
) -> Result<Forward> {
    match wrap(dev, op, shape, y) {
        Ok(value) => Ok(Forward {
            value,
            owned: true,
            workspace,
        }),
        Err(e) => {
            dev.release_all(workspace);
            Err(e)
        }
    }
}

/// The forward value of `op` on `x`, whose output shape (`shape`) the shape rule has inferred.
/// `nats` is the Nat environment (runtime indices and labels) the index ops read.
pub fn forward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    shape: &Shape,
    nats: &[usize],
) -> Result<Forward> {
    use self::{elementwise as ew, linalg as la};
    use Op::*;
    let b = |k: usize| x[k].buffer();
    let value = match op {
        Add => dev.add(b(0), b(1)),
        Sub => dev.sub(b(0), b(1)),
        Mul => dev.mul(b(0), b(1)),
        Div => dev.div(b(0), b(1)),
        Max => dev.max(b(0), b(1)),
        Min => dev.min(b(0), b(1)),
        Scale(c) => dev.scale(b(0), ew::param(*c)),
        Abs => dev.abs(b(0)),
        Sqrt => dev.sqrt(b(0)),
        Exp => dev.exp(b(0)),
        Log => dev.log(b(0)),
        Inv => dev.inv(b(0)),
        Relu => dev.relu(b(0)),
        Sigmoid => dev.sigmoid(b(0)),
        Tanh => dev.tanh(b(0)),
        Softplus => dev.softplus(b(0)),
        Clamp { lo, hi } => dev.clamp(b(0), ew::param(*lo), ew::param(*hi)),
        SafeLog { eps } => dev.safe_log(b(0), ew::param(*eps)),
        Constant(t) => ew::constant(dev, t),
        Detach | Reshape(_) | Flatten => return shape::view(x[0], shape),
        Transpose2d | PermuteBca | PermuteCab | SwapLastTwo | SwapAdjacent(_) => {
            shape::permute(dev, op, x[0])
        }
        BroadcastTo(to) => shape::broadcast(dev, x[0], to),
        Sum => dev.reduce_sum(b(0)),
        ReduceSum(axis) => reduce::axis(dev, x[0], *axis, false),
        ReduceMean(axis) => reduce::axis(dev, x[0], *axis, true),
        Matmul | Bmm => la::Product::of(x[0], x[1]).forward(dev, x[0], x[1]),
        Linear => la::LinearDims::of(x[0], x[2]).forward(dev, x[0], x[1], x[2]),
        Softmax => softmax::forward(dev, x[0], false),
        RandUniform { seed, counter, .. } => random::uniform(dev, shape.numel(), *seed, *counter),
        BernoulliMask {
            keep,
            seed,
            counter,
            ..
        } => random::mask(dev, shape.numel(), *keep, *seed, *counter),
        Dropout {
            keep,
            seed,
            counter,
        } => random::dropout(dev, b(0), shape.numel(), *keep, *seed, *counter),
        SpectralConv1dRfft { .. } => spectral::forward(dev, op, x),
        LogSoftmax => softmax::forward(dev, x[0], true),
        LayerNorm { .. } | BatchNorm { .. } => {
            let (y, stats) = norm::forward(dev, op, x[0], x[1], Some(x[2]))?;
            return kept(dev, op, shape, y, vec![stats]);
        }
        // Two operands (x, γ): no β.
        RmsNorm { .. } => {
            let (y, stats) = norm::forward(dev, op, x[0], x[1], None)?;
            return kept(dev, op, shape, y, vec![stats]);
        }
        BatchMoments => norm::moments(dev, op, x[0]),
        MaskedSoftmax { mask } => attention::masked_softmax(dev, x[0], mask),
        MultiHeadAttention { .. } => {
            let (y, w) = attention::mha(dev, op, x)?;
            return kept(dev, op, shape, y, w);
        }
        ScaledDotProductAttention { .. } => {
            let (y, w) = attention::sdpa(dev, op, x)?;
            return kept(dev, op, shape, y, w);
        }
        Conv { .. } | ConvTranspose { .. } => conv::forward(dev, op, x, shape),
        MaxPool { .. } | AvgPool { .. } | SmoothMaxPool { .. } => {
            pool::forward(dev, op, x[0], shape)
        }
        MseLoss => {
            let (loss, diff) = loss::mse(dev, x[0], x[1])?;
            return kept(dev, op, shape, loss, vec![diff]);
        }
        Gelu => dev.gelu(b(0)),
        Silu => dev.silu(b(0)),
        GeluErf | LeakyRelu { .. } | Elu { .. } => dev.point_act(b(0), point_act(op)),
        Concat => dev.concat(b(0), b(1)),
        Slice { start, len } => index::slice(dev, x[0], *start, *len),
        CrossEntropy { labels_at } => {
            let (loss, labels) = index::cross_entropy(dev, x[0], *labels_at, nats)?;
            return kept(dev, op, shape, loss, vec![labels]);
        }
        tl_ir::gather_ops!() => index::gather(dev, op, x, nats),
        ScatterAddVec { index } | ScatterAddRow { index } => index::scatter_add(dev, x, *index),
        User(u) => return crate::user::forward(dev, op, u, x, shape),
    };
    Ok(Forward {
        value: wrap(dev, op, shape, value?)?,
        owned: true,
        workspace: Vec::new(),
    })
}

/// What a fused bias epilogue does after the bias add ([`forward_then`]).
#[derive(Debug, Clone, Copy)]
pub enum Fusion<'a> {
    /// Applies an activation ([`Device::add_bias_act`]).
    Act(Act),
    /// Adds a residual of the same shape ([`Device::add_bias_residual`]): `other + sum` when
    /// `other_first` (the `add` reads it first), else `sum + other`.
    Residual {
        /// The other operand of the `add`.
        other: &'a AnyBuffer,
        /// Whether it is the `add`'s first operand.
        other_first: bool,
    },
}

/// Whether the pair `op` → `next` (reading `next_args`) is one a bias epilogue may run, before
/// the shapes are known: `op` ends in a bias add (`linear`, `conv`, `convTranspose`) and
/// `next` is an activation the epilogue applies ([`Act`]) of its result, or an `add` of its
/// result and one other value. [`fusion`] decides with the values.
pub fn fusable(op: &Op, next: &Op, next_args: &[Then]) -> bool {
    matches!(op, Op::Linear | Op::Conv { .. } | Op::ConvTranspose { .. })
        && match (next, next_args) {
            (_, [Then::First]) => Act::of(next).is_some(),
            (Op::Add, [Then::First, Then::Id(_)] | [Then::Id(_), Then::First]) => true,
            _ => false,
        }
}

/// The fusion of a pair `op` → `next` that one bias epilogue runs, `next` reading `op`'s result
/// as `next_args` say ([`Then::First`]; `others` are the values of the [`Then::Id`]s): a pair
/// [`fusable`] accepts, a residual `add`'s other value having `op`'s output shape (`shape`,
/// no broadcast). `None` for any other pair, which is recorded one op at a time.
pub fn fusion<'a>(
    op: &Op,
    next: &Op,
    next_args: &[Then],
    others: &[&'a AnyBuffer],
    shape: &Shape,
) -> Option<Fusion<'a>> {
    if !fusable(op, next, next_args) {
        return None;
    }
    match (next, next_args, others) {
        (_, [Then::First], []) => Act::of(next).map(Fusion::Act),
        (Op::Add, [Then::First, Then::Id(_)], [r]) | (Op::Add, [Then::Id(_), Then::First], [r])
            if r.shape() == shape =>
        {
            Some(Fusion::Residual {
                other: r,
                other_first: next_args[0] != Then::First,
            })
        }
        _ => None,
    }
}

/// The forward values of `op` on `x` (output shape `shapes[0]`) and of `next` after it
/// (shape `shapes[1]`), as one fused bias epilogue, for a pair [`fusion`] accepts. The values
/// are the ones [`forward`] gives for each op (tests: `tl_tape_cuda::fused`).
pub fn forward_then<D: Device>(
    dev: &mut D,
    [op, next]: [&Op; 2],
    fusion: Fusion<'_>,
    x: &[&AnyBuffer],
    shapes: [&Shape; 2],
) -> Result<(Forward, Forward)> {
    let epilogue = |dev: &mut D, y, b, layout| match fusion {
        Fusion::Act(act) => dev.add_bias_act(y, b, layout, act),
        Fusion::Residual { other, other_first } => {
            dev.add_bias_residual(y, b, layout, other.buffer(), other_first)
        }
    };
    let pair = match op {
        Op::Linear => {
            linalg::LinearDims::of(x[0], x[2]).forward_with(dev, x[0], x[1], x[2], epilogue)
        }
        Op::Conv { .. } | Op::ConvTranspose { .. } => {
            conv::forward_with(dev, op, x, shapes[0], epilogue)
        }
        _ => Err(crate::Error::kernel(
            op.name(),
            "no bias epilogue to fuse an activation into",
        )),
    };
    pair.and_then(|(pre, post)| {
        let value = |dev: &mut D, o: &Op, s: &Shape, b| {
            wrap(dev, o, s, b).map(|value| Forward {
                value,
                owned: true,
                workspace: Vec::new(),
            })
        };
        let first = value(dev, op, shapes[0], pre).inspect_err(|_| {
            dev.release(post);
        })?;
        match value(dev, next, shapes[1], post) {
            Ok(second) => Ok((first, second)),
            Err(e) => {
                dev.release(first.value.buffer());
                Err(e)
            }
        }
    })
}

/// The operand cotangents of `op` at operands `x` with output `y` and output cotangent `g`.
/// `needs[k]` says whether operand `k` requires grad; no cotangent is computed for the others.
/// `nats` is the Nat environment the node was recorded with (the tape's snapshot for ops that
/// read it). On error, every cotangent already computed is released.
#[allow(clippy::too_many_arguments)]
pub fn backward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    y: &AnyBuffer,
    g: &AnyBuffer,
    needs: &[bool],
    workspace: &[Buffer],
    nats: &[usize],
) -> Result<Grads> {
    let mut out = Grads::new();
    let r = backward_into(dev, op, x, y, g, needs, workspace, nats, &mut out);
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            let owned = out.into_iter().flatten().filter_map(|c| match c {
                Cotangent::Owned(a) => Some(a.buffer()),
                Cotangent::Same(_) => None,
            });
            dev.release_all(owned);
            Err(e)
        }
    }
}

/// Pushes one entry per operand (in order) into `out`.
#[allow(clippy::too_many_arguments)]
fn backward_into<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &[&AnyBuffer],
    y: &AnyBuffer,
    g: &AnyBuffer,
    needs: &[bool],
    workspace: &[Buffer],
    nats: &[usize],
    out: &mut Grads,
) -> Result<()> {
    use self::elementwise as ew;
    use Op::*;
    let gb = g.buffer();
    let cotangent = g;
    let xb = |k: usize| x[k].buffer();
    let mut g = Cotangents { dev, x, needs, out };
    match op {
        Add => {
            g.same(0)?;
            g.same(1)
        }
        Sub => {
            g.same(0)?;
            g.push(1, |d| d.scale(gb, -1.0))
        }
        Mul => {
            g.push(0, |d| d.mul(gb, xb(1)))?;
            g.push(1, |d| d.mul(gb, xb(0)))
        }
        Div => g.pair(|d| d.div_bwd(xb(0), xb(1), gb)),
        Max => g.pair(|d| d.max_bwd(xb(0), xb(1), gb)),
        Min => g.pair(|d| d.min_bwd(xb(0), xb(1), gb)),
        Scale(c) => g.push(0, |d| d.scale(gb, ew::param(*c))),
        Abs => g.push(0, |d| d.abs_bwd(xb(0), gb)),
        Sqrt => g.push(0, |d| d.sqrt_bwd(xb(0), gb)),
        Exp => g.push(0, |d| d.mul(gb, y.buffer())),
        Log => g.push(0, |d| d.div(gb, xb(0))),
        Inv => g.push(0, |d| d.inv_bwd(xb(0), gb)),
        Relu => g.push(0, |d| d.relu_bwd(xb(0), gb)),
        Clamp { lo, hi } => g.push(0, |d| {
            d.clamp_bwd(xb(0), gb, ew::param(*lo), ew::param(*hi))
        }),
        Sigmoid => g.push(0, |d| d.sigmoid_bwd(y.buffer(), gb)),
        Tanh => g.push(0, |d| d.tanh_bwd(y.buffer(), gb)),
        Softplus => g.push(0, |d| d.softplus_bwd(xb(0), gb)),
        SafeLog { eps } => g.push(0, |d| d.safe_log_bwd(xb(0), gb, ew::param(*eps))),
        // Not differentiable: the tape never visits them; no cotangent flows.
        Detach => g.none(1),
        Constant(_) => Ok(()),
        Reshape(_) | Flatten => g.same(0),
        Transpose2d | PermuteBca | PermuteCab | SwapLastTwo | SwapAdjacent(_) => {
            g.push(0, |d| shape::permute_back(d, op, x[0], gb))
        }
        BroadcastTo(to) => g.push(0, |d| {
            d.reduce_broadcast(gb, x[0].shape().dims(), to.dims())
        }),
        Sum => g.push(0, |d| d.broadcast(gb, &[], x[0].shape().dims())),
        ReduceSum(axis) => g.push(0, |d| reduce::axis_back(d, x[0], *axis, gb, false)),
        ReduceMean(axis) => g.push(0, |d| reduce::axis_back(d, x[0], *axis, gb, true)),
        Matmul | Bmm => {
            let p = linalg::Product::of(x[0], x[1]);
            g.push(0, |d| p.grad_left(d, gb, xb(1)))?;
            g.push(1, |d| p.grad_right(d, xb(0), gb))
        }
        Linear => {
            let l = linalg::LinearDims::of(x[0], x[2]);
            g.push(0, |d| l.grad_w(d, gb, xb(2)))?;
            g.push(1, |d| l.grad_b(d, gb))?;
            g.push(2, |d| l.grad_x(d, gb, xb(0)))
        }
        Softmax => g.push(0, |d| softmax::backward(d, y, gb, false)),
        // Operand-free draws: not differentiable, no cotangent.
        RandUniform { .. } | BernoulliMask { .. } => Ok(()),
        Dropout {
            keep,
            seed,
            counter,
        } => g.push(0, |d| {
            random::dropout(d, gb, x[0].shape().numel(), *keep, *seed, *counter)
        }),
        SpectralConv1dRfft { .. } => {
            let [dx, dre, dim] = spectral::backward(g.dev, op, x, gb, g.needs)?;
            g.set_all([dx, dre, dim])
        }
        LogSoftmax => g.push(0, |d| softmax::backward(d, y, gb, true)),
        LayerNorm { .. } | BatchNorm { .. } => {
            let d = norm::backward(g.dev, op, x[0], x[1], gb, g.needs, workspace)?;
            g.set_all(d)
        }
        RmsNorm { .. } => {
            // [dx, dγ]; norm::backward's dβ is None here (released there), let go all the same.
            let [dx, dg, db] = norm::backward(g.dev, op, x[0], x[1], gb, g.needs, workspace)?;
            g.dev.release_all(db);
            g.set_all([dx, dg])
        }
        BatchMoments => g.push(0, |d| norm::moments_back(d, op, x[0], y, gb)),
        MaskedSoftmax { mask } => g.push(0, |d| attention::masked_softmax_back(d, y, gb, mask)),
        MultiHeadAttention { .. } => {
            let d = attention::mha_back(g.dev, op, x, gb, g.needs, workspace)?;
            g.set_all(d)
        }
        ScaledDotProductAttention { .. } => {
            let d = attention::sdpa_back(g.dev, op, x, y, gb, g.needs, workspace)?;
            g.set_all(d)
        }
        Conv { .. } | ConvTranspose { .. } => {
            let [dw, db, dx] = conv::backward(g.dev, op, x, y, gb, g.needs)?;
            g.set_all([dw, db, dx])
        }
        MaxPool { .. } | AvgPool { .. } | SmoothMaxPool { .. } => {
            g.push(0, |d| pool::backward(d, op, x[0], y, gb))
        }
        MseLoss => {
            let (d0, d1) = loss::mse_back(g.dev, x[0], x[1], gb, g.needs, workspace)?;
            if let Err(e) = g.set(0, d0) {
                g.dev.release_all(d1);
                return Err(e);
            }
            g.set(1, d1)
        }
        Gelu => g.push(0, |d| d.gelu_bwd(xb(0), gb)),
        Silu => g.push(0, |d| d.silu_bwd(xb(0), gb)),
        GeluErf | LeakyRelu { .. } | Elu { .. } => {
            g.push(0, |d| d.point_act_bwd(xb(0), gb, point_act(op)))
        }
        Concat => {
            let n0 = x[0].shape().numel();
            g.push(0, |d| d.copy_range(gb, 0, n0))?;
            g.push(1, |d| d.copy_range(gb, n0, x[1].shape().numel()))
        }
        Slice { start, .. } => g.push(0, |d| index::slice_back(d, x[0], *start, gb)),
        CrossEntropy { labels_at } => g.push(0, |d| {
            index::cross_entropy_back(d, x[0], *labels_at, gb, nats, workspace)
        }),
        tl_ir::gather_ops!() => {
            g.push(0, |d| index::gather_back(d, op, x, gb, nats))?;
            // The index tensor of `gather` is never differentiable.
            g.none(x.len() - 1)
        }
        ScatterAddVec { index } | ScatterAddRow { index } => {
            g.push(0, |d| d.copy(gb))?;
            g.push(1, |d| index::scatter_add_back_v(d, x, *index, gb))
        }
        User(u) => crate::user::backward(g.dev, u, x, y, cotangent, needs, g.out),
    }
}

/// The cotangents being collected for one node.
struct Cotangents<'a, D> {
    dev: &'a mut D,
    x: &'a [&'a AnyBuffer],
    needs: &'a [bool],
    out: &'a mut Grads,
}

impl<D: Device> Cotangents<'_, D> {
    /// Compute operand `k`'s cotangent with `f` if it is needed, shaped like the operand.
    fn push(&mut self, k: usize, f: impl FnOnce(&mut D) -> Result<Buffer>) -> Result<()> {
        let b = if self.needs[k] {
            Some(f(self.dev)?)
        } else {
            None
        };
        self.set(k, b)
    }

    /// Record operand `k`'s cotangent (already computed, or `None`). Operands are recorded in
    /// order, so `k` is the number recorded so far.
    fn set(&mut self, k: usize, b: Option<Buffer>) -> Result<()> {
        let a = match b {
            Some(b) => Some(Cotangent::Owned(
                AnyBuffer::new("backward", self.x[k].shape().clone(), b).inspect_err(|_| {
                    self.dev.release(b);
                })?,
            )),
            None => None,
        };
        self.out.push(a);
        Ok(())
    }

    /// Operand `k`'s cotangent is the output cotangent itself (an identity VJP), if needed.
    fn same(&mut self, k: usize) -> Result<()> {
        let c = self.needs[k].then(|| Cotangent::Same(self.x[k].shape().clone()));
        self.out.push(c);
        Ok(())
    }

    /// A kernel that computes both operands' cotangents at once; unneeded halves are released.
    fn pair(&mut self, f: impl FnOnce(&mut D) -> Result<(Buffer, Buffer)>) -> Result<()> {
        if !self.needs[0] && !self.needs[1] {
            return self.none(2);
        }
        let (a, b) = f(self.dev)?;
        let keep = |dev: &mut D, need: bool, buf: Buffer| {
            if need {
                Some(buf)
            } else {
                dev.release(buf);
                None
            }
        };
        let (a, b) = (
            keep(self.dev, self.needs[0], a),
            keep(self.dev, self.needs[1], b),
        );
        if let Err(e) = self.set(0, a) {
            self.dev.release_all(b);
            return Err(e);
        }
        self.set(1, b)
    }

    /// Record every operand's cotangent (already computed, in operand order); on error the
    /// ones not yet recorded are released.
    fn set_all<const N: usize>(&mut self, bufs: [Option<Buffer>; N]) -> Result<()> {
        let mut rest = bufs.into_iter();
        while let Some(b) = rest.next() {
            if let Err(e) = self.set(self.out.len(), b) {
                self.dev.release_all(rest.flatten());
                return Err(e);
            }
        }
        Ok(())
    }

    /// No cotangent for the first `n` operands.
    fn none(&mut self, n: usize) -> Result<()> {
        self.out.extend((0..n).map(|_| None));
        Ok(())
    }
}
