// Attention family: the fused ("flash") attention core, forward and backward (sim:
// crates/tl-tape-cuda/src/device/sim/flash.rs; layout and checks: device/flash.rs).
//
// Q, K, V, O and their cotangents are head-merged (B, n, H, d) buffers: element (b, i, h, c) at
// ((b * n + i) * H + h) * d + c, as the projections x.W leave them. lse (and delta) hold one
// value per (b, h, i) at (b * H + h) * n + i.
//
// One block of 256 threads = 16 x 16 per job; a job is a tile of TL_FA_T = 16 query rows of one
// (b, h) (forward, dQ) or a tile of 16 keys (dK, dV); jobs grid-stride over blockIdx.x. Thread
// (ty, tx) = (threadIdx.x / 16, threadIdx.x % 16). Head size d <= TL_FA_DMAX = 128.
//
// Order (the sim's twin; no atomics, so both reduction modes are this order):
// - a score is s = dot(q_i, k_j) * scale, the dot a fused multiply-add chain over c = 0..d-1
//   from +0; masked (or past n) keys are -inf;
// - forward, per query row, over key tiles in increasing order: the tile's max mt (fmaxf over
//   its keys in order, from -inf), m' = fmaxf(m, mt); if m' = -inf nothing changes; else
//   alpha = expf(m - m'), p_j = expf(s_j - m'), l = l * alpha + (sum of p_j in key order from
//   +0), o_c = o_c * alpha then o_c = fma(p_j, v_jc, o_c) for each key in order; m = m'. At the
//   end o_c / l and lse = m + logf(l), or 0 and -inf for a row with nothing allowed;
// - backward: delta_i = dot(dO_i, O_i) (fma chain from +0); p = expf(s - lse_i) (0 where
//   masked or lse_i = -inf), dp = dot(dO_i, v_j), ds = p * (dp - delta_i) * scale;
//   dQ_ic = fma chain over keys in increasing order of ds_ij * k_jc; dK_jc (dV_jc) = fma chain
//   over query rows in increasing order of ds_ij * q_ic (p_ij * dO_ic), every chain from +0.
// - causal masks skip the tiles that lie wholly above the diagonal (key tiles past the query
//   tile's last row; query tiles before the key tile's first key); every other tile runs.
#include "common.cuh"

#define TL_FA_T 16
#define TL_FA_DMAX 128
#define TL_FA_COLS (TL_FA_DMAX / TL_FA_T)
#define TL_FA_LD (TL_FA_DMAX + 1)

// Mask modes (device/flash.rs FlashMask::mode): bit 0 causal (key j <= query i), bit 1 a keep
// flag per key (mask[j] != 0), bit 2 a full bit matrix (row i's words at i * ceil(n / 32)).
#define TL_FA_CAUSAL 1u
#define TL_FA_KEEP 2u
#define TL_FA_BITS 4u

// The rows of the tile that starts at r0: min(16, n - r0).
__device__ __forceinline__ u32 tl_fa_len(u32 n, u32 r0) {
    return n - r0 < (u32)TL_FA_T ? n - r0 : (u32)TL_FA_T;
}

__device__ __forceinline__ u64 tl_fa_at(u32 b, u32 i, u32 h, u32 c, u32 n, u32 heads, u32 d) {
    return (((u64)b * n + i) * heads + h) * d + c;
}

__device__ __forceinline__ bool tl_fa_allowed(const u32* mask, u32 mode, u32 n, u32 i, u32 j) {
    if ((mode & TL_FA_CAUSAL) && j > i) return false;
    if ((mode & TL_FA_KEEP) && mask[j] == 0u) return false;
    if (mode & TL_FA_BITS) return ((mask[(u64)i * ((n + 31) / 32) + j / 32] >> (j % 32)) & 1u) != 0u;
    return true;
}

__device__ __forceinline__ float tl_fa_dot(const float* a, const float* b, u32 d) {
    float s = 0.0f;
    for (u32 c = 0; c < d; ++c) s = __fmaf_rn(a[c], b[c], s);
    return s;
}

