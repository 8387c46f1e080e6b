//! The one matrix product every CPU kernel goes through, and the knob for its threads.
//!
//! **Kernel.** [`matmul`] calls faer's `matmul`, which picks its micro-kernel at run time from
//! what the CPU has: AVX-512 (`avx512f`) where present, else AVX2 + FMA, else portable code. One
//! binary therefore runs the fastest path of whatever machine it lands on; the same tests run on
//! both (the development machine has AVX2 only; the GPU machine's Xeon has AVX-512:
//! docs/performance.md). faer replaced ndarray's `general_mat_mul` (matrixmultiply): measured
//! side by side on the steps' shapes, matrixmultiply has no AVX-512 kernel and reaches 12–50
//! GFLOP/s on skinny products (n = 16, k = 9–72, the im2col products of a small conv) where faer
//! reaches 60–90 (docs/performance.md, "GEMM"), and faer's API is safe (this crate has no
//! `unsafe`). faer is built without `std` (the workspace Cargo.toml says why: its std-only
//! kernels leave the vector unit in a state that slowed all later scalar code ~30×), so its
//! products run on the gemm crate's kernels, AVX-512 through its `x86-v4` variants.
//!
//! **Views.** Operands are [`Mat`] / [`MatMut`] views over row-major slices ([`rows`],
//! [`rows_mut`]); a transpose ([`Mat::t`]) or a block of rows or columns (one attention head) is
//! a strided view, never a copy. [`matmul`] checks every view against its slice and the
//! dimensions against each other before anything runs: a mismatch is an error naming the op,
//! never a panic. `f32` and `f64` go to faer (reached through [`Scalar::typed`], no `unsafe`);
//! any other [`Scalar`] gets a plain triple loop.
//!
//! **Threads.** [`set_threads`] (or the environment variable `TL_NUM_THREADS`, read once) sets
//! how many threads one product may use; the default is the number of cores the process may run
//! on. A product of fewer than [`PARALLEL_MIN_WORK`] multiply-adds always runs on the calling
//! thread: splitting it costs more than it saves. A larger one is cut along the output's longer
//! side into one block per thread (aligned to 16), each a sequential faer product, the first
//! on the calling thread and the others on rayon's pool ([`crate::par::join`]). faer's own
//! parallel split lost to one thread on the steps' skinny products on the 2-core VM
//! (64×784·784×256: 294 µs on one thread, 351 µs on two); ours takes 158 µs
//! (docs/performance.md). The result does not depend on the thread count: every output's sum
//! over k runs in the same order whatever block it lands in (blocks never change the gemm
//! crate's k-blocking, see `GEMM_SMALL_SIDE`; tested on skinny, tall and ragged shapes).
//!
//! **Autocast.** Under [`crate::precision::Precision::Bf16`] or `Tf32` (installed by a tape set
//! to it) an f32 product reads its operands rounded to bf16 (TF32) and sums in f32: rounded
//! into f32 copies, then the f32 path above (`gemm/autocast.rs`; the semantics in
//! docs/semantics.md, "Mixed precision").

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use faer::{Accum, Par};
use tl_ir::Op;
use tl_spec::{Error as SpecError, Scalar, Typed, TypedMut};

use crate::Result;
use crate::gates::GemmLayout;

pub(crate) mod autocast;
mod narrow;

pub use narrow::MAX_K as NARROW_MAX_K;

/// Products with fewer multiply-adds (`m·n·k`) than this (2²² ≈ a 161³ product) run on one
/// thread whatever [`threads`] says. Measured on the training steps with two threads on the
/// 2-core VM (docs/performance.md): at 2²¹ the transformer's 128×64·64×256 products were split
/// and its step got 22% slower than on one thread (waking the second thread costs more than
/// half of a 40 µs product); at 2²² the mlp and cnn steps gain 10–20% and 20%, the transformer
/// is unchanged; at 2²³ the mlp loses its 64×256·256×256 products' share of the gain.
pub const PARALLEL_MIN_WORK: usize = 1 << 22;

/// 0 = not set by [`set_threads`]: the default applies.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The environment variable that sets the default thread count.
pub const THREADS_VAR: &str = "TL_NUM_THREADS";

/// The cores this process may run on (at least 1).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What [`THREADS_VAR`] should hold, for its warning.
const THREADS_EXPECTS: &str = "a thread count (a positive integer)";

/// What is used in place of a bad [`THREADS_VAR`], for its warning.
fn threads_instead() -> String {
    format!(
        "the default, {} threads (the cores this process may run on)",
        cores()
    )
}

/// The default thread count: `TL_NUM_THREADS` if it is a positive integer, else the cores
/// this process may run on (after one warning when it is set to anything else).
fn default_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        tl_spec::env::read(
            THREADS_VAR,
            THREADS_EXPECTS,
            tl_spec::env::parse_positive,
            threads_instead,
        )
        .unwrap_or_else(cores)
    })
}

