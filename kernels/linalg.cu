// Matrix products: our own tiled, register-blocked GEMM, out = op(a) . op(b) with op(a) (m, k)
// and op(b) (k, n); `ta`: a stored (k, m); `tb`: b stored (n, k); with `into`, out <- out +
// op(a) . op(b) (the finished sum added to out's element with one rounding, as a separate add
// would). Batched over blockIdx.z (grid-stride). Each operand's matrices are product-major
// (batch, rows, cols), or head-merged (groups, rows, heads, cols) where its bit of `merged` is
// set (bit 0 a, bit 1 b, bit 2 out; product z is head z % heads of group z / heads); a or b
// head-merged and grouped (bit 3 a, bit 4 b: grouped-query attention's keys and values) holds
// kv_heads heads a row, (groups, rows, kv_heads, cols), product z reading head
// (z % heads) / (heads / kv_heads): `mat_at`, the arithmetic of Batch::at in
// device/buffer.rs. Each output accumulates over p in increasing
// order from 0 as fma(a, b, acc), one rounding a term (__fmaf_rn; f32::mul_add in
// device/sim/linalg.rs, bit for bit): tiling over k in order, and where the matrices lie, do
// not change the order. (The file is built with --fmad=false like every kernel: the fused
// multiply-add is asked for, never contracted by the compiler.)
//
// Two tilings of the same arithmetic, each 256 threads (16 x 16) with TM x TN outputs a thread
// in registers: `tl_gemm`, 64 x 64 outputs a block, 4 x 4 a thread, k in steps of 16; and
// `tl_gemm_wide`, 128 x 128 a block, 8 x 8 a thread, k in steps of 16, for products with
// enough of its tiles to fill the device (device/cuda.rs, `GemmTiles`). Both stage the next
// k-slice of op(a) and op(b) in registers while they multiply the current one out of one of
// two shared buffers (one barrier a slice), and read global memory along each operand's
// stored rows.
//
// The tensor-core GEMM `tl_gemm_tc` (autocast: bf16 or TF32 operands, f32 sums; device/cuda.rs
// launches it when the tape's precision is not F32) is at the end of the file.
#include "common.cuh"
#include "gemm_tc.cuh"
#include "gemm_tile.cuh"

// Where product z's (rows x cols) matrix starts in its operand, and its row stride; a
// head-merged operand holds `stored` heads a row (heads, or kv_heads where grouped).
struct MatAt {
    u64 start;
    u64 ld;
};
__device__ inline MatAt mat_at(u64 z, u32 rows, u32 cols, u32 heads, u32 stored, u32 merged) {
    MatAt r;
    if (merged) {
        r.start = (z / heads) * rows * stored * cols + (z % heads) / (heads / stored) * cols;
        r.ld = (u64)stored * cols;
    } else {
        r.start = z * rows * cols;
        r.ld = cols;
    }
    return r;
}

// One job of a product split along k into runs of kc (a multiple of 16 unless it covers k):
// job zz is run zz % splits of product z = zz / splits, k in [kb, ke); A, B the product's
// operands (transpose flags ta, tb; head-merged per `merged`), C the run's output matrix zz
// (tl_gemm_sum_splits adds the runs; unsplit, zz = z). One decomposition for tl_gemm,
// tl_gemm_wide and tl_gemm_tc (sim: linalg::gemm).
struct GemmJob {
    u32 kb, ke;
    MatAt pa, pb, pc;
    const float* A;
    const float* B;
    float* C;
};
__device__ inline u32 gemm_splits(u32 k, u32 kc) { return k > kc ? (k + kc - 1) / kc : 1; }
__device__ inline GemmJob gemm_job(u64 zz, u32 splits, const float* a, const float* b, float* out,
                                   u32 m, u32 k, u32 n, u32 ta, u32 tb, u32 kc, u32 heads,
                                   u32 merged, u32 kv_heads) {
    GemmJob j;
    const u64 z = zz / splits;
    j.kb = (u32)(zz % splits) * kc;
    j.ke = k - j.kb < kc ? k : j.kb + kc;
    j.pa = mat_at(z, ta ? k : m, ta ? m : k, heads, merged & 8 ? kv_heads : heads, merged & 1);
    j.pb = mat_at(z, tb ? n : k, tb ? k : n, heads, merged & 16 ? kv_heads : heads, merged & 2);
    j.pc = mat_at(zz, m, n, heads, heads, merged & 4);
    j.A = a + j.pa.start;
    j.B = b + j.pb.start;
    j.C = out + j.pc.start;
    return j;
}

