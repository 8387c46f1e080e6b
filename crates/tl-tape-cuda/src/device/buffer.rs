//! Buffer handles ([`Buffer`]), the dims of a matrix product ([`Gemm`]) and where a batched
//! product's matrices lie ([`Batch`]): the plain data every [`Device`](super::Device) primitive
//! takes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc::{Allocation, CachingAllocator, RawMemory};
use crate::precision::Precision;

/// A handle to a float32 device buffer of `len` elements.
///
/// Ids are unique in the process, so a handle from one device is never mistaken for a buffer of
/// another: it is reported as not live there.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    id: u64,
    len: usize,
}

/// The table of a device's live allocations, by buffer id.
pub(crate) type LiveTable<B> = HashMap<u64, Allocation<B>>;

/// [`Device::release`](super::Device::release) for both devices: remove `b` from `live` and
/// return its allocation to `pool`; whether a live allocation was freed (`false` the second
/// time, or for a handle of another device).
pub(crate) fn release_live<M: RawMemory>(
    pool: &mut CachingAllocator<M>,
    live: &mut LiveTable<M::Block>,
    b: Buffer,
) -> bool {
    live.remove(&b.id).map(|a| pool.free(a)).is_some()
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Buffer {
    /// A handle with a fresh id, for a device that has just allocated `len` elements.
    pub(crate) fn fresh(len: usize) -> Buffer {
        Buffer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            len,
        }
    }

    /// The buffer's process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of float32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of data (`4 · len`).
    pub fn bytes(&self) -> usize {
        self.len * 4
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}[{}]", self.id, self.len)
    }
}

/// Dims of one matrix product `op(a) · op(b)` with `op(a)` of shape (m, k) and `op(b)` of shape
/// (k, n). With `ta`, `a` is stored (k, m) and read transposed; with `tb`, `b` is stored (n, k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of the result.
    pub m: usize,
    /// The contracted dim.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// Read `a` transposed.
    pub ta: bool,
    /// Read `b` transposed.
    pub tb: bool,
}

impl Gemm {
    /// `(m, k) · (k, n)`, no transposes.
    pub fn nn(m: usize, k: usize, n: usize) -> Gemm {
        Gemm {
            m,
            k,
            n,
            ta: false,
            tb: false,
        }
    }

    /// The same product with the transpose flags set.
    pub fn with_t(self, ta: bool, tb: bool) -> Gemm {
        Gemm { ta, tb, ..self }
    }

    /// The run of the contracted dimension one block of the f32 matmul kernel sums (split-K):
    /// [`k_chunk_tiled`](Self::k_chunk_tiled) counting [`GEMM_TILE`]×[`GEMM_TILE`] output
    /// tiles. `tl_gemm`, `tl_gemm_wide` and the implicit-GEMM conv's weight cotangent split this
    /// way whatever their own tile.
    pub fn k_chunk(&self, batch: usize) -> usize {
        self.k_chunk_tiled(batch, GEMM_TILE)
    }

    /// The run of the contracted dimension one block sums (split-K), for a kernel whose output
    /// tiles are `tile`×`tile`: `k` itself (at least 1) when the `batch` products' tiles are
    /// [`SPLIT_K_TILES`] or more (the thread's [`crate::gates::split_k_tiles`] under an
    /// override), or `k` is under two [`SPLIT_K_MIN_CHUNK`]s; otherwise `k` in
    /// up to `min(k / SPLIT_K_MIN_CHUNK, ⌈256 / tiles⌉, SPLIT_K_MAX)` runs, each a multiple of
    /// 16. A conv's weight gradient (an 8×9 output over `k` = 50 176) is one tile: one
    /// block summing all of `k` took 2 ms on an H100. A function of the shape, the tile and
    /// the thread's override alone, so the simulation device splits the same way
    /// ([`crate::device::sim::linalg::gemm`]). The tile of a product at a precision:
    /// [`split_tile`].
    pub fn k_chunk_tiled(&self, batch: usize, tile: usize) -> usize {
        let tiles = batch * self.m.div_ceil(tile) * self.n.div_ceil(tile);
        if tiles == 0 || tiles >= crate::gates::split_k_tiles() || self.k < 2 * SPLIT_K_MIN_CHUNK {
            return self.k.max(1);
        }
        let splits = (self.k / SPLIT_K_MIN_CHUNK)
            .min(256usize.div_ceil(tiles))
            .min(SPLIT_K_MAX);
        self.k.div_ceil(splits).next_multiple_of(16)
    }

    /// How many runs of [`k_chunk`](Self::k_chunk) cover `k` (1: no split).
    pub fn k_splits(&self, batch: usize) -> usize {
        self.k_splits_tiled(batch, GEMM_TILE)
    }

