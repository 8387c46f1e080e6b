// Norm family: layer/batch norm statistics, affine map and closed-form backward, and the masked
// row softmax (sim: crates/tl-tape-cuda/src/device/sim/norm.rs; layout: device/norm.rs).
//
// x is `outer` blocks of `groups` groups of `seg` contiguous elements; element e of group k is
// x[((e / seg) * groups + k) * seg + e % seg], e < m = outer * seg. gamma/beta are indexed by
// the position in the segment (per_column != 0, layer norm) or by the group (batch norm).
//
// A group is centred on its first element x0 (sim: norm::Centre): the statistics hold the mean
// d of x - x0, and every kernel that normalizes computes (x - x0) - d, x0 read from x (exact to
// the rounding of the group's spread, however far its mean is from 0).
//
// The kernels that normalize take `centred` (sim: NormLayout::centred): 1 for layer and batch
// norm; 0 for rmsNorm, where x0 = 0 and d = 0, so (x - 0) - 0 = x exactly: no mean pass (the
// statistics' d entries are written as 0), the variance is sum x^2 / m, no beta is read or added
// (the host passes a live buffer, gamma's, in beta's place: the emulator requires every pointer
// argument to be a live allocation), and tl_norm_bwd_x drops its sum(g * gamma) term.
//
// Determinism: no kernel here uses atomics, so the default path IS the fixed-order path:
// per-group sums fold per thread (e = t, t + 256, ...) then the block tree of common.cuh, or,
// split over several blocks (the tl_norm_split_* kernels below), the same per chunk and the
// chunks' sums in increasing order; the gamma/beta sums are one thread per entry in increasing
// index order.
#include "common.cuh"

// Block reduction of f(e) for e < count: thread t folds f(t), f(t + 256), ... from identity.
#define TL_NORM_REDUCE(result, count, identity, op, fe)                 \
    do {                                                                \
        float acc_ = (identity);                                        \
        for (u32 e = threadIdx.x; e < (count); e += TL_BLOCK) {         \
            acc_ = op(acc_, (fe));                                      \
        }                                                               \
        result = tl_block_tree(acc_, (identity), op, smem);             \
    } while (0)

__device__ __forceinline__ u64 tl_norm_index(u32 k, u32 e, u32 groups, u32 seg) {
    return ((u64)(e / seg) * groups + k) * seg + e % seg;
}

__device__ __forceinline__ u32 tl_norm_feature(u64 i, u32 groups, u32 seg, u32 per_column) {
    return per_column ? (u32)(i % seg) : (u32)((i / seg) % groups);
}

// Group k's first element x0, the shift of a non-empty group (0 where not centred; sim:
// norm::shift).
__device__ __forceinline__ float tl_norm_kept_shift(const float* x, u32 k, u32 seg, u32 centred) {
    return centred ? x[(u64)k * seg] : 0.0f;
}

// Group k's shift x0 (0 for an empty group or where not centred; sim: norm::shift).
__device__ __forceinline__ float tl_norm_shift(const float* x, u32 k, u32 m, u32 seg,
                                               u32 centred) {
    return m > 0 ? tl_norm_kept_shift(x, k, seg, centred) : 0.0f;
}

// Group k's d from the statistics (0, stats[k] not read, where not centred; sim:
// norm::Centre::kept).
__device__ __forceinline__ float tl_norm_kept_mean(const float* stats, u32 k, u32 centred) {
    return centred ? stats[k] : 0.0f;
}

// The centred value (x - x0) - d, in this order (sim: norm::Centre::of).
__device__ __forceinline__ float tl_norm_centre(float x, float shift, float shifted_mean) {
    return (x - shift) - shifted_mean;
}

// Group k's shift x0, the mean d of x - x0, and the biased variance max(sum ((x - x0) - d)^2 /
// m, 0), two passes; where not centred x0 = d = 0 and one pass, max(sum x^2 / m, 0) (sim:
// norm::group_moments). Every thread of the block gets all three.
__device__ void tl_norm_group_moments(const float* x, u32 k, u32 m, u32 groups, u32 seg,
                                      u32 centred, float* smem, float* shift_out,
                                      float* mean_out, float* var_out) {
    const float mf = (float)m;
    const float x0 = tl_norm_shift(x, k, m, seg, centred);
    float d = 0.0f, sq;
    if (centred) {
        float s;
        TL_NORM_REDUCE(s, m, 0.0f, AddOp(), x[tl_norm_index(k, e, groups, seg)] - x0);
        d = s / mf;
    }
    TL_NORM_REDUCE(sq, m, 0.0f, AddOp(),
                   tl_norm_centre(x[tl_norm_index(k, e, groups, seg)], x0, d) *
                       tl_norm_centre(x[tl_norm_index(k, e, groups, seg)], x0, d));
    *shift_out = x0;
    *mean_out = d;
    *var_out = fmaxf(sq / mf, 0.0f);
}

