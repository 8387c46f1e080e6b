// Index kernels: row gathers and their scatter-add backward, contiguous range copies (concat0,
// sliceRange0, scatterAdd*) and the fused cross-entropy rows (sim: device/sim/index.rs).
// Index operands are u32 arrays the host uploads per launch; the host maps every index that is
// out of range to `rows`, and each kernel tests `idx < rows` before any read or write, so no
// index reaches memory out of bounds.
#include "common.cuh"

// out (k, cols): row r is x[idx[r]] (x is (rows, cols)), or zeros when idx[r] >= rows.
extern "C" __global__ void tl_gather_rows(const float* x, const u32* idx, float* out, u64 n,
                                          u32 rows, u32 cols) {
    TL_GRID_STRIDE(i, n) {
        const u64 r = i / cols, c = i % cols;
        const u32 s = idx[r];
        out[i] = s < rows ? x[(u64)s * cols + c] : 0.0f;
    }
}

// Deterministic scatter-add (the gather's backward): one thread per output element (j, c) of
// the (rows, cols) result; the cotangent rows that target row j are order[offsets[j] ..
// offsets[j+1]] in increasing source order (the host builds this CSR), accumulated from 0 in
// that order. The sim does the same sums in the same order.
extern "C" __global__ void tl_scatter_add_rows(const float* g, const u32* offsets,
                                               const u32* order, float* out, u64 n, u32 cols) {
    TL_GRID_STRIDE(o, n) {
        const u64 j = o / cols, c = o % cols;
        float acc = 0.0f;
        for (u32 p = offsets[j]; p < offsets[j + 1]; ++p) {
            acc = acc + g[(u64)order[p] * cols + c];
        }
        out[o] = acc;
    }
}

// Non-deterministic scatter-add: one atomicAdd per cotangent element (n = k * cols) into the
// zeroed (rows, cols) output; rows with idx >= rows are skipped.
extern "C" __global__ void tl_scatter_add_rows_atomic(const float* g, const u32* idx, float* out,
                                                      u64 n, u32 rows, u32 cols) {
    TL_GRID_STRIDE(i, n) {
        const u64 r = i / cols, c = i % cols;
        const u32 s = idx[r];
        if (s < rows) atomicAdd(&out[(u64)s * cols + c], g[i]);
    }
}

// out[i] = x[start + i] for i < n (the host checks start + n <= len(x)).
extern "C" __global__ void tl_copy_range(const float* x, float* out, u64 n, u64 start) {
    TL_GRID_STRIDE(i, n) { out[i] = x[start + i]; }
}

// out (n): g at [start, start + len), zeros elsewhere.
extern "C" __global__ void tl_place_range(const float* g, float* out, u64 n, u64 start,
                                          u64 len) {
    TL_GRID_STRIDE(i, n) { out[i] = (i >= start && i - start < len) ? g[i - start] : 0.0f; }
}

// out (n) = a (na elements) followed by b (n - na).
extern "C" __global__ void tl_concat(const float* a, const float* b, float* out, u64 n, u64 na) {
    TL_GRID_STRIDE(i, n) { out[i] = i < na ? a[i] : b[i - na]; }
}

// out (n) = x with v (len elements) added at [start, start + len); elsewhere an exact copy.
extern "C" __global__ void tl_add_range(const float* x, const float* v, float* out, u64 n,
                                        u64 start, u64 len) {
    TL_GRID_STRIDE(i, n) {
        out[i] = (i >= start && i - start < len) ? x[i] + v[i - start] : x[i];
    }
}

// Block reduction of f(j) for j < cols, as in rows.cu (rows.cu's macro is local to it).
#define TL_INDEX_ROW_REDUCE(result, identity, op, fj)                   \
    do {                                                                \
        float acc_ = (identity);                                        \
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) {            \
            acc_ = op(acc_, (fj));                                      \
        }                                                               \
        result = tl_block_tree(acc_, (identity), op, smem);             \
    } while (0)

// Per-row cross-entropy of (rows, cols) logits: (m + ln sum exp(x - m)) - x[label], m the row
// max; a label >= cols gives 0. One block per row (grid-stride over rows); the label is the
// same for the whole block, so the branch is uniform.
extern "C" __global__ void tl_cross_entropy_rows(const float* x, const u32* labels, float* out,
                                                 u32 rows, u32 cols) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 l = labels[r];
        if (l >= cols) {
            if (threadIdx.x == 0) out[r] = 0.0f;
            continue;
        }
        const float* xr = x + (u64)r * cols;
        float m, s;
        TL_INDEX_ROW_REDUCE(m, -INFINITY, MaxOp(), xr[j]);
        TL_INDEX_ROW_REDUCE(s, 0.0f, AddOp(), expf(xr[j] - m));
        if (threadIdx.x == 0) out[r] = (m + logf(s)) - xr[l];
    }
}

// Its VJP for the mean over rows: with k = g[0] / rows, d[r, j] = exp(x[r, j] - lse_r) * k,
// minus k at the label; rows whose label is >= cols get zeros.
extern "C" __global__ void tl_cross_entropy_rows_bwd(const float* x, const u32* labels,
                                                     const float* g, float* out, u32 rows,
                                                     u32 cols) {
    __shared__ float smem[33];
    const float k = g[0] / (float)rows;
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 l = labels[r];
        const float* xr = x + (u64)r * cols;
        float* dr = out + (u64)r * cols;
        if (l >= cols) {
            for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) dr[j] = 0.0f;
            continue;
        }
        float m, s;
        TL_INDEX_ROW_REDUCE(m, -INFINITY, MaxOp(), xr[j]);
        TL_INDEX_ROW_REDUCE(s, 0.0f, AddOp(), expf(xr[j] - m));
        const float lse = m + logf(s);
        for (u32 j = threadIdx.x; j < cols; j += TL_BLOCK) {
            const float d = expf(xr[j] - lse) * k;
            dr[j] = j == l ? d - k : d;
        }
    }
}