    /// How many runs of [`k_chunk_tiled`](Self::k_chunk_tiled) cover `k` (1: no split).
    pub fn k_splits_tiled(&self, batch: usize, tile: usize) -> usize {
        self.k.div_ceil(self.k_chunk_tiled(batch, tile)).max(1)
    }

    /// The stored (rows, cols) of operand `which` (0: `a`, 1: `b`, 2: the result): `a` is
    /// (m, k), or (k, m) with `ta`; `b` is (k, n), or (n, k) with `tb`; the result (m, n).
    pub fn stored(&self, which: usize) -> (usize, usize) {
        match which {
            0 if self.ta => (self.k, self.m),
            0 => (self.m, self.k),
            1 if self.tb => (self.n, self.k),
            1 => (self.k, self.n),
            _ => (self.m, self.n),
        }
    }
}

/// Where the `count` matrices of each operand of a batched product lie in its buffer.
///
/// Product `z` is head `z % heads` of group `z / heads`. An operand stored **head-merged** holds,
/// per group, the matrices' rows in order with the heads' rows side by side: (groups, rows,
/// heads, cols), the layout in which one product `x·W` leaves the queries of every attention
/// head. The others are stored product-major, (count, rows, cols), as [`Device::bmm`] takes
/// them. Both hold `count·rows·cols` floats; reading a head-merged operand in place is
/// `permute([groups, rows, heads, cols], [0, 2, 1, 3])` without the copy.
/// PyTorch: a `bmm` over `x.view(B, n, H, d).transpose(1, 2)`, which reads the strides.
///
/// A head-merged operand `a` or `b` may be **grouped** ([`Batch::grouped`]): it holds
/// `kv_heads` heads a row, (groups, rows, kv_heads, cols), and product z reads its head
/// `(z % heads) / (heads / kv_heads)`, so that `heads / kv_heads` consecutive products share
/// one matrix (grouped-query attention's keys and values, PyTorch's `enable_gqa`), without the
/// copy of `repeat_interleave`. A result is never grouped (its products would write one
/// matrix).
///
/// [`Device::bmm`]: super::Device::bmm
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Products in all (`groups · heads`).
    pub count: usize,
    /// Heads per group (1 for a plain batch).
    pub heads: usize,
    /// Which of `[a, b, result]` are stored head-merged.
    pub merged: [bool; 3],
    /// Heads a row of the grouped operands holds (dividing `heads`; `heads` when none is).
    pub kv_heads: usize,
    /// Which of `[a, b]` are grouped (each also head-merged).
    pub grouped: [bool; 2],
}

impl Batch {
    /// `count` products, every operand product-major (what [`Device::bmm`] takes).
    ///
    /// [`Device::bmm`]: super::Device::bmm
    pub fn plain(count: usize) -> Batch {
        Batch::heads(count, 1, [false; 3])
    }

    /// `groups · heads` products, the operands flagged in `merged` (`[a, b, result]`) stored
    /// head-merged.
    pub fn heads(groups: usize, heads: usize, merged: [bool; 3]) -> Batch {
        Batch {
            count: groups.saturating_mul(heads),
            heads,
            merged,
            kv_heads: heads,
            grouped: [false; 2],
        }
    }

    /// The same products with the operands flagged in `grouped` (`[a, b]`, each head-merged)
    /// holding `kv_heads` heads a row, product z reading head `(z % heads) / (heads /
    /// kv_heads)` of them. With `kv_heads = heads` every operand reads as before.
    pub fn grouped(self, kv_heads: usize, grouped: [bool; 2]) -> Batch {
        Batch {
            kv_heads,
            grouped,
            ..self
        }
    }

    /// Whether operand `which` (0: `a`, 1: `b`, 2: the result) is grouped.
    fn is_grouped(&self, which: usize) -> bool {
        self.grouped.get(which).copied().unwrap_or(false)
    }

    /// The heads a row of head-merged operand `which` holds: `kv_heads` where it is grouped,
    /// else `heads`.
    pub fn stored_heads(&self, which: usize) -> usize {
        match self.is_grouped(which) {
            true => self.kv_heads,
            false => self.heads,
        }
    }

    /// The matrices operand `which` holds: `count`, or `count·kv_heads/heads` where it is
    /// grouped.
    pub fn matrices(&self, which: usize) -> usize {
        match self.is_grouped(which) {
            true => self.count / self.heads.max(1) * self.kv_heads,
            false => self.count,
        }
    }