/// How many threads one matrix product may use (at least 1): the calling thread's
/// [`crate::gates`] override if there is one, else [`set_threads`]'s setting, else the default.
pub fn threads() -> usize {
    if let Some(n) = crate::gates::current().threads {
        return n.max(1);
    }
    match THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// Let one matrix product use up to `n` threads, process-wide; `0` restores the default (the
/// `TL_NUM_THREADS` environment variable, else the number of cores). Returns the previous
/// setting (`0` if it was the default), so `set_threads(set_threads(n))` restores it. Results
/// do not change with `n`, only the time.
pub fn set_threads(n: usize) -> usize {
    THREADS.swap(n, Ordering::Relaxed)
}

/// The parallelism for an `m·k` by `k·n` product.
fn split_threads(m: usize, n: usize, k: usize) -> usize {
    let work = m.saturating_mul(n).saturating_mul(k);
    let min_work = crate::gates::get(|g| g.gemm_parallel_min_work, PARALLEL_MIN_WORK);
    match threads() {
        t if t > 1 && work >= min_work => t,
        _ => 1,
    }
}

/// Columns (or rows) per block are a multiple of this, so every block but the last fills the
/// micro-kernels' tiles.
const SPLIT_ALIGN: usize = 16;

/// The gemm crate (under faer) takes another k-blocking when both sides of a product are at
/// most this (`kc = min(k, 512)` instead of its cache-derived `kc`), which changes the order of
/// the sums over k.
const GEMM_SMALL_SIDE: usize = 64;

/// The name the layout copies are checked under (their refusal only declines the fast path).
const GEMM: &str = "gemm";

/// Outputs (rows × cols) up to which the gemm crate runs its "horizontal" kernels (each output
/// a dot product over k in vector lanes, then summed across them) where the left operand's
/// rows and the right one's columns are contiguous: another order of the sums. Seen on an AVX2
/// host, where the mlp's `x·wᵀ` layout reaches it (AVX-512 copies `x` column-major first).
const GEMM_HORIZONTAL_OUTPUTS: usize = 16 * 16;

/// m·n·k up to which faer hands an f32/f64 product to nano-gemm, its small-product kernels.
const NANO_GEMM_MNK: usize = 16 * 16 * 16;

/// The kernel families an `(rows, k)·(k, cols)` product can take in faer and the gemm crate
/// whose sums over k run in different orders: nano-gemm (whose own kernels change with the
/// side it vectorizes, at 1, 2, 4 and 8 rows), one row and one column apart (faer and the gemm
/// crate test one before the other, each with a matrix-vector path of its own, and a 1×1
/// block is both), the horizontal kernels, the small-side k-blocking. [`split_matmul`] cuts a
/// product only where both blocks fall in the whole product's families, and never one small
/// enough for nano-gemm (the production threshold, [`PARALLEL_MIN_WORK`], is far above it),
/// so the bits never depend on the thread count (`results_do_not_depend_on_the_thread_count`
/// and `a_split_that_leaves_a_vector_keeps_the_bits` hold us to it).
fn sum_order_family(rows: usize, cols: usize, k: usize) -> [bool; 5] {
    let outputs = rows.saturating_mul(cols);
    [
        outputs.saturating_mul(k) <= NANO_GEMM_MNK,
        rows <= 1,
        cols <= 1,
        outputs <= GEMM_HORIZONTAL_OUTPUTS,
        rows <= GEMM_SMALL_SIDE && cols <= GEMM_SMALL_SIDE,
    ]
}

/// `c ← alpha·a·b (+ c)` on `t` threads: the output's longer side is cut into `t` aligned
/// blocks, each a sequential faer product on its own thread (rayon's pool). Each output element
/// is still one sequential sum over k, so the bits do not depend on `t`.
fn split_matmul<E: faer::traits::ComplexField + Copy>(
    c: faer::MatMut<'_, E>,
    accum: Accum,
    a: faer::MatRef<'_, E>,
    b: faer::MatRef<'_, E>,
    alpha: E,
    t: usize,
) {
    let (m, n) = (c.nrows(), c.ncols());
    let (long, short) = (m.max(n), m.min(n));
    let t1 = t / 2;
    let mid = crate::par::share(long, t1, t)
        .div_ceil(SPLIT_ALIGN)
        .saturating_mul(SPLIT_ALIGN);
    // Both blocks must sum over k as the whole product does (sum_order_family), each taken
    // as it lies: the cut is along the columns when n ≥ m.
    let k = a.ncols();
    let family = |side: usize| match n >= m {
        true => sum_order_family(short, side, k),
        false => sum_order_family(side, short, k),
    };
    let [nano, ..] = family(long);
    let same_path =
        !nano && family(mid) == family(long) && family(long.saturating_sub(mid)) == family(long);
    if t < 2 || mid == 0 || mid >= long || !same_path {
        faer::linalg::matmul::matmul(c, accum, a, b, alpha, Par::Seq);
        return;
    }
    if n >= m {
        let (c0, c1) = c.split_at_col_mut(mid);
        let (b0, b1) = b.split_at_col(mid);
        crate::par::join(
            || split_matmul(c0, accum, a, b0, alpha, t1),
            || split_matmul(c1, accum, a, b1, alpha, t - t1),
        );
    } else {
        let (c0, c1) = c.split_at_row_mut(mid);
        let (a0, a1) = a.split_at_row(mid);
        crate::par::join(
            || split_matmul(c0, accum, a0, b, alpha, t1),
            || split_matmul(c1, accum, a1, b, alpha, t - t1),
        );
    }
}

/// Where a view's elements lie: element (i, j) at `offset + i·rs + j·cs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl Geometry {
    fn t(self) -> Self {
        Geometry {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Rows `start..start + len` (saturating: an out-of-range block fails [`Geometry::fits`]).
    fn row_block(self, start: usize, len: usize) -> Self {
        Geometry {
            offset: self.offset.saturating_add(start.saturating_mul(self.rs)),
            rows: if start.saturating_add(len) <= self.rows {
                len
            } else {
                usize::MAX
            },
            ..self
        }
    }

    fn col_block(self, start: usize, len: usize) -> Self {
        self.t().row_block(start, len).t()
    }

    fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// Whether every element lies inside a slice of `len`.
    fn fits(&self, len: usize) -> bool {
        if self.is_empty() {
            return self.offset <= len && self.rows != usize::MAX && self.cols != usize::MAX;
        }
        let last = (self.rows - 1)
            .checked_mul(self.rs)
            .zip((self.cols - 1).checked_mul(self.cs))
            .and_then(|(a, b)| a.checked_add(b)?.checked_add(self.offset));
        last.is_some_and(|l| l < len)
    }

    fn at(&self, i: usize, j: usize) -> usize {
        self.offset + i * self.rs + j * self.cs
    }

    /// `data` as a faer view, where the layout is one faer takes from a slice (unit column
    /// stride and row stride ≥ cols, or the transpose); `None` otherwise. Built from faer's
    /// column-major constructors only: faer 0.24.4's `MatMut::from_row_major_slice_with_stride_mut`
    /// swaps the two strides (it writes outside the slice; found by this module's tests).
    fn faer<'a, U>(&self, data: &'a [U]) -> Option<faer::MatRef<'a, U>> {
        let s = data.get(self.offset..)?;
        let (r, c) = (self.rows, self.cols);
        if self.cs == 1 && self.rs >= c {
            Some(faer::MatRef::from_column_major_slice_with_stride(s, c, r, self.rs).transpose())
        } else if self.rs == 1 && self.cs >= r {
            Some(faer::MatRef::from_column_major_slice_with_stride(
                s, r, c, self.cs,
            ))
        } else {
            None
        }
    }

    fn faer_mut<'a, U>(&self, data: &'a mut [U]) -> Option<faer::MatMut<'a, U>> {
        let s = data.get_mut(self.offset..)?;
        let (r, c) = (self.rows, self.cols);
        if self.cs == 1 && self.rs >= c {
            let v = faer::MatMut::from_column_major_slice_with_stride_mut(s, c, r, self.rs);
            Some(v.transpose_mut())
        } else if self.rs == 1 && self.cs >= r {
            Some(faer::MatMut::from_column_major_slice_with_stride_mut(
                s, r, c, self.cs,
            ))
        } else {
            None
        }
    }
}

