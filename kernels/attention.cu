// Attention family: the fused ("flash") attention core, forward and backward (sim:
// crates/tl-tape-cuda/src/device/sim/flash.rs; layout and checks: device/flash.rs).
//
// nq query rows attend to nk keys (nq != nk allowed: cross-attention, a KV cache). Q, O and
// their cotangents dO, dQ are head-merged (B, nq, H, d) buffers: element (b, i, h, c) at
// ((b * nq + i) * H + h) * d + c, as the projections x.W leave them; K, V, dK, dV are
// (B, nk, Hk, d) with Hk = kv_heads dividing H, key j of key head g at
// ((b * nk + j) * Hk + g) * d + c: query head h reads key head g = h / (H / Hk) (grouped-query
// attention; Hk = H: a key head per query head). lse (and delta) hold one value per query row
// (b, h, i) at (b * H + h) * nq + i. Every kernel takes (batch, nq, nk, heads, kv_heads, d,
// mode, offset, mstride, scale) last; `offset` (a signed int) places the causal diagonal: query
// i sees keys j <= i + offset (0: the usual causal; nk - nq: the last query row sees every key,
// the KV-cache case; negative: the first rows see nothing). The mask's words (`mask`, as `mode`
// says) of batch element b start at mask + b * mstride: mstride = 0 when one mask is shared by
// every batch element, else the words of one element (nk keep flags, or nq * ceil(nk / 32)
// bits), a per-sequence mask (PyTorch's attn_mask (B, 1, L, S), key_padding_mask (B, S)). The
// causal diagonal is the same for every batch element. A job's (b, h) reads element b's words
// only (mk, set per job): no sum's order depends on mstride.
//
// Blocks of 256 threads; a job is a block of query rows of one (b, h) (forward: 64 rows when
// d <= 64, else 32; dQ: 64) or of keys of one (b, g), g a key head (dK, dV: 64; the job runs
// the query heads of g's group in increasing order), with register micro-tiles (tl_fa_fwd,
// tl_fa_bwd_q64, tl_fa_bwd_kv64 say how); for d > 64 the backward takes one job per tile of
// TL_FA_T = 16 rows (keys), 16 x 16 threads (tl_fa_bwd_q16, tl_fa_bwd_kv16). Jobs grid-stride
// over blockIdx.x. Head size d <= TL_FA_DMAX = 128. The order below is per tile of 16 query
// rows and 16 keys: rows (keys) are independent, so a block of 64 changes no result, and a
// thread's many fma chains each run in the order written.
//
// Order (the sim's twin; no atomics: the forward, and the backward in both reduction modes
// except where the one-pass backward at the end of this file runs, whose dQ adds per key block):
// - a score is s = dot(q_i, k_j) * scale, the dot a fused multiply-add chain over c = 0..d-1
//   from +0; masked (or past nk) keys are -inf;
// - forward, per query row, over key tiles in increasing order: the tile's max mt (fmaxf over
//   its keys in order, from -inf), m' = fmaxf(m, mt); if m' = -inf nothing changes; else
//   alpha = expf(m - m'), p_j = expf(s_j - m'), l = l * alpha + (sum of p_j in key order from
//   +0), o_c = o_c * alpha then o_c = fma(p_j, v_jc, o_c) for each key in order; m = m'. At the
//   end o_c / l and lse = m + logf(l), or 0 and -inf for a row with nothing allowed;
// - backward: delta_i = dot(dO_i, O_i) (fma chain from +0); p = expf(s - lse_i) (0 where
//   masked or lse_i = -inf), dp = dot(dO_i, v_j), ds = p * (dp - delta_i) * scale;
//   dQ_ic = fma chain over keys in increasing order of ds_ij * k_jc; dK_jc (dV_jc) = fma chain
//   over query rows in increasing order of ds_ij * q_ic (p_ij * dO_ic), every chain from +0;
//   for a key head of several query heads, one chain over the heads of its group in increasing
//   order, each head's query rows in increasing order.
// - causal masks skip exactly the tiles that hold no allowed entry: the query tile [i0, i0 +
//   rows) and the key tile from j0 meet when j0 < i0 + rows + offset. So a query tile runs the
//   keys j < min(nk, max(0, i0 + rows + offset)) (tl_fa_kend) and a key tile the query tiles
//   from the one holding row max(0, j0 - offset) (tl_fa_qstart; none when that is >= nq).
//
// Autocast (mode bits TL_FA_BF16 / TL_FA_TF32; device/flash.rs FlashRound; docs/semantics.md,
// "Mixed precision"): the caller hands the kernels Q, K, V (and dO) already rounded, and the
// kernels round the probabilities and the score cotangents as the products that read them do:
// - TL_FA_STATS (a first pass whose O nobody reads: the forward of a node that needs no
//   backward): the plain forward's m, l and lse, in its order, with no P.V products; O is
//   not written.
// - TL_FA_OUT (the forward's second pass, after a plain forward on the same operands wrote
//   lse): p = round(expf(s - lse_i)) (0 where masked or lse_i = -inf), o_c = fma chain of
//   p_j * v_jc over the keys in order from +0 (alpha = 1: no rescaling, no division); lse is
//   read, not written. So O = round(A) V with A the normalized probabilities, as the composed
//   path's A.V product reads them.
// - backward: ds = round(p * (dp - delta_i) * scale) (from the unrounded p) before dQ and dK
//   read it, and dV reads round(p); delta_i = dot(dO_i, O_i) with O the output of the
//   UNROUNDED probabilities (the first pass's), so delta_i is sum_j p_ij dp_ij up to f32
//   reassociation, as the softmax VJP of the composed path computes it from its f32 A.
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"

#define TL_FA_T 16
#define TL_FA_DMAX 128
#define TL_FA_COLS (TL_FA_DMAX / TL_FA_T)
#define TL_FA_LD (TL_FA_DMAX + 1)

// Mask modes (device/flash.rs FlashMask::mode): bit 0 causal (key j <= query i + offset), bit 1
// a keep flag per key (mask[j] != 0, nk words), bit 2 a full bit matrix (nq rows, row i's words
// at i * ceil(nk / 32)); the words of one batch element, from mask + b * mstride.
#define TL_FA_CAUSAL 1u
#define TL_FA_KEEP 2u
#define TL_FA_BITS 4u
// Autocast bits (the header): round p and dS to bf16 (nearest, ties to even) or to TF32
// (nearest, ties away), and the forward's second pass (O = round(A) V from a given lse).
#define TL_FA_BF16 8u
#define TL_FA_TF32 16u
#define TL_FA_OUT 32u
#define TL_FA_STATS 64u

// x as a product reads it under `mode`'s autocast bits (tl_spec::precision::Precision::round).
__device__ __forceinline__ float tl_fa_round(float x, u32 mode) {
    if (mode & TL_FA_BF16) return __bfloat162float(__float2bfloat16(x));
    if (mode & TL_FA_TF32) return nvcuda::wmma::__float_to_tf32(x);
    return x;
}

// The rows of the tile that starts at r0: min(16, n - r0) (0 from n on).
__device__ __forceinline__ u32 tl_fa_len(u32 n, u32 r0) {
    return n - r0 < (u32)TL_FA_T ? n - r0 : (u32)TL_FA_T;
}

// Job `job` of a kernel's grid-stride loop over (b, h, block of R rows of n): n = nq for the
// launches over query rows (heads = H), nk for those over keys (heads = kv_heads: h is a key
// head); tiles = ⌈n / R⌉ blocks per head, bh = b·heads + h = job / tiles, and the block's first row r0 and row count
// len = min(R, n - r0). The block is job % tiles, or counted from the last with `last_first`
// (under a causal mask the longest query blocks first).
struct TlFaJob {
    u32 bh, b, h, r0, len;
};
__device__ __forceinline__ u32 tl_fa_tiles(u32 n, u32 R) { return (n + R - 1) / R; }
__device__ __forceinline__ TlFaJob tl_fa_job(u64 job, u32 tiles, u32 R, u32 n, u32 heads,
                                             bool last_first) {
    TlFaJob j;
    j.bh = (u32)(job / tiles);
    j.b = j.bh / heads;
    j.h = j.bh % heads;
    const u32 t = (u32)(job % tiles);
    j.r0 = (last_first ? tiles - 1 - t : t) * R;
    j.len = n - j.r0 < R ? n - j.r0 : R;
    return j;
}

// Element (b, i, h, c) of a head-merged buffer of n rows a sample (nq: Q, O, dO, dQ; nk: K, V,
// dK, dV).
__device__ __forceinline__ u64 tl_fa_at(u32 b, u32 i, u32 h, u32 c, u32 n, u32 heads, u32 d) {
    return (((u64)b * n + i) * heads + h) * d + c;
}

// The key (and value) head that query head h reads: h / (heads / kv_heads) (FlashDims::kv_head).
__device__ __forceinline__ u32 tl_fa_kv_head(u32 h, u32 heads, u32 kv_heads) {
    return h / (heads / kv_heads);
}

// Whether query i may attend to key j of nk (device/flash.rs FlashMask::allowed), `mask` the
// words of the query's batch element (mask + b * mstride).
__device__ __forceinline__ bool tl_fa_allowed(const u32* mask, u32 mode, int offset, u32 nk,
                                              u32 i, u32 j) {
    if ((mode & TL_FA_CAUSAL) && (long long)j > (long long)i + offset) return false;
    if ((mode & TL_FA_KEEP) && mask[j] == 0u) return false;
    if (mode & TL_FA_BITS) return ((mask[(u64)i * ((nk + 31) / 32) + j / 32] >> (j % 32)) & 1u) != 0u;
    return true;
}

// The keys that query rows before `qend` can be allowed under `mode`'s causal part:
// j < min(nk, max(0, qend + offset)); nk when not causal (FlashMask::key_end).
__device__ __forceinline__ u32 tl_fa_kend(u32 mode, int offset, u32 qend, u32 nk) {
    if (!(mode & TL_FA_CAUSAL)) return nk;
    const long long e = (long long)qend + offset;
    return e <= 0 ? 0u : e < (long long)nk ? (u32)e : nk;
}

// The first query tile (of TL_FA_T rows) that keys from j0 on can be allowed in: the one holding
// row max(0, j0 - offset), nq when that is past the last row; 0 when not causal
// (FlashMask::query_start).
__device__ __forceinline__ u32 tl_fa_qstart(u32 mode, int offset, u32 j0, u32 nq) {
    if (!(mode & TL_FA_CAUSAL)) return 0u;
    const long long s = (long long)j0 - offset;
    return s <= 0 ? 0u : s >= (long long)nq ? nq : (u32)s / TL_FA_T * TL_FA_T;
}

// Whether the key tile from js holds a key that query rows before `qend` can be allowed (under
// `mode`'s causal part): js < qend + offset.
__device__ __forceinline__ bool tl_fa_meet(u32 mode, int offset, u32 qend, u32 js) {
    return !(mode & TL_FA_CAUSAL) || (long long)js < (long long)qend + offset;
}

__device__ __forceinline__ float tl_fa_dot(const float* a, const float* b, u32 d) {
    float s = 0.0f;
    for (u32 c = 0; c < d; ++c) s = __fmaf_rn(a[c], b[c], s);
    return s;
}

// rows x d of head h from row r0 of `src` (n rows a sample) into tile[r][c] (zeros past
// `rows`), every thread of the block.
__device__ __forceinline__ void tl_fa_load(float (*tile)[TL_FA_LD], const float* src, u32 b, u32 r0,
                                           u32 rows, u32 h, u32 n, u32 heads, u32 d) {
    for (u32 e = threadIdx.x; e < TL_FA_T * d; e += TL_BLOCK) {
        const u32 r = e / d, c = e % d;
        tile[r][c] = r < rows ? src[tl_fa_at(b, r0 + r, h, c, n, heads, d)] : 0.0f;
    }
}

// The probability and the score cotangent of query row i (tile row r) and key j (tile row kj):
// (p, ds) with p = 0 = ds where masked or the row has nothing allowed, each rounded as `mode`
// says (autocast; ds from the unrounded p).
__device__ __forceinline__ void tl_fa_p_ds(const float (*qs)[TL_FA_LD], const float (*gs)[TL_FA_LD],
                                           const float (*ks)[TL_FA_LD], const float (*vs)[TL_FA_LD],
                                           u32 r, u32 kj, float lse, float delta, u32 d,
                                           float scale, bool ok, u32 mode, float* p_out,
                                           float* ds_out) {
    float p = 0.0f, ds = 0.0f;
    if (ok && lse != -INFINITY) {
        const float s = tl_fa_dot(qs[r], ks[kj], d) * scale;
        p = expf(s - lse);
        const float dp = tl_fa_dot(gs[r], vs[kj], d);
        ds = p * (dp - delta) * scale;
    }
    *p_out = tl_fa_round(p, mode);
    *ds_out = tl_fa_round(ds, mode);
}

