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
//! [`DeviceImpl::kernels`] written by hand.
//!
//! Only a device whose [`Device::user_kernels`] is `Some` launches them: `CudaDevice`, on the
//! GPU or on the emulator. Everywhere else (the [`SimDevice`]) the op runs its *sim twin*: the
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
//! VJP are its device closures run on a [`SimDevice`] (f32), and it has no JVP.

use std::ffi::c_void;
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
///
/// One built with [`DeviceImpl::new`] runs on every device; one built with
/// [`DeviceImpl::kernels`] (or [`ElementwiseKernels`]) launches the user's kernels, so it runs
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
    /// A device implementation that launches the user's kernels ([`launch`]): the same
    /// arguments as [`DeviceImpl::new`]. On a device without [`Device::user_kernels`] the op
    /// runs its sim twin instead ([`with_sim_twin`](Self::with_sim_twin); by default its
    /// reference in `f32` on the host).
    pub fn kernels(
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
            launches_kernels: true,
            ..DeviceImpl::new(forward, backward)
        }
    }

    /// This implementation with `twin` run on devices that cannot launch user kernels (a
    /// composition of [`Device`] primitives with the kernels' arithmetic, say) instead of the
    /// op's reference on the host.
    pub fn with_sim_twin(mut self, twin: DeviceImpl) -> Self {
        self.twin = Some(Arc::new(twin));
        self
    }

    /// Whether this implementation launches user kernels ([`DeviceImpl::kernels`]).
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

// ---------------------------------------------------------------------------------------------
// the user's own kernels

/// The C signature of an emulator kernel table, `const TlEmuKernel* table(size_t* n)`, as
/// `tl_cuda_build::Emulator` generates it.
pub type EmuTableFn = unsafe extern "C" fn(*mut usize) -> *const c_void;

/// A user library's kernel table for the kernel emulator: what
/// [`emu_kernels!`](crate::emu_kernels) names. The emulator registers it at the first launch
/// of one of its kernels.
#[derive(Clone, Copy)]
pub struct EmuKernels {
    pub(crate) lib: &'static str,
    #[cfg_attr(not(feature = "cuda-emu"), allow(dead_code))]
    pub(crate) table: EmuTableFn,
}

impl EmuKernels {
    /// The library's name (as given to `tl_cuda_build::Emulator::new`).
    pub fn lib(&self) -> &'static str {
        self.lib
    }
}

impl std::fmt::Debug for EmuKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmuKernels({})", self.lib)
    }
}

/// The kernel table of the emulator library `lib` (built by `tl_cuda_build::Emulator::new("lib")`
/// in the calling crate's `build.rs`), as `Option<`[`EmuKernels`]`>`: `Some` where **the calling
/// crate's** feature `cuda-emu` is on (it must forward to `tl-tape-cuda/cuda-emu`, and its
/// `build.rs` must compile the library under that feature), `None` otherwise. No `unsafe` in
/// the calling crate: the declaration of the table's C symbol is in this macro.
///
/// ```ignore
/// // build.rs: tl_cuda_build::Emulator::new("my_kernels").kernels(&set)?.compile()?;
/// let module = KernelModule::new("my_kernels")
///     .ptx(include_str!("my_kernels.ptx"))
///     .emu(tl_tape_cuda::emu_kernels!(my_kernels)); // the C symbol `tl_emu_table_my_kernels`
/// ```
///
/// (Not run here: the symbol exists only in a crate whose build.rs built the library.)
#[macro_export]
macro_rules! emu_kernels {
    ($lib:ident) => {{
        #[cfg(feature = "cuda-emu")]
        let table = {
            unsafe extern "C" {
                #[link_name = concat!("tl_emu_table_", stringify!($lib))]
                fn table(n: *mut usize) -> *const ::core::ffi::c_void;
            }
            // SAFETY: `tl_emu_table_<lib>` is the table function that tl_cuda_build's
            // Emulator::compile generated for library `lib` (the declaration above is its C
            // signature), linked into the calling crate by its build.rs.
            ::core::option::Option::Some(unsafe {
                $crate::user::EmuKernels::from_table(stringify!($lib), table)
            })
        };
        #[cfg(not(feature = "cuda-emu"))]
        let table: ::core::option::Option<$crate::user::EmuKernels> = ::core::option::Option::None;
        table
    }};
}