/// A read-only matrix view into a slice (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a, T> {
    data: &'a [T],
    g: Geometry,
}

impl<'a, T> Mat<'a, T> {
    /// Rows.
    pub fn nrows(&self) -> usize {
        self.g.rows
    }

    /// Columns.
    pub fn ncols(&self) -> usize {
        self.g.cols
    }

    /// The transpose (a view).
    pub fn t(self) -> Self {
        Mat {
            g: self.g.t(),
            ..self
        }
    }

    /// Rows `start..start + len` (a view; out of range is reported by [`matmul`]).
    pub fn row_block(self, start: usize, len: usize) -> Self {
        Mat {
            g: self.g.row_block(start, len),
            ..self
        }
    }

    /// Columns `start..start + len` (a view; out of range is reported by [`matmul`]).
    pub fn col_block(self, start: usize, len: usize) -> Self {
        Mat {
            g: self.g.col_block(start, len),
            ..self
        }
    }
}

/// A writable matrix view into a slice (see the module docs).
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    g: Geometry,
}

impl<'a, T> MatMut<'a, T> {
    /// A shorter-lived view of the same elements, so `self` can be used again afterwards.
    pub fn as_mut(&mut self) -> MatMut<'_, T> {
        MatMut {
            data: self.data,
            g: self.g,
        }
    }

    /// The block of rows `r0..r0 + r` and columns `c0..c0 + c` (a view; out of range is
    /// reported by [`matmul`]).
    pub fn block(self, r0: usize, c0: usize, r: usize, c: usize) -> Self {
        MatMut {
            g: self.g.row_block(r0, r).col_block(c0, c),
            ..self
        }
    }
}

/// The row-major `(r, c)` matrix held by `data` (an error naming `op` if the length is not
/// `r·c`).
pub fn rows<'a, T: Scalar>(op: &Op, data: &'a [T], r: usize, c: usize) -> Result<Mat<'a, T>> {
    check_len(op, data.len(), r, c)?;
    Ok(Mat {
        data,
        g: row_major(r, c),
    })
}

/// The row-major `(r, c)` matrix held by `data`, writable (an error naming `op` if the length
/// is not `r·c`).
pub fn rows_mut<'a, T: Scalar>(
    op: &Op,
    data: &'a mut [T],
    r: usize,
    c: usize,
) -> Result<MatMut<'a, T>> {
    check_len(op, data.len(), r, c)?;
    Ok(MatMut {
        data,
        g: row_major(r, c),
    })
}

fn row_major(r: usize, c: usize) -> Geometry {
    Geometry {
        offset: 0,
        rows: r,
        cols: c,
        rs: c,
        cs: 1,
    }
}

fn check_len(op: &Op, len: usize, r: usize, c: usize) -> Result<()> {
    if r.checked_mul(c) != Some(len) {
        return Err(SpecError::shape(
            op.name(),
            format!("a {len}-element buffer is not a ({r}, {c}) matrix"),
        )
        .into());
    }
    Ok(())
}

