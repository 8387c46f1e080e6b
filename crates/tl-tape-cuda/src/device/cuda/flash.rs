//! The fused attention on the CUDA device (kernels/attention.cu): `tl_flash_fwd` forward,
//! `tl_flash_bwd_q` then `tl_flash_bwd_kv` backward, operands already checked by
//! [`Device`]'s provided methods ([`Flash`]'s checks). No atomics: both reduction modes run the
//! sim's order. The mask's words (if its mode has any) go up per launch and are released on
//! every path.

use super::CudaDevice;
use super::driver::Arg;
use crate::Result;
use crate::device::{Buffer, Device, FLASH_TILE, Flash, FlashTiles};

/// Blocks of a launch over `jobs` blocks of work (grid-stride beyond 65 535).
fn grid(jobs: usize) -> [u32; 3] {
    [jobs.clamp(1, 65_535) as u32, 1, 1]
}

/// Query rows per block of `tl_flash_fwd` (kernels/attention.cu `tl_fa_fwd`): 64 when
/// d ≤ 64, else 32.
fn fwd_rows(f: &Flash) -> usize {
    if f.dims.d <= 64 { 64 } else { 32 }
}

/// Bytes of dynamic shared memory of `tl_flash_fwd_wide`: `TL_FA_FWD_SMEM(64, 64, 64)` floats
/// (kernels/attention.cu: Q^T, K^T or V, the scores, three (tile, row) arrays of four tiles, m
/// and l; the emulator's guard zones catch a kernel that uses more).
const FWD_WIDE_SMEM_BYTES: u32 = 4 * (3 * 64 * 64 + 3 * 4 * 64 + 2 * 64);

/// Query rows (keys) per block of `tl_flash_bwd_q` (`tl_flash_bwd_kv`): 64 when d ≤ 64
/// (`tl_fa_bwd_q64`, `tl_fa_bwd_kv64`), else one tile of [`FLASH_TILE`].
fn bwd_rows(f: &Flash) -> usize {
    if f.dims.d <= 64 { 64 } else { FLASH_TILE }
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

    /// The sizes, mode and scale every fused attention kernel takes last (checked for the ABI
    /// by [`Flash::check_forward`]).
    fn flash_tail(f: &Flash) -> [Arg; 6] {
        let d = f.dims;
        [
            Arg::U32(d.batch as u32),
            Arg::U32(d.n as u32),
            Arg::U32(d.heads as u32),
            Arg::U32(d.d as u32),
            Arg::U32(f.mask.mode),
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
                o = Some(d.with_out(OP, f.dims.qkv_len(), |d, out| {
                    let mut args = vec![
                        Arg::Ptr(pq),
                        Arg::Ptr(pk),
                        Arg::Ptr(pv),
                        Arg::Ptr(pm),
                        Arg::Ptr(out),
                        Arg::Ptr(lse),
                    ];
                    args.extend(Self::flash_tail(f));
                    let jobs = grid(f.dims.blocks(fwd_rows(f)));
                    if d.flash_tiles == FlashTiles::Wide && f.dims.d <= 64 {
                        d.run_shared(OP, "tl_flash_fwd_wide", jobs, FWD_WIDE_SMEM_BYTES, &args)
                    } else {
                        d.run(OP, "tl_flash_fwd", jobs, &args)
                    }
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
            let r = d.flash_bwd_launches(p, pm, pd, f);
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
        let jobs = grid(f.dims.blocks(bwd_rows(f)));
        let [dq] = self.with_outs::<1>(OP, f.dims.qkv_len(), |d, [dq]| {
            let mut args = [pq, pk, pv, po, pg, pl, pm, dq, pd].map(Arg::Ptr).to_vec();
            args.extend(tail);
            d.run(OP, "tl_flash_bwd_q", jobs, &args)
        })?;
        let kv = self.with_outs::<2>(OP, f.dims.qkv_len(), |d, [dk, dv]| {
            let mut args = [pq, pk, pv, pg, pl, pd, pm, dk, dv].map(Arg::Ptr).to_vec();
            args.extend(tail);
            d.run(OP, "tl_flash_bwd_kv", jobs, &args)
        });
        match kv {
            Ok([dk, dv]) => Ok([dq, dk, dv]),
            Err(e) => {
                self.release(dq);
                Err(e)
            }
        }
    }
}
