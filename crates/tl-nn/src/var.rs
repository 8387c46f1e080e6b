//! [`Var`]: a tensor recorded in an open pass, with the ops as methods and the arithmetic
//! operators, so expressions nest as users write them: `x.matmul(&w)?.relu()?`,
//! `(&a + &b)?`. Every call goes through the session's checks: a handle from another session or
//! from an ended pass is still an error.
//!
//! The operators return `Result<Var>` (as candle's do); `+ - * /` broadcast their operands to a
//! common shape with PyTorch's rules first.

use std::ops::{Add, Div, Mul, Neg, Sub};

use tl_ir::{Op, UserOpRef};
use tl_session::{TensorRef, Train};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};

use crate::error::{dims_product, usage};
use crate::{Labels, Result, Runtime, Scope};

/// A tensor in an open pass (a handle plus the runtime it lives in). Cheap to clone.
/// PyTorch comparison: a `torch.Tensor` in the autograd graph.
pub struct Var<'g, O: Train> {
    rt: &'g Runtime<O>,
    r: TensorRef,
}

impl<'g, O: Train> Clone for Var<'g, O> {
    fn clone(&self) -> Self {
        Var {
            rt: self.rt,
            r: self.r.clone(),
        }
    }
}

impl<'g, O: Train> std::fmt::Debug for Var<'g, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var(#{} {})", self.r.id(), self.r.shape())
    }
}

/// Methods `fn name(&self) -> Result<Var>` for the one-operand ops without parameters.
macro_rules! unary {
    ($( $(#[$doc:meta])* $name:ident; )*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Var<'g, O>> {
                self.record(|s| s.$name(&self.r))
            }
        )*
    };
}

impl<'g, O: Train> Var<'g, O> {
    pub(crate) fn new(rt: &'g Runtime<O>, r: TensorRef) -> Self {
        Var { rt, r }
    }

    /// The session handle.
    pub fn tensor_ref(&self) -> &TensorRef {
        &self.r
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.r.shape()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.r.shape().dims()
    }

