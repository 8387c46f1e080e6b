//! The instruction set the element-wise loops run with, chosen at run time.
//!
//! The crate is built for baseline x86-64 (SSE2), so a loop the compiler vectorizes uses
//! 4-wide SSE unless it is compiled again for a wider instruction set. [`vectorize`] runs a
//! kernel compiled for the best set this CPU has (AVX-512 `x86-v4`, else AVX2 `x86-v3`, else
//! the baseline), through `pulp`'s safe dispatch (the crate behind the GEMM's micro-kernel
//! choice). What runs must inline into the dispatch, or it is compiled at the baseline width:
//! a [`Kernel`] whose `call` is `#[inline(always)]` (a closure is not inlined reliably), with
//! plain loops over slices and `#[inline(always)]` helpers inside.
//!
//! The level changes the time, never the bits: Rust never fuses `a·b + c` into an FMA by
//! itself, IEEE `+ − × ÷` and `sqrt` round the same at every width, and the FMAs written out
//! ([`f32::mul_add`], in `tl_spec::approx`) round once at every level (an instruction at the
//! AVX2 and AVX-512 levels, libm's `fmaf` at the baseline, slower but the same bits). The
//! tests compare every level the machine has against the baseline, bit for bit; [`set_level`]
//! (or `TL_SIMD=avx512|avx2|scalar`, read once; a level this CPU lacks or another value: one
//! warning, then the best level) forces a level, e.g. to time one against
//! another.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use tl_spec::Scalar;

use crate::Result;

/// An instruction set for the element-wise loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The build's baseline (SSE2 on x86-64; the only level elsewhere).
    Scalar,
    /// AVX2 + FMA + BMI (`x86-v3`).
    Avx2,
    /// AVX-512 F/BW/CD/DQ/VL (`x86-v4`).
    Avx512,
}

impl Level {
    fn code(self) -> u8 {
        match self {
            Level::Scalar => 1,
            Level::Avx2 => 2,
            Level::Avx512 => 3,
        }
    }

