//! The fused attention on the CUDA device (kernels/attention.cu): `tl_flash_fwd` forward;
//! backward `tl_flash_bwd_q` then `tl_flash_bwd_kv` (the sim's order, no atomics), or, where
//! [`gates::flash_bwd_one_pass`] says so (deterministic reductions off, d ≤ 64:
//! [`FLASH_ONE_PASS_MAX_HEAD`](crate::device::FLASH_ONE_PASS_MAX_HEAD)), `tl_flash_bwd_delta`
//! then `tl_flash_bwd_atomic` (one pass over the key blocks, dQ added with `atomicAdd`).
//! Operands already checked by [`Device`]'s provided methods ([`Flash`]'s checks). The mask's
//! words (if its mode has any: one element's, or every batch element's back to back) go up per
//! launch and are released on every path.

use super::CudaDevice;
use super::driver::Arg;
use crate::Result;
use crate::device::flash::{FLASH_OUT, FLASH_STATS};
use crate::device::{Buffer, Device, FLASH_TILE, Flash, FlashProducts, FlashTiles};
use crate::gates;

/// Blocks of a launch over `jobs` blocks of work (grid-stride beyond 65 535).
fn grid(jobs: usize) -> [u32; 3] {
    [jobs.clamp(1, 65_535) as u32, 1, 1]
}

/// The fused attention's launches.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// `O` and the log-sum-exp.
    Forward,
    /// dQ and delta.
    BackwardQ,
    /// dK and dV.
    BackwardKv,
    /// The one-pass backward's first launch: delta, and dQ zeroed (one thread per row).
    BackwardDelta,
    /// The one-pass backward: dK and dV per block of 64 keys, dQ added with `atomicAdd`.
    BackwardAtomic,
}

/// Threads of a block (`TL_BLOCK`): `tl_flash_bwd_delta`'s rows per block.
const BLOCK: usize = 256;

/// Dynamic shared memory of `tl_flash_fwd_tc`, bytes (`TL_FA_TC_SMEM` floats: Q of 128 rows,
/// K and V of 64 keys, each warp's scores and outputs, rows of `TL_FA_TC_LD` = 68 floats; each
/// warp's m, l and alpha of its 16 rows and a slot a lane).
const FWD_TC_SMEM_BYTES: u32 = 4 * ((128 + 2 * 64 + 2 * 128) * 68 + 5 * 128);

/// Dynamic shared memory of `tl_flash_bwd_q_tc` and `tl_flash_bwd_kv_tc`, bytes
/// (`TL_FA_TC_BWD_SMEM` floats: two operands of 128 rows and two of 64, rows of 68 floats;
/// each warp's two 16 × 16 tiles, rows of 20; two values of each of 128 rows).
const BWD_TC_SMEM_BYTES: u32 = 4 * ((2 * 128 + 2 * 64) * 68 + 8 * 2 * 16 * 20 + 2 * 128);

impl Phase {
    /// Whether the phase's blocks take keys (dK, dV) rather than query rows.
    fn over_keys(self) -> bool {
        matches!(self, Phase::BackwardKv | Phase::BackwardAtomic)
    }
}

