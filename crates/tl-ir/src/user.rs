//! User ops: an op defined outside the catalogue, with the same five faces as a catalogue op.
//!
//! A user implements [`UserOp`] (name, static parameters, shape rule, reference value / VJP /
//! JVP generic over the scalar, optionally a faster CPU kernel) and wraps it in a [`UserOpRef`]
//! ([`UserOpRef::new`]); [`Op::User`](crate::Op::User) holds that handle, so the IR
//! ([`crate::GraphBuilder`], [`crate::GraphData::eval`], `backprop_all`, `jvp`, `replay`), both
//! tapes, both sessions and tl-nn take it like any catalogue op, and the harness
//! (`tl_conformance::user`) checks it like one.
//!
//! Backends attach their own implementations as typed *extensions* of the handle
//! ([`UserOpRef::with_extension`]): the CUDA tape looks for its device implementation there
//! (`tl_tape_cuda::user`), and falls back to the op's reference in `f32` on the host when there
//! is none.
//!
//! PyTorch: `torch.library.custom_op` with `register_fake` (the shape rule) and
//! `register_autograd` (the VJP); JAX: `jax.custom_vjp` / `custom_jvp`.
//!
//! ```
//! use tl_ir::{GraphBuilder, Op, UserOp, UserOpRef};
//! use tl_spec::{Scalar, Shape, Tensor};
//!
//! /// `x³`, elementwise.
//! struct Cube;
//!
//! impl UserOp for Cube {
//!     fn name(&self) -> &'static str {
//!         "cube"
//!     }
//!     fn arity(&self) -> usize {
//!         1
//!     }
//!     fn infer_shape(&self, shapes: &[&Shape]) -> tl_spec::Result<Shape> {
//!         Ok(shapes[0].clone())
//!     }
//!     fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
//!         Ok(x[0].map(|v| v * v * v))
//!     }
//!     fn vjp<T: Scalar>(
//!         &self,
//!         x: &[&Tensor<T>],
//!         g: &Tensor<T>,
//!     ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
//!         Ok(vec![Some(x[0].zip_map("cube", g, |v, g| T::lit(3.0) * v * v * g)?)])
//!     }
//!     fn jvp<T: Scalar>(
//!         &self,
//!         x: &[&Tensor<T>],
//!         dx: &[&Tensor<T>],
//!     ) -> tl_spec::Result<Tensor<T>> {
//!         x[0].zip_map("cube", dx[0], |v, d| T::lit(3.0) * v * v * d)
//!     }
//! }
//!
//! let mut g = GraphBuilder::new();
//! let x = g.leaf([2], Some("x"))?;
//! let y = g.apply(Op::User(UserOpRef::new(Cube)), &[x])?;
//! let s = g.apply(Op::Sum, &[y])?;
//! let graph = g.finish();
//! let grads = graph.backprop_all(&[Tensor::new([2], vec![1.0, 2.0])?], &[], s, &Tensor::scalar(1.0))?;
//! assert_eq!(grads[x].data(), &[3.0, 12.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use tl_spec::{Result, Scalar, Shape, Tensor};

/// A static parameter of a user op (an axis, a coefficient, a stencil): compared for op
/// equality, printed in graphs and errors.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// An integer (axes, sizes, counts).
    Int(i64),
    /// A real number (coefficients, ε).
    Float(f64),
    /// A flag.
    Bool(bool),
    /// A word (a mode, a boundary condition).
    Text(String),
    /// A list of integers (strides, dims).
    Ints(Vec<i64>),
    /// A list of reals (a stencil).
    Floats(Vec<f64>),
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Param::Int(v) => write!(f, "{v}"),
            Param::Float(v) => write!(f, "{v}"),
            Param::Bool(v) => write!(f, "{v}"),
            Param::Text(v) => write!(f, "{v:?}"),
            Param::Ints(v) => write!(f, "{v:?}"),
            Param::Floats(v) => write!(f, "{v:?}"),
        }
    }
}

