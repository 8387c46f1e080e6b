//! The norm family on the CUDA device (kernels/norm.cu): one launch per primitive, its operands
//! already checked by [`Device`]'s provided methods ([`NormLayout`]'s checks); where a layout's
//! sums are split over several blocks a group ([`NormLayout::split_parts`]), the chunk sums'
//! launches first, into a workspace released after. No kernel of the family uses atomics, so
//! deterministic mode changes nothing here (the sim's order is the only order).
//!
//! The kernels that normalize take [`NormLayout::centred`] (0 for rmsNorm: last, but before
//! the split kernels' parts and chunk, and `tl_norm_split_finish`'s `moments`); where it is
//! 0, the β pointer is γ's (checked by [`NormLayout::check_beta`]): a live allocation, never
//! read.

use super::CudaDevice;
use super::driver::Arg;
use super::launch::blocks;
use crate::Result;
use crate::device::{Buffer, Device, MaskedRows, NormLayout};

/// Blocks of a one-block-per-group (or per-row) launch.
fn per_group(n: usize) -> u32 {
    n.clamp(1, 65_535) as u32
}

/// A split layout's parts and the arguments `outer, groups, seg, parts, chunk` of the
/// `tl_norm_split_*` kernels: `parts` chunks of `chunk = ⌈m/parts⌉` elements a group. All
/// u32: `check_x` holds the dims and m within x's u32 length, and
/// [`NORM_SPLIT_MAX_PARTS`](crate::device::norm::NORM_SPLIT_MAX_PARTS) bounds the parts.
fn split_geometry(l: NormLayout) -> (u32, [Arg; 5]) {
    let parts = l.split_parts();
    let chunk = l.group_len().div_ceil(parts);
    let p = parts as u32;
    (
        p,
        [
            Arg::U32(l.outer as u32),
            Arg::U32(l.groups as u32),
            Arg::U32(l.seg as u32),
            Arg::U32(p),
            Arg::U32(chunk as u32),
        ],
    )
}

impl CudaDevice {
    /// `tl_norm_stats`, one block per group, or the split sums ([`Self::split_moments`]).
    pub(super) fn norm_stats_impl(&mut self, x: Buffer, l: NormLayout, eps: f32) -> Result<Buffer> {
        if l.split_parts() > 1 {
            return self.split_moments("norm_stats", x, l, eps, false);
        }
        let tail = [Arg::F32(eps), Arg::U32(u32::from(l.centred))];
        self.per_group_moments("norm_stats", "tl_norm_stats", x, l, &tail)
    }

    /// `tl_norm_moments` (`batchMoments`), one block per group, or the split sums
    /// ([`Self::split_moments`]).
    pub(super) fn norm_moments_impl(&mut self, x: Buffer, l: NormLayout) -> Result<Buffer> {
        if l.split_parts() > 1 {
            let l = NormLayout { centred: true, ..l };
            return self.split_moments("norm_moments", x, l, 0.0, true);
        }
        self.per_group_moments("norm_moments", "tl_norm_moments", x, l, &[])
    }

    /// The statistics (or, with `moments`, `batchMoments`' means and variances) of a layout
    /// whose sums are split: `tl_norm_split_mean` (centred layouts) and `tl_norm_split_sq`
    /// over grids of (parts, groups) blocks into two workspaces of `parts` sums a group, then
    /// `tl_norm_split_finish`, one thread a group.
    fn split_moments(
        &mut self,
        op: &'static str,
        x: Buffer,
        l: NormLayout,
        eps: f32,
        moments: bool,
    ) -> Result<Buffer> {
        let px = self.ptr(op, x)?;
        let (parts, geo) = split_geometry(l);
        let grid = [parts, l.groups as u32, 1];
        let centred = u32::from(l.centred);
        let len = parts as usize * l.groups;
        self.with_workspace(op, len, |d, mean| {
            d.with_workspace(op, len, |d, sq| {
                if l.centred {
                    let mut args = vec![Arg::Ptr(px), Arg::Ptr(mean)];
                    args.extend(geo);
                    d.run(op, "tl_norm_split_mean", grid, &args)?;
                }
                // Where not centred the mean's workspace is a live pointer never read.
                let mut args = vec![Arg::Ptr(px), Arg::Ptr(mean), Arg::Ptr(sq)];
                args.extend(geo);
                args.push(Arg::U32(centred));
                d.run(op, "tl_norm_split_sq", grid, &args)?;
                d.with_out(op, 2 * l.groups, |d, o| {
                    let ptrs = [px, mean, sq, o].map(Arg::Ptr);
                    // check_x holds m = outer·seg within x's u32 length.
                    let extra = [
                        Arg::U32(l.seg as u32),
                        Arg::U32(l.group_len() as u32),
                        Arg::U32(parts),
                        Arg::F32(eps),
                        Arg::U32(centred),
                        Arg::U32(u32::from(moments)),
                    ];
                    d.grid_stride(op, "tl_norm_split_finish", l.groups, &ptrs, &extra)
                })
            })
        })
    }

