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
//! The level changes the time, never the bits: Rust never fuses `a·b + c` into an FMA, and
//! IEEE `+ − × ÷` and `sqrt` round the same at every width. The tests compare every level the
//! machine has against the baseline, bit for bit; [`set_level`] (or `TL_SIMD=avx512|avx2|
//! scalar`, read once) forces a level, e.g. to time one against another.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use tl_spec::Scalar;

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

/// The best available level, or `TL_SIMD`'s if it names an available one.
fn default_level() -> Level {
    static DEFAULT: OnceLock<Level> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let wanted = match std::env::var("TL_SIMD").as_deref().map(str::trim) {
            Ok("scalar") => Some(Level::Scalar),
            Ok("avx2") => Some(Level::Avx2),
            Ok("avx512") => Some(Level::Avx512),
            _ => None,
        };
        match wanted {
            Some(l) if l.is_available() => l,
            _ => *Level::available().last().unwrap_or(&Level::Scalar),
        }
    })
}

/// The level [`vectorize`] runs with now.
pub fn level() -> Level {
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

/// One element's value, for [`map`]. A named type with an `#[inline(always)]` method,
/// not a closure: a closure with a large body is not inlined into the SIMD loop, and then the
/// loop makes one call per element at the baseline width.
pub trait Map1<T>: Copy {
    /// The value at `v`.
    fn at(self, v: T) -> T;
}

/// One element's value from two operands, for [`zip`] (as [`Map1`]).
pub trait Map2<T>: Copy {
    /// The value at `(u, v)`.
    fn at(self, u: T, v: T) -> T;
}

/// `f` at every element of `x`, the loop compiled for the chosen instruction set
/// ([`vectorize`]).
#[inline(always)]
pub fn map<T: Scalar>(x: &[T], f: impl Map1<T>) -> Vec<T> {
    vectorize(MapSimd { x, f })
}

/// `f` at every pair of elements of `a` and `b` (the shorter length), likewise.
#[inline(always)]
pub fn zip<T: Scalar>(a: &[T], b: &[T], f: impl Map2<T>) -> Vec<T> {
    vectorize(ZipSimd { a, b, f })
}

/// [`map`]'s loop, as a kernel whose body inlines into the dispatch.
struct MapSimd<'a, T, F> {
    x: &'a [T],
    f: F,
}

impl<T: Scalar, F: Map1<T>> Kernel for MapSimd<'_, T, F> {
    type Output = Vec<T>;

    #[inline(always)]
    fn call(self) -> Vec<T> {
        let mut out = tl_spec::pool::zeroed(self.x.len());
        for (o, &v) in out.iter_mut().zip(self.x) {
            *o = self.f.at(v);
        }
        out
    }
}

/// [`zip`]'s loop, likewise.
struct ZipSimd<'a, T, F> {
    a: &'a [T],
    b: &'a [T],
    f: F,
}

impl<T: Scalar, F: Map2<T>> Kernel for ZipSimd<'_, T, F> {
    type Output = Vec<T>;

    #[inline(always)]
    fn call(self) -> Vec<T> {
        let mut out = tl_spec::pool::zeroed(self.a.len().min(self.b.len()));
        for ((o, &u), &v) in out.iter_mut().zip(self.a).zip(self.b) {
            *o = self.f.at(u, v);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_can_be_forced_and_restored_and_unavailable_ones_are_refused() {
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
}