// rows x d of head h from row r0 into tile[r][c] (zeros past `rows`), every thread of the block.
__device__ __forceinline__ void tl_fa_load(float (*tile)[TL_FA_LD], const float* src, u32 b, u32 r0,
                                           u32 rows, u32 h, u32 n, u32 heads, u32 d) {
    for (u32 e = threadIdx.x; e < TL_FA_T * d; e += TL_BLOCK) {
        const u32 r = e / d, c = e % d;
        tile[r][c] = r < rows ? src[tl_fa_at(b, r0 + r, h, c, n, heads, d)] : 0.0f;
    }
}

// The probability and the score cotangent of query row i (tile row r) and key j (tile row kj):
// (p, ds) with p = 0 = ds where masked or the row has nothing allowed.
__device__ __forceinline__ void tl_fa_p_ds(const float (*qs)[TL_FA_LD], const float (*gs)[TL_FA_LD],
                                           const float (*ks)[TL_FA_LD], const float (*vs)[TL_FA_LD],
                                           u32 r, u32 kj, float lse, float delta, u32 d,
                                           float scale, bool ok, float* p_out, float* ds_out) {
    float p = 0.0f, ds = 0.0f;
    if (ok && lse != -INFINITY) {
        const float s = tl_fa_dot(qs[r], ks[kj], d) * scale;
        p = expf(s - lse);
        const float dp = tl_fa_dot(gs[r], vs[kj], d);
        ds = p * (dp - delta) * scale;
    }
    *p_out = p;
    *ds_out = ds;
}

// O = softmax(Q K^T * scale) V per head (masked as `mode` says) and lse = m + log(l) per row.
extern "C" __global__ void tl_flash_fwd(const float* q, const float* k, const float* v,
                                        const u32* mask, float* o, float* lse, u32 batch, u32 n,
                                        u32 heads, u32 d, u32 mode, float scale) {
    __shared__ float qs[TL_FA_T][TL_FA_LD];
    __shared__ float ks[TL_FA_T][TL_FA_LD];
    __shared__ float vs[TL_FA_T][TL_FA_LD];
    __shared__ float ps[TL_FA_T][TL_FA_T + 1];
    __shared__ float alpha_s[TL_FA_T];
    __shared__ float m_s[TL_FA_T];
    __shared__ float l_s[TL_FA_T];
    const u32 ty = threadIdx.x / TL_FA_T, tx = threadIdx.x % TL_FA_T;
    const u32 tiles = (n + TL_FA_T - 1) / TL_FA_T;
    const u64 jobs = (u64)batch * heads * tiles;
    for (u64 job = blockIdx.x; job < jobs; job += gridDim.x) {
        const u32 bh = (u32)(job / tiles);
        const u32 b = bh / heads, h = bh % heads;
        const u32 i0 = (u32)(job % tiles) * TL_FA_T;
        const u32 rows = tl_fa_len(n, i0);
        const u32 i = i0 + ty;
        __syncthreads();  // the previous job's reads of qs, m_s, l_s are done
        tl_fa_load(qs, q, b, i0, rows, h, n, heads, d);
        if (threadIdx.x < TL_FA_T) {
            m_s[threadIdx.x] = -INFINITY;
            l_s[threadIdx.x] = 0.0f;
        }
        float acc[TL_FA_COLS];
        for (u32 u = 0; u < TL_FA_COLS; ++u) acc[u] = 0.0f;
        const u32 kend = (mode & TL_FA_CAUSAL) ? i0 + rows : n;
        for (u32 j0 = 0; j0 < kend; j0 += TL_FA_T) {
            const u32 cols = tl_fa_len(n, j0);
            __syncthreads();  // the previous tile's reads of ks, vs, ps are done
            tl_fa_load(ks, k, b, j0, cols, h, n, heads, d);
            tl_fa_load(vs, v, b, j0, cols, h, n, heads, d);
            __syncthreads();
            float s = -INFINITY;
            if (ty < rows && tx < cols && tl_fa_allowed(mask, mode, n, i, j0 + tx))
                s = tl_fa_dot(qs[ty], ks[tx], d) * scale;
            ps[ty][tx] = s;
            __syncthreads();
            if (tx == 0) {
                float mt = -INFINITY;
                for (u32 j = 0; j < cols; ++j) mt = fmaxf(mt, ps[ty][j]);
                const float m = m_s[ty];
                const float mn = fmaxf(m, mt);
                float alpha = 1.0f;
                if (mn == -INFINITY) {
                    for (u32 j = 0; j < cols; ++j) ps[ty][j] = 0.0f;
                } else {
                    alpha = expf(m - mn);
                    float sum = 0.0f;
                    for (u32 j = 0; j < cols; ++j) {
                        const float p = expf(ps[ty][j] - mn);
                        ps[ty][j] = p;
                        sum = sum + p;
                    }
                    l_s[ty] = l_s[ty] * alpha + sum;
                    m_s[ty] = mn;
                }
                alpha_s[ty] = alpha;
            }
            __syncthreads();
            const float alpha = alpha_s[ty];
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) {
                    float t = acc[u] * alpha;
                    for (u32 j = 0; j < cols; ++j) t = __fmaf_rn(ps[ty][j], vs[j][c], t);
                    acc[u] = t;
                }
            }
        }
        __syncthreads();  // m_s and l_s of the last tile are visible
        if (ty < rows) {
            const float m = m_s[ty], l = l_s[ty];
            const bool none = m == -INFINITY;
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) o[tl_fa_at(b, i, h, c, n, heads, d)] = none ? 0.0f : acc[u] / l;
            }
            if (tx == 0) lse[(u64)bh * n + i] = none ? -INFINITY : m + logf(l);
        }
    }
}

