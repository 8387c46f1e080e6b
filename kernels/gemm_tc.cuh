// The tensor-core tile (autocast: bf16 or TF32 operands, f32 sums) shared by the tensor-core
// GEMM (kernels/linalg.cu: tl_gemm_tc) and the tensor-core implicit-GEMM convolution
// (kernels/conv.cu: tl_conv_implicit_tc); each brings its own loaders and output layout.
//
// 256 threads (8 warps, 2 x 4) a block, 128 x 128 outputs, each warp 64 x 32 as 4 x 2 f32
// accumulator fragments (WMMA, sm_80+); `R` the operands' precision: Bf16 (__float2bfloat16,
// nearest even; m16n16k16 fragments) or Tf32 (wmma::__float_to_tf32, nearest, ties away;
// m16n16k8). The depth run is walked in slices of BK = 16, zero-padded past the run's end (on
// the emulator that adds fma(0, 0, acc) = acc + 0: device/sim/linalg.rs, TC_K), double-buffered
// (k_slices of gemm_tile.cuh: the next slice is read into registers while the tensor cores
// multiply the current one, then rounded into the other buffer; one barrier a slice). Each
// warp writes its finished fragments one by one through its own 16 x 16 scratch in shared
// memory. The summation order inside mma_sync is the hardware's: on the emulator the one
// cuda_emu.h documents (increasing k, one fma a term), which the sim twins reproduce bit for
// bit; on a GPU within tl_spec::bf16::accumulation_bound of the reference.
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"
#include "gemm_tile.cuh"

