// Deliberately wrong user kernels (tests/tl_tape_cuda/user_kernels.rs shows each is caught).

// Writes only the first 100 elements; the rest keep the emulator's NaN poison. (A kernel that
// forgets the grid stride does the same past gridDim.x * blockDim.x elements, which the 1-D
// launches of ElementwiseKernels reach only past 65535 * 256.)
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

// Off by one: runs to i <= n, so it reads x[n] (past x's end: its guard's NaN) and writes y[n]
// (past y's end), NaN, with x's guard payload.
extern "C" __global__ void tl_test_scale_obo_fwd(const float* x, float* y,
                                                 unsigned long long n, float c) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i <= n; i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = c * x[i];
}

// Hands each element to the next thread through shared memory with no __syncthreads()
// between the write and the read: right when a block's threads run in order (thread t - 1
// has written s[t] before thread t reads it), wrong in reverse (one element a thread; the
// launches of ElementwiseKernels give every thread at most one below 65535 * 256).
extern "C" __global__ void tl_test_scale_racy_fwd(const float* x, float* y,
                                                  unsigned long long n, float c) {
    __shared__ float s[1025];
    const unsigned int t = threadIdx.x;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + t;
    if (i < n) {
        if (i + 1 < n) s[t + 1] = c * x[i + 1];
        y[i] = t == 0 ? c * x[i] : s[t];
    }
}

// Takes the length as u32 where the op passes u64: the emulator refuses the launch.
extern "C" __global__ void tl_test_scale_bad_sig(const float* x, float* y, unsigned int n,
                                                 float c) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = c * x[i];
}
