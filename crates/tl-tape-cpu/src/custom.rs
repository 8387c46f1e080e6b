//! User-defined ops: TorchLean's generic `unary`/`binary` constructors as a trait object.

use std::sync::Arc;

use tl_spec::{Scalar, Shape, Tensor};

use crate::Result;

/// A user-defined op with its own forward and VJP. The tape checks the declared output shape and
/// the shapes of returned gradients, so a buggy custom op is caught at the op, not downstream.
pub trait CustomOp<T: Scalar>: Send + Sync {
    /// Name used in errors and printing.
    fn name(&self) -> &str;
    /// Output shape for the operand shapes (or an error).
    fn infer_shape(&self, shapes: &[&Shape]) -> Result<Shape>;
    /// Forward value.
    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<Tensor<T>>;
    /// VJP: one cotangent per operand (`None` for no gradient), given the output and its cotangent.
    fn backward(
        &self,
        inputs: &[&Tensor<T>],
        output: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>>;
}

type Fwd<T> = dyn Fn(&[&Tensor<T>]) -> Result<Tensor<T>> + Send + Sync;
type Bwd<T> = dyn Fn(&[&Tensor<T>], &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>> + Send + Sync;

/// A custom op from two closures and a fixed output shape (the seeds' `unary`/`binary`).
pub struct ClosureOp<T: Scalar> {
    name: String,
    out_shape: Shape,
    forward: Arc<Fwd<T>>,
    backward: Arc<Bwd<T>>,
}

impl<T: Scalar> ClosureOp<T> {
    /// An op named `name` with output shape `out_shape`; `backward(inputs, g)` returns the
    /// operand cotangents.
    pub fn new(
        name: impl Into<String>,
        out_shape: Shape,
        forward: impl Fn(&[&Tensor<T>]) -> Result<Tensor<T>> + Send + Sync + 'static,
        backward: impl Fn(&[&Tensor<T>], &Tensor<T>) -> Result<Vec<Option<Tensor<T>>>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        ClosureOp {
            name: name.into(),
            out_shape,
            forward: Arc::new(forward),
            backward: Arc::new(backward),
        }
    }
}

impl<T: Scalar> CustomOp<T> for ClosureOp<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn infer_shape(&self, _shapes: &[&Shape]) -> Result<Shape> {
        Ok(self.out_shape.clone())
    }
    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<Tensor<T>> {
        (self.forward)(inputs)
    }
    fn backward(
        &self,
        inputs: &[&Tensor<T>],
        _output: &Tensor<T>,
        g: &Tensor<T>,
    ) -> Result<Vec<Option<Tensor<T>>>> {
        (self.backward)(inputs, g)
    }
}
