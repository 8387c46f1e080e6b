//! The kernel emulator's driver (feature `cuda-emu`): the same functions as `driver.rs`, over
//! `kernels/*.cu` compiled for the host by g++ with the runtime of `crates/tl-cuda-build/emu/` (built by
//! `build.rs`; docs/cuda.md, "The kernel emulator"). [`super::CudaDevice`] runs unchanged on
//! it: its allocator, launch shapes and arguments, and the kernel sources themselves, with one
//! fiber per CUDA thread. What it cannot check is what nvcc and the GPU add: code generation,
//! CUDA's own `expf`/`logf`/... (the host libm is used), timing and true concurrency.
//!
//! Every `unsafe` block is a call into the runtime's C ABI, with a `// SAFETY:` comment.

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use super::arg;
pub use super::arg::Arg;
use crate::alloc::RawMemory;
use crate::user::{EmuKernels, EmuTableFn, KernelModule};
use crate::{Error, Result};

/// What [`CudaDevice::name`](crate::Device::name) reports over this driver.
pub const NAME: &str = "cuda-emu";

/// Room for the runtime's error messages.
const ERR_CAP: usize = 512;

unsafe extern "C" {
    fn tl_emu_find(name: *const c_char) -> c_int;
    fn tl_emu_launch(
        index: c_int,
        grid: *const u32,
        block: *const u32,
        shared: u32,
        params: *mut *mut c_void,
        sig: *const c_char,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn tl_emu_register(
        table: EmuTableFn,
        name: *const c_char,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn tl_emu_alloc(bytes: usize) -> u64;
    fn tl_emu_free(p: u64);
    fn tl_emu_copy_to_device(
        dst: u64,
        src: *const f32,
        n: usize,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn tl_emu_copy_to_host(
        dst: *mut f32,
        src: u64,
        n: usize,
        err: *mut c_char,
        cap: usize,
    ) -> c_int;
    fn tl_emu_set_reverse(on: c_int);
    #[cfg(test)]
    fn tl_emu_set_portable_fibers(on: c_int);
    #[cfg(test)]
    fn tl_emu_switch_built() -> c_int;
    #[cfg(test)]
    fn tl_emu_set_plain_kernels(on: c_int);
    #[cfg(test)]
    fn tl_emu_runs_fma_build(index: c_int) -> c_int;
}

/// The runtime's message in `err` (NUL-terminated by `vsnprintf`) as our error.
fn failed(op: &'static str, err: &[c_char; ERR_CAP]) -> Error {
    // SAFETY: the runtime wrote a NUL-terminated string of at most ERR_CAP bytes into `err`
    // (vsnprintf always terminates), and `err` lives for this call.
    let detail = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
    // The runtime names the kernel first; said once where `op` is that kernel.
    let detail = detail
        .strip_prefix(op)
        .and_then(|d| d.strip_prefix(": "))
        .unwrap_or(&detail)
        .to_owned();
    Error::Emulator { op, detail }
}

/// `Ok` for a runtime return code of 0, else the runtime's message as the error of `op`.
fn status(op: &'static str, rc: c_int, err: &[c_char; ERR_CAP]) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(failed(op, err))
    }
}

/// Run this thread's later launches with every block's threads in reverse order (`true`) or
/// in order (tests: results that depend on the schedule show up).
#[cfg(test)]
pub(crate) fn set_reverse_schedule(on: bool) {
    // SAFETY: sets a thread-local flag of the runtime; no pointers are involved.
    unsafe { tl_emu_set_reverse(c_int::from(on)) };
}

/// `f`, with the kernel emulator running every block's threads in reverse order for the
/// launches this thread makes inside it (`TL_EMU_SCHEDULE=reverse` for one scope; afterwards,
/// panic or not, the launches follow `TL_EMU_SCHEDULE` again). A kernel whose threads read
/// each other's writes without a barrier between them (a missing `__syncthreads()`) gives
/// other results than in the forward order, so a check run in both orders catches it.
pub fn in_reverse_schedule<R>(f: impl FnOnce() -> R) -> R {
    /// Back to `TL_EMU_SCHEDULE` when the scope ends.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: sets a thread-local flag of the runtime; no pointers are involved.
            unsafe { tl_emu_set_reverse(-1) };
        }
    }
    // SAFETY: as above.
    unsafe { tl_emu_set_reverse(1) };
    let _restore = Restore;
    f()
}

