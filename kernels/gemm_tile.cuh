// The register-blocked tile of the GEMM kernels (kernels/linalg.cu: tl_gemm, tl_gemm_wide),
// shared with the implicit-GEMM convolutions that run the same arithmetic on a product whose
// operands are gathered on the fly (kernels/conv.cu: tl_conv_implicit, _dx, _dw).
//
// 256 threads (16 x 16) a block; thread (ty, tx) = (threadIdx.x / 16, threadIdx.x % 16) keeps
// TM x TN outputs in registers. The depth is walked in k-slices of BK staged in shared memory:
// As[buf][p][row] holds op(a) along its output rows, Bs[buf][p][col] op(b) along its output
// columns (rows padded by 4 floats: 16-byte aligned for `ld4`). Each output accumulates over p
// in increasing order as fma(a, b, acc), one rounding a term (__fmaf_rn; f32::mul_add in the
// simulation device).
#pragma once

#include "common.cuh"

// The output row (column) of a thread's i-th register: four consecutive ones, then the next
// four 64 further on, so that a warp's shared-memory reads are consecutive.
__device__ __forceinline__ u32 reg_pos(u32 t, int i) {
    return (u32)(i / 4) * 64 + t * 4 + (u32)(i % 4);
}

// Rows [0, pend) of one staged k-slice into the thread's outputs: for each slice row p in
// increasing order, acc[i][j] = fma(op(a)[row i, p], op(b)[p, column j], acc[i][j]).
template <int TM, int TN, int LDA, int LDB>
__device__ __forceinline__ void tile_fma(const float (*as)[LDA], const float (*bs)[LDB], u32 pend,
                                         float (&acc)[TM][TN]) {
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (u32 p = 0; p < pend; ++p) {
        float ar[TM], br[TN];
        for (int i = 0; i < TM; i += 4) ld4(&as[p][reg_pos(ty, i)], &ar[i]);
        for (int j = 0; j < TN; j += 4) ld4(&bs[p][reg_pos(tx, j)], &br[j]);
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) acc[i][j] = __fmaf_rn(ar[i], br[j], acc[i][j]);
    }
}

// The double-buffered k loop over the depth run [kb, ke) in slices of BK: slice p0 = kb, kb + BK,
// ... is computed (`compute(buf, pend)`: pend of its rows inside the run) out of one of the two
// shared buffers while the next one is fetched into registers (`fetch(p0)`: the thread's
// elements of the slice from p0, zeros outside the operands) and then staged into the other
// buffer (`stage(buf)`); one barrier a slice (stage writes the buffer computed one slice before,
// behind that slice's barrier). Shared by tile_run and the tensor-core GEMM (linalg.cu, tc).
template <int BK, typename Fetch, typename Stage, typename Compute>
__device__ __forceinline__ void k_slices(u32 kb, u32 ke, Fetch& fetch, Stage& stage,
                                         Compute& compute) {
    fetch(kb);
    stage(0);
    __syncthreads();
    int buf = 0;
    for (u32 p0 = kb; p0 < ke; p0 += BK) {
        const bool more = ke - p0 > BK;
        if (more) fetch(p0 + BK);
        compute(buf, more ? (u32)BK : ke - p0);
        if (more) stage(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
}

// The k loop (k_slices) over the depth run [kb, ke) into acc (zeroed first). Only the slice's
// rows inside the run are summed: acc + 0·b could turn a -0 sum into +0 (and 0·inf is NaN).
template <int BK, int LDA, int LDB, int TM, int TN, typename Fetch, typename Stage>
__device__ __forceinline__ void tile_run(float (*As)[BK][LDA], float (*Bs)[BK][LDB], u32 kb, u32 ke,
                                         Fetch& fetch, Stage& stage, float (&acc)[TM][TN]) {
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    auto compute = [&](int buf, u32 pend) { tile_fma(As[buf], Bs[buf], pend, acc); };
    k_slices<BK>(kb, ke, fetch, stage, compute);
}