// ---- Forward: register micro-tiles -----------------------------------------------------------
//
// A job is a block of BM query rows of one (b, h): BM = 64 when d <= 64, else 32 (shared
// memory holds the block's Q transposed, BM x DM with DM = 64 or 128). The key loop takes BN
// keys (BN / 16 tiles of 16) per step: TL_FA_BN = 32 (tl_flash_fwd, static shared memory) or
// 64 (tl_flash_fwd_wide, d <= 64, dynamic shared memory: FlashTiles::Wide):
// 1. K^T into shared memory; each thread scores 4 rows x BN·BM/1024 keys (one fma chain over
//    c per score, all of them in flight at once), Q read 4 rows at a time;
// 2. the scores into pt (key-major); V replaces K; thread (r, t) of the first BN/16 · BM takes
//    row r's key tile t: its max, then (with the maxima of the tiles before it, fmaxf being
//    order-free) m', alpha and the p_j in place, their sum in key order;
// 3. thread (ry, cx) holds the outputs of rows 4 ry..4 ry+3, columns 4 cx..4 cx+3 and applies
//    the step's tiles in order (o * alpha, then one fma per key in order); the thread with
//    cx = 0 also keeps m and l of its rows, l = l * alpha + sum per tile.
// Per row every tile of 16 keys is the same operations in the same order whatever BN is: the
// two tilings give the same bits.
// Shared rows are XOR-swizzled (multiples of 4, so four-float loads stay whole) so that the
// transposing stores do not all land in one bank.
#define TL_FA_BN 32

// Unroll a loop over c by 8 on the GPU (with d known, each copy's swizzle is a constant).
#ifdef __CUDA_ARCH__
#define TL_FA_UNROLL8 _Pragma("unroll 8")
#define TL_FA_UNROLL2 _Pragma("unroll 2")
#define TL_FA_UNROLL1 _Pragma("unroll 1")
#define TL_FA_UNROLL _Pragma("unroll")
#else
#define TL_FA_UNROLL
#define TL_FA_UNROLL1
#define TL_FA_UNROLL8
#define TL_FA_UNROLL2
#endif

// The XOR of a transposed row: (x % 8) * 4, in 0..28.
__device__ __forceinline__ u32 tl_fa_swz(u32 x) { return (x & 7u) << 2; }

// Whether tile t (keys j0 + 16 t ..) of a step runs for query row i: it has keys, and a causal
// mask skips the key tiles that the 16-row query tile holding i does not meet (tl_fa_meet),
// as the tiles of the order do.
__device__ __forceinline__ bool tl_fa_runs(u32 mode, int offset, u32 nq, u32 j0, u32 t, u32 keys,
                                           u32 i) {
    const u32 qs = i / TL_FA_T * TL_FA_T, qend = qs + TL_FA_T < nq ? qs + TL_FA_T : nq;
    return t * TL_FA_T < keys && tl_fa_meet(mode, offset, qend, j0 + t * TL_FA_T);
}

// Rows [r0, r0 + rows) of head (b, h) of `src` (n rows a sample; R rows of DM floats, 0 past
// `rows` or d) into
// registers: reg[u] is element e = threadIdx.x + 256 u, row e / DM, column e % DM. Loaded a
// phase before they go to shared memory, so that the loads fly while the block computes.
template <u32 R, u32 DM>
__device__ __forceinline__ void tl_fa_stage(float* reg, const float* src, u32 b, u32 r0,
                                            u32 rows, u32 h, u32 n, u32 heads, u32 d) {
    for (u32 u = 0; u < R * DM / TL_BLOCK; ++u) {
        const u32 e = threadIdx.x + TL_BLOCK * u, r = e / DM, c = e % DM;
        reg[u] = r < rows && c < d ? src[tl_fa_at(b, r0 + r, h, c, n, heads, d)] : 0.0f;
    }
}

// Rows [r0, r0 + rows) of head (b, h) of `x` and of `y` (n rows a sample; R rows of DM floats, zeros past
// `rows`; columns from d on left as they are) into the swizzled shared rows
// xs[r * DM + (c ^ swz(r))] and ys (the same way), every thread of the block.
template <u32 R, u32 DM>
__device__ __forceinline__ void tl_fa_load_swz2(float* xs, float* ys, const float* x,
                                                const float* y, u32 b, u32 r0, u32 rows, u32 h,
                                                u32 n, u32 heads, u32 d) {
    for (u32 e = threadIdx.x; e < R * DM; e += TL_BLOCK) {
        const u32 r = e / DM, c = e % DM;
        if (c >= d) continue;
        const bool in = r < rows;
        const u64 at = tl_fa_at(b, r0 + (in ? r : 0u), h, c, n, heads, d);
        xs[r * DM + (c ^ tl_fa_swz(r))] = in ? x[at] : 0.0f;
        ys[r * DM + (c ^ tl_fa_swz(r))] = in ? y[at] : 0.0f;
    }
}

// Shared floats of the forward for (BM, BN, DM): qt, kv, pt, three (tile, row) arrays, m and
// l. (device/cuda/flash.rs: FWD_WIDE_SMEM_BYTES is this for (64, 64, 64), in bytes.)
#define TL_FA_FWD_SMEM(BM, BN, DM) \
    ((BM) * (DM) + (BN) * (DM) + (BN) * (BM) + 3 * ((BN) / TL_FA_T) * (BM) + 2 * (BM))

// DC: the head size when known at compile time (64: the loops over c unroll, their shared
// addresses constant), else 0 and d at run time.
template <u32 BM, u32 BN, u32 DM, u32 DC>
__device__ __forceinline__ void tl_fa_fwd(const float* q, const float* k, const float* v,
                                          const u32* mask, float* o, float* lse, u32 batch,
                                          u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d_run, u32 mode,
                                          int offset, u32 mstride, float scale, float* smem) {
    const u32 d = DC ? DC : d_run;
    constexpr u32 NT = BN / TL_FA_T;  // key tiles a step
    static_assert(BN % TL_FA_T == 0 && NT * BM <= TL_BLOCK, "a thread per (row, tile)");
    constexpr u32 SX = 1024 / BM;  // score phase: threads across the keys of a step
    constexpr u32 SK = BN / SX;    // keys per thread there
    constexpr u32 CG = DM / 4;     // output phase: groups of 4 columns
    float* qt = smem;              // qt[c * BM + (r ^ swz(c))]
    float* kv = qt + BM * DM;      // K^T: kv[c * BN + (j ^ (c % 32))]; V: kv[j * DM + c]
    float* pt = kv + BN * DM;      // pt[j * BM + (r ^ swz(j))]: scores, then p
    float* mts = pt + BN * BM;     // [t * BM + r]: tile max
    float* als = mts + NT * BM;    // alpha
    float* sms = als + NT * BM;    // sum of p
    float* ms = sms + NT * BM;     // m of each row before the step
    float* ls = ms + BM;           // l at the end
    const u32 tid = threadIdx.x;
    const u32 sy = tid / SX, sx = tid % SX;
    const u32 ry = tid / CG, cx = tid % CG;
    const u32 tiles = tl_fa_tiles(nq, BM);
    for (u64 job = blockIdx.x; job < (u64)batch * heads * tiles; job += gridDim.x) {
        const auto [bh, b, h, i0, rows] = tl_fa_job(job, tiles, BM, nq, heads, true);
        const u32 g = tl_fa_kv_head(h, heads, kv_heads);  // the key head h reads
        const u32* mk = mask + (u64)b * mstride;  // batch element b's words
        __syncthreads();  // the previous job's reads of qt, ms, ls are done
        for (u32 e = tid; e < BM * DM; e += TL_BLOCK) {
            const u32 r = e / DM, c = e % DM;
            if (c >= d) continue;
            qt[c * BM + (r ^ tl_fa_swz(c))] =
                r < rows ? q[tl_fa_at(b, i0 + r, h, c, nq, heads, d)] : 0.0f;
        }
        if (tid < BM) ms[tid] = -INFINITY;
        float acc[4][4], mr[4], lr[4];
        for (u32 a = 0; a < 4; ++a) {
            mr[a] = -INFINITY;
            lr[a] = 0.0f;
            for (u32 e = 0; e < 4; ++e) acc[a][e] = 0.0f;
        }
        const u32 kend = tl_fa_kend(mode, offset, i0 + rows, nk);
        constexpr u32 NL = BN * DM / TL_BLOCK;  // staged floats a thread
        float kreg[NL], vreg[NL];
        tl_fa_stage<BN, DM>(kreg, k, b, 0, nk < BN ? nk : BN, g, nk, kv_heads, d);
        for (u32 j0 = 0; j0 < kend; j0 += BN) {
            const u32 keys = nk - j0 < BN ? nk - j0 : BN;
            __syncthreads();  // the previous step's reads of kv and pt are done
            for (u32 u = 0; u < NL; ++u) {
                const u32 e = tid + TL_BLOCK * u, j = e / DM, c = e % DM;
                kv[c * BN + (j ^ (c & 31u))] = kreg[u];
            }
            tl_fa_stage<BN, DM>(vreg, v, b, j0, keys, g, nk, kv_heads, d);
            __syncthreads();
            // 1. Scores: rows 4 sy + a, keys sx + SX bb.
            float s[4][SK];
            for (u32 a = 0; a < 4; ++a)
                for (u32 bb = 0; bb < SK; ++bb) s[a][bb] = 0.0f;
            TL_FA_UNROLL8
            for (u32 c = 0; c < d; ++c) {
                float qr[4];
                ld4(&qt[c * BM + ((sy * 4) ^ tl_fa_swz(c))], qr);
                for (u32 bb = 0; bb < SK; ++bb) {
                    const float kk = kv[c * BN + ((sx + SX * bb) ^ (c & 31u))];
                    for (u32 a = 0; a < 4; ++a) s[a][bb] = __fmaf_rn(qr[a], kk, s[a][bb]);
                }
            }
            for (u32 a = 0; a < 4; ++a) {
                const u32 r = sy * 4 + a;
                for (u32 bb = 0; bb < SK; ++bb) {
                    const u32 j = sx + SX * bb;
                    const bool ok = r < rows && j < keys &&
                                    tl_fa_allowed(mk, mode, offset, nk, i0 + r, j0 + j);
                    pt[j * BM + (r ^ tl_fa_swz(j))] = ok ? s[a][bb] * scale : -INFINITY;
                }
            }
            __syncthreads();  // the scores are in pt; the reads of K are done
            // 2. V in place of K; each (row, tile) its max.
            for (u32 u = 0; u < NL; ++u) kv[tid + TL_BLOCK * u] = vreg[u];
            const u32 r2 = tid % BM, t2 = tid / BM;
            const bool runs2 = t2 < NT && tl_fa_runs(mode, offset, nq, j0, t2, keys, i0 + r2);
            const u32 jb = t2 * TL_FA_T, je = jb + tl_fa_len(keys, jb);
            if (t2 < NT) {
                float mt = -INFINITY;
                if (runs2 && je - jb == TL_FA_T) {  // a whole tile: every read at once
                    TL_FA_UNROLL
                    for (u32 jj = 0; jj < TL_FA_T; ++jj) {
                        const u32 j = jb + jj;
                        mt = fmaxf(mt, pt[j * BM + (r2 ^ tl_fa_swz(j))]);
                    }
                } else if (runs2) {
                    for (u32 j = jb; j < je; ++j) mt = fmaxf(mt, pt[j * BM + (r2 ^ tl_fa_swz(j))]);
                }
                mts[t2 * BM + r2] = mt;
            }
            __syncthreads();
            if (runs2) {
                float mb = ms[r2];
                for (u32 u = 0; u < t2; ++u) mb = fmaxf(mb, mts[u * BM + r2]);
                const float mn = fmaxf(mb, mts[t2 * BM + r2]);
                float alpha = 1.0f, sum = 0.0f;
                if (mn == -INFINITY) {
                    for (u32 j = jb; j < je; ++j) pt[j * BM + (r2 ^ tl_fa_swz(j))] = 0.0f;
                } else if (mode & TL_FA_OUT) {  // a row with a finite max: r2 < rows, lse finite
                    const float lr2 = lse[(u64)bh * nq + i0 + r2];
                    for (u32 j = jb; j < je; ++j) {
                        float* at = &pt[j * BM + (r2 ^ tl_fa_swz(j))];
                        *at = tl_fa_round(expf(*at - lr2), mode);
                    }
                } else {
                    alpha = expf(mb - mn);
                    if (je - jb == TL_FA_T) {  // a whole tile: the exps at once, then the sum
                        float pv[TL_FA_T];
                        TL_FA_UNROLL
                        for (u32 jj = 0; jj < TL_FA_T; ++jj) {
                            const u32 j = jb + jj;
                            pv[jj] = expf(pt[j * BM + (r2 ^ tl_fa_swz(j))] - mn);
                        }
                        TL_FA_UNROLL
                        for (u32 jj = 0; jj < TL_FA_T; ++jj) {
                            const u32 j = jb + jj;
                            pt[j * BM + (r2 ^ tl_fa_swz(j))] = pv[jj];
                            sum = sum + pv[jj];
                        }
                    } else {
                        for (u32 j = jb; j < je; ++j) {
                            float* at = &pt[j * BM + (r2 ^ tl_fa_swz(j))];
                            const float p = expf(*at - mn);
                            *at = p;
                            sum = sum + p;
                        }
                    }
                }
                als[t2 * BM + r2] = alpha;
                sms[t2 * BM + r2] = sum;
            }
            __syncthreads();
            if (j0 + BN < kend) {  // the next step's K, in flight during this one's sums
                const u32 nx = nk - (j0 + BN) < BN ? nk - (j0 + BN) : BN;
                tl_fa_stage<BN, DM>(kreg, k, b, j0 + BN, nx, g, nk, kv_heads, d);
            }
            // 3. O rows 4 ry + a, columns 4 cx + e: the step's tiles in order.
            for (u32 t = 0; t < NT; ++t) {
                if (!tl_fa_runs(mode, offset, nq, j0, t, keys, i0 + ry * 4)) break;
                float al[4];
                for (u32 a = 0; a < 4; ++a) al[a] = als[t * BM + ry * 4 + a];
                if (!(mode & TL_FA_STATS)) {
                    for (u32 a = 0; a < 4; ++a)
                        for (u32 e = 0; e < 4; ++e) acc[a][e] = acc[a][e] * al[a];
                    const u32 jb3 = t * TL_FA_T, je3 = jb3 + tl_fa_len(keys, jb3);
                    const auto key = [&](u32 j) {
                        float pr[4], vr[4];
                        ld4(&pt[j * BM + ((ry * 4) ^ tl_fa_swz(j))], pr);
                        ld4(&kv[j * DM + cx * 4], vr);
                        for (u32 a = 0; a < 4; ++a)
                            for (u32 e = 0; e < 4; ++e)
                                acc[a][e] = __fmaf_rn(pr[a], vr[e], acc[a][e]);
                    };
                    if (je3 - jb3 == TL_FA_T) {
                        TL_FA_UNROLL
                        for (u32 jj = 0; jj < TL_FA_T; ++jj) key(jb3 + jj);
                    } else {
                        for (u32 j = jb3; j < je3; ++j) key(j);
                    }
                }
                if (cx == 0) {
                    for (u32 a = 0; a < 4; ++a) {
                        const float mn = fmaxf(mr[a], mts[t * BM + ry * 4 + a]);
                        if (mn != -INFINITY) {
                            lr[a] = lr[a] * al[a] + sms[t * BM + ry * 4 + a];
                            mr[a] = mn;
                        }
                    }
                }
            }
            if (cx == 0)
                for (u32 a = 0; a < 4; ++a) ms[ry * 4 + a] = mr[a];
        }
        if (cx == 0)
            for (u32 a = 0; a < 4; ++a) ls[ry * 4 + a] = lr[a];
        __syncthreads();  // m and l of every row are visible
        for (u32 a = 0; a < 4; ++a) {
            const u32 r = ry * 4 + a;
            if (r >= rows) continue;
            const float m = ms[r], l = ls[r];
            const bool none = m == -INFINITY;
            for (u32 e = 0; e < 4; ++e) {
                const u32 c = cx * 4 + e;
                const float out = (mode & TL_FA_OUT) ? acc[a][e] : acc[a][e] / l;
                if (c < d && !(mode & TL_FA_STATS))
                    o[tl_fa_at(b, i0 + r, h, c, nq, heads, d)] = none ? 0.0f : out;
            }
            if (cx == 0 && !(mode & TL_FA_OUT))
                lse[(u64)bh * nq + i0 + r] = none ? -INFINITY : m + logf(l);
        }
    }
}

