// exp, tanh and the logistic sigmoid in straight-line arithmetic, the twins of
// tl_spec::approx::{exp_f32, tanh_f32, sigmoid_f32}
// (same operations in the same order; built with --fmad=false, so each rounds as on the host).
// The simulation device and the CPU tape's f32 kernels call those functions where these are
// called (gelu and silu in activation.cu; tanh, sigmoid and the sigmoid in the backward passes
// of softplus and safe_log in pointwise.cu), so the
// three agree bit for bit, which CUDA's expf/tanhf and libm's do not.
#pragma once

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

// 1/(1 + e) for x >= 0, e/(1 + e) below, e = e^{-|x|}: the twin of tl_spec::approx::sigmoid_f32
// (one division of a selected numerator, the same bits as either branch).
__device__ __forceinline__ float tl_sigmoid_approx(float x) {
    const float e = tl_exp_approx(-fabsf(x));
    const float num = x >= 0.0f ? 1.0f : e;
    return num / (1.0f + e);
}
