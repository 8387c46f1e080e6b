//! The fused ("flash") attention core's geometry ([`FlashDims`]), its mask as the kernels read
//! it ([`FlashMask`]) and the argument checks shared by the simulation device and the CUDA
//! device (kernels/attention.cu; sim twin `sim/flash.rs`).
//!
//! Q, K, V, O and their cotangents are head-merged (B, n, H, d) buffers, the layout the
//! projections `x·W` leave (element (b, i, h, c) at `((b·n + i)·H + h)·d + c`); the row
//! statistics `lse` (and the backward's `delta`) hold one value per (b, h, i) at
//! `(b·H + h)·n + i`. Query rows and keys go in tiles of [`FLASH_TILE`] (the order of every
//! sum; the CUDA kernels take blocks of several tiles, [`FlashDims::blocks`]); the kernels hold
//! Q, K, V (and dO) rows in shared memory, so the head size is at most [`FLASH_MAX_HEAD`].

use super::{Buffer, check};
use crate::{Error, Result, abi};
use tl_spec::ops::attention::{Mask, MaskForm};

/// Query rows (and keys) per tile of the fused attention kernels (`TL_FA_T`).
pub const FLASH_TILE: usize = 16;

/// The largest head size `d` the fused attention kernels take (`TL_FA_DMAX`): their blocks of
/// Q, K, V and dO rows, each `d` floats, in 48 KiB of static shared memory.
/// Every d in `1..=128` is supported (not only multiples of 16); a larger head is an error
/// before launch (the composed path, `fused = false`, has no limit).
pub const FLASH_MAX_HEAD: usize = 128;

/// The largest head size the one-pass backward takes (`tl_flash_bwd_atomic`: the key block's
/// K and V, 64 floats a row, in the static shared memory of `tl_flash_bwd_kv`); larger heads
/// (up to [`FLASH_MAX_HEAD`]) run the two-kernel backward whatever the reduction mode
/// ([`crate::gates::flash_bwd_one_pass`]).
pub const FLASH_ONE_PASS_MAX_HEAD: usize = 64;

/// Mask mode bit: causal (key j ≤ query i) (`TL_FA_CAUSAL`).
pub const FLASH_CAUSAL: u32 = 1;
/// Mask mode bit: a keep flag per key (`TL_FA_KEEP`).
pub const FLASH_KEEP: u32 = 2;
/// Mask mode bit: the full (n, n) mask as bits (`TL_FA_BITS`).
pub const FLASH_BITS: u32 = 4;

/// The sizes of one fused attention core: `batch·heads` heads of `n` query rows and keys of
/// size `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashDims {
    /// Samples B.
    pub batch: usize,
    /// Sequence length n (queries and keys).
    pub n: usize,
    /// Heads H.
    pub heads: usize,
    /// Head size d (1..=[`FLASH_MAX_HEAD`]).
    pub d: usize,
}

impl FlashDims {
    /// Elements of Q (K, V, O, and each cotangent): `B·n·H·d`.
    pub fn qkv_len(&self) -> usize {
        self.batch * self.n * self.heads * self.d
    }

    /// Elements of `lse` (and `delta`): `B·H·n`.
    pub fn rows_len(&self) -> usize {
        self.batch * self.heads * self.n
    }

    /// `1/√d` as the kernels' f32 (the reference's `1/sqrt(d)` rounded once, as the composed
    /// path's scale).
    pub fn scale(&self) -> f32 {
        (1.0 / (self.d as f64).sqrt()) as f32
    }

    /// Blocks of one CUDA launch that take `rows` query rows (or keys) each:
    /// `B·H·⌈n/rows⌉` (the kernels grid-stride over them).
    pub fn blocks(&self, rows: usize) -> usize {
        self.batch * self.heads * self.n.div_ceil(rows)
    }

    /// Checked: n ≥ 1, `1 ≤ d ≤ FLASH_MAX_HEAD`, heads and batch ≥ 1, every count within the
    /// `u32` ABI. Returns `(qkv_len, rows_len)`.
    pub fn check(&self, op: &'static str) -> Result<(usize, usize)> {
        if self.d == 0 || self.d > FLASH_MAX_HEAD {
            return Err(Error::kernel(
                op,
                format!(
                    "head size d = {} is not supported by the fused attention kernels \
                     (d must be 1..={FLASH_MAX_HEAD}); use the composed path (fused = false)",
                    self.d
                ),
            ));
        }
        if self.n == 0 || self.heads == 0 || self.batch == 0 {
            return Err(Error::kernel(
                op,
                format!("empty attention: {self:?} (n, heads and batch must be ≥ 1)"),
            ));
        }
        for (what, v) in [
            ("batch", self.batch),
            ("n", self.n),
            ("heads", self.heads),
            ("d", self.d),
        ] {
            abi::to_u32(op, what, v)?;
        }
        let qkv = check::product(op, &[self.batch, self.n, self.heads, self.d])?;
        let rows = check::product(op, &[self.batch, self.heads, self.n])?;
        abi::len_u32(op, qkv)?;
        abi::len_u32(op, rows)?;
        Ok((qkv, rows))
    }
}

