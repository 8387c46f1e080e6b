// Pointwise kernels: one element per grid-stride iteration. Each body is the twin of the
// function of the same name in crates/tl-tape-cuda/src/device/sim/pointwise.rs.
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"
#include "nan.cuh"
#include "approx.cuh"

__device__ __forceinline__ float tl_sigmoid_f(float x) { return tl_sigmoid_approx(x); }
__device__ __forceinline__ float tl_softplus_f(float x) { return tl_softplus_approx(x); }
__device__ __forceinline__ float tl_sign_f(float x) {
    return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

#define TL_UNARY(name, expr)                                                   \
    extern "C" __global__ void tl_##name(const float* x, float* out, u64 n) {  \
        TL_GRID_STRIDE(i, n) {                                                 \
            float v = x[i];                                                    \
            out[i] = (expr);                                                   \
        }                                                                      \
    }

TL_UNARY(abs, fabsf(v))
TL_UNARY(sqrt, v != v ? v : sqrtf(fmaxf(v, 0.0f)))
TL_UNARY(exp, expf(v))
TL_UNARY(log, logf(v))
TL_UNARY(inv, 1.0f / v)
TL_UNARY(relu, tl_relu_f(v))
TL_UNARY(sigmoid, tl_sigmoid_f(v))
TL_UNARY(tanh, tl_tanh_approx(v))
TL_UNARY(softplus, tl_softplus_f(v))

extern "C" __global__ void tl_safe_log(const float* x, float* out, u64 n, float eps) {
    TL_GRID_STRIDE(i, n) { out[i] = tl_log_approx(tl_softplus_f(x[i]) + eps); }
}
extern "C" __global__ void tl_clamp(const float* x, float* out, u64 n, float lo, float hi) {
    TL_GRID_STRIDE(i, n) { out[i] = tl_min_f(hi, tl_max_f(lo, x[i])); }
}
extern "C" __global__ void tl_scale(const float* x, float* out, u64 n, float c) {
    TL_GRID_STRIDE(i, n) { out[i] = c * x[i]; }
}
// x as a product under autocast reads it (tl_spec::precision::Precision::round; sim: map1
// "round"): prec 1 bf16 (nearest, ties to even), 2 TF32 (nearest, ties away), else unchanged.
extern "C" __global__ void tl_round(const float* x, float* out, u64 n, u32 prec) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = prec == 1u   ? __bfloat162float(__float2bfloat16(v))
                 : prec == 2u ? nvcuda::wmma::__float_to_tf32(v)
                              : v;
    }
}
extern "C" __global__ void tl_full(float* out, u64 n, float v) {
    TL_GRID_STRIDE(i, n) { out[i] = v; }
}

// Unary backward: x (or the output y) and the cotangent g.
#define TL_UNARY_BWD(name, expr)                                                           \
    extern "C" __global__ void tl_##name(const float* x, const float* g, float* out, u64 n) { \
        TL_GRID_STRIDE(i, n) {                                                             \
            float v = x[i];                                                                \
            float gi = g[i];                                                               \
            out[i] = (expr);                                                               \
        }                                                                                  \
    }

TL_UNARY_BWD(abs_bwd, tl_sign_f(v) * gi)
TL_UNARY_BWD(sqrt_bwd, v > 0.0f ? gi / (2.0f * sqrtf(v)) : 0.0f)
TL_UNARY_BWD(relu_bwd, v > 0.0f ? gi : 0.0f)
TL_UNARY_BWD(inv_bwd, -gi / (v * v))
TL_UNARY_BWD(sigmoid_bwd, gi * (v * (1.0f - v)))
TL_UNARY_BWD(tanh_bwd, gi * (1.0f - v * v))
TL_UNARY_BWD(softplus_bwd, gi * tl_sigmoid_f(v))

extern "C" __global__ void tl_clamp_bwd(const float* x, const float* g, float* out, u64 n,
                                        float lo, float hi) {
    TL_GRID_STRIDE(i, n) { out[i] = (x[i] > lo && x[i] < hi) ? g[i] : 0.0f; }
}
extern "C" __global__ void tl_safe_log_bwd(const float* x, const float* g, float* out, u64 n,
                                           float eps) {
    TL_GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = g[i] * (tl_sigmoid_f(v) / (tl_softplus_f(v) + eps));
    }
}

