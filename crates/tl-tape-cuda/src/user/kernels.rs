//! The user's own kernels: a `.cu` file in its compiled forms ([`KernelModule`]), launched on
//! a device that can ([`KernelDevice`], [`launch`]), and a forward/backward pair of element-wise
//! kernels as a [`DeviceImpl`](super::DeviceImpl) ([`ElementwiseKernels`]).

use std::ffi::c_void;
use std::sync::Arc;

use super::DeviceImpl;
use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Error, Result};

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
    /// `int` (a signed value: an offset, a shift, a diagonal).
    I32(i32),
    /// `float` (the op's parameters).
    F32(f32),
    /// `double`.
    F64(f64),
}

/// How many threads a user kernel launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchShape {
    /// A 1-D grid-stride launch over `n` elements, as the project's kernels: blocks of 256
    /// threads, `clamp(⌈n/256⌉, 1, 65535)` of them; nothing is launched for `n = 0`.
    GridStride(usize),
    /// `grid` blocks (x, y, z) of `block` threads (x, y, z), each with `shared` bytes of
    /// dynamic shared memory (CUDA's `<<<grid, block, shared>>>`; 0 for none). Thread
    /// `threadIdx = (x, y, z)` of a block is its thread `x + bx·(y + by·z)` and warps are runs
    /// of 32 of those, as on a GPU. A shape outside CUDA's limits ([`LaunchShape::check`]) is
    /// refused before anything is allocated. The kernel declares it with
    /// `TL_DYNAMIC_SHARED(float, name)` (docs/cuda.md, "Your own kernels": the emulator's
    /// `cuda_emu.h` defines the macro, the kernel's own `#ifndef` defines it for nvcc as
    /// `extern __shared__ float name[]`). Past 48 KiB the kernel is opted in at launch; beyond
    /// what the GPU allows a block (227 KiB on sm_90, as the emulator checks) the launch fails
    /// with an error naming the kernel.
    Grid {
        /// Blocks along x, y, z: 1 to 2³¹ − 1 along x, 1 to 65 535 along y and z.
        grid: [u32; 3],
        /// Threads per block along x, y, z (`dim3 block`): at least 1 along each, at most
        /// 1024 along x and y and 64 along z, 1024 in all; `[256, 1, 1]` for a 1-D block.
        block: [u32; 3],
        /// Bytes of dynamic shared memory per block.
        shared: u32,
    },
}

impl LaunchShape {
    /// `Ok` where CUDA can launch this shape (every GPU since sm_20 and the kernel emulator
    /// share these limits), else what is outside them: a grid or block extent of 0, a grid
    /// beyond 2³¹ − 1 blocks along x or 65 535 along y or z, a block beyond 1024 threads along
    /// x or y, 64 along z or 1024 in all. A [`LaunchShape::GridStride`] is always launchable.
    pub fn check(&self) -> std::result::Result<(), String> {
        let LaunchShape::Grid { grid, block, .. } = *self else {
            return Ok(());
        };
        let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
        let why = if grid.contains(&0) || block.contains(&0) {
            "every extent must be at least 1"
        } else if grid[0] > i32::MAX as u32 || grid[1] > 65_535 || grid[2] > 65_535 {
            "a grid has at most 2³¹ − 1 blocks along x and 65 535 along y and z"
        } else if block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
            "a block has at most 1024 threads along x and y and 64 along z"
        } else if threads > 1024 {
            "a block has at most 1024 threads in all"
        } else {
            return Ok(());
        };
        Err(format!(
            "launch shape grid ({}, {}, {}) × block ({}, {}, {}) is outside CUDA's limits: {why}",
            grid[0], grid[1], grid[2], block[0], block[1], block[2]
        ))
    }
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
/// launches no user kernels (the simulation device: a [`DeviceImpl::launching_kernels`] never calls this
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
        Some(k) => {
            let got = k.launch_user(op, module, kernel, shape, args, outs)?;
            if got.len() == outs.len() {
                return Ok(got);
            }
            // A device of one's own that returns another count: its buffers go back, and the
            // launch is an error (the callers index one buffer per output).
            let n = got.len();
            for b in got {
                dev.release(b);
            }
            Err(Error::kernel(
                op,
                format!(
                    "kernel {kernel} of module {}: the {name} device returned {n} output \
                     buffer(s) for {} output(s)",
                    module.name,
                    outs.len()
                ),
            ))
        }
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

    /// The device implementation (a [`DeviceImpl::launching_kernels`]: the sim twin runs where the
    /// device launches no user kernels).
    pub fn device_impl(self) -> DeviceImpl {
        let me = Arc::new(self);
        let fwd = Arc::clone(&me);
        DeviceImpl::new(
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
        .launching_kernels()
    }
}
