// Matrix products: our own tiled, register-blocked GEMM, out = op(a) . op(b) with op(a) (m, k)
// and op(b) (k, n); `ta`: a stored (k, m); `tb`: b stored (n, k); with `into`, out <- out +
// op(a) . op(b) (the finished sum added to out's element with one rounding, as a separate add
// would). Batched over blockIdx.z (grid-stride). Each operand's matrices are product-major
// (batch, rows, cols), or head-merged (groups, rows, heads, cols) where its bit of `merged` is
// set (bit 0 a, bit 1 b, bit 2 out; product z is head z % heads of group z / heads): `mat_at`,
// the arithmetic of Batch::at in device/buffer.rs. Each output accumulates over p in increasing
// order from 0 as acc + a*b with two roundings (--fmad=false), exactly as device/sim/linalg.rs:
// tiling over k in order, and where the matrices lie, do not change the order.
//
// Tile: 64 x 64 outputs per block of 16 x 16 threads, 4 x 4 outputs per thread in registers,
// k in steps of 16 through shared memory.
#include "common.cuh"

#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4

// Where product z's (rows x cols) matrix starts in its operand, and its row stride.
struct MatAt {
    u64 start;
    u64 ld;
};
__device__ inline MatAt mat_at(u64 z, u32 rows, u32 cols, u32 heads, u32 merged) {
    MatAt r;
    if (merged) {
        r.start = (z / heads) * rows * heads * cols + (z % heads) * cols;
        r.ld = (u64)heads * cols;
    } else {
        r.start = z * rows * cols;
        r.ld = cols;
    }
    return r;
}

extern "C" __global__ void tl_gemm(const float* a, const float* b, float* out, u32 batch, u32 m,
                                   u32 k, u32 n, u32 ta, u32 tb, u32 into, u32 kc, u32 heads,
                                   u32 merged) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN + 1];
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const u32 row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // Split-K: `k` in runs of kc (a multiple of BK unless it covers k), run s of product z
    // written to out + (z·splits + s)·m·n for tl_gemm_sum_splits (sim: linalg::gemm); the
    // launch then clears out's bit of `merged`.
    const u32 splits = k > kc ? (k + kc - 1) / kc : 1;
    const u64 jobs = (u64)batch * splits;
    for (u64 zz = blockIdx.z; zz < jobs; zz += gridDim.z) {
        const u64 z = zz / splits;
        const u32 kb = (u32)(zz % splits) * kc;
        const u32 ke = k - kb < kc ? k : kb + kc;
        const MatAt pa = mat_at(z, ta ? k : m, ta ? m : k, heads, merged & 1);
        const MatAt pb = mat_at(z, tb ? n : k, tb ? k : n, heads, merged & 2);
        const MatAt pc = mat_at(zz, m, n, heads, merged & 4);
        const float* A = a + pa.start;
        const float* B = b + pb.start;
        float* C = out + pc.start;
        float acc[TM][TN];
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
        for (u32 p0 = kb; p0 < ke; p0 += BK) {
            // 256 threads load the 16 x 64 slices of op(a) and op(b), 4 elements each.
            for (u32 e = threadIdx.x; e < BK * BM; e += 256) {
                const u32 p = e / BM, i = e % BM;
                const u32 gi = row0 + i, gp = p0 + p;
                float v = 0.0f;
                if (gi < m && gp < ke) v = ta ? A[gp * pa.ld + gi] : A[gi * pa.ld + gp];
                As[p][i] = v;
            }
            for (u32 e = threadIdx.x; e < BK * BN; e += 256) {
                const u32 p = e / BN, j = e % BN;
                const u32 gj = col0 + j, gp = p0 + p;
                float v = 0.0f;
                if (gj < n && gp < ke) v = tb ? B[gj * pb.ld + gp] : B[gp * pb.ld + gj];
                Bs[p][j] = v;
            }
            __syncthreads();
            const u32 pend = (ke - p0) < BK ? (ke - p0) : BK;
            for (u32 p = 0; p < pend; ++p) {
                float ar[TM], br[TN];
                for (int i = 0; i < TM; ++i) ar[i] = As[p][ty * TM + i];
                for (int j = 0; j < TN; ++j) br[j] = Bs[p][tx * TN + j];
                for (int i = 0; i < TM; ++i)
                    for (int j = 0; j < TN; ++j)
                        acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(ar[i], br[j]));
            }
            __syncthreads();
        }
        for (int i = 0; i < TM; ++i) {
            const u32 gi = row0 + ty * TM + i;
            if (gi >= m) continue;
            for (int j = 0; j < TN; ++j) {
                const u32 gj = col0 + tx * TN + j;
                if (gj >= n) continue;
                float* o = &C[gi * pc.ld + gj];
                *o = into ? __fadd_rn(*o, acc[i][j]) : acc[i][j];
            }
        }
    }
}

// The second kernel of a split product: out[z, e] (= or +=) the sum of the splits' runs
// part[z·splits + s, e] in increasing s from +0 (sim: linalg::gemm); out's matrices (m·n = mn
// elements, n columns) product-major, or head-merged with `merged_out` (mat_at).
extern "C" __global__ void tl_gemm_sum_splits(const float* part, float* out, u64 total, u64 mn,
                                              u32 splits, u32 into, u32 n, u32 heads,
                                              u32 merged_out) {
    TL_GRID_STRIDE(e, total) {
        const u64 z = e / mn, r = e % mn;
        const float* p = part + z * splits * mn + r;
        float acc = 0.0f;
        for (u32 s = 0; s < splits; ++s) acc = __fadd_rn(acc, p[(u64)s * mn]);
        const MatAt pc = mat_at(z, (u32)(mn / n), n, heads, merged_out);
        float* o = out + pc.start + (r / n) * pc.ld + r % n;
        *o = into ? __fadd_rn(*o, acc) : acc;
    }
}
