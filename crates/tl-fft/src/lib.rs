//! Real FFT plans for `f32` and `f64`: `realfft` (over `rustfft`), planned here and handed out
//! as trait objects.
//!
//! Planning instantiates every algorithm rustfft has for the element type (its scalar, SSE and
//! AVX butterflies, mixed radices, Rader, Bluestein): about 0.4 M lines of LLVM IR a type. A
//! generic function is compiled in the crate that names its concrete type, so tl-tape-cpu
//! compiled all of it for its library and again for its unit tests (half of that crate's IR),
//! and tl-cli once more for its Burgers solver. Here [`Real::plans`] is one non-generic
//! function per type; callers hold the plans as `Arc<dyn …>` and compile none of rustfft
//! (docs/verification.md, "CI time").
//!
//! ```
//! use tl_fft::{Complex, Real};
//! let plans = f64::plans(8);
//! let mut x = vec![1.0; 8];
//! let mut spectrum = plans.forward.make_output_vec();
//! plans.forward.process(&mut x, &mut spectrum).unwrap();
//! assert_eq!(spectrum[0], Complex::new(8.0, 0.0));
//! ```

use std::sync::Arc;

pub use realfft::num_complex::Complex;
pub use realfft::{ComplexToReal, FftError, FftNum, RealToComplex};

/// A forward (real to complex, `n / 2 + 1` bins) and an inverse (complex to real) transform
/// of length `n`, both unnormalized, as realfft defines them.
pub struct Plans<F> {
    /// `rfft`: `n` real samples to `n / 2 + 1` complex bins.
    pub forward: Arc<dyn RealToComplex<F>>,
    /// `irfft`: `n / 2 + 1` bins (the imaginary parts of the DC and Nyquist bins must be zero)
    /// to `n` real samples, not divided by `n`.
    pub inverse: Arc<dyn ComplexToReal<F>>,
}

/// The element types with plans: `f32` and `f64`.
pub trait Real: FftNum {
    /// Both transforms of length `n` (a fresh planner each call: callers plan once per
    /// operation and reuse the plans across its channels and batch entries).
    fn plans(n: usize) -> Plans<Self>;
}

impl Real for f32 {
    fn plans(n: usize) -> Plans<f32> {
        plan(n)
    }
}

impl Real for f64 {
    fn plans(n: usize) -> Plans<f64> {
        plan(n)
    }
}

/// [`Real::plans`] for either type (instantiated in this crate only, by the two impls).
fn plan<F: FftNum>(n: usize) -> Plans<F> {
    let mut planner = realfft::RealFftPlanner::<F>::new();
    Plans {
        forward: planner.plan_fft_forward(n),
        inverse: planner.plan_fft_inverse(n),
    }
}