    /// The start of product `z`'s matrix in operand `which` (0: `a`, 1: `b`, 2: the result)
    /// and the stride between its rows, the matrix being `rows × cols` as stored. The same
    /// arithmetic as `mat_at` in `kernels/linalg.cu`.
    pub fn at(&self, which: usize, z: usize, (rows, cols): (usize, usize)) -> (usize, usize) {
        if self.merged[which] {
            let h = self.heads.max(1);
            let stored = self.stored_heads(which).max(1);
            let head = tl_spec::ops::attention::mha::kv_head(z % h, h, stored);
            ((z / h) * rows * stored * cols + head * cols, stored * cols)
        } else {
            (z * rows * cols, cols)
        }
    }

    /// The kernel's flag word: bit 0 `a`, bit 1 `b`, bit 2 the result stored head-merged;
    /// bit 3 `a`, bit 4 `b` grouped (holding `kv_heads` heads a row).
    pub fn merged_bits(&self) -> u32 {
        let flags = self.merged.iter().chain(&self.grouped);
        flags.enumerate().map(|(i, &m)| u32::from(m) << i).sum()
    }
}

/// Which tiling the CUDA device's matrix product runs: `tl_gemm`, 64×64 outputs a block (4×4
/// a thread), or `tl_gemm_wide`, 128×128 (8×8 a thread). Both sum every output in the same
/// order, so the choice changes the time, never the bits (`kernels/linalg.cu`); the simulation
/// device has one order and no tiles. Set per device with
/// `CudaDevice::set_gemm_tiles` (features `cuda`, `cuda-emu`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GemmTiles {
    /// Wide tiles where the launch has [`WIDE_MIN_TILES`] of them or more, else narrow (the
    /// default).
    #[default]
    Auto,
    /// Always 64×64.
    Narrow,
    /// Always 128×128.
    Wide,
}

/// Which tilings the CUDA device's fused attention runs where dynamic shared memory allows
/// larger ones: `Narrow` (the kernels in static shared memory), `Wide`, or `Auto` (the
/// default: each head size the tiling measured faster). `Wide`: the forward for
/// d ≤ 64 with 64 keys a step (`tl_flash_fwd_wide`: four tiles of 16, every thread in the
/// softmax phase, half the barriers a key; 51.5 KiB), and dQ for 64 < d ≤ 128 on blocks of 64
/// query rows with register micro-tiles (`tl_flash_bwd_q_wide`, 96 KiB) instead of one
/// block of 16 × 16 threads per tile of 16. Per row (key) every tile of 16 runs the same
/// operations in the same order either way, so the choice changes the time, never the bits
/// (`kernels/attention.cu`). Set per device with `CudaDevice::set_flash_tiles` (features
/// `cuda`, `cuda-emu`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlashTiles {
    /// `Narrow` where d ≤ 64, `Wide` where d > 64 (the default). On an H200 (2026-12-04, the
    /// GPU bench's `attention-core/…` rows, forward and backward) the wide forward at d = 64
    /// ran within 1% of the narrow one (1% slower from n = 4096), and the wide backward at
    /// d = 128 in half the time (n = 4096: 11.5 ms against 23.9).
    #[default]
    Auto,
    /// 32 keys a step.
    Narrow,
    /// 64 keys a step in the forward where d ≤ 64; dQ on blocks of 64 rows where d > 64.
    Wide,
}

impl FlashTiles {
    /// Whether heads of `d` run the wide kernels under this setting.
    pub fn wide_for(self, d: usize) -> bool {
        match self {
            FlashTiles::Auto => d > 64,
            FlashTiles::Narrow => false,
            FlashTiles::Wide => true,
        }
    }
}

/// The wide tiles (128×128 outputs, over every job of the launch) from which
/// [`GemmTiles::Auto`] takes them. On an H200 (2026-11-27, `gpu-bundle/gemmbench`) the wide
/// tiling ran 2048³ (256 tiles) in 0.76 ms against 0.92, 4096³ in 5.97 against 7.11, and lost
/// at 1024³ (64 tiles: 0.23 against 0.13 ms), where too few blocks fill the 132 multiprocessors.
pub const WIDE_MIN_TILES: usize = 256;

impl GemmTiles {
    /// The side of the output tile for `jobs` products of (m, n) results (a split product's
    /// runs counted as jobs): 64 or 128.
    pub fn side(self, m: usize, n: usize, jobs: usize) -> usize {
        match self {
            GemmTiles::Narrow => 64,
            GemmTiles::Wide => 128,
            GemmTiles::Auto => {
                let wide = jobs
                    .saturating_mul(m.div_ceil(128))
                    .saturating_mul(n.div_ceil(128));
                if wide >= WIDE_MIN_TILES { 128 } else { 64 }
            }
        }
    }
}

/// Output tiles (over the batch, each of the kernel's own side: [`split_tile`]) from which a
/// matmul is not split along `k` (overridden per thread by
/// [`gates::force_split_k_tiles`](crate::gates::force_split_k_tiles)).
pub const SPLIT_K_TILES: usize = 64;
/// The shortest run of `k` a split matmul gives one block.
pub const SPLIT_K_MIN_CHUNK: usize = 128;
/// The most runs a matmul's `k` is split into.
pub const SPLIT_K_MAX: usize = 128;