/// The kernel a phase runs for `f` under `tiles`, the query rows (keys) each of its blocks
/// takes, and its bytes of dynamic shared memory (0: static arrays only); kernels/attention.cu
/// says how each tiles its work. The narrow kernels: the forward on 64 query rows when d ≤ 64,
/// else 32; the backward on 64 rows (keys) when d ≤ 64 (`tl_fa_bwd_q64`, `tl_fa_bwd_kv64`),
/// else one tile of [`FLASH_TILE`]. `FlashTiles::Wide`: the forward's 64 keys a step where
/// d ≤ 64 (`TL_FA_FWD_SMEM(64, 64, 64)` floats: Q^T, K^T or V, the scores, three (tile, row)
/// arrays of four tiles, m and l), and for d > 64 dQ on 64 rows (`TL_FA_BWD_Q_SMEM(128)`: Q
/// and dO of 64 rows, K and V of 32) and dK/dV on 32 keys (`TL_FA_BWD_KV_SMEM(32, 128)`: K
/// and V, a tile of 16 Q and dO rows, P and dS). The emulator's guard zones catch a kernel
/// that uses more than it is given. The one-pass backward (d ≤ 64 only, whatever `tiles`):
/// `tl_flash_bwd_delta` one row a thread, `tl_flash_bwd_atomic` 64 keys a block in the static
/// arrays of `tl_flash_bwd_kv`. [`FlashProducts::Tf32x3`] (d ≤ 64, checked before): the
/// forward and the two backward kernels on the tensor cores (`tl_flash_fwd_tc`,
/// `tl_flash_bwd_q_tc`, `tl_flash_bwd_kv_tc`), 128 query rows or keys a block (whatever
/// `tiles`).
fn kernel(tiles: FlashTiles, f: &Flash, phase: Phase) -> (&'static str, usize, u32) {
    let (wide, small) = (tiles.wide_for(f.dims.d), f.dims.d <= 64);
    let tc = f.products == FlashProducts::Tf32x3;
    match phase {
        Phase::Forward if tc => ("tl_flash_fwd_tc", 128, FWD_TC_SMEM_BYTES),
        Phase::BackwardQ if tc => ("tl_flash_bwd_q_tc", 128, BWD_TC_SMEM_BYTES),
        Phase::BackwardKv if tc => ("tl_flash_bwd_kv_tc", 128, BWD_TC_SMEM_BYTES),
        Phase::Forward if wide && small => (
            "tl_flash_fwd_wide",
            64,
            4 * (3 * 64 * 64 + 3 * 4 * 64 + 2 * 64),
        ),
        Phase::Forward => ("tl_flash_fwd", if small { 64 } else { 32 }, 0),
        Phase::BackwardQ if wide && !small => {
            ("tl_flash_bwd_q_wide", 64, 4 * (2 * 64 + 2 * 32) * 128)
        }
        Phase::BackwardQ => ("tl_flash_bwd_q", if small { 64 } else { FLASH_TILE }, 0),
        Phase::BackwardKv if wide && !small => (
            "tl_flash_bwd_kv_wide",
            32,
            4 * (2 * 32 * 128 + 2 * 16 * 128 + 2 * 16 * 32),
        ),
        Phase::BackwardKv => ("tl_flash_bwd_kv", if small { 64 } else { FLASH_TILE }, 0),
        Phase::BackwardDelta => ("tl_flash_bwd_delta", BLOCK, 0),
        Phase::BackwardAtomic => ("tl_flash_bwd_atomic", 64, 0),
    }
}

impl CudaDevice {
    /// Run `body` with the address of the mask's words (uploaded for the call; `fallback`,
    /// which the kernels never read, when the mode has none), then release them.
    fn with_mask<R>(
        &mut self,
        op: &'static str,
        f: &Flash,
        fallback: u64,
        body: impl FnOnce(&mut Self, u64) -> Result<R>,
    ) -> Result<R> {
        if f.mask.words.is_empty() {
            return body(self, fallback);
        }
        let bits: Vec<f32> = f.mask.words.iter().map(|&w| f32::from_bits(w)).collect();
        let buf = self.upload(&bits)?;
        let r = self.ptr(op, buf).and_then(|pm| body(self, pm));
        self.release(buf);
        r
    }

    /// Launch `phase`'s kernel for `f` under this device's [`FlashTiles`] ([`kernel`]): its
    /// blocks over the query rows, or over the keys of each key head for dK and dV.
    fn run_flash(&mut self, op: &'static str, f: &Flash, phase: Phase, args: &[Arg]) -> Result<()> {
        let (name, rows, shared) = kernel(self.flash_tiles, f, phase);
        let blocks = match phase.over_keys() {
            true => f.dims.key_blocks(rows),
            false => f.dims.query_blocks(rows),
        };
        self.run_shared(op, name, grid(blocks), shared, args)
    }

    /// What every fused attention kernel but `tl_flash_bwd_delta` takes last: `batch, nq, nk,
    /// heads, kv_heads, d, mode, offset, mstride, scale` (`mode` [`Flash::mode`]: the mask's
    /// bits and the autocast rounding; checked for the ABI by
    /// [`Flash::check_forward`]: the sizes and the mask's words within `u32`, kv_heads dividing
    /// heads, the offset within `i32`; `mstride` the mask's
    /// [`stride`](crate::device::FlashMask::stride), 0 for a mask shared by every batch
    /// element).
    fn flash_tail(f: &Flash) -> [Arg; 10] {
        let d = f.dims;
        [
            Arg::U32(d.batch as u32),
            Arg::U32(d.nq as u32),
            Arg::U32(d.nk as u32),
            Arg::U32(d.heads as u32),
            Arg::U32(d.kv_heads as u32),
            Arg::U32(d.d as u32),
            Arg::U32(f.mode()),
            Arg::I32(f.mask.offset as i32),
            Arg::U32(f.mask.stride() as u32),
            Arg::F32(d.scale()),
        ]
    }