    fn from_code(c: u8) -> Option<Level> {
        match c {
            1 => Some(Level::Scalar),
            2 => Some(Level::Avx2),
            3 => Some(Level::Avx512),
            _ => None,
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        match self {
            Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => pulp::x86::V4::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU can run, baseline first.
    pub fn available() -> Vec<Level> {
        [Level::Scalar, Level::Avx2, Level::Avx512]
            .into_iter()
            .filter(|l| l.is_available())
            .collect()
    }
}

/// 0 = not forced by [`set_level`]: the default applies.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// The environment variable that forces the default level: `scalar`, `avx2` or `avx512`.
pub const SIMD_VAR: &str = "TL_SIMD";

/// What [`SIMD_VAR`] should hold, for its warning.
const LEVEL_EXPECTS: &str = "a SIMD level (scalar, avx2 or avx512)";

/// A level's name as [`SIMD_VAR`] spells it (any case accepted).
fn parse_level(s: &str) -> Option<Level> {
    match s.trim().to_ascii_lowercase().as_str() {
        "scalar" => Some(Level::Scalar),
        "avx2" => Some(Level::Avx2),
        "avx512" => Some(Level::Avx512),
        _ => None,
    }
}

impl Level {
    /// The level's name as [`SIMD_VAR`] spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }
}

/// The best level this CPU has.
fn best() -> Level {
    *Level::available().last().unwrap_or(&Level::Scalar)
}

/// What is used in place of a bad [`SIMD_VAR`], for its warning.
fn level_instead() -> String {
    format!("the default, {} (the best this CPU has)", best().name())
}

/// The warning for a [`SIMD_VAR`] that names a level this CPU lacks.
fn unavailable(l: Level) -> String {
    let has: Vec<&str> = Level::available().into_iter().map(Level::name).collect();
    tl_spec::env::warning(
        SIMD_VAR,
        l.name(),
        &format!("a level this CPU has ({})", has.join(", ")),
        &level_instead(),
    )
}

/// [`SIMD_VAR`]'s level if it names one this CPU has, else the best available (after one
/// warning when it is set to anything else).
fn default_level() -> Level {
    static DEFAULT: OnceLock<Level> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        match tl_spec::env::read(SIMD_VAR, LEVEL_EXPECTS, parse_level, level_instead) {
            Some(l) if l.is_available() => l,
            Some(l) => {
                eprintln!("{}", unavailable(l));
                best()
            }
            None => best(),
        }
    })
}

/// The level [`vectorize`] runs with now: the calling thread's [`crate::gates`] override if it
/// names a level this CPU has, else [`set_level`]'s, else the default.
pub fn level() -> Level {
    if let Some(l) = crate::gates::current().level.filter(|l| l.is_available()) {
        return l;
    }
    Level::from_code(FORCED.load(Ordering::Relaxed)).unwrap_or_else(default_level)
}

/// Run the element-wise loops at `level` from now on, process-wide (`None` restores the
/// default: `TL_SIMD`, else the best this CPU has). A level the CPU lacks is refused (the
/// setting is unchanged, `false` returned). Results do not change, only the time.
pub fn set_level(level: Option<Level>) -> bool {
    match level {
        None => FORCED.store(0, Ordering::Relaxed),
        Some(l) if l.is_available() => FORCED.store(l.code(), Ordering::Relaxed),
        Some(_) => return false,
    }
    true
}

/// A loop to run at the chosen level: implement `call` with `#[inline(always)]` so that its
/// body is compiled inside [`vectorize`]'s target-feature function. (Closures implement it
/// too, but are not always inlined there.)
pub use pulp::NullaryFnOnce as Kernel;

/// Run `f` compiled for [`level`]'s instruction set (see the module doc for what must inline).
#[inline(always)]
pub fn vectorize<F: Kernel>(f: F) -> F::Output {
    match level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => match pulp::x86::V4::try_new() {
            Some(v4) => v4.vectorize(f),
            None => f.call(),
        },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => match pulp::x86::V3::try_new() {
            Some(v3) => v3.vectorize(f),
            None => f.call(),
        },
        _ => f.call(),
    }
}

/// One element's value, for [`map`]. A named type with an `#[inline(always)]` method for a
/// large body: a closure with a large body is not inlined into the SIMD loop, and then the
/// loop makes one call per element at the baseline width. Small closures (`|v| c * v`) implement
/// it too.
pub trait Map1<T>: Copy + Sync {
    /// The value at `v`.
    fn at(self, v: T) -> T;
}

/// One element's value from two operands, for [`zip`] (as [`Map1`]).
pub trait Map2<T>: Copy + Sync {
    /// The value at `(u, v)`.
    fn at(self, u: T, v: T) -> T;
}

/// One element's value from three operands, for [`zip3`] (as [`Map1`]).
pub trait Map3<T>: Copy + Sync {
    /// The value at `(u, v, w)`.
    fn at(self, u: T, v: T, w: T) -> T;
}

impl<T, F: Fn(T) -> T + Copy + Sync> Map1<T> for F {
    #[inline(always)]
    fn at(self, v: T) -> T {
        self(v)
    }
}

impl<T, F: Fn(T, T) -> T + Copy + Sync> Map2<T> for F {
    #[inline(always)]
    fn at(self, u: T, v: T) -> T {
        self(u, v)
    }
}

impl<T, F: Fn(T, T, T) -> T + Copy + Sync> Map3<T> for F {
    #[inline(always)]
    fn at(self, u: T, v: T, w: T) -> T {
        self(u, v, w)
    }
}

/// `f` at every element of `x`, the loop compiled for the chosen instruction set
/// ([`vectorize`]) and cut across threads when long enough (`crate::par::chunks`).
#[inline(always)]
pub fn map<T: Scalar>(op: &'static str, x: &[T], f: impl Map1<T>) -> Result<Vec<T>> {
    fill(op, x.len(), 2, &|r, out| {
        let x = &x[r];
        vectorize(MapSimd { x, out, f })
    })
}

