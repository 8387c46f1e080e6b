//! Products whose output is 16 columns wide: an attention head of 16 (`A·V_h`, `dS·K_h`, and the
//! accumulated `Aᵀ·dO_h`, `dSᵀ·Q_h`), where the gemm crate runs its 16-row micro-kernel after
//! packing both operands (docs/performance.md, "GEMM").
//!
//! At the AVX-512 level each output row is one register and `ROWS` (8) rows are summed at a time:
//! for each k, the right-hand side's row k (copied once into a contiguous buffer) is multiplied
//! by a broadcast of each left-hand element and added, one fused multiply-add per element. Each
//! output is one sum over k in order from zero, times `alpha` (unless 1), then added to `c` when
//! accumulating: the order the gemm crate's kernels keep on the shapes this path takes (one
//! k-block: its `kc` is at least `min(k, 512)`; not its small-product, matrix-vector,
//! horizontal or k ≤ 2 kernels), so the bits are those of the gemm path (the tests compare
//! them bit for bit) and do not depend on the level.

use super::{Geometry, Mat, MatMut};

/// The output width this path takes.
const WIDTH: usize = 16;

/// The deepest product (k) this path takes: within the gemm crate's first k-block (its `kc`
/// is at least `min(k, 512)`), so the sums run in the same order.
pub const MAX_K: usize = 512;

/// The most left-hand elements (m·k) this path takes: below this the product is one thread's
/// work (m·k·16 < [`super::PARALLEL_MIN_WORK`]), so taking it never depends on the thread count.
const MAX_MK: usize = super::PARALLEL_MIN_WORK / WIDTH;

/// Output rows summed at a time (their accumulators stay in registers; 16 was slower).
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 8;

/// Whether an `(m, k)·(k, 16)` f32 product into `c` takes this path: the AVX-512 level, a
/// right-hand side and an output 16 wide with unit column stride, 3 ≤ k ≤ `max_k` (the
/// [`crate::gates`] override of [`MAX_K`]; at k ≤ 2 the gemm crate takes its `gevv` kernel,
/// another order), m·k within one thread's work, and none of the gemm crate's other kernel
/// families (`super::sum_order_family`: more than one row and more than its small-product and
/// horizontal outputs).
pub(super) fn applies(a: &Geometry, b: &Geometry, c: &Geometry) -> bool {
    let (m, k) = (a.rows, a.cols);
    let max_k = crate::gates::get(|g| g.narrow_max_k, MAX_K).min(MAX_K);
    let [nano, row, column, horizontal, _] = super::sum_order_family(m, WIDTH, k);
    b.cols == WIDTH
        && b.cs == 1
        && c.cs == 1
        && (3..=max_k).contains(&k)
        && m.saturating_mul(k) <= MAX_MK
        && !(nano || column || row || horizontal)
        && crate::simd::level() == crate::simd::Level::Avx512
}

/// `c ← alpha·a·b (+ c)` for a product [`applies`] accepts, views already checked. Returns
/// `false` (nothing written: the caller's path runs) where AVX-512 is missing or the
/// contiguous copy of `b` cannot be allocated.
pub(super) fn product(
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    c: MatMut<'_, f32>,
    accumulate: bool,
    alpha: f32,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V4::try_new() {
        let (k, bd, b) = (a.g.cols, b.data, b.g);
        let Ok(mut rows) = tl_spec::alloc::try_for_overwrite(super::GEMM, "b's rows", k * WIDTH)
        else {
            return false;
        };
        for (kk, row) in rows.chunks_exact_mut(WIDTH).enumerate() {
            let o = b.offset + kk * b.rs;
            row.copy_from_slice(&bd[o..o + WIDTH]);
        }
        simd.vectorize(Kernel {
            simd,
            a,
            b: pulp::as_arrays::<WIDTH, f32>(&rows).0,
            c,
            accumulate,
            alpha,
        });
        tl_spec::pool::give(rows);
        return true;
    }
    let _ = (a, b, c, accumulate, alpha);
    false
}

/// One product at the AVX-512 level: `b` as contiguous 16-wide rows.
#[cfg(target_arch = "x86_64")]
struct Kernel<'a> {
    simd: pulp::x86::V4,
    a: Mat<'a, f32>,
    b: &'a [[f32; WIDTH]],
    c: MatMut<'a, f32>,
    accumulate: bool,
    alpha: f32,
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Kernel<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        use pulp::Simd;
        let Kernel {
            simd: s,
            a: Mat { data: ad, g: a },
            b,
            c: MatMut { data: cd, g: c },
            accumulate,
            alpha,
        } = self;
        let load = |v: &[f32; WIDTH]| -> pulp::f32x16 { pulp::cast(*v) };
        let fma = |x: f32, row, acc| s.mul_add_f32s(s.splat_f32s(x), row, acc);
        let (m, k) = (a.rows, a.cols);
        let mut i0 = 0;
        while i0 < m {
            let r = ROWS.min(m - i0);
            let mut acc = [s.splat_f32s(0.0); ROWS];
            if r == ROWS && a.cs == 1 {
                // Rows of a contiguous: each row's element k in turn.
                let rows: [&[f32]; ROWS] = core::array::from_fn(|j| {
                    let o = a.offset + (i0 + j) * a.rs;
                    &ad[o..o + k]
                });
                for (kk, bk) in b.iter().enumerate() {
                    let bk = load(bk);
                    for j in 0..ROWS {
                        acc[j] = fma(rows[j][kk], bk, acc[j]);
                    }
                }
            } else if r == ROWS && a.rs == 1 && a.cs >= a.rows {
                // Columns of a contiguous (a transposed matrix): ROWS elements of column k.
                let cols = ad[a.offset + i0..].chunks(a.cs);
                for (bk, col) in b.iter().zip(cols) {
                    let bk = load(bk);
                    let col = &col[..ROWS];
                    for j in 0..ROWS {
                        acc[j] = fma(col[j], bk, acc[j]);
                    }
                }
            } else {
                for (kk, bk) in b.iter().enumerate() {
                    let bk = load(bk);
                    for (j, acc) in acc.iter_mut().enumerate().take(r) {
                        *acc = fma(ad[a.at(i0 + j, kk)], bk, *acc);
                    }
                }
            }
            for (j, &sum) in acc.iter().enumerate().take(r) {
                let o = c.offset + (i0 + j) * c.rs;
                let dst: &mut [f32; WIDTH] = (&mut cd[o..o + WIDTH])
                    .try_into()
                    .expect("a 16-wide output row");
                let alpha_v = s.splat_f32s(alpha);
                let v = match (accumulate, alpha == 1.0) {
                    (false, true) => sum,
                    (false, false) => s.mul_f32s(alpha_v, sum),
                    (true, true) => s.add_f32s(load(dst), sum),
                    (true, false) => s.mul_add_f32s(alpha_v, sum, load(dst)),
                };
                *dst = pulp::cast(v);
            }
            i0 += r;
        }
    }
}
