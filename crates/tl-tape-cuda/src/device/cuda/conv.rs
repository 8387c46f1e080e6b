//! The conv family on cust (kernels/conv.cu): `im2col`, `col2im`, `conv_implicit` (and its
//! cotangents `conv_implicit_dx`, `conv_implicit_dw`), `pool`, `pool_bwd`, their
//! operands already checked by [`Device`](crate::device::Device)'s provided methods. `col2im`
//! and `pool_bwd` take the gather kernels (one thread per output element, fixed order) in
//! deterministic mode and the `atomicAdd` scatters into a zeroed output otherwise, both set up
//! by one helper.

use super::CudaDevice;
use super::driver::Arg;
use super::launch::dims8;
use crate::device::{Batch, Buffer, PoolKind, WindowLens, Windows};
use crate::{Error, Result, abi};

/// The kernels' geometry arguments (`TL_GEO_PARAMS` in conv.cu); checked by [`Windows::check`],
/// so every count fits a `u32`.
fn geo_args(w: &Windows, l: &WindowLens) -> Vec<Arg> {
    vec![
        Arg::U32(w.big.len() as u32),
        Arg::Dims(dims8(&w.big, 1)),
        Arg::Dims(dims8(&w.small, 1)),
        Arg::Dims(dims8(&w.kernel, 1)),
        Arg::Dims(dims8(&w.stride, 1)),
        Arg::Dims(dims8(&w.padding, 0)),
        Arg::U32(w.batch as u32),
        Arg::U32(w.channels as u32),
        Arg::U32(l.kernel as u32),
        Arg::U32(l.small as u32),
        Arg::U32(l.big as u32),
    ]
}

/// [`geo_args`] with the pool's planes as the batch and `(kind, beta)` appended.
fn pool_args(w: &Windows, l: &WindowLens, kind: PoolKind) -> Vec<Arg> {
    let planes = Windows {
        batch: l.planes,
        channels: 1,
        ..w.clone()
    };
    let mut a = geo_args(&planes, l);
    let (code, beta) = kind.code();
    a.push(Arg::U32(code));
    a.push(Arg::F32(beta));
    a
}

impl CudaDevice {
    pub(super) fn im2col_impl(&mut self, x: Buffer, w: &Windows, l: WindowLens) -> Result<Buffer> {
        const OP: &str = "im2col";
        let px = self.ptr(OP, x)?;
        let extra = geo_args(w, &l);
        self.with_out(OP, l.cols_len(), |d, out| {
            d.grid_stride(
                OP,
                "tl_im2col",
                l.cols_len(),
                &[Arg::Ptr(px), Arg::Ptr(out)],
                &extra,
            )
        })
    }

    /// `tl_conv_implicit`: the output `(batch, out_channels, small)` in 64×64 tiles of the
    /// `(out_channels, batch·small)` product; under autocast `tl_conv_implicit_tc`, the
    /// tensor-core kernel, in 128×128 tiles, the precision's code appended.
    pub(super) fn conv_implicit_impl(
        &mut self,
        w: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        l: WindowLens,
    ) -> Result<Buffer> {
        let tiles = (out_channels, win.batch * l.small);
        match super::kernel_code(crate::precision::current()) {
            0 => {
                let kernel = ("conv_implicit", "tl_conv_implicit", 64);
                self.implicit_launch(kernel, [w, x], tiles, win, l, &[out_channels as u32])
            }
            prec => {
                let kernel = (
                    "conv_implicit",
                    "tl_conv_implicit_tc",
                    crate::device::TC_TILE,
                );
                let last = [out_channels as u32, prec];
                self.implicit_launch(kernel, [w, x], tiles, win, l, &last)
            }
        }
    }