// dQ of the fused attention, and delta_i = dot(dO_i, O_i) (which tl_flash_bwd_kv reads), one
// job per tile of query rows.
extern "C" __global__ void tl_flash_bwd_q(const float* q, const float* k, const float* v,
                                          const float* o, const float* go, const float* lse,
                                          const u32* mask, float* dq, float* delta, u32 batch,
                                          u32 n, u32 heads, u32 d, u32 mode, float scale) {
    __shared__ float qs[TL_FA_T][TL_FA_LD];
    __shared__ float gs[TL_FA_T][TL_FA_LD];
    __shared__ float ks[TL_FA_T][TL_FA_LD];
    __shared__ float vs[TL_FA_T][TL_FA_LD];
    __shared__ float dss[TL_FA_T][TL_FA_T + 1];
    __shared__ float lse_s[TL_FA_T];
    __shared__ float delta_s[TL_FA_T];
    const u32 ty = threadIdx.x / TL_FA_T, tx = threadIdx.x % TL_FA_T;
    const u32 tiles = (n + TL_FA_T - 1) / TL_FA_T;
    const u64 jobs = (u64)batch * heads * tiles;
    for (u64 job = blockIdx.x; job < jobs; job += gridDim.x) {
        const u32 bh = (u32)(job / tiles);
        const u32 b = bh / heads, h = bh % heads;
        const u32 i0 = (u32)(job % tiles) * TL_FA_T;
        const u32 rows = tl_fa_len(n, i0);
        const u32 i = i0 + ty;
        __syncthreads();
        tl_fa_load(qs, q, b, i0, rows, h, n, heads, d);
        tl_fa_load(gs, go, b, i0, rows, h, n, heads, d);
        __syncthreads();
        if (threadIdx.x < rows) {
            const u32 r = threadIdx.x;
            float dl = 0.0f;
            for (u32 c = 0; c < d; ++c)
                dl = __fmaf_rn(gs[r][c], o[tl_fa_at(b, i0 + r, h, c, n, heads, d)], dl);
            delta_s[r] = dl;
            delta[(u64)bh * n + i0 + r] = dl;
            lse_s[r] = lse[(u64)bh * n + i0 + r];
        }
        float acc[TL_FA_COLS];
        for (u32 u = 0; u < TL_FA_COLS; ++u) acc[u] = 0.0f;
        const u32 kend = (mode & TL_FA_CAUSAL) ? i0 + rows : n;
        for (u32 j0 = 0; j0 < kend; j0 += TL_FA_T) {
            const u32 cols = tl_fa_len(n, j0);
            __syncthreads();
            tl_fa_load(ks, k, b, j0, cols, h, n, heads, d);
            tl_fa_load(vs, v, b, j0, cols, h, n, heads, d);
            __syncthreads();
            float p, ds;
            const bool ok = ty < rows && tx < cols && tl_fa_allowed(mask, mode, n, i, j0 + tx);
            tl_fa_p_ds(qs, gs, ks, vs, ty, tx, ok ? lse_s[ty] : 0.0f, ok ? delta_s[ty] : 0.0f, d,
                       scale, ok, &p, &ds);
            dss[ty][tx] = ds;
            __syncthreads();
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) {
                    float t = acc[u];
                    for (u32 j = 0; j < cols; ++j) t = __fmaf_rn(dss[ty][j], ks[j][c], t);
                    acc[u] = t;
                }
            }
        }
        if (ty < rows) {
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) dq[tl_fa_at(b, i, h, c, n, heads, d)] = acc[u];
            }
        }
    }
}