/// Nothing to initialize: the emulator has no context.
pub fn enter() -> Result<()> {
    Ok(())
}

/// The index of kernel `name` in the emulator's table.
pub fn function(name: &'static str) -> Result<usize> {
    let cname = CString::new(name).map_err(|_| Error::kernel(name, "bad kernel name"))?;
    // SAFETY: `cname` is NUL-terminated and outlives the call; the table is immutable.
    let i = unsafe { tl_emu_find(cname.as_ptr()) };
    usize::try_from(i).map_err(|_| Error::Emulator {
        op: name,
        detail: "no such kernel in kernels/*.cu".to_owned(),
    })
}

impl EmuKernels {
    /// The kernel table `table` of the emulator library `lib`: what
    /// [`emu_kernels!`](crate::emu_kernels) expands to (use the macro).
    ///
    /// # Safety
    ///
    /// `table` must be the table function that `tl_cuda_build::Emulator::compile` generated
    /// for `lib` (`tl_emu_table_<lib>`), linked into the program: the emulator calls it and
    /// reads the kernels it returns.
    #[doc(hidden)]
    pub unsafe fn from_table(lib: &'static str, table: EmuTableFn) -> Self {
        EmuKernels { lib, table }
    }
}

/// The index of kernel `name` of a user's module: its emulator table is registered with the
/// runtime (once), then searched.
pub fn user_function(module: &KernelModule, name: &'static str) -> Result<usize> {
    let Some(emu) = module.emu_table() else {
        return Err(Error::Emulator {
            op: name,
            detail: "the module has no emulator build (build its .cu with \
                     tl_cuda_build::Emulator in the build.rs, name it with \
                     tl_tape_cuda::emu_kernels! under feature cuda-emu)"
                .to_owned(),
        });
    };
    let cname = CString::new(name).map_err(|_| Error::kernel(name, "bad kernel name"))?;
    let mut err = [0 as c_char; ERR_CAP];
    // SAFETY: `emu.table` is the table function of an emulator library
    // (`EmuKernels::from_table`'s contract), which the runtime calls once and whose kernels
    // it copies; `cname` is NUL-terminated and outlives the call; `err` has room for ERR_CAP
    // bytes.
    let i = unsafe { tl_emu_register(emu.table, cname.as_ptr(), err.as_mut_ptr(), ERR_CAP) };
    usize::try_from(i).map_err(|_| {
        let e = failed(name, &err);
        match e {
            Error::Emulator { op, detail } => Error::Emulator {
                op,
                detail: format!("{detail} (emulator library {})", emu.lib()),
            },
            other => other,
        }
    })
}

/// Run kernel `f` with `grid` blocks of `block` threads (x, y, z) and `shared` bytes of dynamic shared memory a
/// block (0 for none; `TL_DYNAMIC_SHARED`); the emulator refuses arguments that do not match
/// the kernel's parameters, pointers outside live allocations, and out-of-bounds writes; it
/// refuses more than sm_90 allows a block (227 KiB), poisons it before each block and
/// reports a write past either end.
pub fn launch(
    op: &'static str,
    f: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    args: &[Arg],
) -> Result<()> {
    let index = c_int::try_from(f).map_err(|_| Error::kernel(op, "bad kernel index"))?;
    let mut vals: Vec<Arg> = args.to_vec();
    let mut ptrs = arg::params(&mut vals);
    let sig = CString::new(args.iter().map(Arg::tag).collect::<Vec<u8>>())
        .map_err(|_| Error::kernel(op, "bad argument tags"))?;
    let mut err = [0 as c_char; ERR_CAP];
    // SAFETY: `grid` and `block` have three elements each; `ptrs` has one pointer per argument, each into `vals`,
    // which outlives the call; `sig` is NUL-terminated with one tag per argument, which the
    // runtime checks against the kernel's parameter list before reading any argument; `err`
    // has room for ERR_CAP bytes. The runtime checks every pointer argument against its live
    // allocations before running the kernel.
    let rc = unsafe {
        tl_emu_launch(
            index,
            grid.as_ptr(),
            block.as_ptr(),
            shared,
            ptrs.as_mut_ptr(),
            sig.as_ptr(),
            err.as_mut_ptr(),
            ERR_CAP,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(failed(op, &err))
    }
}

/// Always done: the emulator runs every launch, copy and library call to its end.
pub fn stream_done(_op: &'static str) -> Result<bool> {
    Ok(true)
}

/// Copy `data` to device address `dst` (at least `data.len()` floats).
pub fn copy_to_device(dst: u64, data: &[f32]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut err = [0 as c_char; ERR_CAP];
    // SAFETY: `data` is valid for `data.len()` floats; the runtime checks that the destination
    // range lies in one live allocation before it copies; `err` has room for ERR_CAP bytes.
    let rc =
        unsafe { tl_emu_copy_to_device(dst, data.as_ptr(), data.len(), err.as_mut_ptr(), ERR_CAP) };
    status("upload", rc, &err)
}

/// Copy `n` floats from device address `src` to a new host vector.
pub fn copy_to_host(src: u64, n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; n];
    if n == 0 {
        return Ok(out);
    }
    let mut err = [0 as c_char; ERR_CAP];
    // SAFETY: `out` has room for `n` floats; the runtime checks that the source range lies in
    // one live allocation before it copies; `err` has room for ERR_CAP bytes.
    let rc = unsafe { tl_emu_copy_to_host(out.as_mut_ptr(), src, n, err.as_mut_ptr(), ERR_CAP) };
    status("download", rc, &err).map(|()| out)
}

