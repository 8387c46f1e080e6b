// Several declarators in one static __shared__ declaration, read before written, and their
// correct twin, for tests/tl_tape_cuda/user_kernels.rs (emulator only: no PTX). Each kernel
// computes what tl_test_shared_written (shared_unwritten.cu) does: thread t of block b writes
// y[b * blockDim.x + t] = the sum over r < rows of x[(b * rows + r) * blockDim.x + blockDim.x - 1 - t]
// (blockDim.x at most 256). The emulator poisons every declarator of the declaration (a NaN
// in each block), so each wrong kernel gives NaN in every block, where arrays that start at 0
// and keep the previous block's values gave the right sums.

// Wrong: the accumulator is the declaration's second declarator, after a 2-D array (written),
// and is never set to 0 before use, only after, "for the next block".
extern "C" __global__ void tl_test_shared_declarators_second_unwritten(const float* x, float* y,
                                                                       unsigned int rows) {
    __shared__ __align__(16) float lead[2][64], acc[256];
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    if (t < 64) lead[1][t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = acc[blockDim.x - 1 - t] + lead[1][t % 64];
    __syncthreads();
    acc[t] = 0.0f;
}

// Wrong: the accumulator is set to 0, but the scalar declarator after it (an offset every
// thread adds) is never written: it "starts at 0".
extern "C" __global__ void tl_test_shared_declarators_scalar_unwritten(const float* x, float* y,
                                                                       unsigned int rows) {
    __shared__ float acc[256], offset;
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    acc[t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = acc[blockDim.x - 1 - t] + offset;
}

// Right: every declarator written before it is read (volatile, a 2-D array, an array and a
// scalar over two lines).
extern "C" __global__ void tl_test_shared_declarators_written(const float* x, float* y,
                                                              unsigned int rows) {
    volatile __shared__ float lead[2][64], acc[256],
        offset;
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    if (t == 0) offset = 0.0f;
    if (t < 64) lead[1][t] = 0.0f;
    acc[t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = acc[blockDim.x - 1 - t] + lead[1][t % 64] + offset;
}
