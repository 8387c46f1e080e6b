//! The matmul kernel's arithmetic: one output element per thread (a tiled kernel computes the
//! same thing), accumulated over `k` in increasing order from `0.0` as `acc + a·b` with two
//! roundings (no FMA).

use crate::device::Gemm;

/// `out (m, n) = op(a) · op(b)` for one batch entry.
pub fn gemm(a: &[f32], b: &[f32], g: Gemm, out: &mut [f32]) {
    let Gemm { m, k, n, ta, tb } = g;
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                acc += av * bv;
            }
            out[i * n + j] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_flags_read_the_stored_layouts() {
        // a = [[1, 2], [3, 4]], b = [[5], [6]]
        let mut out = [0.0; 2];
        gemm(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1),
            &mut out,
        );
        assert_eq!(out, [17.0, 39.0]);
        // aᵀ stored: [[1, 3], [2, 4]] read transposed is a again
        gemm(
            &[1.0, 3.0, 2.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1).with_t(true, false),
            &mut out,
        );
        assert_eq!(out, [17.0, 39.0]);
        // bᵀ stored (1, 2) read transposed
        gemm(
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0],
            Gemm::nn(2, 2, 1).with_t(false, true),
            &mut out,
        );
        assert_eq!(out, [17.0, 39.0]);
    }
}
