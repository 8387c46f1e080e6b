//! The matmul kernel's arithmetic: one output element per thread (a tiled kernel computes the
//! same thing), accumulated over `k` in increasing order from `0.0` as `fma(a, b, acc)`, one
//! rounding a term (`f32::mul_add`; `__fmaf_rn` in the kernels). A product with few output tiles is split along `k`
//! ([`Gemm::k_chunk`]): each run of `k` is summed that way from `0.0`, then the runs' sums are
//! added in increasing order from `0.0` (the kernels `tl_gemm` and `tl_gemm_sum_splits`).
//!
//! **Autocast** (`Precision::Bf16` / `Tf32`, [`crate::precision`]): the twin of the
//! tensor-core kernel `tl_gemm_tc` as the kernel emulator runs it. Each operand element is
//! rounded as it is staged ([`Precision::round`]); each run of `k` (split as above but counting
//! the kernel's own 128×128 tiles, [`crate::device::TC_TILE`]: [`Gemm::k_chunk_tiled`]) is
//! summed from `0.0` as `fma(round(a), round(b), acc)` in increasing `k` order, the order the
//! emulator's `wmma::mma_sync` documents (each product of two rounded values is exact in f32,
//! so this is `acc + a·b` with one rounding a term), over the run padded with zeros to a
//! multiple of [`TC_K`]: the padding adds `fma(0, 0, acc)`, which is `acc + 0` (a `−0` sum
//! becomes `+0`). The runs are then added as above. On a GPU the tensor cores sum each tile
//! in their own order: within [`tl_spec::bf16::accumulation_bound`] of the reference, not
//! these bits.

use crate::device::{Batch, Gemm, split_tile};
use crate::precision::Precision;

/// The `k` depth of one staged slice of the tensor-core GEMM (`BK` of `tl_gemm_tc`): a run of
/// `k` is padded with zeros to a multiple of it.
pub const TC_K: usize = 16;

/// Where one matrix lies in its buffer: its first element and the stride between its rows
/// (from [`Batch::at`]).
#[derive(Debug, Clone, Copy)]
pub struct At {
    /// Index of element (0, 0).
    pub start: usize,
    /// Elements from one row to the next.
    pub ld: usize,
}

impl At {
    /// A contiguous row-major matrix of `cols` columns at the buffer's start.
    pub fn dense(cols: usize) -> At {
        At { start: 0, ld: cols }
    }

    /// Product `z`'s matrix in operand `which` of a batched product laid out as `bt`.
    pub fn of(bt: Batch, g: Gemm, which: usize, z: usize) -> At {
        let (start, ld) = bt.at(which, z, g.stored(which));
        At { start, ld }
    }
}

/// `out (m, n) = op(a) · op(b)` for one of `batch` products (the split is the whole batch's:
/// [`Gemm::k_chunk_tiled`] over the tiles of the kernel `prec` runs, [`split_tile`]), each
/// matrix where its [`At`] says, at precision `prec` (module docs).
pub fn gemm(
    a: (&[f32], At),
    b: (&[f32], At),
    g: Gemm,
    batch: usize,
    out: (&mut [f32], At),
    prec: Precision,
) {
    let Gemm { m, k, n, ta, tb } = g;
    let ((a, pa), (b, pb), (out, po)) = (a, b, out);
    let chunk = g.k_chunk_tiled(batch, split_tile(prec));
    // Element (i, p) of op(a) at a_row·i + a_step·p, (p, j) of op(b) at b_step·p + b_col·j.
    let (a_row, a_step) = if ta { (1, pa.ld) } else { (pa.ld, 1) };
    let (b_step, b_col) = if tb { (1, pb.ld) } else { (pb.ld, 1) };
    for i in 0..m {
        for j in 0..n {
            let run = |p0: usize, p1: usize| {
                let (mut ai, mut bi) = (
                    pa.start + i * a_row + p0 * a_step,
                    pb.start + p0 * b_step + j * b_col,
                );
                let mut acc = 0.0f32;
                if prec.is_autocast() {
                    for _ in p0..p1 {
                        acc = prec.round(a[ai]).mul_add(prec.round(b[bi]), acc);
                        ai += a_step;
                        bi += b_step;
                    }
                    return tc_padded(acc, p1 - p0, prec);
                }
                for _ in p0..p1 {
                    acc = a[ai].mul_add(b[bi], acc);
                    ai += a_step;
                    bi += b_step;
                }
                acc
            };
            out[po.start + i * po.ld + j] = split_sum(k, chunk, run);
        }
    }
}

