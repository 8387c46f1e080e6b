//! How the CUDA device runs a primitive: resolve the kernel, allocate the output from the pool,
//! launch over the operands' device pointers, release the output again if the launch fails.
//! Also the launch shapes shared by many primitives (maps, splits, full reductions).

use super::CudaDevice;
use super::driver::{self, Arg};
use crate::device::Buffer;
use crate::device::sim::reduce::{BLOCK, grid_size};
use crate::{Error, Result, abi};

/// The most blocks of a grid-stride launch (more threads only add loop trips).
const MAX_BLOCKS: usize = 65_535;

/// Blocks of a grid-stride launch over `n` elements: `clamp(ceil(n/256), 1, 65535)`.
pub(super) fn blocks(n: usize) -> u32 {
    n.div_ceil(BLOCK).clamp(1, MAX_BLOCKS) as u32
}

impl CudaDevice {
    /// The device address of a live buffer, or [`Error::Released`] naming `op`.
    pub(super) fn ptr(&self, op: &'static str, b: Buffer) -> Result<u64> {
        abi::len_u32(op, b.len())?;
        self.live
            .get(&b.id())
            .map(|a| a.block)
            .ok_or(Error::Released {
                op,
                buffer: b.id(),
                len: b.len(),
            })
    }

    /// A fresh buffer of `n` elements from the pool (uninitialized).
    pub(super) fn alloc(&mut self, op: &'static str, n: usize) -> Result<(Buffer, u64)> {
        abi::len_u32(op, n)?;
        driver::enter()?;
        let a = self.pool.allocate(op, n * 4)?;
        let ptr = a.block;
        let b = Buffer::fresh(n);
        self.live.insert(b.id(), a);
        Ok((b, ptr))
    }

    /// The raw handle of kernel `name` (cached per device).
    pub(super) fn func(&mut self, name: &'static str) -> Result<usize> {
        if let Some(&f) = self.funcs.get(name) {
            return Ok(f);
        }
        let f = driver::function(name)?;
        self.funcs.insert(name, f);
        Ok(f)
    }

    /// Launch `kernel` with `grid` blocks of 256 threads.
    pub(super) fn run(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        grid: [u32; 3],
        args: &[Arg],
    ) -> Result<()> {
        self.run_blocks_of(op, kernel, grid, BLOCK as u32, args)
    }

    /// Launch `kernel` with `grid` blocks of `block` threads.
    pub(super) fn run_blocks_of(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        grid: [u32; 3],
        block: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_kernel(op, kernel, (grid, [block, 1, 1], 0), args)
    }

    /// Launch `kernel` with `grid` blocks of 256 threads and `shared` bytes of dynamic shared
    /// memory a block (`TL_DYNAMIC_SHARED`).
    pub(super) fn run_shared(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        grid: [u32; 3],
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_kernel(op, kernel, (grid, [BLOCK as u32, 1, 1], shared), args)
    }

    /// The one launch path of our kernels: resolve, count, launch with `(grid, block,
    /// shared bytes)`.
    fn launch_kernel(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        (grid, block, shared): ([u32; 3], [u32; 3], u32),
        args: &[Arg],
    ) -> Result<()> {
        let f = self.func(kernel)?;
        self.traffic.launch();
        driver::launch(op, f, grid, block, shared, args)
    }

    /// Allocate `outs` buffers of `n` elements, run `body` with their addresses, and release
    /// them all if it fails.
    pub(super) fn with_outs<const K: usize>(
        &mut self,
        op: &'static str,
        n: usize,
        body: impl FnOnce(&mut Self, [u64; K]) -> Result<()>,
    ) -> Result<[Buffer; K]> {
        let mut bufs = Vec::with_capacity(K);
        let mut ptrs = [0u64; K];
        for p in ptrs.iter_mut() {
            match self.alloc(op, n) {
                Ok((b, ptr)) => {
                    bufs.push(b);
                    *p = ptr;
                }
                Err(e) => {
                    self.release_all_bufs(&bufs);
                    return Err(e);
                }
            }
        }
        match body(self, ptrs) {
            Ok(()) => Ok(bufs.try_into().expect("K buffers were pushed")),
            Err(e) => {
                self.release_all_bufs(&bufs);
                Err(e)
            }
        }
    }

    fn release_all_bufs(&mut self, bufs: &[Buffer]) {
        for &b in bufs {
            if let Some(a) = self.live.remove(&b.id()) {
                self.pool.free(a);
            }
        }
    }

    /// One output of `n` elements: see [`with_outs`](Self::with_outs).
    pub(super) fn with_out(
        &mut self,
        op: &'static str,
        n: usize,
        body: impl FnOnce(&mut Self, u64) -> Result<()>,
    ) -> Result<Buffer> {
        self.with_outs::<1>(op, n, |d, [o]| body(d, o)).map(|[b]| b)
    }

    /// A pool workspace of `n` elements for `body` (its address), released after it, whether
    /// it succeeds or fails; `body`'s result.
    pub(super) fn with_workspace<T>(
        &mut self,
        op: &'static str,
        n: usize,
        body: impl FnOnce(&mut Self, u64) -> Result<T>,
    ) -> Result<T> {
        let (work, ptr) = self.alloc(op, n)?;
        let r = body(self, ptr);
        self.release_all_bufs(&[work]);
        r
    }

