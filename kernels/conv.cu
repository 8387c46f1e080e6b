// Windowed kernels of the conv family (sim: crates/tl-tape-cuda/src/device/sim/conv.rs, geometry
// in device/window.rs): im2col, col2im, pooling forward and backward. Spatial rank <= 8; big,
// small, kernel, stride and padding are passed by value as Dims8, every index row-major with the
// last axis fastest. Window cell k of small cell o reads big cell o*stride + k - padding per axis.
//
// Accumulation paths (crate::determinism):
// - deterministic (and the sim): col2im and pool backward are *gathers*, one thread per big
//   element, which walks its window cells from last to first (small cells in increasing order)
//   and sums from 0: a fixed order, bit-identical between runs;
// - fast (deterministic mode off): *scatters*, one thread per column element / window, adding
//   into the zeroed output with atomicAdd (order left to the hardware).
#include "common.cuh"

struct Geo {
    u32 rank;
    Dims8 big, small, kernel, stride, padding;
};

// The flat big index read by window cell k of small cell o, or -1 for padding (sim:
// Windows::cell).
__device__ long long window_cell(const Geo& g, u64 o, u64 k) {
    u64 flat = 0, st = 1;
    for (int i = (int)g.rank - 1; i >= 0; --i) {
        const u64 oi = o % g.small.d[i], ki = k % g.kernel.d[i];
        o /= g.small.d[i];
        k /= g.kernel.d[i];
        const u64 q = oi * g.stride.d[i] + ki;
        if (q < g.padding.d[i]) return -1;
        const u64 pos = q - g.padding.d[i];
        if (pos >= g.big.d[i]) return -1;
        flat += pos * st;
        st *= g.big.d[i];
    }
    return (long long)flat;
}

// The small cell whose window cell k reads big cell j, or -1 (sim: Windows::window_of).
__device__ long long window_of(const Geo& g, u64 j, u64 k) {
    u64 flat = 0, st = 1;
    for (int i = (int)g.rank - 1; i >= 0; --i) {
        const u64 ji = j % g.big.d[i], ki = k % g.kernel.d[i];
        j /= g.big.d[i];
        k /= g.kernel.d[i];
        const u64 a = ji + g.padding.d[i];
        if (a < ki) return -1;
        const u64 t = a - ki;
        if (t % g.stride.d[i] != 0 || t / g.stride.d[i] >= g.small.d[i]) return -1;
        flat += (t / g.stride.d[i]) * st;
        st *= g.small.d[i];
    }
    return (long long)flat;
}

#define TL_GEO_PARAMS                                                                       \
    u32 rank, Dims8 big, Dims8 small, Dims8 kernel, Dims8 stride, Dims8 padding, u32 batch, \
        u32 channels, u32 kl, u32 sl, u32 bl
#define TL_GEO Geo g = {rank, big, small, kernel, stride, padding}

// cols[c, k, n, o] = x[n, c, cell(o, k)] (0 for padding); n = cols length.
extern "C" __global__ void tl_im2col(const float* x, float* cols, u64 n, TL_GEO_PARAMS) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 o = i % sl, b = (i / sl) % batch, k = (i / ((u64)sl * batch)) % kl;
        const u64 c = i / ((u64)sl * batch * kl);
        const long long j = window_cell(g, o, k);
        cols[i] = j < 0 ? 0.0f : x[(b * channels + c) * bl + (u64)j];
    }
}

// Deterministic col2im: one thread per x element (n = x length), window cells last to first.
extern "C" __global__ void tl_col2im(const float* cols, float* x, u64 n, TL_GEO_PARAMS) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 j = i % bl, c = (i / bl) % channels, b = i / ((u64)bl * channels);
        float acc = 0.0f;
        for (long long k = (long long)kl - 1; k >= 0; --k) {
            const long long o = window_of(g, j, (u64)k);
            if (o >= 0) acc = acc + cols[((c * kl + (u64)k) * batch + b) * sl + (u64)o];
        }
        x[i] = acc;
    }
}

// Fast col2im: one thread per column element (n = cols length), atomicAdd into zeroed x.
extern "C" __global__ void tl_col2im_atomic(const float* cols, float* x, u64 n, TL_GEO_PARAMS) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 o = i % sl, b = (i / sl) % batch, k = (i / ((u64)sl * batch)) % kl;
        const u64 c = i / ((u64)sl * batch * kl);
        const long long j = window_cell(g, o, k);
        if (j >= 0) atomicAdd(&x[(b * channels + c) * bl + (u64)j], cols[i]);
    }
}

