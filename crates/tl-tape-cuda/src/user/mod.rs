//! User ops on the CUDA tape ([`tl_ir::UserOp`], held by [`Op::User`]).
//!
//! A user op runs on the device in one of two ways:
//! - **its device implementation** ([`DeviceImpl`]), attached to its handle with
//!   [`UserOpRef::with_extension`] (or [`with_device`]): a forward and a backward over device
//!   buffers, composed from the [`Device`] primitives (TorchLean's CUDA `Tape.unary` /
//!   `Tape.binary`: closures over buffers) or launching the user's own kernels
//!   ([`ElementwiseKernels`], [`launch`]; below);
//! - without one, **its reference in `f32` on the host**: the operands are downloaded, the op's
//!   reference value (or VJP) runs, and the result is uploaded. Correct everywhere, counted in
//!   [`crate::Traffic`] like any copy, and slow on a real GPU.
//!
//! What a device implementation returns is checked before the tape takes it: one buffer of the
//! output's length from the forward, one buffer of its operand's length for each operand the
//! backward was asked for. A wrong length is an error naming the op and the operand, and every
//! buffer it returned is released, so the tape stays usable.
//!
//! # The user's own kernels
//!
//! A [`KernelModule`] is a user's `.cu` file in its compiled forms: its PTX (committed,
//! embedded with `include_str!`, loaded by the driver on a real GPU) and its build for the
//! kernel emulator (a static library from `tl_cuda_build::Emulator`, named with
//! [`emu_kernels!`](crate::emu_kernels)). [`ElementwiseKernels`] turns a forward and a backward
//! kernel of the module into a [`DeviceImpl`] (1-D grid-stride launches over the output's
//! length); [`launch`] runs any kernel of it with explicit arguments and launch shape, for a
//! [`DeviceImpl::launching_kernels`] written by hand.
//!
//! Only a device whose [`Device::user_kernels`] is `Some` launches them: `CudaDevice`, on the
//! GPU or on the emulator. Everywhere else (the [`SimDevice`](crate::SimDevice)) the op runs its *sim twin*: the
//! [`DeviceImpl::with_sim_twin`] given, by default its reference in `f32` on the host.
//!
//! ```
//! use tl_tape_cuda::user::{ElementwiseKernels, KernelModule};
//!
//! // y = c·x: `scale_fwd(const float* x, float* y, u64 n, float c)`,
//! // `scale_bwd(const float* x, const float* g, float* dx, u64 n, float c)`.
//! let module = KernelModule::new("my_scale")
//!     // .ptx(include_str!("my_scale.ptx"))          // the GPU: the committed PTX
//!     // .emu(tl_tape_cuda::emu_kernels!(my_scale))  // the emulator (feature `cuda-emu`)
//!     ;
//! let imp = ElementwiseKernels::new(module, "scale_fwd", "scale_bwd")
//!     .param(2.0)
//!     .device_impl();
//! assert!(imp.launches_kernels());
//! // tl_tape_cuda::user::with_device(UserOpRef::new(MyScale), imp) attaches it to the op.
//! ```
//!
//! [`CudaTape::unary`](crate::CudaTape::unary) and [`CudaTape::binary`](crate::CudaTape::binary)
//! are the seeds' generic constructors; [`unary_op`] and [`binary_op`] build the same ops as
//! handles, for the sessions and the IR. Such an op has no reference of its own: its value and
//! VJP are its device closures run on a [`SimDevice`](crate::SimDevice) (f32), and it has no JVP.

mod closures;
mod kernels;

use std::sync::Arc;

use tl_ir::{Op, UserOpRef};
use tl_spec::{Shape, Tensor};

use crate::device::{Buffer, Device};
use crate::ops::{Cotangent, Forward, Grads, wrap};
use crate::{AnyBuffer, Error, Result};