    /// One block per group of x: `kernel` (`tl_norm_stats` with `tail` = `eps, centred`,
    /// `tl_norm_moments` without) writes two values per group.
    fn per_group_moments(
        &mut self,
        op: &'static str,
        kernel: &'static str,
        x: Buffer,
        l: NormLayout,
        tail: &[Arg],
    ) -> Result<Buffer> {
        let px = self.ptr(op, x)?;
        self.with_out(op, 2 * l.groups, |d, out| {
            if l.groups == 0 {
                return Ok(());
            }
            let mut args = vec![
                Arg::Ptr(px),
                Arg::Ptr(out),
                Arg::U32(l.outer as u32),
                Arg::U32(l.groups as u32),
                Arg::U32(l.seg as u32),
            ];
            args.extend_from_slice(tail);
            d.run(op, kernel, [per_group(l.groups), 1, 1], &args)
        })
    }

    /// `tl_running_update_moments`, grid-stride over the `n` channels: both statistics in one
    /// launch, the unbiased correction's numerator and denominator in f64 (a denominator of 0
    /// keeps the running variance: one element per channel).
    pub(super) fn running_update_moments_impl(
        &mut self,
        mean: Buffer,
        var: Buffer,
        moments: Buffer,
        momentum: f64,
        count: usize,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "running_update_moments";
        let (num, den) = match count {
            c if c > 1 => (c as f64, (c - 1) as f64),
            _ => (0.0, 0.0),
        };
        let n = mean.len();
        let ptrs = [mean, var, moments]
            .iter()
            .map(|&b| self.ptr(OP, b))
            .collect::<Result<Vec<_>>>()?;
        let extra = [Arg::F64(momentum), Arg::F64(num), Arg::F64(den)];
        let [m, v] = self.with_outs::<2>(OP, n, |d, [om, ov]| {
            let args = [ptrs[0], ptrs[1], ptrs[2], om, ov].map(Arg::Ptr);
            d.grid_stride(OP, "tl_running_update_moments", n, &args, &extra)
        })?;
        Ok((m, v))
    }

