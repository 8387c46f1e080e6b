// Static shared memory declared in a switch with a later case label, read before written, and
// the correct twin, for tests/tl_tape_cuda/user_kernels.rs (emulator only: no PTX). Each kernel
// computes what tl_test_shared_written (shared_unwritten.cu) does. The odd threads jump to
// `case 1`, past the declaration, into its scope (legal: the variable has static storage); the
// even ones pass it and fall through. The emulator cannot poison the variable where the
// declaration is (a thread that jumped past it may have written it already), so it registers
// it there and fills it at the start of the kernel's later blocks on the launching thread.

// Wrong: the accumulator is never set to 0 before use, only after, "for the next block".
extern "C" __global__ void tl_test_shared_switch_unwritten(const float* x, float* y,
                                                           unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    float v = 0.0f;
    switch (t % 2) {
    case 0:
        __shared__ float acc[256];
        [[fallthrough]];
    case 1:
        for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
        __syncthreads();
        v = acc[blockDim.x - 1 - t];
        __syncthreads();
        acc[t] = 0.0f;
    }
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = v;
}

// Right: each thread sets its element to 0 first, the odd ones after jumping past the
// declaration (in reverse order, before any even thread passes it: a fill there would erase
// their zeros and sums).
extern "C" __global__ void tl_test_shared_switch_written(const float* x, float* y,
                                                         unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    float v = 0.0f;
    switch (t % 2) {
    case 0:
        __shared__ float acc[256];
        acc[t] = 0.0f;
        [[fallthrough]];
    case 1:
        if (t % 2 == 1) acc[t] = 0.0f;
        for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
        __syncthreads();
        v = acc[blockDim.x - 1 - t];
    }
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = v;
}
