// Deliberately wrong user kernels (tests/tl_tape_cuda/user_kernels.rs shows each is caught).

// Forgets the grid stride: only the first gridDim.x * blockDim.x elements are written; the
// rest keep the emulator's NaN poison.
extern "C" __global__ void tl_test_scale_wrong_fwd(const float* x, float* y,
                                                   unsigned long long n, float c) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i < 100) y[i] = c * x[i];
}

// Off by a little: c * g + 2^-20 * g (a few ulps).
extern "C" __global__ void tl_test_scale_wrong_bwd(const float* x, const float* g, float* dx,
                                                   unsigned long long n, float c) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dx[i] = c * g[i] + 0x1p-20f * g[i];
}

// Takes the length as u32 where the op passes u64: the emulator refuses the launch.
extern "C" __global__ void tl_test_scale_bad_sig(const float* x, float* y, unsigned int n,
                                                 float c) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = c * x[i];
}