/// A user's `.cu` file in its compiled forms: the PTX (for a real GPU) and the emulator build
/// (for `cuda-emu`). Either may be absent; launching where the running driver's form is
/// absent is an error naming the module and the kernel.
#[derive(Debug, Clone)]
pub struct KernelModule {
    name: &'static str,
    ptx: Option<&'static str>,
    emu: Option<EmuKernels>,
}

impl KernelModule {
    /// A module named `name` (in errors) with no compiled form yet.
    pub fn new(name: &'static str) -> Self {
        KernelModule {
            name,
            ptx: None,
            emu: None,
        }
    }

    /// Its PTX (`include_str!` of the committed file: nvcc 13.0, PTX ISA ≤ 9.0, checked by
    /// `tl_cuda_build::Kernels::check`), loaded by the driver at the first launch on a GPU.
    pub fn ptx(mut self, ptx: &'static str) -> Self {
        self.ptx = Some(ptx);
        self
    }

    /// Its emulator build ([`emu_kernels!`](crate::emu_kernels)); `None` leaves it without one.
    pub fn emu(mut self, emu: Option<EmuKernels>) -> Self {
        self.emu = emu;
        self
    }

    /// The module's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its PTX, if given.
    pub fn ptx_text(&self) -> Option<&'static str> {
        self.ptx
    }

    /// Its emulator table, if given.
    pub fn emu_table(&self) -> Option<EmuKernels> {
        self.emu
    }
}

/// One argument of a user kernel launch, in the kernel's parameter order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// An input buffer (`const float*`).
    In(Buffer),
    /// The `k`-th output of the launch (`float*`): a fresh buffer of the length
    /// [`launch`]'s `outs[k]` gives.
    Out(usize),
    /// `unsigned long long` (lengths).
    U64(u64),
    /// `unsigned int`.
    U32(u32),
    /// `float` (the op's parameters).
    F32(f32),
}

/// How many threads a user kernel launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchShape {
    /// A 1-D grid-stride launch over `n` elements, as the project's kernels: blocks of 256
    /// threads, `clamp(⌈n/256⌉, 1, 65535)` of them; nothing is launched for `n = 0`.
    GridStride(usize),
    /// `grid` blocks (x, y, z) of `block` threads.
    Grid {
        /// Blocks along x, y, z.
        grid: [u32; 3],
        /// Threads per block (1 to 1024).
        block: u32,
    },
}

/// A device that launches the user's own kernels: `CudaDevice`, on a GPU (the module's PTX)
/// or on the kernel emulator (its emulator build). Reached through [`Device::user_kernels`].
pub trait KernelDevice {
    /// Allocate one fresh buffer per entry of `outs` (its length), launch `kernel` of `module`
    /// with `args` (where [`KernelArg::Out`]`(k)` is the `k`-th of those buffers) and `shape`,
    /// and return the outputs. Any error (an input released, no compiled form for this driver,
    /// no such kernel, arguments the kernel does not take, a failed launch) names `op`, the
    /// kernel and the module, and releases the outputs.
    fn launch_user(
        &mut self,
        op: &'static str,
        module: &KernelModule,
        kernel: &'static str,
        shape: LaunchShape,
        args: &[KernelArg],
        outs: &[usize],
    ) -> Result<Vec<Buffer>>;
}

/// [`KernelDevice::launch_user`] on `dev`, or an error naming `op` and `kernel` where `dev`
/// launches no user kernels (the simulation device: a [`DeviceImpl::kernels`] never calls this
/// there, the op's sim twin runs instead).
pub fn launch(
    dev: &mut dyn Device,
    op: &'static str,
    module: &KernelModule,
    kernel: &'static str,
    shape: LaunchShape,
    args: &[KernelArg],
    outs: &[usize],
) -> Result<Vec<Buffer>> {
    let name = dev.name();
    match dev.user_kernels() {
        Some(k) => k.launch_user(op, module, kernel, shape, args, outs),
        None => Err(Error::kernel(
            op,
            format!(
                "kernel {kernel} of module {}: the {name} device launches no user kernels \
                 (the op's sim twin runs there)",
                module.name
            ),
        )),
    }
}