/// Host memory with guard zones (the runtime's) under the caching allocator; no device
/// free/total to report (0, as on the simulation device).
#[derive(Debug, Default)]
pub struct DeviceMemory;

impl RawMemory for DeviceMemory {
    type Block = u64;

    fn alloc(&mut self, op: &'static str, bytes: usize) -> Result<u64> {
        // SAFETY: plain allocation; the runtime returns 0 when malloc fails.
        let p = unsafe { tl_emu_alloc(bytes) };
        if p == 0 {
            return Err(Error::OutOfMemory {
                op,
                requested: bytes,
                in_use: 0,
                limit: 0,
            });
        }
        Ok(p)
    }

    fn free(&mut self, block: u64, _bytes: usize) {
        // SAFETY: `block` came from `tl_emu_alloc` and the pool frees it once; the runtime
        // ignores an address it does not hold.
        unsafe { tl_emu_free(block) }
    }

    fn mem_info(&self) -> (usize, usize) {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    //! Each check of the emulator, shown to fire: these are what make a kernel bug an error
    //! here instead of garbage on a GPU.
    use super::*;

    fn alloc_floats(n: usize) -> u64 {
        DeviceMemory.alloc("test", 4 * n).unwrap()
    }

    fn detail(r: Result<()>) -> String {
        match r {
            Err(Error::Emulator { detail, .. }) => detail,
            other => panic!("expected an emulator error, got {other:?}"),
        }
    }

    /// `tl_full` over one block of 256 threads with the given arguments.
    fn full(args: &[Arg]) -> Result<()> {
        launch(
            "full",
            function("tl_full")?,
            [1, 1, 1],
            [256, 1, 1],
            0,
            args,
        )
    }

    /// Launch a self-test kernel over one block of 256 threads on this thread, in the given
    /// order, and download its 256 outputs.
    fn run_selftest(name: &'static str, reverse: bool) -> Result<Vec<f32>> {
        let out = alloc_floats(256);
        // SAFETY: sets a thread-local flag of the runtime.
        unsafe { tl_emu_set_reverse(c_int::from(reverse)) };
        let r = launch(
            name,
            function(name)?,
            [1, 1, 1],
            [256, 1, 1],
            0,
            &[Arg::Ptr(out)],
        );
        // SAFETY: as above.
        unsafe { tl_emu_set_reverse(0) };
        let v = r.and_then(|()| copy_to_host(out, 256));
        DeviceMemory.free(out, 1024);
        v
    }

    #[test]
    fn a_kernel_runs_and_fills_its_output() {
        let out = alloc_floats(1000);
        let f = function("tl_full").unwrap();
        launch(
            "full",
            f,
            [4, 1, 1],
            [256, 1, 1],
            0,
            &[Arg::Ptr(out), Arg::U64(1000), Arg::F32(2.5)],
        )
        .unwrap();
        assert_eq!(copy_to_host(out, 1000).unwrap(), vec![2.5f32; 1000]);
        DeviceMemory.free(out, 4000);
    }

    #[test]
    fn arguments_that_do_not_match_the_kernel_are_refused() {
        let out = alloc_floats(4);
        // n as u32 where the kernel takes u64.
        let d = detail(full(&[Arg::Ptr(out), Arg::U32(4), Arg::F32(1.0)]));
        assert!(
            d.contains("tl_full takes parameters (pUf) but the launch passed (puf)"),
            "{d}"
        );
        // One argument missing.
        let d = detail(full(&[Arg::Ptr(out), Arg::U64(4)]));
        assert!(d.contains("(pU)"), "{d}");
        DeviceMemory.free(out, 16);
    }

    #[test]
    fn a_pointer_outside_every_allocation_is_refused() {
        // A host address: never in the emulator's table. (A freed block's address could be
        // handed out again at once to a test running in parallel.)
        let host = [0.0f32; 4];
        let out = host.as_ptr() as u64;
        let d = detail(full(&[Arg::Ptr(out), Arg::U64(4), Arg::F32(1.0)]));
        assert!(
            d.contains("argument 0") && d.contains("not a live allocation"),
            "{d}"
        );
    }

    #[test]
    fn a_write_past_the_end_of_a_buffer_is_caught() {
        let out = alloc_floats(16);
        // 20 elements into a 16-element allocation.
        let d = detail(full(&[Arg::Ptr(out), Arg::U64(20), Arg::F32(1.0)]));
        assert!(
            d.contains("tl_full wrote outside an allocation of 64 bytes"),
            "{d}"
        );
        // The guard zones are restored, so the next (correct) launch passes.
        full(&[Arg::Ptr(out), Arg::U64(16), Arg::F32(1.0)]).unwrap();
        DeviceMemory.free(out, 64);
    }

    #[test]
    fn launch_shapes_beyond_cuda_limits_are_refused() {
        let out = alloc_floats(4);
        let f = function("tl_full").unwrap();
        let args = [Arg::Ptr(out), Arg::U64(4), Arg::F32(1.0)];
        for (grid, block) in [
            ([1, 1, 1], [1025, 1, 1]),
            ([1, 1, 1], [0, 1, 1]),
            ([1, 65_536, 1], [256, 1, 1]),
            // 2048 threads, though each extent is within its own limit.
            ([1, 1, 1], [32, 32, 2]),
            ([1, 1, 1], [1, 1, 65]),
            ([1, 1, 1], [16, 0, 1]),
        ] {
            let d = detail(launch("full", f, grid, block, 0, &args));
            assert!(d.contains("outside CUDA's limits"), "{d}");
        }
        DeviceMemory.free(out, 16);
    }

    #[test]
    fn copies_outside_an_allocation_are_refused_and_new_memory_is_nan() {
        let p = alloc_floats(8);
        assert!(copy_to_host(p, 8).unwrap().iter().all(|v| v.is_nan()));
        let d = detail(copy_to_device(p, &[0.0; 9]));
        assert!(
            d.contains("upload of 9 floats") && d.contains("not inside"),
            "{d}"
        );
        let d = detail(copy_to_host(p + 4, 8).map(|_| ()));
        assert!(d.contains("download of 8 floats"), "{d}");
        DeviceMemory.free(p, 32);
    }

    /// Dynamic shared memory starts each block as the poison (a NaN), so a read before any
    /// write shows; the launch's bytes stay within what a block may have.
    #[test]
    fn unwritten_dynamic_shared_memory_is_nan() {
        let out = alloc_floats(256);
        let f = function("tl_emu_test_dynamic_unwritten").unwrap();
        launch("dyn", f, [2, 1, 1], [256, 1, 1], 1024, &[Arg::Ptr(out)]).unwrap();
        assert!(copy_to_host(out, 256).unwrap().iter().all(|v| v.is_nan()));
        let d = detail(launch(
            "dyn",
            f,
            [1, 1, 1],
            [256, 1, 1],
            300_000,
            &[Arg::Ptr(out)],
        ));
        assert!(d.contains("300000 bytes of dynamic shared memory"), "{d}");
        DeviceMemory.free(out, 1024);
    }

    #[test]
    fn a_barrier_not_every_thread_reaches_is_an_error() {
        let d = detail(run_selftest("tl_emu_test_divergent", false).map(|_| ()));
        assert!(d.contains("threads wait at different barriers"), "{d}");
    }

    /// Run `f` with this thread's launches switching fibers by ucontext (`portable`) or by
    /// the runtime's assembly switch (where built).
    fn with_fibers<T>(portable: bool, f: impl FnOnce() -> T) -> T {
        // SAFETY: sets a thread-local flag of the runtime; no pointers are involved.
        unsafe { tl_emu_set_portable_fibers(c_int::from(portable)) };
        let r = f();
        // SAFETY: as above.
        unsafe { tl_emu_set_portable_fibers(0) };
        r
    }

    /// The sum of `x` by the two-pass reduction kernels (16 blocks of 256 threads: strided
    /// sums, warp shuffles, a block tree behind barriers; then one block over the partials).
    fn two_pass_sum(x: &[f32]) -> f32 {
        let (px, partials, out) = (alloc_floats(x.len()), alloc_floats(16), alloc_floats(1));
        copy_to_device(px, x).unwrap();
        let n = Arg::U64(x.len() as u64);
        let run = |name: &'static str, blocks: u32, args: &[Arg]| {
            launch(
                "sum",
                function(name).unwrap(),
                [blocks, 1, 1],
                [256, 1, 1],
                0,
                args,
            )
            .unwrap();
        };
        run(
            "tl_reduce_partials",
            16,
            &[Arg::Ptr(px), Arg::Ptr(partials), n],
        );
        let second = [
            Arg::Ptr(partials),
            Arg::Ptr(out),
            Arg::U32(16),
            n,
            Arg::U32(0),
        ];
        run("tl_reduce_final", 1, &second);
        let s = copy_to_host(out, 1).unwrap()[0];
        for (p, len) in [(px, x.len()), (partials, 16), (out, 1)] {
            DeviceMemory.free(p, 4 * len);
        }
        s
    }