// Group k's shift x0, the mean d of x - x0, and 1 / sqrt(max(var, 0) + eps), two passes (one
// where not centred); every thread of the block gets all three.
__device__ void tl_norm_group_stats(const float* x, u32 k, u32 m, u32 groups, u32 seg, float eps,
                                    u32 centred, float* smem, float* shift_out, float* mean_out,
                                    float* rstd_out) {
    float var;
    tl_norm_group_moments(x, k, m, groups, seg, centred, smem, shift_out, mean_out, &var);
    *rstd_out = 1.0f / sqrtf(var + eps);
}

// ((x - x0) - d) * rstd * gamma, in this order: the map where not centred (x0 = d = 0, so
// x * rstd * gamma), no beta (sim: norm::apply).
__device__ __forceinline__ float tl_norm_scale(float x, float shift, float shifted_mean,
                                               float rstd, float gamma) {
    return tl_norm_centre(x, shift, shifted_mean) * rstd * gamma;
}

// ((x - x0) - d) * rstd * gamma + beta, in this order (sim: norm::apply).
__device__ __forceinline__ float tl_norm_affine(float x, float shift, float shifted_mean,
                                                float rstd, float gamma, float beta) {
    return tl_norm_scale(x, shift, shifted_mean, rstd, gamma) + beta;
}

// stats[k] = d (the mean of x - x0; 0 where not centred), stats[groups + k] = 1 / sqrt(max(var,
// 0) + eps), one block per group.
extern "C" __global__ void tl_norm_stats(const float* x, float* stats, u32 outer, u32 groups,
                                         u32 seg, float eps, u32 centred) {
    __shared__ float smem[33];
    for (u32 k = blockIdx.x; k < groups; k += gridDim.x) {
        float x0, mean, rstd;
        tl_norm_group_stats(x, k, outer * seg, groups, seg, eps, centred, smem, &x0, &mean,
                            &rstd);
        if (threadIdx.x == 0) {
            stats[k] = mean;
            stats[groups + k] = rstd;
        }
    }
}

// batchMoments: out[k] = x0 + d (the mean), out[groups + k] = max(var, 0) (biased), one block
// per group: the sums of tl_norm_stats (centred), without eps.
extern "C" __global__ void tl_norm_moments(const float* x, float* out, u32 outer, u32 groups,
                                           u32 seg) {
    __shared__ float smem[33];
    for (u32 k = blockIdx.x; k < groups; k += gridDim.x) {
        float x0, mean, var;
        tl_norm_group_moments(x, k, outer * seg, groups, seg, 1, smem, &x0, &mean, &var);
        if (threadIdx.x == 0) {
            out[k] = x0 + mean;
            out[groups + k] = var;
        }
    }
}

// batchMoments' VJP: dx = (g[k] + 2 * g[groups + k] * (x - mean[k])) / m, in this order,
// grid-stride over the n elements (moments = the forward's output, [means, variances]).
extern "C" __global__ void tl_norm_moments_bwd(const float* x, const float* moments,
                                               const float* g, float* dx, u64 n, u32 groups,
                                               u32 seg, u32 m) {
    const float mf = (float)m;
    TL_GRID_STRIDE(i, n) {
        const u32 k = (u32)((i / seg) % groups);
        dx[i] = (g[k] + 2.0f * g[groups + k] * (x[i] - moments[k])) / mf;
    }
}