// O = softmax(Q K^T * scale) V per head (masked as `mode` says) and lse = m + log(l) per row:
// blocks of 64 query rows when d <= 64, else 32 (tl_fa_fwd), 32 keys a step.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_fwd(const float* q, const float* k, const float* v,
                                        const u32* mask, float* o, float* lse, u32 batch, u32 nq,
                                        u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                        u32 mstride, float scale) {
    constexpr u32 A = TL_FA_FWD_SMEM(64, TL_FA_BN, 64);
    constexpr u32 B = TL_FA_FWD_SMEM(32, TL_FA_BN, TL_FA_DMAX);
    __shared__ __align__(16) float smem[A > B ? A : B];
    if (d == 64)
        tl_fa_fwd<64, TL_FA_BN, 64, 64>(q, k, v, mask, o, lse, batch, nq, nk, heads, kv_heads, d, mode,
                                        offset, mstride, scale, smem);
    else if (d < 64)
        tl_fa_fwd<64, TL_FA_BN, 64, 0>(q, k, v, mask, o, lse, batch, nq, nk, heads, kv_heads, d, mode,
                                       offset, mstride, scale, smem);
    else
        tl_fa_fwd<32, TL_FA_BN, TL_FA_DMAX, 0>(q, k, v, mask, o, lse, batch, nq, nk, heads, kv_heads, d,
                                               mode, offset, mstride, scale, smem);
}

// tl_flash_fwd for d <= 64 with 64 keys a step (four tiles: every thread in the softmax phase,
// half the barriers a key), in TL_FA_FWD_SMEM(64, 64, 64) floats of dynamic shared memory (past
// the 48 KiB of static arrays). The same bits as tl_flash_fwd.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_fwd_wide(const float* q, const float* k, const float* v,
                                        const u32* mask, float* o, float* lse, u32 batch, u32 nq,
                                        u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                        u32 mstride, float scale) {
    TL_DYNAMIC_SHARED(float, smem);
    if (d == 64)
        tl_fa_fwd<64, 64, 64, 64>(q, k, v, mask, o, lse, batch, nq, nk, heads, kv_heads, d, mode, offset,
                                  mstride, scale, smem);
    else
        tl_fa_fwd<64, 64, 64, 0>(q, k, v, mask, o, lse, batch, nq, nk, heads, kv_heads, d, mode, offset,
                                 mstride, scale, smem);
}

// ---- Forward on tensor cores: f32 as three TF32 products, rounded operands as one ------------
//
// tl_flash_fwd_tc (device/flash.rs FlashProducts::Tf32x3; d <= 64): the products of the scores
// Q K^T and of P V on the tensor cores (WMMA m16n16k8, TF32 fragments, f32 accumulators), each
// f32 operand x split into big = tf32(x) (nearest, ties away) and small = tf32(x - big)
// (x - big is exact), a.b taken as small_a.big_b + big_a.small_b + big_a.big_b (three mma_sync
// in that order; small_a.small_b, below 2^-22 of the product, dropped): CUTLASS's 3xTF32, the
// arithmetic PyTorch's f32 memory-efficient attention runs on sm80+. A block of 256 threads
// takes 128 query rows of one (b, h), warp w the rows 16 w .. 16 w + 15 (its scores,
// probabilities and outputs in shared memory of its own); the key loop takes TL_FA_TC_STEP =
// 64 keys a step, K and V of the step shared by the block. Order (the sim's twin,
// device/sim/flash.rs forward with FlashProducts::Tf32x3):
// - a score is s = S3(q_i, k_j) * scale, S3 over c in chunks of 8 from +0, each chunk the three
//   fma chains above in c order (the emulator's mma_sync order, cuda_emu.h); masked keys -inf;
// - per query row, per step of 64 keys that the row's tile of 16 rows meets (tl_fa_meet; keys
//   before tl_fa_kend): mt = the step's max, m' = fmaxf(m, mt); if m' = -inf nothing changes;
//   else alpha = expf(m - m'), p_j = expf(s_j - m') (0 where masked or past nk), l = l * alpha +
//   (h0 + h1), h0 and h1 the sums of p_j over keys 0..31 and 32..63 of the step, each in key
//   order from +0 (two lanes a row); o_c = o_c * alpha, then over the step's keys in chunks of
//   8 (p = 0 and v = 0 past nk) the three fma chains of p_j v_jc into o_c; m = m'. At the end
//   o_c / l and lse = m + logf(l), or 0 and -inf for a row with nothing allowed. Columns past d
//   are zeros, whose products add +0 to sums that are never -0: no change.
// Autocast (TL_FA_BF16 / TL_FA_TF32, with TL_FA_STATS or TL_FA_OUT as for tl_flash_fwd): the
// caller hands Q, K and V unrounded (no copies, unlike tl_flash_fwd) and tl_fa_tc_stage rounds
// them as it stages them, so their small parts are zero (a bf16 value is a TF32 value) and only
// big.big is multiplied (mma3's `exact`), one exact product a pair; the first pass's P V keeps
// small_p.v (p unrounded). TL_FA_STATS: m, l and lse as above, no P V, O not written. TL_FA_OUT:
// each row's lse read where l is kept, p_j = round(expf(s_j - lse)) (0 where masked or past nk),
// alpha = 1, l untouched; at the end o_c undivided, lse not written.
// On a GPU mma_sync sums in the hardware's order: the same function within f32 tolerance, not
// the emulator's bits.
#define TL_FA_TC_BM 128
#define TL_FA_TC_STEP 64  // keys (forward, dQ) or query rows (dK, dV) staged a step
#define TL_FA_TC_LDT 20   // a 16 x 16 tile's row stride in shared memory
#define TL_FA_TC_DMAX 64  // the largest head (device/flash.rs FLASH_TC_MAX_HEAD)
#define TL_FA_TC_LD (TL_FA_TC_DMAX + 4)
// Shared floats of tl_flash_fwd_tc (device/cuda/flash.rs FWD_TC_SMEM_BYTES is this in bytes):
// Q of the block, K and V of a step, each warp's scores (then p) and outputs (16 x LD each),
// and each warp's m, l and alpha of its 16 rows and one exchange slot a lane (80 floats).
#define TL_FA_TC_SMEM ((TL_FA_TC_BM + 2 * TL_FA_TC_STEP + 2 * TL_FA_TC_BM) * TL_FA_TC_LD + 5 * TL_FA_TC_BM)

namespace tl_fa_tc {
namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragB;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> FragC;

// x (loaded with its f32 bits) split into its big and small TF32 parts, element by element.
template <class F>
__device__ __forceinline__ void split(F& x, F& small) {
    for (int e = 0; e < x.num_elements; ++e) {
        const float big = wmma::__float_to_tf32(x.x[e]);
        small.x[e] = wmma::__float_to_tf32(x.x[e] - big);
        x.x[e] = big;
    }
}

// Which operands of a product hold TF32 values already (their small parts zero; autocast's
// rounded operands: a bf16 value is a TF32 value): bit TL_FA_TC_A_EXACT the left one, bit
// TL_FA_TC_B_EXACT the right one. The products of a zero small part are skipped (each would add
// +0 to a sum that is never -0: the same bits for finite operands).
#define TL_FA_TC_A_EXACT 1u
#define TL_FA_TC_B_EXACT 2u

// acc += a.b as three TF32 products: small_a.big_b, big_a.small_b, big_a.big_b, less those of
// an operand `exact` names.
template <class FA, class FB>
__device__ __forceinline__ void mma3(FragC& acc, const FA& a_big, const FA& a_small,
                                     const FB& b_big, const FB& b_small, u32 exact) {
    if (!(exact & TL_FA_TC_A_EXACT)) wmma::mma_sync(acc, a_small, b_big, acc);
    if (!(exact & TL_FA_TC_B_EXACT)) wmma::mma_sync(acc, a_big, b_small, acc);
    wmma::mma_sync(acc, a_big, b_big, acc);
}

// The exactness bits of a product of two operands rounded under `mode`'s autocast: both, or none
// in f32.
__device__ __forceinline__ u32 exact_of(u32 mode) {
    return (mode & (TL_FA_BF16 | TL_FA_TF32)) ? (TL_FA_TC_A_EXACT | TL_FA_TC_B_EXACT) : 0u;
}
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> FragAt;

// Warp-wide: the 16 x 16 tile out = A B^T (row-major, row stride TL_FA_TC_LDT) of the 16 rows
// of a and the 16 rows of b (row stride TL_FA_TC_LD, dp columns, zeros from d on), 3xTF32 over
// the columns in chunks of 8 (`exact` as mma3's).
__device__ __forceinline__ void abt(const float* a, const float* b, u32 dp, float* out, u32 exact) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (u32 c0 = 0; c0 < dp; c0 += 8) {
        FragA ab, as;
        FragBt bb, bs;
        wmma::load_matrix_sync(ab, a + c0, TL_FA_TC_LD);
        wmma::load_matrix_sync(bb, b + c0, TL_FA_TC_LD);
        split(ab, as);
        split(bb, bs);
        mma3(acc, ab, as, bb, bs, exact);
    }
    wmma::store_matrix_sync(out, acc, TL_FA_TC_LDT, wmma::mem_row_major);
}