// One window's statistics in window order (sim: stats): the first argmax among real cells
// (strict >), the sum of real cells, and for smooth max (kind 2) the pivot and
// z = sum exp(beta (v - p)) over all cells, padding as 0.
struct Stats {
    long long argmax;
    float sum, pivot, z;
};

__device__ Stats window_stats(const Geo& g, const float* xp, u64 o, u32 kl, u32 kind,
                              float beta) {
    Stats s = {-1, 0.0f, 0.0f, 0.0f};
    float best = 0.0f;
    for (u32 k = 0; k < kl; ++k) {
        const long long j = window_cell(g, o, k);
        if (j >= 0) {
            const float v = xp[j];
            if (s.argmax < 0 || v > best) {
                s.argmax = j;
                best = v;
            }
            s.sum = s.sum + v;
        }
    }
    if (kind == 2) {
        float p = beta > 0.0f ? -INFINITY : INFINITY;
        for (u32 k = 0; k < kl; ++k) {
            const long long j = window_cell(g, o, k);
            const float v = j < 0 ? 0.0f : xp[j];
            p = beta > 0.0f ? fmaxf(p, v) : fminf(p, v);
        }
        float z = 0.0f;
        for (u32 k = 0; k < kl; ++k) {
            const long long j = window_cell(g, o, k);
            const float v = j < 0 ? 0.0f : xp[j];
            z = z + expf(beta * (v - p));
        }
        s.pivot = p;
        s.z = z;
    }
    return s;
}

// The share of a window's cotangent gv that big cell j receives (sim: share).
__device__ float window_share(const float* xp, const Stats& s, long long j, float gv, u32 kl,
                              u32 kind, float beta) {
    if (kind == 0) return s.argmax == j ? gv : 0.0f;
    if (kind == 1) return gv / (float)kl;
    return gv * (expf(beta * (xp[j] - s.pivot)) / s.z);
}

// Pool forward: one thread per output (plane, o); n = planes * sl (batch = planes). kind 0 max,
// 1 avg, 2 smooth max.
extern "C" __global__ void tl_pool(const float* x, float* out, u64 n, TL_GEO_PARAMS, u32 kind,
                                   float beta) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 plane = i / sl, o = i % sl;
        const float* xp = x + plane * bl;
        const Stats s = window_stats(g, xp, o, kl, kind, beta);
        float v;
        if (kind == 0) {
            v = s.argmax < 0 ? 0.0f : xp[s.argmax];
        } else if (kind == 1) {
            v = s.sum / (float)kl;
        } else {
            v = s.pivot + logf(s.z) / beta;
        }
        out[i] = v;
    }
}

// Deterministic pool backward: one thread per input element (n = planes * bl); the windows
// reading it in increasing order, each window's statistics recomputed.
extern "C" __global__ void tl_pool_bwd(const float* x, const float* gr, float* dx, u64 n,
                                       TL_GEO_PARAMS, u32 kind, float beta) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 plane = i / bl, j = i % bl;
        const float* xp = x + plane * bl;
        float acc = 0.0f;
        for (long long k = (long long)kl - 1; k >= 0; --k) {
            const long long o = window_of(g, j, (u64)k);
            if (o >= 0) {
                const Stats s = window_stats(g, xp, (u64)o, kl, kind, beta);
                acc = acc + window_share(xp, s, (long long)j, gr[plane * sl + (u64)o], kl, kind,
                                         beta);
            }
        }
        dx[i] = acc;
    }
}

// Fast pool backward: one thread per window (n = planes * sl), atomicAdd of each cell's share
// into the zeroed dx.
extern "C" __global__ void tl_pool_bwd_atomic(const float* x, const float* gr, float* dx, u64 n,
                                              TL_GEO_PARAMS, u32 kind, float beta) {
    TL_GEO;
    TL_GRID_STRIDE(i, n) {
        const u64 plane = i / sl, o = i % sl;
        const float* xp = x + plane * bl;
        const Stats s = window_stats(g, xp, o, kl, kind, beta);
        for (u32 k = 0; k < kl; ++k) {
            const long long j = window_cell(g, o, k);
            if (j >= 0 && (kind != 0 || s.argmax == j)) {
                atomicAdd(&dx[plane * bl + j], window_share(xp, s, j, gr[i], kl, kind, beta));
            }
        }
    }
}
