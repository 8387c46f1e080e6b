// A user's kernels for tests/tl_tape_cuda/user_kernels.rs, built for the kernel emulator by
// build.rs through tl-cuda-build's Emulator, as a user's build.rs builds its own. Only the
// emulator compiles them (no PTX).

// y = c * x and its VJP dx = c * g, c an f32 parameter; grid-stride loops.
extern "C" __global__ void tl_test_scale_fwd(const float* x, float* y, unsigned long long n,
                                             float c) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = c * x[i];
}

extern "C" __global__ void tl_test_scale_bwd(const float* x, const float* g, float* dx,
                                             unsigned long long n, float c) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dx[i] = c * g[i];
}

// y = a * b (two operands) and its VJP (da, db) = (g * b, g * a).
extern "C" __global__ void tl_test_mul_fwd(const float* a, const float* b, float* y,
                                           unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = a[i] * b[i];
}

extern "C" __global__ void tl_test_mul_bwd(const float* a, const float* b, const float* g,
                                           float* da, float* db, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        da[i] = g[i] * b[i];
        db[i] = g[i] * a[i];
    }
}