// The matrix_a fragment of a tile read as it is stored (COL false) or transposed (COL true).
template <bool COL>
struct FragAOf {
    typedef FragA T;
};
template <>
struct FragAOf<true> {
    typedef FragAt T;
};

// Warp-wide: acc[t] += A x (16 rows of y from y0, columns 16 t ..), A the row-major 16 x 16
// tile at x (row stride ldx; COL false) or its transpose (COL true), over k in chunks of 8;
// the fragments of y past dp untouched; `exact` as mma3's.
template <bool COL>
__device__ __forceinline__ void add_xy(FragC* acc, const float* x, u32 ldx, const float* y0,
                                       u32 dp, u32 exact) {
    typedef typename FragAOf<COL>::T FA;
    for (u32 kk = 0; kk < 16; kk += 8) {
        FA xb, xsm;
        wmma::load_matrix_sync(xb, COL ? x + kk * ldx : x + kk, ldx);
        split(xb, xsm);
        TL_FA_UNROLL
        for (u32 t = 0; t < TL_FA_TC_DMAX / 16; ++t) {
            if (t * 16 >= dp) continue;
            FragB yb, ysm;
            wmma::load_matrix_sync(yb, y0 + kk * TL_FA_TC_LD + t * 16, TL_FA_TC_LD);
            split(yb, ysm);
            mma3(acc[t], xb, xsm, yb, ysm, exact);
        }
    }
}

// Warp-wide: rows [0, n) x columns [0, d) of the fragments acc (through the 16 rows of scratch,
// row stride TL_FA_TC_LD) into out[r * stride + c].
__device__ __forceinline__ void write_rows(FragC* acc, float* scratch, u32 dp, u32 d, u32 n,
                                           float* out, u64 stride) {
    TL_FA_UNROLL
    for (u32 t = 0; t < TL_FA_TC_DMAX / 16; ++t)
        if (t * 16 < dp) wmma::store_matrix_sync(scratch + t * 16, acc[t], TL_FA_TC_LD, wmma::mem_row_major);
    __syncwarp();
    for (u32 e = threadIdx.x % 32; e < 16 * d; e += 32) {
        const u32 r = e / d, c = e % d;
        if (r < n) out[r * stride + c] = scratch[r * TL_FA_TC_LD + c];
    }
    __syncwarp();
}
}  // namespace tl_fa_tc

// Warp-wide, on a 16 x 16 tile of query rows i0 + r and keys j0 + jj: S (st) and dP (dt) into
// p (st) and dS (dt), p = expf(S * scale - lse_r), dS = p * (dP - delta_r) * scale, and 0
// where r >= nr, jj >= nc, lse_r = -inf or the mask hides (i, j); each rounded as `mode` says
// (autocast; dS from the unrounded p).
__device__ __forceinline__ void tl_fa_tc_p_ds(float* st, float* dt, u32 nr, u32 nc, u32 i0, u32 j0,
                                              const float* lse, const float* delta,
                                              const u32* mk, u32 mode, int offset, u32 nk,
                                              float scale) {
    for (u32 e = threadIdx.x % 32; e < 256; e += 32) {
        const u32 r = e / 16, jj = e % 16, at = r * TL_FA_TC_LDT + jj;
        const float l = lse[r];
        float p = 0.0f, ds = 0.0f;
        if (r < nr && jj < nc && l != -INFINITY &&
            tl_fa_allowed(mk, mode, offset, nk, i0 + r, j0 + jj)) {
            p = expf(st[at] * scale - l);
            ds = p * (dt[at] - delta[r]) * scale;
        }
        st[at] = tl_fa_round(p, mode);
        dt[at] = tl_fa_round(ds, mode);
    }
}

// Rows [r0, r0 + R) of head (b, h) of `x` (n rows a sample) into xs (R rows of TL_FA_TC_LD, the
// first dp columns written: zeros past `rows` or d), each value rounded as `mode` says (autocast:
// the tensor-core kernels read their operands unrounded and round them here), every thread of
// the block.
__device__ __forceinline__ void tl_fa_tc_stage(float* xs, const float* x, u32 R, u32 b, u32 r0,
                                               u32 rows, u32 h, u32 n, u32 heads, u32 d, u32 dp,
                                               u32 mode) {
    for (u32 e = threadIdx.x; e < R * dp; e += TL_BLOCK) {
        const u32 r = e / dp, c = e % dp;
        const bool in = r < rows && c < d;
        xs[r * TL_FA_TC_LD + c] = in ? tl_fa_round(x[tl_fa_at(b, r0 + r, h, c, n, heads, d)], mode) : 0.0f;
    }
}

// O = softmax(Q K^T * scale) V per head and lse = m + log(l) per row, the products as 3xTF32 on
// the tensor cores (above), in TL_FA_TC_SMEM floats of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 1) tl_flash_fwd_tc(const float* q, const float* k, const float* v,
                                        const u32* mask, float* o, float* lse, u32 batch, u32 nq,
                                        u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                        u32 mstride, float scale) {
    namespace wmma = nvcuda::wmma;
    using namespace tl_fa_tc;
    constexpr u32 BM = TL_FA_TC_BM, BN = TL_FA_TC_STEP, LD = TL_FA_TC_LD;
    TL_DYNAMIC_SHARED(float, smem);
    const u32 tid = threadIdx.x, w = tid / 32, lane = tid % 32, exact = exact_of(mode);
    const bool out_pass = mode & TL_FA_OUT, stats = mode & TL_FA_STATS;
    // P V's left operand is rounded (a TF32 value) in the second pass only.
    const u32 pv_exact = out_pass ? exact : exact & TL_FA_TC_B_EXACT;
    const u32 dp = (d + 15) / 16 * 16;  // columns in shared memory, zeros from d on
    float* qs = smem;                                // qs[r * LD + c]
    float* ks = qs + BM * LD;                        // ks[j * LD + c]
    float* vs = ks + BN * LD;                        // vs[j * LD + c]
    float* ss = vs + BN * LD + w * 16 * LD;          // warp w's scores, then p: ss[r * LD + j]
    float* os = vs + BN * LD + (BM + w * 16) * LD;   // warp w's outputs: os[r * LD + c]
    float* st = vs + BN * LD + 2 * BM * LD + w * 80; // its rows' m (st[r]), l or lse (16 + r), alpha (32 + r)
    float* xs = st + 48;                             // a slot a lane, for the two lanes of a row
    const u32 tiles = tl_fa_tiles(nq, BM);
    for (u64 job = blockIdx.x; job < (u64)batch * heads * tiles; job += gridDim.x) {
        const auto [bh, b, h, i0, rows] = tl_fa_job(job, tiles, BM, nq, heads, true);
        const u32 g = tl_fa_kv_head(h, heads, kv_heads);  // the key head h reads
        const u32* mk = mask + (u64)b * mstride;           // batch element b's words
        const u32 r0 = w * 16, wrows = rows > r0 ? (rows - r0 < 16 ? rows - r0 : 16) : 0;
        __syncthreads();  // the previous job's reads of qs are done
        tl_fa_tc_stage(qs, q, BM, b, i0, rows, h, nq, heads, d, dp, mode);
        for (u32 e = lane; e < 16 * dp; e += 32) os[e / dp * LD + e % dp] = 0.0f;
        if (lane < 16) {
            st[lane] = -INFINITY;
            // The second pass reads each row's lse where l is kept otherwise.
            const bool lr = out_pass && lane < wrows;
            st[16 + lane] = lr ? lse[(u64)bh * nq + i0 + r0 + lane] : (out_pass ? -INFINITY : 0.0f);
        }
        __syncwarp();
        const u32 kend = tl_fa_kend(mode, offset, i0 + rows, nk);
        for (u32 j0 = 0; j0 < kend; j0 += BN) {
            const u32 keys = nk - j0 < BN ? nk - j0 : BN;
            __syncthreads();  // the previous step's reads of ks and vs are done
            tl_fa_tc_stage(ks, k, BN, b, j0, keys, g, nk, kv_heads, d, dp, mode);
            tl_fa_tc_stage(vs, v, BN, b, j0, keys, g, nk, kv_heads, d, dp, mode);
            __syncthreads();
            if (wrows == 0 || !tl_fa_meet(mode, offset, i0 + r0 + wrows, j0)) continue;
            // 1. The warp's 16 x 64 scores.
            FragC acc[BN / 16];
            for (u32 t = 0; t < BN / 16; ++t) wmma::fill_fragment(acc[t], 0.0f);
            for (u32 c0 = 0; c0 < dp; c0 += 8) {
                FragA qb, qsm;
                wmma::load_matrix_sync(qb, &qs[r0 * LD + c0], LD);
                split(qb, qsm);
                for (u32 t = 0; t < BN / 16; ++t) {
                    FragBt kb, ksm;
                    wmma::load_matrix_sync(kb, &ks[t * 16 * LD + c0], LD);
                    split(kb, ksm);
                    mma3(acc[t], qb, qsm, kb, ksm, exact);
                }
            }
            for (u32 t = 0; t < BN / 16; ++t)
                wmma::store_matrix_sync(&ss[t * 16], acc[t], LD, wmma::mem_row_major);
            __syncwarp();
            // 2. Row r = lane % 16's online softmax over the step, lane r its keys 0..31 and
            // lane r + 16 its keys 32..63 (the halves' maxima and sums exchanged through xs).
            {
                const u32 r = lane % 16, jb = lane / 16 * (BN / 2), i = i0 + r0 + r;
                float* sr = &ss[r * LD];
                const float m = st[r];
                float mt = -INFINITY;
                for (u32 j = jb; j < jb + BN / 2; ++j) {
                    const bool ok =
                        r < wrows && j < keys && tl_fa_allowed(mk, mode, offset, nk, i, j0 + j);
                    const float s = ok ? sr[j] * scale : -INFINITY;
                    sr[j] = s;
                    mt = fmaxf(mt, s);
                }
                xs[lane] = mt;
                __syncwarp();
                const float mn = fmaxf(m, fmaxf(xs[r], xs[r + 16]));
                __syncwarp();  // every lane has read the maxima
                float alpha = 1.0f, half = 0.0f;
                if (mn == -INFINITY) {
                    for (u32 j = jb; j < jb + BN / 2; ++j) sr[j] = 0.0f;
                } else if (out_pass) {  // a row with a finite max: lse finite
                    const float lr = st[16 + r];
                    for (u32 j = jb; j < jb + BN / 2; ++j) sr[j] = tl_fa_round(expf(sr[j] - lr), mode);
                } else {
                    alpha = expf(m - mn);
                    for (u32 j = jb; j < jb + BN / 2; ++j) {
                        const float p = expf(sr[j] - mn);
                        sr[j] = p;
                        half = half + p;
                    }
                }
                xs[lane] = half;
                __syncwarp();
                if (lane < 16) {
                    if (mn != -INFINITY) {
                        if (!out_pass) st[16 + r] = st[16 + r] * alpha + (xs[r] + xs[r + 16]);
                        st[r] = mn;
                    }
                    st[32 + r] = alpha;
                }
            }
            __syncwarp();
            if (stats) continue;  // the statistics alone: no P V
            // 3. o = o * alpha, then the step's P V.
            for (u32 e = lane; e < 16 * dp; e += 32) {
                const u32 r = e / dp, c = e % dp;
                os[r * LD + c] = os[r * LD + c] * st[32 + r];
            }
            __syncwarp();
            // Each output fragment sums over the step's keys in chunks of 8 in order, a tile of 16
            // at a time (the fragments stay in registers: unrolled constant bounds).
            constexpr u32 FT = TL_FA_TC_DMAX / 16;
            FragC oc[FT];
            TL_FA_UNROLL
            for (u32 t = 0; t < FT; ++t)
                if (t * 16 < dp) wmma::load_matrix_sync(oc[t], &os[t * 16], LD, wmma::mem_row_major);
            for (u32 j = 0; j < BN; j += 16) add_xy<false>(oc, &ss[j], LD, &vs[j * LD], dp, pv_exact);
            TL_FA_UNROLL
            for (u32 t = 0; t < FT; ++t)
                if (t * 16 < dp) wmma::store_matrix_sync(&os[t * 16], oc[t], LD, wmma::mem_row_major);
            __syncwarp();
        }
        // The warp's rows out: O (not in the statistics pass; undivided in the second pass), lse
        // (not in the second pass).
        for (u32 e = lane; e < 16 * d && !stats; e += 32) {
            const u32 r = e / d, c = e % d;
            if (r >= wrows) continue;
            const bool none = st[r] == -INFINITY;
            const float oc = out_pass ? os[r * LD + c] : os[r * LD + c] / st[16 + r];
            o[tl_fa_at(b, i0 + r0 + r, h, c, nq, heads, d)] = none ? 0.0f : oc;
        }
        if (lane < wrows && !out_pass) {
            const bool none = st[lane] == -INFINITY;
            lse[(u64)bh * nq + i0 + r0 + lane] = none ? -INFINITY : st[lane] + logf(st[16 + lane]);
        }
    }
}