/// `c ← alpha·a·b` (`accumulate == false`) or `c ← c + alpha·a·b` (`accumulate == true`).
/// Mismatched dimensions, or a view reaching outside its slice, are errors naming `op`.
pub fn matmul<T: Scalar>(
    op: &Op,
    c: MatMut<'_, T>,
    accumulate: bool,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    alpha: T,
) -> Result<()> {
    let ((m, k), (k2, n)) = ((a.g.rows, a.g.cols), (b.g.rows, b.g.cols));
    let fits = a.g.fits(a.data.len()) && b.g.fits(b.data.len()) && c.g.fits(c.data.len());
    if k != k2 || (c.g.rows, c.g.cols) != (m, n) || !fits {
        return Err(SpecError::shape(
            op.name(),
            format!(
                "gemm operands ({m}, {k}) · ({k2}, {n}) do not fit a ({}, {}) output{}",
                c.g.rows,
                c.g.cols,
                if fits {
                    ""
                } else {
                    " (a view outside its buffer)"
                }
            ),
        )
        .into());
    }
    if c.g.is_empty() {
        return Ok(());
    }
    let precision = crate::precision::current();
    if precision.is_autocast()
        && let (Typed::F32(ad), Typed::F32(bd), TypedMut::F32(cd)) =
            (T::typed(a.data), T::typed(b.data), T::typed_mut(c.data))
    {
        let (a, b) = (Mat { data: ad, g: a.g }, Mat { data: bd, g: b.g });
        let c = MatMut { data: cd, g: c.g };
        return autocast::matmul(precision, op, c, accumulate, a, b, alpha.as_f64() as f32);
    }
    product(c, accumulate, a, b, alpha);
    Ok(())
}

/// [`matmul`] at the operands' own precision, views already checked and `c` not empty.
fn product<T: Scalar>(c: MatMut<'_, T>, accumulate: bool, a: Mat<'_, T>, b: Mat<'_, T>, alpha: T) {
    let (m, k, n) = (a.g.rows, a.g.cols, b.g.cols);
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    let t = split_threads(m, n, k);
    match (T::typed(a.data), T::typed(b.data), T::typed_mut(c.data)) {
        (Typed::F32(ad), Typed::F32(bd), TypedMut::F32(cd)) => {
            if narrow::applies(&a.g, &b.g, &c.g)
                && narrow::product(
                    Mat { data: ad, g: a.g },
                    Mat { data: bd, g: b.g },
                    MatMut {
                        data: &mut *cd,
                        g: c.g,
                    },
                    accumulate,
                    alpha.as_f64() as f32,
                )
            {
                return;
            }
            if column_major_product(a.g, ad, b.g, bd, c.g, cd, accumulate, alpha, t) {
                return;
            }
            let bt = row_major_rhs(m, &b.g, bd, &c.g, t);
            let (bd, bg) = match &bt {
                Some(v) => (&v[..], row_major(k, n)),
                None => (bd, b.g),
            };
            if let (Some(av), Some(bv), Some(cv)) = (a.g.faer(ad), bg.faer(bd), c.g.faer_mut(cd)) {
                split_matmul(cv, accum, av, bv, alpha.as_f64() as f32, t);
                if let Some(v) = bt {
                    tl_spec::pool::give(v);
                }
                return;
            }
        }
        (Typed::F64(ad), Typed::F64(bd), TypedMut::F64(cd)) => {
            if let (Some(av), Some(bv), Some(cv)) = (a.g.faer(ad), b.g.faer(bd), c.g.faer_mut(cd)) {
                split_matmul(cv, accum, av, bv, alpha.as_f64(), t);
                return;
            }
        }
        _ => {}
    }
    plain(c, accumulate, a, b, alpha);
}

/// Sides (m, k, n) from which [`row_major_rhs`] copies a column-major right-hand side.
const TRANSPOSE_MIN_SIDE: usize = 16;

/// Whether every side of an `(m, k)·(k, n)` product reaches [`TRANSPOSE_MIN_SIDE`] (or its
/// [`crate::gates`] override).
fn sides_reach(m: usize, k: usize, n: usize) -> bool {
    m.min(k).min(n) >= crate::gates::get(|g| g.transpose_min_side, TRANSPOSE_MIN_SIDE)
}

/// The path the [`crate::gates`] override forces on an `x·wᵀ` product, if any.
fn forced_layout() -> Option<GemmLayout> {
    crate::gates::current().gemm_layout
}

/// Whether an `(m, k)·(k, n)` product with a column-major right-hand side (`x·wᵀ`) and a
/// row-major output is made by [`column_major_product`] (copy `x` column-major and the output
/// back, m·k + m·n elements, and the output in first too when the product is added to it)
/// rather than by [`row_major_rhs`] (copy `wᵀ` row-major, k·n elements) at the AVX-512 level
/// or strided at AVX2: the fewer copied elements.
fn column_major_cheaper(m: usize, k: usize, n: usize, accumulate: bool) -> bool {
    let outputs = m
        .saturating_mul(n)
        .saturating_mul(1 + usize::from(accumulate));
    m.saturating_mul(k).saturating_add(outputs) < k.saturating_mul(n)
}

