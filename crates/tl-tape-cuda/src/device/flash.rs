//! The fused ("flash") attention core's geometry ([`FlashDims`]), its mask as the kernels read
//! it ([`FlashMask`]) and the argument checks shared by the simulation device and the CUDA
//! device (kernels/attention.cu; sim twin `sim/flash.rs`).
//!
//! `nq` query rows attend to `nk` keys (`nq ≠ nk`: cross-attention of another length, or a KV
//! cache, one new query against the cached keys). Q, O and their cotangents dO, dQ are
//! head-merged (B, nq, H, d) buffers, the layout the projections `x·W` leave (element
//! (b, i, h, c) at `((b·nq + i)·H + h)·d + c`); K, V, dK and dV are (B, nk, Hk, d) with Hk
//! ([`FlashDims::kv_heads`]) key heads dividing H (key j of key head g at
//! `((b·nk + j)·Hk + g)·d + c`): query head h reads key head [`FlashDims::kv_head`]`(h)` =
//! `h / (H / Hk)` (grouped-query attention; Hk = H: a key head per query head, Hk = 1:
//! multi-query), and the cotangents of a key head sum those of its group of query heads, in
//! increasing head order. The row statistics `lse` (and the backward's `delta`) hold one
//! value per query row (b, h, i) at `(b·H + h)·nq + i`. Query rows and keys go in tiles of
//! [`FLASH_TILE`] (the order of every sum; the CUDA kernels take blocks of several tiles,
//! [`FlashDims::query_blocks`], [`FlashDims::key_blocks`]); the kernels hold Q, K, V (and dO)
//! rows in shared memory, so the head size is at most [`FLASH_MAX_HEAD`].
//!
//! A causal mask has a signed diagonal `offset` ([`FlashMask::offset`]): query i sees keys
//! `j ≤ i + offset` (0: the usual causal, aligned at the top left; `nk − nq`: aligned at the
//! bottom right, the KV-cache case; negative: the first rows see nothing). The kernels skip
//! exactly the tiles that hold no entry it allows ([`FlashMask::key_end`],
//! [`FlashMask::query_start`]).
//!
//! The mask's words ([`FlashMask::words`]: nk keep flags, or nq rows of ⌈nk/32⌉ bit words,
//! row i's at `i·⌈nk/32⌉`) are one mask shared by every batch element, or one per batch
//! element (a key padding that differs per sequence of a padded batch; PyTorch's `attn_mask`
//! (B, 1, L, S), `key_padding_mask` (B, S)): batch element b's words start at `b·mstride`,
//! `mstride` ([`FlashMask::stride`]) 0 for a shared mask, else the words of one element
//! ([`FlashMask::words_per_batch`]); the causal diagonal is the same for every element. A
//! job of the kernels is one (b, h) and reads element b's words only, so no sum's order
//! depends on the stride: a shared mask sent as B identical copies gives the same bits.
//!
//! Under autocast ([`Flash::round`] bf16 or TF32: docs/semantics.md, "Mixed precision") the
//! core is the composed path's products on rounded operands, in O(n·d) memory
//! ([`Device::flash_attention_rounded`](super::Device::flash_attention_rounded),
//! `device/flash_round.rs`): Q, K, V and dO rounded into copies, a plain forward for lse and
//! the output of the unrounded probabilities (which the backward's delta reads), then a
//! second forward pass ([`FLASH_OUT`]) for `O = round(A)·V`; the backward rounds p and dS
//! ([`FLASH_BF16`], [`FLASH_TF32`]) before its sums read them. Every kernel of either
//! [`FlashProducts`] takes those passes and bits.

use super::{Buffer, check};
use crate::precision::Precision;
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

/// The largest head size the tensor-core kernels take ([`FlashProducts::Tf32x3`],
/// `tl_flash_fwd_tc`, `tl_flash_bwd_q_tc`, `tl_flash_bwd_kv_tc`: their operands' rows, of 64
/// floats, in shared memory).
pub const FLASH_TC_MAX_HEAD: usize = 64;

/// How a fused attention core multiplies, forward and backward: on the CUDA cores or on the
/// tensor cores. PyTorch: its f32 `scaled_dot_product_attention` runs the memory-efficient
/// kernel, whose products on sm80+ are CUTLASS's 3xTF32 on the tensor cores, and its bf16 one
/// multiplies bf16 operands there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlashProducts {
    /// Every product an f32 fused multiply-add on the CUDA cores (`tl_flash_fwd`, the backward
    /// kernels), in the order kernels/attention.cu writes down.
    #[default]
    Fma,
    /// Every product on the tensor cores (the forward's Q·Kᵀ and P·V; the backward's Q·Kᵀ and
    /// dO·Vᵀ recomputed, dS·K, dSᵀ·Q and Pᵀ·dO), each f32 operand split into two TF32 values
    /// `big = tf32(x)`, `small = tf32(x − big)` and `a·b` taken as `small_a·big_b +
    /// big_a·small_b + big_a·big_b` (`tl_flash_fwd_tc`, `tl_flash_bwd_q_tc`,
    /// `tl_flash_bwd_kv_tc`; the dropped `small_a·small_b` is below 2⁻²² of the product): the
    /// same function as [`Fma`](Self::Fma) within f32 tolerance, not its bits. Under autocast
    /// ([`Flash::round`] bf16 or TF32) the kernels round Q, K, V and dO as they stage them (no
    /// rounded copies: [`Flash::rounds_on_read`]), each then a TF32 value (a bf16 value is
    /// one) whose small part is zero, so they multiply the big parts alone: one exact product
    /// a pair, as the composed path's tensor-core GEMM (the forward's first pass keeps
    /// `small_p·v`, its probabilities unrounded). Head sizes up to
    /// [`FLASH_TC_MAX_HEAD`]; the backward runs its two fixed-order kernels whatever the
    /// reduction mode.
    Tf32x3,
}

