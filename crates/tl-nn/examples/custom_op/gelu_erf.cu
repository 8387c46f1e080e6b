// The worked example's kernels (docs/cuda.md, "Your own kernels"): the exact-erf GELU,
//   y  = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))),
//   dx = g * (Phi(x) + x * phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// f32 in and out, grid-stride loops over a u64 length, as the project's own kernels
// (kernels/*.cu). Phi and phi are evaluated in double and the result rounded once, because in
// f32 the op is ill-conditioned where a user will look: Phi(x) = 0.5 * (1 + erff(x / sqrt(2)))
// cancels for x < 0 (no correct digit below x = -5.5); written 0.5 * erfcf(-x / sqrt(2)) it is
// still ~x^2 ulps off (13 ulps at x = -4: the rounding of x / sqrt(2) amplified); and the VJP
// Phi(x) + x * phi(x) has a root at x = -0.75, where the f32 terms cancel (358 ulps off). In
// double, on the kernel emulator, value and cotangent are the f64 reference rounded to f32, bit
// for bit, at 5001 points of [-6, 6]; on a GPU CUDA's double erfc/exp add a few ulps of double,
// far below one of f32.
// PTX: gelu_erf.ptx next to this file (`cargo xtask kernels`, nvcc 13.0, checked by
// `cargo xtask kernels --check`); the kernel emulator compiles this file for the host
// (tl-nn's build.rs, feature cuda-emu).

#define GELU_ERF_INV_SQRT2 0.70710678118654752440    // 1 / sqrt(2)
#define GELU_ERF_INV_SQRT_2PI 0.39894228040143267794 // 1 / sqrt(2 pi)

// Phi(v), the standard normal CDF, in double: 0.5 * erfc(-v / sqrt(2)) (no cancellation).
__device__ inline double gelu_erf_cdf(double v) { return 0.5 * erfc(-v * GELU_ERF_INV_SQRT2); }

extern "C" __global__ void tl_gelu_erf_fwd(const float* x, float* y, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const double v = x[i];
        y[i] = (float)(v * gelu_erf_cdf(v));
    }
}

extern "C" __global__ void tl_gelu_erf_bwd(const float* x, const float* g, float* dx,
                                           unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const double v = x[i];
        const double pdf = exp(-0.5 * v * v) * GELU_ERF_INV_SQRT_2PI;
        dx[i] = (float)((double)g[i] * (gelu_erf_cdf(v) + v * pdf));
    }
}