    #[test]
    fn both_fiber_switches_run_blocks_alike() {
        // The assembly switch is built on x86-64 ELF (Linux, the BSDs), and launches use it by
        // default there.
        // SAFETY: reads a constant of the runtime.
        let built = unsafe { tl_emu_switch_built() } != 0;
        if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            assert!(
                built,
                "the runtime's assembly fiber switch is not built on x86-64 Linux"
            );
        }
        let x: Vec<f32> = (0..4000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let [fast, portable] = [false, true].map(|p| with_fibers(p, || two_pass_sum(&x)));
        assert_eq!(fast.to_bits(), portable.to_bits());
        assert!((f64::from(fast) - want).abs() < 1e-3, "{fast} vs {want}");
        // Each on a thread of its own, as another launching thread would run them (its own
        // scheduler and static __shared__ arrays, poisoned each block).
        for p in [false, true] {
            std::thread::spawn(move || {
                with_fibers(p, || {
                    let fwd = run_selftest("tl_emu_test_race", false).unwrap();
                    assert_ne!(fwd, run_selftest("tl_emu_test_race", true).unwrap());
                    let want: Vec<f32> = (0..256).map(|t| ((t + 1) % 256 + 1) as f32).collect();
                    for reverse in [false, true] {
                        assert_eq!(run_selftest("tl_emu_test_synced", reverse).unwrap(), want);
                    }
                    let d = detail(run_selftest("tl_emu_test_divergent", false).map(|_| ()));
                    assert!(d.contains("threads wait at different barriers"), "{d}");
                });
            })
            .join()
            .unwrap();
        }
    }

