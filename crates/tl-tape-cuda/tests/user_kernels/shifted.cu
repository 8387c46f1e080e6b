// A user's kernel taking a signed int and a double (KernelArg::I32, KernelArg::F64), for
// tests/tl_tape_cuda/user_kernels.rs; only the emulator compiles it (no PTX).

// y[i] = (float)(scale * x[(i + shift) mod n]) for i < n, the index wrapped both ways (shift
// may be negative or past n).
extern "C" __global__ void tl_test_shifted(const float* x, float* y, unsigned long long n, int shift,
                                           double scale) {
    const long long s = (long long)(shift % (long long)n);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long from = (unsigned long long)(((long long)i + s + (long long)n) % (long long)n);
        y[i] = (float)(scale * (double)x[from]);
    }
}
