// CUDA built-ins a user's kernel may call that the project's own kernels do not: the emulator
// provides them (tests/tl_tape_cuda/user_kernels.rs, emulated::a_user_kernel_calls_warp_shuffles_and_built_ins).
// One block; for element i of x (integer values, so every sum is exact), four outputs:
// its warp's sum by an xor butterfly, lane 0's value, the previous lane's value (lane 0 its
// own), and saturate(x/4) + popc(i) + rsqrt(4) + 1000·(i xor 1) through an int shuffle.
extern "C" __global__ void tl_test_warp_builtins(const float* x, float* y, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? __ldg(&x[i]) : 0.0f;
    float s = v;
    for (int m = warpSize / 2; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    const float first = __shfl_sync(0xffffffffu, v, 0);
    const float prev = __shfl_up_sync(0xffffffffu, v, 1u);
    const int partner = __shfl_xor_sync(0xffffffffu, (int)i, 1);
    const float zero = __fdividef(v, 2.0f) - __frcp_rn(2.0f) * v;
    if (i < n) {
        y[4 * i] = s;
        y[4 * i + 1] = first;
        y[4 * i + 2] = prev;
        y[4 * i + 3] = __saturatef(0.25f * v) + (float)__popc(i) + rsqrtf(4.0f) +
                       1000.0f * (float)partner + zero;
    }
}