    pub(super) fn flash_fwd_impl(
        &mut self,
        qkv: [Buffer; 3],
        f: &Flash,
    ) -> Result<(Buffer, Buffer)> {
        const OP: &str = "flash_attention";
        let [pq, pk, pv] = [0, 1, 2].map(|i| self.ptr(OP, qkv[i]));
        let (pq, pk, pv) = (pq?, pk?, pv?);
        let mut o = None;
        let lse = self.with_mask(OP, f, pq, |d, pm| {
            d.with_out(OP, f.dims.rows_len(), |d, lse| {
                o = Some(d.with_out(OP, f.dims.q_len(), |d, out| {
                    let mut args = vec![
                        Arg::Ptr(pq),
                        Arg::Ptr(pk),
                        Arg::Ptr(pv),
                        Arg::Ptr(pm),
                        Arg::Ptr(out),
                        Arg::Ptr(lse),
                    ];
                    args.extend(Self::flash_tail(f));
                    d.run_flash(OP, f, Phase::Forward, &args)
                })?);
                Ok(())
            })
        })?;
        match o {
            Some(o) => Ok((o, lse)),
            None => {
                self.release(lse);
                Err(crate::Error::kernel(OP, "the output was not allocated"))
            }
        }
    }

    /// `tl_flash_fwd` in one of autocast's passes, the one buffer it writes: with `lse`,
    /// `FLASH_OUT` (O from the lse, which the kernel reads); without, `FLASH_STATS` (lse alone:
    /// the kernel gets Q's address for O, which it never writes).
    pub(super) fn flash_pass_impl(
        &mut self,
        qkv: [Buffer; 3],
        lse: Option<Buffer>,
        f: &Flash,
    ) -> Result<Buffer> {
        const OP: &str = "flash_attention";
        let [pq, pk, pv] = [0, 1, 2].map(|i| self.ptr(OP, qkv[i]));
        let (pq, pk, pv) = (pq?, pk?, pv?);
        let pl = lse.map(|b| self.ptr(OP, b)).transpose()?;
        let (bit, len) = match pl {
            Some(_) => (FLASH_OUT, f.dims.q_len()),
            None => (FLASH_STATS, f.dims.rows_len()),
        };
        self.with_mask(OP, f, pq, |d, pm| {
            d.with_out(OP, len, |d, out| {
                let (po, pl) = pl.map_or((pq, out), |pl| (out, pl));
                let mut args = [pq, pk, pv, pm, po, pl].map(Arg::Ptr).to_vec();
                let mut tail = Self::flash_tail(f);
                tail[6] = Arg::U32(f.mode() | bit);
                args.extend(tail);
                d.run_flash(OP, f, Phase::Forward, &args)
            })
        })
    }

    pub(super) fn flash_bwd_impl(
        &mut self,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        const OP: &str = "flash_attention_bwd";
        let mut p = [0u64; 6];
        for (slot, b) in p.iter_mut().zip([qkv[0], qkv[1], qkv[2], o, go, lse]) {
            *slot = self.ptr(OP, b)?;
        }
        self.with_mask(OP, f, p[0], |d, pm| {
            let (delta, pd) = d.alloc(OP, f.dims.rows_len())?;
            // The tensor cores' backward is the two fixed-order kernels in either mode.
            let tc = f.products == FlashProducts::Tf32x3;
            let r = if !tc && gates::flash_bwd_one_pass(d.deterministic(), f.dims.d) {
                d.flash_bwd_one_pass(p, pm, pd, f)
            } else {
                d.flash_bwd_launches(p, pm, pd, f)
            };
            d.release(delta);
            r
        })
    }

    /// `tl_flash_bwd_q` (dQ, and delta into `pd`) then `tl_flash_bwd_kv` (dK, dV), `p` the
    /// addresses of Q, K, V, O, dO and lse, `pm` the mask's.
    fn flash_bwd_launches(
        &mut self,
        p: [u64; 6],
        pm: u64,
        pd: u64,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        const OP: &str = "flash_attention_bwd";
        let [pq, pk, pv, po, pg, pl] = p;
        let tail = Self::flash_tail(f);
        let [dq] = self.with_outs::<1>(OP, f.dims.q_len(), |d, [dq]| {
            let mut args = [pq, pk, pv, po, pg, pl, pm, dq, pd].map(Arg::Ptr).to_vec();
            args.extend(tail);
            d.run_flash(OP, f, Phase::BackwardQ, &args)
        })?;
        let kv = self.with_outs::<2>(OP, f.dims.kv_len(), |d, [dk, dv]| {
            let mut args = [pq, pk, pv, pg, pl, pd, pm, dk, dv].map(Arg::Ptr).to_vec();
            args.extend(tail);
            d.run_flash(OP, f, Phase::BackwardKv, &args)
        });
        match kv {
            Ok([dk, dv]) => Ok([dq, dk, dv]),
            Err(e) => {
                self.release(dq);
                Err(e)
            }
        }
    }

