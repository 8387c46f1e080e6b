//! Mixed precision: the autocast setting of a tape ([`Precision`], shared with every tape:
//! `tl_spec::precision`), and the kernel its products run on.
//!
//! [`Precision::Bf16`] makes every matrix product of an `f32` tape (matmul, bmm, linear,
//! conv, attention: everything that goes through [`crate::gemm::matmul`], forward and
//! backward) read its operands rounded to bf16 ([`tl_spec::bf16::round`]) and accumulate in
//! f32; every other value, and the parameters and optimizer state, stay f32. The reference
//! is [`tl_spec::bf16::matmul`]: the exact product of the rounded operands, from which a bf16
//! product differs by at most its f32 accumulation ([`tl_spec::bf16::accumulation_bound`]).
//! [`Precision::Tf32`] is the same with the operands rounded to TF32
//! ([`tl_spec::tf32::round`]: nearest, ties away from zero), on the same code path.
//! [`Precision::F32`] (the default) is today's path, bit for bit. An `f64` tape ignores the
//! setting (autocast concerns f32 only, as PyTorch's).
//!
//! A tape installs its precision on the calling thread ([`install`]) while its kernels run;
//! work handed to the pool ([`crate::par::join`]) runs under the same setting.
//!
//! The bf16 products run on one of two kernels ([`Bf16Kernel`]), chosen at run time:
//! AVX512-BF16's `vdpbf16ps` where the CPU has it and the element-wise level is AVX-512
//! ([`crate::simd::level`], so `TL_SIMD=avx2` or `scalar` turns it off too), else the
//! portable one (the operands rounded into f32 copies, then the f32 GEMM: each product of two
//! bf16 values is exact in f32, so this *is* the reference's arithmetic with f32 sums). A
//! [`crate::gates`] override forces either (a kernel the CPU lacks is ignored).

use std::cell::Cell;

pub use tl_spec::precision::Precision;

/// The kernel of a bf16 product. One today; the enum is where a `vdpbf16ps` or AMX kernel
/// would go (each needs an `unsafe` entry into code compiled for its instructions, which the
/// project allows only in FFI modules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bf16Kernel {
    /// Operands rounded into f32 copies, then the f32 GEMM (every CPU).
    Portable,
}

impl Bf16Kernel {
    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Bf16Kernel::Portable => true,
        }
    }

    /// Every kernel this CPU can run, portable first.
    pub fn available() -> Vec<Bf16Kernel> {
        [Bf16Kernel::Portable]
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// The kernel bf16 products run on now: the calling thread's [`crate::gates`] override if
    /// it names one this CPU has, else the portable one.
    pub fn current() -> Bf16Kernel {
        crate::gates::current()
            .bf16_kernel
            .filter(|k| k.is_available())
            .unwrap_or(Bf16Kernel::Portable)
    }
}

thread_local! {
    static CURRENT: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// The precision installed on this thread ([`Precision::F32`] unless a tape installed another).
pub fn current() -> Precision {
    CURRENT.with(Cell::get)
}

/// Install `p` on this thread until the returned guard is dropped (which restores the
/// previous setting).
pub fn install(p: Precision) -> Guard {
    tl_spec::scoped::install(&CURRENT, p)
}

/// Run `f` under `p` on this thread (how [`crate::par::join`] carries it to the pool).
pub(crate) fn with<R>(p: Precision, f: impl FnOnce() -> R) -> R {
    let _guard = install(p);
    f()
}

/// Restores the precision [`install`] replaced when dropped (on the thread that installed it).
pub type Guard = tl_spec::scoped::Guard<Precision>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_restores_and_reaches_the_pool() {
        assert_eq!(current(), Precision::F32);
        {
            let _g = install(Precision::Bf16);
            assert_eq!(current(), Precision::Bf16);
            let (a, b) = crate::par::join(current, current);
            assert_eq!((a, b), (Precision::Bf16, Precision::Bf16));
            let other = std::thread::spawn(current).join().ok();
            assert_eq!(other, Some(Precision::F32));
        }
        assert_eq!(current(), Precision::F32);
        assert_eq!(Precision::default().name(), "f32");
    }

    #[test]
    fn the_kernel_follows_the_gates_and_the_level() {
        use crate::gates::{Gates, force};
        let all = Bf16Kernel::available();
        assert_eq!(all[0], Bf16Kernel::Portable);
        for &k in &all {
            let _g = force(Gates {
                bf16_kernel: Some(k),
                ..Gates::DEFAULT
            });
            assert_eq!(Bf16Kernel::current(), k);
        }
        {
            let _off = force(Gates::fast_paths_off());
            assert_eq!(Bf16Kernel::current(), Bf16Kernel::Portable);
        }
        let _scalar = force(Gates::DEFAULT.with_level(crate::simd::Level::Scalar));
        assert_eq!(Bf16Kernel::current(), Bf16Kernel::Portable);
    }
}
