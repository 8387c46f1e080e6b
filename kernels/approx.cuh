// exp, tanh, the logistic sigmoid, ln and softplus in straight-line arithmetic (and erf), the
// twins of tl_spec::approx::{exp_f32, tanh_f32, sigmoid_f32, log_f32, softplus_f32, erf_f32}
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

// erf x, the twin of tl_spec::approx::erf_f32: FreeBSD's erff, its two expf calls
// tl_exp_approx, the sign of x put back last (same operations in the same order).
__device__ __forceinline__ float tl_erf_approx(float x) {
    const float erx = 8.4506291151e-01f;
    const float a = fabsf(x);
    if (a != a) return x;
    float y;
    if (a < 0.84375f) {
        const float z = x * x;
        const float r = 1.2837916613e-01f +
                        z * (-3.2504209876e-01f +
                             z * (-2.8481749818e-02f +
                                  z * (-5.7702702470e-03f + z * -2.3763017452e-05f)));
        const float s =
            1.0f + z * (3.9791721106e-01f +
                        z * (6.5022252500e-02f +
                             z * (5.0813062117e-03f +
                                  z * (1.3249473704e-04f + z * -3.9602282413e-06f))));
        return x + x * (r / s);
    } else if (a < 1.25f) {
        const float s = a - 1.0f;
        const float p =
            -2.3621185683e-03f +
            s * (4.1485610604e-01f +
                 s * (-3.7220788002e-01f +
                      s * (3.1834661961e-01f +
                           s * (-1.1089469492e-01f +
                                s * (3.5478305072e-02f + s * -2.1663755178e-03f)))));
        const float q =
            1.0f + s * (1.0642088205e-01f +
                        s * (5.4039794207e-01f +
                             s * (7.1828655899e-02f +
                                  s * (1.2617121637e-01f +
                                       s * (1.3637083583e-02f + s * 1.1984500103e-02f)))));
        y = erx + p / q;
    } else if (a < 6.0f) {
        const float s = 1.0f / (a * a);
        float r, big_s;
        if (a < __int_as_float(0x4036db6d)) {
            r = -9.8649440333e-03f +
                s * (-6.9385856390e-01f +
                     s * (-1.0558626175e+01f +
                          s * (-6.2375331879e+01f +
                               s * (-1.6239666748e+02f +
                                    s * (-1.8460508728e+02f +
                                         s * (-8.1287437439e+01f + s * -9.8143291473e+00f))))));
            big_s = 1.0f +
                    s * (1.9651271820e+01f +
                         s * (1.3765776062e+02f +
                              s * (4.3456588745e+02f +
                                   s * (6.4538726807e+02f +
                                        s * (4.2900814819e+02f +
                                             s * (1.0863500214e+02f +
                                                  s * (6.5702495575e+00f +
                                                       s * -6.0424413532e-02f)))))));
        } else {
            r = -9.8649431020e-03f +
                s * (-7.9928326607e-01f +
                     s * (-1.7757955551e+01f +
                          s * (-1.6063638306e+02f +
                               s * (-6.3756646729e+02f +
                                    s * (-1.0250950928e+03f + s * -4.8351919556e+02f)))));
            big_s = 1.0f +
                    s * (3.0338060379e+01f +
                         s * (3.2579251099e+02f +
                              s * (1.5367296143e+03f +
                                   s * (3.1998581543e+03f +
                                        s * (2.5530502930e+03f +
                                             s * (4.7452853394e+02f + s * -2.2440952301e+01f))))));
        }
        const float z = __int_as_float(__float_as_int(a) & (int)0xffffe000u);
        y = 1.0f - tl_exp_approx(-z * z - 0.5625f) * tl_exp_approx((z - a) * (z + a) + r / big_s) / a;
    } else {
        y = 1.0f;
    }
    return copysignf(y, x);
}