/// `c ← alpha·a·b (+ c)` for a row-major `a`, a column-major `b` (a transposed row-major
/// matrix: a linear layer's `x·wᵀ`) and a row-major `c`, all contiguous, at the AVX-512 or
/// AVX2 level ([`copies_pay`]), every side at least [`TRANSPOSE_MIN_SIDE`], when
/// [`column_major_cheaper`]: the whole product in column-major form (faer's own layout), `a`
/// copied column-major (and `c` too when accumulating, so the product is added to it inside
/// the kernel as on the other paths) and the column-major result copied into `c`. Returns whether it did. A wide layer (k ≫ m, the
/// mlp's 784 inputs for a batch of 64) then copies 64×784 + 64×256 elements instead of the
/// 256×784 of `wᵀ`, and the gemm crate runs its fastest layout: 64×784·784×256 took 239 µs
/// against 293 (the copy of `wᵀ` alone 50), 64×256·256×256 78 against 87, on every shape
/// measured where the rule chooses it but one (32×288·288×64, +5%), and the rule keeps the
/// row-major copy on the shapes where that is faster (128×256·256×64: 39 against 44 µs;
/// docs/performance.md). At AVX2 (with 8×8 register transposes) the rule's choices gain as
/// much against the strided product: 64×784·784×256 289 against 325 µs, 64×256·256×256 100
/// against 107, 16×512·512×512 93 against 170; where it declines, the strided product was
/// the fastest there. Each output is still one sum over k in the same order, added to `c`
/// by the kernel: the same bits (tested across levels and thread counts). On `threads` > 1
/// the copies stay on the calling thread and the column-major product is split as any other
/// ([`split_matmul`]): the two-thread mlp step took 0.524 ms against 0.595 with its products
/// split strided.
#[allow(clippy::too_many_arguments)]
fn column_major_product(
    a: Geometry,
    ad: &[f32],
    b: Geometry,
    bd: &[f32],
    c: Geometry,
    cd: &mut [f32],
    accumulate: bool,
    alpha: impl Scalar,
    threads: usize,
) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let sides = sides_reach(m, k, n);
    let layouts = a.cs == 1 && a.rs == k && b.rs == 1 && b.cs == k && c.cs == 1 && c.rs == n;
    let chosen = match forced_layout() {
        Some(layout) => layout == GemmLayout::ColumnMajor,
        None => copies_pay() && column_major_cheaper(m, k, n, accumulate),
    };
    if !(sides && layouts && chosen) {
        return false;
    }
    let (Some(a_src), Some(c_dst)) = (
        ad.get(a.offset..a.offset + m * k),
        cd.get_mut(c.offset..c.offset + m * n),
    ) else {
        return false;
    };
    // The copies are an optimisation: where they cannot be allocated, the strided path runs.
    let copies = (
        tl_spec::alloc::try_for_overwrite(GEMM, "column-major copy of a", m * k),
        tl_spec::alloc::try_for_overwrite(GEMM, "column-major copy of c", m * n),
    );
    let (Ok(mut at), Ok(mut ct)) = copies else {
        return false;
    };
    crate::simd::transpose_f32(a_src, m, k, &mut at);
    let accum = match accumulate {
        true => {
            crate::simd::transpose_f32(c_dst, m, n, &mut ct);
            Accum::Add
        }
        false => Accum::Replace,
    };
    let col_major = |rows, cols| Geometry {
        offset: 0,
        rows,
        cols,
        rs: 1,
        cs: rows,
    };
    let views = (
        col_major(m, k).faer(&at),
        b.faer(bd),
        col_major(m, n).faer_mut(&mut ct),
    );
    let (Some(av), Some(bv), Some(cv)) = views else {
        return false;
    };
    split_matmul(cv, accum, av, bv, alpha.as_f64() as f32, threads);
    crate::simd::transpose_f32(&ct, n, m, c_dst);
    tl_spec::pool::give(at);
    tl_spec::pool::give(ct);
    true
}

/// Whether [`column_major_product`]'s copies pay at the current level: at AVX-512 and AVX2,
/// where [`crate::simd::transpose_f32`] moves whole register tiles (the baseline copies
/// element by element: 0.55 ns an element, more than the product gains).
fn copies_pay() -> bool {
    use crate::simd::{Level, level};
    matches!(level(), Level::Avx512 | Level::Avx2)
}

/// A row-major copy of a column-major right-hand side `b` (a transposed row-major matrix: the
/// `x·wᵀ` of every linear layer) for a row-major output, at the AVX-512 level, when every side
/// is at least [`TRANSPOSE_MIN_SIDE`]; `None` otherwise. (At AVX2 the strided product was as
/// fast or faster on every shape measured: 128×256·256×64 48.7 against 49.5–55 µs with the
/// copy, 256×784·784×256 1.13 against 1.19–1.41 ms.) The gemm crate packs such a `b` with
/// one scalar load per element (its row stride is not 1): 64×256×256 takes 124 µs that way and
/// 85 µs with the copy (transpose included), 128×256×64 49 against 39 µs, and no measured shape
/// of the steps loses more than noise (docs/performance.md). Below 16 a side, the gemm crate's
/// small-product path is faster strided. Same bits on every shape measured (each output is
/// still one sum over k in the same order). Single-threaded products only (`threads == 1`):
/// split across two threads the strided products were faster (mlp step 0.82–0.96 against
/// 0.97–1.07 ms). A [`crate::gates`] override of the layout replaces the level and thread rule.
fn row_major_rhs(
    m: usize,
    b: &Geometry,
    data: &[f32],
    c: &Geometry,
    threads: usize,
) -> Option<Vec<f32>> {
    let (k, n) = (b.rows, b.cols);
    let sides = sides_reach(m, k, n);
    let layouts = b.rs == 1 && b.cs == k && c.cs == 1;
    let chosen = match forced_layout() {
        Some(layout) => layout == GemmLayout::RowMajorRhs,
        None => threads == 1 && crate::simd::level() == crate::simd::Level::Avx512,
    };
    if !(sides && layouts && chosen) {
        return None;
    }
    let src = data.get(b.offset..b.offset.checked_add(k.checked_mul(n)?)?)?;
    // An optimisation: where the copy cannot be allocated, the strided path runs.
    let mut out = tl_spec::alloc::try_for_overwrite(GEMM, "row-major copy of b", k * n).ok()?;
    crate::simd::transpose_f32(src, n, k, &mut out);
    Some(out)
}