/// An op defined outside the catalogue: its five faces, as a catalogue op has them.
///
/// - **shape rule** — [`UserOp::infer_shape`], the only place its operand shapes are checked
///   (the tapes check every kernel's output against it);
/// - **reference value, VJP, JVP** — generic over the scalar and written to be obviously
///   right; `f64` is the reference the harness compares every backend with;
/// - **CPU kernel** — [`UserOp::cpu_value`] / [`UserOp::cpu_vjp`], defaulting to the reference;
/// - **CUDA** — an extension of the handle (`tl_tape_cuda::user`), or the reference in `f32`
///   on the host.
///
/// Operands are never modified; a VJP returns one entry per operand (`None`: no gradient flows
/// to it, as for an index operand), each of its operand's shape. Errors are `tl_spec` errors
/// naming the op ([`tl_spec::Error::param`], `Error::Domain`, ...).
pub trait UserOp: Send + Sync + 'static {
    /// The op's name in errors, printing and reports (its [`Op::name`](crate::Op::name)).
    fn name(&self) -> &'static str;

    /// Static parameters, in a fixed order. Two handles are the same op when their types,
    /// names and parameters are equal. Default: none.
    fn params(&self) -> Vec<(&'static str, Param)> {
        Vec::new()
    }

    /// How many tensor operands the op takes.
    fn arity(&self) -> usize;

    /// The output shape for the operand shapes, or an error naming the op and the shapes.
    fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape>;

    /// Whether gradients flow through the op at all (default `true`).
    fn is_differentiable(&self) -> bool {
        true
    }

    /// The reference value (operand shapes already checked by the shape rule).
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>>;

    /// The reference VJP for the output cotangent `g`: one entry per operand.
    fn vjp<T: Scalar>(&self, x: &[&Tensor<T>], g: &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>>;

    /// The reference JVP along the operand tangents `dx` (one per operand, same shapes).
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> Result<Tensor<T>>;

    /// The CPU tape's forward kernel. Default: [`UserOp::value`].
    fn cpu_value<T: Scalar>(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        self.value(x)
    }

    /// The CPU tape's backward kernel; `y` is the forward value. Default: [`UserOp::vjp`].
    fn cpu_vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        y: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let _ = y;
        self.vjp(x, g)
    }
}