    /// `a (m×k) · b (k×n)` by `kernel` (`tl_gemm`, or `tl_gemm_tc` with precision `tc`),
    /// launched as the device launches it unsplit, built plain or with -mfma (`plain`); the
    /// output's bits and whether the -mfma build ran.
    fn gemm_bits(kernel: &'static str, tc: Option<u32>, plain: bool) -> (Vec<u32>, bool) {
        let (m, k, n) = (70usize, 50usize, 90usize);
        let fill = |len: usize, s: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + s) % 257) as f32 / 64.0 - 2.0)
                .collect()
        };
        let (a, b) = (fill(m * k, 1), fill(k * n, 2));
        let (pa, pb, out) = (
            alloc_floats(m * k),
            alloc_floats(k * n),
            alloc_floats(m * n),
        );
        copy_to_device(pa, &a).unwrap();
        copy_to_device(pb, &b).unwrap();
        let side = if tc.is_some() { 128 } else { 64 };
        let u = |v: usize| Arg::U32(v as u32);
        let mut args = vec![
            Arg::Ptr(pa),
            Arg::Ptr(pb),
            Arg::Ptr(out),
            u(1),
            u(m),
            u(k),
            u(n),
        ];
        // ta, tb, into, kc, heads, merged, kv_heads.
        args.extend([u(0), u(0), u(0), u(k), u(1), u(0), u(1)]);
        args.extend(tc.map(Arg::U32));
        let f = function(kernel).unwrap();
        let grid = [n.div_ceil(side) as u32, m.div_ceil(side) as u32, 1];
        // SAFETY: set and read thread-local flags of the runtime; no pointers are involved.
        let fma = unsafe {
            tl_emu_set_plain_kernels(c_int::from(plain));
            tl_emu_runs_fma_build(f as c_int) == 1
        };
        let r = launch(kernel, f, grid, [256, 1, 1], 0, &args);
        // SAFETY: as above.
        unsafe { tl_emu_set_plain_kernels(0) };
        r.unwrap();
        let got = copy_to_host(out, m * n).unwrap();
        for (p, len) in [(pa, m * k), (pb, k * n), (out, m * n)] {
            DeviceMemory.free(p, 4 * len);
        }
        // Within f32 rounding of the f64 product (the bf16 products: of the rounded operands,
        // so only a loose bound here; the harness checks them exactly).
        let tol = if tc.is_some() { 0.1 } else { 1e-4 };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                    .sum();
                let g = f64::from(got[i * n + j]);
                assert!(
                    (g - want).abs() <= tol * (1.0 + want.abs()),
                    "{kernel} ({i}, {j}): {g} vs {want}"
                );
            }
        }
        (bits(&got), fma)
    }

    #[test]
    fn the_fma_build_of_a_kernel_gives_the_plain_builds_bits() {
        // The -mfma build exists on x86-64 and runs by default where the CPU has FMA.
        #[cfg(target_arch = "x86_64")]
        let has_fma = std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let has_fma = false;
        for (kernel, tc) in [("tl_gemm", None), ("tl_gemm_tc", Some(1))] {
            let (fma_bits, ran_fma) = gemm_bits(kernel, tc, false);
            let (plain_bits, ran_fma_anyway) = gemm_bits(kernel, tc, true);
            assert_eq!(
                ran_fma, has_fma,
                "{kernel}: the -mfma build runs where the CPU has FMA"
            );
            assert!(!ran_fma_anyway, "{kernel}: the plain build was asked for");
            assert_eq!(
                fma_bits, plain_bits,
                "{kernel}: the two builds' bits differ"
            );
        }
    }

    /// Without a barrier the result depends on the threads' order: forward, each thread but
    /// the last reads its neighbour's slot before the neighbour writes it, the poison (static
    /// shared memory starts each block as NaN, as it starts undefined on a GPU); in reverse,
    /// the last thread alone (it reads thread 0's slot).
    #[test]
    fn a_missing_barrier_shows_as_a_difference_between_schedules() {
        let fwd = run_selftest("tl_emu_test_race", false).unwrap();
        let rev = run_selftest("tl_emu_test_race", true).unwrap();
        let want: Vec<f32> = (0..256).map(|t| ((t + 1) % 256 + 1) as f32).collect();
        assert!(
            fwd[..255].iter().all(|v| v.is_nan()) && fwd[255] == 1.0,
            "forward, the racy kernel read numbers from unwritten slots: {:?}",
            &fwd[..4]
        );
        assert!(
            rev[..255] == want[..255] && rev[255].is_nan(),
            "in reverse, the racy kernel read {} from thread 0's unwritten slot",
            rev[255]
        );
        assert_eq!(run_selftest("tl_emu_test_synced", false).unwrap(), want);
        assert_eq!(run_selftest("tl_emu_test_synced", true).unwrap(), want);
        // __syncwarp: the same exchange within each warp.
        let want: Vec<f32> = (0..256)
            .map(|t| (t / 32 * 32 + (t + 1) % 32 + 1) as f32)
            .collect();
        assert_eq!(
            run_selftest("tl_emu_test_warp_synced", false).unwrap(),
            want
        );
        assert_eq!(run_selftest("tl_emu_test_warp_synced", true).unwrap(), want);
    }

    /// Run a warp-matrix self-test kernel `(a, b, out, flag)` on 16×16 operands over one
    /// block of 64 threads (two warps, each computing the same tile), in the given order.
    fn run_wmma(
        name: &'static str,
        a: &[f32],
        b: &[f32],
        flag: u32,
        reverse: bool,
    ) -> Result<Vec<f32>> {
        let (pa, pb, out) = (alloc_floats(256), alloc_floats(256), alloc_floats(256));
        copy_to_device(pa, a)?;
        copy_to_device(pb, b)?;
        // SAFETY: sets a thread-local flag of the runtime.
        unsafe { tl_emu_set_reverse(c_int::from(reverse)) };
        let args = [Arg::Ptr(pa), Arg::Ptr(pb), Arg::Ptr(out), Arg::U32(flag)];
        let r = launch(name, function(name)?, [1, 1, 1], [64, 1, 1], 0, &args);
        // SAFETY: as above.
        unsafe { tl_emu_set_reverse(0) };
        let v = r.and_then(|()| copy_to_host(out, 256));
        for p in [pa, pb, out] {
            DeviceMemory.free(p, 1024);
        }
        v
    }

    /// 16×16 operands whose low bits matter to both roundings (and a tie of each).
    fn wmma_operands() -> (Vec<f32>, Vec<f32>) {
        let a: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0 + 1.0e-3 * (i as f32).sin())
            .collect();
        let mut b: Vec<f32> = (0..256)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0 + 1.0e-4 * (i as f32).cos())
            .collect();
        b[0] = 1.0 + 2f32.powi(-8); // a bf16 tie (to even: 1)
        b[1] = 1.0 + 2f32.powi(-11); // a TF32 tie (away: 1 + 2⁻¹⁰)
        (a, b)
    }

    /// The documented order of `mma_sync` over a 16×16×16 tile: `d = fma(r(a), r(b), d)` in
    /// increasing k from 0, each operand read through `r`.
    fn mma_order(a: &[f32], b: &[f32], r: impl Fn(f32) -> f32) -> Vec<f32> {
        let mut out = vec![0.0f32; 256];
        for i in 0..16 {
            for j in 0..16 {
                out[i * 16 + j] = (0..16).fold(0.0f32, |d, kk| {
                    r(a[i * 16 + kk]).mul_add(r(b[kk * 16 + j]), d)
                });
            }
        }
        out
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_warp_matrix_functions_follow_their_documented_order() {
        let (a, b) = wmma_operands();
        let bf16 = mma_order(&a, &b, tl_spec::bf16::round);
        let tf32 = mma_order(&a, &b, tl_spec::tf32::round);
        let truncated = mma_order(&a, &b, |x| f32::from_bits(x.to_bits() & !0x1fff));
        for reverse in [false, true] {
            let got = run_wmma("tl_emu_test_wmma_bf16", &a, &b, 0, reverse).unwrap();
            assert_eq!(bits(&got), bits(&bf16), "bf16, reverse {reverse}");
            // mem_col_major stores the transpose.
            let col = run_wmma("tl_emu_test_wmma_bf16", &a, &b, 4, reverse).unwrap();
            let t: Vec<f32> = (0..256).map(|e| bf16[(e % 16) * 16 + e / 16]).collect();
            assert_eq!(bits(&col), bits(&t), "bf16 col-major store");
            let got = run_wmma("tl_emu_test_wmma_tf32", &a, &b, 1, reverse).unwrap();
            assert_eq!(bits(&got), bits(&tf32), "tf32, reverse {reverse}");
            // Unconverted TF32 operands are read through their top 19 bits: not the rounding.
            let raw = run_wmma("tl_emu_test_wmma_tf32", &a, &b, 0, reverse).unwrap();
            assert_eq!(bits(&raw), bits(&truncated), "tf32 unconverted");
        }
        assert_ne!(bits(&tf32), bits(&truncated));
        assert_ne!(bits(&tf32), bits(&bf16));
    }

    #[test]
    fn warp_matrix_misuse_is_an_error_naming_the_rule() {
        let (a, b) = wmma_operands();
        // The whole message: the kernel is the error's op (said once).
        let run = |bad| {
            run_wmma("tl_emu_test_wmma_bf16", &a, &b, bad, false)
                .unwrap_err()
                .to_string()
        };
        let d = run(1);
        assert!(
            d.contains("tl_emu_test_wmma_bf16")
                && d.contains("load_matrix_sync: ldm 12 (24 bytes) is not a multiple of 16 bytes"),
            "{d}"
        );
        let d = run(2);
        assert!(d.contains("is not 256-bit (32-byte) aligned"), "{d}");
        let d = run(3);
        assert!(
            d.contains("the lanes of a warp passed different pointers"),
            "{d}"
        );
        // The runtime is fine afterwards.
        run_wmma("tl_emu_test_wmma_bf16", &a, &b, 0, false).unwrap();
    }
}
