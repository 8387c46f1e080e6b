//! The autocast products of [`super::matmul`] under [`Precision::Bf16`] or
//! [`Precision::Tf32`]: the operands rounded ([`Precision::round`]: bf16 nearest-even,
//! [`tl_spec::bf16::round`]; TF32 nearest, ties away, [`tl_spec::tf32::round`]), f32 sums.
//!
//! One code path for both, parameterised by the rounding (the bf16 kernel is
//! [`crate::precision::Bf16Kernel::Portable`]): `a` and `b` rounded into f32 copies (`b` kept
//! column-major when it was, so a linear layer's `x·wᵀ` takes the same layout paths), then the
//! f32 GEMM. A product of two bf16 (or two TF32) values is exact in f32, so the result is the
//! reference's arithmetic with the f32 GEMM's sums (their order: [`super`]'s module docs).
//!
//! No `vdpbf16ps` (AVX512-BF16) or AMX kernel: entering code compiled for those instructions
//! from the baseline takes an `unsafe` call, and the project keeps `unsafe` to its FFI modules
//! (docs/performance.md, "bf16 autocast on the CPU", says what that costs).

use tl_ir::Op;
use tl_spec::precision::Precision;

use super::{Mat, MatMut, product, row_major};
use crate::Result;

/// `c ← alpha·r(a)·r(b)` (`+ c` when `accumulate`), `r` the rounding of `p`, views checked
/// and `c` not empty: rounded f32 copies, then the f32 GEMM.
pub(super) fn matmul(
    p: Precision,
    op: &Op,
    c: MatMut<'_, f32>,
    accumulate: bool,
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    alpha: f32,
) -> Result<()> {
    let (m, k, n) = (a.g.rows, a.g.cols, b.g.cols);
    let ar = rounded(p, op, "rounded copy of a", a)?;
    // A column-major b (x·wᵀ) stays column-major: its transpose copied row-major.
    let b_column_major = b.g.rs == 1 && b.g.cs != 1;
    let br = match b_column_major {
        true => rounded(p, op, "rounded copy of b", b.t())?,
        false => rounded(p, op, "rounded copy of b", b)?,
    };
    let av = Mat {
        data: &ar[..],
        g: row_major(m, k),
    };
    let bv = match b_column_major {
        true => Mat {
            data: &br[..],
            g: row_major(n, k),
        }
        .t(),
        false => Mat {
            data: &br[..],
            g: row_major(k, n),
        },
    };
    product(c, accumulate, av, bv, alpha);
    tl_spec::pool::give(ar);
    tl_spec::pool::give(br);
    Ok(())
}

/// `v` rounded as `p` reads it, row-major.
fn rounded(p: Precision, op: &Op, what: &str, v: Mat<'_, f32>) -> Result<Vec<f32>> {
    let (r, c) = (v.g.rows, v.g.cols);
    let mut out = tl_spec::alloc::try_for_overwrite(op.name(), what, r * c)?;
    let contiguous = v.g.cs == 1 && v.g.rs == c;
    match v.data.get(v.g.offset..v.g.offset + r * c) {
        Some(src) if contiguous => {
            for (o, &x) in out.iter_mut().zip(src) {
                *o = p.round(x);
            }
        }
        _ => {
            for (i, row) in out.chunks_exact_mut(c.max(1)).enumerate().take(r) {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = p.round(v.data[v.g.at(i, j)]);
                }
            }
        }
    }
    Ok(out)
}