// Running statistics (sim: norm::running_update_moments, the rule
// tl_spec::ops::norm::running_update): BatchNorm's running mean and variance in one launch from
// moments = [means (n), biased variances (n)] (batchMoments' (2, C)). Per element i, in double
// and rounded once to float: out_mean = (1 - momentum) * mean + momentum * moments[i]; the
// variance s = moments[n + i] made unbiased, s * num / den, and out_var = (1 - momentum) * var
// + momentum * s, var kept where den == 0 (one element per channel) or s is NaN. Grid-stride
// over n.
extern "C" __global__ void tl_running_update_moments(const float* mean, const float* var,
                                                     const float* moments, float* out_mean,
                                                     float* out_var, u64 n, double momentum,
                                                     double num, double den) {
    TL_GRID_STRIDE(i, n) {
        const double m = (double)mean[i];
        out_mean[i] = (float)((1.0 - momentum) * m + momentum * (double)moments[i]);
        const double v = (double)var[i];
        double s = (double)moments[n + i];
        bool keep = den == 0.0;
        if (!keep) s = s * num / den;
        keep = keep || s != s;
        out_var[i] = keep ? (float)v : (float)((1.0 - momentum) * v + momentum * s);
    }
}

// BatchNorm's eval scale from its running variance (sim: norm::running_inv_std, the rule
// tl_spec::ops::norm::running_inv_std): out = 1 / sqrt(var + eps) in double, rounded once to
// float. Grid-stride over n.
extern "C" __global__ void tl_running_inv_std(const float* var, float* out, u64 n, double eps) {
    TL_GRID_STRIDE(i, n) { out[i] = (float)(1.0 / sqrt((double)var[i] + eps)); }
}

// y = ((x - x0) - d) * rstd * gamma + beta, grid-stride over the n elements; where not centred
// y = x * rstd * gamma (beta not read).
extern "C" __global__ void tl_norm_apply(const float* x, const float* stats, const float* gamma,
                                         const float* beta, float* y, u64 n, u32 groups, u32 seg,
                                         u32 per_column, u32 centred) {
    TL_GRID_STRIDE(i, n) {
        const u32 k = (u32)((i / seg) % groups);
        const u32 f = tl_norm_feature(i, groups, seg, per_column);
        const float x0 = tl_norm_kept_shift(x, k, seg, centred);
        const float d = tl_norm_kept_mean(stats, k, centred);
        if (centred) {
            y[i] = tl_norm_affine(x[i], x0, d, stats[groups + k], gamma[f], beta[f]);
        } else {
            y[i] = tl_norm_scale(x[i], x0, d, stats[groups + k], gamma[f]);
        }
    }
}

// tl_norm_stats and tl_norm_apply in one launch for short groups (NormLayout::fused_forward):
// each group's block writes its statistics, then normalizes its own elements.
extern "C" __global__ void tl_norm_fwd(const float* x, const float* gamma, const float* beta,
                                       float* y, float* stats, u32 outer, u32 groups, u32 seg,
                                       u32 per_column, float eps, u32 centred) {
    __shared__ float smem[33];
    const u32 m = outer * seg;
    for (u32 k = blockIdx.x; k < groups; k += gridDim.x) {
        float x0, mean, rstd;
        tl_norm_group_stats(x, k, m, groups, seg, eps, centred, smem, &x0, &mean, &rstd);
        if (threadIdx.x == 0) {
            stats[k] = mean;
            stats[groups + k] = rstd;
        }
        for (u32 e = threadIdx.x; e < m; e += TL_BLOCK) {
            const u64 i = tl_norm_index(k, e, groups, seg);
            const u32 f = tl_norm_feature(i, groups, seg, per_column);
            if (centred) {
                y[i] = tl_norm_affine(x[i], x0, mean, rstd, gamma[f], beta[f]);
            } else {
                y[i] = tl_norm_scale(x[i], x0, mean, rstd, gamma[f]);
            }
        }
    }
}