/// Mask mode bit: causal (key j ≤ query i + [`FlashMask::offset`]) (`TL_FA_CAUSAL`).
pub const FLASH_CAUSAL: u32 = 1;
/// Mask mode bit: a keep flag per key, `nk` words (`TL_FA_KEEP`).
pub const FLASH_KEEP: u32 = 2;
/// Mask mode bit: the full (nq, nk) mask as bits (`TL_FA_BITS`).
pub const FLASH_BITS: u32 = 4;
/// Mode bit (not a mask's): p and dS rounded to bf16 before the sums read them (`TL_FA_BF16`).
pub const FLASH_BF16: u32 = 8;
/// Mode bit (not a mask's): p and dS rounded to TF32 before the sums read them (`TL_FA_TF32`).
pub const FLASH_TF32: u32 = 16;
/// Mode bit (not a mask's): the forward's second pass under autocast, `O = round(A)·V` from a
/// given lse (`TL_FA_OUT`).
pub const FLASH_OUT: u32 = 32;
/// Mode bit (not a mask's): the forward's statistics alone, lse without O (`TL_FA_STATS`).
pub const FLASH_STATS: u32 = 64;

/// The sizes of one fused attention core: `batch·heads` heads of `nq` query rows against `nk`
/// keys of `batch·kv_heads` key heads, each of size `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashDims {
    /// Samples B.
    pub batch: usize,
    /// Query rows nq (of Q, O, dO, dQ, lse).
    pub nq: usize,
    /// Keys nk (rows of K, V, dK, dV).
    pub nk: usize,
    /// Query heads H.
    pub heads: usize,
    /// Key and value heads Hk, dividing H: H for a key head per query head, fewer for
    /// grouped-query attention (query head h reads key head [`FlashDims::kv_head`]`(h)`).
    pub kv_heads: usize,
    /// Head size d (1..=[`FLASH_MAX_HEAD`]).
    pub d: usize,
}

/// The element counts of one fused attention core's buffers ([`FlashDims::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashLens {
    /// Q, O, dO, dQ: `B·nq·H·d`.
    pub q: usize,
    /// K, V, dK, dV: `B·nk·Hk·d`.
    pub kv: usize,
    /// lse and delta: `B·H·nq`.
    pub rows: usize,
}

impl FlashDims {
    /// Elements of Q (and O, dO, dQ): `B·nq·H·d`.
    pub fn q_len(&self) -> usize {
        self.batch * self.nq * self.heads * self.d
    }

    /// Elements of K (and V, dK, dV): `B·nk·Hk·d`.
    pub fn kv_len(&self) -> usize {
        self.batch * self.nk * self.kv_heads * self.d
    }

    /// Query heads per key head, `H / Hk` (1 without grouping).
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }

    /// The key (and value) head that query head `h` reads: `h / (H / Hk)`
    /// ([`tl_spec::ops::attention::mha::kv_head`]; `tl_fa_kv_head` in the kernels).
    pub fn kv_head(&self, h: usize) -> usize {
        tl_spec::ops::attention::mha::kv_head(h, self.heads, self.kv_heads)
    }

    /// Elements of `lse` (and `delta`): one per query row, `B·H·nq`.
    pub fn rows_len(&self) -> usize {
        self.batch * self.heads * self.nq
    }

    /// `1/√d` as the kernels' f32 (the reference's `1/sqrt(d)` rounded once, as the composed
    /// path's scale).
    pub fn scale(&self) -> f32 {
        (1.0 / (self.d as f64).sqrt()) as f32
    }

    /// Blocks of a CUDA launch over the query rows (forward, dQ) that takes `rows` of them
    /// each: `B·H·⌈nq/rows⌉` (the kernels grid-stride over them).
    pub fn query_blocks(&self, rows: usize) -> usize {
        self.batch * self.heads * self.nq.div_ceil(rows)
    }

    /// Blocks of a CUDA launch over the keys (dK, dV) that takes `keys` of them each, one job
    /// per key head (which sums its group of query heads): `B·Hk·⌈nk/keys⌉`.
    pub fn key_blocks(&self, keys: usize) -> usize {
        self.batch * self.kv_heads * self.nk.div_ceil(keys)
    }

    /// Checked: nq ≥ 1, nk ≥ 1, `1 ≤ d ≤ FLASH_MAX_HEAD`, heads and batch ≥ 1, kv_heads ≥ 1
    /// dividing heads, every size and count within the `u32` ABI. Returns the buffers'
    /// lengths.
    pub fn check(&self, op: &'static str) -> Result<FlashLens> {
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
        if self.nq == 0 || self.nk == 0 || self.heads == 0 || self.batch == 0 {
            return Err(Error::kernel(
                op,
                format!("empty attention: {self:?} (nq, nk, heads and batch must be ≥ 1)"),
            ));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::kernel(
                op,
                format!(
                    "kv_heads = {} key and value heads must be ≥ 1 and divide heads = {} \
                     (grouped-query attention)",
                    self.kv_heads, self.heads
                ),
            ));
        }
        for (what, v) in [
            ("batch", self.batch),
            ("nq", self.nq),
            ("nk", self.nk),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("d", self.d),
        ] {
            abi::to_u32(op, what, v)?;
        }
        let lens = FlashLens {
            q: check::product(op, &[self.batch, self.nq, self.heads, self.d])?,
            kv: check::product(op, &[self.batch, self.nk, self.kv_heads, self.d])?,
            rows: check::product(op, &[self.batch, self.heads, self.nq])?,
        };
        for len in [lens.q, lens.kv, lens.rows] {
            abi::len_u32(op, len)?;
        }
        Ok(lens)
    }
}

