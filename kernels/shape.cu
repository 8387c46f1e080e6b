// Layout kernels: a strided gather (permute and broadcast) and the broadcast's reduction
// (sim: device/mod.rs plans + device/sim.rs). Dims are passed by value, rank <= 8.
#include "common.cuh"

// out[i] = x[src(i)], src(i) = sum_k coord_k(i) * src_strides[k], coords of i row-major over
// `dims` (rank axes). Broadcast uses source stride 0 along broadcast axes.
extern "C" __global__ void tl_gather(const float* x, float* out, u64 n, u32 rank, Dims8 dims,
                                     Dims8 src_strides) {
    TL_GRID_STRIDE(i, n) {
        u64 rem = i, src = 0;
        for (int k = (int)rank - 1; k >= 0; --k) {
            const u64 d = dims.d[k];
            src += (rem % d) * src_strides.d[k];
            rem /= d;
        }
        out[i] = x[src];
    }
}

// Deterministic broadcast reduction: one thread per output element (n_out of them). Over the
// `rank` axes of the cotangent: `keep` holds the cotangent's dim where the axis is kept and 1
// where it is reduced, `red` the opposite, `gstrides` the cotangent's row-major strides. The
// output's coordinates (row-major over keep) give a base offset; the preimage is walked
// row-major over `red` (increasing cotangent index), accumulating from 0.
extern "C" __global__ void tl_reduce_broadcast(const float* g, float* out, u64 n_out, u32 rank,
                                               Dims8 keep, Dims8 red, Dims8 gstrides,
                                               u64 n_red) {
    TL_GRID_STRIDE(o, n_out) {
        u64 rem = o, base = 0;
        for (int k = (int)rank - 1; k >= 0; --k) {
            const u64 d = keep.d[k];
            base += (rem % d) * gstrides.d[k];
            rem /= d;
        }
        float acc = 0.0f;
        for (u64 c = 0; c < n_red; ++c) {
            u64 r = c, off = 0;
            for (int k = (int)rank - 1; k >= 0; --k) {
                const u64 d = red.d[k];
                off += (r % d) * gstrides.d[k];
                r /= d;
            }
            acc = acc + g[base + off];
        }
        out[o] = acc;
    }
}

// Non-deterministic broadcast reduction: one atomicAdd per cotangent element into the zeroed
// output (the gather's index map, run backwards).
extern "C" __global__ void tl_reduce_broadcast_atomic(const float* g, float* out, u64 n, u32 rank,
                                                      Dims8 dims, Dims8 src_strides) {
    TL_GRID_STRIDE(i, n) {
        u64 rem = i, src = 0;
        for (int k = (int)rank - 1; k >= 0; --k) {
            const u64 d = dims.d[k];
            src += (rem % d) * src_strides.d[k];
            rem /= d;
        }
        atomicAdd(&out[src], g[i]);
    }
}
