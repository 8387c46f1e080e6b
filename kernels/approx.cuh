// exp, tanh, the logistic sigmoid, ln and softplus in straight-line arithmetic, the twins of
// tl_spec::approx::{exp_f32, tanh_f32, sigmoid_f32, log_f32, softplus_f32}
// (same operations in the same order; built with --fmad=false, so each rounds as on the host,
// and the fused multiply-adds are written out: __fmaf_rn for f32::mul_add).
// The simulation device and the CPU tape's f32 kernels call those functions where these are
// called (gelu and silu in activation.cu; tanh, sigmoid, softplus, safe_log and their backward
// passes in pointwise.cu), so the three agree bit for bit, which CUDA's expf/tanhf/log1pf and
// libm's do not.
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

// ln(1 + f) + e ln 2 for f in [sqrt(1/2) - 1, sqrt(2) - 1] and a whole e: Cephes' logf kernel,
// the twin of tl_spec::approx::log_reduced.
__device__ __forceinline__ float tl_log_reduced(float f, float e) {
    const float ln2_hi = 0.6933594f, ln2_lo = -2.1219444e-4f;
    const float z = f * f;
    float p = 7.0376836e-2f;
    p = __fmaf_rn(p, f, -1.151461e-1f);
    p = __fmaf_rn(p, f, 1.1676999e-1f);
    p = __fmaf_rn(p, f, -1.2420141e-1f);
    p = __fmaf_rn(p, f, 1.4249323e-1f);
    p = __fmaf_rn(p, f, -1.6668058e-1f);
    p = __fmaf_rn(p, f, 2.0000714e-1f);
    p = __fmaf_rn(p, f, -2.4999994e-1f);
    p = __fmaf_rn(p, f, 3.333333e-1f);
    float y = (p * f) * z;
    y = __fmaf_rn(ln2_lo, e, y);
    y = __fmaf_rn(-0.5f, z, y);
    return __fmaf_rn(ln2_hi, e, f + y);
}

// ln x, the twin of tl_spec::approx::log_f32: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (a
// subnormal x scaled by 2^23 first), then tl_log_reduced; -inf at 0, +inf at +inf, NaN below 0
// and for NaN.
__device__ __forceinline__ float tl_log_approx(float x) {
    const bool subnormal = x < 1.17549435e-38f;
    const float xs = subnormal ? x * 8388608.0f : x;
    const unsigned bits = (unsigned)__float_as_int(xs);
    int e = (int)((bits >> 23) & 0xffu) - 126 - (subnormal ? 23 : 0);
    const float m = __int_as_float((int)((bits & 0x007fffffu) | 0x3f000000u));
    const bool low = m < 0.70710677f;
    e = low ? e - 1 : e;
    const float f = low ? m + m - 1.0f : m - 1.0f;
    const float r = tl_log_reduced(f, (float)e);
    return x == 0.0f ? -INFINITY : (x == INFINITY ? x : (x > 0.0f ? r : NAN));
}

// softplus x = max(x, 0) + ln(1 + u), u = e^-|x|, the twin of tl_spec::approx::softplus_f32:
// ln(1 + u) at f = u below sqrt(2) - 1 (no rounding of 1 + u), else at f = (1 + u)/2 - 1, e = 1.
__device__ __forceinline__ float tl_softplus_approx(float x) {
    const float u = tl_exp_approx(-fabsf(x));
    const bool big = u >= 0.41421357f;
    const float f = big ? (1.0f + u) * 0.5f - 1.0f : u;
    return fmaxf(x, 0.0f) + tl_log_reduced(f, big ? 1.0f : 0.0f);
}