/// The definition, for element types faer does not take and layouts it cannot view (views
/// already checked against their slices).
fn plain<T: Scalar>(c: MatMut<'_, T>, accumulate: bool, a: Mat<'_, T>, b: Mat<'_, T>, alpha: T) {
    for i in 0..c.g.rows {
        for j in 0..c.g.cols {
            let mut s = T::zero();
            for l in 0..a.g.cols {
                s += a.data[a.g.at(i, l)] * b.data[b.g.at(l, j)];
            }
            let o = &mut c.data[c.g.at(i, j)];
            *o = if accumulate {
                *o + alpha * s
            } else {
                alpha * s
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic, non-trivial fill.
    fn fill(len: usize, seed: u64) -> Vec<f64> {
        (0..len as u64)
            .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f64) / 250.0 - 2.0)
            .collect()
    }

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn thread_count_variable_values() {
        let read = |v: &str| {
            tl_spec::env::interpret(
                THREADS_VAR,
                Some(v.as_ref()),
                THREADS_EXPECTS,
                tl_spec::env::parse_positive,
                threads_instead,
            )
        };
        assert_eq!(read("1"), Ok(Some(1)));
        assert_eq!(read(" 4 "), Ok(Some(4)));
        assert_eq!(read(&usize::MAX.to_string()), Ok(Some(usize::MAX)));
        assert_eq!(read(""), Ok(None));
        assert_eq!(read("   "), Ok(None));
        for bad in ["four", "0", "-2", "2.5", "18446744073709551616", "٤"] {
            let w = read(bad).unwrap_err();
            assert_eq!(
                w,
                format!(
                    "warning: TL_NUM_THREADS={bad:?} is not a thread count (a positive integer); \
                     using the default, {} threads (the cores this process may run on)",
                    cores()
                )
            );
        }
    }

    #[test]
    fn products_transposes_and_column_blocks_match_the_definition() {
        let (m, k, n) = (37, 19, 23);
        let (a, b) = (fill(m * k, 1), fill(k * n, 2));
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![f64::NAN; m * n];
        let op = Op::Matmul;
        let (av, bv) = (rows(&op, &a, m, k).unwrap(), rows(&op, &b, k, n).unwrap());
        matmul(
            &op,
            rows_mut(&op, &mut c, m, n).unwrap(),
            false,
            av,
            bv,
            1.0,
        )
        .unwrap();
        for (x, y) in c.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {y}");
        }
        // (Bᵀ)ᵀ through a transposed view of the transposed data; alpha and accumulate.
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let btv = rows(&op, &bt, n, k).unwrap().t();
        matmul(
            &op,
            rows_mut(&op, &mut c, m, n).unwrap(),
            true,
            av,
            btv,
            -2.0,
        )
        .unwrap();
        for (x, y) in c.iter().zip(&want) {
            assert!((x + y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {}", -y);
        }
        // Columns 5..12 of A (a strided block) times rows 5..12 of B.
        let mut c2 = vec![0.0; m * n];
        let (a2, b2) = (av.col_block(5, 7), bv.row_block(5, 7));
        matmul(
            &op,
            rows_mut(&op, &mut c2, m, n).unwrap(),
            false,
            a2,
            b2,
            1.0,
        )
        .unwrap();
        let want2 = (0..m * n).map(|ij| {
            let (i, j) = (ij / n, ij % n);
            (5..12).map(|l| a[i * k + l] * b[l * n + j]).sum::<f64>()
        });
        for (x, y) in c2.iter().zip(want2) {
            assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {y}");
        }
    }

    /// The portable loop (other element types, odd layouts) agrees with faer's kernels.
    #[test]
    fn the_plain_loop_agrees_with_the_kernels() {
        let op = Op::Matmul;
        let (m, k, n) = (9, 7, 5);
        let (a, b) = (fill(m * k, 5), fill(k * n, 6));
        let (av, bv) = (
            rows(&op, &a, m, k).unwrap(),
            rows(&op, &b, n, k).unwrap().t(),
        );
        let (mut c1, mut c2) = (vec![1.0; m * n], vec![1.0; m * n]);
        matmul(
            &op,
            rows_mut(&op, &mut c1, m, n).unwrap(),
            true,
            av,
            bv,
            0.5,
        )
        .unwrap();
        plain(rows_mut(&op, &mut c2, m, n).unwrap(), true, av, bv, 0.5);
        for (x, y) in c1.iter().zip(&c2) {
            assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {y}");
        }
    }

    #[test]
    fn empty_and_degenerate_products() {
        let op = Op::Matmul;
        // k = 0: the product is all zeros (replacing NaN), or leaves c unchanged when adding.
        let mut c = vec![f32::NAN; 6];
        let e: [f32; 0] = [];
        let (a, b) = (rows(&op, &e, 2, 0).unwrap(), rows(&op, &e, 0, 3).unwrap());
        matmul(&op, rows_mut(&op, &mut c, 2, 3).unwrap(), false, a, b, 1.0).unwrap();
        assert_eq!(c, [0.0; 6]);
        let mut c = vec![1.5f32; 6];
        matmul(&op, rows_mut(&op, &mut c, 2, 3).unwrap(), true, a, b, 1.0).unwrap();
        assert_eq!(c, [1.5; 6]);
        // m = 0 or n = 0: nothing to write, no error.
        let mut none: [f32; 0] = [];
        let z = rows(&op, &e, 0, 0).unwrap();
        matmul(
            &op,
            rows_mut(&op, &mut none, 0, 0).unwrap(),
            false,
            z,
            z,
            1.0,
        )
        .unwrap();
    }

    #[test]
    fn mismatches_are_errors_naming_the_op() {
        let op = Op::Bmm;
        let d = [0.0f32; 6];
        let e = rows(&op, &d, 4, 2).unwrap_err().to_string();
        assert!(e.contains("bmm") && e.contains("(4, 2)"), "{e}");
        let e = rows(&op, &d, usize::MAX, 2).unwrap_err().to_string();
        assert!(e.contains("bmm"), "{e}");
        let a = rows(&op, &d, 2, 3).unwrap();
        let mut c = [0.0f32; 4];
        let e = matmul(&op, rows_mut(&op, &mut c, 2, 2).unwrap(), false, a, a, 1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bmm") && e.contains("(2, 3) · (2, 3)"), "{e}");
    }

    /// The thread count changes the time, never the bits; the knob round-trips.
    #[test]
    fn set_threads_is_process_wide_returns_the_previous_setting_and_yields_to_an_override() {
        // The only test of this binary that sets the process-wide count (the others force it
        // on their own thread), so nothing else changes it between these lines.
        let prev = set_threads(3);
        assert_eq!(threads(), 3);
        assert_eq!(set_threads(5), 3);
        assert_eq!(threads(), 5);
        {
            let _forced = crate::gates::force_threads(2);
            assert_eq!(threads(), 2);
            // Another thread does not see this thread's override.
            assert_eq!(std::thread::spawn(threads).join().unwrap(), 5);
        }
        assert_eq!(threads(), 5);
        assert_eq!(set_threads(0), 5);
        assert_eq!(threads(), default_threads());
        set_threads(prev);
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let op = Op::Matmul;
        // Above PARALLEL_MIN_WORK: square-ish, the mlp's skinny forward (split by columns), its
        // tall weight gradient (split by rows), a long k, and sides that leave ragged blocks.
        for (m, k, n) in [
            (200, 130, 170),
            (64, 784, 256),
            (784, 64, 256),
            (33, 3000, 47),
            (301, 197, 83),
        ] {
            assert!(m * k * n >= PARALLEL_MIN_WORK);
            let a: Vec<f32> = fill(m * k, 3).into_iter().map(|v| v as f32).collect();
            let b: Vec<f32> = fill(k * n, 4).into_iter().map(|v| v as f32).collect();
            // The same b stored transposed: a column-major right-hand side (x·wᵀ), which at
            // AVX-512 takes the copied or the column-major path and AVX2 the column-major or
            // the strided one (column_major_product).
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let run = |t: usize, accumulate: bool, transposed: bool| {
                // This thread's override, not the process-wide setting other tests change.
                let _forced = crate::gates::force_threads(t);
                assert_eq!(threads(), t);
                let mut c: Vec<f32> = fill(m * n, 5).into_iter().map(|v| v as f32).collect();
                let av = rows(&op, &a, m, k).unwrap();
                let bv = match transposed {
                    false => rows(&op, &b, k, n).unwrap(),
                    true => rows(&op, &bt, n, k).unwrap().t(),
                };
                let cv = rows_mut(&op, &mut c, m, n).unwrap();
                matmul(&op, cv, accumulate, av, bv, 0.75).unwrap();
                c
            };
            for accumulate in [false, true] {
                let one = run(1, accumulate, false);
                for (t, transposed) in [(1, true), (2, false), (2, true), (3, false), (4, true)] {
                    let c = run(t, accumulate, transposed);
                    let same = one.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{t} threads (b transposed: {transposed}) changed ({m}, {k}, {n}) acc {accumulate}"
                    );
                }
            }
        }
        assert!(threads() >= 1);
    }

    /// The thread split (forced on at every size) keeps the bits where a block of the cut
    /// product would be one row or one column wide: faer and the gemm crate give one-column
    /// and one-row outputs matrix-vector paths of their own, which sum over k in other orders
    /// (a 1×17 row split 16 + 1 changed its last element by an ulp before), and nano-gemm
    /// changes kernels with the rows it vectorizes.
    #[test]
    fn a_split_that_leaves_a_vector_keeps_the_bits() {
        use crate::gates::{Gates, force};
        let op = Op::Matmul;
        let shapes = [(1, 17), (17, 1), (1, 33), (2, 17), (17, 2), (1, 2), (3, 1)];
        for (m, n) in shapes {
            // Nano-gemm's sizes (never split), just past them, and deep enough (k > 16³) that a
            // one-wide block is past them too.
            let past_nano = NANO_GEMM_MNK / (m * n) + 1;
            for k in [1, 2, 3, 5, 64, past_nano, past_nano + 37, NANO_GEMM_MNK + 5] {
                let a: Vec<f32> = fill(m * k, 8).into_iter().map(|v| v as f32).collect();
                let b: Vec<f32> = fill(k * n, 9).into_iter().map(|v| v as f32).collect();
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
                let run = |t: usize, accumulate: bool, a_t: bool, b_t: bool| {
                    let _g = force(Gates {
                        threads: Some(t),
                        gemm_parallel_min_work: Some(0),
                        ..Gates::DEFAULT
                    });
                    let mut c: Vec<f32> = fill(m * n, 10).into_iter().map(|v| v as f32).collect();
                    let av = match a_t {
                        false => rows(&op, &a, m, k).unwrap(),
                        true => rows(&op, &at, k, m).unwrap().t(),
                    };
                    let bv = match b_t {
                        false => rows(&op, &b, k, n).unwrap(),
                        true => rows(&op, &bt, n, k).unwrap().t(),
                    };
                    let cv = rows_mut(&op, &mut c, m, n).unwrap();
                    matmul(&op, cv, accumulate, av, bv, 0.75).unwrap();
                    c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                for accumulate in [false, true] {
                    for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
                        let one = run(1, accumulate, a_t, b_t);
                        for t in [2, 3, 4] {
                            assert_eq!(
                                run(t, accumulate, a_t, b_t),
                                one,
                                "({m}, {k}, {n}) on {t} threads, accumulate {accumulate}, a transposed {a_t}, b transposed {b_t}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The 16-wide kernel (`narrow`) gives the gemm path's bits on every shape it takes, at
    /// its edges (k = 1 and `NARROW_MAX_K`, ragged row blocks, the families it leaves to the
    /// gemm crate), for a row-major and a transposed left-hand side, replacing and
    /// accumulating, with and without a scale; on an AVX-512 machine it must take most cases.
    #[test]
    fn sixteen_wide_products_give_the_gemm_bits() {
        use crate::gates::{Gates, force};
        // The level decides which path is expected: no other test may change it meanwhile.
        let _level = crate::simd::tests::hold_level();
        let op = Op::Matmul;
        let avx512 = crate::simd::level() == crate::simd::Level::Avx512;
        let (mut taken, mut cases) = (0, 0);
        let w = 16;
        for m in [1, 7, 8, 9, 16, 17, 24, 64, 129, 300] {
            for k in [1, 2, 3, 16, 77, 128, 300, NARROW_MAX_K, NARROW_MAX_K + 1] {
                let a: Vec<f32> = fill(m * k, 7).into_iter().map(|v| v as f32).collect();
                // b: columns 16..16 + w of a (k, w + 24) matrix; c: columns 8..8 + w of an
                // (m, w + 14) one.
                let b: Vec<f32> = fill(k * (w + 24), 8)
                    .into_iter()
                    .map(|v| v as f32)
                    .collect();
                let c0: Vec<f32> = fill(m * (w + 14), 9)
                    .into_iter()
                    .map(|v| v as f32)
                    .collect();
                for (transposed, accumulate, alpha) in [
                    (false, false, 1.0f32),
                    (false, true, 1.0),
                    (true, true, 1.0),
                    (true, false, 0.25),
                    (false, true, 0.75),
                ] {
                    let run = |gates: Gates| {
                        let _g = force(gates);
                        let mut c = c0.clone();
                        let av = match transposed {
                            false => rows(&op, &a, m, k).unwrap(),
                            true => rows(&op, &a, k, m).unwrap().t(),
                        };
                        let bv = rows(&op, &b, k, w + 24).unwrap().col_block(16, w);
                        let cv = rows_mut(&op, &mut c, m, w + 14).unwrap().block(0, 8, m, w);
                        let took = narrow::applies(&av.g, &bv.g, &cv.g);
                        matmul(&op, cv, accumulate, av, bv, alpha).unwrap();
                        (c, took)
                    };
                    let (gemm, off) = run(Gates {
                        narrow_max_k: Some(0),
                        ..Gates::DEFAULT
                    });
                    let (ours, took) = run(Gates::DEFAULT);
                    assert!(!off);
                    cases += 1;
                    taken += usize::from(took);
                    let same = gemm
                        .iter()
                        .zip(&ours)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "w {w} m {m} k {k} transposed {transposed} accumulate {accumulate} alpha {alpha}: the narrow kernel (taken: {took}) differs from the gemm path"
                    );
                    // Taken exactly outside the gemm crate's small-product (m·16·k ≤ 16³),
                    // horizontal (m·16 ≤ 256) and k ≤ 2 kernels, within one k-block and one
                    // thread's work, at AVX-512.
                    let expected = avx512
                        && m * w > 256
                        && m > 1
                        && m * w * k > 4096
                        && (3..=NARROW_MAX_K).contains(&k)
                        && m * k * w <= PARALLEL_MIN_WORK;
                    assert_eq!(took, expected, "w {w} m {m} k {k}: which path");
                }
            }
        }
        assert!(
            !avx512 || taken > cases / 4,
            "taken in {taken} of {cases} cases"
        );
    }
}
