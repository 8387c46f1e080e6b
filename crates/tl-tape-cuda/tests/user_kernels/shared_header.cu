// Static shared memory declared in a local header (shared_header.cuh), read before written,
// and the correct twin, for tests/tl_tape_cuda/user_kernels.rs (emulator only: no PTX). Each
// kernel computes what tl_test_shared_written (shared_unwritten.cu) does.
#include "shared_header.cuh"

extern "C" __global__ void tl_test_shared_header_unwritten(const float* x, float* y,
                                                           unsigned int rows) {
    y[(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x] = tl_test_header_sum_unzeroed(x, rows);
}

extern "C" __global__ void tl_test_shared_header_global_unwritten(const float* x, float* y,
                                                                  unsigned int rows) {
    y[(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x] =
        tl_test_header_sum_unzeroed_global(x, rows);
}

extern "C" __global__ void tl_test_shared_header_written(const float* x, float* y,
                                                         unsigned int rows) {
    y[(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x] = tl_test_header_sum(x, rows);
}
