// Optimizer steps in one launch per parameter. Each element is computed as the composed device
// step computes it (crates/tl-session/src/optim: one primitive per operation of the rule,
// tl_axpy_assign, tl_mul, tl_sqrt, tl_axpy, tl_div, each an f32 operation rounded once), in the
// same order, so a fused step has the composed step's bits while reading each buffer once.
// Twins: crates/tl-tape-cuda/src/device/sim/optim.rs.
#include "common.cuh"

// flags: the update's optional parts.
#define TL_OPT_DECAY 1u     // decoupled weight decay first: w <- w + decay * w (AdamW)
#define TL_OPT_L2 2u        // the gradient read as g + l2 * w (L2 weight decay)
#define TL_OPT_NESTEROV 4u  // momentum SGD's Nesterov form

// One Adam(W) step of w and its moments m, v from the gradient g:
//   m <- m + b1m1 * m; m <- m + omb1 * g       (b1m1 = beta1 - 1, omb1 = 1 - beta1)
//   v <- v + b2m1 * v; v <- v + omb2 * (g * g)
//   w <- w + step * (m / (eps + inv_sqrt_bc2 * sqrt(max(v, 0))))
extern "C" __global__ void tl_adam_update(float* w, float* m, float* v, const float* g, u64 n,
                                          u32 flags, float decay, float l2, float b1m1,
                                          float omb1, float b2m1, float omb2,
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
// the first step's gradient):
//   b <- b + mom_m1 * b; b <- b + omd * g      (mom_m1 = momentum - 1, omd = 1 - dampening)
//   Nesterov: w <- w + step * (g + momentum * b); else w <- w + step * b
extern "C" __global__ void tl_momentum_update(float* w, float* b, const float* g, u64 n,
                                              u32 flags, float l2, float mom_m1, float omd,
                                              float momentum, float step) {
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