/// An attention mask as the fused kernels read it: a mode ([`FLASH_CAUSAL`], [`FLASH_KEEP`],
/// [`FLASH_BITS`]), the causal diagonal, and its words, uploaded per launch. A mask that is
/// causal and/or a key padding (entry (i, j) = `(j ≤ i + offset or not causal) and keep[j]`)
/// travels as nk words per batch element (O(nk) device memory); any other mask as its
/// nq·⌈nk/32⌉ bits per batch element. One mask shared by every batch element holds the words
/// of one ([`FlashMask::batch`] = 1, the kernels' `mstride` 0); a per-sequence mask (PyTorch's
/// `attn_mask` (B, 1, L, S), `key_padding_mask` (B, S)) holds B elements' words back to back,
/// batch element b's from `b·`[`FlashMask::words_per_batch`]; the causal diagonal is shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlashMask {
    /// The mode bits (0: no mask).
    pub mode: u32,
    /// The words the kernel reads, [`FlashMask::batch`] elements' words back to back: per key
    /// 1/0 for [`FLASH_KEEP`] (nk words an element), row-major bits for [`FLASH_BITS`] (row
    /// i's ⌈nk/32⌉ words at `i·⌈nk/32⌉` of its element's nq rows), none otherwise.
    pub words: Vec<u32>,
    /// With [`FLASH_CAUSAL`]: query i sees keys `j ≤ i + offset` (0 otherwise). The kernels
    /// take it as a signed 32-bit `int`; [`FlashMask::check`] refuses one that does not fit.
    pub offset: i64,
    /// The query rows nq the mask was made for (0 for no mask).
    pub rows: usize,
    /// The keys nk the mask was made for (0 for no mask).
    pub cols: usize,
    /// The batch elements whose words `words` holds: 1 (one mask shared by every batch
    /// element, or no words at all) or the attention's B.
    pub batch: usize,
}

impl FlashMask {
    /// No mask: every key allowed.
    pub fn none() -> FlashMask {
        FlashMask {
            mode: 0,
            words: Vec::new(),
            offset: 0,
            rows: 0,
            cols: 0,
            batch: 1,
        }
    }

    /// The causal mask of `nq` queries over `nk` keys whose query i sees keys j ≤ i + `offset`,
    /// shared by every batch element, `offset` as given (not clamped: [`check`](Self::check)
    /// refuses one past the kernels' `int`).
    pub fn causal_diagonal(nq: usize, nk: usize, offset: i64) -> FlashMask {
        FlashMask {
            mode: FLASH_CAUSAL,
            words: Vec::new(),
            offset,
            rows: nq,
            cols: nk,
            batch: 1,
        }
    }

