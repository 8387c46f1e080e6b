// Static __shared__ variables declared at namespace scope (the file, a namespace, an
// `extern "C"` block), read before written, and their correct twin, for
// tests/tl_tape_cuda/user_kernels.rs (emulator only: no PTX). Each kernel computes what
// tl_test_shared_written (shared_unwritten.cu) does. No statement runs where such a variable is
// declared: the emulator poisons them (a NaN) at the start of every block of a kernel of this
// file, before any of its threads runs, so each wrong kernel gives NaN in every block.

__shared__ float tl_test_file_acc[256];

namespace tl_test_ns {
__shared__ float acc[256], offset;
}

extern "C" {
__shared__ float tl_test_c_acc[256];
}

// Wrong: the file-scope accumulator is never set to 0 before use, only after.
extern "C" __global__ void tl_test_shared_namespace_unwritten(const float* x, float* y,
                                                              unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    for (unsigned int r = 0; r < rows; ++r)
        tl_test_file_acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = tl_test_file_acc[blockDim.x - 1 - t];
    __syncthreads();
    tl_test_file_acc[t] = 0.0f;
}

// Wrong: the namespace's accumulator is set to 0, its scalar (the second declarator) never.
extern "C" __global__ void tl_test_shared_namespace_scalar_unwritten(const float* x, float* y,
                                                                     unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    tl_test_ns::acc[t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r)
        tl_test_ns::acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] =
        tl_test_ns::acc[blockDim.x - 1 - t] + tl_test_ns::offset;
}

// Wrong: the `extern "C"` block's accumulator is never set to 0.
extern "C" __global__ void tl_test_shared_extern_c_unwritten(const float* x, float* y,
                                                             unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    for (unsigned int r = 0; r < rows; ++r)
        tl_test_c_acc[t] += x[base + (unsigned long long)r * blockDim.x + t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] = tl_test_c_acc[blockDim.x - 1 - t];
}

// Right: every variable set before it is read; the accumulators written by each thread in
// turn, then read by others after a barrier (a fill during the block would erase them).
extern "C" __global__ void tl_test_shared_namespace_written(const float* x, float* y,
                                                            unsigned int rows) {
    const unsigned int t = threadIdx.x;
    const unsigned long long base = (unsigned long long)blockIdx.x * rows * blockDim.x;
    if (t == 0) tl_test_ns::offset = 0.0f;
    tl_test_file_acc[t] = 0.0f;
    tl_test_c_acc[t] = 0.0f;
    for (unsigned int r = 0; r < rows; ++r) {
        const float v = x[base + (unsigned long long)r * blockDim.x + t];
        if (r % 2 == 0) tl_test_file_acc[t] += v;
        else tl_test_c_acc[t] += v;
    }
    __syncthreads();
    tl_test_ns::acc[t] = tl_test_file_acc[t] + tl_test_c_acc[t];
    __syncthreads();
    y[(unsigned long long)blockIdx.x * blockDim.x + t] =
        tl_test_ns::acc[blockDim.x - 1 - t] + tl_test_ns::offset;
}