pub use closures::{
    BinaryBackward, BinaryForward, UnaryBackward, UnaryForward, binary_op, unary_op,
};
pub use kernels::{
    ElementwiseKernels, EmuKernels, EmuTableFn, KernelArg, KernelDevice, KernelModule, LaunchShape,
    launch,
};

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
///
/// One built with [`DeviceImpl::new`] runs on every device; one built with
/// [`DeviceImpl::launching_kernels`] (or [`ElementwiseKernels`]) launches the user's kernels, so it runs
/// only where [`Device::user_kernels`] is `Some`, and elsewhere the op runs its sim twin.
#[derive(Clone)]
pub struct DeviceImpl {
    forward: Arc<ForwardFn>,
    backward: Arc<BackwardFn>,
    /// Whether the closures launch user kernels (then they need [`Device::user_kernels`]).
    launches_kernels: bool,
    /// What runs where the kernels cannot (`None`: the op's reference in f32 on the host).
    twin: Option<Arc<DeviceImpl>>,
}

impl DeviceImpl {
    /// This implementation marked as launching the user's kernels ([`launch`]): on a device
    /// without [`Device::user_kernels`] the op runs its sim twin instead
    /// ([`with_sim_twin`](Self::with_sim_twin); by default its reference in `f32` on the host).
    pub fn launching_kernels(mut self) -> Self {
        self.launches_kernels = true;
        self
    }

    /// This implementation with `twin` run on devices that cannot launch user kernels (a
    /// composition of [`Device`] primitives with the kernels' arithmetic, say) instead of the
    /// op's reference on the host.
    pub fn with_sim_twin(mut self, twin: DeviceImpl) -> Self {
        self.twin = Some(Arc::new(twin));
        self
    }

    /// Whether this implementation launches user kernels ([`DeviceImpl::launching_kernels`]).
    pub fn launches_kernels(&self) -> bool {
        self.launches_kernels
    }

    /// What runs on `dev`: this implementation, its sim twin, or (`None`) the op's reference.
    fn on<D: Device + ?Sized>(&self, dev: &mut D) -> Option<&DeviceImpl> {
        if !self.launches_kernels || dev.user_kernels().is_some() {
            Some(self)
        } else {
            self.twin.as_deref().and_then(|t| t.on(dev))
        }
    }

    /// A device implementation from its forward and backward (compositions of [`Device`]
    /// primitives: it runs on every device).
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
            launches_kernels: false,
            twin: None,
        }
    }
}

impl std::fmt::Debug for DeviceImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceImpl")
            .field("launches_kernels", &self.launches_kernels)
            .field("twin", &self.twin)
            .finish_non_exhaustive()
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
    let imp = u.extension::<DeviceImpl>().and_then(|i| i.on(dev));
    let value = match imp {
        Some(imp) => {
            let b = (imp.forward)(dev, x, shape).map_err(|e| named(u, "device forward", e))?;
            if let Some(k) = x.iter().position(|a| a.buffer() == b) {
                // Not released: it is the operand's.
                return Err(named(
                    u,
                    "device forward",
                    Error::kernel(
                        u.name(),
                        format!("returned operand {k}'s buffer, not a fresh one"),
                    ),
                ));
            }
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
    let imp = u.extension::<DeviceImpl>().and_then(|i| i.on(dev));
    let grads: Vec<Option<Buffer>> = match imp {
        Some(imp) => {
            (imp.backward)(dev, x, y, g, needs).map_err(|e| named(u, "device backward", e))?
        }
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
    // Every cotangent must be a fresh buffer of its own: the tape releases them.
    let taken: Vec<Buffer> = x
        .iter()
        .map(|a| a.buffer())
        .chain([y.buffer(), g.buffer()])
        .collect();
    let returned: Vec<Buffer> = grads.iter().flatten().copied().collect();
    let reused = returned
        .iter()
        .enumerate()
        .find(|&(i, b)| taken.contains(b) || returned[..i].contains(b));
    if let Some((_, &b)) = reused {
        let fresh = returned
            .iter()
            .enumerate()
            .filter(|&(i, b)| !taken.contains(b) && !returned[..i].contains(b))
            .map(|(_, &b)| b);
        dev.release_all(fresh.collect::<Vec<_>>());
        let what = if taken.contains(&b) {
            "an operand's, the output's or the cotangent's buffer"
        } else {
            "the same buffer twice"
        };
        return Err(named(
            u,
            "device backward",
            Error::kernel(
                u.name(),
                format!("returned {what} as a cotangent, not a fresh one"),
            ),
        ));
    }
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