    /// The pass this tensor lives in (to create constants or reach parameters).
    pub fn scope(&self) -> Scope<'g, O> {
        Scope { rt: self.rt }
    }

    /// The value, read back to the host. PyTorch: `x.detach().cpu()`.
    pub fn value(&self) -> Result<Tensor<O::T>> {
        Ok(self.rt.borrow_mut().read(&self.r)?)
    }

    /// Check that `other` lives in the same runtime (its session checks the rest).
    fn same(&self, what: &'static str, other: &Var<'g, O>) -> Result<()> {
        if std::ptr::eq(self.rt, other.rt) {
            Ok(())
        } else {
            Err(usage(
                what,
                "the operands belong to different runtimes (sessions)",
            ))
        }
    }

    /// Check the handle against the session now: a handle of another session or of an ended
    /// pass is an error.
    pub(crate) fn check_here(&self, what: &'static str) -> Result<()> {
        let now = self.rt.session().stamp();
        let h = self.r.stamp();
        if h.session != now.session {
            return Err(usage(what, "the tensor belongs to another session"));
        }
        if h.epoch != now.epoch {
            return Err(usage(
                what,
                "the tensor was recorded in an earlier pass (each step or eval is a fresh pass); record it again in this one",
            ));
        }
        Ok(())
    }

    /// Record an op over `self` and `others` (which must live in the same runtime) with `f`.
    pub(crate) fn op(
        &self,
        what: &'static str,
        others: &[&Var<'g, O>],
        f: impl FnOnce(&mut O) -> tl_session::Result<TensorRef>,
    ) -> Result<Var<'g, O>> {
        for o in others {
            self.same(what, o)?;
        }
        self.record(f)
    }

    fn record(
        &self,
        f: impl FnOnce(&mut O) -> tl_session::Result<TensorRef>,
    ) -> Result<Var<'g, O>> {
        let r = f(&mut self.rt.borrow_mut())?;
        Ok(Var::new(self.rt, r))
    }

    fn record2(
        &self,
        what: &'static str,
        other: &Var<'g, O>,
        f: impl FnOnce(&mut O, &TensorRef, &TensorRef) -> tl_session::Result<TensorRef>,
    ) -> Result<Var<'g, O>> {
        self.same(what, other)?;
        self.record(|s| f(s, &self.r, &other.r))
    }

    /// `self` and `other` broadcast to their common shape (PyTorch's rules).
    fn broadcast_pair(
        &self,
        what: &'static str,
        other: &Var<'g, O>,
    ) -> Result<(Var<'g, O>, Var<'g, O>)> {
        self.same(what, other)?;
        if self.shape() == other.shape() {
            return Ok((self.clone(), other.clone()));
        }
        let to = broadcast_shapes(what, self.shape(), other.shape())?;
        Ok((self.broadcast_to(&to)?, other.broadcast_to(&to)?))
    }

    unary! {
        /// `|x|`. PyTorch: `torch.abs`.
        abs;
        /// `sqrt(max(x, 0))`. PyTorch: `torch.sqrt`.
        sqrt;
        /// `exp x`. PyTorch: `torch.exp`.
        exp;
        /// `ln x` (an error for x ≤ 0 on the CPU). PyTorch: `torch.log`.
        log;
        /// `1/x`. PyTorch: `torch.reciprocal`.
        inv;
        /// `max(x, 0)`. PyTorch: `torch.relu`.
        relu;
        /// `1/(1+exp(−x))`. PyTorch: `torch.sigmoid`.
        sigmoid;
        /// `tanh x`. PyTorch: `torch.tanh`.
        tanh;
        /// `log(1+exp(x))`, stable. PyTorch: `F.softplus`.
        softplus;
        /// GELU (tanh form). PyTorch: `F.gelu(x, approximate="tanh")`.
        gelu;
        /// `x·sigmoid(x)`. PyTorch: `F.silu`.
        silu;
        /// The exact GELU `½·x·(1 + erf(x/√2))`. PyTorch: `F.gelu(x)` (`approximate="none"`).
        gelu_erf;
        /// Identity without gradient. PyTorch: `x.detach()`.
        detach;
        /// Per-channel batch mean (row 0) and biased variance (row 1) of (C, H, W) or
        /// (N, C, H, W), shaped (2, C). PyTorch: `torch.var_mean(x, dim=(0, 2, 3),
        /// unbiased=False)`.
        batch_moments;
        /// All axes into one. PyTorch: `torch.flatten(x)`.
        flatten;
        /// (m, n) → (n, m). PyTorch: `x.T`.
        transpose2d;
        /// (a, b, c) → (a, c, b). PyTorch: `x.transpose(-1, -2)`.
        swap_last_two;
        /// The sum of every element. PyTorch: `x.sum()`.
        sum;
        /// Softmax along the last axis. PyTorch: `F.softmax(x, -1)`.
        softmax;
        /// Log-softmax along the last axis. PyTorch: `F.log_softmax(x, -1)`.
        log_softmax;
    }

    /// The mean of every element. PyTorch: `x.mean()`.
    pub fn mean(&self) -> Result<Var<'g, O>> {
        let n = self.shape().numel().max(1);
        self.sum()?.scale(1.0 / n as f64)
    }

    /// `c · x`. PyTorch: `x * c`.
    pub fn scale(&self, c: f64) -> Result<Var<'g, O>> {
        self.record(|s| s.scale(&self.r, c))
    }

    /// Axes `depth` and `depth + 1` swapped (the identity where `depth + 1` is not an axis).
    /// PyTorch: `x.transpose(depth, depth + 1)`.
    pub fn swap_adjacent(&self, depth: usize) -> Result<Var<'g, O>> {
        self.record(|s| s.swap_adjacent(&self.r, depth))
    }

    /// Softmax along `axis` (0-based; the last axis is [`Var::softmax`]). PyTorch:
    /// `F.softmax(x, dim=axis)`.
    pub fn softmax_axis(&self, axis: usize) -> Result<Var<'g, O>> {
        self.along_axis("softmax", axis, |v| v.softmax())
    }

    /// Log-softmax along `axis` (0-based; the last axis is [`Var::log_softmax`]). PyTorch:
    /// `F.log_softmax(x, dim=axis)`.
    pub fn log_softmax_axis(&self, axis: usize) -> Result<Var<'g, O>> {
        self.along_axis("log_softmax", axis, |v| v.log_softmax())
    }

    /// `f`, an op along the last axis, applied along `axis`: the shape viewed as (A, n, B)
    /// with n the axis, the axis moved last (`swapLastTwo`), `f`, and moved back. An axis out
    /// of range is an error naming `what`, the axis and the shape.
    fn along_axis(
        &self,
        what: &'static str,
        axis: usize,
        f: impl FnOnce(&Var<'g, O>) -> Result<Var<'g, O>>,
    ) -> Result<Var<'g, O>> {
        let dims = self.dims();
        if axis >= dims.len() {
            return Err(usage(
                what,
                format!("axis {axis} is out of range for {}", self.shape()),
            ));
        }
        if axis + 1 == dims.len() {
            return f(self);
        }
        let outer = dims_product(what, self.shape(), &dims[..axis])?;
        let inner = dims_product(what, self.shape(), &dims[axis + 1..])?;
        let moved = self.reshape(&[outer, dims[axis], inner])?.swap_last_two()?;
        f(&moved)?.swap_last_two()?.reshape(dims)
    }

    /// `x + c` (the scalar broadcast to x's shape). PyTorch: `x + c`.
    pub fn add_scalar(&self, c: f64) -> Result<Var<'g, O>> {
        self + &self.scope().full(&[], c)?
    }

    /// `min(hi, max(lo, x))`. PyTorch: `torch.clamp`.
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Var<'g, O>> {
        self.record(|s| s.clamp(&self.r, lo, hi))
    }

    /// `x` for x > 0, else `negative_slope·x` (gradient `negative_slope` at 0). PyTorch:
    /// `F.leaky_relu(x, negative_slope)` (its default: 0.01).
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Var<'g, O>> {
        self.record(|s| s.leaky_relu(&self.r, negative_slope))
    }

    /// `x` for x > 0, else `alpha·(eˣ − 1)` (gradient `alpha` at 0). PyTorch: `F.elu(x, alpha)`
    /// (its default: 1.0).
    pub fn elu(&self, alpha: f64) -> Result<Var<'g, O>> {
        self.record(|s| s.elu(&self.r, alpha))
    }

    /// The same elements in `dims` (row-major). PyTorch: `x.reshape(dims)`.
    pub fn reshape(&self, dims: &[usize]) -> Result<Var<'g, O>> {
        self.record(|s| s.reshape(&self.r, Shape::new(dims)))
    }

    /// Keep the leading axis and flatten the rest: (B, …) → (B, ∏…). PyTorch: `nn.Flatten()`.
    pub fn flatten_batch(&self) -> Result<Var<'g, O>> {
        match self.dims() {
            [] => self.reshape(&[1, 1]),
            [b, rest @ ..] => {
                let n = rest
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .ok_or_else(|| {
                        usage(
                            "Var::flatten_batch",
                            format!(
                                "the trailing dims {rest:?} of {} have more elements than usize holds",
                                self.shape()
                            ),
                        )
                    })?;
                self.reshape(&[*b, n])
            }
        }
    }

    /// Expand to `to` (numpy/PyTorch rules). PyTorch: `x.expand(to)`.
    pub fn broadcast_to(&self, to: &Shape) -> Result<Var<'g, O>> {
        if self.shape() == to {
            return Ok(self.clone());
        }
        self.record(|s| s.broadcast_to(&self.r, to.clone()))
    }

    /// Sum over `axis` (removed). PyTorch: `x.sum(axis)`.
    pub fn sum_axis(&self, axis: usize) -> Result<Var<'g, O>> {
        self.record(|s| s.reduce_sum(&self.r, axis))
    }

    /// Mean over `axis` (removed). PyTorch: `x.mean(axis)`.
    pub fn mean_axis(&self, axis: usize) -> Result<Var<'g, O>> {
        self.record(|s| s.reduce_mean(&self.r, axis))
    }

    /// Matrix product of 2-D tensors. PyTorch: `a @ b`.
    pub fn matmul(&self, other: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.record2("Var::matmul", other, |s, a, b| s.matmul(a, b))
    }

    /// Batched matrix product (B, m, k)·(B, k, n). PyTorch: `torch.bmm`.
    pub fn bmm(&self, other: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.record2("Var::bmm", other, |s, a, b| s.bmm(a, b))
    }

    /// Elementwise maximum (ties split the gradient). PyTorch: `torch.maximum`.
    pub fn maximum(&self, other: &Var<'g, O>) -> Result<Var<'g, O>> {
        let (a, b) = self.broadcast_pair("Var::maximum", other)?;
        a.record2("Var::maximum", &b, |s, a, b| s.max(a, b))
    }

    /// Elementwise minimum (ties split the gradient). PyTorch: `torch.minimum`.
    pub fn minimum(&self, other: &Var<'g, O>) -> Result<Var<'g, O>> {
        let (a, b) = self.broadcast_pair("Var::minimum", other)?;
        a.record2("Var::minimum", &b, |s, a, b| s.min(a, b))
    }

    /// Concatenate along axis 0. PyTorch: `torch.cat([a, b])`.
    pub fn concat0(&self, other: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.record2("Var::concat0", other, |s, a, b| s.concat0(a, b))
    }

    /// Rows `start..start+len` of axis 0. PyTorch: `x[start:start+len]`.
    pub fn narrow0(&self, start: usize, len: usize) -> Result<Var<'g, O>> {
        self.record(|s| s.slice_range0(&self.r, start, len))
    }

    /// The user op `op` ([`tl_ir::UserOp`]) applied to `self` then `others`, in the op's
    /// operand order: recorded like any catalogue op, so it runs eager and linked, on the CPU
    /// and the CUDA tapes, and its gradients flow. PyTorch: calling a `torch.library.custom_op`.
    pub fn user(&self, op: &UserOpRef, others: &[&Var<'g, O>]) -> Result<Var<'g, O>> {
        for o in others {
            self.same("Var::user", o)?;
        }
        let mut args: Vec<&TensorRef> = vec![&self.r];
        args.extend(others.iter().map(|o| &o.r));
        self.record(|s| s.user(op, &args))
    }

    /// Mean squared error against `target` (same shape). PyTorch: `F.mse_loss(x, target)`.
    pub fn mse_loss(&self, target: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.record2("Var::mse_loss", target, |s, a, b| s.mse_loss(a, b))
    }

    /// Softmax of the last axis with `mask` (true = allowed; a row with nothing allowed gives
    /// zeros). PyTorch: `F.softmax(x.masked_fill(~mask, -inf), -1)`.
    pub fn masked_softmax(&self, mask: &Mask) -> Result<Var<'g, O>> {
        self.record(|s| s.masked_softmax(&self.r, mask.clone()))
    }

    /// Scaled dot-product attention with this tensor as the queries ((n, P) or (B, n, P)) and
    /// `key`, `value` of one shape ((nk, Pk) or (B, nk, Pk): as many keys as queries, or another
    /// length), `heads` heads side by side on the last axis (head h: columns h·d..(h+1)·d, d =
    /// P/heads): per head `softmax(Q_h K_gᵀ/√d)·V_g` (masked where the (n, nk) `mask` is false; a
    /// query with nothing allowed gives zeros), the heads merged back. Pk = P gives every query
    /// head its own key head (g = h); Pk = kv_heads·d with kv_heads dividing heads is
    /// grouped-query attention, query head h reading key head g = h / (heads / kv_heads)
    /// (multi-query: kv_heads = 1), with no copy of k and v per query head. `fused` runs the
    /// streaming core (on CUDA the flash kernels: O((n + nk)·P) memory, never the (n, nk)
    /// scores); the value is the same function either way. The op
    /// `scaledDotProductAttention`: `multiHeadAttention`'s core without its projections, for
    /// attention whose queries and keys are made another way (rotary embeddings, grouped
    /// heads). PyTorch: `F.scaled_dot_product_attention(q', k', v', attn_mask=mask,
    /// enable_gqa=kv_heads < heads)` on `q' = q.view(B, n, heads, d).transpose(1, 2)` (likewise
    /// k', v' with nk and kv_heads), transposed back and viewed as (B, n, P).
    pub fn scaled_dot_product_attention(
        &self,
        key: &Var<'g, O>,
        value: &Var<'g, O>,
        heads: usize,
        mask: Option<&Mask>,
        fused: bool,
    ) -> Result<Var<'g, O>> {
        self.op("Var::scaled_dot_product_attention", &[key, value], |s| {
            s.scaled_dot_product_attention(&self.r, &key.r, &value.r, heads, mask.cloned(), fused)
        })
    }

    /// `x · mask / keep` with a fresh mask (keep probability `keep`) from the session's seed
    /// and counter, whatever the mode. PyTorch: `F.dropout(x, 1 − keep, training=True)`.
    pub fn dropout(&self, keep: f64) -> Result<Var<'g, O>> {
        self.record(|s| s.dropout(&self.r, keep))
    }

    /// Mean cross-entropy of these logits ((rows, classes), or (…, classes) folded into rows)
    /// against `labels`. The label count must equal the row count and the classes the last
    /// axis: anything else is an error naming both (the op of the spec would silently give 0
    /// for a label out of range). PyTorch: `F.cross_entropy(logits, labels)`.
    pub fn cross_entropy(&self, labels: &Labels) -> Result<Var<'g, O>> {
        let what = "Var::cross_entropy";
        let dims = self.dims();
        let Some((&classes, lead)) = dims.split_last() else {
            return Err(usage(
                what,
                "the logits must have a class axis, got a scalar",
            ));
        };
        let rows = dims_product(what, self.shape(), lead)?;
        if classes != labels.classes() || rows != labels.len() {
            return Err(usage(
                what,
                format!(
                    "logits {} hold {rows} row(s) of {classes} classes, but the labels are {} value(s) of {} classes",
                    self.shape(),
                    labels.len(),
                    labels.classes()
                ),
            ));
        }
        let x = if lead.len() == 1 {
            self.clone()
        } else {
            self.reshape(&[rows, classes])?
        };
        let at = self.rt.borrow_mut().record_nat_vec(labels.values()).pos();
        x.record(|s| s.apply(Op::CrossEntropy { labels_at: at }, &[&x.r]))
    }

    fn arith(
        &self,
        what: &'static str,
        other: &Var<'g, O>,
        f: impl FnOnce(&mut O, &TensorRef, &TensorRef) -> tl_session::Result<TensorRef>,
    ) -> Result<Var<'g, O>> {
        let (a, b) = self.broadcast_pair(what, other)?;
        a.record2(what, &b, f)
    }
}