// ---- Backward on tensor cores: f32 as three TF32 products, rounded operands as one -----------
//
// tl_flash_bwd_q_tc, then tl_flash_bwd_kv_tc (FlashProducts::Tf32x3, d <= 64): the backward's
// products, S = Q K^T and dP = dO V^T recomputed, dQ += dS K,
// dK += dS^T Q and dV += P^T dO, as the forward's 3xTF32 WMMA products (tl_fa_tc), in tiles of
// 16 query rows and 16 keys, a warp per 16 rows (dQ) or 16 keys (dK, dV) holding its sums in
// accumulator fragments. Order (the sim's twin, device/sim/flash.rs backward_q and backward_kv
// with the tensor cores' arithmetic):
// - s = S3(q_i, k_j) * scale and dP_ij = S3(dO_i, v_j) (S3 as the forward's scores: columns in
//   chunks of 8 from +0, three fma chains each); p = expf(s - lse_i), dS = p * (dP - delta_i) *
//   scale (0 where masked, past nk or lse_i = -inf); delta_i = dot(dO_i, O_i), an fma chain
//   from +0 (tl_fa_dot);
// - dQ_ic over the key tiles below tl_fa_kend of the row's tile of 16 in increasing order, each
//   tile's 16 keys in chunks of 8 (three chains each);
// - dK_jc and dV_jc over the query heads of the key head's group in increasing order, each
//   head's query tiles from tl_fa_qstart of the key's tile of 16 in increasing order, each
//   tile's 16 rows in chunks of 8 (three chains each).
// Rows and keys past nq, nk or d are zeros, whose products add +0 to sums that are never -0.
// Autocast (TL_FA_BF16 / TL_FA_TF32): Q, K, V and dO come unrounded and are rounded as they are
// staged (delta_i = dot(round(dO_i), O_i), the fma chain above, O the first pass's output of the
// unrounded p); p and dS are rounded as tl_fa_round says (dS from the unrounded p) before dV,
// dQ and dK read them, and every product is big.big alone (mma3's `exact`).
// Shared floats of the two kernels (device/cuda/flash.rs BWD_TC_SMEM_BYTES is this in bytes):
// 128 rows of two operands and 64 of two others (rows of TL_FA_TC_LD), each warp's two 16 x 16
// tiles, and two values a row of a step (lse and delta).
#define TL_FA_TC_BWD_SMEM \
    ((2 * TL_FA_TC_BM + 2 * TL_FA_TC_STEP) * TL_FA_TC_LD + 8 * 2 * 16 * TL_FA_TC_LDT + 2 * TL_FA_TC_BM)

// dQ and delta (tl_flash_bwd_q's outputs) on the tensor cores: a block of 128 query rows of one
// (b, h), warp w the rows 16 w ..; K and V of 64 keys a step.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 1) tl_flash_bwd_q_tc(const float* q, const float* k, const float* v,
                                          const float* o, const float* go, const float* lse,
                                          const u32* mask, float* dq, float* delta, u32 batch,
                                          u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                          u32 mstride, float scale) {
    using namespace tl_fa_tc;
    constexpr u32 BM = TL_FA_TC_BM, BN = TL_FA_TC_STEP, LD = TL_FA_TC_LD, LDT = TL_FA_TC_LDT;
    constexpr u32 FT = TL_FA_TC_DMAX / 16;
    TL_DYNAMIC_SHARED(float, smem);
    const u32 tid = threadIdx.x, w = tid / 32, lane = tid % 32, exact = exact_of(mode);
    const u32 dp = (d + 15) / 16 * 16;
    float* qs = smem;          // Q rows
    float* gs = qs + BM * LD;  // dO rows
    float* ks = gs + BM * LD;  // K rows of a step
    float* vs = ks + BN * LD;  // V rows of a step
    float* st = vs + BN * LD + w * 2 * 16 * LDT;  // warp w's S
    float* dt = st + 16 * LDT;                    // its dP, then dS
    float* rl = vs + BN * LD + 8 * 2 * 16 * LDT + w * 32;  // its rows' lse (r), delta (16 + r)
    const u32 tiles = tl_fa_tiles(nq, BM);
    for (u64 job = blockIdx.x; job < (u64)batch * heads * tiles; job += gridDim.x) {
        const auto [bh, b, h, i0, rows] = tl_fa_job(job, tiles, BM, nq, heads, true);
        const u32 g = tl_fa_kv_head(h, heads, kv_heads);
        const u32* mk = mask + (u64)b * mstride;
        const u32 r0 = w * 16, wrows = rows > r0 ? (rows - r0 < 16 ? rows - r0 : 16) : 0;
        __syncthreads();  // the previous job's reads of qs and gs are done
        tl_fa_tc_stage(qs, q, BM, b, i0, rows, h, nq, heads, d, dp, mode);
        tl_fa_tc_stage(gs, go, BM, b, i0, rows, h, nq, heads, d, dp, mode);
        if (lane < 16) {
            const u32 i = i0 + r0 + lane;
            if (lane < wrows) {
                const u64 at = tl_fa_at(b, i, h, 0, nq, heads, d);
                float dl = 0.0f;  // tl_fa_dot of round(dO_i) and O_i
                for (u32 c = 0; c < d; ++c) dl = __fmaf_rn(tl_fa_round(go[at + c], mode), o[at + c], dl);
                delta[(u64)bh * nq + i] = dl;
                rl[lane] = lse[(u64)bh * nq + i];
                rl[16 + lane] = dl;
            } else {
                rl[lane] = -INFINITY;
                rl[16 + lane] = 0.0f;
            }
        }
        FragC acc[FT];
        TL_FA_UNROLL
        for (u32 t = 0; t < FT; ++t) wmma::fill_fragment(acc[t], 0.0f);
        const u32 kend = tl_fa_kend(mode, offset, i0 + rows, nk);
        for (u32 j0 = 0; j0 < kend; j0 += BN) {
            const u32 keys = nk - j0 < BN ? nk - j0 : BN;
            __syncthreads();  // the previous step's reads of ks and vs are done; qs, gs, rl written
            tl_fa_tc_stage(ks, k, BN, b, j0, keys, g, nk, kv_heads, d, dp, mode);
            tl_fa_tc_stage(vs, v, BN, b, j0, keys, g, nk, kv_heads, d, dp, mode);
            __syncthreads();
            for (u32 t = 0; t < BN / 16 && wrows > 0; ++t) {
                const u32 js = j0 + 16 * t;
                if (16 * t >= keys || !tl_fa_meet(mode, offset, i0 + r0 + wrows, js)) break;
                abt(&qs[r0 * LD], &ks[16 * t * LD], dp, st, exact);
                abt(&gs[r0 * LD], &vs[16 * t * LD], dp, dt, exact);
                __syncwarp();
                const u32 cols = nk - js < 16 ? nk - js : 16;
                tl_fa_tc_p_ds(st, dt, wrows, cols, i0 + r0, js, rl, rl + 16, mk, mode, offset, nk,
                              scale);
                __syncwarp();
                add_xy<false>(acc, dt, LDT, &ks[16 * t * LD], dp, exact);
                __syncwarp();  // the tiles are read before the next key tile overwrites them
            }
        }
        // The warp's Q rows, read by it alone, hold its dQ on the way out.
        float* out = &dq[tl_fa_at(b, i0 + r0, h, 0, nq, heads, d)];
        write_rows(acc, &qs[r0 * LD], dp, d, wrows, out, (u64)heads * d);
    }
}

// dK and dV (tl_flash_bwd_kv's outputs, from tl_flash_bwd_q_tc's delta) on the tensor cores: a
// block of 128 keys of one (b, g), warp w the keys 16 w ..; per query head of g's group, Q, dO,
// lse and delta of 64 rows a step.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 1) tl_flash_bwd_kv_tc(const float* q, const float* k, const float* v,
                                           const float* go, const float* lse, const float* delta,
                                           const u32* mask, float* dk, float* dv, u32 batch,
                                           u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                           u32 mstride, float scale) {
    using namespace tl_fa_tc;
    constexpr u32 BK = TL_FA_TC_BM, BQ = TL_FA_TC_STEP, LD = TL_FA_TC_LD, LDT = TL_FA_TC_LDT;
    constexpr u32 FT = TL_FA_TC_DMAX / 16;
    TL_DYNAMIC_SHARED(float, smem);
    const u32 tid = threadIdx.x, w = tid / 32, exact = exact_of(mode);
    const u32 dp = (d + 15) / 16 * 16;
    float* ks = smem;          // K rows of the block
    float* vs = ks + BK * LD;  // V rows
    float* qs = vs + BK * LD;  // Q rows of a step
    float* gs = qs + BQ * LD;  // dO rows of a step
    float* st = gs + BQ * LD + w * 2 * 16 * LDT;  // warp w's S, then P
    float* dt = st + 16 * LDT;                    // its dP, then dS
    float* rl = gs + BQ * LD + 8 * 2 * 16 * LDT;  // the step's rows' lse (r), delta (BQ + r)
    const u32 tiles = tl_fa_tiles(nk, BK), group = heads / kv_heads;
    for (u64 job = blockIdx.x; job < (u64)batch * kv_heads * tiles; job += gridDim.x) {
        const auto [bg, b, g, j0, keys] = tl_fa_job(job, tiles, BK, nk, kv_heads, false);
        const u32* mk = mask + (u64)b * mstride;
        const u32 k0 = w * 16, wkeys = keys > k0 ? (keys - k0 < 16 ? keys - k0 : 16) : 0;
        const u32 qstart = tl_fa_qstart(mode, offset, j0 + k0, nq);  // the warp's first tile
        __syncthreads();  // the previous job's reads of ks and vs are done
        tl_fa_tc_stage(ks, k, BK, b, j0, keys, g, nk, kv_heads, d, dp, mode);
        tl_fa_tc_stage(vs, v, BK, b, j0, keys, g, nk, kv_heads, d, dp, mode);
        FragC ak[FT], av[FT];
        TL_FA_UNROLL
        for (u32 t = 0; t < FT; ++t) {
            wmma::fill_fragment(ak[t], 0.0f);
            wmma::fill_fragment(av[t], 0.0f);
        }
        for (u32 h = g * group; h < (g + 1) * group; ++h) {
            const u32 bh = b * heads + h;
            for (u32 i0 = tl_fa_qstart(mode, offset, j0, nq); i0 < nq; i0 += BQ) {
                const u32 rows = nq - i0 < BQ ? nq - i0 : BQ;
                __syncthreads();  // the previous step's reads of qs, gs and rl are done
                tl_fa_tc_stage(qs, q, BQ, b, i0, rows, h, nq, heads, d, dp, mode);
                tl_fa_tc_stage(gs, go, BQ, b, i0, rows, h, nq, heads, d, dp, mode);
                for (u32 r = tid; r < BQ; r += TL_BLOCK) {
                    rl[r] = r < rows ? lse[(u64)bh * nq + i0 + r] : -INFINITY;
                    rl[BQ + r] = r < rows ? delta[(u64)bh * nq + i0 + r] : 0.0f;
                }
                __syncthreads();
                for (u32 u = 0; u < BQ / 16 && wkeys > 0; ++u) {
                    const u32 is = i0 + 16 * u;
                    if (16 * u >= rows) break;
                    if (is < qstart) continue;  // no row of the tile sees the warp's keys
                    abt(&qs[16 * u * LD], &ks[k0 * LD], dp, st, exact);
                    abt(&gs[16 * u * LD], &vs[k0 * LD], dp, dt, exact);
                    __syncwarp();
                    tl_fa_tc_p_ds(st, dt, rows - 16 * u, wkeys, is, j0 + k0, rl + 16 * u,
                                  rl + BQ + 16 * u, mk, mode, offset, nk, scale);
                    __syncwarp();
                    // P and dS read transposed (keys x rows): col-major fragments of the tiles.
                    add_xy<true>(av, st, LDT, &gs[16 * u * LD], dp, exact);
                    add_xy<true>(ak, dt, LDT, &qs[16 * u * LD], dp, exact);
                    __syncwarp();
                }
            }
        }
        // The warp's K and V rows, read by it alone, hold its dK and dV on the way out.
        const u64 at = tl_fa_at(b, j0 + k0, g, 0, nk, kv_heads, d), stride = (u64)kv_heads * d;
        write_rows(ak, &ks[k0 * LD], dp, d, wkeys, &dk[at], stride);
        write_rows(av, &vs[k0 * LD], dp, d, wkeys, &dv[at], stride);
    }
}