// dx = rstd / m * (m * g * gamma - sum(g * gamma) - xhat * sum(g * gamma * xhat)), one block
// per group, xhat = ((x - x0) - d) * rstd; where not centred (x0 = d = 0) the sum(g * gamma)
// term is neither summed nor subtracted (sim: norm::bwd_x).
extern "C" __global__ void tl_norm_bwd_x(const float* x, const float* stats, const float* gamma,
                                         const float* g, float* dx, u32 outer, u32 groups,
                                         u32 seg, u32 per_column, u32 centred) {
    __shared__ float smem[33];
    const u32 m = outer * seg;
    const float mf = (float)m;
    for (u32 k = blockIdx.x; k < groups; k += gridDim.x) {
        const float x0 = tl_norm_shift(x, k, m, seg, centred);
        const float mean = tl_norm_kept_mean(stats, k, centred);
        const float rstd = stats[groups + k];
#define TL_GH(i) (g[i] * gamma[tl_norm_feature((i), groups, seg, per_column)])
        float s1 = 0.0f, s2;
        if (centred) {
            TL_NORM_REDUCE(s1, m, 0.0f, AddOp(), TL_GH(tl_norm_index(k, e, groups, seg)));
        }
        TL_NORM_REDUCE(s2, m, 0.0f, AddOp(),
                       TL_GH(tl_norm_index(k, e, groups, seg)) *
                           (tl_norm_centre(x[tl_norm_index(k, e, groups, seg)], x0, mean) * rstd));
        const float c = rstd / mf;
        for (u32 e = threadIdx.x; e < m; e += TL_BLOCK) {
            const u64 i = tl_norm_index(k, e, groups, seg);
            const float h = tl_norm_centre(x[i], x0, mean) * rstd;
            const float t = mf * g[i] * gamma[tl_norm_feature(i, groups, seg, per_column)];
            dx[i] = c * ((centred ? t - s1 : t) - h * s2);
        }
#undef TL_GH
    }
}

// dgamma[f] = sum g * xhat, dbeta[f] = sum g over the elements of entry f, one thread per entry
// accumulating in increasing index order (the fixed order in every mode; no atomics). Where not
// centred xhat = x * rstd; dbeta is written all the same (rmsNorm's tape releases it).
extern "C" __global__ void tl_norm_bwd_affine(const float* x, const float* stats, const float* g,
                                              float* dgamma, float* dbeta, u64 features,
                                              u32 outer, u32 groups, u32 seg, u32 per_column,
                                              u32 centred) {
    TL_GRID_STRIDE(f, features) {
        float ag = 0.0f, ab = 0.0f;
        if (per_column) {
            const u32 rows = outer * groups;
            for (u32 r = 0; r < rows; ++r) {
                const u64 i = (u64)r * seg + f;
                const u32 k = r % groups;
                const float h = tl_norm_centre(x[i], tl_norm_kept_shift(x, k, seg, centred),
                                               tl_norm_kept_mean(stats, k, centred)) *
                                stats[groups + k];
                ab = ab + g[i];
                ag = ag + g[i] * h;
            }
        } else {
            const u32 m = outer * seg;
            const u32 k = (u32)f;
            const float x0 = tl_norm_shift(x, k, m, seg, centred);
            const float d = tl_norm_kept_mean(stats, k, centred);
            for (u32 e = 0; e < m; ++e) {
                const u64 i = tl_norm_index(k, e, groups, seg);
                const float h = tl_norm_centre(x[i], x0, d) * stats[groups + k];
                ab = ab + g[i];
                ag = ag + g[i] * h;
            }
        }
        dgamma[f] = ag;
        dbeta[f] = ab;
    }
}

// The same sums where each feature has many elements and the features are few (sim:
// NormLayout::affine_by_block): one block per feature f, thread t accumulating the elements
// e = t, t + 256, ... of f in increasing order from +0, then the block tree, for each sum.
extern "C" __global__ void tl_norm_bwd_affine_block(const float* x, const float* stats,
                                                    const float* g, float* dgamma, float* dbeta,
                                                    u64 features, u32 outer, u32 groups, u32 seg,
                                                    u32 per_column, u32 centred) {
    __shared__ float smem[33];
    const u32 len = per_column ? outer * groups : outer * seg;
    for (u64 f = blockIdx.x; f < features; f += gridDim.x) {
        float ag = 0.0f, ab = 0.0f;
        for (u32 e = threadIdx.x; e < len; e += TL_BLOCK) {
            const u64 i = per_column ? (u64)e * seg + f : tl_norm_index((u32)f, e, groups, seg);
            const u32 k = (u32)((i / seg) % groups);
            const float h = tl_norm_centre(x[i], tl_norm_kept_shift(x, k, seg, centred),
                                           tl_norm_kept_mean(stats, k, centred)) *
                            stats[groups + k];
            ab = ab + g[i];
            ag = ag + g[i] * h;
        }
        const float sg = tl_block_tree(ag, 0.0f, AddOp(), smem);
        const float sb = tl_block_tree(ab, 0.0f, AddOp(), smem);
        if (threadIdx.x == 0) {
            dgamma[f] = sg;
            dbeta[f] = sb;
        }
    }
}