    /// `tl_conv_implicit_dx`: the input cotangent `(batch, channels, big)` in 64×64 tiles of
    /// the `(channels, batch·big)` product; under autocast `tl_conv_implicit_dx_tc`, the
    /// tensor-core kernel, in 128×128 tiles, the precision's code appended (its slices,
    /// K·⌈A/16⌉·16 rows, held to a `u32`).
    pub(super) fn conv_implicit_dx_impl(
        &mut self,
        w: Buffer,
        g: Buffer,
        win: &Windows,
        out_channels: usize,
        l: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit_dx";
        let tiles = (win.channels, win.batch * l.big);
        match super::kernel_code(crate::precision::current()) {
            0 => {
                let kernel = (OP, "tl_conv_implicit_dx", 64);
                self.implicit_launch(kernel, [w, g], tiles, win, l, &[out_channels as u32])
            }
            prec => {
                let rows =
                    crate::device::check::product(OP, &[l.kernel, out_channels.div_ceil(16), 16])?;
                abi::to_u32(OP, "slice rows", rows)?;
                let kernel = (OP, "tl_conv_implicit_dx_tc", crate::device::TC_TILE);
                let last = [out_channels as u32, prec];
                self.implicit_launch(kernel, [w, g], tiles, win, l, &last)
            }
        }
    }

    /// `tl_conv_implicit_dw`: the weight cotangent `(out_channels, channels·K)` in 64×64 tiles,
    /// one block per tile and run of the split of [`Windows::dw_gemm`] (grid `(⌈C·K/64⌉,
    /// ⌈A/64⌉, runs)`, 256 threads); split, the runs go to a workspace that
    /// `tl_gemm_sum_splits` adds, as the GEMM's runs do ([`CudaDevice::with_split_runs`]).
    /// Under autocast `tl_conv_implicit_dw_tc`, the tensor-core kernel: 128×128 tiles, the
    /// split counting them ([`crate::device::split_tile`]), the precision's code appended.
    pub(super) fn conv_implicit_dw_impl(
        &mut self,
        g: Buffer,
        x: Buffer,
        win: &Windows,
        out_channels: usize,
        l: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "conv_implicit_dw";
        let (pg, px) = (self.ptr(OP, g)?, self.ptr(OP, x)?);
        let gm = win.dw_gemm(out_channels);
        let prec = crate::precision::current();
        let side = crate::device::split_tile(prec);
        let (kernel, code) = match super::kernel_code(prec) {
            0 => ("tl_conv_implicit_dw", None),
            code => ("tl_conv_implicit_dw_tc", Some(code)),
        };
        let (mn, kc, splits) = (
            gm.m * gm.n,
            gm.k_chunk_tiled(1, side),
            gm.k_splits_tiled(1, side),
        );
        let gy = gm.m.div_ceil(side);
        if gy > 65_535 {
            return Err(Error::kernel(
                OP,
                format!("{} channels exceed the grid limit 65535·{side}", gm.m),
            ));
        }
        let gx = abi::to_u32(OP, "grid", gm.n.div_ceil(side))?;
        // `Device::conv_implicit_dw` holds the cotangent's and the result's lengths to u32, so
        // k = batch·small (a factor of the cotangent's length where the result is not empty),
        // kc ≤ max(k, 1) and splits ≤ SPLIT_K_MAX are u32 too.
        let mut extra = geo_args(win, &l);
        extra.extend([Arg::U32(out_channels as u32), Arg::U32(kc as u32)]);
        extra.extend(code.map(Arg::U32));
        let grid = [gx, gy as u32, splits as u32];
        let run = move |d: &mut Self, dst: u64| {
            let mut args = vec![Arg::Ptr(pg), Arg::Ptr(px), Arg::Ptr(dst)];
            args.extend(extra);
            d.run_blocks_of(OP, kernel, grid, 256, &args)
        };
        self.with_out(OP, mn, |d, out| {
            if mn == 0 {
                Ok(())
            } else if splits == 1 {
                run(d, out)
            } else {
                d.with_split_runs(OP, out, false, Batch::plain(1), gm, splits, run)
            }
        })
    }

