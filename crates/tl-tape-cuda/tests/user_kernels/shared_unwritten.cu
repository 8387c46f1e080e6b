// Static shared memory read before it is written, and its correct twin, for
// tests/tl_tape_cuda/user_kernels.rs; only the emulator compiles them (no PTX). On a GPU shared
// memory is undefined at a block's start; the emulator fills each block's static __shared__
// variables with 0xFF bytes (a NaN) where the block's first thread passes the declaration, so
// the first kernel gives NaN in every block, block 0 included (where a zeroed array would look
// like an initialised accumulator).

// Each block sums `rows` rows of blockDim.x (at most 256) columns of x into a shared
// accumulator, then thread t writes column blockDim.x - 1 - t of its block's sums:
// y[b * blockDim.x + t] = sum over r of x[(b * rows + r) * blockDim.x + blockDim.x - 1 - t].
// Wrong: the accumulator is never set to 0 before use, only after, "for the next block" (as if
// a block found shared memory as the previous one left it: an emulator whose shared arrays
// start at 0 and keep their values ran this right in every block).
extern "C" __global__ void tl_test_shared_unwritten(const float* x, float* y, unsigned int rows) {
    __shared__ float acc[256];
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = acc[blockDim.x - 1 - t];
    __syncthreads();
    acc[t] = 0.0f;
}

// The same sums, right: the accumulator is set to 0 first. Declared inside the loop, so each
// thread passes the declaration `rows` times a block, after other threads have written it: the
// block's first pass alone poisons it, or the sums would be NaN.
extern "C" __global__ void tl_test_shared_written(const float* x, float* y, unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    float sum = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) {
        __shared__ float acc[256];
        if (r == 0) acc[t] = 0.0f;
        acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
        __syncthreads();
        if (r + 1 == rows) sum = acc[blockDim.x - 1 - t];
        __syncthreads();
    }
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = sum;
}