    /// `tl_norm_moments_bwd`, grid-stride over x's elements.
    pub(super) fn norm_moments_bwd_impl(
        &mut self,
        x: Buffer,
        moments: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_moments_bwd";
        let n = x.len();
        let ptrs = [x, moments, g]
            .iter()
            .map(|&b| self.ptr(OP, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        // check_x bounds outer·seg by x's length, which fits a u32.
        let extra = [
            Arg::U32(l.groups as u32),
            Arg::U32(l.seg as u32),
            Arg::U32(l.group_len() as u32),
        ];
        self.with_out(OP, n, |d, out| {
            let mut p = ptrs.clone();
            p.push(Arg::Ptr(out));
            d.grid_stride(OP, "tl_norm_moments_bwd", n, &p, &extra)
        })
    }

    /// `tl_norm_fwd`, for the short groups of [`NormLayout::fused_forward`].
    pub(super) fn norm_forward_impl(
        &mut self,
        x: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
        eps: f32,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_forward";
        let ptrs = [x, gamma, beta]
            .iter()
            .map(|&b| self.ptr(OP, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        let mut y = None;
        let st = self.with_out(OP, 2 * l.groups, |d, st| {
            y = Some(d.with_out(OP, x.len(), |d, out| {
                if l.groups == 0 {
                    return Ok(());
                }
                let mut args = ptrs;
                args.extend([
                    Arg::Ptr(out),
                    Arg::Ptr(st),
                    Arg::U32(l.outer as u32),
                    Arg::U32(l.groups as u32),
                    Arg::U32(l.seg as u32),
                    Arg::U32(u32::from(l.per_column)),
                    Arg::F32(eps),
                    Arg::U32(u32::from(l.centred)),
                ]);
                d.run(OP, "tl_norm_fwd", [per_group(l.groups), 1, 1], &args)
            })?);
            Ok(())
        })?;
        match y {
            Some(y) => Ok((y, st)),
            None => {
                self.release(st);
                Err(crate::Error::kernel(OP, "the output was not allocated"))
            }
        }
    }

    pub(super) fn norm_apply_impl(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        beta: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_apply";
        let n = x.len();
        let ptrs = [x, stats, gamma, beta]
            .iter()
            .map(|&b| self.ptr(OP, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        let extra = [
            Arg::U32(l.groups as u32),
            Arg::U32(l.seg as u32),
            Arg::U32(u32::from(l.per_column)),
            Arg::U32(u32::from(l.centred)),
        ];
        self.with_out(OP, n, |d, out| {
            let mut p = ptrs.clone();
            p.push(Arg::Ptr(out));
            d.grid_stride(OP, "tl_norm_apply", n, &p, &extra)
        })
    }

    pub(super) fn norm_bwd_x_impl(
        &mut self,
        x: Buffer,
        stats: Buffer,
        gamma: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<Buffer> {
        const OP: &str = "norm_bwd_x";
        let n = x.len();
        let ptrs = [x, stats, gamma, g]
            .iter()
            .map(|&b| self.ptr(OP, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        if l.split_parts() > 1 {
            return self.split_bwd_x(&ptrs, n, l);
        }
        self.with_out(OP, n, |d, out| {
            if n == 0 {
                return Ok(());
            }
            let mut args = ptrs;
            args.extend([
                Arg::Ptr(out),
                Arg::U32(l.outer as u32),
                Arg::U32(l.groups as u32),
                Arg::U32(l.seg as u32),
                Arg::U32(u32::from(l.per_column)),
                Arg::U32(u32::from(l.centred)),
            ]);
            d.run(OP, "tl_norm_bwd_x", [per_group(l.groups), 1, 1], &args)
        })
    }

    /// `norm_bwd_x` of a layout whose sums are split: `tl_norm_split_bwd_sums` into a
    /// workspace of two sums a chunk, then `tl_norm_split_bwd_x`, both over (parts, groups)
    /// blocks. `ptrs`: x, the statistics, γ and g.
    fn split_bwd_x(&mut self, ptrs: &[Arg], n: usize, l: NormLayout) -> Result<Buffer> {
        const OP: &str = "norm_bwd_x";
        let (parts, [outer, groups, seg, _, chunk]) = split_geometry(l);
        let grid = [parts, l.groups as u32, 1];
        let layout = [
            outer,
            groups,
            seg,
            Arg::U32(u32::from(l.per_column)),
            Arg::U32(u32::from(l.centred)),
            Arg::U32(parts),
            chunk,
        ];
        self.with_workspace(OP, 2 * parts as usize * l.groups, |d, part| {
            let mut args = ptrs.to_vec();
            args.push(Arg::Ptr(part));
            args.extend(layout);
            d.run(OP, "tl_norm_split_bwd_sums", grid, &args)?;
            d.with_out(OP, n, |d, out| {
                let mut args = ptrs.to_vec();
                args.extend([Arg::Ptr(part), Arg::Ptr(out)]);
                args.extend(layout);
                d.run(OP, "tl_norm_split_bwd_x", grid, &args)
            })
        })
    }

    pub(super) fn norm_bwd_affine_impl(
        &mut self,
        x: Buffer,
        stats: Buffer,
        g: Buffer,
        l: NormLayout,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_bwd_affine";
        let ptrs = [x, stats, g]
            .iter()
            .map(|&b| self.ptr(OP, b).map(Arg::Ptr))
            .collect::<Result<Vec<_>>>()?;
        let nf = l.features();
        if l.affine_split() {
            return self.split_bwd_affine(&ptrs, l);
        }
        let [dg, db] = self.with_outs::<2>(OP, nf, |d, [dg, db]| {
            if nf == 0 {
                return Ok(());
            }
            let mut args = ptrs;
            args.extend([
                Arg::Ptr(dg),
                Arg::Ptr(db),
                Arg::U64(nf as u64),
                Arg::U32(l.outer as u32),
                Arg::U32(l.groups as u32),
                Arg::U32(l.seg as u32),
                Arg::U32(u32::from(l.per_column)),
                Arg::U32(u32::from(l.centred)),
            ]);
            if l.affine_by_block() {
                // One block per feature (at most AXIS_BLOCK_MAX_OUT of them).
                d.run(OP, "tl_norm_bwd_affine_block", [nf as u32, 1, 1], &args)
            } else {
                d.run(OP, "tl_norm_bwd_affine", [blocks(nf), 1, 1], &args)
            }
        })?;
        Ok((dg, db))
    }

    /// `norm_bwd_affine` where the features are the groups and their sums are split:
    /// `tl_norm_split_affine_sums` over (parts, groups) blocks into a workspace of two sums a
    /// chunk, then `tl_norm_split_affine_finish`, one thread a feature. `ptrs`: x, the
    /// statistics and g.
    fn split_bwd_affine(&mut self, ptrs: &[Arg], l: NormLayout) -> Result<(Buffer, Buffer)> {
        const OP: &str = "norm_bwd_affine";
        let (parts, [outer, groups, seg, _, chunk]) = split_geometry(l);
        let grid = [parts, l.groups as u32, 1];
        self.with_workspace(OP, 2 * parts as usize * l.groups, |d, part| {
            let mut args = ptrs.to_vec();
            args.push(Arg::Ptr(part));
            args.extend([
                outer,
                groups,
                seg,
                Arg::U32(u32::from(l.centred)),
                Arg::U32(parts),
                chunk,
            ]);
            d.run(OP, "tl_norm_split_affine_sums", grid, &args)?;
            let [dg, db] = d.with_outs::<2>(OP, l.groups, |d, [dg, db]| {
                let ptrs = [part, dg, db].map(Arg::Ptr);
                let extra = [Arg::U32(parts)];
                d.grid_stride(OP, "tl_norm_split_affine_finish", l.groups, &ptrs, &extra)
            })?;
            Ok((dg, db))
        })
    }

    pub(super) fn masked_softmax_rows_impl(
        &mut self,
        x: Buffer,
        mask: &[bool],
        l: MaskedRows,
    ) -> Result<Buffer> {
        const OP: &str = "masked_softmax_rows";
        let px = self.ptr(OP, x)?;
        // The mask travels as 0/1 floats in a temporary buffer, released on every path.
        let bits: Vec<f32> = mask.iter().map(|&a| if a { 1.0 } else { 0.0 }).collect();
        let pm_buf = self.upload(&bits)?;
        let r = self.ptr(OP, pm_buf).and_then(|pm| {
            self.with_out(OP, x.len(), |d, out| {
                if x.is_empty() {
                    return Ok(());
                }
                let args = [
                    Arg::Ptr(px),
                    Arg::Ptr(pm),
                    Arg::Ptr(out),
                    Arg::U32(l.rows as u32),
                    Arg::U32(l.n as u32),
                    Arg::U32(l.m as u32),
                    Arg::U32(l.group as u32),
                ];
                d.run(
                    OP,
                    "tl_masked_softmax_rows",
                    [per_group(l.rows), 1, 1],
                    &args,
                )
            })
        });
        self.release(pm_buf);
        r
    }
}