namespace tc {

// Unroll the next loop fully in the PTX, so that the accumulator fragments it indexes stay in
// registers (the emulator's g++ unrolls as it likes).
#ifdef __CUDACC__
#define TC_UNROLL _Pragma("unroll")
#else
#define TC_UNROLL
#endif

constexpr int BM = 128, BN = 128, BK = 16, THREADS = 256;
constexpr int WM = 64, WN = 32, FI = WM / 16, FJ = WN / 16;  // a warp's outputs, its fragments
constexpr int WARPS_N = BN / WN;
static_assert((BM / WM) * WARPS_N * 32 == THREADS, "the warps cover the tile");

struct Bf16 {
    typedef __nv_bfloat16 T;  // shared-memory element
    typedef __nv_bfloat16 P;  // fragment precision
    static constexpr int FK = 16;
    __device__ static T cvt(float x) { return __float2bfloat16(x); }
};
struct Tf32 {
    typedef float T;
    typedef nvcuda::wmma::precision::tf32 P;
    static constexpr int FK = 8;
    __device__ static T cvt(float x) { return nvcuda::wmma::__float_to_tf32(x); }
};

// The shared memory of one precision's tiles: two buffers of As (BM x LDA) and Bs (BK x LDB) of
// its element type, then each warp's 16 x LDC float scratch. Rows padded by 16 bytes: ldm a
// multiple of 16 bytes and every fragment's first element 32-byte aligned, as load_matrix_sync /
// store_matrix_sync require.
template <class R>
struct Smem {
    typedef typename R::T T;
    static constexpr int PAD = 16 / (int)sizeof(T), LDA = BK + PAD, LDB = BN + PAD, LDC = 16 + 4;
    static constexpr int A_BYTES = BM * LDA * (int)sizeof(T), B_BYTES = BK * LDB * (int)sizeof(T);
    static constexpr int C_BYTES = 16 * LDC * 4;
    static constexpr int BYTES = 2 * (A_BYTES + B_BYTES) + THREADS / 32 * C_BYTES;
    static_assert(A_BYTES % 32 == 0 && B_BYTES % 32 == 0 && C_BYTES % 32 == 0,
                  "every buffer stays 32-byte aligned");
};
// One buffer for both precisions (a kernel instantiates both: two sets of static arrays would
// pass the 48 KiB of static shared memory a block may have).
constexpr int SMEM_BYTES =
    Smem<Bf16>::BYTES > Smem<Tf32>::BYTES ? Smem<Bf16>::BYTES : Smem<Tf32>::BYTES;
static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory");

// One block's tile in `smem` (SMEM_BYTES, 32-byte aligned): the two staging buffers, each
// warp's 16 x 16 scratch and its 4 x 2 accumulator fragments (from +0).
template <class R>
struct Tile {
    typedef typename R::T T;
    typedef Smem<R> S;
    typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, R::FK, float> Acc;
    T* As;      // [2][BM * LDA]
    T* Bs;      // [2][BK * LDB]
    float* Cw;  // the warp's scratch
    u32 wm, wn, lane;
    Acc acc[FI][FJ];
    __device__ explicit Tile(unsigned char* smem)
        : As(reinterpret_cast<T*>(smem)), Bs(reinterpret_cast<T*>(smem + 2 * S::A_BYTES)),
          Cw(reinterpret_cast<float*>(smem + 2 * (S::A_BYTES + S::B_BYTES) +
                                      threadIdx.x / 32 * S::C_BYTES)),
          wm(threadIdx.x / 32 / WARPS_N), wn(threadIdx.x / 32 % WARPS_N), lane(threadIdx.x % 32) {
        zero();
    }
    __device__ void zero() {
        TC_UNROLL
        for (int i = 0; i < FI; ++i) {
            TC_UNROLL
            for (int j = 0; j < FJ; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
        }
    }
    // `stage(as, bs, lda, ldb)` into buffer buf: op(a) as As[i * lda + p] (output row i, slice
    // row p), op(b) as Bs[p * ldb + j] (output column j), rounded (R::cvt) by the caller.
    template <typename Stage>
    __device__ void stage(int buf, Stage& st) {
        st(As + buf * BM * S::LDA, Bs + buf * BK * S::LDB, S::LDA, S::LDB);
    }
    // The whole slice in buffer buf into the accumulators, zero-padded past the run (the sim
    // twins' padding: TC_K).
    __device__ void mma(int buf) {
        namespace wmma = nvcuda::wmma;
        const T* as = As + buf * BM * S::LDA;
        const T* bs = Bs + buf * BK * S::LDB;
        for (int kk = 0; kk < BK; kk += R::FK) {
            wmma::fragment<wmma::matrix_a, 16, 16, R::FK, typename R::P, wmma::row_major> fa[FI];
            wmma::fragment<wmma::matrix_b, 16, 16, R::FK, typename R::P, wmma::row_major> fb[FJ];
            for (int i = 0; i < FI; ++i)
                wmma::load_matrix_sync(fa[i], &as[(wm * WM + i * 16) * S::LDA + kk], S::LDA);
            for (int j = 0; j < FJ; ++j)
                wmma::load_matrix_sync(fb[j], &bs[kk * S::LDB + wn * WN + j * 16], S::LDB);
            for (int i = 0; i < FI; ++i)
                for (int j = 0; j < FJ; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    // Every sum of the warp's fragments through its scratch: f(i, j, l, r, c, v) for fragment
    // (i, j) and the lane's element l < 8 of it, at the block's row r and column c (the lane's
    // column within a fragment is lane % 16, its rows lane / 16 + 2·l).
    template <typename F>
    __device__ void drain(F& f) {
        TC_UNROLL
        for (int i = 0; i < FI; ++i) {
            TC_UNROLL
            for (int j = 0; j < FJ; ++j) {
                nvcuda::wmma::store_matrix_sync(Cw, acc[i][j], S::LDC, nvcuda::wmma::mem_row_major);
                __syncwarp();
                const u32 r0 = wm * WM + i * 16, c0 = wn * WN + j * 16;
                TC_UNROLL
                for (int l = 0; l < 256 / 32; ++l) {
                    const u32 e = lane + 32 * l, r = e / 16, c = e % 16;
                    f(i, j, l, r0 + r, c0 + c, Cw[r * S::LDC + c]);
                }
                __syncwarp();  // read before the next fragment's store
            }
        }
    }
};

// One block's 128 x 128 outputs of a product over the depth run [kb, ke), in `smem`
// (SMEM_BYTES, 32-byte aligned): `fetch(p0)` reads the thread's elements of the slice from p0
// into its registers (zeros outside the operands and the run); `stage(as, bs, lda, ldb)`
// rounds them (R::cvt) into one buffer (Tile::stage); `put(r, c, v)` writes the finished sum v
// of the block's output (r, c) where the caller's bounds and layout say. Ends on a barrier
// (k_slices), so a second call on the same buffers waits for every warp's last reads; the
// scratch is the warp's own.
template <class R, typename Fetch, typename Stage, typename Put>
__device__ void block(unsigned char* smem, u32 kb, u32 ke, Fetch& fetch, Stage& stage,
                      Put& put) {
    Tile<R> t(smem);
    auto stage_buf = [&](int buf) { t.stage(buf, stage); };
    auto compute = [&](int buf, u32) { t.mma(buf); };
    k_slices<BK>(kb, ke, fetch, stage_buf, compute);
    auto out = [&](int, int, int, u32 r, u32 c, float v) { put(r, c, v); };
    t.drain(out);
}

}  // namespace tc