    /// `tl_flash_bwd_delta` (delta into `pd`, dQ zeroed) then `tl_flash_bwd_atomic` (dK, dV,
    /// and dQ added over the key blocks with `atomicAdd`): the one-pass backward, d ≤
    /// [`FLASH_ONE_PASS_MAX_HEAD`](crate::device::FLASH_ONE_PASS_MAX_HEAD); `p` and `pm` as
    /// [`Self::flash_bwd_launches`].
    fn flash_bwd_one_pass(
        &mut self,
        p: [u64; 6],
        pm: u64,
        pd: u64,
        f: &Flash,
    ) -> Result<[Buffer; 3]> {
        const OP: &str = "flash_attention_bwd";
        let [pq, pk, pv, po, pg, pl] = p;
        let tail = Self::flash_tail(f);
        let dims = f.dims;
        let mut kv = None;
        let [dq] = self.with_outs::<1>(OP, dims.q_len(), |d, [dq]| {
            let delta_tail = [dims.batch, dims.nq, dims.heads, dims.d].map(|v| Arg::U32(v as u32));
            let mut args = [po, pg, dq, pd].map(Arg::Ptr).to_vec();
            args.extend(delta_tail);
            d.run_flash(OP, f, Phase::BackwardDelta, &args)?;
            kv = Some(d.with_outs::<2>(OP, dims.kv_len(), |d, [dk, dv]| {
                let mut args = [pq, pk, pv, pg, pl, pd, pm, dq, dk, dv]
                    .map(Arg::Ptr)
                    .to_vec();
                args.extend(tail);
                d.run_flash(OP, f, Phase::BackwardAtomic, &args)
            })?);
            Ok(())
        })?;
        match kv {
            Some([dk, dv]) => Ok([dq, dk, dv]),
            None => {
                self.release(dq);
                Err(crate::Error::kernel(OP, "dK and dV were not allocated"))
            }
        }
    }
}

#[cfg(all(test, feature = "cuda-emu"))]
mod tests {
    //! Which backward runs, on the kernel emulator: the kernels a fresh device resolved.
    use super::*;
    use crate::device::{FlashDims, FlashMask};

    /// The `tl_flash_bwd*` kernels a fresh device with reductions `deterministic` resolves for
    /// one backward of head size `d` under the override `force`, sorted; the backward is two
    /// launches either way.
    fn bwd_kernels(deterministic: bool, force: Option<bool>, d: usize) -> Vec<&'static str> {
        let _gate = gates::force_flash_bwd_one_pass(force);
        let mut dev = CudaDevice::new().unwrap();
        dev.set_deterministic(Some(deterministic));
        let dims = FlashDims {
            batch: 1,
            nq: 20,
            nk: 20,
            heads: 2,
            kv_heads: 2,
            d,
        };
        let f = Flash::new(dims, FlashMask::none());
        let x = dev.upload(&vec![0.25; f.dims.q_len()]).unwrap();
        let (o, lse) = dev.flash_attention([x, x, x], &f).unwrap();
        let before = dev.traffic().launches;
        let [dq, dk, dv] = dev.flash_attention_bwd([x, x, x], o, lse, x, &f).unwrap();
        assert_eq!(dev.traffic().launches - before, 2, "d = {d}");
        dev.release_all([x, o, lse, dq, dk, dv]);
        assert_eq!(dev.memory_usage().live_bytes, 0);
        let mut names: Vec<&'static str> = dev
            .funcs
            .keys()
            .copied()
            .filter(|k| k.starts_with("tl_flash_bwd"))
            .collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn the_backward_follows_the_reduction_mode_the_gate_and_the_head_size() {
        let one = ["tl_flash_bwd_atomic", "tl_flash_bwd_delta"];
        let two = ["tl_flash_bwd_kv", "tl_flash_bwd_q"];
        // Past heads of 64 the default tiling (`FlashTiles::Auto`) takes the wide kernels.
        let two_wide = ["tl_flash_bwd_kv_wide", "tl_flash_bwd_q_wide"];
        assert_eq!(bwd_kernels(false, None, 64), one, "atomics allowed");
        assert_eq!(bwd_kernels(true, None, 64), two, "deterministic");
        assert_eq!(bwd_kernels(false, None, 65), two_wide, "a head over 64");
        assert_eq!(bwd_kernels(true, Some(true), 8), one, "forced on");
        assert_eq!(bwd_kernels(false, Some(false), 8), two, "forced off");
        assert_eq!(
            bwd_kernels(true, Some(true), 65),
            two_wide,
            "forced, but the head is too big"
        );
    }
}
