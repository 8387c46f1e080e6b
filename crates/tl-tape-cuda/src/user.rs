//! User ops on the CUDA tape ([`tl_ir::UserOp`], held by [`Op::User`]).
//!
//! A user op runs on the device in one of two ways:
//! - **its device implementation** ([`DeviceImpl`]), attached to its handle with
//!   [`UserOpRef::with_extension`] (or [`with_device`]): a forward and a backward over device
//!   buffers, composed from the [`Device`] primitives (TorchLean's CUDA `Tape.unary` /
//!   `Tape.binary`: closures over buffers) or launching the user's own kernels;
//! - without one, **its reference in `f32` on the host**: the operands are downloaded, the op's
//!   reference value (or VJP) runs, and the result is uploaded. Correct everywhere, counted in
//!   [`crate::Traffic`] like any copy, and slow on a real GPU.
//!
//! What a device implementation returns is checked before the tape takes it: one buffer of the
//! output's length from the forward, one buffer of its operand's length for each operand the
//! backward was asked for. A wrong length is an error naming the op and the operand, and every
//! buffer it returned is released, so the tape stays usable.
//!
//! [`CudaTape::unary`](crate::CudaTape::unary) and [`CudaTape::binary`](crate::CudaTape::binary)
//! are the seeds' generic constructors; [`unary_op`] and [`binary_op`] build the same ops as
//! handles, for the sessions and the IR. Such an op has no reference of its own: its value and
//! VJP are its device closures run on a [`SimDevice`] (f32), and it has no JVP.

use std::sync::Arc;

use tl_ir::{Op, UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};

use crate::device::{Buffer, Device};
use crate::ops::{Cotangent, Forward, Grads, wrap};
use crate::{AnyBuffer, Error, Result, SimDevice};

/// A device forward: the operands (with their shapes) and the output shape give a fresh buffer
/// of the output's length.
pub type ForwardFn =
    dyn Fn(&mut dyn Device, &[&AnyBuffer], &Shape) -> Result<Buffer> + Send + Sync + 'static;

/// A device backward: the operands, the output, its cotangent, and which operands need a
/// cotangent give one entry per operand (`None` for those not needed or not differentiable),
/// each a fresh buffer of its operand's length.
pub type BackwardFn = dyn Fn(
        &mut dyn Device,
        &[&AnyBuffer],
        &AnyBuffer,
        &AnyBuffer,
        &[bool],
    ) -> Result<Vec<Option<Buffer>>>
    + Send
    + Sync
    + 'static;

/// A user op's device implementation: its forward and backward over device buffers. Attach it
/// with [`with_device`] (or `UserOpRef::with_extension`).
#[derive(Clone)]
pub struct DeviceImpl {
    forward: Arc<ForwardFn>,
    backward: Arc<BackwardFn>,
}

impl DeviceImpl {
    /// A device implementation from its forward and backward.
    pub fn new(
        forward: impl Fn(&mut dyn Device, &[&AnyBuffer], &Shape) -> Result<Buffer>
        + Send
        + Sync
        + 'static,
        backward: impl Fn(
            &mut dyn Device,
            &[&AnyBuffer],
            &AnyBuffer,
            &AnyBuffer,
            &[bool],
        ) -> Result<Vec<Option<Buffer>>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        DeviceImpl {
            forward: Arc::new(forward),
            backward: Arc::new(backward),
        }
    }
}

impl std::fmt::Debug for DeviceImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceImpl")
    }
}

/// `op` with the device implementation `imp` attached.
pub fn with_device(op: UserOpRef, imp: DeviceImpl) -> UserOpRef {
    op.with_extension(imp)
}

/// The forward of the user op `op` (`Op::User`) on `x`, whose output shape is `shape`.
pub fn forward<D: Device>(
    dev: &mut D,
    op: &Op,
    u: &UserOpRef,
    x: &[&AnyBuffer],
    shape: &Shape,
) -> Result<Forward> {
    let value = match u.extension::<DeviceImpl>() {
        Some(imp) => {
            let b = (imp.forward)(dev, x, shape)?;
            wrap(dev, op, shape, b).map_err(|e| named(u, "device forward's value", e))?
        }
        None => {
            let host = download_all(dev, x)?;
            let refs: Vec<&Tensor<f32>> = host.iter().collect();
            let y = u.value(&refs)?;
            let y = tl_ir::user::check_shape(u, "reference value", y, shape)?;
            AnyBuffer::upload(dev, &y)?
        }
    };
    Ok(Forward {
        value,
        owned: true,
        workspace: Vec::new(),
    })
}

/// The operand cotangents of the user op `u` at `x` (output `y`, cotangent `g`), computed only
/// where `needs` says so; pushed into `out`, one entry per operand.
pub(crate) fn backward<D: Device>(
    dev: &mut D,
    u: &UserOpRef,
    x: &[&AnyBuffer],
    y: &AnyBuffer,
    g: &AnyBuffer,
    needs: &[bool],
    out: &mut Grads,
) -> Result<()> {
    let grads: Vec<Option<Buffer>> = match u.extension::<DeviceImpl>() {
        Some(imp) => (imp.backward)(dev, x, y, g, needs)?,
        None => {
            let host = download_all(dev, x)?;
            let refs: Vec<&Tensor<f32>> = host.iter().collect();
            let g = g.download::<f32, _>(dev)?;
            let grads = u.vjp(&refs, &g)?;
            let grads = tl_ir::user::check_grads(u, "reference VJP", &refs, grads)?;
            let mut up = Vec::with_capacity(grads.len());
            for (k, c) in grads.into_iter().enumerate() {
                let b = match c {
                    Some(c) if needs.get(k).copied().unwrap_or(true) => {
                        match AnyBuffer::upload(dev, &c) {
                            Ok(b) => Some(b.buffer()),
                            Err(e) => {
                                dev.release_all(up.into_iter().flatten());
                                return Err(e);
                            }
                        }
                    }
                    _ => None,
                };
                up.push(b);
            }
            up
        }
    };
    if grads.len() != x.len() {
        let n = grads.len();
        dev.release_all(grads.into_iter().flatten());
        return Err(Error::Count {
            what: format!("{}: device backward's cotangents", u.name()),
            expected: x.len(),
            got: n,
        });
    }
    let mut checked: Vec<Option<AnyBuffer>> = Vec::with_capacity(grads.len());
    for (k, b) in grads.iter().enumerate() {
        let Some(b) = *b else {
            checked.push(None);
            continue;
        };
        let want = needs.get(k).copied().unwrap_or(true);
        let fits = AnyBuffer::new(u.name(), x[k].shape().clone(), b);
        match fits {
            Ok(a) if want => checked.push(Some(a)),
            // A cotangent nobody asked for is dropped at once.
            Ok(a) => {
                a.release(dev);
                checked.push(None);
            }
            Err(e) => {
                dev.release_all(grads.iter().flatten().copied());
                return Err(named(u, &format!("device backward's cotangent {k}"), e));
            }
        }
    }
    out.extend(checked.into_iter().map(|c| c.map(Cotangent::Owned)));
    Ok(())
}

/// `e` with the op and the face that caused it named.
fn named(u: &UserOpRef, what: &str, e: Error) -> Error {
    Error::kernel(u.name(), format!("{what}: {e}"))
}

/// Every operand as a host `f32` tensor.
fn download_all<D: Device + ?Sized>(dev: &D, x: &[&AnyBuffer]) -> Result<Vec<Tensor<f32>>> {
    x.iter().map(|b| b.download::<f32, _>(dev)).collect()
}

// ---------------------------------------------------------------------------------------------
// the seeds' generic constructors

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
