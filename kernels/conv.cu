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
#include "gemm_tc.cuh"
#include "gemm_tile.cuh"

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

// One window's statistics in window order (sim: stats): the argmax among real cells (the first
// NaN, else the first max: tl_spec::ops::pool::takes_max), the sum of real cells, and for smooth max (kind 2) the pivot and
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
            if (s.argmax < 0 || (best == best && !(v <= best))) {
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

// ---- Implicit-GEMM convolution (forward; the cotangents tl_conv_implicit_dx, _dw after it) ----
//
// tl_conv_implicit: y (N, A, L) = w (A, C·K) · im2col(x) (C·K, N·L) without the column matrix
// (sim: conv::conv_implicit; the selection rule: ops::conv::implicit in the crate, docs/cuda.md).
// The arithmetic of tl_gemm on that product (kernels/linalg.cu; the tile and its k loop are
// kernels/gemm_tile.cuh, shared by both): 256 threads (16 x 16) a block,
// 64 x 64 outputs, 4 x 4 a thread in registers, k = C·K in slices of 16 staged through two
// shared buffers; each output accumulates over p = c·K + k in increasing order from 0 as
// fma(w, x, acc), a padding cell as fma(w, 0, acc), as the GEMM sums the column matrix's zeros.
// So where the im2col GEMM is not split along k (Gemm::k_chunk) both give the same bits. The
// loader of op(b) gathers each slice's window cells straight from x: each thread keeps one
// column (n, o) of every slice, so its window origin o·stride − padding per axis is computed
// once; the finished tile is written in (N, A, L) order, so no permute follows.
namespace igemm {

constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
constexpr int LA = BK * BM / 256, LB = BK * BN / 256;  // elements a thread stages

// One column (n, o) of the forward's op(b) = im2col(x), `gcol` of the product's `cols` = N·L:
// x's image n and, per axis, the big position of window cell 0 of small cell o (o·stride −
// padding), decomposed once. `at(p)`: its element p = c·K + kk, x[n, c, cell(o, kk)], or 0 for
// padding. A column past the product (`in` false) stands for image 0's cell 0 and is never read.
template <int R>
struct XColumn {
    const float* xb;
    long long org[R ? R : 8];
    bool in;
    __device__ XColumn(const Geo& g, const float* x, u64 gcol, u64 cols, u32 channels, u32 sl,
                       u32 bl, int rank) {
        in = gcol < cols;
        xb = x + (in ? gcol / sl : 0) * channels * bl;
        u64 o = in ? gcol % sl : 0;
        for (int i = rank - 1; i >= 0; --i) {
            org[i] = (long long)((o % g.small.d[i]) * g.stride.d[i]) - (long long)g.padding.d[i];
            o /= g.small.d[i];
        }
    }
    __device__ float at(const Geo& g, u32 p, u32 kl, u32 bl, int rank) const {
        u32 kk = p % kl;
        u64 flat = 0, st = 1;
        for (int i = rank - 1; i >= 0; --i) {
            const long long pos = org[i] + (long long)(kk % g.kernel.d[i]);
            kk /= g.kernel.d[i];
            if (pos < 0 || pos >= (long long)g.big.d[i]) return 0.0f;
            flat += (u64)pos * st;
            st *= g.big.d[i];
        }
        return xb[(u64)(p / kl) * bl + flat];
    }
};

// R: the spatial rank when known at compile time (1, 2, 3), or 0 for any rank <= 8.
template <int R>
__device__ void tiles(float (*As)[BK][BM + 4], float (*Bs)[BK][BN + 4], const float* w,
                      const float* x, float* y, const Geo& g, u32 batch, u32 channels, u32 kl,
                      u32 sl, u32 bl, u32 m) {
    const int rank = R ? R : (int)g.rank;
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const u32 row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const u32 k = channels * kl;
    const u64 n = (u64)batch * sl;
    // This thread's column of op(b) in every slice, and its slice rows p0 + LB·l (slice_pos
    // with the column fastest: e = threadIdx.x + 256·l gives column e % 64, row e / 64).
    const u32 jb = threadIdx.x % BN, pb = threadIdx.x / BN;
    const XColumn<R> col(g, x, (u64)col0 + jb, n, channels, sl, bl, rank);
    float ra[LA], rb[LB];
    auto fetch = [&](u32 p0) {
        for (int l = 0; l < LA; ++l) {
            const u32 e = threadIdx.x + 256 * l, p = e % BK, i = e / BK;  // w along k
            const u32 gi = row0 + i, gp = p0 + p;
            ra[l] = gi < m && gp < k ? w[(u64)gi * k + gp] : 0.0f;
        }
        for (int l = 0; l < LB; ++l) {
            const u32 gp = p0 + pb + (u32)(256 / BN) * l;
            rb[l] = col.in && gp < k ? col.at(g, gp, kl, bl, rank) : 0.0f;
        }
    };
    auto stage = [&](int buf) {
        for (int l = 0; l < LA; ++l) {
            const u32 e = threadIdx.x + 256 * l;
            As[buf][e % BK][e / BK] = ra[l];
        }
        for (int l = 0; l < LB; ++l) Bs[buf][pb + (256 / BN) * l][jb] = rb[l];
    };
    float acc[TM][TN];
    tile_run(As, Bs, 0, k, fetch, stage, acc);
    for (int j = 0; j < TN; ++j) {
        const u64 gj = (u64)col0 + reg_pos(tx, j);
        if (gj >= n) continue;
        const u64 b = gj / sl, o = gj % sl;
        for (int i = 0; i < TM; ++i) {
            const u32 gi = row0 + reg_pos(ty, i);
            if (gi < m) y[(b * m + gi) * sl + o] = acc[i][j];
        }
    }
}

// tl_conv_implicit_tc: the forward's product on the tensor-core tile (gemm_tc.cuh; autocast,
// `P` the operands' precision, each rounded as it is staged): 128 x 128 outputs a block, the
// depth C·K in slices of 16 zero-padded past its end, the same loaders as `tiles` (w along k,
// each thread one column of im2col(x) gathered straight from x) and the same (N, A, L) output.
// On the emulator each output is the sum over p = c·K + k in increasing order from 0 of
// fma(round(w), round(x), acc), plus 0 where C·K is not a multiple of 16 (the padding: sim
// conv::conv_implicit at the precision), the bits of the im2col path's tensor-core GEMM where
// that is not split along k; on a GPU the tensor cores' order.
template <int R, class P>
__device__ void tiles_tc(unsigned char* smem, const float* w, const float* x, float* y,
                         const Geo& g, u32 batch, u32 channels, u32 kl, u32 sl, u32 bl, u32 m) {
    constexpr int TA = tc::BM * tc::BK / tc::THREADS, TB = tc::BK * tc::BN / tc::THREADS;
    const int rank = R ? R : (int)g.rank;
    const u32 row0 = blockIdx.y * tc::BM;
    const u64 col0 = (u64)blockIdx.x * tc::BN;
    const u32 k = channels * kl;
    const u64 n = (u64)batch * sl;
    // The thread's column of op(b) in every slice and its slice rows pb + 2·l.
    const u32 jb = threadIdx.x % tc::BN, pb = threadIdx.x / tc::BN;
    const XColumn<R> col(g, x, col0 + jb, n, channels, sl, bl, rank);
    float ra[TA], rb[TB];
    auto fetch = [&](u32 p0) {
        for (int l = 0; l < TA; ++l) {
            const u32 e = threadIdx.x + tc::THREADS * l, p = e % tc::BK, i = e / tc::BK;
            const u32 gi = row0 + i, gp = p0 + p;
            ra[l] = gi < m && gp < k ? w[(u64)gi * k + gp] : 0.0f;
        }
        for (int l = 0; l < TB; ++l) {
            const u32 gp = p0 + pb + (u32)(tc::THREADS / tc::BN) * l;
            rb[l] = col.in && gp < k ? col.at(g, gp, kl, bl, rank) : 0.0f;
        }
    };
    auto stage = [&](typename P::T* as, typename P::T* bs, int lda, int ldb) {
        for (int l = 0; l < TA; ++l) {
            const u32 e = threadIdx.x + tc::THREADS * l;
            as[(e / tc::BK) * lda + e % tc::BK] = P::cvt(ra[l]);
        }
        for (int l = 0; l < TB; ++l)
            bs[(pb + (tc::THREADS / tc::BN) * l) * ldb + jb] = P::cvt(rb[l]);
    };
    auto put = [&](u32 r, u32 c, float v) {
        const u32 gi = row0 + r;
        const u64 gj = col0 + c;
        if (gi < m && gj < n) y[((gj / sl) * m + gi) * sl + gj % sl] = v;
    };
    tc::block<P>(smem, 0, k, fetch, stage, put);
}

// The small cell whose window cell k reads the big cell at per-axis positions jp[i] + padding
// (`jp` holds them), or -1 (window_of with the position decomposed once).
template <int R>
__device__ inline long long window_at(const Geo& g, const long long* jp, u32 k, int rank) {
    u64 flat = 0, st = 1;
    for (int i = rank - 1; i >= 0; --i) {
        const long long t = jp[i] - (long long)(k % g.kernel.d[i]);
        k /= g.kernel.d[i];
        if (t < 0 || t % g.stride.d[i] != 0 || t / g.stride.d[i] >= (long long)g.small.d[i])
            return -1;
        flat += (u64)(t / g.stride.d[i]) * st;
        st *= g.small.d[i];
    }
    return (long long)flat;
}

// Big cell j's per-axis positions plus padding, into jp.
template <int R>
__device__ inline void big_pos(const Geo& g, u64 j, long long* jp, int rank) {
    for (int i = rank - 1; i >= 0; --i) {
        jp[i] = (long long)(j % g.big.d[i]) + (long long)g.padding.d[i];
        j /= g.big.d[i];
    }
}

// The input cotangent: dx (N, C, big) = col2im(wᵀ · g') without the column matrix. Rows c,
// columns (n, j), depth a; for each window cell k from last to first, the term
// part = Σ_a w[a, c, k] · g[n, a, o] (fma from 0 in increasing a, 16 a slice) of the small cell o
// whose window cell k reads j, added to the output as acc + part where o exists (the gather
// col2im's order over the GEMM's sums).
template <int R>
__device__ void tiles_dx(float (*As)[BK][BM + 4], float (*Bs)[BK][BN + 4], const float* w,
                         const float* gr, float* dx, const Geo& g, u32 batch, u32 channels,
                         u32 kl, u32 sl, u32 bl, u32 depth) {
    const int rank = R ? R : (int)g.rank;
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const u32 row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const u32 m = channels, ck = channels * kl;
    const u64 n = (u64)batch * bl;
    // The loader's column (as in `tiles`) and the thread's output columns, decomposed.
    const u32 jb = threadIdx.x % BN, pb = threadIdx.x / BN;
    const u64 gcol = (u64)col0 + jb;
    const bool col_in = gcol < n;
    const float* gb = gr + (col_in ? gcol / bl : 0) * depth * sl;
    long long jp[R ? R : 8], op[TN][R ? R : 8];
    big_pos<R>(g, col_in ? gcol % bl : 0, jp, rank);
    bool out_in[TN];
    for (int j = 0; j < TN; ++j) {
        const u64 gj = (u64)col0 + reg_pos(tx, j);
        out_in[j] = gj < n;
        big_pos<R>(g, out_in[j] ? gj % bl : 0, op[j], rank);
    }
    const u32 sa = (depth + BK - 1) / BK;  // slices of a per window cell
    const u32 steps = kl * sa;
    float ra[LA], rb[LB];
    // Step s: window cell kl - 1 - s / sa, a from 16·(s % sa).
    auto fetch = [&](u32 s) {
        const u32 k = kl - 1 - s / sa, a0 = (s % sa) * BK;
        for (int l = 0; l < LA; ++l) {
            const u32 e = threadIdx.x + 256 * l, i = e % BM, p = e / BM;  // c fastest
            const u32 gi = row0 + i, ga = a0 + p;
            ra[l] = gi < m && ga < depth ? w[(u64)ga * ck + (u64)gi * kl + k] : 0.0f;
        }
        const long long o = col_in ? window_at<R>(g, jp, k, rank) : -1;
        for (int l = 0; l < LB; ++l) {
            const u32 ga = a0 + pb + (u32)(256 / BN) * l;
            rb[l] = o >= 0 && ga < depth ? gb[(u64)ga * sl + (u64)o] : 0.0f;
        }
    };
    auto stage = [&](int buf) {
        for (int l = 0; l < LA; ++l) {
            const u32 e = threadIdx.x + 256 * l;
            As[buf][e / BM][e % BM] = ra[l];
        }
        for (int l = 0; l < LB; ++l) Bs[buf][pb + (256 / BN) * l][jb] = rb[l];
    };
    float acc[TM][TN], part[TM][TN];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] = part[i][j] = 0.0f;
    if (steps > 0) {
        fetch(0);
        stage(0);
    }
    __syncthreads();
    int buf = 0;
    for (u32 s = 0; s < steps; ++s) {
        const bool more = s + 1 < steps;
        if (more) fetch(s + 1);
        const u32 a0 = (s % sa) * BK;
        tile_fma(As[buf], Bs[buf], depth - a0 < BK ? depth - a0 : BK, part);
        if (s % sa == sa - 1) {  // the window cell's last slice: add its terms where o exists
            const u32 k = kl - 1 - s / sa;
            for (int j = 0; j < TN; ++j) {
                const bool has = out_in[j] && window_at<R>(g, op[j], k, rank) >= 0;
                for (int i = 0; i < TM; ++i) {
                    if (has) acc[i][j] = __fadd_rn(acc[i][j], part[i][j]);
                    part[i][j] = 0.0f;
                }
            }
        }
        if (more) stage(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
    for (int j = 0; j < TN; ++j) {
        const u64 gj = (u64)col0 + reg_pos(tx, j);
        if (gj >= n) continue;
        const u64 b = gj / bl, jj = gj % bl;
        for (int i = 0; i < TM; ++i) {
            const u32 gi = row0 + reg_pos(ty, i);
            if (gi < m) dx[(b * m + gi) * bl + jj] = acc[i][j];
        }
    }
}

// The input cotangent on the tensor-core tile (autocast; `P` the operands' precision, each
// rounded as it is staged), tiles_dx's order: per window cell k from last to first, part =
// Σ_a w[a, c, k]·g[n, a, o] in the accumulator fragments from +0, slices of 16 a zero-padded
// past A; then, through the warp's scratch (Tile::drain), acc + part where the small cell o
// that reads the column's big cell through k exists, acc in registers (the lane's 8 elements
// of each of its 4 x 2 fragments: one column, lane % 16, a fragment column). 128 x 128 outputs
// a block. On the emulator the sim twin's bits (conv::conv_implicit_dx at the precision).
template <int R, class P>
__device__ void tiles_dx_tc(unsigned char* smem, const float* w, const float* gr, float* dx,
                            const Geo& g, u32 batch, u32 channels, u32 kl, u32 sl, u32 bl,
                            u32 depth) {
    constexpr int TA = tc::BM * tc::BK / tc::THREADS, TB = tc::BK * tc::BN / tc::THREADS;
    constexpr int RK = R ? R : 8, ROWS = tc::THREADS / tc::BN;
    const int rank = R ? R : (int)g.rank;
    const u32 row0 = blockIdx.y * tc::BM;
    const u64 col0 = (u64)blockIdx.x * tc::BN;
    const u32 m = channels, ck = channels * kl;
    const u64 n = (u64)batch * bl;
    // The loader's column of g (its big cell, decomposed) and slice rows pb + 2·l.
    const u32 jb = threadIdx.x % tc::BN, pb = threadIdx.x / tc::BN;
    const u64 gcol = col0 + jb;
    const bool col_in = gcol < n;
    const float* gb = gr + (col_in ? gcol / bl : 0) * depth * sl;
    long long jp[RK];
    big_pos<R>(g, col_in ? gcol % bl : 0, jp, rank);
    tc::Tile<P> t(smem);
    // The lane's output column in each fragment column j, decomposed.
    long long op[tc::FJ][RK];
    bool out_in[tc::FJ];
    for (int j = 0; j < tc::FJ; ++j) {
        const u64 gj = col0 + t.wn * tc::WN + 16 * j + t.lane % 16;
        out_in[j] = gj < n;
        big_pos<R>(g, out_in[j] ? gj % bl : 0, op[j], rank);
    }
    const u32 sa = (depth + tc::BK - 1) / tc::BK;  // slices of a per window cell
    float ra[TA], rb[TB];
    // Slice s = p0 / 16: window cell kl - 1 - s / sa, a from 16·(s % sa).
    auto fetch = [&](u32 p0) {
        const u32 s = p0 / tc::BK, k = kl - 1 - s / sa, a0 = (s % sa) * tc::BK;
        for (int l = 0; l < TA; ++l) {
            const u32 e = threadIdx.x + tc::THREADS * l, i = e % tc::BM, p = e / tc::BM;
            const u32 gi = row0 + i, ga = a0 + p;
            ra[l] = gi < m && ga < depth ? w[(u64)ga * ck + (u64)gi * kl + k] : 0.0f;
        }
        const long long o = col_in ? window_at<R>(g, jp, k, rank) : -1;
        for (int l = 0; l < TB; ++l) {
            const u32 ga = a0 + pb + (u32)ROWS * l;
            rb[l] = o >= 0 && ga < depth ? gb[(u64)ga * sl + (u64)o] : 0.0f;
        }
    };
    auto stage = [&](typename P::T* as, typename P::T* bs, int lda, int ldb) {
        for (int l = 0; l < TA; ++l) {
            const u32 e = threadIdx.x + tc::THREADS * l;
            as[(e % tc::BM) * lda + e / tc::BM] = P::cvt(ra[l]);
        }
        for (int l = 0; l < TB; ++l) bs[(pb + ROWS * l) * ldb + jb] = P::cvt(rb[l]);
    };
    auto stage_buf = [&](int buf) { t.stage(buf, stage); };
    float acc[tc::FI][tc::FJ][8];
    for (int i = 0; i < tc::FI; ++i)
        for (int j = 0; j < tc::FJ; ++j)
            for (int l = 0; l < 8; ++l) acc[i][j][l] = 0.0f;
    u32 done = 0;  // slices multiplied
    auto compute = [&](int buf, u32) {
        t.mma(buf);
        if (done % sa == sa - 1) {  // the window cell's last slice: add its parts where o exists
            const u32 k = kl - 1 - done / sa;
            bool has[tc::FJ];
            for (int j = 0; j < tc::FJ; ++j)
                has[j] = out_in[j] && window_at<R>(g, op[j], k, rank) >= 0;
            auto add = [&](int i, int j, int l, u32, u32, float v) {
                if (has[j]) acc[i][j][l] = __fadd_rn(acc[i][j][l], v);
            };
            t.drain(add);
            t.zero();
        }
        ++done;
    };
    // The host holds kl·sa·16 to a u32. No output channels (sa = 0): no slice, the sums +0
    // (k_slices reads its first slice before its loop, and a slice needs sa).
    if (sa > 0) k_slices<tc::BK>(0, kl * sa * tc::BK, fetch, stage_buf, compute);
    for (int i = 0; i < tc::FI; ++i) {
        for (int j = 0; j < tc::FJ; ++j) {
            const u64 gj = col0 + t.wn * tc::WN + 16 * j + t.lane % 16;
            if (gj >= n) continue;
            const u64 b = gj / bl, jj = gj % bl;
            for (int l = 0; l < 8; ++l) {
                const u32 gi = row0 + t.wm * tc::WM + 16 * i + t.lane / 16 + 2 * l;
                if (gi < m) dx[(b * m + gi) * bl + jj] = acc[i][j][l];
            }
        }
    }
}

// The weight cotangent: dw (A, C·K) = g' (A, N·L) · im2col(x)ᵀ (N·L, C·K) without the column
// matrix (nor the permute of g to g'). Rows a, columns q = c·K + k, depth p = n·L + o. The GEMM
// tl_gemm runs on that product (Gemm::nn(A, N·L, C·K), b transposed) split along its depth
// into runs of kc (Gemm::k_chunk; one run covering N·L where it does not split): block z sums
// run z, p in [z·kc, min((z + 1)·kc, N·L)), in increasing p from 0 as fma(g, x, acc), a
// padding cell as fma(g, 0, acc), and writes its tile to out + z·A·C·K (the run's matrix,
// added by tl_gemm_sum_splits; unsplit, the result itself): the im2col path's bits, split or
// not. Under autocast tiles_dw_tc runs the same runs (kc from Gemm::k_chunk_tiled over its
// 128 x 128 tiles, as tl_gemm_tc splits) on the tensor-core tile: the im2col path's
// tensor-core GEMM, run for run.
//
// The block of both (DwLoader): its BM x BN tile at (row0, col0) of the (A, C·K) result and
// block z's run of the depth N·L, p in [kb, ke) = [z·kc, min((z + 1)·kc, N·L)), written at
// out + z·A·C·K (`run_out`); and its loaders: every element a thread stages has the same slice
// row pp = threadIdx.x % 16, so (n, o) and the window origin o·stride − padding are decomposed
// once a slice; its L rows a = row0 + e0 + 16·l of g' and L columns q = col0 + e0 + 16·l of
// the weight side (e0 = threadIdx.x / 16) are fixed, so the columns' (c, kernel offsets) are
// decomposed once.
template <int R, int L>
struct DwLoader {
    static constexpr int RK = R ? R : 8;
    const Geo& g;
    const float* gr;
    const float* x;
    u32 channels, kl, sl, bl, m, n, row0, col0, kb, ke, pp, e0;
    int rank;
    u32 qc[L];      // the channel c of each staged column, or `channels` past C·K
    u32 qk[L][RK];  // its kernel offsets per axis
    __device__ DwLoader(const Geo& g_, const float* gr_, const float* x_, u32 batch, u32 channels_,
                        u32 kl_, u32 sl_, u32 bl_, u32 m_, u32 kc, u32 bm, u32 bn)
        : g(g_), gr(gr_), x(x_), channels(channels_), kl(kl_), sl(sl_), bl(bl_), m(m_),
          n(channels_ * kl_), row0(blockIdx.y * bm), col0(blockIdx.x * bn),
          pp(threadIdx.x % 16), e0(threadIdx.x / 16), rank(R ? R : (int)g_.rank) {
        const u32 depth = batch * sl;
        kb = blockIdx.z * kc;
        ke = depth - kb < kc ? depth : kb + kc;
        for (int l = 0; l < L; ++l) {
            const u32 q = col0 + e0 + 16u * l;
            qc[l] = q < n ? q / kl : channels;
            u32 kk = q < n ? q % kl : 0;
            for (int i = rank - 1; i >= 0; --i) {
                qk[l][i] = (u32)(kk % g.kernel.d[i]);
                kk /= g.kernel.d[i];
            }
        }
    }
    // The slice from p0: ra[l] = g'[row l, p0 + pp], rb[l] = im2col(x)ᵀ[p0 + pp, column l],
    // zeros outside the matrices and past the run's end ke.
    __device__ void fetch(u32 p0, float (&ra)[L], float (&rb)[L]) const {
        const int rk = R ? R : rank;  // a constant where the rank is compiled in
        const u32 gp = p0 + pp;
        const bool in = gp < ke;
        const u32 nb = in ? gp / sl : 0;
        u32 o = in ? gp % sl : 0;
        long long org[RK];  // per axis: the big position of window cell 0 of small cell o
        for (int i = rk - 1; i >= 0; --i) {
            org[i] = (long long)(o % g.small.d[i]) * (long long)g.stride.d[i] -
                     (long long)g.padding.d[i];
            o /= g.small.d[i];
        }
        const u32 oo = in ? gp % sl : 0;
        for (int l = 0; l < L; ++l) {
            const u32 gi = row0 + e0 + 16u * l;
            ra[l] = in && gi < m ? gr[((u64)nb * m + gi) * sl + oo] : 0.0f;
        }
        const float* xn = x + (u64)nb * channels * bl;
        for (int l = 0; l < L; ++l) {
            float v = 0.0f;
            if (in && qc[l] < channels) {
                u64 flat = 0, st = 1;
                bool pad = false;
                for (int i = rk - 1; i >= 0; --i) {
                    const long long pos = org[i] + (long long)qk[l][i];
                    if (pos < 0 || pos >= (long long)g.big.d[i]) pad = true;
                    flat += (u64)pos * st;
                    st *= g.big.d[i];
                }
                if (!pad) v = xn[(u64)qc[l] * bl + flat];
            }
            rb[l] = v;
        }
    }
    // The block's run matrix in the output.
    __device__ float* run_out(float* out) const { return out + (u64)blockIdx.z * m * n; }
};

template <int R>
__device__ void tiles_dw(float (*As)[BK][BM + 4], float (*Bs)[BK][BN + 4], const float* gr,
                         const float* x, float* out, const Geo& g, u32 batch, u32 channels,
                         u32 kl, u32 sl, u32 bl, u32 m, u32 kc) {
    static_assert(LA == LB && 256 / BK == 16, "one row and column set for both operands");
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const DwLoader<R, LA> ld(g, gr, x, batch, channels, kl, sl, bl, m, kc, BM, BN);
    const u32 row0 = ld.row0, col0 = ld.col0, n = ld.n;
    out = ld.run_out(out);
    float ra[LA], rb[LB];
    auto fetch = [&](u32 p0) { ld.fetch(p0, ra, rb); };
    auto stage = [&](int buf) {
        for (int l = 0; l < LA; ++l) As[buf][ld.pp][ld.e0 + 16 * l] = ra[l];
        for (int l = 0; l < LB; ++l) Bs[buf][ld.pp][ld.e0 + 16 * l] = rb[l];
    };
    float acc[TM][TN];
    tile_run(As, Bs, ld.kb, ld.ke, fetch, stage, acc);
    for (int i = 0; i < TM; ++i) {
        const u32 gi = row0 + reg_pos(ty, i);
        if (gi >= m) continue;
        for (int j = 0; j < TN; ++j) {
            const u32 gj = col0 + reg_pos(tx, j);
            if (gj < n) out[(u64)gi * n + gj] = acc[i][j];
        }
    }
}

// The weight cotangent on the tensor-core tile (autocast; `P` the operands' precision, each
// rounded as it is staged): block z's run of kc (tl_gemm_tc's split), 128 x 128 outputs.
template <int R, class P>
__device__ void tiles_dw_tc(unsigned char* smem, const float* gr, const float* x, float* out,
                            const Geo& g, u32 batch, u32 channels, u32 kl, u32 sl, u32 bl, u32 m,
                            u32 kc) {
    constexpr int TL = tc::BM * tc::BK / tc::THREADS;
    static_assert(TL == tc::BN * tc::BK / tc::THREADS && tc::THREADS / tc::BK == 16,
                  "one row and column set for both operands");
    const DwLoader<R, TL> ld(g, gr, x, batch, channels, kl, sl, bl, m, kc, tc::BM, tc::BN);
    out = ld.run_out(out);
    float ra[TL], rb[TL];
    auto fetch = [&](u32 p0) { ld.fetch(p0, ra, rb); };
    auto stage = [&](typename P::T* as, typename P::T* bs, int lda, int ldb) {
        for (int l = 0; l < TL; ++l) {
            as[(ld.e0 + 16 * l) * lda + ld.pp] = P::cvt(ra[l]);
            bs[ld.pp * ldb + ld.e0 + 16 * l] = P::cvt(rb[l]);
        }
    };
    auto put = [&](u32 r, u32 c, float v) {
        const u32 gi = ld.row0 + r, gj = ld.col0 + c;
        if (gi < m && gj < ld.n) out[(u64)gi * ld.n + gj] = v;
    };
    tc::block<P>(smem, ld.kb, ld.ke, fetch, stage, put);
}

// f(Rank<R>(), As, Bs) with the block's shared buffers, R the spatial rank where it is 1, 2 or
// 3 (an instance compiled per rank), else 0 (any rank <= 8). One set of shared buffers for
// every rank's instance (each declaring its own would add up).
template <int R>
struct Rank {
    static constexpr int value = R;
};
template <typename F>
__device__ __forceinline__ void by_rank(u32 rank, F&& f) {
    __shared__ __align__(16) float As[2][BK][BM + 4];
    __shared__ __align__(16) float Bs[2][BK][BN + 4];
    switch (rank) {
        case 1:
            f(Rank<1>(), As, Bs);
            break;
        case 2:
            f(Rank<2>(), As, Bs);
            break;
        case 3:
            f(Rank<3>(), As, Bs);
            break;
        default:
            f(Rank<0>(), As, Bs);
    }
}

// f(Rank<R>(), P(), smem) for the spatial rank (as by_rank), the tensor-core precision `prec`
// (1 bf16, 2 TF32: tl_gemm_tc's codes) and the block's tile memory (tc::SMEM_BYTES).
template <typename F>
__device__ __forceinline__ void tc_by_rank(u32 rank, u32 prec, F&& f) {
    __shared__ __align__(32) unsigned char smem[tc::SMEM_BYTES];
    auto at = [&](auto r) {
        if (prec == 2)
            f(r, tc::Tf32(), smem);
        else
            f(r, tc::Bf16(), smem);
    };
    switch (rank) {
        case 1:
            at(Rank<1>());
            break;
        case 2:
            at(Rank<2>());
            break;
        case 3:
            at(Rank<3>());
            break;
        default:
            at(Rank<0>());
    }
}

}  // namespace igemm

// Grid (⌈N·L/64⌉, ⌈A/64⌉), 256 threads; m = A, the weight (A, C, kernel...) row-major.
extern "C" __global__ void __launch_bounds__(256)
    tl_conv_implicit(const float* w, const float* x, float* y, TL_GEO_PARAMS, u32 m) {
    TL_GEO;
    igemm::by_rank(rank, [&](auto r, auto As, auto Bs) {
        igemm::tiles<decltype(r)::value>(As, Bs, w, x, y, g, batch, channels, kl, sl, bl, m);
    });
}

// The tensor-core forward (autocast; igemm::tiles_tc): grid (⌈N·L/128⌉, ⌈A/128⌉), 256 threads,
// one block an SM (two would hold it to 128 registers, where ptxas spills the loaders' state);
// `prec` 1 bf16, 2 TF32 (tl_gemm_tc's codes).
extern "C" __global__ void __launch_bounds__(256, 1)
    tl_conv_implicit_tc(const float* w, const float* x, float* y, TL_GEO_PARAMS, u32 m,
                        u32 prec) {
    TL_GEO;
    igemm::tc_by_rank(rank, prec, [&](auto r, auto p, unsigned char* smem) {
        igemm::tiles_tc<decltype(r)::value, decltype(p)>(smem, w, x, y, g, batch, channels, kl,
                                                          sl, bl, m);
    });
}

// Grid (⌈N·big/64⌉, ⌈C/64⌉), 256 threads; `depth` = A, the cotangent g (N, A, small).
extern "C" __global__ void __launch_bounds__(256)
    tl_conv_implicit_dx(const float* w, const float* gr, float* dx, TL_GEO_PARAMS, u32 depth) {
    TL_GEO;
    igemm::by_rank(rank, [&](auto r, auto As, auto Bs) {
        igemm::tiles_dx<decltype(r)::value>(As, Bs, w, gr, dx, g, batch, channels, kl, sl, bl,
                                            depth);
    });
}

// Grid (⌈C·K/64⌉, ⌈A/64⌉, runs), 256 threads; `m` = A, the cotangent g (N, A, small), `kc` the
// run of N·L a block sums (Gemm::k_chunk), run z's (A, C·K) tile written at out + z·A·C·K.
extern "C" __global__ void __launch_bounds__(256)
    tl_conv_implicit_dw(const float* gr, const float* x, float* out, TL_GEO_PARAMS, u32 m,
                        u32 kc) {
    TL_GEO;
    igemm::by_rank(rank, [&](auto r, auto As, auto Bs) {
        igemm::tiles_dw<decltype(r)::value>(As, Bs, gr, x, out, g, batch, channels, kl, sl, bl, m,
                                            kc);
    });
}

// The tensor-core input cotangent (autocast; igemm::tiles_dx_tc): grid (⌈N·big/128⌉,
// ⌈C/128⌉), 256 threads, one block an SM (its accumulators and fragments take the registers);
// `depth` = A, `prec` as tl_conv_implicit_tc's.
extern "C" __global__ void __launch_bounds__(256, 1)
    tl_conv_implicit_dx_tc(const float* w, const float* gr, float* dx, TL_GEO_PARAMS, u32 depth,
                           u32 prec) {
    TL_GEO;
    igemm::tc_by_rank(rank, prec, [&](auto r, auto p, unsigned char* smem) {
        igemm::tiles_dx_tc<decltype(r)::value, decltype(p)>(smem, w, gr, dx, g, batch, channels,
                                                             kl, sl, bl, depth);
    });
}

// The tensor-core weight cotangent (autocast; igemm::tiles_dw_tc): grid (⌈C·K/128⌉, ⌈A/128⌉,
// runs), 256 threads, one block an SM (as tl_conv_implicit_tc); `kc` the run of N·L a block
// sums (Gemm::k_chunk_tiled over 128 x 128 tiles), `prec` as tl_conv_implicit_tc's.
extern "C" __global__ void __launch_bounds__(256, 1)
    tl_conv_implicit_dw_tc(const float* gr, const float* x, float* out, TL_GEO_PARAMS, u32 m,
                           u32 kc, u32 prec) {
    TL_GEO;
    igemm::tc_by_rank(rank, prec, [&](auto r, auto p, unsigned char* smem) {
        igemm::tiles_dw_tc<decltype(r)::value, decltype(p)>(smem, gr, x, out, g, batch, channels,
                                                             kl, sl, bl, m, kc);
    });
}
