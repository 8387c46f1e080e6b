// Kernels that only the emulator compiles (no PTX): each breaks a rule on purpose, so the
// emulator's unit tests (crates/tl-tape-cuda/src/device/cuda/emu.rs) can show it is caught.
#include "common.cuh"

// Lanes 0..15 of every warp wait at __syncthreads while lanes 16..31 wait in a warp shuffle:
// no barrier can ever be passed.
extern "C" __global__ void tl_emu_test_divergent(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % TL_WARP < 16) {
        __syncthreads();
    } else {
        v = __shfl_down_sync(TL_FULL_MASK, v, 1);
    }
    out[threadIdx.x] = v;
}

// Each thread reads its right neighbour's shared slot with no __syncthreads between the write
// and the read: the result depends on the order in which the threads run.
extern "C" __global__ void tl_emu_test_race(float* out) {
    __shared__ float s[TL_BLOCK];
    s[threadIdx.x] = (float)threadIdx.x + 1.0f;
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// The same with the barrier: every order gives out[t] = t + 2 (mod the block).
extern "C" __global__ void tl_emu_test_synced(float* out) {
    __shared__ float s[TL_BLOCK];
    s[threadIdx.x] = (float)threadIdx.x + 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