/// `f` at every pair of elements of `a` and `b` (the shorter length), likewise.
#[inline(always)]
pub fn zip<T: Scalar>(op: &'static str, a: &[T], b: &[T], f: impl Map2<T>) -> Result<Vec<T>> {
    fill(op, a.len().min(b.len()), 3, &|r, out| {
        let (a, b) = (&a[r.clone()], &b[r]);
        vectorize(ZipSimd { a, b, out, f })
    })
}

/// `f` at every triple of elements of `a`, `b` and `c` (the shortest length), likewise.
#[inline(always)]
pub fn zip3<T: Scalar>(
    op: &'static str,
    a: &[T],
    b: &[T],
    c: &[T],
    f: impl Map3<T>,
) -> Result<Vec<T>> {
    fill(op, a.len().min(b.len()).min(c.len()), 4, &|r, out| {
        let (a, b, c) = (&a[r.clone()], &b[r.clone()], &c[r]);
        vectorize(Zip3Simd { a, b, c, out, f })
    })
}

/// `a[i] ← f(a[i], b[i])` for every `i` below the shorter length, in place: [`zip`]'s loop
/// writing into its first operand (no output buffer; an optimizer's update of a parameter
/// nothing else holds), across threads under the same rule as [`zip`]. Each element is
/// computed alone, so the bits are [`zip`]'s whatever the split.
#[inline(always)]
pub fn zip_assign<T: Scalar>(a: &mut [T], b: &[T], f: impl Map2<T>) {
    let n = a.len().min(b.len());
    crate::par::chunks(&mut a[..n], 3, &|at, block: &mut [T]| {
        let b = &b[at..at + block.len()];
        vectorize(ZipAssignSimd { a: block, b, f })
    });
}

/// [`zip_assign`]'s loop, as a kernel whose body inlines into the dispatch.
struct ZipAssignSimd<'a, 'b, T, F> {
    a: &'a mut [T],
    b: &'b [T],
    f: F,
}

impl<T: Scalar, F: Map2<T>> Kernel for ZipAssignSimd<'_, '_, T, F> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        for (u, &v) in self.a.iter_mut().zip(self.b) {
            *u = self.f.at(*u, v);
        }
    }
}