// ---- Split group sums (sim: norm::group_sum; NormLayout::split_parts) --------------------------
//
// Where a few groups hold many elements (a batch norm's channels over N*H*W), one block a group
// leaves most of the device idle. There a group's m elements are cut into `parts` chunks of
// `chunk = ceil(m / parts)` consecutive elements (in the group's order e; the last chunks may be
// short or empty), block (p, k) reduces chunk p of group k as a whole group is reduced above
// (thread t folds the chunk's elements t, t + 256, ... from +0, then the block tree), and writes
// its sum to part[(k * parts + p) * stride + which]; the group's sum is then +0 + part 0 +
// part 1 + ..., in this order (tl_norm_fold), folded by every thread that reads it. Still no
// atomics: the order is fixed in every mode. Grids are (parts, groups).

// Block reduction of f(e) for lo <= e < hi: thread t folds f(lo + t), f(lo + t + 256), ...
#define TL_NORM_REDUCE_RANGE(result, lo, hi, fe)                        \
    do {                                                                \
        float acc_ = 0.0f;                                              \
        for (u64 e = (lo) + threadIdx.x; e < (hi); e += TL_BLOCK) {     \
            acc_ = acc_ + (fe);                                         \
        }                                                               \
        result = tl_block_tree(acc_, 0.0f, AddOp(), smem);              \
    } while (0)

// Group k's sum `which` of `stride` from its chunk sums, +0 + part 0 + part 1 + ...
__device__ __forceinline__ float tl_norm_fold(const float* part, u64 k, u32 parts, u32 stride,
                                              u32 which) {
    float s = 0.0f;
    for (u32 p = 0; p < parts; ++p) s = s + part[(k * parts + p) * stride + which];
    return s;
}

// Block (p, k)'s chunk [lo, hi) of group k's m elements.
__device__ __forceinline__ void tl_norm_chunk(u32 m, u32 chunk, u64* lo, u64* hi) {
    const u64 a = (u64)blockIdx.x * chunk;
    *lo = a < m ? a : m;
    *hi = a + chunk < m ? a + chunk : m;
}

// part[k * parts + p] = sum of x - x0 over chunk p of group k (the statistics' first pass;
// centred layouts only).
extern "C" __global__ void tl_norm_split_mean(const float* x, float* part, u32 outer, u32 groups,
                                              u32 seg, u32 parts, u32 chunk) {
    __shared__ float smem[33];
    const u32 k = blockIdx.y, m = outer * seg;
    u64 lo, hi;
    tl_norm_chunk(m, chunk, &lo, &hi);
    const float x0 = tl_norm_shift(x, k, m, seg, 1);
    float s;
    TL_NORM_REDUCE_RANGE(s, lo, hi, x[tl_norm_index(k, (u32)e, groups, seg)] - x0);
    if (threadIdx.x == 0) part[(u64)k * parts + blockIdx.x] = s;
}

// part[k * parts + p] = sum of ((x - x0) - d)^2 over chunk p of group k, d the fold of
// mean_part over m (x0 = d = 0, mean_part not read, where not centred).
extern "C" __global__ void tl_norm_split_sq(const float* x, const float* mean_part, float* part,
                                            u32 outer, u32 groups, u32 seg, u32 parts, u32 chunk,
                                            u32 centred) {
    __shared__ float smem[33];
    const u32 k = blockIdx.y, m = outer * seg;
    u64 lo, hi;
    tl_norm_chunk(m, chunk, &lo, &hi);
    const float x0 = tl_norm_shift(x, k, m, seg, centred);
    const float d = centred ? tl_norm_fold(mean_part, k, parts, 1, 0) / (float)m : 0.0f;
    float s;
    TL_NORM_REDUCE_RANGE(s, lo, hi,
                         tl_norm_centre(x[tl_norm_index(k, (u32)e, groups, seg)], x0, d) *
                             tl_norm_centre(x[tl_norm_index(k, (u32)e, groups, seg)], x0, d));
    if (threadIdx.x == 0) part[(u64)k * parts + blockIdx.x] = s;
}