/// The broadcast shape of `a` and `b` (right-aligned; a size-1 axis stretches).
pub(crate) fn broadcast_shapes(what: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
    let (a, b) = (a.dims(), b.dims());
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(usage(
                    what,
                    format!("shapes {a:?} and {b:?} do not broadcast (axis {i}: {da} vs {db})"),
                ));
            }
        };
    }
    Ok(Shape::new(&out))
}

/// `impl $Trait for &Var`, `Var` and their mixes, each returning `Result<Var>`.
macro_rules! binary_operator {
    ($Trait:ident, $method:ident, $what:literal, $op:ident) => {
        impl<'g, O: Train> $Trait<&Var<'g, O>> for &Var<'g, O> {
            type Output = Result<Var<'g, O>>;
            fn $method(self, rhs: &Var<'g, O>) -> Self::Output {
                self.arith($what, rhs, |s, a, b| s.$op(a, b))
            }
        }
        impl<'g, O: Train> $Trait<Var<'g, O>> for Var<'g, O> {
            type Output = Result<Var<'g, O>>;
            fn $method(self, rhs: Var<'g, O>) -> Self::Output {
                (&self).$method(&rhs)
            }
        }
        impl<'g, O: Train> $Trait<&Var<'g, O>> for Var<'g, O> {
            type Output = Result<Var<'g, O>>;
            fn $method(self, rhs: &Var<'g, O>) -> Self::Output {
                (&self).$method(rhs)
            }
        }
    };
}

binary_operator!(Add, add, "Var + Var", add);
binary_operator!(Sub, sub, "Var - Var", sub);
binary_operator!(Mul, mul, "Var * Var", mul);
binary_operator!(Div, div, "Var / Var", div);

impl<'g, O: Train> Mul<f64> for &Var<'g, O> {
    type Output = Result<Var<'g, O>>;
    fn mul(self, c: f64) -> Self::Output {
        self.scale(c)
    }
}

impl<'g, O: Train> Neg for &Var<'g, O> {
    type Output = Result<Var<'g, O>>;
    fn neg(self) -> Self::Output {
        self.scale(-1.0)
    }
}