/// A run's sum `acc` of `len` terms as the tensor-core kernels leave it at `prec`: under
/// autocast plus `0.0` where `len` is not a multiple of [`TC_K`] (the last slice's zero
/// padding adds `fma(0, 0, acc)`: a `−0` sum becomes `+0`); `acc` itself in f32. Shared by
/// [`gemm`] and the implicit conv's twins ([`super::conv`]).
pub fn tc_padded(acc: f32, len: usize, prec: Precision) -> f32 {
    if prec.is_autocast() && !len.is_multiple_of(TC_K) {
        acc + 0.0
    } else {
        acc
    }
}

/// One output of a product whose `k` is split into runs of `chunk` ([`Gemm::k_chunk`]):
/// `run(0, k)` where one run covers `k`, else each run's sum `run(p0, p1)` added in increasing
/// order from `0.0` (`tl_gemm_sum_splits`). Shared by [`gemm`] and the implicit-GEMM conv's
/// weight cotangent ([`super::conv::conv_implicit_dw`]).
pub fn split_sum(k: usize, chunk: usize, run: impl Fn(usize, usize) -> f32) -> f32 {
    if chunk >= k {
        run(0, k)
    } else {
        (0..k)
            .step_by(chunk)
            .fold(0.0f32, |acc, p0| acc + run(p0, (p0 + chunk).min(k)))
    }
}