    /// The kernels' form of `mask` for `nq` queries over `nk` keys of an attention of `batch`
    /// elements (`None`: no mask). A mask of other sizes, or whose batch is neither 1 (shared)
    /// nor `batch`, is an error naming `op` and both sizes. O(B·nk) on the host for causal and
    /// key-padding masks ([`Mask::form`]; a causal diagonal is kept as `offset`, clamped to
    /// `−nq..=nk`, which allows the same entries); a dense mask's entries are read once into
    /// its bits.
    pub fn of(
        op: &'static str,
        mask: Option<&Mask>,
        nq: usize,
        nk: usize,
        batch: usize,
    ) -> Result<FlashMask> {
        let Some(mask) = mask else {
            return Ok(FlashMask::none());
        };
        if (mask.rows(), mask.cols()) != (nq, nk) {
            return Err(Error::kernel(
                op,
                format!(
                    "the mask is ({}, {}) but the attention has nq = {nq} queries and nk = {nk} \
                     keys",
                    mask.rows(),
                    mask.cols()
                ),
            ));
        }
        let mb = mask.batch();
        if mb != 1 && mb != batch {
            return Err(Error::kernel(
                op,
                format!(
                    "the mask holds {mb} batch elements' masks but the attention has batch \
                     B = {batch} (a mask's batch must be 1, shared by every element, or B)"
                ),
            ));
        }
        // The structure was found when the mask was made: a causal or key-padding mask costs
        // O(B·nk) here, not a pass over its B·nq·nk entries.
        if let MaskForm::Keys { causal, keep } = mask.form() {
            let (mode, offset) = match *causal {
                // Past −nq no row sees a key, past nk every row sees all: the same entries.
                Some(o) => (FLASH_CAUSAL, (o as i64).clamp(-(nq as i64), nk as i64)),
                None => (0, 0),
            };
            // keep: B·nk flags, element b's at b·nk (nk for a shared mask).
            let (mode, words, batch) = match keep {
                None => (mode, Vec::new(), 1),
                Some(keep) => (
                    mode | FLASH_KEEP,
                    keep.iter().map(|&k| u32::from(k)).collect(),
                    mb,
                ),
            };
            return Ok(FlashMask {
                mode,
                words,
                offset,
                rows: nq,
                cols: nk,
                batch,
            });
        }
        let per_row = nk.div_ceil(32);
        let len = check::product(op, &[mb, nq, per_row])?;
        abi::len_u32(op, len)?;
        let mut words = Vec::new();
        words.try_reserve_exact(len).map_err(|_| {
            Error::kernel(
                op,
                format!("the bits of {mb} ({nq}, {nk}) attention mask(s) could not be allocated"),
            )
        })?;
        words.resize(len, 0u32);
        for (b, rows) in words.chunks_exact_mut((nq * per_row).max(1)).enumerate() {
            for i in 0..nq {
                for (j, &a) in mask.row_in(b, i).iter().enumerate() {
                    if a {
                        rows[i * per_row + j / 32] |= 1 << (j % 32);
                    }
                }
            }
        }
        Ok(FlashMask {
            mode: FLASH_BITS,
            words,
            offset: 0,
            rows: nq,
            cols: nk,
            batch: mb,
        })
    }

    /// The words of one batch element that `mode` reads for `nq` queries over `nk` keys: nq
    /// rows of ⌈nk/32⌉ for [`FLASH_BITS`], nk for [`FLASH_KEEP`], none otherwise.
    fn words_for(mode: u32, nq: usize, nk: usize) -> usize {
        match mode {
            m if m & FLASH_BITS != 0 => nq.saturating_mul(nk.div_ceil(32)),
            m if m & FLASH_KEEP != 0 => nk,
            _ => 0,
        }
    }

    /// The words of one batch element: nq·⌈nk/32⌉ bits, nk keep flags, or none.
    pub fn words_per_batch(&self) -> usize {
        FlashMask::words_for(self.mode, self.rows, self.cols)
    }

    /// The kernels' `mstride`: where batch element b's words start, `b·stride` —
    /// [`FlashMask::words_per_batch`] for a per-sequence mask, 0 for a shared one.
    pub fn stride(&self) -> usize {
        match self.batch {
            1 => 0,
            _ => self.words_per_batch(),
        }
    }

    /// Whether query `i` of batch element `b` may attend to key `j` (the kernels'
    /// `tl_fa_allowed` on the words from `b·`[`FlashMask::stride`]; the bits' row stride from
    /// [`FlashMask::cols`]).
    pub fn allowed(&self, b: usize, i: usize, j: usize) -> bool {
        if self.causal() && j as i64 > i as i64 + self.offset {
            return false;
        }
        let base = b * self.stride();
        if self.mode & FLASH_KEEP != 0 && self.words[base + j] == 0 {
            return false;
        }
        if self.mode & FLASH_BITS != 0 {
            let word = self.words[base + i * self.cols.div_ceil(32) + j / 32];
            return (word >> (j % 32)) & 1 != 0;
        }
        true
    }

    /// Whether the mask has a causal part (the kernels skip tiles by it).
    pub fn causal(&self) -> bool {
        self.mode & FLASH_CAUSAL != 0
    }

    /// The keys that query rows before `qend` can be allowed (`tl_fa_kend`): `j < min(nk,
    /// max(0, qend + offset))` under a causal mask, all `nk` otherwise. A query tile
    /// `[i0, qend)` runs the key tiles that start before it.
    pub fn key_end(&self, qend: usize, nk: usize) -> usize {
        if !self.causal() {
            return nk;
        }
        (qend as i64 + self.offset).clamp(0, nk as i64) as usize
    }

    /// The first query tile (of [`FLASH_TILE`] rows) that keys from `j0` on can be allowed in
    /// (`tl_fa_qstart`): the tile holding row `max(0, j0 − offset)` under a causal mask (`nq`,
    /// no tile, when that row is past the last), 0 otherwise. A key tile from `j0` runs the
    /// query tiles from there on.
    pub fn query_start(&self, j0: usize, nq: usize) -> usize {
        if !self.causal() {
            return 0;
        }
        match (j0 as i64 - self.offset).max(0) as usize {
            s if s >= nq => nq,
            s => s / FLASH_TILE * FLASH_TILE,
        }
    }