    /// `kernel(x, out, n, extra...)` over `n = x.len()` elements.
    pub(super) fn map1(
        &mut self,
        kernel: &'static str,
        x: Buffer,
        extra: &[Arg],
    ) -> Result<Buffer> {
        let op = &kernel[3..];
        let px = self.ptr(op, x)?;
        let n = x.len();
        self.with_out(op, n, |d, o| {
            d.grid_stride(op, kernel, n, &[Arg::Ptr(px), Arg::Ptr(o)], extra)
        })
    }

    /// `kernel(a, b, out, n, extra...)` over equal lengths (checked by [`Device`](crate::device::Device)).
    pub(super) fn map2(
        &mut self,
        kernel: &'static str,
        a: Buffer,
        b: Buffer,
        extra: &[Arg],
    ) -> Result<Buffer> {
        let op = &kernel[3..];
        let n = a.len();
        let (pa, pb) = (self.ptr(op, a)?, self.ptr(op, b)?);
        self.with_out(op, n, |d, o| {
            d.grid_stride(
                op,
                kernel,
                n,
                &[Arg::Ptr(pa), Arg::Ptr(pb), Arg::Ptr(o)],
                extra,
            )
        })
    }

    /// `kernel(a, b, g, da, db, n)` over equal lengths (checked by [`Device`](crate::device::Device)).
    pub(super) fn split3(
        &mut self,
        kernel: &'static str,
        a: Buffer,
        b: Buffer,
        g: Buffer,
    ) -> Result<(Buffer, Buffer)> {
        let op = &kernel[3..];
        let n = a.len();
        let (pa, pb, pg) = (self.ptr(op, a)?, self.ptr(op, b)?, self.ptr(op, g)?);
        let [da, db] = self.with_outs::<2>(op, n, |d, [da, db]| {
            let args = [pa, pb, pg, da, db].map(Arg::Ptr);
            d.grid_stride(op, kernel, n, &args, &[])
        })?;
        Ok((da, db))
    }

    /// A grid-stride launch over `n` elements: `kernel(ptrs..., n as u64, extra...)`; nothing
    /// is launched for `n = 0`.
    pub(super) fn grid_stride(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        n: usize,
        ptrs: &[Arg],
        extra: &[Arg],
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let mut args = ptrs.to_vec();
        args.push(Arg::U64(n as u64));
        args.extend_from_slice(extra);
        self.run(op, kernel, [blocks(n), 1, 1], &args)
    }

    /// The full sum of `x` into a length-1 buffer (divided by `len` when `mean`): the
    /// two-pass fixed-order kernels in deterministic mode, else one atomic pass; one launch of
    /// one block when either would use a single block (the same bits as both).
    pub(super) fn full_reduce(
        &mut self,
        op: &'static str,
        x: Buffer,
        mean: bool,
    ) -> Result<Buffer> {
        let px = self.ptr(op, x)?;
        let n = x.len();
        let g = grid_size(n);
        let deterministic = self.deterministic();
        self.with_out(op, 1, |d, out| {
            if g == 1 {
                let args = [
                    Arg::Ptr(px),
                    Arg::Ptr(out),
                    Arg::U64(n as u64),
                    Arg::U32(u32::from(mean)),
                ];
                return d.run(op, "tl_reduce_one_block", [1, 1, 1], &args);
            }
            if deterministic {
                let [partials] = d.with_outs::<1>(op, g, |d, [p]| {
                    let first = [Arg::Ptr(px), Arg::Ptr(p), Arg::U64(n as u64)];
                    d.run(op, "tl_reduce_partials", [g as u32, 1, 1], &first)?;
                    let second = [
                        Arg::Ptr(p),
                        Arg::Ptr(out),
                        Arg::U32(g as u32),
                        Arg::U64(n as u64),
                        Arg::U32(u32::from(mean)),
                    ];
                    d.run(op, "tl_reduce_final", [1, 1, 1], &second)
                })?;
                d.release_all_bufs(&[partials]);
                Ok(())
            } else {
                d.grid_stride(op, "tl_full", 1, &[Arg::Ptr(out)], &[Arg::F32(0.0)])?;
                let args = [Arg::Ptr(px), Arg::Ptr(out), Arg::U64(n as u64)];
                d.run(op, "tl_reduce_atomic", [g as u32, 1, 1], &args)?;
                if mean {
                    d.run(
                        op,
                        "tl_reduce_div",
                        [1, 1, 1],
                        &[Arg::Ptr(out), Arg::U64(n as u64)],
                    )?;
                }
                Ok(())
            }
        })
    }
}

/// `dims` padded with `pad` to the kernels' `Dims8`.
pub(super) fn dims8(dims: &[usize], pad: u32) -> [u32; 8] {
    let mut out = [pad; 8];
    for (o, &d) in out.iter_mut().zip(dims) {
        *o = d as u32;
    }
    out
}
