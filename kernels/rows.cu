// Row kernels of the softmax family over (rows, cols): one block of 256 threads per row
// (grid-stride over rows), row max with fmaxf and row sums in the block-tree order of
// reduce.cu (sim: device/sim/rows.rs).
#include "common.cuh"

// Block reduction of f(j) for j < cols: thread t folds f(t), f(t + 256), ... from identity.
#define TL_ROW_REDUCE(result, identity, op, fj)                         \
    do {                                                                \
        float acc_ = (identity);                                        \
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) {            \
            acc_ = op(acc_, (fj));                                      \
        }                                                               \
        result = tl_block_tree(acc_, (identity), op, smem);             \
    } while (0)

// softmax(c * x) per row: the product c * x[j] (rounded, as tl_scale writes it) is what every
// pass reads, so c = 1 is plain softmax and any c gives scale -> softmax in one launch.
extern "C" __global__ void tl_softmax_rows(const float* x, float* out, u32 rows, u32 cols,
                                           float c) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (u64)r * cols;
        float* yr = out + (u64)r * cols;
        float m, s;
        TL_ROW_REDUCE(m, -INFINITY, MaxOp(), c * xr[j]);
        TL_ROW_REDUCE(s, 0.0f, AddOp(), expf(c * xr[j] - m));
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) yr[j] = expf(c * xr[j] - m) / s;
    }
}

extern "C" __global__ void tl_log_softmax_rows(const float* x, float* out, u32 rows, u32 cols) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (u64)r * cols;
        float* yr = out + (u64)r * cols;
        float m, s;
        TL_ROW_REDUCE(m, -INFINITY, MaxOp(), xr[j]);
        TL_ROW_REDUCE(s, 0.0f, AddOp(), expf(xr[j] - m));
        const float lse = logf(s);
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) yr[j] = (xr[j] - m) - lse;
    }
}

// c * (y * (g - sum(g * y))) per row (c = 1: the softmax VJP; else the VJP of softmax(c * x)
// with respect to x, i.e. softmax_bwd -> scale in one launch).
extern "C" __global__ void tl_softmax_rows_bwd(const float* y, const float* g, float* out,
                                               u32 rows, u32 cols, float c) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 base = (u64)r * cols;
        float dot;
        TL_ROW_REDUCE(dot, 0.0f, AddOp(), g[base + j] * y[base + j]);
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK)
            out[base + j] = c * (y[base + j] * (g[base + j] - dot));
    }
}

// g - exp(y) * sum(g) per row.
extern "C" __global__ void tl_log_softmax_rows_bwd(const float* y, const float* g, float* out,
                                                   u32 rows, u32 cols) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 base = (u64)r * cols;
        float s;
        TL_ROW_REDUCE(s, 0.0f, AddOp(), g[base + j]);
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK)
            out[base + j] = g[base + j] - expf(y[base + j]) * s;
    }
}
