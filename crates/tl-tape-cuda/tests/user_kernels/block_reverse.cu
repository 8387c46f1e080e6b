// A user's kernel with dynamic shared memory (LaunchShape::Grid's `shared` bytes), for
// tests/tl_tape_cuda/user_kernels.rs; only the emulator compiles it (no PTX). The macro is the
// portable declaration: the emulator's cuda_emu.h defines it, nvcc gets the `#ifndef` below.
#ifndef TL_DYNAMIC_SHARED
#define TL_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// Block b reverses its run of `words` floats of x through shared memory: y[b * words + w] =
// x[b * words + words - 1 - w]. `words` floats of dynamic shared memory a block.
extern "C" __global__ void tl_test_block_reverse(const float* x, float* y, unsigned int words) {
    TL_DYNAMIC_SHARED(float, buf);
    const unsigned long long base = (unsigned long long)blockIdx.x * words;
    for (unsigned int w = threadIdx.x; w < words; w += blockDim.x) buf[w] = x[base + w];
    __syncthreads();
    for (unsigned int w = threadIdx.x; w < words; w += blockDim.x)
        y[base + w] = buf[words - 1 - w];
}