// Element (row i, k index p) of op(a) (`ta`: a stored (k, m)) and element (k index p, column
// j) of op(b) (`tb`: b stored (n, k)) of a job, 0 outside the matrices or past the run's end.
__device__ inline float gemm_a_at(const GemmJob& g, u32 ta, u32 m, u32 i, u32 p) {
    return i < m && p < g.ke ? (ta ? g.A[p * g.pa.ld + i] : g.A[i * g.pa.ld + p]) : 0.0f;
}
__device__ inline float gemm_b_at(const GemmJob& g, u32 tb, u32 n, u32 p, u32 j) {
    return j < n && p < g.ke ? (tb ? g.B[j * g.pb.ld + p] : g.B[p * g.pb.ld + j]) : 0.0f;
}

// Element e (< BK x B) of a k-slice of one operand: its slice row p (along k) and column c
// (along m for a, n for b). A matrix stored along k (`along_k`: a not transposed, b
// transposed) is read with p fastest, else with c fastest, so that a warp's reads follow the
// stored rows.
template <int BK, int B>
__device__ inline void slice_pos(u32 e, bool along_k, u32& p, u32& c) {
    if (along_k) {
        p = e % BK;
        c = e / BK;
    } else {
        p = e / B;
        c = e % B;
    }
}

template <int BM, int BN, int BK, int TM, int TN>
__device__ void gemm_tiles(const float* a, const float* b, float* out, u32 batch, u32 m, u32 k,
                           u32 n, u32 ta, u32 tb, u32 into, u32 kc, u32 heads, u32 merged,
                           u32 kv_heads) {
    static_assert(BM == 16 * TM && BN == 16 * TN, "16 x 16 threads cover the tile");
    constexpr int LA = BK * BM / 256, LB = BK * BN / 256;  // elements a thread stages
    // Rows padded by 4 floats: 16-byte aligned for `ld4`, and a k-fastest fill spreads over
    // the banks.
    __shared__ __align__(16) float As[2][BK][BM + 4];
    __shared__ __align__(16) float Bs[2][BK][BN + 4];
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const u32 row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // Split-K: `k` in runs of kc (a multiple of 16 unless it covers k), run s of product z
    // written to out + (z·splits + s)·m·n for tl_gemm_sum_splits (sim: linalg::gemm); the
    // launch then clears out's bit of `merged`.
    const u32 splits = gemm_splits(k, kc);
    const u64 jobs = (u64)batch * splits;
    for (u64 zz = blockIdx.z; zz < jobs; zz += gridDim.z) {
        const GemmJob job =
            gemm_job(zz, splits, a, b, out, m, k, n, ta, tb, kc, heads, merged, kv_heads);
        const u32 kb = job.kb, ke = job.ke;
        // The k-slice from p0 into registers (zeros outside the matrices; never summed).
        float ra[LA], rb[LB];
        auto fetch = [&](u32 p0) {
            for (int l = 0; l < LA; ++l) {
                u32 p, i;
                slice_pos<BK, BM>(threadIdx.x + 256 * l, !ta, p, i);
                ra[l] = gemm_a_at(job, ta, m, row0 + i, p0 + p);
            }
            for (int l = 0; l < LB; ++l) {
                u32 p, j;
                slice_pos<BK, BN>(threadIdx.x + 256 * l, tb, p, j);
                rb[l] = gemm_b_at(job, tb, n, p0 + p, col0 + j);
            }
        };
        auto stage = [&](int buf) {
            for (int l = 0; l < LA; ++l) {
                u32 p, i;
                slice_pos<BK, BM>(threadIdx.x + 256 * l, !ta, p, i);
                As[buf][p][i] = ra[l];
            }
            for (int l = 0; l < LB; ++l) {
                u32 p, j;
                slice_pos<BK, BN>(threadIdx.x + 256 * l, tb, p, j);
                Bs[buf][p][j] = rb[l];
            }
        };
        float acc[TM][TN];
        tile_run(As, Bs, kb, ke, fetch, stage, acc);
        for (int i = 0; i < TM; ++i) {
            const u32 gi = row0 + reg_pos(ty, i);
            if (gi >= m) continue;
            for (int j = 0; j < TN; ++j) {
                const u32 gj = col0 + reg_pos(tx, j);
                if (gj >= n) continue;
                float* o = &job.C[gi * job.pc.ld + gj];
                *o = into ? __fadd_rn(*o, acc[i][j]) : acc[i][j];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) tl_gemm(const float* a, const float* b,
                                                          float* out, u32 batch, u32 m, u32 k,
                                                          u32 n, u32 ta, u32 tb, u32 into,
                                                          u32 kc, u32 heads, u32 merged,
                                                          u32 kv_heads) {
    gemm_tiles<64, 64, 16, 4, 4>(a, b, out, batch, m, k, n, ta, tb, into, kc, heads, merged,
                                 kv_heads);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    tl_gemm_wide(const float* a, const float* b, float* out, u32 batch, u32 m, u32 k, u32 n,
                 u32 ta, u32 tb, u32 into, u32 kc, u32 heads, u32 merged, u32 kv_heads) {
    gemm_tiles<128, 128, 16, 8, 8>(a, b, out, batch, m, k, n, ta, tb, into, kc, heads, merged,
                                   kv_heads);
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
        const MatAt pc = mat_at(z, (u32)(mn / n), n, heads, heads, merged_out);
        float* o = out + pc.start + (r / n) * pc.ld + r % n;
        *o = into ? __fadd_rn(*o, acc) : acc;
    }
}

// ---- Tensor cores (autocast) -------------------------------------------------------------------
//
// tl_gemm_tc: the products of tl_gemm (the same arguments, transpose flags, batch, head-merged
// operands, split-K runs of kc and `into`) on the tensor-core tile of gemm_tc.cuh (128 x 128
// outputs a block, `prec` 1: bf16, 2: TF32 operands rounded as they are staged, f32 sums), each
// job's depth run one tc::block. Each thread reads its slice elements in groups of four along
// the operand's stored rows: one 16-byte load where the matrix's start and row stride allow it
// and the group lies inside the matrix and the run, four scalar reads (gemm_a_at / gemm_b_at)
// otherwise; the finished sums go to global memory with the bounds and `into` of tl_gemm.
namespace tc {

constexpr int GA = BM * BK / 4 / THREADS, GB = BK * BN / 4 / THREADS;  // groups a thread stages

// Group g of a k-slice of one operand (B columns along m or n; `along_k` as slice_pos): its
// first element's slice row p and column c; the group's four elements follow the stored rows
// (p, p + 1, ... along k, else c, c + 1, ...).
template <int B>
__device__ inline void group_pos(u32 g, bool along_k, u32& p, u32& c) {
    slice_pos<BK / 4, B / 4>(g, along_k, p, c);
    if (along_k)
        p *= 4;
    else
        c *= 4;
}

// The four elements of op(a) (`is_a`; else op(b)) of a job from (row or column c, k index p)
// along the stored rows into r: one 16-byte load when `vec` (the matrix 16-byte aligned, its row
// stride a multiple of 4) and the group is inside the matrix (`lim` = m or n) and the run, else
// gemm_a_at / gemm_b_at (zeros outside).
__device__ inline void group_at(const GemmJob& g, bool is_a, u32 t, u32 lim, u32 c, u32 p,
                                bool along_k, bool vec, float* r) {
    const float* base = is_a ? g.A : g.B;
    const u64 ld = is_a ? g.pa.ld : g.pb.ld;
    if (vec && c < lim && p < g.ke && (along_k ? g.ke - p >= 4 : lim - c >= 4)) {
        ld4(along_k ? &base[c * ld + p] : &base[p * ld + c], r);
        return;
    }
    for (u32 q = 0; q < 4; ++q) {
        const u32 cq = along_k ? c : c + q, pq = along_k ? p + q : p;
        r[q] = is_a ? gemm_a_at(g, t, lim, cq, pq) : gemm_b_at(g, t, lim, pq, cq);
    }
}

template <class R>
__device__ void gemm(unsigned char* smem, const float* a, const float* b, float* out, u32 batch,
                     u32 m, u32 k, u32 n, u32 ta, u32 tb, u32 into, u32 kc, u32 heads,
                     u32 merged, u32 kv_heads) {
    const u32 row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const u32 splits = gemm_splits(k, kc);
    const u64 jobs = (u64)batch * splits;
    for (u64 zz = blockIdx.z; zz < jobs; zz += gridDim.z) {
        const GemmJob job =
            gemm_job(zz, splits, a, b, out, m, k, n, ta, tb, kc, heads, merged, kv_heads);
        const bool vec_a = reinterpret_cast<u64>(job.A) % 16 == 0 && job.pa.ld % 4 == 0;
        const bool vec_b = reinterpret_cast<u64>(job.B) % 16 == 0 && job.pb.ld % 4 == 0;
        // The slice from p0 into registers, as read (zeros outside the matrices and the run).
        float ra[GA][4], rb[GB][4];
        auto fetch = [&](u32 p0) {
            for (int l = 0; l < GA; ++l) {
                u32 p, i;
                group_pos<BM>(threadIdx.x + THREADS * l, !ta, p, i);
                group_at(job, true, ta, m, row0 + i, p0 + p, !ta, vec_a, ra[l]);
            }
            for (int l = 0; l < GB; ++l) {
                u32 p, j;
                group_pos<BN>(threadIdx.x + THREADS * l, tb, p, j);
                group_at(job, false, tb, n, col0 + j, p0 + p, tb, vec_b, rb[l]);
            }
        };
        // ... rounded into one buffer: As (BM x BK) and Bs (BK x BN) row-major.
        auto stage = [&](typename R::T* as, typename R::T* bs, int lda, int ldb) {
            for (int l = 0; l < GA; ++l) {
                u32 p, i;
                group_pos<BM>(threadIdx.x + THREADS * l, !ta, p, i);
                for (int q = 0; q < 4; ++q)
                    as[(ta ? i + q : i) * lda + (ta ? p : p + q)] = R::cvt(ra[l][q]);
            }
            for (int l = 0; l < GB; ++l) {
                u32 p, j;
                group_pos<BN>(threadIdx.x + THREADS * l, tb, p, j);
                for (int q = 0; q < 4; ++q)
                    bs[(tb ? p + q : p) * ldb + (tb ? j : j + q)] = R::cvt(rb[l][q]);
            }
        };
        auto put = [&](u32 r, u32 c, float v) {
            const u32 gi = row0 + r, gj = col0 + c;
            if (gi >= m || gj >= n) return;
            float* o = &job.C[gi * job.pc.ld + gj];
            *o = into ? __fadd_rn(*o, v) : v;
        };
        block<R>(smem, job.kb, job.ke, fetch, stage, put);
    }
}

}  // namespace tc

extern "C" __global__ void __launch_bounds__(256, 2)
    tl_gemm_tc(const float* a, const float* b, float* out, u32 batch, u32 m, u32 k, u32 n, u32 ta,
               u32 tb, u32 into, u32 kc, u32 heads, u32 merged, u32 kv_heads, u32 prec) {
    __shared__ __align__(32) unsigned char smem[tc::SMEM_BYTES];
    if (prec == 2)
        tc::gemm<tc::Tf32>(smem, a, b, out, batch, m, k, n, ta, tb, into, kc, heads, merged,
                           kv_heads);
    else
        tc::gemm<tc::Bf16>(smem, a, b, out, batch, m, k, n, ta, tb, into, kc, heads, merged,
                           kv_heads);
}