    /// The launch the forward and input-cotangent kernels share: `kernel.1(ins..., out,
    /// geometry..., last...)` (`last`: the output channels, then what the kernel adds) over a
    /// fresh output of `rows·cols` elements, one block of 256 threads per `side`×`side` tile
    /// (`kernel.2`; grid `(⌈cols/side⌉, ⌈rows/side⌉)`).
    fn implicit_launch(
        &mut self,
        (op, kernel, side): (&'static str, &'static str, usize),
        ins: [Buffer; 2],
        (rows, cols): (usize, usize),
        win: &Windows,
        l: WindowLens,
        last: &[u32],
    ) -> Result<Buffer> {
        let mut args = vec![
            Arg::Ptr(self.ptr(op, ins[0])?),
            Arg::Ptr(self.ptr(op, ins[1])?),
        ];
        let gy = rows.div_ceil(side);
        if gy > 65_535 {
            return Err(Error::kernel(
                op,
                format!("{rows} channels exceed the grid limit 65535·{side}"),
            ));
        }
        // rows·cols is the output's length, and `Windows::check` / the `Device` method hold
        // every count to u32.
        let n = rows * cols;
        let gx = abi::to_u32(op, "grid", cols.div_ceil(side))?;
        let mut extra = geo_args(win, &l);
        extra.extend(last.iter().map(|&v| Arg::U32(v)));
        self.with_out(op, n, |d, out| {
            if n == 0 {
                return Ok(());
            }
            args.push(Arg::Ptr(out));
            args.extend(extra);
            d.run_blocks_of(op, kernel, [gx, gy as u32, 1], 256, &args)
        })
    }

    pub(super) fn col2im_impl(
        &mut self,
        cols: Buffer,
        w: &Windows,
        l: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "col2im";
        let pc = self.ptr(OP, cols)?;
        let kernels = ("tl_col2im", "tl_col2im_atomic");
        self.scatter_to_big(OP, kernels, &[pc], &l, l.cols_len(), &geo_args(w, &l))
    }

    pub(super) fn pool_impl(
        &mut self,
        x: Buffer,
        w: &Windows,
        kind: PoolKind,
        l: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "pool";
        let px = self.ptr(OP, x)?;
        let extra = pool_args(w, &l, kind);
        self.with_out(OP, l.small_len(), |d, out| {
            d.grid_stride(
                OP,
                "tl_pool",
                l.small_len(),
                &[Arg::Ptr(px), Arg::Ptr(out)],
                &extra,
            )
        })
    }

    pub(super) fn pool_bwd_impl(
        &mut self,
        x: Buffer,
        g: Buffer,
        w: &Windows,
        kind: PoolKind,
        l: WindowLens,
    ) -> Result<Buffer> {
        const OP: &str = "pool_bwd";
        let (px, pg) = (self.ptr(OP, x)?, self.ptr(OP, g)?);
        let kernels = ("tl_pool_bwd", "tl_pool_bwd_atomic");
        let extra = pool_args(w, &l, kind);
        self.scatter_to_big(OP, kernels, &[px, pg], &l, l.small_len(), &extra)
    }

    /// The launch set-up `col2im` and `pool_bwd` share: a fresh output of `l.big_len()`
    /// elements, written by `kernels.0(ins..., out, n, extra...)`, the gather kernel (one thread
    /// per output element, fixed order), in deterministic mode; otherwise zeroed first and then
    /// scattered into by `kernels.1`, the `atomicAdd` kernel, one thread per each of the
    /// `n_src` source elements.
    fn scatter_to_big(
        &mut self,
        op: &'static str,
        kernels: (&'static str, &'static str),
        ins: &[u64],
        l: &WindowLens,
        n_src: usize,
        extra: &[Arg],
    ) -> Result<Buffer> {
        let n_out = l.big_len();
        let (kernel, n, zero_first) = if self.deterministic() {
            (kernels.0, n_out, false)
        } else {
            (kernels.1, n_src, true)
        };
        let mut ptrs: Vec<Arg> = ins.iter().map(|&p| Arg::Ptr(p)).collect();
        self.with_out(op, n_out, |d, out| {
            if zero_first {
                d.grid_stride(op, "tl_full", n_out, &[Arg::Ptr(out)], &[Arg::F32(0.0)])?;
            }
            ptrs.push(Arg::Ptr(out));
            d.grid_stride(op, kernel, n, &ptrs, extra)
        })
    }
}