// ---- Backward, d > 64: one block of 16 x 16 threads per tile of 16 ----------------------------

typedef float (*TlFaRows)[TL_FA_LD];
typedef float (*TlFaTile)[TL_FA_T + 1];

// Shared floats of tl_fa_bwd_q16 and tl_fa_bwd_kv16.
#define TL_FA_BWD16_SMEM (4 * TL_FA_T * TL_FA_LD + 2 * TL_FA_T * (TL_FA_T + 1) + 2 * TL_FA_T)

// Their shared memory (TL_FA_BWD16_SMEM floats): tiles of Q, dO, K and V rows; two 16 x 16
// tiles (kv16: P and dS; q16: dS in the first); the query tile's lse and delta.
struct TlFaBwd16 {
    TlFaRows qs, gs, ks, vs;
    TlFaTile ts;
    float *lse_s, *delta_s;
};
__device__ __forceinline__ TlFaBwd16 tl_fa_bwd16_smem(float* smem) {
    TlFaBwd16 m;
    m.qs = reinterpret_cast<TlFaRows>(smem);
    m.gs = m.qs + TL_FA_T;
    m.ks = m.gs + TL_FA_T;
    m.vs = m.ks + TL_FA_T;
    m.ts = reinterpret_cast<TlFaTile>(smem + 4 * TL_FA_T * TL_FA_LD);
    m.lse_s = smem + 4 * TL_FA_T * TL_FA_LD + 2 * TL_FA_T * (TL_FA_T + 1);
    m.delta_s = m.lse_s + TL_FA_T;
    return m;
}

// dQ and delta, one job per tile of 16 query rows; thread (ty, tx) scores row ty against key
// tx, then sums columns tx, tx + 16, ... of row ty.
__device__ __forceinline__ void tl_fa_bwd_q16(const float* q, const float* k, const float* v,
                                              const float* o, const float* go, const float* lse,
                                              const u32* mask, float* dq, float* delta,
                                              u32 batch, u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d,
                                              u32 mode, int offset, u32 mstride, float scale,
                                              float* smem) {
    const auto [qs, gs, ks, vs, dss, lse_s, delta_s] = tl_fa_bwd16_smem(smem);
    const u32 ty = threadIdx.x / TL_FA_T, tx = threadIdx.x % TL_FA_T;
    const u32 tiles = tl_fa_tiles(nq, TL_FA_T);
    for (u64 job = blockIdx.x; job < (u64)batch * heads * tiles; job += gridDim.x) {
        const auto [bh, b, h, i0, rows] = tl_fa_job(job, tiles, TL_FA_T, nq, heads, false);
        const u32 g = tl_fa_kv_head(h, heads, kv_heads);  // the key head h reads
        const u32* mk = mask + (u64)b * mstride;  // batch element b's words
        const u32 i = i0 + ty;
        __syncthreads();
        tl_fa_load(qs, q, b, i0, rows, h, nq, heads, d);
        tl_fa_load(gs, go, b, i0, rows, h, nq, heads, d);
        __syncthreads();
        if (threadIdx.x < rows) {
            const u32 r = threadIdx.x;
            float dl = 0.0f;
            for (u32 c = 0; c < d; ++c)
                dl = __fmaf_rn(gs[r][c], o[tl_fa_at(b, i0 + r, h, c, nq, heads, d)], dl);
            delta_s[r] = dl;
            delta[(u64)bh * nq + i0 + r] = dl;
            lse_s[r] = lse[(u64)bh * nq + i0 + r];
        }
        float acc[TL_FA_COLS];
        for (u32 u = 0; u < TL_FA_COLS; ++u) acc[u] = 0.0f;
        const u32 kend = tl_fa_kend(mode, offset, i0 + rows, nk);
        for (u32 j0 = 0; j0 < kend; j0 += TL_FA_T) {
            const u32 cols = tl_fa_len(nk, j0);
            __syncthreads();
            tl_fa_load(ks, k, b, j0, cols, g, nk, kv_heads, d);
            tl_fa_load(vs, v, b, j0, cols, g, nk, kv_heads, d);
            __syncthreads();
            float p, ds;
            const bool ok = ty < rows && tx < cols &&
                            tl_fa_allowed(mk, mode, offset, nk, i, j0 + tx);
            tl_fa_p_ds(qs, gs, ks, vs, ty, tx, ok ? lse_s[ty] : 0.0f, ok ? delta_s[ty] : 0.0f, d,
                       scale, ok, mode, &p, &ds);
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
                if (c < d) dq[tl_fa_at(b, i, h, c, nq, heads, d)] = acc[u];
            }
        }
    }
}

