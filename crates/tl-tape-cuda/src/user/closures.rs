//! The seeds' generic constructors: TorchLean's CUDA `Tape.unary` / `Tape.binary` as user ops
//! built from closures over device buffers.

use tl_ir::{UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};

use super::{DeviceImpl, with_device};
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Result, SimDevice};

/// A unary device forward: operand buffer → fresh output buffer.
pub type UnaryForward = dyn Fn(&mut dyn Device, Buffer) -> Result<Buffer> + Send + Sync;
/// A unary device backward (VJP): operand and output cotangent → operand cotangent.
pub type UnaryBackward = dyn Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync;
/// A binary device forward: operands → fresh output buffer.
pub type BinaryForward = dyn Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync;
/// A binary device backward (VJP): operands and output cotangent → both cotangents.
pub type BinaryBackward =
    dyn Fn(&mut dyn Device, Buffer, Buffer, Buffer) -> Result<(Buffer, Buffer)> + Send + Sync;

/// The op TorchLean's `Tape.unary` / `Tape.binary` build: explicit operand and output shapes,
/// checked dynamically, and device closures.
struct ClosureOp {
    name: &'static str,
    inputs: Vec<Shape>,
    output: Shape,
    imp: DeviceImpl,
}

impl ClosureOp {
    /// The closures run on a fresh simulation device over `x` (as f32).
    fn on_sim<T: Scalar, R>(
        &self,
        x: &[&Tensor<T>],
        f: impl FnOnce(&mut SimDevice, &[&AnyBuffer]) -> Result<R>,
    ) -> tl_spec::Result<R> {
        let mut dev = SimDevice::new();
        let run = |dev: &mut SimDevice| -> Result<R> {
            let bufs: Vec<AnyBuffer> = x
                .iter()
                .map(|t| AnyBuffer::upload(dev, *t))
                .collect::<Result<_>>()?;
            let refs: Vec<&AnyBuffer> = bufs.iter().collect();
            f(dev, &refs)
        };
        run(&mut dev).map_err(|e| tl_spec::Error::param(self.name, e.to_string()))
    }
}

impl UserOp for ClosureOp {
    fn name(&self) -> &'static str {
        self.name
    }
    fn arity(&self) -> usize {
        self.inputs.len()
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> tl_spec::Result<Shape> {
        for (k, (got, want)) in shapes.iter().zip(&self.inputs).enumerate() {
            if *got != want {
                return Err(tl_spec::Error::shape(
                    self.name,
                    format!("operand {k} has shape {got}, the op was declared for {want}"),
                ));
            }
        }
        Ok(self.output.clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        self.on_sim(x, |dev, b| {
            let y = (self.imp.forward)(dev, b, &self.output)?;
            let y = AnyBuffer::new(self.name, self.output.clone(), y)?;
            y.download::<T, _>(dev)
        })
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let mut all: Vec<&Tensor<T>> = x.to_vec();
        all.push(g);
        let n = x.len();
        self.on_sim(&all, |dev, b| {
            let y = (self.imp.forward)(dev, &b[..n], &self.output)?;
            let y = AnyBuffer::new(self.name, self.output.clone(), y)?;
            let needs = vec![true; n];
            let grads = (self.imp.backward)(dev, &b[..n], &y, b[n], &needs)?;
            grads
                .into_iter()
                .zip(x)
                .map(|(d, x)| {
                    d.map(|d| AnyBuffer::new(self.name, x.shape().clone(), d)?.download(dev))
                        .transpose()
                })
                .collect()
        })
    }
    fn jvp<T: Scalar>(&self, _x: &[&Tensor<T>], _dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Err(tl_spec::Error::param(
            self.name,
            "an op built from device closures (`unary`/`binary`) has no JVP; \
             implement tl_ir::UserOp for forward mode",
        ))
    }
}

/// The op of TorchLean's `Tape.unary`: `name`, operand shape `sigma` and output shape `tau`
/// (checked dynamically), `forward` on the operand buffer, `backward` (the VJP) on the operand
/// and the output cotangent.
pub fn unary_op(
    name: &'static str,
    sigma: Shape,
    tau: Shape,
    forward: impl Fn(&mut dyn Device, Buffer) -> Result<Buffer> + Send + Sync + 'static,
    backward: impl Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync + 'static,
) -> UserOpRef {
    let imp = DeviceImpl::new(
        move |dev, x, _| forward(dev, x[0].buffer()),
        move |dev, x, _, g, needs| {
            let dx = match needs.first() {
                Some(false) => None,
                _ => Some(backward(dev, x[0].buffer(), g.buffer())?),
            };
            Ok(vec![dx])
        },
    );
    closure_op(name, vec![sigma], tau, imp)
}

/// The op of TorchLean's `Tape.binary`: operand shapes `sigma1`, `sigma2`, output shape `tau`,
/// `forward` on the two operand buffers, `backward` on the operands and the output cotangent
/// giving both cotangents.
pub fn binary_op(
    name: &'static str,
    (sigma1, sigma2): (Shape, Shape),
    tau: Shape,
    forward: impl Fn(&mut dyn Device, Buffer, Buffer) -> Result<Buffer> + Send + Sync + 'static,
    backward: impl Fn(&mut dyn Device, Buffer, Buffer, Buffer) -> Result<(Buffer, Buffer)>
    + Send
    + Sync
    + 'static,
) -> UserOpRef {
    let imp = DeviceImpl::new(
        move |dev, x, _| forward(dev, x[0].buffer(), x[1].buffer()),
        move |dev, x, _, g, needs| {
            if !needs.iter().any(|&n| n) {
                return Ok(vec![None, None]);
            }
            let (da, db) = backward(dev, x[0].buffer(), x[1].buffer(), g.buffer())?;
            let keep = |k: usize, b: Buffer, dev: &mut dyn Device| {
                if needs.get(k).copied().unwrap_or(true) {
                    Some(b)
                } else {
                    dev.release(b);
                    None
                }
            };
            let da = keep(0, da, dev);
            let db = keep(1, db, dev);
            Ok(vec![da, db])
        },
    );
    closure_op(name, vec![sigma1, sigma2], tau, imp)
}

fn closure_op(name: &'static str, inputs: Vec<Shape>, output: Shape, imp: DeviceImpl) -> UserOpRef {
    let op = ClosureOp {
        name,
        inputs,
        output,
        imp: imp.clone(),
    };
    with_device(UserOpRef::new(op), imp)
}
