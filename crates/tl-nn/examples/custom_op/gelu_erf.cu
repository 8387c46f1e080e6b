// The worked example's kernels (docs/cuda.md, "Your own kernels"): the exact-erf GELU,
//   y  = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))),
//   dx = g * (Phi(x) + x * phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// f32, grid-stride loops over a u64 length, as the project's own kernels (kernels/*.cu).
// PTX: gelu_erf.ptx next to this file (`cargo xtask kernels`, nvcc 13.0, checked by
// `cargo xtask kernels --check`); the kernel emulator compiles this file for the host
// (tl-nn's build.rs, feature cuda-emu).

#define GELU_ERF_INV_SQRT2 0.70710678118654752f    // 1 / sqrt(2)
#define GELU_ERF_INV_SQRT_2PI 0.39894228040143268f // 1 / sqrt(2 pi)

extern "C" __global__ void tl_gelu_erf_fwd(const float* x, float* y, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * GELU_ERF_INV_SQRT2));
    }
}

extern "C" __global__ void tl_gelu_erf_bwd(const float* x, const float* g, float* dx,
                                           unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + erff(v * GELU_ERF_INV_SQRT2));
        const float pdf = expf(-0.5f * v * v) * GELU_ERF_INV_SQRT_2PI;
        dx[i] = g[i] * (cdf + v * pdf);
    }
}
