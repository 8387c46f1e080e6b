// A user's kernel that happens to carry the name of one of the runtime's own (kernels/pointwise.cu
// has tl_scale too): on a GPU each module has its names, and so it is on the emulator
// (tests/tl_tape_cuda/user_kernels.rs, a_user_kernel_may_share_a_name_with_the_runtimes).
// y = c * x + 1, so the test can tell the two apart.
extern "C" __global__ void tl_scale(const float* x, float* y, unsigned long long n, float c) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = c * x[i] + 1.0f;
}
