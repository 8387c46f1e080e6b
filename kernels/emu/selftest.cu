// Kernels that only the emulator compiles (no PTX): each breaks a rule on purpose, so the
// emulator's unit tests (crates/tl-tape-cuda/src/device/cuda/emu.rs) can show it is caught.
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"

// Lanes 0..15 of every warp wait at __syncthreads while lanes 16..31 wait in a warp shuffle:
// no barrier can ever be passed.
extern "C" __global__ void tl_emu_test_divergent(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % TL_WARP < 16) {
        __syncthreads();
    } else {
        v = __shfl_down_sync(TL_FULL_MASK, v, 1);
    }
    out[threadIdx.x] = v;
}

// Each thread reads its right neighbour's shared slot with no __syncthreads between the write
// and the read: the result depends on the order in which the threads run.
extern "C" __global__ void tl_emu_test_race(float* out) {
    __shared__ float s[TL_BLOCK];
    s[threadIdx.x] = (float)threadIdx.x + 1.0f;
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// The same with the barrier: every order gives out[t] = t + 2 (mod the block).
extern "C" __global__ void tl_emu_test_synced(float* out) {
    __shared__ float s[TL_BLOCK];
    s[threadIdx.x] = (float)threadIdx.x + 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Each thread reads the next lane's slot of its own warp after __syncwarp: every order gives
// out[t] = (warp base) + (t + 1) % 32 + 1.
extern "C" __global__ void tl_emu_test_warp_synced(float* out) {
    __shared__ float s[TL_BLOCK];
    s[threadIdx.x] = (float)threadIdx.x + 1.0f;
    __syncwarp();
    out[threadIdx.x] = s[threadIdx.x / 32 * 32 + (threadIdx.x + 1) % 32];
}

// The warp matrix functions (cuda_emu.h's nvcuda::wmma), run by every warp of the block (each
// computes the same tile and stores the same values). out (16 x 16) = a (16 x 16, row-major) .
// b (16 x 16) with bf16 fragments, the operands rounded as they are staged in shared memory.
// `bad` breaks one rule CUDA sets: 1 ldm not a multiple of 16 bytes, 2 a pointer not 32-byte
// aligned, 3 lanes passing different pointers; 4 stores the result column-major (correct).
extern "C" __global__ void tl_emu_test_wmma_bf16(const float* a, const float* b, float* out,
                                                 u32 bad) {
    namespace wmma = nvcuda::wmma;
    __shared__ __align__(32) __nv_bfloat16 as[2 * 256];
    __shared__ __align__(32) __nv_bfloat16 bs[256];
    for (u32 e = threadIdx.x; e < 256; e += blockDim.x) {
        as[e] = __float2bfloat16(a[e]);
        as[256 + e] = as[e];
        bs[e] = __float2bfloat16(b[e]);
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    const unsigned ldm = bad == 1 ? 12 : 16;
    const __nv_bfloat16* pa = bad == 2 ? as + 8 : bad == 3 ? as + 16 * (threadIdx.x % 2) : as;
    wmma::load_matrix_sync(fa, pa, ldm);
    wmma::load_matrix_sync(fb, bs, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(out, acc, 16, bad == 4 ? wmma::mem_col_major : wmma::mem_row_major);
}

// TF32 fragments (m16n16k8, two k steps), b staged transposed and loaded col_major. With
// `convert` the fragments' elements are rounded (__float_to_tf32, element-wise as CUDA allows);
// without it the products read the operands' top 19 bits.
extern "C" __global__ void tl_emu_test_wmma_tf32(const float* a, const float* b, float* out,
                                                 u32 convert) {
    namespace wmma = nvcuda::wmma;
    __shared__ __align__(32) float as[256];
    __shared__ __align__(32) float bt[256];
    for (u32 e = threadIdx.x; e < 256; e += blockDim.x) {
        as[e] = a[e];
        bt[(e % 16) * 16 + e / 16] = b[e];
    }
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < 16; kk += 8) {
        wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, as + kk, 16);
        wmma::load_matrix_sync(fb, bt + kk, 16);
        if (convert) {
            for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
            for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
        }
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

// Reads dynamic shared memory no thread wrote: the emulator's poison (a NaN).
extern "C" __global__ void tl_emu_test_dynamic_unwritten(float* out) {
    TL_DYNAMIC_SHARED(float, dyn);
    out[threadIdx.x] = dyn[threadIdx.x];
}
