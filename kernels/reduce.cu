// Reductions. The deterministic kernels follow the order documented in
// crates/tl-tape-cuda/src/device/sim/reduce.rs (fixed grid G = clamp(ceil(n/256), 1, 1024) of
// 256 threads, per-thread strided sums, warp-shuffle tree, block tree, partials, one-block
// second pass). The atomic kernel is used only when deterministic reductions are off.
#include "common.cuh"

// First pass: block b writes partials[b]. Launch with exactly G blocks of 256 threads.
extern "C" __global__ void tl_reduce_partials(const float* x, float* partials, u64 n) {
    __shared__ float smem[33];
    const u64 stride = (u64)gridDim.x * TL_BLOCK;
    float acc = 0.0f;
    for (u64 i = (u64)blockIdx.x * TL_BLOCK + threadIdx.x; i < n; i += stride) acc = acc + x[i];
    float s = tl_block_tree(acc, 0.0f, AddOp(), smem);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Second pass: one block of 256 threads over the g partials; out[0] = sum, or sum / (float)n
// when `mean` is non-zero.
extern "C" __global__ void tl_reduce_final(const float* partials, float* out, u32 g, u64 n,
                                           u32 mean) {
    __shared__ float smem[33];
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < g; i += TL_BLOCK) acc = acc + partials[i];
    float s = tl_block_tree(acc, 0.0f, AddOp(), smem);
    if (threadIdx.x == 0) out[0] = mean ? s / (float)n : s;
}

// Both paths in one launch when they would use one block (n <= 256): that block's tree sum s,
// then / n for a mean. The second pass's tree over s and idle zeros, and the atomic add into a
// zeroed out[0], add +0 to s, which changes nothing (s is never -0: every accumulator starts
// at +0), so this gives the bits of either path.
extern "C" __global__ void tl_reduce_one_block(const float* x, float* out, u64 n, u32 mean) {
    __shared__ float smem[33];
    float acc = 0.0f;
    for (u64 i = threadIdx.x; i < n; i += TL_BLOCK) acc = acc + x[i];
    float s = tl_block_tree(acc, 0.0f, AddOp(), smem);
    if (threadIdx.x == 0) out[0] = mean ? s / (float)n : s;
}

// Non-deterministic single pass: each block's tree sum is atomically added to out[0], which the
// host zeroes first (then divides for a mean with tl_reduce_div).
extern "C" __global__ void tl_reduce_atomic(const float* x, float* out, u64 n) {
    __shared__ float smem[33];
    const u64 stride = (u64)gridDim.x * TL_BLOCK;
    float acc = 0.0f;
    for (u64 i = (u64)blockIdx.x * TL_BLOCK + threadIdx.x; i < n; i += stride) acc = acc + x[i];
    float s = tl_block_tree(acc, 0.0f, AddOp(), smem);
    if (threadIdx.x == 0) atomicAdd(out, s);
}

extern "C" __global__ void tl_reduce_div(float* out, u64 n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = out[0] / (float)n;
}

// x viewed as (outer, n, inner) summed over the middle axis: one thread per output element,
// accumulating in increasing k from 0 (sim: axis_sum).
extern "C" __global__ void tl_axis_sum(const float* x, float* out, u32 outer, u32 n, u32 inner,
                                       u32 mean) {
    const u64 total = (u64)outer * inner;
    TL_GRID_STRIDE(j, total) {
        const u64 o = j / inner, i = j % inner;
        float acc = 0.0f;
        for (u64 k = 0; k < n; ++k) acc = acc + x[(o * n + k) * inner + i];
        out[j] = mean ? acc / (float)n : acc;
    }
}

// The same sum where the axis is long and the outputs few (sim: axis_sum_by_block): one block
// per output element j, thread t accumulating k = t, t + 256, ... in increasing order from +0,
// then the block tree.
extern "C" __global__ void tl_axis_sum_block(const float* x, float* out, u32 outer, u32 n,
                                             u32 inner, u32 mean) {
    __shared__ float smem[33];
    const u64 total = (u64)outer * inner;
    for (u64 j = blockIdx.x; j < total; j += gridDim.x) {
        const u64 o = j / inner, i = j % inner;
        float acc = 0.0f;
        for (u64 k = threadIdx.x; k < n; k += TL_BLOCK) acc = acc + x[(o * n + k) * inner + i];
        const float s = tl_block_tree(acc, 0.0f, AddOp(), smem);
        if (threadIdx.x == 0) out[j] = mean ? s / (float)n : s;
    }
}