/// An elementwise user op's forward and backward kernels, launched over the output's `n`
/// elements (1-D grid stride, [`LaunchShape::GridStride`]), every operand of `n` elements:
///
/// - forward `fwd(const float* x_0, …, const float* x_{k−1}, float* y, u64 n, float p…)`;
/// - backward `bwd(const float* x_0, …, const float* x_{k−1}, const float* g, float* dx_0, …,
///   float* dx_{k−1}, u64 n, float p…)`, every operand's cotangent written;
///
/// where `p…` are the [`param`](Self::param)s in order. The exact-erf GELU of
/// crates/tl-nn/examples/custom_op is one.
#[derive(Debug, Clone)]
pub struct ElementwiseKernels {
    module: KernelModule,
    forward: &'static str,
    backward: &'static str,
    params: Vec<f32>,
}

impl ElementwiseKernels {
    /// The kernels `forward` and `backward` of `module`, with no parameters.
    pub fn new(module: KernelModule, forward: &'static str, backward: &'static str) -> Self {
        ElementwiseKernels {
            module,
            forward,
            backward,
            params: Vec::new(),
        }
    }

    /// Append an `f32` parameter, passed after `n` to both kernels.
    pub fn param(mut self, p: f32) -> Self {
        self.params.push(p);
        self
    }

    /// Operand lengths all equal to `n`, else an error naming the kernel.
    fn check_lens(&self, kernel: &'static str, x: &[&AnyBuffer], n: usize) -> Result<()> {
        for (k, b) in x.iter().enumerate() {
            if b.buffer().len() != n {
                return Err(Error::kernel(
                    kernel,
                    format!(
                        "module {}: operand {k} has {} elements, the elementwise launch covers \
                         the output's {n}",
                        self.module.name,
                        b.buffer().len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The device implementation (a [`DeviceImpl::kernels`]: the sim twin runs where the
    /// device launches no user kernels).
    pub fn device_impl(self) -> DeviceImpl {
        let me = Arc::new(self);
        let fwd = Arc::clone(&me);
        DeviceImpl::kernels(
            move |dev, x, shape| {
                let k = &*fwd;
                let n = shape.numel();
                k.check_lens(k.forward, x, n)?;
                let mut args: Vec<KernelArg> =
                    x.iter().map(|b| KernelArg::In(b.buffer())).collect();
                args.push(KernelArg::Out(0));
                args.push(KernelArg::U64(n as u64));
                args.extend(k.params.iter().map(|&p| KernelArg::F32(p)));
                let out = launch(
                    dev,
                    k.forward,
                    &k.module,
                    k.forward,
                    LaunchShape::GridStride(n),
                    &args,
                    &[n],
                )?;
                Ok(out[0])
            },
            move |dev, x, y, g, needs| {
                let k = &*me;
                let n = y.buffer().len();
                k.check_lens(k.backward, x, n)?;
                k.check_lens(k.backward, &[g], n)?;
                if !needs.iter().any(|&w| w) {
                    return Ok(vec![None; x.len()]);
                }
                let mut args: Vec<KernelArg> =
                    x.iter().map(|b| KernelArg::In(b.buffer())).collect();
                args.push(KernelArg::In(g.buffer()));
                args.extend((0..x.len()).map(KernelArg::Out));
                args.push(KernelArg::U64(n as u64));
                args.extend(k.params.iter().map(|&p| KernelArg::F32(p)));
                let outs = vec![n; x.len()];
                let dx = launch(
                    dev,
                    k.backward,
                    &k.module,
                    k.backward,
                    LaunchShape::GridStride(n),
                    &args,
                    &outs,
                )?;
                let mut grads = Vec::with_capacity(dx.len());
                for (i, b) in dx.into_iter().enumerate() {
                    if needs.get(i).copied().unwrap_or(true) {
                        grads.push(Some(b));
                    } else {
                        dev.release(b);
                        grads.push(None);
                    }
                }
                Ok(grads)
            },
        )
    }
}