/// The faces of a [`UserOp`] for the two wire scalars, behind a trait object.
trait Erased: Send + Sync {
    fn name(&self) -> &'static str;
    fn params(&self) -> Vec<(&'static str, Param)>;
    fn arity(&self) -> usize;
    fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape>;
    fn is_differentiable(&self) -> bool;
    fn op_type(&self) -> TypeId;
    fn f64(&self) -> &dyn Faces<f64>;
    fn f32(&self) -> &dyn Faces<f32>;
}

/// The value-computing faces at one scalar type.
trait Faces<T: Scalar> {
    fn value(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>>;
    fn vjp(&self, x: &[&Tensor<T>], g: &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>>;
    fn jvp(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> Result<Tensor<T>>;
    fn cpu_value(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>>;
    fn cpu_vjp(
        &self,
        x: &[&Tensor<T>],
        y: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>>;
}

impl<U: UserOp, T: Scalar> Faces<T> for U {
    fn value(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        UserOp::value(self, x)
    }
    fn vjp(&self, x: &[&Tensor<T>], g: &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>> {
        UserOp::vjp(self, x, g)
    }
    fn jvp(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> Result<Tensor<T>> {
        UserOp::jvp(self, x, dx)
    }
    fn cpu_value(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        UserOp::cpu_value(self, x)
    }
    fn cpu_vjp(
        &self,
        x: &[&Tensor<T>],
        y: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        UserOp::cpu_vjp(self, x, y, g)
    }
}

impl<U: UserOp> Erased for U {
    fn name(&self) -> &'static str {
        UserOp::name(self)
    }
    fn params(&self) -> Vec<(&'static str, Param)> {
        UserOp::params(self)
    }
    fn arity(&self) -> usize {
        UserOp::arity(self)
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape> {
        UserOp::infer_shape(self, shapes)
    }
    fn is_differentiable(&self) -> bool {
        UserOp::is_differentiable(self)
    }
    fn op_type(&self) -> TypeId {
        TypeId::of::<U>()
    }
    fn f64(&self) -> &dyn Faces<f64> {
        self
    }
    fn f32(&self) -> &dyn Faces<f32> {
        self
    }
}

/// A shared handle to a user op, as [`Op::User`](crate::Op::User) holds it: cheap to clone,
/// compared by the op's type, name and parameters, printed as `name(param=value, ...)`.
#[derive(Clone)]
pub struct UserOpRef {
    op: Arc<dyn Erased>,
    extensions: Arc<Vec<(TypeId, Arc<dyn Any + Send + Sync>)>>,
}

impl UserOpRef {
    /// Wrap `op`.
    pub fn new(op: impl UserOp) -> Self {
        UserOpRef {
            op: Arc::new(op),
            extensions: Arc::new(Vec::new()),
        }
    }

    /// This handle with `ext` attached (replacing an extension of the same type): how a
    /// backend's implementation of the op travels with it (e.g. `tl_tape_cuda::user::Device`).
    pub fn with_extension<E: Any + Send + Sync>(mut self, ext: E) -> Self {
        let exts = Arc::make_mut(&mut self.extensions);
        exts.retain(|(t, _)| *t != TypeId::of::<E>());
        exts.push((TypeId::of::<E>(), Arc::new(ext)));
        self
    }

    /// Whether a backend's implementation is attached ([`UserOpRef::with_extension`]): the
    /// harness says so when its build cannot run it (`tl_conformance::user`).
    pub fn has_extensions(&self) -> bool {
        !self.extensions.is_empty()
    }

    /// The extension of type `E`, if one is attached.
    pub fn extension<E: Any + Send + Sync>(&self) -> Option<&E> {
        self.extensions
            .iter()
            .find(|(t, _)| *t == TypeId::of::<E>())
            .and_then(|(_, e)| e.downcast_ref::<E>())
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.op.name()
    }

    /// The op's static parameters.
    pub fn params(&self) -> Vec<(&'static str, Param)> {
        self.op.params()
    }

    /// How many operands the op takes.
    pub fn arity(&self) -> usize {
        self.op.arity()
    }

    /// The op's shape rule.
    pub fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape> {
        self.op.infer_shape(shapes)
    }

    /// Whether gradients flow through the op.
    pub fn is_differentiable(&self) -> bool {
        self.op.is_differentiable()
    }

    /// The reference value at any scalar type.
    pub fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        typed(
            self.name(),
            x,
            |x| self.op.f64().value(x),
            |x| self.op.f32().value(x),
            |x| self.op.f64().value(x),
        )
    }

    /// The reference VJP at any scalar type.
    pub fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        typed_grads(
            self.name(),
            x,
            g,
            |x, g| self.op.f64().vjp(x, g),
            |x, g| self.op.f32().vjp(x, g),
        )
    }

    /// The reference JVP at any scalar type.
    pub fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> Result<Tensor<T>> {
        let mut all: Vec<&Tensor<T>> = x.to_vec();
        all.extend_from_slice(dx);
        let n = x.len();
        typed(
            self.name(),
            &all,
            |a| self.op.f64().jvp(&a[..n], &a[n..]),
            |a| self.op.f32().jvp(&a[..n], &a[n..]),
            |a| self.op.f64().jvp(&a[..n], &a[n..]),
        )
    }

    /// The CPU kernel's forward at any scalar type.
    pub fn cpu_value<T: Scalar>(&self, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
        typed(
            self.name(),
            x,
            |x| self.op.f64().cpu_value(x),
            |x| self.op.f32().cpu_value(x),
            |x| self.op.f64().cpu_value(x),
        )
    }

    /// The CPU kernel's backward at any scalar type; `y` is the forward value.
    pub fn cpu_vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        y: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let mut all: Vec<&Tensor<T>> = x.to_vec();
        all.push(y);
        let n = x.len();
        typed_grads(
            self.name(),
            &all,
            g,
            |a, g| self.op.f64().cpu_vjp(&a[..n], a[n], g),
            |a, g| self.op.f32().cpu_vjp(&a[..n], a[n], g),
        )
    }
}

/// `x` seen as `f64` or `f32` tensors without a copy (another scalar type is converted to `f64`
/// and back, a conversion's buffer checked as [`Tensor::try_cast`]'s, naming `op`), `f` run at
/// that type, its result seen as `T` again.
fn typed<T: Scalar>(
    op: &'static str,
    x: &[&Tensor<T>],
    f64_face: impl FnOnce(&[&Tensor<f64>]) -> Result<Tensor<f64>>,
    f32_face: impl FnOnce(&[&Tensor<f32>]) -> Result<Tensor<f32>>,
    other: impl FnOnce(&[&Tensor<f64>]) -> Result<Tensor<f64>>,
) -> Result<Tensor<T>> {
    if let Some(x) = downcast_all::<T, f64>(x) {
        return recast(op, f64_face(&x)?);
    }
    if let Some(x) = downcast_all::<T, f32>(x) {
        return recast(op, f32_face(&x)?);
    }
    let wide = widen(op, x)?;
    let refs: Vec<&Tensor<f64>> = wide.iter().collect();
    recast(op, other(&refs)?)
}

/// [`typed`] for a VJP (operands and a cotangent in, a list of cotangents out).
fn typed_grads<T: Scalar>(
    op: &'static str,
    x: &[&Tensor<T>],
    g: &Tensor<T>,
    f64_face: impl FnOnce(&[&Tensor<f64>], &Tensor<f64>) -> Result<Vec<Option<Tensor<f64>>>>,
    f32_face: impl FnOnce(&[&Tensor<f32>], &Tensor<f32>) -> Result<Vec<Option<Tensor<f32>>>>,
) -> Result<Vec<Option<Tensor<T>>>> {
    fn recast_all<S: Scalar, T: Scalar>(
        op: &'static str,
        v: Vec<Option<Tensor<S>>>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        v.into_iter()
            .map(|t| t.map(|t| recast(op, t)).transpose())
            .collect()
    }
    if let (Some(x), Some(g)) = (downcast_all::<T, f64>(x), downcast::<T, f64>(g)) {
        return recast_all(op, f64_face(&x, g)?);
    }
    if let (Some(x), Some(g)) = (downcast_all::<T, f32>(x), downcast::<T, f32>(g)) {
        return recast_all(op, f32_face(&x, g)?);
    }
    let wide = widen(op, x)?;
    let refs: Vec<&Tensor<f64>> = wide.iter().collect();
    recast_all(op, f64_face(&refs, &g.try_cast(op)?)?)
}

/// Every operand converted to `f64` (for a scalar type other than `f32` and `f64`).
fn widen<T: Scalar>(op: &'static str, x: &[&Tensor<T>]) -> Result<Vec<Tensor<f64>>> {
    x.iter().map(|t| t.try_cast(op)).collect()
}

/// `t` as a `Tensor<S>` when `T` is `S`.
fn downcast<T: Scalar, S: Scalar>(t: &Tensor<T>) -> Option<&Tensor<S>> {
    (t as &dyn Any).downcast_ref::<Tensor<S>>()
}

/// Every operand as a `Tensor<S>` when `T` is `S`.
fn downcast_all<'a, T: Scalar, S: Scalar>(x: &[&'a Tensor<T>]) -> Option<Vec<&'a Tensor<S>>> {
    x.iter().map(|t| downcast::<T, S>(t)).collect()
}

/// A tensor of `S` as a tensor of `T`: shared (no copy) when the types are the same, converted
/// otherwise (checked as [`Tensor::try_cast`], naming `op`).
fn recast<S: Scalar, T: Scalar>(op: &'static str, t: Tensor<S>) -> Result<Tensor<T>> {
    match downcast::<S, T>(&t) {
        Some(same) => Ok(same.clone()),
        None => t.try_cast(op),
    }
}

impl PartialEq for UserOpRef {
    fn eq(&self, other: &Self) -> bool {
        self.op.op_type() == other.op.op_type()
            && self.name() == other.name()
            && self.params() == other.params()
    }
}

impl fmt::Debug for UserOpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let params = self.params();
        if !params.is_empty() {
            f.write_str("(")?;
            for (k, (name, v)) in params.iter().enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{name}={v}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// `y` when it has the shape the op's shape rule gave (`out`); otherwise an error naming the op
/// and the face (`what`) that returned the wrong shape.
pub fn check_shape<T: Scalar>(
    op: &UserOpRef,
    what: &str,
    y: Tensor<T>,
    out: &Shape,
) -> Result<Tensor<T>> {
    if y.shape() != out {
        return Err(tl_spec::Error::Shape {
            op: op.name(),
            detail: format!(
                "the {what} has shape {}, the shape rule says {out}",
                y.shape()
            ),
        });
    }
    Ok(y)
}

/// `grads` when they are one per operand, each of its operand's shape; otherwise an error
/// naming the op, the face (`what`) and the operand.
pub fn check_grads<T: Scalar>(
    op: &UserOpRef,
    what: &str,
    x: &[&Tensor<T>],
    grads: Vec<Option<Tensor<T>>>,
) -> Result<Vec<Option<Tensor<T>>>> {
    if grads.len() != x.len() {
        return Err(tl_spec::Error::Param {
            op: op.name(),
            detail: format!(
                "the {what} returned {} cotangent(s) for {} operand(s)",
                grads.len(),
                x.len()
            ),
        });
    }
    for (k, (g, x)) in grads.iter().zip(x).enumerate() {
        if let Some(g) = g
            && g.shape() != x.shape()
        {
            return Err(tl_spec::Error::Shape {
                op: op.name(),
                detail: format!(
                    "the {what}'s cotangent of operand {k} has shape {}, the operand {}",
                    g.shape(),
                    x.shape()
                ),
            });
        }
    }
    Ok(grads)
}