/// Where a kernel puts its values: a block of a sized buffer, or pushed onto an empty one.
enum Out<'a, T> {
    /// A block of the output, each element overwritten.
    Block(&'a mut [T]),
    /// The whole output, pushed in order (no fill before).
    Push(&'a mut Vec<T>),
}

/// Values pushed per stage of [`Out::Push`]: computed into a stack buffer by the same loop as
/// a block, then appended (a copy within L1).
const STAGE: usize = 256;

/// An element-wise loop over `n` elements: `block(lo, out)` writes elements `lo..lo + out.len()`.
trait Elems<T: Scalar> {
    /// How many elements.
    fn len(&self) -> usize;
    /// Elements `lo..lo + out.len()` into `out`, a plain loop (inlined into the dispatch).
    fn block(&self, lo: usize, out: &mut [T]);

    /// Every element into `out`.
    #[inline(always)]
    fn store(&self, out: Out<'_, T>) {
        match out {
            Out::Block(b) => self.block(0, b),
            Out::Push(v) => {
                let mut stage = [T::zero(); STAGE];
                let size = crate::gates::get(|g| g.stage, STAGE).clamp(1, STAGE);
                let n = self.len();
                let mut lo = 0;
                while lo < n {
                    let len = size.min(n - lo);
                    self.block(lo, &mut stage[..len]);
                    v.extend_from_slice(&stage[..len]);
                    lo += len;
                }
            }
        }
    }
}

/// The `n` values of an element-wise kernel `k(range, out)`, each computed alone from
/// `streams - 1` operand slices: across threads into a spare pool buffer or a zeroed one when
/// [`crate::par::chunks`] would split the work, else in one pass on this thread, into a
/// spare pool buffer if there is one or pushed onto an empty buffer (no fill first).
#[inline(always)]
fn fill<T: Scalar>(
    op: &'static str,
    n: usize,
    streams: usize,
    k: &(impl Fn(std::ops::Range<usize>, Out<'_, T>) + Sync),
) -> Result<Vec<T>> {
    let spare = tl_spec::pool::take_for_overwrite(n);
    if spare.is_none() && !crate::par::splits(n, streams) {
        let mut out = tl_spec::alloc::try_with_capacity(op, "output", n)?;
        k(0..n, Out::Push(&mut out));
        return Ok(out);
    }
    let mut out = match spare {
        Some(spare) => spare,
        None => tl_spec::alloc::try_zeroed(op, "output", n)?,
    };
    crate::par::chunks(&mut out, streams, &|at, block: &mut [T]| {
        k(at..at + block.len(), Out::Block(block))
    });
    Ok(out)
}

/// [`map`]'s loop, as a kernel whose body inlines into the dispatch.
struct MapSimd<'a, 'o, T, F> {
    x: &'a [T],
    out: Out<'o, T>,
    f: F,
}

impl<T: Scalar, F: Map1<T>> Elems<T> for MapSimd<'_, '_, T, F> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.x.len()
    }

    #[inline(always)]
    fn block(&self, lo: usize, out: &mut [T]) {
        for (o, &v) in out.iter_mut().zip(&self.x[lo..]) {
            *o = self.f.at(v);
        }
    }
}

/// [`zip`]'s loop, likewise.
struct ZipSimd<'a, 'o, T, F> {
    a: &'a [T],
    b: &'a [T],
    out: Out<'o, T>,
    f: F,
}

impl<T: Scalar, F: Map2<T>> Elems<T> for ZipSimd<'_, '_, T, F> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.a.len().min(self.b.len())
    }

    #[inline(always)]
    fn block(&self, lo: usize, out: &mut [T]) {
        let ab = self.a[lo..].iter().zip(&self.b[lo..]);
        for (o, (&u, &v)) in out.iter_mut().zip(ab) {
            *o = self.f.at(u, v);
        }
    }
}

/// [`zip3`]'s loop, likewise.
struct Zip3Simd<'a, 'o, T, F> {
    a: &'a [T],
    b: &'a [T],
    c: &'a [T],
    out: Out<'o, T>,
    f: F,
}

impl<T: Scalar, F: Map3<T>> Elems<T> for Zip3Simd<'_, '_, T, F> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.a.len().min(self.b.len()).min(self.c.len())
    }

    #[inline(always)]
    fn block(&self, lo: usize, out: &mut [T]) {
        let abc = self.a[lo..].iter().zip(&self.b[lo..]).zip(&self.c[lo..]);
        for (o, ((&u, &v), &w)) in out.iter_mut().zip(abc) {
            *o = self.f.at(u, v, w);
        }
    }
}

/// The three loops as [`Kernel`]s: the output moves out of the struct, the rest is read.
macro_rules! kernel {
    ($($k:ident: $m:ident),*) => {$(
        impl<T: Scalar, F: $m<T>> Kernel for $k<'_, '_, T, F> {
            type Output = ();

            #[inline(always)]
            fn call(mut self) {
                let out = std::mem::replace(&mut self.out, Out::Block(&mut []));
                self.store(out);
            }
        }
    )*};
}
kernel!(MapSimd: Map1, ZipSimd: Map2, Zip3Simd: Map3);

