// Shared by every kernels/*.cu: integer types, launch geometry, the grid-stride loop and the
// block reduction whose order crates/tl-tape-cuda/src/device/sim/reduce.rs documents (and the
// simulation device reproduces bit for bit). Built with --fmad=false: `a + b * c` is two
// roundings, as on the host.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

#define TL_BLOCK 256
#define TL_WARP 32
#define TL_FULL_MASK 0xffffffffu

// Dims and strides of a rank <= 8 tensor, passed by value (MAX_RANK in device/mod.rs).
struct Dims8 {
    u32 d[8];
};

// The launch's dynamic shared memory as `T name[]`, 16-byte aligned (CudaDevice::run_shared
// gives the bytes; past 48 KiB the driver layer opts the kernel in). The kernel emulator's
// cuda_emu.h defines its own: the launch's guarded buffer.
#ifndef TL_DYNAMIC_SHARED
#define TL_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// for (i = global thread index; i < n; i += total threads), in u64.
#define TL_GRID_STRIDE(i, n)                                                         \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n);            \
         i += (u64)gridDim.x * blockDim.x)

// Four consecutive floats of shared memory (16-byte aligned) in one load on the GPU.
__device__ inline void ld4(const float* p, float* r) {
#ifdef __CUDA_ARCH__
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x;
    r[1] = v.y;
    r[2] = v.z;
    r[3] = v.w;
#else
    // The emulator: the same four reads, and a misaligned address is a bug there too.
    if (reinterpret_cast<u64>(p) % 16 != 0) __builtin_trap();
    for (int q = 0; q < 4; ++q) r[q] = p[q];
#endif
}

struct AddOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The shuffle-down tree over one warp: lane l < off computes v[l] = v[l] op v[l + off] for
// off = 16, 8, 4, 2, 1; lane 0 returns the warp's value (sim: warp_tree).
template <typename Op>
__device__ float tl_warp_tree(float v, Op op) {
    for (int off = TL_WARP / 2; off > 0; off /= 2) {
        v = op(v, __shfl_down_sync(TL_FULL_MASK, v, off));
    }
    return v;
}

// Block tree over the 256 per-thread values (blockDim.x == 256): a warp tree per warp, then
// warp 0 reduces the 8 warp values padded with `identity` to 32 lanes (sim: block_tree).
// Every thread gets the result. `smem` holds at least 33 floats.
template <typename Op>
__device__ float tl_block_tree(float v, float identity, Op op, float* smem) {
    const int lane = threadIdx.x % TL_WARP;
    const int warp = threadIdx.x / TL_WARP;
    v = tl_warp_tree(v, op);
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < TL_BLOCK / TL_WARP ? smem[lane] : identity;
        w = tl_warp_tree(w, op);
        if (lane == 0) smem[32] = w;
    }
    __syncthreads();
    float r = smem[32];
    __syncthreads();
    return r;
}