/// An attention mask as the fused kernels read it: a mode ([`FLASH_CAUSAL`], [`FLASH_KEEP`],
/// [`FLASH_BITS`]) and its words, uploaded per launch. A mask that is causal and/or a key
/// padding (entry (i, j) = `(j ≤ i or not causal) and keep[j]`) travels as n words (O(n)
/// device memory); any other mask as its n·⌈n/32⌉ bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlashMask {
    /// The mode bits (0: no mask).
    pub mode: u32,
    /// The words the kernel reads: per key 1/0 for [`FLASH_KEEP`], row-major bits for
    /// [`FLASH_BITS`], none otherwise.
    pub words: Vec<u32>,
    /// The side n the mask was made for (0 for no mask).
    pub n: usize,
}

impl FlashMask {
    /// No mask: every key allowed.
    pub fn none() -> FlashMask {
        FlashMask {
            mode: 0,
            words: Vec::new(),
            n: 0,
        }
    }

    /// The kernels' form of `mask` for sequences of `n` (`None`: no mask). A mask of another
    /// side is an error naming `op` and both sides. O(n) on the host for causal and key-padding
    /// masks ([`Mask::form`]); a dense mask's n² entries are read once into its bits.
    pub fn of(op: &'static str, mask: Option<&Mask>, n: usize) -> Result<FlashMask> {
        let Some(mask) = mask else {
            return Ok(FlashMask::none());
        };
        if (mask.rows(), mask.cols()) != (n, n) {
            return Err(Error::kernel(
                op,
                format!(
                    "the mask is ({}, {}) but the sequence has n = {n}",
                    mask.rows(),
                    mask.cols()
                ),
            ));
        }
        // The structure was found when the mask was made: a causal or key-padding mask costs
        // O(n) here, not a pass over its n² entries.
        if let MaskForm::Keys {
            causal: causal @ (None | Some(0)),
            keep,
        } = mask.form()
        {
            let mode = if causal.is_some() { FLASH_CAUSAL } else { 0 };
            return Ok(match keep {
                None => FlashMask {
                    mode,
                    words: Vec::new(),
                    n,
                },
                Some(keep) => FlashMask {
                    mode: mode | FLASH_KEEP,
                    words: keep.iter().map(|&k| u32::from(k)).collect(),
                    n,
                },
            });
        }
        let per_row = n.div_ceil(32);
        let len = check::product(op, &[n, per_row])?;
        abi::len_u32(op, len)?;
        let mut words = Vec::new();
        words.try_reserve_exact(len).map_err(|_| {
            Error::kernel(
                op,
                format!("the bits of an ({n}, {n}) attention mask could not be allocated"),
            )
        })?;
        words.resize(len, 0u32);
        for i in 0..n {
            for (j, &a) in mask.row(i).iter().enumerate() {
                if a {
                    words[i * per_row + j / 32] |= 1 << (j % 32);
                }
            }
        }
        Ok(FlashMask {
            mode: FLASH_BITS,
            words,
            n,
        })
    }

    /// Whether query `i` may attend to key `j` (the kernels' `tl_fa_allowed`).
    pub fn allowed(&self, n: usize, i: usize, j: usize) -> bool {
        if self.mode & FLASH_CAUSAL != 0 && j > i {
            return false;
        }
        if self.mode & FLASH_KEEP != 0 && self.words[j] == 0 {
            return false;
        }
        if self.mode & FLASH_BITS != 0 {
            return (self.words[i * n.div_ceil(32) + j / 32] >> (j % 32)) & 1 != 0;
        }
        true
    }

    /// Whether the kernels skip the tiles above the diagonal.
    pub fn causal(&self) -> bool {
        self.mode & FLASH_CAUSAL != 0
    }

    /// Checked against `dims`: made for its n (or no mask), words as long as the mode needs.
    pub fn check(&self, op: &'static str, dims: &FlashDims) -> Result<()> {
        let n = dims.n;
        let expected = match self.mode {
            m if m & FLASH_BITS != 0 => n * n.div_ceil(32),
            m if m & FLASH_KEEP != 0 => n,
            _ => 0,
        };
        if self.mode > FLASH_CAUSAL | FLASH_KEEP | FLASH_BITS
            || (self.mode != 0 && self.n != n)
            || self.words.len() != expected
        {
            return Err(Error::kernel(
                op,
                format!(
                    "a mask of mode {} with {} word(s) made for n = {} does not fit n = {n} \
                     (expected {expected} word(s))",
                    self.mode,
                    self.words.len(),
                    self.n
                ),
            ));
        }
        Ok(())
    }
}