// Binary, equal lengths.
#define TL_BINARY(name, expr)                                                               \
    extern "C" __global__ void tl_##name(const float* a, const float* b, float* out, u64 n) { \
        TL_GRID_STRIDE(i, n) {                                                              \
            float x = a[i];                                                                 \
            float y = b[i];                                                                 \
            out[i] = (expr);                                                                \
        }                                                                                   \
    }

TL_BINARY(add, x + y)
TL_BINARY(sub, x - y)
TL_BINARY(mul, x * y)
TL_BINARY(div, x / y)
TL_BINARY(max, tl_max_f(x, y))
TL_BINARY(min, tl_min_f(x, y))

extern "C" __global__ void tl_axpy(const float* a, const float* b, float* out, u64 n, float c) {
    TL_GRID_STRIDE(i, n) { out[i] = a[i] + c * b[i]; }
}
// y <- y + c * x in place; y and x may alias (each element reads before it writes).
extern "C" __global__ void tl_axpy_assign(float* y, const float* x, u64 n, float c) {
    TL_GRID_STRIDE(i, n) { y[i] = y[i] + c * x[i]; }
}

// y_t <- y_t + c * x_t for the pairs t < count, pair t over blockIdx.y: one launch for a list
// of tensors (an optimizer step over every parameter, PyTorch's multi-tensor "foreach" apply).
// Each element is computed as tl_axpy_assign computes it. Unused slots are never read. No y may
// be another pair's y or x (the caller launches such pairs one at a time).
#define TL_PAIR(k) float *y##k, const float *x##k, u64 n##k
extern "C" __global__ void tl_axpy_assign_list(float c, u32 count, TL_PAIR(0), TL_PAIR(1),
                                               TL_PAIR(2), TL_PAIR(3), TL_PAIR(4), TL_PAIR(5),
                                               TL_PAIR(6), TL_PAIR(7)) {
    const u32 t = blockIdx.y;
    if (t >= count) return;
    // A switch, not arrays indexed by t: those live in local memory, which every thread would
    // fill (24 words each) before reading one slot; on an H100 that made the launch 25 times
    // slower than the arithmetic.
    float* y;
    const float* x;
    u64 n;
    switch (t) {
#define TL_SLOT(k) \
    case k:        \
        y = y##k;  \
        x = x##k;  \
        n = n##k;  \
        break;
        TL_SLOT(0) TL_SLOT(1) TL_SLOT(2) TL_SLOT(3) TL_SLOT(4) TL_SLOT(5) TL_SLOT(6) TL_SLOT(7)
#undef TL_SLOT
        default:
            return;
    }
    TL_GRID_STRIDE(i, n) { y[i] = y[i] + c * x[i]; }
}
#undef TL_PAIR

// Binary backward: both cotangents at once.
extern "C" __global__ void tl_div_bwd(const float* a, const float* b, const float* g, float* da,
                                      float* db, u64 n) {
    TL_GRID_STRIDE(i, n) {
        float x = a[i], y = b[i], gi = g[i];
        da[i] = gi / y;
        db[i] = -gi * x / (y * y);
    }
}
__device__ __forceinline__ void tl_max_split(float x, float y, float gi, float* dx, float* dy) {
    if (x > y) {
        *dx = gi;
        *dy = 0.0f;
    } else if (x == y) {
        *dx = 0.5f * gi;
        *dy = 0.5f * gi;
    } else if (x < y) {
        *dx = 0.0f;
        *dy = gi;
    } else {  // a NaN: neither side
        *dx = 0.0f;
        *dy = 0.0f;
    }
}
extern "C" __global__ void tl_max_bwd(const float* a, const float* b, const float* g, float* da,
                                      float* db, u64 n) {
    TL_GRID_STRIDE(i, n) { tl_max_split(a[i], b[i], g[i], &da[i], &db[i]); }
}
extern "C" __global__ void tl_min_bwd(const float* a, const float* b, const float* g, float* da,
                                      float* db, u64 n) {
    // min_bwd(a, b) = max_bwd(b, a) with its outputs kept in (a, b) order: when b > a the
    // first output, g, is a's (sim: pointwise::min_bwd).
    TL_GRID_STRIDE(i, n) { tl_max_split(b[i], a[i], g[i], &da[i], &db[i]); }
}