// The statistics from the chunk sums, one thread a group (grid-stride over the n groups):
// d = fold(mean_part) / m (0 where not centred), var = max(fold(sq_part) / m, 0); then
// out[k] = d, out[n + k] = 1 / sqrt(var + eps) (tl_norm_stats), or with `moments` out[k] =
// x0 + d, out[n + k] = var (tl_norm_moments).
extern "C" __global__ void tl_norm_split_finish(const float* x, const float* mean_part,
                                                const float* sq_part, float* out, u64 n, u32 seg,
                                                u32 m, u32 parts, float eps, u32 centred,
                                                u32 moments) {
    const float mf = (float)m;
    TL_GRID_STRIDE(k, n) {
        const float x0 = centred ? x[k * seg] : 0.0f;
        const float d = centred ? tl_norm_fold(mean_part, k, parts, 1, 0) / mf : 0.0f;
        const float var = fmaxf(tl_norm_fold(sq_part, k, parts, 1, 0) / mf, 0.0f);
        if (moments) {
            out[k] = x0 + d;
            out[n + k] = var;
        } else {
            out[k] = d;
            out[n + k] = 1.0f / sqrtf(var + eps);
        }
    }
}

// Block (p, k)'s share of group k in the backward's split kernels: its chunk [lo, hi), the
// group's shift x0, d and rstd from the statistics (x0 = d = 0 where not centred).
struct TlNormSplitChunk {
    u32 k, m;
    u64 lo, hi;
    float x0, mean, rstd;
};

__device__ TlNormSplitChunk tl_norm_split_chunk(const float* x, const float* stats, u32 outer,
                                                u32 groups, u32 seg, u32 centred, u32 chunk) {
    TlNormSplitChunk c;
    c.k = blockIdx.y;
    c.m = outer * seg;
    tl_norm_chunk(c.m, chunk, &c.lo, &c.hi);
    c.x0 = tl_norm_shift(x, c.k, c.m, seg, centred);
    c.mean = tl_norm_kept_mean(stats, c.k, centred);
    c.rstd = stats[groups + c.k];
    return c;
}

// The block sums of a and b (per-thread partial sums) to part[(k * parts + p) * 2] and
// part[... + 1].
__device__ void tl_norm_split_put2(float a, float b, float* part, u32 k, u32 parts,
                                   float* smem) {
    const float sa = tl_block_tree(a, 0.0f, AddOp(), smem);
    const float sb = tl_block_tree(b, 0.0f, AddOp(), smem);
    if (threadIdx.x == 0) {
        part[((u64)k * parts + blockIdx.x) * 2] = sa;
        part[((u64)k * parts + blockIdx.x) * 2 + 1] = sb;
    }
}

// Block (p, k)'s two sums over its chunk in one pass: add(i, a, b) adds element i's terms to
// the thread's sums a and b (each from +0), then tl_norm_split_put2.
template <typename Add>
__device__ void tl_norm_split_sums2(const TlNormSplitChunk& c, u32 groups, u32 seg, u32 parts,
                                    float* part, float* smem, Add add) {
    float a = 0.0f, b = 0.0f;
    for (u64 e = c.lo + threadIdx.x; e < c.hi; e += TL_BLOCK)
        add(tl_norm_index(c.k, (u32)e, groups, seg), a, b);
    tl_norm_split_put2(a, b, part, c.k, parts, smem);
}

// tl_norm_bwd_x's two sums over chunk p of group k in one pass: part[(k * parts + p) * 2] =
// sum g * gamma, part[... + 1] = sum g * gamma * xhat (the first unused where not centred).
extern "C" __global__ void tl_norm_split_bwd_sums(const float* x, const float* stats,
                                                  const float* gamma, const float* g,
                                                  float* part, u32 outer, u32 groups, u32 seg,
                                                  u32 per_column, u32 centred, u32 parts,
                                                  u32 chunk) {
    __shared__ float smem[33];
    const TlNormSplitChunk c = tl_norm_split_chunk(x, stats, outer, groups, seg, centred, chunk);
    tl_norm_split_sums2(c, groups, seg, parts, part, smem, [&](u64 i, float& a1, float& a2) {
        const float gh = g[i] * gamma[tl_norm_feature(i, groups, seg, per_column)];
        a1 = a1 + gh;
        a2 = a2 + gh * (tl_norm_centre(x[i], c.x0, c.mean) * c.rstd);
    });
}