/// [`gemm`] on contiguous row-major operands.
pub fn gemm_dense(a: &[f32], b: &[f32], g: Gemm, batch: usize, out: &mut [f32], prec: Precision) {
    let dense = |which| At::dense(g.stored(which).1);
    gemm(
        (a, dense(0)),
        (b, dense(1)),
        g,
        batch,
        (out, dense(2)),
        prec,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_flags_read_the_stored_layouts() {
        // a = [[1, 2], [3, 4]], b = [[5], [6]]
        let mut out = [0.0; 2];
        gemm_dense(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1),
            1,
            &mut out,
            Precision::F32,
        );
        assert_eq!(out, [17.0, 39.0]);
        // aᵀ stored: [[1, 3], [2, 4]] read transposed is a again
        gemm_dense(
            &[1.0, 3.0, 2.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1).with_t(true, false),
            1,
            &mut out,
            Precision::F32,
        );
        assert_eq!(out, [17.0, 39.0]);
        // bᵀ stored (1, 2) read transposed
        gemm_dense(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1).with_t(false, true),
            1,
            &mut out,
            Precision::F32,
        );
        assert_eq!(out, [17.0, 39.0]);
    }

    #[test]
    fn each_term_is_one_fused_multiply_add() {
        // −1·1, then (1 + ε)(1 − ε) = 1 − ε² exactly: rounded on its own that product is 1 and
        // the sum 0; one fused rounding keeps −ε².
        let e = f32::EPSILON;
        let mut out = [0.0f32];
        gemm_dense(
            &[-1.0, 1.0 + e],
            &[1.0, 1.0 - e],
            Gemm::nn(1, 2, 1),
            1,
            &mut out,
            Precision::F32,
        );
        assert_eq!(out[0], -e * e, "fma(1+ε, 1−ε, −1)");
        assert_eq!((1.0 + e) * (1.0 - e) - 1.0, 0.0, "two roundings lose it");
    }

    #[test]
    fn a_split_product_adds_the_runs_sums_in_order() {
        // One output over k = 4096 (one tile): split into runs of `k_chunk`.
        let k = 4096;
        let g = Gemm::nn(1, k, 1);
        let chunk = g.k_chunk(1);
        assert!(chunk < k && chunk.is_multiple_of(16), "chunk {chunk}");
        assert_eq!(g.k_splits(1), k.div_ceil(chunk));
        let a: Vec<f32> = (0..k).map(|p| 1.0 + (p as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k).map(|p| (p as f32 * 0.11).cos() * 1e-3).collect();
        let mut out = [0.0f32];
        gemm_dense(&a, &b, g, 1, &mut out, Precision::F32);
        let want = a
            .chunks(chunk)
            .zip(b.chunks(chunk))
            .map(|(x, y)| x.iter().zip(y).fold(0.0f32, |s, (p, q)| p.mul_add(*q, s)))
            .fold(0.0f32, |s, r| s + r);
        assert_eq!(out[0].to_bits(), want.to_bits());
        let straight = a.iter().zip(&b).fold(0.0f32, |s, (p, q)| p.mul_add(*q, s));
        assert_ne!(
            want.to_bits(),
            straight.to_bits(),
            "the orders must differ here"
        );
        // Many tiles, or a short k: no split.
        assert_eq!(Gemm::nn(512, k, 512).k_chunk(1), k);
        assert_eq!(Gemm::nn(1, 200, 1).k_chunk(1), 200);
        assert_eq!(Gemm::nn(1, 0, 1).k_chunk(1), 1);
    }

    #[test]
    fn an_autocast_product_splits_as_the_tensor_core_kernel_counts_its_tiles() {
        // 16 products of 65 × 70 over k = 300: 64 tiles of 64 (the f32 GEMM does not split),
        // 16 of 128 (the tensor-core kernel's: runs of 160 and 140).
        let (g, batch) = (Gemm::nn(65, 300, 70), 16);
        assert_eq!(g.k_splits(batch), 1);
        assert_eq!(g.k_chunk_tiled(batch, crate::device::TC_TILE), 160);
        let p = Precision::Bf16;
        let a: Vec<f32> = (0..65 * 300)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let b: Vec<f32> = (0..300 * 70).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0.0f32; 65 * 70];
        gemm_dense(&a, &b, g, batch, &mut out, p);
        let (mut split_differs, mut f32_out) = (0, vec![0.0f32; 65 * 70]);
        gemm_dense(&a, &b, g, batch, &mut f32_out, Precision::F32);
        for i in 0..65 {
            for j in 0..70 {
                let run = |p0: usize, p1: usize| {
                    (p0..p1).fold(0.0f32, |s, q| {
                        p.round(a[i * 300 + q]).mul_add(p.round(b[q * 70 + j]), s)
                    })
                };
                let want = 0.0 + run(0, 160) + (run(160, 300) + 0.0);
                let got = out[i * 70 + j];
                assert_eq!(got.to_bits(), want.to_bits(), "({i}, {j})");
                split_differs += usize::from(got.to_bits() != run(0, 300).to_bits());
            }
        }
        assert!(split_differs > 0, "the orders must differ somewhere");
        // The f32 product at the same shape is one run (k_chunk's decision).
        let straight = (0..300).fold(0.0f32, |s, q| a[q].mul_add(b[q * 70], s));
        assert_eq!(f32_out[0].to_bits(), straight.to_bits());
    }

    #[test]
    fn autocast_rounds_each_operand_and_pads_k_to_the_tensor_core_depth() {
        // 1 + 2⁻⁹ rounds to 1 in bf16; TF32 (10 fraction bits) keeps it.
        let x = 1.0 + 2f32.powi(-9);
        let mut out = [0.0f32];
        gemm_dense(
            &[x],
            &[3.0],
            Gemm::nn(1, 1, 1),
            1,
            &mut out,
            Precision::Bf16,
        );
        assert_eq!(out[0], 3.0);
        gemm_dense(
            &[x],
            &[3.0],
            Gemm::nn(1, 1, 1),
            1,
            &mut out,
            Precision::Tf32,
        );
        assert_eq!(out[0], 3.0 * x);
        // An underflowing product sums to −0 in f32; a run padded to 16 adds fma(0, 0, −0),
        // which is +0; a run of exactly 16 terms is not padded.
        let (a, b) = ([-2f32.powi(-100)], [2f32.powi(-100)]);
        gemm_dense(&a, &b, Gemm::nn(1, 1, 1), 1, &mut out, Precision::F32);
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
        gemm_dense(&a, &b, Gemm::nn(1, 1, 1), 1, &mut out, Precision::Bf16);
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
        let (a16, b16) = ([a[0]; TC_K], [b[0]; TC_K]);
        gemm_dense(
            &a16,
            &b16,
            Gemm::nn(1, TC_K, 1),
            1,
            &mut out,
            Precision::Bf16,
        );
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
    }
}