/// `dst ← srcᵀ`: `src` holds a row-major `(rows, cols)` matrix, `dst` receives the row-major
/// `(cols, rows)` one (slices shorter than `rows · cols` leave `dst` unchanged). Square tiles go
/// through registers, 16×16 at the AVX-512 level and 8×8 at AVX2 (one load a row, rounds of
/// unpacks and lane shuffles, one whole-line store a column); the edges, and the baseline
/// level, copy element by element.
pub fn transpose_f32(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    let n = rows.saturating_mul(cols);
    if src.len() < n || dst.len() < n {
        return;
    }
    // The rows and columns the register tiles covered (none at the baseline level).
    #[cfg(target_arch = "x86_64")]
    let (rt, ct) = {
        let tiles = (src, rows, cols, &mut *dst);
        match level() {
            Level::Avx512 => pulp::x86::V4::try_new().map(|v4| transpose_tiles(v4, tiles)),
            Level::Avx2 => pulp::x86::V3::try_new().map(|v3| transpose_tiles(v3, tiles)),
            Level::Scalar => None,
        }
        .unwrap_or((0, 0))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (rt, ct) = (0, 0);
    // The right edge of the tiled rows, then the rows below them (all of them if no tiles).
    for i in 0..rt {
        for j in ct..cols {
            dst[j * rows + i] = src[i * cols + j];
        }
    }
    for i in rt..rows {
        for (j, &v) in src[i * cols..(i + 1) * cols].iter().enumerate() {
            dst[j * rows + i] = v;
        }
    }
}

/// A level's square register transpose: [`Tile::SIDE`] rows of `src` (row stride `ss`) become
/// as many rows of `dst` (row stride `ds`).
#[cfg(target_arch = "x86_64")]
trait Tile: pulp::Simd {
    /// The tile's side: one register's lanes.
    const SIDE: usize;
    /// Transpose the `SIDE × SIDE` tile at the start of `src` into the start of `dst`.
    fn tile(self, src: &[f32], ss: usize, dst: &mut [f32], ds: usize);
}

/// [`transpose_f32`]'s tiled part at `simd`'s level: the top-left block whose sides are
/// multiples of [`Tile::SIDE`]; returns its sides.
#[cfg(target_arch = "x86_64")]
fn transpose_tiles<S: Tile>(
    simd: S,
    (src, rows, cols, dst): (&[f32], usize, usize, &mut [f32]),
) -> (usize, usize) {
    let (rt, ct) = (rows / S::SIDE * S::SIDE, cols / S::SIDE * S::SIDE);
    simd.vectorize(Tiles {
        simd,
        src,
        rows: rt,
        cols: ct,
        stride: (cols, rows),
        dst,
    });
    (rt, ct)
}

/// [`transpose_f32`]'s tiles: the top-left `rows × cols` block (multiples of the tile's side)
/// of a source with row stride `stride.0`, into a destination with row stride `stride.1`.
#[cfg(target_arch = "x86_64")]
struct Tiles<'a, S> {
    simd: S,
    src: &'a [f32],
    rows: usize,
    cols: usize,
    stride: (usize, usize),
    dst: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl<S: Tile> Kernel for Tiles<'_, S> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let (ss, ds) = self.stride;
        for i0 in (0..self.rows).step_by(S::SIDE) {
            for j0 in (0..self.cols).step_by(S::SIDE) {
                self.simd.tile(
                    &self.src[i0 * ss + j0..],
                    ss,
                    &mut self.dst[j0 * ds + i0..],
                    ds,
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Tile for pulp::x86::V4 {
    const SIDE: usize = 16;

    /// Rows 2i, 2i+1 interleaved by pairs, then by fours, then 128-bit lanes gathered across
    /// the four row groups.
    #[inline(always)]
    fn tile(self, src: &[f32], ss: usize, dst: &mut [f32], ds: usize) {
        use core::arch::x86_64::__m512;
        let a = self.avx512f;
        let r: [__m512; 16] = core::array::from_fn(|i| {
            let mut row = [0.0f32; 16];
            row.copy_from_slice(&src[i * ss..i * ss + 16]);
            pulp::cast(row)
        });
        // Rows 2i, 2i+1 interleaved by pairs, then rows 4g..4g+4 by fours: u[4g + j] holds,
        // in its 128-bit lane L, rows 4g..4g+4 of column 4L + j.
        let t: [__m512; 16] = core::array::from_fn(|i| {
            let (x, y) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                a._mm512_unpacklo_ps(x, y)
            } else {
                a._mm512_unpackhi_ps(x, y)
            }
        });
        let u: [__m512; 16] = core::array::from_fn(|i| {
            let (g, j) = (i / 4, i % 4);
            let x = a._mm512_castps_pd(t[4 * g + j / 2]);
            let y = a._mm512_castps_pd(t[4 * g + 2 + j / 2]);
            a._mm512_castpd_ps(if j % 2 == 0 {
                a._mm512_unpacklo_pd(x, y)
            } else {
                a._mm512_unpackhi_pd(x, y)
            })
        });
        // Lanes gathered across the four row groups: column c's 16 rows in one register.
        for j in 0..4 {
            let lo = a._mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let hi = a._mm512_shuffle_f32x4::<0xdd>(u[j], u[4 + j]);
            let lo2 = a._mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let hi2 = a._mm512_shuffle_f32x4::<0xdd>(u[8 + j], u[12 + j]);
            let cols = [
                (j, a._mm512_shuffle_f32x4::<0x88>(lo, lo2)),
                (8 + j, a._mm512_shuffle_f32x4::<0xdd>(lo, lo2)),
                (4 + j, a._mm512_shuffle_f32x4::<0x88>(hi, hi2)),
                (12 + j, a._mm512_shuffle_f32x4::<0xdd>(hi, hi2)),
            ];
            for (c, v) in cols {
                let out: [f32; 16] = pulp::cast(v);
                dst[c * ds..c * ds + 16].copy_from_slice(&out);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Tile for pulp::x86::V3 {
    const SIDE: usize = 8;

    /// Rows 2i, 2i+1 interleaved by pairs, then by fours within each 128-bit lane, then the
    /// two lanes of the two row groups swapped into place.
    #[inline(always)]
    fn tile(self, src: &[f32], ss: usize, dst: &mut [f32], ds: usize) {
        use core::arch::x86_64::__m256;
        let a = self.avx;
        let r: [__m256; 8] = core::array::from_fn(|i| {
            let mut row = [0.0f32; 8];
            row.copy_from_slice(&src[i * ss..i * ss + 8]);
            pulp::cast(row)
        });
        let t: [__m256; 8] = core::array::from_fn(|i| {
            let (x, y) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                a._mm256_unpacklo_ps(x, y)
            } else {
                a._mm256_unpackhi_ps(x, y)
            }
        });
        // u[4g + j] holds, in its 128-bit lane L, rows 4g..4g+4 of column 4L + j.
        let u: [__m256; 8] = core::array::from_fn(|i| {
            let (g, j) = (i / 4, i % 4);
            let (x, y) = (t[4 * g + j / 2], t[4 * g + 2 + j / 2]);
            if j % 2 == 0 {
                a._mm256_shuffle_ps::<0x44>(x, y)
            } else {
                a._mm256_shuffle_ps::<0xee>(x, y)
            }
        });
        // Column j: lane 0 of both row groups; column 4 + j: lane 1 of both.
        for j in 0..4 {
            let cols = [
                (j, a._mm256_permute2f128_ps::<0x20>(u[j], u[4 + j])),
                (4 + j, a._mm256_permute2f128_ps::<0x31>(u[j], u[4 + j])),
            ];
            for (c, v) in cols {
                let out: [f32; 8] = pulp::cast(v);
                dst[c * ds..c * ds + 8].copy_from_slice(&out);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Held by every unit test that changes the process-wide level, so that none changes it
    /// under another (the levels test asserts the level it set).
    pub(crate) static LEVEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Take [`LEVEL`] (a test that failed while holding it does not poison the others).
    pub(crate) fn hold_level() -> std::sync::MutexGuard<'static, ()> {
        LEVEL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn level_variable_values() {
        let read = |v: &str| {
            tl_spec::env::interpret(
                SIMD_VAR,
                Some(v.as_ref()),
                LEVEL_EXPECTS,
                parse_level,
                level_instead,
            )
        };
        assert_eq!(read("scalar"), Ok(Some(Level::Scalar)));
        assert_eq!(read(" AVX2 "), Ok(Some(Level::Avx2)));
        assert_eq!(read("avx512"), Ok(Some(Level::Avx512)));
        assert_eq!(read(""), Ok(None));
        for bad in ["avx512f", "sse2", "0", "avx-512", "ａｖｘ２"] {
            let w = read(bad).unwrap_err();
            assert_eq!(
                w,
                format!(
                    "warning: TL_SIMD={bad:?} is not a SIMD level (scalar, avx2 or avx512); \
                     using the default, {} (the best this CPU has)",
                    best().name()
                )
            );
        }
        let w = unavailable(Level::Avx512);
        assert!(
            w.starts_with("warning: TL_SIMD=\"avx512\" is not a level this CPU has (scalar"),
            "{w}"
        );
        for l in [Level::Scalar, Level::Avx2, Level::Avx512] {
            assert_eq!(parse_level(l.name()), Some(l));
        }
    }

    #[test]
    fn levels_can_be_forced_and_restored_and_unavailable_ones_are_refused() {
        let _level = hold_level();
        let all = Level::available();
        assert_eq!(all[0], Level::Scalar);
        for &l in &all {
            assert!(set_level(Some(l)));
            assert_eq!(level(), l);
            assert_eq!(vectorize(|| 2 + 3), 5);
        }
        assert!(set_level(None));
        assert_eq!(level(), default_level());
        for l in [Level::Avx2, Level::Avx512] {
            if !l.is_available() {
                assert!(!set_level(Some(l)));
                assert_eq!(level(), default_level());
            }
        }
    }

    #[test]
    fn transpose_at_every_level_and_shape() {
        let _level = hold_level();
        for &l in &Level::available() {
            assert!(set_level(Some(l)));
            let shapes = [
                (0, 3),
                (1, 1),
                (3, 5),
                (16, 16),
                (8, 8),
                (9, 24),
                (7, 13),
                (17, 33),
                (64, 48),
                (10, 256),
            ];
            for (r, c) in shapes {
                let src: Vec<f32> = (0..r * c).map(|i| i as f32).collect();
                let mut dst = vec![f32::NAN; r * c];
                transpose_f32(&src, r, c, &mut dst);
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(
                            dst[j * r + i],
                            src[i * c + j],
                            "{l:?} {r}x{c} at ({i}, {j})"
                        );
                    }
                }
            }
        }
        set_level(None);
    }

    /// `zip_assign` writes `zip`'s values into its first operand, bit for bit, at every level,
    /// on one thread and split across two (the split forced at every length), including the
    /// lengths around a vector's width and a shorter second operand.
    #[test]
    fn zip_assign_gives_zip_in_place_at_every_level_and_split() {
        let _level = hold_level();
        let f = |u: f32, v: f32| (f64::from(u) - 0.37 * f64::from(v)) as f32;
        for &l in &Level::available() {
            for gates in [
                crate::gates::Gates::fast_paths_off().with_level(l),
                crate::gates::Gates::fast_paths_on(2).with_level(l),
            ] {
                let _g = crate::gates::force(gates);
                for (n, m) in [
                    (0, 0),
                    (1, 1),
                    (15, 15),
                    (16, 16),
                    (17, 17),
                    (1000, 1000),
                    (300, 290),
                ] {
                    let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin()).collect();
                    let b: Vec<f32> = (0..m).map(|i| (i as f32 * 0.173).cos()).collect();
                    let want = zip("test", &a, &b, f).unwrap();
                    let mut got = a.clone();
                    zip_assign(&mut got, &b, f);
                    let k = n.min(m);
                    assert_eq!(&got[..k], &want[..], "{l:?} {gates:?} n={n} m={m}");
                    assert_eq!(&got[k..], &a[k..], "past the shorter operand: unchanged");
                }
            }
        }
    }
}