// dK and dV, one job per tile of 16 keys of one key head g (reads delta from
// tl_flash_bwd_q): its group's query heads in increasing order, each head's query tiles in
// order, one chain per output.
__device__ __forceinline__ void tl_fa_bwd_kv16(const float* q, const float* k, const float* v,
                                               const float* go, const float* lse,
                                               const float* delta, const u32* mask, float* dk,
                                               float* dv, u32 batch, u32 nq, u32 nk, u32 heads, u32 kv_heads,
                                               u32 d, u32 mode, int offset, u32 mstride,
                                               float scale, float* smem) {
    const auto [qs, gs, ks, vs, ps, lse_s, delta_s] = tl_fa_bwd16_smem(smem);
    const TlFaTile dss = ps + TL_FA_T;
    const u32 ty = threadIdx.x / TL_FA_T, tx = threadIdx.x % TL_FA_T;
    const u32 tiles = tl_fa_tiles(nk, TL_FA_T), group = heads / kv_heads;
    for (u64 job = blockIdx.x; job < (u64)batch * kv_heads * tiles; job += gridDim.x) {
        const auto [bg, b, g, j0, cols] = tl_fa_job(job, tiles, TL_FA_T, nk, kv_heads, false);
        const u32* mk = mask + (u64)b * mstride;  // batch element b's words
        __syncthreads();
        tl_fa_load(ks, k, b, j0, cols, g, nk, kv_heads, d);
        tl_fa_load(vs, v, b, j0, cols, g, nk, kv_heads, d);
        float acc_k[TL_FA_COLS], acc_v[TL_FA_COLS];
        for (u32 u = 0; u < TL_FA_COLS; ++u) acc_k[u] = acc_v[u] = 0.0f;
        for (u32 h = g * group; h < (g + 1) * group; ++h) {
            const u64 bh = (u64)b * heads + h;
            for (u32 i0 = tl_fa_qstart(mode, offset, j0, nq); i0 < nq; i0 += TL_FA_T) {
                const u32 rows = tl_fa_len(nq, i0);
                __syncthreads();
                tl_fa_load(qs, q, b, i0, rows, h, nq, heads, d);
                tl_fa_load(gs, go, b, i0, rows, h, nq, heads, d);
                if (threadIdx.x < rows) {
                    lse_s[threadIdx.x] = lse[bh * nq + i0 + threadIdx.x];
                    delta_s[threadIdx.x] = delta[bh * nq + i0 + threadIdx.x];
                }
                __syncthreads();
                // Thread (ty, tx): query row ty of the tile, key tx.
                float p, ds;
                const bool ok = ty < rows && tx < cols &&
                                tl_fa_allowed(mk, mode, offset, nk, i0 + ty, j0 + tx);
                tl_fa_p_ds(qs, gs, ks, vs, ty, tx, ok ? lse_s[ty] : 0.0f,
                           ok ? delta_s[ty] : 0.0f, d, scale, ok, mode, &p, &ds);
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
        }
        if (ty < cols) {
            for (u32 u = 0; u < TL_FA_COLS; ++u) {
                const u32 c = tx + u * TL_FA_T;
                if (c < d) {
                    const u64 at = tl_fa_at(b, j0 + ty, g, c, nk, kv_heads, d);
                    dk[at] = acc_k[u];
                    dv[at] = acc_v[u];
                }
            }
        }
    }
}

// ---- Backward, d <= 64: register micro-tiles -------------------------------------------------
//
// tl_fa_bwd_q64: a job is a block of 64 query rows; shared memory holds the block's Q and dO
// rows (64 x DM each) and, per step, 32 keys of K and V (rows), all swizzled. Each thread
// computes the scores and dP of 4 rows against 2 keys in one pass over c, four columns a load
// (16 fma chains; a warp covers 16 rows x 16 keys), then dS goes where V was and thread
// (sy, sx) adds dS K to dQ rows 4 sy.., columns 4 sx.. (and 64 + 4 sx.. when DM = 128) over
// key tile 0 then tile 1, each key in order. DM = 64 (tl_flash_bwd_q, static shared memory)
// or 128 (tl_flash_bwd_q_wide, d > 64, 96 KiB of dynamic shared memory: FlashTiles::Wide).
//
// tl_fa_bwd_kv64: a job is a block of BN keys of one key head (K and V rows, resident); the
// query loop takes one tile of 16 rows (Q, dO rows) of one query head per step, the group's
// heads in increasing order, each head's tiles in order. Each thread scores one row against BN/16 keys (s
// and dP, four columns a load; a warp covers 8 rows x BN/4 keys), P and dS into shared
// memory; then thread (kx, cx) adds rows 0.. of the tile to dK and dV of keys 4 kx..,
// columns 4 cx.. (32 chains). BN = 64, DM = 64 (tl_flash_bwd_kv, static shared memory) or
// BN = 32, DM = 128 (tl_flash_bwd_kv_wide, d > 64, 52 KiB of dynamic shared memory).
#define TL_FA_BWD64_SMEM (3 * 64 * 64)
// Shared floats of tl_fa_bwd_kv64 for BN keys of width DM: K and V, a tile of Q and dO rows,
// P and dS. (device/cuda/flash.rs: BWD_KV_WIDE_SMEM_BYTES is this for (32, 128), in bytes.)
#define TL_FA_BWD_KV_SMEM(BN, DM) (2 * (BN) * (DM) + 2 * TL_FA_T * (DM) + 2 * TL_FA_T * (BN))
// Shared floats of tl_fa_bwd_q64 for head width DM: Q and dO (64 rows), K and V (32 rows).
// (device/cuda/flash.rs: BWD_Q_WIDE_SMEM_BYTES is this for DM = 128, in bytes.)
#define TL_FA_BWD_Q_SMEM(DM) ((2 * 64 + 2 * TL_FA_BN) * (DM))

template <u32 DM, u32 DC>
__device__ __forceinline__ void tl_fa_bwd_q64(const float* q, const float* k, const float* v,
                                              const float* o, const float* go, const float* lse,
                                              const u32* mask, float* dq, float* delta,
                                              u32 batch, u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d_run,
                                              u32 mode, int offset, u32 mstride, float scale,
                                              float* smem) {
    const u32 d = DC ? DC : d_run;  // as tl_fa_fwd's DC
    constexpr u32 BM = 64, BN = TL_FA_BN;
    constexpr u32 CH = DM / 64;  // dQ: groups of 64 columns a thread
    static_assert(DM % 64 == 0, "dQ columns in groups of 64");
    float* qs = smem;            // qs[r * DM + (c ^ swz(r))]
    float* gs = qs + DM * BM;    // dO, the same way
    float* ks = gs + DM * BM;    // ks[j * DM + (c ^ swz(j))]
    float* vs = ks + BN * DM;    // V as K; then dS: vs[j * BM + (r ^ swz(j))]
    const u32 tid = threadIdx.x;
    // Scores: warp w takes rows 16 (w / 2).. and keys 16 (w % 2).. of the step; its lane rows
    // sr + 4 a, keys sk + 8 bb, reading four columns at once.
    const u32 w = tid / TL_WARP, lane = tid % TL_WARP;
    const u32 sr = (w / 2) * 16 + lane / 8, sk = (w % 2) * 16 + lane % 8;
    const u32 sy = tid / 16, sx = tid % 16;  // dQ: rows 4 sy.., columns 4 sx..
    const u32 tiles = tl_fa_tiles(nq, BM);
    for (u64 job = blockIdx.x; job < (u64)batch * heads * tiles; job += gridDim.x) {
        const auto [bh, b, h, i0, rows] = tl_fa_job(job, tiles, BM, nq, heads, true);
        const u32 g = tl_fa_kv_head(h, heads, kv_heads);  // the key head h reads
        const u32* mk = mask + (u64)b * mstride;  // batch element b's words
        __syncthreads();  // the previous job's reads are done
        tl_fa_load_swz2<BM, DM>(qs, gs, q, go, b, i0, rows, h, nq, heads, d);
        __syncthreads();
        if (tid < rows) {
            float dl = 0.0f;
            for (u32 c = 0; c < d; ++c)
                dl = __fmaf_rn(gs[tid * DM + (c ^ tl_fa_swz(tid))],
                               o[tl_fa_at(b, i0 + tid, h, c, nq, heads, d)], dl);
            delta[(u64)bh * nq + i0 + tid] = dl;
        }
        __syncthreads();  // delta of the block's rows is written
        float lr[4], dr[4], acc[4][4 * CH];
        for (u32 a = 0; a < 4; ++a) {
            const u32 r = sr + 4 * a;
            lr[a] = r < rows ? lse[(u64)bh * nq + i0 + r] : -INFINITY;
            dr[a] = r < rows ? delta[(u64)bh * nq + i0 + r] : 0.0f;
            for (u32 e = 0; e < 4 * CH; ++e) acc[a][e] = 0.0f;
        }
        const u32 kend = tl_fa_kend(mode, offset, i0 + rows, nk);
        constexpr u32 NL = BN * DM / TL_BLOCK;  // staged floats a thread
        float kreg[NL], vreg[NL];
        tl_fa_stage<BN, DM>(kreg, k, b, 0, nk < BN ? nk : BN, g, nk, kv_heads, d);
        tl_fa_stage<BN, DM>(vreg, v, b, 0, nk < BN ? nk : BN, g, nk, kv_heads, d);
        for (u32 j0 = 0; j0 < kend; j0 += BN) {
            const u32 keys = nk - j0 < BN ? nk - j0 : BN;
            __syncthreads();  // the previous step's reads of ks and vs are done
            for (u32 u = 0; u < NL; ++u) {
                const u32 e = tid + TL_BLOCK * u, j = e / DM, c = e % DM;
                ks[j * DM + (c ^ tl_fa_swz(j))] = kreg[u];
                vs[j * DM + (c ^ tl_fa_swz(j))] = vreg[u];
            }
            __syncthreads();
            float s[4][2], dp[4][2];
            for (u32 a = 0; a < 4; ++a)
                for (u32 bb = 0; bb < 2; ++bb) s[a][bb] = dp[a][bb] = 0.0f;
            u32 c = 0;
            TL_FA_UNROLL1
            for (; c + 4 <= d; c += 4) {  // four columns at once, each chain in order
                float kr[2][4], vr[2][4];
                for (u32 bb = 0; bb < 2; ++bb) {
                    const u32 j = sk + 8 * bb;
                    ld4(&ks[j * DM + (c ^ tl_fa_swz(j))], kr[bb]);
                    ld4(&vs[j * DM + (c ^ tl_fa_swz(j))], vr[bb]);
                }
                for (u32 a = 0; a < 4; ++a) {
                    const u32 r = sr + 4 * a;
                    float qr[4], gr[4];
                    ld4(&qs[r * DM + (c ^ tl_fa_swz(r))], qr);
                    ld4(&gs[r * DM + (c ^ tl_fa_swz(r))], gr);
                    for (u32 bb = 0; bb < 2; ++bb)
                        for (u32 cc = 0; cc < 4; ++cc) {
                            s[a][bb] = __fmaf_rn(qr[cc], kr[bb][cc], s[a][bb]);
                            dp[a][bb] = __fmaf_rn(gr[cc], vr[bb][cc], dp[a][bb]);
                        }
                }
            }
            for (; c < d; ++c) {
                for (u32 a = 0; a < 4; ++a) {
                    const u32 r = sr + 4 * a;
                    const float qq = qs[r * DM + (c ^ tl_fa_swz(r))];
                    const float gg = gs[r * DM + (c ^ tl_fa_swz(r))];
                    for (u32 bb = 0; bb < 2; ++bb) {
                        const u32 j = sk + 8 * bb;
                        s[a][bb] = __fmaf_rn(qq, ks[j * DM + (c ^ tl_fa_swz(j))], s[a][bb]);
                        dp[a][bb] = __fmaf_rn(gg, vs[j * DM + (c ^ tl_fa_swz(j))], dp[a][bb]);
                    }
                }
            }
            float ds[4][2];
            for (u32 a = 0; a < 4; ++a) {
                const u32 r = sr + 4 * a;
                for (u32 bb = 0; bb < 2; ++bb) {
                    const u32 j = sk + 8 * bb;
                    const bool ok = r < rows && j < keys &&
                                    tl_fa_allowed(mk, mode, offset, nk, i0 + r, j0 + j);
                    ds[a][bb] = 0.0f;
                    if (ok && lr[a] != -INFINITY) {
                        const float p = expf(s[a][bb] * scale - lr[a]);
                        ds[a][bb] = tl_fa_round(p * (dp[a][bb] - dr[a]) * scale, mode);
                    }
                }
            }
            __syncthreads();  // the reads of V are done
            for (u32 a = 0; a < 4; ++a)
                for (u32 bb = 0; bb < 2; ++bb) {
                    const u32 j = sk + 8 * bb;
                    vs[j * BM + ((sr + 4 * a) ^ tl_fa_swz(j))] = ds[a][bb];
                }
            __syncthreads();
            if (j0 + BN < kend) {  // the next step's K and V, in flight during this one's sums
                const u32 nx = nk - (j0 + BN) < BN ? nk - (j0 + BN) : BN;
                tl_fa_stage<BN, DM>(kreg, k, b, j0 + BN, nx, g, nk, kv_heads, d);
                tl_fa_stage<BN, DM>(vreg, v, b, j0 + BN, nx, g, nk, kv_heads, d);
            }
            for (u32 t = 0; t < 2; ++t) {
                if (!tl_fa_runs(mode, offset, nq, j0, t, keys, i0 + sy * 4)) break;
                const u32 jb = t * TL_FA_T, je = jb + tl_fa_len(keys, jb);
                const auto key = [&](u32 j) {
                    float dsr[4], kr[4 * CH];
                    ld4(&vs[j * BM + ((sy * 4) ^ tl_fa_swz(j))], dsr);
                    for (u32 hh = 0; hh < CH; ++hh)
                        ld4(&ks[j * DM + ((sx * 4 + 64 * hh) ^ tl_fa_swz(j))], &kr[4 * hh]);
                    for (u32 a = 0; a < 4; ++a)
                        for (u32 e = 0; e < 4 * CH; ++e)
                            acc[a][e] = __fmaf_rn(dsr[a], kr[e], acc[a][e]);
                };
                if (je - jb == TL_FA_T) {
                    TL_FA_UNROLL
                    for (u32 jj = 0; jj < TL_FA_T; ++jj) key(jb + jj);
                } else {
                    for (u32 j = jb; j < je; ++j) key(j);
                }
            }
        }
        for (u32 a = 0; a < 4; ++a) {
            const u32 r = sy * 4 + a;
            if (r >= rows) continue;
            for (u32 e = 0; e < 4 * CH; ++e) {
                const u32 c = sx * 4 + 64 * (e / 4) + e % 4;
                if (c < d) dq[tl_fa_at(b, i0 + r, h, c, nq, heads, d)] = acc[a][e];
            }
        }
    }
}

// The one-pass backward's dQ (tl_flash_bwd_atomic, DM = 64): after tl_fa_bwd_kv64's sums of
// a step, thread (r, cx), r = tid / 16, adds dS K of query row r of the step's tile over the
// block's keys 0..keys-1 in order (one fma chain from +0 per column, columns 4 cx..; dS read
// four keys at a time), then atomicAdds the four sums into the zeroed dQ: the order across
// key blocks is the hardware's. Reads dss and ks only, which the next step rewrites after
// its first barrier.
template <u32 BN, u32 DM>
__device__ __forceinline__ void tl_fa_dq_atomic(const float* dss, const float* ks, float* dq,
                                                u32 b, u32 h, u32 i0, u32 rows, u32 keys,
                                                u32 nq, u32 heads, u32 d) {
    static_assert(DM == 64 && TL_FA_T * DM / 4 == TL_BLOCK, "a row, four columns a thread");
    const u32 r = threadIdx.x / 16, cx = threadIdx.x % 16;
    if (r >= rows) return;
    const u32 rsw = tl_fa_swz(r);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const auto key = [&](u32 j, float s) {
        float kr[4];
        ld4(&ks[j * DM + ((cx * 4) ^ tl_fa_swz(j))], kr);
        for (u32 e = 0; e < 4; ++e) acc[e] = __fmaf_rn(s, kr[e], acc[e]);
    };
    u32 j = 0;
    TL_FA_UNROLL2
    for (; j + 4 <= keys; j += 4) {  // keys j..j+3 stay together under the swizzle
        float sr[4];
        ld4(&dss[r * BN + (j ^ rsw)], sr);
        for (u32 jj = 0; jj < 4; ++jj) key(j + jj, sr[jj]);
    }
    for (; j < keys; ++j) key(j, dss[r * BN + (j ^ rsw)]);
    for (u32 e = 0; e < 4; ++e) {
        const u32 c = cx * 4 + e;
        if (c < d) atomicAdd(&dq[tl_fa_at(b, i0 + r, h, c, nq, heads, d)], acc[e]);
    }
}

// DQ (tl_flash_bwd_atomic): also dQ += dS K per step (tl_fa_dq_atomic) into `dq`, zeroed before.
template <u32 BN, u32 DM, u32 DC, bool DQ = false>
__device__ __forceinline__ void tl_fa_bwd_kv64(const float* q, const float* k, const float* v,
                                               const float* go, const float* lse,
                                               const float* delta, const u32* mask, float* dk,
                                               float* dv, u32 batch, u32 nq, u32 nk, u32 heads, u32 kv_heads,
                                               u32 d_run, u32 mode, int offset, u32 mstride,
                                               float scale, float* smem, float* dq = nullptr) {
    const u32 d = DC ? DC : d_run;  // as tl_fa_fwd's DC
    constexpr u32 BM = TL_FA_T;
    constexpr u32 KA = BN / 16;  // scores: keys a thread
    constexpr u32 CGX = DM / 4;  // sums: threads across the columns
    static_assert(BN % 16 == 0 && (BN / 4) * CGX == TL_BLOCK, "4 keys x 4 columns a thread");
    float* ks = smem;           // ks[j * DM + (c ^ swz(j))]
    float* vs = ks + DM * BN;   // V, the same way
    float* qs = vs + DM * BN;   // qs[r * DM + (c ^ swz(r))]
    float* gs = qs + BM * DM;   // dO rows, the same way
    float* ps = gs + BM * DM;   // ps[r * BN + (j ^ swz(r))]
    float* dss = ps + BM * BN;  // dS, the same way
    const u32 tid = threadIdx.x;
    // Scores: warp w takes rows 8 (w / 4).. and keys BN/4 (w % 4).. of the step; its lane row
    // sr, keys sk + 4 a, reading four columns at once (so a warp reads 8 rows and BN/4 keys).
    const u32 w = tid / TL_WARP, lane = tid % TL_WARP;
    const u32 sr = (w / 4) * 8 + lane / 4, sk = (w % 4) * (BN / 4) + lane % 4;
    const u32 kx = tid / CGX, cx = tid % CGX;  // sums: keys 4 kx.., columns 4 cx..
    const u32 tiles = tl_fa_tiles(nk, BN), group = heads / kv_heads;
    for (u64 job = blockIdx.x; job < (u64)batch * kv_heads * tiles; job += gridDim.x) {
        const auto [bg, b, g, j0, cols] = tl_fa_job(job, tiles, BN, nk, kv_heads, false);
        const u32* mk = mask + (u64)b * mstride;  // batch element b's words
        __syncthreads();  // the previous job's reads are done
        tl_fa_load_swz2<BN, DM>(ks, vs, k, v, b, j0, cols, g, nk, kv_heads, d);
        float ak[4][4], av[4][4];
        for (u32 a = 0; a < 4; ++a)
            for (u32 e = 0; e < 4; ++e) ak[a][e] = av[a][e] = 0.0f;
        // The query tiles from the first that the block's first key tile meets (causal); this
        // thread's keys 4 kx.. lie in one tile of 16 (from `mine`), which adds the query tiles
        // it meets (tl_fa_meet), as the 16-key tiles of the order.
        const u32 mine = (j0 + kx * 4) / TL_FA_T * TL_FA_T;
        const u32 istart = tl_fa_qstart(mode, offset, j0, nq);
        // A step is one query tile of one head: the group's heads h0.. in increasing order,
        // each head's `qtiles` tiles from istart in order (one chain per output).
        const u32 h0 = g * group, qtiles = tl_fa_tiles(nq - istart, BM);
        const u32 steps = group * qtiles;
        constexpr u32 NL = BM * DM / TL_BLOCK;  // staged floats a thread
        float qreg[NL], greg[NL];
        tl_fa_stage<BM, DM>(qreg, q, b, istart, tl_fa_len(nq, istart), h0, nq, heads, d);
        tl_fa_stage<BM, DM>(greg, go, b, istart, tl_fa_len(nq, istart), h0, nq, heads, d);
        for (u32 st = 0; st < steps; ++st) {
            const u32 h = h0 + st / qtiles, i0 = istart + st % qtiles * BM;
            const u64 bh = (u64)b * heads + h;
            const u32 rows = tl_fa_len(nq, i0);
            __syncthreads();  // the previous step's reads of qs, gs, ps, dss are done
            for (u32 u = 0; u < NL; ++u) {
                const u32 e = tid + TL_BLOCK * u, r = e / DM, c = e % DM;
                qs[r * DM + (c ^ tl_fa_swz(r))] = qreg[u];
                gs[r * DM + (c ^ tl_fa_swz(r))] = greg[u];
            }
            __syncthreads();
            const bool live = sr < rows;  // the row's statistics, read before the sums
            const float l = live ? lse[bh * nq + i0 + sr] : -INFINITY;
            const float dl = live ? delta[bh * nq + i0 + sr] : 0.0f;
            float s[KA], dp[KA];
            for (u32 a = 0; a < KA; ++a) s[a] = dp[a] = 0.0f;
            const float* qrow = &qs[sr * DM];
            const float* grow = &gs[sr * DM];
            const u32 rsw = tl_fa_swz(sr);
            u32 c = 0;
            TL_FA_UNROLL2
            for (; c + 4 <= d; c += 4) {  // four columns at once, each chain in order
                float qq[4], gg[4];
                ld4(&qrow[c ^ rsw], qq);
                ld4(&grow[c ^ rsw], gg);
                for (u32 a = 0; a < KA; ++a) {
                    const u32 j = sk + 4 * a;
                    float kr[4], vr[4];
                    ld4(&ks[j * DM + (c ^ tl_fa_swz(j))], kr);
                    ld4(&vs[j * DM + (c ^ tl_fa_swz(j))], vr);
                    for (u32 cc = 0; cc < 4; ++cc) {
                        s[a] = __fmaf_rn(qq[cc], kr[cc], s[a]);
                        dp[a] = __fmaf_rn(gg[cc], vr[cc], dp[a]);
                    }
                }
            }
            for (; c < d; ++c) {
                const float qq = qrow[c ^ rsw], gg = grow[c ^ rsw];
                for (u32 a = 0; a < KA; ++a) {
                    const u32 j = sk + 4 * a;
                    s[a] = __fmaf_rn(qq, ks[j * DM + (c ^ tl_fa_swz(j))], s[a]);
                    dp[a] = __fmaf_rn(gg, vs[j * DM + (c ^ tl_fa_swz(j))], dp[a]);
                }
            }
            for (u32 a = 0; a < KA; ++a) {
                const u32 j = sk + 4 * a;
                float p = 0.0f, ds = 0.0f;
                if (live && j < cols && l != -INFINITY &&
                    tl_fa_allowed(mk, mode, offset, nk, i0 + sr, j0 + j)) {
                    p = expf(s[a] * scale - l);
                    ds = p * (dp[a] - dl) * scale;
                }
                ps[sr * BN + (j ^ rsw)] = tl_fa_round(p, mode);
                dss[sr * BN + (j ^ rsw)] = tl_fa_round(ds, mode);
            }
            __syncthreads();
            if (st + 1 < steps) {  // the next step's Q and dO rows, in flight during the sums
                const u32 hn = h0 + (st + 1) / qtiles, in = istart + (st + 1) % qtiles * BM;
                const u32 nr = tl_fa_len(nq, in);
                tl_fa_stage<BM, DM>(qreg, q, b, in, nr, hn, nq, heads, d);
                tl_fa_stage<BM, DM>(greg, go, b, in, nr, hn, nq, heads, d);
            }
            if (tl_fa_meet(mode, offset, i0 + rows, mine)) {
                const auto row = [&](u32 r) {
                    float pr[4], dr[4], qr[4], gr[4];
                    ld4(&ps[r * BN + ((kx * 4) ^ tl_fa_swz(r))], pr);
                    ld4(&dss[r * BN + ((kx * 4) ^ tl_fa_swz(r))], dr);
                    ld4(&qs[r * DM + ((cx * 4) ^ tl_fa_swz(r))], qr);
                    ld4(&gs[r * DM + ((cx * 4) ^ tl_fa_swz(r))], gr);
                    for (u32 a = 0; a < 4; ++a)
                        for (u32 e = 0; e < 4; ++e) {
                            ak[a][e] = __fmaf_rn(dr[a], qr[e], ak[a][e]);
                            av[a][e] = __fmaf_rn(pr[a], gr[e], av[a][e]);
                        }
                };
                if (rows == TL_FA_T) {  // a whole tile: rows in order, unrolled
                    TL_FA_UNROLL
                    for (u32 r = 0; r < TL_FA_T; ++r) row(r);
                } else {
                    for (u32 r = 0; r < rows; ++r) row(r);
                }
            }
            if constexpr (DQ) {  // causal: keys from the tile's kend on are masked for all
                const u32 ke = tl_fa_kend(mode, offset, i0 + rows, nk);
                const u32 keys = ke <= j0 ? 0u : ke - j0 < cols ? ke - j0 : cols;
                tl_fa_dq_atomic<BN, DM>(dss, ks, dq, b, h, i0, rows, keys, nq, heads, d);
            }
        }
        for (u32 a = 0; a < 4; ++a) {
            const u32 j = kx * 4 + a;
            if (j >= cols) continue;
            for (u32 e = 0; e < 4; ++e) {
                const u32 c = cx * 4 + e;
                if (c < d) {
                    const u64 at = tl_fa_at(b, j0 + j, g, c, nk, kv_heads, d);
                    dk[at] = ak[a][e];
                    dv[at] = av[a][e];
                }
            }
        }
    }
}

// dQ of the fused attention, and delta_i = dot(dO_i, O_i) (which tl_flash_bwd_kv reads):
// blocks of 64 query rows when d <= 64 (tl_fa_bwd_q64), else tiles of 16 (tl_fa_bwd_q16).
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_bwd_q(const float* q, const float* k, const float* v,
                                          const float* o, const float* go, const float* lse,
                                          const u32* mask, float* dq, float* delta, u32 batch,
                                          u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                          u32 mstride, float scale) {
    constexpr u32 A = TL_FA_BWD64_SMEM, B = TL_FA_BWD16_SMEM;
    __shared__ __align__(16) float smem[A > B ? A : B];
    if (d == 64)
        tl_fa_bwd_q64<64, 64>(q, k, v, o, go, lse, mask, dq, delta, batch, nq, nk, heads, kv_heads, d,
                              mode, offset, mstride, scale, smem);
    else if (d < 64)
        tl_fa_bwd_q64<64, 0>(q, k, v, o, go, lse, mask, dq, delta, batch, nq, nk, heads, kv_heads, d,
                             mode, offset, mstride, scale, smem);
    else
        tl_fa_bwd_q16(q, k, v, o, go, lse, mask, dq, delta, batch, nq, nk, heads, kv_heads, d, mode,
                      offset, mstride, scale, smem);
}

// tl_flash_bwd_q for 64 < d <= 128 on blocks of 64 query rows (tl_fa_bwd_q64 with DM = 128),
// in TL_FA_BWD_Q_SMEM(128) floats of dynamic shared memory: the same bits as the tiles of 16.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_bwd_q_wide(const float* q, const float* k, const float* v,
                                          const float* o, const float* go, const float* lse,
                                          const u32* mask, float* dq, float* delta, u32 batch,
                                          u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode, int offset,
                                          u32 mstride, float scale) {
    TL_DYNAMIC_SHARED(float, smem);
    tl_fa_bwd_q64<TL_FA_DMAX, 0>(q, k, v, o, go, lse, mask, dq, delta, batch, nq, nk, heads, kv_heads, d,
                                 mode, offset, mstride, scale, smem);
}

