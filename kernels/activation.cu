// Activation kernels: GELU (tanh form, PyTorch `approximate="tanh"`) and SiLU, forward and
// backward, one element per grid-stride iteration. Each body is the twin of the function of
// the same name in crates/tl-tape-cuda/src/device/sim/activation.rs (same operation order;
// built with --fmad=false). The GELU's tanh is tl_tanh_approx below, the twin of
// tl_spec::approx::tanh_f32 (which the simulation device and the CPU tape's f32 gelu call), so
// GELU is bit-identical on all three; only SiLU's expf may differ from the host by a few ulp.
#include "common.cuh"

#define TL_SQRT_2_OVER_PI 0.7978845608028654f
#define TL_GELU_CUBIC 0.044715f

__device__ __forceinline__ float tl_act_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

// e^x in straight-line arithmetic, the twin of tl_spec::approx::exp_f32 (same operations in
// the same order; its doc says why each step is there). A NaN x makes k meaningless, but the
// last select returns x itself; the shifts are unsigned so no k is undefined behaviour.
__device__ __forceinline__ float tl_exp_approx(float x) {
    const float ln2_hi = 0.6933594f, ln2_lo = -2.1219444e-4f;
    const float hi = 88.72283f, lo = -103.97208f, shift = 12582912.0f;
    const float xc = x < lo ? lo : (x > hi ? hi : x);
    const float n = (xc * 1.44269504088896341f + shift) - shift;
    const float r = xc - n * ln2_hi - n * ln2_lo;
    float p = 1.9875691e-4f;
    p = p * r + 1.3981999e-3f;
    p = p * r + 8.333452e-3f;
    p = p * r + 4.1665796e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 0.5f;
    const float er = p * r * r + r + 1.0f;
    const int k = (int)n;
    const int k1 = k / 2, k2 = k - k / 2;
    const float y = er * __int_as_float((int)((unsigned)(k1 + 127) << 23)) *
                    __int_as_float((int)((unsigned)(k2 + 127) << 23));
    return x > hi ? INFINITY : (x < lo ? 0.0f : (x != x ? x : y));
}

// tanh x, the twin of tl_spec::approx::tanh_f32: Cephes' odd polynomial for |x| < 0.625, else
// 1 - 2/(e^{2|x|} + 1); the sign of x put back last.
__device__ __forceinline__ float tl_tanh_approx(float x) {
    const float a = fabsf(x);
    const float z = a * a;
    float p = -5.7049887e-3f;
    p = p * z + 2.063909e-2f;
    p = p * z - 5.3739716e-2f;
    p = p * z + 1.3331442e-1f;
    p = p * z - 3.333328e-1f;
    const float small = p * z * a + a;
    const float e = tl_exp_approx(a + a);
    const float big = 1.0f - 2.0f / (e + 1.0f);
    return copysignf(a < 0.625f ? small : big, x);
}

// tanh(sqrt(2/pi) * (v + 0.044715 v^3)), the cubic as ((a*v)*v)*v.
__device__ __forceinline__ float tl_gelu_t(float v) {
    return tl_tanh_approx(TL_SQRT_2_OVER_PI * (v + TL_GELU_CUBIC * v * v * v));
}

__device__ __forceinline__ float tl_gelu_f(float v) { return 0.5f * v * (1.0f + tl_gelu_t(v)); }

extern "C" __global__ void tl_gelu(const float* x, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) { out[i] = tl_gelu_f(x[i]); }
}

// The bias epilogue (device/bias.rs): x (outer, ch, inner) plus b (ch) broadcast, i.e. the
// chain broadcast -> add in one launch (sim: launch_add_bias in device/sim/prims.rs).
extern "C" __global__ void tl_add_bias(const float* x, const float* b, float* out, u64 n, u32 ch,
                                       u32 inner) {
    TL_GRID_STRIDE(i, n) { out[i] = x[i] + b[(i / inner) % ch]; }
}

// The same sum followed by an activation of it (act 1: relu as tl_relu, 2: gelu as tl_gelu);
// both the sum (the activation's VJP reads it) and the activation are written.
extern "C" __global__ void tl_add_bias_act(const float* x, const float* b, float* pre,
                                           float* post, u64 n, u32 ch, u32 inner, u32 act) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i] + b[(i / inner) % ch];
        pre[i] = v;
        post[i] = act == 1u ? (v > 0.0f ? v : 0.0f) : tl_gelu_f(v);
    }
}

// 0.5 (1 + t) + 0.5 v sech^2 c (1 + 3 a v^2), the second term taken as 0 once tanh has
// saturated (sech^2 == 0), so no 0 * inf for huge |v|.
extern "C" __global__ void tl_gelu_bwd(const float* x, const float* g, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float t = tl_gelu_t(v);
        const float sech2 = 1.0f - t * t;
        const float three_a = 3.0f * TL_GELU_CUBIC;
        const float tail =
            sech2 == 0.0f ? 0.0f
                          : 0.5f * v * sech2 * TL_SQRT_2_OVER_PI * (1.0f + three_a * v * v);
        out[i] = (0.5f * (1.0f + t) + tail) * g[i];
    }
}

extern "C" __global__ void tl_silu(const float* x, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = v * tl_act_sigmoid(v);
    }
}

// s (1 + v (1 - s)) g with s = sigmoid(v).
extern "C" __global__ void tl_silu_bwd(const float* x, const float* g, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float s = tl_act_sigmoid(v);
        out[i] = s * (1.0f + v * (1.0f - s)) * g[i];
    }
}
