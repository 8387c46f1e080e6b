// Column sums through static shared memory declared in a header (a function's and one at
// namespace scope), for shared_header.cu. The emulator compiles a copy of a header a source
// includes with `#include "..."`, its declarations poisoned as a source's are.
#pragma once

__shared__ float tl_test_header_acc[256];

// Wrong: the function's accumulator is never set to 0 before use, only after.
__device__ inline float tl_test_header_sum_unzeroed(const float* x, unsigned int rows) {
    __shared__ float acc[256];
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    for (unsigned int r = 0; r < rows; ++r) acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    const float v = acc[blockDim.x - 1 - t];
    __syncthreads();
    acc[t] = 0.0f;
    return v;
}

// Wrong: the header's namespace-scope accumulator, the same way.
__device__ inline float tl_test_header_sum_unzeroed_global(const float* x, unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    for (unsigned int r = 0; r < rows; ++r)
        tl_test_header_acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    const float v = tl_test_header_acc[blockDim.x - 1 - t];
    __syncthreads();
    tl_test_header_acc[t] = 0.0f;
    return v;
}

// Right: both accumulators set to 0 first.
__device__ inline float tl_test_header_sum(const float* x, unsigned int rows) {
    __shared__ float acc[256];
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    acc[t] = 0.0f;
    tl_test_header_acc[t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) {
        const float v = x[base + (unsigned long long)r * blockDim.x + t];
        if (r % 2 == 0) acc[t] += v;
        else tl_test_header_acc[t] += v;
    }
    __syncthreads();
    return acc[blockDim.x - 1 - t] + tl_test_header_acc[blockDim.x - 1 - t];
}