// dK and dV of the fused attention (reads delta from tl_flash_bwd_q): blocks of 64 keys when
// d <= 64 (tl_fa_bwd_kv64), else tiles of 16 (tl_fa_bwd_kv16).
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_bwd_kv(const float* q, const float* k, const float* v,
                                           const float* go, const float* lse, const float* delta,
                                           const u32* mask, float* dk, float* dv, u32 batch,
                                           u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode,
                                           int offset, u32 mstride, float scale) {
    constexpr u32 A = TL_FA_BWD64_SMEM, B = TL_FA_BWD16_SMEM;
    __shared__ __align__(16) float smem[A > B ? A : B];
    if (d == 64)
        tl_fa_bwd_kv64<64, 64, 64>(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk, heads, kv_heads, d,
                                   mode, offset, mstride, scale, smem);
    else if (d < 64)
        tl_fa_bwd_kv64<64, 64, 0>(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk, heads, kv_heads, d,
                                  mode, offset, mstride, scale, smem);
    else
        tl_fa_bwd_kv16(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk, heads, kv_heads, d, mode,
                       offset, mstride, scale, smem);
}

// tl_flash_bwd_kv for 64 < d <= 128 on blocks of 32 keys (tl_fa_bwd_kv64 with BN = 32,
// DM = 128), in TL_FA_BWD_KV_SMEM(32, 128) floats of dynamic shared memory: the same bits as
// the tiles of 16.
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_bwd_kv_wide(const float* q, const float* k, const float* v,
                                           const float* go, const float* lse, const float* delta,
                                           const u32* mask, float* dk, float* dv, u32 batch,
                                           u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d, u32 mode,
                                           int offset, u32 mstride, float scale) {
    TL_DYNAMIC_SHARED(float, smem);
    tl_fa_bwd_kv64<32, TL_FA_DMAX, 0>(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk,
                                      heads, kv_heads, d, mode, offset, mstride, scale, smem);
}

// ---- Backward in one pass (deterministic reductions off; d <= 64) ------------------------------
//
// FlashAttention-2's order of work: tl_flash_bwd_delta writes delta and zeroes dQ, then
// tl_flash_bwd_atomic takes a block of 64 keys of one key head a job as tl_flash_bwd_kv does
// (the same scores, P, dS and dK, dV sums over the group's query heads: tl_fa_bwd_kv64 with
// DQ) and adds each step's dS K into the step's query head's dQ with atomicAdd
// (tl_fa_dq_atomic): five tile products a step instead of the two kernels'
// seven. dK, dV and delta have the two-kernel path's bits; dQ's sum over key blocks is in the
// order the atomics land (device/cuda/flash.rs selects it; the sim has no twin of it).

// delta_i = dot(dO_i, O_i) (the fma chain of tl_fa_bwd_q64) and row i of dQ zeroed: one thread
// per query row (b, i, h) of nq, grid-stride.
extern "C" __global__ void tl_flash_bwd_delta(const float* o, const float* go, float* dq,
                                              float* delta, u32 batch, u32 nq, u32 heads, u32 d) {
    TL_GRID_STRIDE(t, (u64)batch * nq * heads) {
        const u32 h = (u32)(t % heads), i = (u32)((t / heads) % nq), b = (u32)(t / heads / nq);
        const u64 at = t * d;
        float dl = 0.0f;
        for (u32 c = 0; c < d; ++c) {
            dl = __fmaf_rn(go[at + c], o[at + c], dl);
            dq[at + c] = 0.0f;
        }
        delta[((u64)b * heads + h) * nq + i] = dl;
    }
}

// dQ, dK and dV of the fused attention for d <= 64 (reads delta, adds into the dQ that
// tl_flash_bwd_delta zeroed). Never launched for d > 64 (the two kernels run there).
extern "C" __global__ void __launch_bounds__(TL_BLOCK, 2) tl_flash_bwd_atomic(const float* q, const float* k, const float* v,
                                               const float* go, const float* lse, const float* delta,
                                               const u32* mask, float* dq, float* dk, float* dv,
                                               u32 batch, u32 nq, u32 nk, u32 heads, u32 kv_heads, u32 d,
                                               u32 mode, int offset, u32 mstride, float scale) {
    __shared__ __align__(16) float smem[TL_FA_BWD_KV_SMEM(64, 64)];
    if (d == 64)
        tl_fa_bwd_kv64<64, 64, 64, true>(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk,
                                         heads, kv_heads, d, mode, offset, mstride, scale, smem, dq);
    else if (d < 64)
        tl_fa_bwd_kv64<64, 64, 0, true>(q, k, v, go, lse, delta, mask, dk, dv, batch, nq, nk,
                                        heads, kv_heads, d, mode, offset, mstride, scale, smem, dq);
}
