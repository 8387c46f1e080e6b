//! Autocast on the CUDA tape: the arithmetic of its matrix products ([`Precision`], the type
//! every tape shares: `tl_spec::precision`).
//!
//! [`CudaTape::set_precision`](crate::CudaTape::set_precision) with [`Precision::Bf16`] or
//! [`Precision::Tf32`] makes every product the tape runs (matmul, bmm, linear, conv's im2col
//! GEMM, attention's projections and score/value products, forward and backward, the cotangent
//! rounded as an operand) read its operands rounded and sum in f32; everything else stays f32,
//! as on the CPU tape (docs/semantics.md, "Mixed precision"). The tape installs its setting on
//! the calling thread ([`install`]) while its formulas run; the devices' matrix products read
//! it ([`current`]) and run the tensor-core GEMM (`tl_gemm_tc` in kernels/linalg.cu; the sim
//! twin in [`crate::device::sim::linalg`]). A formula whose GEMMs are not autocast products (the
//! spectral ops' DFT matrices: the CPU tape runs an FFT there) installs `F32` around them.

use std::cell::Cell;

pub use tl_spec::precision::Precision;

thread_local! {
    static CURRENT: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// The precision installed on this thread ([`Precision::F32`] unless a tape installed another).
pub fn current() -> Precision {
    CURRENT.with(Cell::get)
}

/// Install `p` on this thread until the returned guard is dropped (which restores the
/// previous setting). Device products launched meanwhile on this thread round as `p` says.
pub fn install(p: Precision) -> Guard {
    tl_spec::scoped::install(&CURRENT, p)
}

/// Restores the precision [`install`] replaced when dropped (on the thread that installed it).
pub type Guard = tl_spec::scoped::Guard<Precision>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_nests_and_restores() {
        assert_eq!(current(), Precision::F32);
        {
            let _g = install(Precision::Bf16);
            assert_eq!(current(), Precision::Bf16);
            {
                let _h = install(Precision::F32);
                assert_eq!(current(), Precision::F32);
            }
            assert_eq!(current(), Precision::Bf16);
            let other = std::thread::spawn(current).join().ok();
            assert_eq!(other, Some(Precision::F32));
        }
        assert_eq!(current(), Precision::F32);
    }
}