// dK and dV of the fused attention, one job per tile of keys (reads delta from tl_flash_bwd_q).
extern "C" __global__ void tl_flash_bwd_kv(const float* q, const float* k, const float* v,
                                           const float* go, const float* lse, const float* delta,
                                           const u32* mask, float* dk, float* dv, u32 batch,
                                           u32 n, u32 heads, u32 d, u32 mode, float scale) {
    __shared__ float qs[TL_FA_T][TL_FA_LD];
    __shared__ float gs[TL_FA_T][TL_FA_LD];
    __shared__ float ks[TL_FA_T][TL_FA_LD];
    __shared__ float vs[TL_FA_T][TL_FA_LD];
    __shared__ float ps[TL_FA_T][TL_FA_T + 1];
    __shared__ float dss[TL_FA_T][TL_FA_T + 1];
    __shared__ float lse_s[TL_FA_T];
    __shared__ float delta_s[TL_FA_T];
    const u32 ty = threadIdx.x / TL_FA_T, tx = threadIdx.x % TL_FA_T;
    const u32 tiles = (n + TL_FA_T - 1) / TL_FA_T;
    const u64 jobs = (u64)batch * heads * tiles;
    for (u64 job = blockIdx.x; job < jobs; job += gridDim.x) {
        const u32 bh = (u32)(job / tiles);
        const u32 b = bh / heads, h = bh % heads;
        const u32 j0 = (u32)(job % tiles) * TL_FA_T;
        const u32 cols = tl_fa_len(n, j0);
        __syncthreads();
        tl_fa_load(ks, k, b, j0, cols, h, n, heads, d);
        tl_fa_load(vs, v, b, j0, cols, h, n, heads, d);
        float acc_k[TL_FA_COLS], acc_v[TL_FA_COLS];
        for (u32 u = 0; u < TL_FA_COLS; ++u) acc_k[u] = acc_v[u] = 0.0f;
        const u32 istart = (mode & TL_FA_CAUSAL) ? j0 : 0u;
        for (u32 i0 = istart; i0 < n; i0 += TL_FA_T) {
            const u32 rows = tl_fa_len(n, i0);
            __syncthreads();
            tl_fa_load(qs, q, b, i0, rows, h, n, heads, d);
            tl_fa_load(gs, go, b, i0, rows, h, n, heads, d);
            if (threadIdx.x < rows) {
                lse_s[threadIdx.x] = lse[(u64)bh * n + i0 + threadIdx.x];
                delta_s[threadIdx.x] = delta[(u64)bh * n + i0 + threadIdx.x];
            }
            __syncthreads();
            // Thread (ty, tx): query row ty of the tile, key tx.
            float p, ds;
            const bool ok =
                ty < rows && tx < cols && tl_fa_allowed(mask, mode, n, i0 + ty, j0 + tx);
            tl_fa_p_ds(qs, gs, ks, vs, ty, tx, ok ? lse_s[ty] : 0.0f, ok ? delta_s[ty] : 0.0f, d,
                       scale, ok, &p, &ds);
            ps[ty][tx] = p;
            dss[ty][tx] = ds;
            __syncthreads();
            // Thread (ty, tx): key ty of the tile, columns tx, tx + 16, ...
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) {
                    float tk = acc_k[u], tv = acc_v[u];
                    for (u32 r = 0; r < rows; ++r) {
                        tk = __fmaf_rn(dss[r][ty], qs[r][c], tk);
                        tv = __fmaf_rn(ps[r][ty], gs[r][c], tv);
                    }
                    acc_k[u] = tk;
                    acc_v[u] = tv;
                }
            }
        }
        if (ty < cols) {
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) {
                    const u64 at = tl_fa_at(b, j0 + ty, h, c, n, heads, d);
                    dk[at] = acc_k[u];
                    dv[at] = acc_v[u];
                }
            }
        }
    }
}
