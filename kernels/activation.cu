// Activation kernels: GELU (tanh form, PyTorch `approximate="tanh"`) and SiLU, forward and
// backward, one element per grid-stride iteration (leakyRelu, elu and the exact GELU at the end). Each body is the twin of the function of
// the same name in crates/tl-tape-cuda/src/device/sim/activation.rs (same operation order;
// built with --fmad=false). The GELU's tanh and SiLU's sigmoid are tl_tanh_approx and
// tl_sigmoid_approx (approx.cuh), the twins of tl_spec::approx::{tanh_f32, sigmoid_f32}, which
// the simulation device and the CPU tape's f32 kernels call, so both are bit-identical on all
// three.
#include "common.cuh"
#include "nan.cuh"
#include "approx.cuh"

#define TL_SQRT_2_OVER_PI 0.7978845608028654f
#define TL_GELU_CUBIC 0.044715f

__device__ __forceinline__ float tl_act_sigmoid(float x) { return tl_sigmoid_approx(x); }

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
        post[i] = act == 1u ? tl_relu_f(v) : tl_gelu_f(v);
    }
}

// The same sum followed by a residual add of r (of x's length), r + sum where `r_first`, else
// sum + r, as `add` of the two would compute it; both the sum and the total are written.
extern "C" __global__ void tl_add_bias_res(const float* x, const float* b, const float* r,
                                           float* pre, float* out, u64 n, u32 ch, u32 inner,
                                           u32 r_first) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i] + b[(i / inner) % ch];
        pre[i] = v;
        out[i] = r_first ? r[i] + v : v + r[i];
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

// leakyRelu, elu and the exact (erf) GELU, forward and backward; twins of
// crates/tl-tape-cuda/src/device/sim/point_act.rs. Kinks as PyTorch's autograd: the x <= 0
// branch is taken at 0 (slope there: negative_slope, alpha). The exact GELU's erf and exp are
// tl_erf_approx and tl_exp_approx (approx.cuh), as on the sim and the CPU tape's f32 kernel:
// the same bits on all three. elu calls CUDA's expm1f/expf (the host libm's on the emulator,
// as the sim): within a few ulps of the sim on a GPU.
#define TL_FRAC_1_SQRT_2 0.7071067811865476f
#define TL_FRAC_1_SQRT_2PI 0.3989422804014327f

extern "C" __global__ void tl_leaky_relu(const float* x, float* out, u64 n, float slope) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = v > 0.0f ? v : slope * v;
    }
}

extern "C" __global__ void tl_leaky_relu_bwd(const float* x, const float* g, float* out, u64 n,
                                             float slope) {
    TL_GRID_STRIDE(i, n) { out[i] = x[i] > 0.0f ? g[i] : slope * g[i]; }
}

extern "C" __global__ void tl_elu(const float* x, float* out, u64 n, float alpha) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = v > 0.0f ? v : alpha * expm1f(v);
    }
}

// g for v > 0, else (alpha e^v) g.
extern "C" __global__ void tl_elu_bwd(const float* x, const float* g, float* out, u64 n,
                                      float alpha) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = v > 0.0f ? g[i] : alpha * expf(v) * g[i];
    }
}

// 0.5 v (1 + erf(v / sqrt 2)).
extern "C" __global__ void tl_gelu_erf(const float* x, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + tl_erf_approx(v * TL_FRAC_1_SQRT_2));
    }
}

// (Phi(v) + v phi(v)) g: Phi = 0.5 (1 + erf(v / sqrt 2)), phi = e^{-v^2/2} / sqrt(2 pi).
extern "C" __global__ void tl_gelu_erf_bwd(const float* x, const float* g, float* out, u64 n) {
    TL_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + tl_erf_approx(v * TL_FRAC_1_SQRT_2));
        const float pdf = TL_FRAC_1_SQRT_2PI * tl_exp_approx(-(0.5f * v * v));
        out[i] = (cdf + v * pdf) * g[i];
    }
}