/// The output tile side the f32 GEMM's split counts ([`Gemm::k_chunk`]): `tl_gemm`'s 64.
pub const GEMM_TILE: usize = 64;
/// The output tile side of the tensor-core GEMM `tl_gemm_tc` (128×128), which its split counts.
pub const TC_TILE: usize = 128;

/// The tile side whose count decides the split of a product run at `prec`
/// ([`Gemm::k_chunk_tiled`]): [`GEMM_TILE`] in f32, [`TC_TILE`] under autocast (the
/// tensor-core GEMM). The CUDA launch and the sim twin both take it from here.
pub fn split_tile(prec: Precision) -> usize {
    if prec.is_autocast() {
        TC_TILE
    } else {
        GEMM_TILE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (kc, runs) of `g` over `batch` products counting `tile`×`tile` tiles.
    fn split(g: Gemm, batch: usize, tile: usize) -> (usize, usize) {
        (g.k_chunk_tiled(batch, tile), g.k_splits_tiled(batch, tile))
    }

    #[test]
    fn the_default_flash_tiling_is_wide_past_heads_of_64() {
        assert_eq!(FlashTiles::default(), FlashTiles::Auto);
        for (d, wide) in [(1, false), (64, false), (65, true), (128, true)] {
            assert_eq!(FlashTiles::Auto.wide_for(d), wide, "d = {d}");
            assert!(FlashTiles::Wide.wide_for(d) && !FlashTiles::Narrow.wide_for(d));
        }
    }

    #[test]
    fn the_tensor_core_split_counts_its_own_tiles() {
        assert_eq!(split_tile(Precision::F32), GEMM_TILE);
        assert_eq!(split_tile(Precision::Bf16), TC_TILE);
        assert_eq!(split_tile(Precision::Tf32), TC_TILE);
        let sq = |s: usize| Gemm::nn(s, s, s);
        // 512³: 64 tiles of 64 (no split in f32), 16 of 128: four runs of 128 under autocast.
        assert_eq!(split(sq(512), 1, GEMM_TILE), (512, 1));
        assert_eq!(split(sq(512), 1, TC_TILE), (128, 4));
        // 512 × 4096 × 512: 16 tensor-core tiles, ⌈256 / 16⌉ = 16 runs of 256.
        assert_eq!(split(Gemm::nn(512, 4096, 512), 1, TC_TILE), (256, 16));
        assert_eq!(split(Gemm::nn(512, 4096, 512), 1, GEMM_TILE), (4096, 1));
        // From 64 tiles of its own the GPU is filled: 1024³ has 64 of 128, no split either way.
        for s in [1024, 2048, 4096] {
            assert_eq!(split(sq(s), 1, GEMM_TILE), (s, 1), "{s}");
            assert_eq!(split(sq(s), 1, TC_TILE), (s, 1), "{s}");
        }
        assert_eq!(split(Gemm::nn(128, 4096, 128), 64, TC_TILE), (4096, 1));
        assert_eq!(split(Gemm::nn(128, 4096, 128), 63, TC_TILE).1, 5);
        // 16 products of 65 × 70 over k = 300: 64 tiles of 64 (f32: no split), 16 of 128
        // (autocast: runs of 160, the last of 140).
        let g = Gemm::nn(65, 300, 70);
        assert_eq!(split(g, 16, GEMM_TILE), (300, 1));
        assert_eq!(split(g, 16, TC_TILE), (160, 2));
        // The f32 decision is k_chunk's, unchanged: one tile over a long k, or short k.
        let one = Gemm::nn(16, 1000, 24);
        assert_eq!(split(one, 1, GEMM_TILE), (one.k_chunk(1), one.k_splits(1)));
        assert_eq!(split(one, 1, GEMM_TILE), (144, 7));
        assert_eq!(split(one, 1, TC_TILE), (144, 7));
        assert_eq!(sq(512).k_chunk(1), 512);
        assert_eq!(Gemm::nn(130, 600, 140).k_chunk(1), 160);
        // Small products never split: k under two minimum runs, or nothing to compute.
        for tile in [GEMM_TILE, TC_TILE] {
            assert_eq!(split(Gemm::nn(1, 255, 1), 1, tile), (255, 1));
            assert_eq!(split(Gemm::nn(1, 0, 1), 1, tile), (1, 1));
            assert_eq!(split(Gemm::nn(0, 4096, 5), 1, tile), (4096, 1));
            assert_eq!(split(sq(16), 1, tile), (16, 1));
        }
    }
}
