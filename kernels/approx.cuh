// exp, tanh and the logistic sigmoid in straight-line arithmetic, the twins of
// tl_spec::approx::{exp_f32, tanh_f32, sigmoid_f32}
// (same operations in the same order; built with --fmad=false, so each rounds as on the host,
// and the fused multiply-adds are written out: __fmaf_rn for f32::mul_add).
// The simulation device and the CPU tape's f32 kernels call those functions where these are
// called (gelu and silu in activation.cu; tanh, sigmoid and the sigmoid in the backward passes
// of softplus and safe_log in pointwise.cu), so the
// three agree bit for bit, which CUDA's expf/tanhf and libm's do not.
#pragma once

// e^x in straight-line arithmetic, the twin of tl_spec::approx::exp_f32 (same operations in
// the same order, each f32::mul_add there a __fmaf_rn here; its doc says why each step is
// there). No select at the end: the clamp makes the arithmetic overflow to +inf above
// ln(FLT_MAX) and round to 0 below -150 ln 2; a NaN x passes the clamp and makes er NaN. k is
// read from the shifted sum's bits, as on the host (no float-to-int conversion, so a NaN is
// no undefined behaviour); k >> 1 is arithmetic (floor), as Rust's i32 >> 1; the shifts of
// k + 127 are unsigned.
__device__ __forceinline__ float tl_exp_approx(float x) {
    const float ln2_hi = 0.6933594f, ln2_lo = -2.1219444e-4f;
    const float hi = 89.0f, lo = -104.0f, shift = 12582912.0f;
    const float xc = x < lo ? lo : (x > hi ? hi : x);
    const float shifted = __fmaf_rn(xc, 1.44269504088896341f, shift);
    const float n = shifted - shift;
    float r = __fmaf_rn(-n, ln2_hi, xc);
    r = __fmaf_rn(-n, ln2_lo, r);
    float p = 1.9875691e-4f;
    p = __fmaf_rn(p, r, 1.3981999e-3f);
    p = __fmaf_rn(p, r, 8.333452e-3f);
    p = __fmaf_rn(p, r, 4.1665796e-2f);
    p = __fmaf_rn(p, r, 1.6666665e-1f);
    p = __fmaf_rn(p, r, 0.5f);
    const float er = __fmaf_rn(p * r, r, r) + 1.0f;
    const int k = __float_as_int(shifted) - __float_as_int(shift);
    const int k1 = k >> 1, k2 = k - (k >> 1);
    return er * __int_as_float((int)((unsigned)(k1 + 127) << 23)) *
           __int_as_float((int)((unsigned)(k2 + 127) << 23));
}

// tanh x, the twin of tl_spec::approx::tanh_f32: Cephes' odd polynomial for |x| < 0.625, else
// 1 - 2/(e^{2|x|} + 1); the sign of x put back last.
__device__ __forceinline__ float tl_tanh_approx(float x) {
    const float a = fabsf(x);
    const float z = a * a;
    float p = -5.7049887e-3f;
    p = __fmaf_rn(p, z, 2.063909e-2f);
    p = __fmaf_rn(p, z, -5.3739716e-2f);
    p = __fmaf_rn(p, z, 1.3331442e-1f);
    p = __fmaf_rn(p, z, -3.333328e-1f);
    const float small = __fmaf_rn(p * z, a, a);
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
