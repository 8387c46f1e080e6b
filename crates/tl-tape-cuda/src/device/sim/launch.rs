//! How the simulation device runs a primitive: check the lengths against the ABI, look the
//! operands up (a released one is an error), allocate the output from the pool, run the kernel
//! body over host slices, register the output. The operands' shapes arrive checked by
//! [`Device`](crate::device::Device)'s provided methods. Also the
//! shared shapes of launches (one-input maps, two-input maps, two-output splits).

use std::collections::HashMap;

use super::SimDevice;
use crate::alloc::Allocation;
use crate::device::Buffer;
use crate::{Error, Result, abi};

/// The elements of a live buffer, or [`Error::Released`] naming `op`.
pub(super) fn view<'a>(
    live: &'a HashMap<u64, Allocation<Vec<f32>>>,
    op: &'static str,
    b: Buffer,
) -> Result<&'a [f32]> {
    live.get(&b.id())
        .map(|a| &a.block[..b.len()])
        .ok_or(Error::Released {
            op,
            buffer: b.id(),
            len: b.len(),
        })
}

impl SimDevice {
    pub(super) fn insert(&mut self, out: Allocation<Vec<f32>>, len: usize) -> Buffer {
        let b = Buffer::fresh(len);
        self.live.insert(b.id(), out);
        b
    }

    /// `body` (the sim's launch of a primitive) beside what the CUDA device's split passes add
    /// to it: `launches` more kernels, and a pool workspace of each length in `workspaces`,
    /// taken before `body` and given back after it whether it succeeds or fails
    /// (`CudaDevice::with_workspace`), so that the sim's traffic and pool counts are the
    /// device's. The sim's split sums themselves live in host temporaries.
    pub(super) fn with_split_passes<T>(
        &mut self,
        op: &'static str,
        launches: usize,
        workspaces: &[usize],
        body: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let mut held = Vec::with_capacity(workspaces.len());
        for &len in workspaces {
            match self.pool.allocate(op, len * 4) {
                Ok(a) => held.push(a),
                Err(e) => {
                    held.into_iter().for_each(|a| self.pool.free(a));
                    return Err(e);
                }
            }
        }
        let r = body(self);
        held.into_iter().for_each(|a| self.pool.free(a));
        if r.is_ok() {
            for _ in 0..launches {
                self.traffic.launch();
            }
        }
        r
    }

    /// One launch: check the ABI, look the operands up, allocate the output, run `kernel` on the
    /// operands' elements and the output's, register the output.
    /// Counted as one kernel launch ([`crate::Traffic`]).
    pub(super) fn launch<const N: usize>(
        &mut self,
        op: &'static str,
        ins: [Buffer; N],
        out_len: usize,
        kernel: impl FnOnce([&[f32]; N], &mut [f32]),
    ) -> Result<Buffer> {
        let out = self.run_body(op, ins, out_len, kernel)?;
        self.traffic.launch();
        Ok(out)
    }

    /// [`launch`](Self::launch)'s work without counting a launch (`upload` is a copy).
    pub(super) fn run_body<const N: usize>(
        &mut self,
        op: &'static str,
        ins: [Buffer; N],
        out_len: usize,
        kernel: impl FnOnce([&[f32]; N], &mut [f32]),
    ) -> Result<Buffer> {
        abi::len_u32(op, out_len)?;
        let mut views: [&[f32]; N] = [&[]; N];
        for (v, b) in views.iter_mut().zip(ins) {
            abi::len_u32(op, b.len())?;
            *v = view(&self.live, op, b)?;
        }
        let mut out = self.pool.allocate(op, out_len * 4)?;
        if out_len > 0 {
            // An empty output has nothing to compute; the kernel's loops over the operands'
            // dims could still run for hours (outer = 2⁶² around an inner extent of 0).
            kernel(views, &mut out.block[..out_len]);
        }
        Ok(self.insert(out, out_len))
    }

    /// An in-place update of the distinct buffers `outs` (checked by the caller) from their
    /// own elements and `g`'s, index by index (`kernel` maps the values at one index to the new
    /// ones); every operand is looked up before anything is written. No launch counted (the
    /// callers count theirs: one for a parameter, one for a list).
    pub(super) fn update_in_place<const N: usize>(
        &mut self,
        op: &'static str,
        outs: [Buffer; N],
        g: Buffer,
        kernel: impl Fn([f32; N], f32) -> [f32; N],
    ) -> Result<()> {
        let gs = view(&self.live, op, g)?;
        let mut cols: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for (col, b) in cols.iter_mut().zip(outs) {
            *col = view(&self.live, op, b)?.to_vec();
        }
        for (i, &gi) in gs.iter().enumerate() {
            let new = kernel(std::array::from_fn(|k| cols[k][i]), gi);
            for (col, v) in cols.iter_mut().zip(new) {
                col[i] = v;
            }
        }
        for (col, b) in cols.iter().zip(outs) {
            if let Some(a) = self.live.get_mut(&b.id()) {
                a.block[..b.len()].copy_from_slice(col);
            }
        }
        Ok(())
    }