    /// Checked against `dims`: made for its (nq, nk) (or no mask), for batch 1 (shared) or
    /// its B, words as long as the mode needs for that many batch elements (and within the
    /// kernels' `u32`), the offset within the kernels' `int`.
    pub fn check(&self, op: &'static str, dims: &FlashDims) -> Result<()> {
        let (nq, nk) = (dims.nq, dims.nk);
        let per = FlashMask::words_for(self.mode, nq, nk);
        let expected = per.checked_mul(self.batch);
        if self.mode & (FLASH_KEEP | FLASH_BITS) == FLASH_KEEP | FLASH_BITS {
            return Err(Error::kernel(
                op,
                format!(
                    "a mask of mode {} is both keep flags (FLASH_KEEP) and bits (FLASH_BITS): \
                     one form or the other",
                    self.mode
                ),
            ));
        }
        if self.mode > FLASH_CAUSAL | FLASH_KEEP | FLASH_BITS
            || (self.mode != 0 && (self.rows, self.cols) != (nq, nk))
            || (self.batch != 1 && self.batch != dims.batch)
            || expected != Some(self.words.len())
        {
            return Err(Error::kernel(
                op,
                format!(
                    "a mask of mode {} with {} word(s) for {} batch element(s), made for ({}, \
                     {}), does not fit B = {}, nq = {nq}, nk = {nk} (expected {per} word(s) for \
                     each of 1 or B batch elements)",
                    self.mode,
                    self.words.len(),
                    self.batch,
                    self.rows,
                    self.cols,
                    dims.batch,
                ),
            ));
        }
        abi::len_u32(op, self.words.len())?;
        if i32::try_from(self.offset).is_err() {
            return Err(Error::kernel(
                op,
                format!(
                    "the causal offset {} does not fit the kernels' 32-bit int",
                    self.offset
                ),
            ));
        }
        Ok(())
    }
}

/// One fused attention core: its sizes, its mask and its products' arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    /// The sizes.
    pub dims: FlashDims,
    /// The mask, as the kernels read it.
    pub mask: FlashMask,
    /// The arithmetic of the core's products: [`Precision::F32`], or autocast (bf16, TF32:
    /// every operand of every product rounded, as the composed path's products read them;
    /// the module docs).
    pub round: Precision,
    /// How the core multiplies ([`FlashProducts::Fma`] unless set).
    pub products: FlashProducts,
}

impl Flash {
    /// The f32 core of `dims` under `mask`.
    pub fn new(dims: FlashDims, mask: FlashMask) -> Flash {
        Flash {
            dims,
            mask,
            round: Precision::F32,
            products: FlashProducts::Fma,
        }
    }

    /// The core with its products as `products` says.
    pub fn with_products(self, products: FlashProducts) -> Flash {
        Flash { products, ..self }
    }

    /// Whether the tensor-core kernels take this core ([`FlashProducts::Tf32x3`]): a head of
    /// at most [`FLASH_TC_MAX_HEAD`], at any precision. The attention ops ask for them only
    /// then; an explicit request elsewhere is an error before launch.
    pub fn tensor_cores_fit(&self) -> bool {
        self.dims.d <= FLASH_TC_MAX_HEAD
    }

    /// Whether the core's kernels round their operands (Q, K, V, dO) as they read them under
    /// autocast, so that the caller hands them unrounded and makes no copies: the tensor-core
    /// kernels ([`FlashProducts::Tf32x3`]) round as they stage; the FMA kernels read copies
    /// rounded beforehand ([`Device::round_to`](super::Device::round_to)).
    pub fn rounds_on_read(&self) -> bool {
        self.products == FlashProducts::Tf32x3
    }

    /// The core with its products at `round`.
    pub fn with_round(self, round: Precision) -> Flash {
        Flash { round, ..self }
    }

    /// The kernels' `mode`: the mask's bits, and [`FLASH_BF16`] or [`FLASH_TF32`] under
    /// autocast.
    pub fn mode(&self) -> u32 {
        self.mask.mode
            | match self.round {
                Precision::F32 => 0,
                Precision::Bf16 => FLASH_BF16,
                Precision::Tf32 => FLASH_TF32,
            }
    }

    /// Checked operands of [`Device::flash_attention`](super::Device::flash_attention): dims,
    /// mask, Q of `B·nq·H·d` elements, K and V of `B·nk·Hk·d`. Returns the buffers' lengths.
    pub fn check_forward(&self, op: &'static str, qkv: [Buffer; 3]) -> Result<FlashLens> {
        let lens = self.dims.check(op)?;
        self.mask.check(op, &self.dims)?;
        if self.products == FlashProducts::Tf32x3 && !self.tensor_cores_fit() {
            return Err(Error::kernel(
                op,
                format!(
                    "the tensor-core kernels (FlashProducts::Tf32x3) take heads up to \
                     {FLASH_TC_MAX_HEAD}; this core has head size d = {}: use \
                     FlashProducts::Fma (d up to {FLASH_MAX_HEAD})",
                    self.dims.d
                ),
            ));
        }
        for ((what, b), len) in ["Q", "K", "V"]
            .into_iter()
            .zip(qkv)
            .zip([lens.q, lens.kv, lens.kv])
        {
            check::len_is(op, what, b, len)?;
        }
        Ok(lens)
    }

