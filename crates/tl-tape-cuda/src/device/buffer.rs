//! Buffer handles ([`Buffer`]), the dims of a matrix product ([`Gemm`]) and where a batched
//! product's matrices lie ([`Batch`]): the plain data every [`Device`](super::Device) primitive
//! takes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc::{Allocation, CachingAllocator, RawMemory};

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

    /// The run of the contracted dimension one block of the matmul kernel sums (split-K): `k`
    /// itself (at least 1) when the `batch` products' 64×64 output tiles are
    /// [`SPLIT_K_TILES`] or more, or `k` is under two [`SPLIT_K_MIN_CHUNK`]s; otherwise `k` in
    /// up to `min(k / SPLIT_K_MIN_CHUNK, ⌈256 / tiles⌉, SPLIT_K_MAX)` runs, each a multiple of
    /// 16. A conv's weight gradient (an 8×9 output over `k` = 50 176) is one tile: one
    /// block summing all of `k` took 2 ms on an H100. A function of the shape alone, so the
    /// simulation device splits the same way ([`crate::device::sim::linalg::gemm`]).
    pub fn k_chunk(&self, batch: usize) -> usize {
        let tiles = batch * self.m.div_ceil(64) * self.n.div_ceil(64);
        if tiles == 0 || tiles >= SPLIT_K_TILES || self.k < 2 * SPLIT_K_MIN_CHUNK {
            return self.k.max(1);
        }
        let splits = (self.k / SPLIT_K_MIN_CHUNK)
            .min(256usize.div_ceil(tiles))
            .min(SPLIT_K_MAX);
        self.k.div_ceil(splits).next_multiple_of(16)
    }

    /// How many runs of [`k_chunk`](Self::k_chunk) cover `k` (1: no split).
    pub fn k_splits(&self, batch: usize) -> usize {
        self.k.div_ceil(self.k_chunk(batch)).max(1)
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
/// [`Device::bmm`]: super::Device::bmm
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Products in all (`groups · heads`).
    pub count: usize,
    /// Heads per group (1 for a plain batch).
    pub heads: usize,
    /// Which of `[a, b, result]` are stored head-merged.
    pub merged: [bool; 3],
}

impl Batch {
    /// `count` products, every operand product-major (what [`Device::bmm`] takes).
    ///
    /// [`Device::bmm`]: super::Device::bmm
    pub fn plain(count: usize) -> Batch {
        Batch {
            count,
            heads: 1,
            merged: [false; 3],
        }
    }

    /// `groups · heads` products, the operands flagged in `merged` (`[a, b, result]`) stored
    /// head-merged.
    pub fn heads(groups: usize, heads: usize, merged: [bool; 3]) -> Batch {
        Batch {
            count: groups.saturating_mul(heads),
            heads,
            merged,
        }
    }

    /// The start of product `z`'s matrix in operand `which` (0: `a`, 1: `b`, 2: the result)
    /// and the stride between its rows, the matrix being `rows × cols` as stored. The same
    /// arithmetic as `mat_at` in `kernels/linalg.cu`.
    pub fn at(&self, which: usize, z: usize, (rows, cols): (usize, usize)) -> (usize, usize) {
        if self.merged[which] {
            let h = self.heads.max(1);
            ((z / h) * rows * h * cols + (z % h) * cols, h * cols)
        } else {
            (z * rows * cols, cols)
        }
    }

    /// The kernel's flag word: bit 0 `a`, bit 1 `b`, bit 2 the result stored head-merged.
    pub fn merged_bits(&self) -> u32 {
        self.merged
            .iter()
            .enumerate()
            .map(|(i, &m)| u32::from(m) << i)
            .sum()
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

/// Which tiling the CUDA device's fused attention forward runs for heads of d ≤ 64:
/// `tl_flash_fwd`, 32 keys a step in static shared memory, or `tl_flash_fwd_wide`, 64 keys a
/// step (four tiles of 16: every thread in the softmax phase, half the barriers a key) in 51.5
/// KiB of dynamic shared memory. Per query row every tile of 16 keys runs the same operations
/// in the same order either way, so the choice changes the time, never the bits
/// (`kernels/attention.cu`); d > 64 always takes the narrow kernel. Set per device with
/// `CudaDevice::set_flash_tiles` (features `cuda`, `cuda-emu`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlashTiles {
    /// 32 keys a step (the default: the kernel timed on an H200).
    #[default]
    Narrow,
    /// 64 keys a step, where d ≤ 64.
    Wide,
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

/// Output tiles (64×64, over the batch) from which a matmul is not split along `k`.
pub const SPLIT_K_TILES: usize = 64;
/// The shortest run of `k` a split matmul gives one block.
pub const SPLIT_K_MIN_CHUNK: usize = 128;
/// The most runs a matmul's `k` is split into.
pub const SPLIT_K_MAX: usize = 128;
