// Optimizer steps in one launch per list of up to eight parameters (a one-parameter step is a
// list of one). Each element is computed as the composed device step computes it
// (crates/tl-session/src/optim: one primitive per operation of the rule, tl_axpy_assign, tl_mul,
// tl_sqrt, tl_axpy, tl_div, each an f32 operation rounded once), in the same order, so a fused
// step has the composed step's bits while reading each buffer once. Twins: AdamUpdate::element and MomentumUpdate::element in
// crates/tl-tape-cuda/src/device/optim.rs.
#include "common.cuh"

// flags: the update's optional parts.
#define TL_OPT_DECAY 1u     // decoupled weight decay first: w <- w + decay * w (AdamW)
#define TL_OPT_L2 2u        // the gradient read as g + l2 * w (L2 weight decay)
#define TL_OPT_NESTEROV 4u  // momentum SGD's Nesterov form

// One Adam(W) step of w and its moments m, v from the gradient g, over n elements:
//   m <- m + b1m1 * m; m <- m + omb1 * g       (b1m1 = beta1 - 1, omb1 = 1 - beta1)
//   v <- v + b2m1 * v; v <- v + omb2 * (g * g)
//   w <- w + step * (m / (eps + inv_sqrt_bc2 * sqrt(max(v, 0))))
__device__ __forceinline__ void tl_adam_elements(float* w, float* m, float* v, const float* g,
                                                 u64 n, u32 flags, float decay, float l2,
                                                 float b1m1, float omb1, float b2m1, float omb2,
                                                 float inv_sqrt_bc2, float eps, float step) {
    TL_GRID_STRIDE(i, n) {
        float wi = w[i];
        float gi = g[i];
        if (flags & TL_OPT_DECAY) wi = wi + decay * wi;
        if (flags & TL_OPT_L2) gi = gi + l2 * wi;
        float mi = m[i];
        mi = mi + b1m1 * mi;
        mi = mi + omb1 * gi;
        const float g2 = gi * gi;
        float vi = v[i];
        vi = vi + b2m1 * vi;
        vi = vi + omb2 * g2;
        const float denom = eps + inv_sqrt_bc2 * sqrtf(fmaxf(vi, 0.0f));
        const float u = mi / denom;
        w[i] = wi + step * u;
        m[i] = mi;
        v[i] = vi;
    }
}

// One momentum SGD step of w and its momentum buffer b from the gradient g (b already holds
// the first step's gradient), over n elements:
//   b <- b + mom_m1 * b; b <- b + omd * g      (mom_m1 = momentum - 1, omd = 1 - dampening)
//   Nesterov: w <- w + step * (g + momentum * b); else w <- w + step * b
__device__ __forceinline__ void tl_momentum_elements(float* w, float* b, const float* g, u64 n,
                                                     u32 flags, float l2, float mom_m1,
                                                     float omd, float momentum, float step) {
    TL_GRID_STRIDE(i, n) {
        const float wi = w[i];
        float gi = g[i];
        if (flags & TL_OPT_L2) gi = gi + l2 * wi;
        float bi = b[i];
        bi = bi + mom_m1 * bi;
        bi = bi + omd * gi;
        if (flags & TL_OPT_NESTEROV) {
            gi = gi + momentum * bi;
            w[i] = wi + step * gi;
        } else {
            w[i] = wi + step * bi;
        }
        b[i] = bi;
    }
}

// The kernels: up to eight parameters (slots) in one launch, blockIdx.y the slot, each slot's
// elements computed by the functions above. The coefficients are the list's, except Adam's bias
// corrections (inv_sqrt_bc2, step), which follow each parameter's own step count and so come per
// slot. Slots past `count` are never read; no
// buffer of a slot may be another slot's (the caller launches such lists one parameter at a
// time). A switch, not arrays indexed by the slot, as in tl_axpy_assign_list (pointwise.cu).
#define TL_ADAM_SLOT(k) \
    float *w##k, float *m##k, float *v##k, const float *g##k, u64 n##k, float bc##k, float st##k
extern "C" __global__ void tl_adam_update_list(u32 flags, float decay, float l2, float b1m1,
                                               float omb1, float b2m1, float omb2, float eps,
                                               u32 count, TL_ADAM_SLOT(0), TL_ADAM_SLOT(1),
                                               TL_ADAM_SLOT(2), TL_ADAM_SLOT(3), TL_ADAM_SLOT(4),
                                               TL_ADAM_SLOT(5), TL_ADAM_SLOT(6),
                                               TL_ADAM_SLOT(7)) {
    const u32 t = blockIdx.y;
    if (t >= count) return;
    float *w, *m, *v;
    const float* g;
    u64 n;
    float inv_sqrt_bc2, step;
    switch (t) {
#define TL_CASE(k)             \
    case k:                    \
        w = w##k;              \
        m = m##k;              \
        v = v##k;              \
        g = g##k;              \
        n = n##k;              \
        inv_sqrt_bc2 = bc##k;  \
        step = st##k;          \
        break;
        TL_CASE(0) TL_CASE(1) TL_CASE(2) TL_CASE(3) TL_CASE(4) TL_CASE(5) TL_CASE(6) TL_CASE(7)
#undef TL_CASE
        default:
            return;
    }
    tl_adam_elements(w, m, v, g, n, flags, decay, l2, b1m1, omb1, b2m1, omb2, inv_sqrt_bc2, eps,
                     step);
}
#undef TL_ADAM_SLOT

#define TL_MOMENTUM_SLOT(k) float *w##k, float *b##k, const float *g##k, u64 n##k
extern "C" __global__ void tl_momentum_update_list(u32 flags, float l2, float mom_m1, float omd,
                                                   float momentum, float step, u32 count,
                                                   TL_MOMENTUM_SLOT(0), TL_MOMENTUM_SLOT(1),
                                                   TL_MOMENTUM_SLOT(2), TL_MOMENTUM_SLOT(3),
                                                   TL_MOMENTUM_SLOT(4), TL_MOMENTUM_SLOT(5),
                                                   TL_MOMENTUM_SLOT(6), TL_MOMENTUM_SLOT(7)) {
    const u32 t = blockIdx.y;
    if (t >= count) return;
    float *w, *b;
    const float* g;
    u64 n;
    switch (t) {
#define TL_CASE(k) \
    case k:        \
        w = w##k;  \
        b = b##k;  \
        g = g##k;  \
        n = n##k;  \
        break;
        TL_CASE(0) TL_CASE(1) TL_CASE(2) TL_CASE(3) TL_CASE(4) TL_CASE(5) TL_CASE(6) TL_CASE(7)
#undef TL_CASE
        default:
            return;
    }
    tl_momentum_elements(w, b, g, n, flags, l2, mom_m1, omd, momentum, step);
}
#undef TL_MOMENTUM_SLOT