// tl_norm_bwd_x over chunk p of group k, its sums folded from tl_norm_split_bwd_sums' parts.
extern "C" __global__ void tl_norm_split_bwd_x(const float* x, const float* stats,
                                               const float* gamma, const float* g,
                                               const float* part, float* dx, u32 outer,
                                               u32 groups, u32 seg, u32 per_column, u32 centred,
                                               u32 parts, u32 chunk) {
    const TlNormSplitChunk c = tl_norm_split_chunk(x, stats, outer, groups, seg, centred, chunk);
    const float mf = (float)c.m;
    const float s1 = tl_norm_fold(part, c.k, parts, 2, 0);
    const float s2 = tl_norm_fold(part, c.k, parts, 2, 1);
    const float scale = c.rstd / mf;
    for (u64 e = c.lo + threadIdx.x; e < c.hi; e += TL_BLOCK) {
        const u64 i = tl_norm_index(c.k, (u32)e, groups, seg);
        const float h = tl_norm_centre(x[i], c.x0, c.mean) * c.rstd;
        const float t = mf * g[i] * gamma[tl_norm_feature(i, groups, seg, per_column)];
        dx[i] = scale * ((centred ? t - s1 : t) - h * s2);
    }
}

// dgamma's and dbeta's sums over chunk p of group k, where the features are the groups (batch
// norm): part[(k * parts + p) * 2] = sum g * xhat, part[... + 1] = sum g.
extern "C" __global__ void tl_norm_split_affine_sums(const float* x, const float* stats,
                                                     const float* g, float* part, u32 outer,
                                                     u32 groups, u32 seg, u32 centred, u32 parts,
                                                     u32 chunk) {
    __shared__ float smem[33];
    const TlNormSplitChunk c = tl_norm_split_chunk(x, stats, outer, groups, seg, centred, chunk);
    tl_norm_split_sums2(c, groups, seg, parts, part, smem, [&](u64 i, float& ag, float& ab) {
        ag = ag + g[i] * (tl_norm_centre(x[i], c.x0, c.mean) * c.rstd);
        ab = ab + g[i];
    });
}

// dgamma[f], dbeta[f] folded from tl_norm_split_affine_sums' parts, one thread a feature.
extern "C" __global__ void tl_norm_split_affine_finish(const float* part, float* dgamma,
                                                       float* dbeta, u64 features, u32 parts) {
    TL_GRID_STRIDE(f, features) {
        dgamma[f] = tl_norm_fold(part, f, parts, 2, 0);
        dbeta[f] = tl_norm_fold(part, f, parts, 2, 1);
    }
}

// Masked softmax of each row (rows, n). The mask is one or more matrices of mrows rows of n
// floats (row-major, nonzero = allowed: an (nq, nk) attention mask has mrows = nq rows of
// n = nk), one per batch element, which split x's rows in order into shares of `group` rows:
// row r uses row r % mrows of matrix r / group, mask row (r / group) * mrows + r % mrows
// (device/norm.rs MaskedRows::mask_row; one matrix shared by all rows: group = rows). Masked
// entries and rows with nothing allowed are exactly 0.
extern "C" __global__ void tl_masked_softmax_rows(const float* x, const float* mask, float* out,
                                                  u32 rows, u32 n, u32 mrows, u32 group) {
    __shared__ float smem[33];
    for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (u64)r * n;
        const float* ok = mask + ((u64)(r / group) * mrows + r % mrows) * n;
        float* yr = out + (u64)r * n;
        float m, s;
        TL_NORM_REDUCE(m, n, -INFINITY, MaxOp(), ok[e] != 0.0f ? xr[e] : -INFINITY);
        if (m == -INFINITY) {
            for (u32 j = threadIdx.x; j < n; j += TL_BLOCK) yr[j] = 0.0f;
            continue;
        }
        TL_NORM_REDUCE(s, n, 0.0f, AddOp(), ok[e] != 0.0f ? expf(xr[e] - m) : 0.0f);
        for (u32 j = threadIdx.x; j < n; j += TL_BLOCK)
            yr[j] = ok[j] != 0.0f ? expf(xr[j] - m) / s : 0.0f;
    }
}
