// Counter-based RNG (SEMANTICS.md "Randomness"; host twin crates/tl-tape-cuda/src/rng.rs):
// element i of a draw keyed by `key` uses the low 32 bits of splitmix64(key + i).
#include "common.cuh"

__device__ __forceinline__ u64 tl_splitmix64(u64 z) {
    u64 z1 = z + 0x9e3779b97f4a7c15ull;
    u64 z2 = (z1 ^ (z1 >> 30)) * 0xbf58476d1ce4e5b9ull;
    u64 z3 = (z2 ^ (z2 >> 27)) * 0x94d049bb133111ebull;
    return z3 ^ (z3 >> 31);
}

// u / 2^32 rounded to the nearest float (exact in double first), clamped below 1.
extern "C" __global__ void tl_rand_uniform(float* out, u64 n, u64 key) {
    const float below_one = 0.99999994f;  // 1 - 2^-24, the largest float below 1
    TL_GRID_STRIDE(i, n) {
        u32 u = (u32)tl_splitmix64(key + i);
        float f = (float)((double)u / 4294967296.0);
        out[i] = fminf(f, below_one);
    }
}

// 1 where keep_prob > u / 2^32 (compared in double), else 0.
extern "C" __global__ void tl_bernoulli_mask(float* out, u64 n, u64 key, double keep_prob) {
    TL_GRID_STRIDE(i, n) {
        u32 u = (u32)tl_splitmix64(key + i);
        out[i] = keep_prob > (double)u / 4294967296.0 ? 1.0f : 0.0f;
    }
}