    /// `y ← y + c·x` in place, element by element as the kernel computes it (`y` and `x` may
    /// be the same buffer); no launch counted (the callers count theirs).
    pub(super) fn axpy_in_place(
        &mut self,
        op: &'static str,
        y: Buffer,
        c: f32,
        x: Buffer,
    ) -> Result<()> {
        let xs = view(&self.live, op, x)?.to_vec();
        let ys = self.live.get_mut(&y.id()).ok_or(Error::Released {
            op,
            buffer: y.id(),
            len: y.len(),
        })?;
        for (o, &v) in ys.block[..y.len()].iter_mut().zip(&xs) {
            *o = super::pointwise::axpy(*o, v, c);
        }
        Ok(())
    }

    /// A launch with two outputs of `out_len` elements each.
    pub(super) fn launch2<const N: usize>(
        &mut self,
        op: &'static str,
        ins: [Buffer; N],
        out_len: usize,
        kernel: impl FnOnce([&[f32]; N], &mut [f32], &mut [f32]),
    ) -> Result<(Buffer, Buffer)> {
        abi::len_u32(op, out_len)?;
        let mut views: [&[f32]; N] = [&[]; N];
        for (v, b) in views.iter_mut().zip(ins) {
            *v = view(&self.live, op, b)?;
        }
        let mut o1 = self.pool.allocate(op, out_len * 4)?;
        let mut o2 = match self.pool.allocate(op, out_len * 4) {
            Ok(o) => o,
            Err(e) => {
                self.pool.free(o1);
                return Err(e);
            }
        };
        if out_len > 0 {
            // As in `launch`: empty outputs, nothing to compute.
            kernel(views, &mut o1.block[..out_len], &mut o2.block[..out_len]);
        }
        self.traffic.launch();
        Ok((self.insert(o1, out_len), self.insert(o2, out_len)))
    }

    /// One launch with `K` outputs of the lengths `lens` (all released if one cannot be
    /// allocated): `kernel` gets the operands' elements and the outputs'.
    pub(super) fn launch_outs<const N: usize, const K: usize>(
        &mut self,
        op: &'static str,
        ins: [Buffer; N],
        lens: [usize; K],
        kernel: impl FnOnce([&[f32]; N], [&mut [f32]; K]),
    ) -> Result<[Buffer; K]> {
        for &len in &lens {
            abi::len_u32(op, len)?;
        }
        let mut views: [&[f32]; N] = [&[]; N];
        for (v, b) in views.iter_mut().zip(ins) {
            abi::len_u32(op, b.len())?;
            *v = view(&self.live, op, b)?;
        }
        let mut allocs = Vec::with_capacity(K);
        for &len in &lens {
            match self.pool.allocate(op, len * 4) {
                Ok(a) => allocs.push(a),
                Err(e) => {
                    allocs.into_iter().for_each(|a| self.pool.free(a));
                    return Err(e);
                }
            }
        }
        let mut slices = allocs
            .iter_mut()
            .zip(lens)
            .map(|(a, len)| &mut a.block[..len]);
        let outs: [&mut [f32]; K] = std::array::from_fn(|_| slices.next().unwrap_or_default());
        if lens.iter().any(|&l| l > 0) {
            kernel(views, outs);
        }
        self.traffic.launch();
        let bufs: Vec<Buffer> = allocs
            .into_iter()
            .zip(lens)
            .map(|(a, len)| self.insert(a, len))
            .collect();
        bufs.try_into()
            .map_err(|_| Error::kernel(op, "the outputs were not allocated"))
    }

    pub(super) fn map1(
        &mut self,
        op: &'static str,
        x: Buffer,
        f: impl Fn(f32) -> f32,
    ) -> Result<Buffer> {
        self.launch(op, [x], x.len(), |[x], out| {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f(v);
            }
        })
    }

    pub(super) fn map2(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        f: impl Fn(f32, f32) -> f32,
    ) -> Result<Buffer> {
        self.launch(op, [a, b], a.len(), |[a, b], out| {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        })
    }

    pub(super) fn split3(
        &mut self,
        op: &'static str,
        a: Buffer,
        b: Buffer,
        g: Buffer,
        f: impl Fn(f32, f32, f32) -> (f32, f32),
    ) -> Result<(Buffer, Buffer)> {
        let n = a.len();
        self.launch2(op, [a, b, g], n, |[a, b, g], da, db| {
            for i in 0..n {
                (da[i], db[i]) = f(a[i], b[i], g[i]);
            }
        })
    }
}