    /// Checked operands of
    /// [`Device::flash_attention_bwd`](super::Device::flash_attention_bwd): those of the
    /// forward, O and dO of Q's length, lse of `B·H·nq`.
    pub fn check_backward(
        &self,
        op: &'static str,
        qkv: [Buffer; 3],
        o: Buffer,
        lse: Buffer,
        go: Buffer,
    ) -> Result<FlashLens> {
        let lens = self.check_forward(op, qkv)?;
        check::len_is(op, "O", o, lens.q)?;
        check::len_is(op, "dO", go, lens.q)?;
        check::len_is(op, "lse", lse, lens.rows)?;
        Ok(lens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(nq: usize, nk: usize) -> FlashDims {
        FlashDims {
            batch: 1,
            nq,
            nk,
            heads: 1,
            kv_heads: 1,
            d: 4,
        }
    }

    /// `m`'s kernel form fits its sizes and allows exactly its entries.
    fn same_entries(m: &FlashMask, mask: &Mask) {
        let (nq, nk) = (mask.rows(), mask.cols());
        m.check("t", &dims(nq, nk)).unwrap();
        for i in 0..nq {
            for j in 0..nk {
                assert_eq!(
                    m.allowed(0, i, j),
                    mask.allowed(i, j),
                    "{mask:?} ({i}, {j})"
                );
            }
        }
    }

    #[test]
    fn masks_take_the_smallest_form_that_holds_them() {
        let n = 5;
        let causal = FlashMask::of("t", Some(&Mask::causal(n).unwrap()), n, n, 1).unwrap();
        assert_eq!(
            (causal.mode, causal.offset, causal.words.len()),
            (FLASH_CAUSAL, 0, 0)
        );
        let pad = Mask::from_fn(n, |_, j| j != 3).unwrap();
        let keep = FlashMask::of("t", Some(&pad), n, n, 1).unwrap();
        assert_eq!(keep.mode, FLASH_KEEP);
        assert_eq!(keep.words, [1, 1, 1, 0, 1]);
        let both = Mask::from_fn(n, |i, j| j <= i && j != 0).unwrap();
        let cb = FlashMask::of("t", Some(&both), n, n, 1).unwrap();
        assert_eq!(cb.mode, FLASH_CAUSAL | FLASH_KEEP);
        let all = Mask::from_fn(n, |_, _| true).unwrap();
        let none = FlashMask::of("t", Some(&all), n, n, 1).unwrap();
        assert_eq!((none.mode, none.words.len()), (0, 0));
        // Row 2 allows key 4 (not causal), row 4 not key 1 but row 3 does: bits.
        let odd = Mask::from_fn(n, |i, j| (i + j) % 3 != 1).unwrap();
        let bits = FlashMask::of("t", Some(&odd), n, n, 1).unwrap();
        assert_eq!((bits.mode, bits.words.len()), (FLASH_BITS, n));
        for (m, mask) in [(&causal, Mask::causal(n).unwrap()), (&keep, pad)] {
            same_entries(m, &mask);
        }
        for (m, mask) in [(&cb, &both), (&none, &all), (&bits, &odd)] {
            same_entries(m, mask);
        }
        let e = FlashMask::of("flash", Some(&Mask::causal(4).unwrap()), n, n, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flash") && e.contains("(4, 4)") && e.contains("nq = 5"),
            "{e}"
        );
        let e = causal.check("flash", &dims(6, 6)).unwrap_err().to_string();
        assert!(e.contains("made for (5, 5)") && e.contains("nq = 6"), "{e}");
    }

    /// Rectangular masks (queries ≠ keys) take the smallest form too: the lower-right causal
    /// mask its diagonal nk − nq (negative when the queries outnumber the keys: the first rows
    /// see nothing), key padding nk words, both; anything else nq rows of ⌈nk/32⌉ words.
    #[test]
    fn rectangular_masks_take_the_smallest_form_and_allow_their_entries() {
        for (nq, nk) in [(1, 37), (20, 70), (33, 5), (3, 40), (40, 33)] {
            let lr = Mask::causal_lower_right(nq, nk).unwrap();
            let ul = Mask::causal_upper_left(nq, nk).unwrap();
            let pad = Mask::from_fn_rectangular(nq, nk, |_, j| j % 5 != 2).unwrap();
            let lr_pad = Mask::from_fn_rectangular(nq, nk, |i, j| {
                j as i64 <= i as i64 + nk as i64 - nq as i64 && j % 4 != 1
            })
            .unwrap();
            let dense = Mask::from_fn_rectangular(nq, nk, |i, j| (i * 3 + j) % 5 != 0).unwrap();
            let words = |m: &Mask| FlashMask::of("t", Some(m), nq, nk, 1).unwrap();
            let diag = (nk as i64 - nq as i64).clamp(-(nq as i64), nk as i64);
            let form = |f: &FlashMask| (f.mode, f.offset, f.words.len());
            // One query row over every key (1, 37): lower right is no mask at all, upper left
            // a key padding (key 0 only); otherwise the diagonal nk − nq, and 0.
            let f = words(&lr);
            let want = if nq == 1 {
                (0, 0, 0)
            } else {
                (FLASH_CAUSAL, diag, 0)
            };
            assert_eq!(form(&f), want, "({nq}, {nk}) lower right");
            same_entries(&f, &lr);
            let f = words(&ul);
            let want = if nq == 1 {
                (FLASH_KEEP, 0, nk)
            } else {
                (FLASH_CAUSAL, 0, 0)
            };
            assert_eq!(form(&f), want, "({nq}, {nk}) upper left");
            same_entries(&f, &ul);
            let f = words(&pad);
            assert_eq!(form(&f), (FLASH_KEEP, 0, nk), "({nq}, {nk}) padding");
            same_entries(&f, &pad);
            let f = words(&lr_pad);
            let want = match nq {
                1 => (FLASH_KEEP, 0, nk),
                _ => (FLASH_CAUSAL | FLASH_KEEP, diag, nk),
            };
            assert_eq!(form(&f), want, "({nq}, {nk}) lower right + padding");
            same_entries(&f, &lr_pad);
            // One row is always a key padding.
            let f = words(&dense);
            let want = match nq {
                1 => (FLASH_KEEP, 0, nk),
                _ => (FLASH_BITS, 0, nq * nk.div_ceil(32)),
            };
            assert_eq!(form(&f), want, "({nq}, {nk}) dense");
            same_entries(&f, &dense);
        }
        // A mask made for other sizes: the op and both sizes named.
        let lr = Mask::causal_lower_right(1, 37).unwrap();
        let e = FlashMask::of("scaledDotProductAttention", Some(&lr), 1, 36, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("scaledDotProductAttention")
                && e.contains("(1, 37)")
                && e.contains("nq = 1 queries and nk = 36 keys"),
            "{e}"
        );
        let lr = Mask::causal_lower_right(20, 70).unwrap();
        let f = FlashMask::of("t", Some(&lr), 20, 70, 1).unwrap();
        let e = f.check("flash", &dims(70, 20)).unwrap_err().to_string();
        assert!(
            e.contains("made for (20, 70)") && e.contains("nq = 70, nk = 20"),
            "{e}"
        );
    }

    /// A mask of one matrix per batch element travels as B elements' words, element b's from
    /// `b·stride`: a key padding per sequence (with or without the causal diagonal) as B·nk
    /// keep flags, a dense one as B·nq·⌈nk/32⌉ bits; a batched mask whose padding has no key
    /// flag (causal only) needs no words, shared; each allows exactly its element's entries. A
    /// batch that is neither 1 nor B is an error naming the op and both sizes.
    #[test]
    fn batched_masks_hold_each_elements_words() {
        let (nq, nk, batch) = (5, 37, 3);
        let lens = [37, 20, 0];
        let pad = Mask::from_fn_batched(batch, nq, nk, |b, _, j| j < lens[b]).unwrap();
        let lr_pad = Mask::from_fn_batched(batch, nq, nk, |b, i, j| {
            j as i64 <= i as i64 + 32 && j < lens[b]
        })
        .unwrap();
        let dense = Mask::from_fn_batched(batch, nq, nk, |b, i, j| {
            (i + j + b) % 3 != 0 && (b, i) != (1, 2)
        })
        .unwrap();
        let causal = Mask::from_fn_batched(batch, nq, nk, |_, i, j| j <= i).unwrap();
        let per_row = nk.div_ceil(32);
        for (mask, mode, offset, words, stride) in [
            (&pad, FLASH_KEEP, 0, batch * nk, nk),
            (&lr_pad, FLASH_CAUSAL | FLASH_KEEP, 32, batch * nk, nk),
            (&dense, FLASH_BITS, 0, batch * nq * per_row, nq * per_row),
            (&causal, FLASH_CAUSAL, 0, 0, 0),
        ] {
            let f = FlashMask::of("t", Some(mask), nq, nk, batch).unwrap();
            assert_eq!(
                (f.mode, f.offset, f.words.len(), f.stride()),
                (mode, offset, words, stride),
                "{mask:?}"
            );
            f.check(
                "t",
                &FlashDims {
                    batch,
                    ..dims(nq, nk)
                },
            )
            .unwrap();
            for b in 0..batch {
                for i in 0..nq {
                    for j in 0..nk {
                        let want = mask.allowed_in(b, i, j);
                        assert_eq!(f.allowed(b, i, j), want, "{mask:?} ({b}, {i}, {j})");
                    }
                }
            }
        }
        // The shared mask's words serve every element (stride 0) for any B.
        let shared = Mask::from_fn_rectangular(nq, nk, |_, j| j != 4).unwrap();
        let f = FlashMask::of("t", Some(&shared), nq, nk, batch).unwrap();
        assert_eq!((f.batch, f.stride(), f.words.len()), (1, 0, nk));
        assert!(!f.allowed(2, 0, 4) && f.allowed(2, 0, 5));
        // Batch 3 for an attention of batch 2 (the IR refuses it first on the tape).
        let e = FlashMask::of("multiHeadAttention", Some(&pad), nq, nk, 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("multiHeadAttention") && e.contains("holds 3 batch") && e.contains("B = 2"),
            "{e}"
        );
        // Words of batch 3 checked against dims of batch 2.
        let f = FlashMask::of("t", Some(&dense), nq, nk, batch).unwrap();
        let e = f
            .check(
                "flash",
                &FlashDims {
                    batch: 2,
                    ..dims(nq, nk)
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 batch element(s)") && e.contains("B = 2"),
            "{e}"
        );
    }

    /// The tiles a causal mask runs are exactly those holding an allowed entry, for every
    /// diagonal from "nothing allowed" to "everything": a query tile's keys end at the first
    /// key no row of it sees, a key tile's query tiles start at the first that sees one of
    /// its keys.
    #[test]
    fn causal_tiles_run_exactly_where_an_entry_is_allowed() {
        let t = FLASH_TILE;
        for (nq, nk) in [(1, 37), (20, 70), (33, 5), (16, 16), (47, 47), (64, 1)] {
            for offset in -(nq as i64) - 2..=nk as i64 + 2 {
                let m = FlashMask::causal_diagonal(nq, nk, offset);
                let meet = |i0: usize, j0: usize| {
                    (i0..nq.min(i0 + t)).any(|i| (j0..nk.min(j0 + t)).any(|j| m.allowed(0, i, j)))
                };
                for i0 in (0..nq).step_by(t) {
                    let kend = m.key_end(nq.min(i0 + t), nk);
                    for j0 in (0..nk).step_by(t) {
                        assert_eq!(j0 < kend, meet(i0, j0), "{nq} {nk} {offset}: {i0}, {j0}");
                    }
                }
                for j0 in (0..nk).step_by(t) {
                    let start = m.query_start(j0, nq);
                    assert!(
                        start.is_multiple_of(t) || start == nq,
                        "a tile start, or none"
                    );
                    for i0 in (0..nq).step_by(t) {
                        assert_eq!(i0 >= start, meet(i0, j0), "{nq} {nk} {offset}: {i0}, {j0}");
                    }
                }
            }
        }
        // Not causal: every tile.
        let none = FlashMask::none();
        assert_eq!((none.key_end(3, 40), none.query_start(32, 5)), (40, 0));
    }

    #[test]
    fn sizes_and_offsets_past_the_kernel_are_refused() {
        let dims = |d| FlashDims {
            batch: 2,
            nq: 3,
            nk: 5,
            heads: 2,
            kv_heads: 2,
            d,
        };
        let lens = dims(128).check("f").unwrap();
        assert_eq!(
            lens,
            FlashLens {
                q: 2 * 3 * 2 * 128,
                kv: 2 * 5 * 2 * 128,
                rows: 12
            }
        );
        assert_eq!((dims(1).query_blocks(2), dims(1).key_blocks(2)), (8, 12));
        for d in [0, 129, 256] {
            let e = dims(d).check("flash_attention").unwrap_err().to_string();
            assert!(
                e.contains("flash_attention")
                    && e.contains(&format!("d = {d}"))
                    && e.contains("1..=128"),
                "{e}"
            );
        }
        for (nq, nk) in [(0, 3), (3, 0)] {
            let e = FlashDims { nq, nk, ..dims(4) }
                .check("flash_attention")
                .unwrap_err()
                .to_string();
            assert!(e.contains("empty attention") && e.contains("nq"), "{e}");
        }
        // Grouped-query attention: 6 query heads over 3 key heads, K and V of 3 heads a row,
        // the key blocks one job per key head.
        let gqa = FlashDims {
            heads: 6,
            kv_heads: 3,
            ..dims(4)
        };
        assert_eq!(
            gqa.check("f").unwrap(),
            FlashLens {
                q: 2 * 3 * 6 * 4,
                kv: 2 * 5 * 3 * 4,
                rows: 2 * 6 * 3
            }
        );
        assert_eq!(
            (gqa.group(), gqa.key_blocks(2), gqa.query_blocks(2)),
            (2, 18, 24)
        );
        let heads: Vec<usize> = (0..6).map(|h| gqa.kv_head(h)).collect();
        assert_eq!(heads, [0, 0, 1, 1, 2, 2]);
        for kv_heads in [0, 4, 7] {
            let e = FlashDims { kv_heads, ..gqa }
                .check("scaledDotProductAttention")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("scaledDotProductAttention")
                    && e.contains(&format!("kv_heads = {kv_heads}"))
                    && e.contains("divide heads = 6"),
                "{e}"
            );
        }
        for (nq, nk) in [(1 << 33, 1), (1, 1 << 33)] {
            let e = FlashDims {
                batch: 1,
                nq,
                nk,
                heads: 1,
                kv_heads: 1,
                d: 1,
            }
            .check("flash_attention")
            .unwrap_err()
            .to_string();
            assert!(e.contains("flash_attention"), "{e}");
        }
        let far = FlashMask::causal_diagonal(3, 5, 1 << 31);
        let e = far
            .check("flash_attention", &dims(4))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flash_attention") && e.contains("offset 2147483648"),
            "{e}"
        );
        // The mask's own diagonal far past the keys: clamped, the same entries.
        let wide = Mask::from_fn_rectangular(3, 5, |_, _| true).unwrap();
        assert_eq!(FlashMask::of("t", Some(&wide), 3, 5, 1).unwrap().mode, 0);
    }
}