/// One fused attention core: its sizes and its mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    /// The sizes.
    pub dims: FlashDims,
    /// The mask, as the kernels read it.
    pub mask: FlashMask,
}

impl Flash {
    /// Checked operands of [`Device::flash_attention`](super::Device::flash_attention): dims,
    /// mask, and Q, K, V of `B·n·H·d` elements each. Returns `(qkv_len, rows_len)`.
    pub fn check_forward(&self, op: &'static str, qkv: [Buffer; 3]) -> Result<(usize, usize)> {
        let lens = self.dims.check(op)?;
        self.mask.check(op, &self.dims)?;
        for (what, b) in ["Q", "K", "V"].into_iter().zip(qkv) {
            check::len_is(op, what, b, lens.0)?;
        }
        Ok(lens)
    }

    /// Checked operands of
    /// [`Device::flash_attention_bwd`](super::Device::flash_attention_bwd): those of the
    /// forward, O and dO of its length, lse of `B·H·n`.
    pub fn check_backward(
        &self,
        op: &'static str,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
    ) -> Result<(usize, usize)> {
        let (len, rows) = self.check_forward(op, qkv)?;
        check::len_is(op, "O", o, len)?;
        check::len_is(op, "dO", go, len)?;
        check::len_is(op, "lse", lse, rows)?;
        Ok((len, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_take_the_smallest_form_that_holds_them() {
        let n = 5;
        let causal = FlashMask::of("t", Some(&Mask::causal(n).unwrap()), n).unwrap();
        assert_eq!((causal.mode, causal.words.len()), (FLASH_CAUSAL, 0));
        let pad = Mask::from_fn(n, |_, j| j != 3).unwrap();
        let keep = FlashMask::of("t", Some(&pad), n).unwrap();
        assert_eq!(keep.mode, FLASH_KEEP);
        assert_eq!(keep.words, [1, 1, 1, 0, 1]);
        let both = Mask::from_fn(n, |i, j| j <= i && j != 0).unwrap();
        let cb = FlashMask::of("t", Some(&both), n).unwrap();
        assert_eq!(cb.mode, FLASH_CAUSAL | FLASH_KEEP);
        let all = FlashMask::of("t", Some(&Mask::from_fn(n, |_, _| true).unwrap()), n).unwrap();
        assert_eq!((all.mode, all.words.len()), (0, 0));
        // Row 2 allows key 4 (not causal), row 4 not key 1 but row 3 does: bits.
        let odd = Mask::from_fn(n, |i, j| (i + j) % 3 != 1).unwrap();
        let bits = FlashMask::of("t", Some(&odd), n).unwrap();
        assert_eq!((bits.mode, bits.words.len()), (FLASH_BITS, n));
        for m in [&causal, &keep, &cb, &bits] {
            m.check(
                "t",
                &FlashDims {
                    batch: 1,
                    n,
                    heads: 1,
                    d: 4,
                },
            )
            .unwrap();
        }
        for i in 0..n {
            for j in 0..n {
                assert_eq!(bits.allowed(n, i, j), odd.allowed(i, j), "({i}, {j})");
                assert_eq!(cb.allowed(n, i, j), both.allowed(i, j), "({i}, {j})");
            }
        }
        let e = FlashMask::of("flash", Some(&Mask::causal(4).unwrap()), n)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flash") && e.contains("(4, 4)") && e.contains("n = 5"),
            "{e}"
        );
        let e = causal
            .check(
                "flash",
                &FlashDims {
                    batch: 1,
                    n: 6,
                    heads: 1,
                    d: 4,
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("n = 6"), "{e}");
    }

    #[test]
    fn head_sizes_past_the_kernel_are_refused() {
        let dims = |d| FlashDims {
            batch: 2,
            n: 3,
            heads: 2,
            d,
        };
        assert_eq!(dims(128).check("f").unwrap(), (2 * 3 * 2 * 128, 12));
        assert!(dims(1).check("f").is_ok());
        for d in [0, 129, 256] {
            let e = dims(d).check("flash_attention").unwrap_err().to_string();
            assert!(
                e.contains("flash_attention")
                    && e.contains(&format!("d = {d}"))
                    && e.contains("1..=128"),
                "{e}"
            );
        }
        let e = FlashDims {
            batch: 1,
            n: 1 << 33,
            heads: 1,
            d: 1,
        }
        .check("flash_attention")
        .unwrap_err()
        .to_string();
        assert!(e.contains("flash_attention"), "{e}");
    }
}
