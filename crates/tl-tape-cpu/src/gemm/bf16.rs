//! The bf16 products of [`super::matmul`] under [`crate::precision::Precision::Bf16`]: the
//! operands rounded to bf16 (nearest, ties to even: [`tl_spec::bf16::round`]), f32 sums.
//!
//! Two kernels ([`Bf16Kernel`], chosen at run time):
//! - **portable**: `a` and `b` rounded into f32 copies (`b` kept column-major when it was, so
//!   a linear layer's `x·wᵀ` takes the same layout paths), then the f32 GEMM. A product of two
//!   bf16 values is exact in f32, so the result is the reference's arithmetic with the f32
//!   GEMM's sums (their order: [`super`]'s module docs).
//! - **AVX512-BF16**: `a` packed in panels of [`avx512::MR`] rows and `b` in panels of
//!   [`avx512::NR`] columns, as bf16 pairs along k (a zero pair pads an odd k and the ragged
//!   panels), then one micro-kernel call per block of outputs ([`avx512::Token::tile`]: each
//!   output one f32 accumulator over the pairs of k in increasing order), the row panels split
//!   across threads as the f32 products are ([`super::split_threads`]: the bits do not depend
//!   on the thread count), and `c ← alpha·sum (+ c)` last. `vdpbf16ps` treats subnormal
//!   results (within [`tl_spec::bf16::accumulation_bound`]) and subnormal operands as zero
//!   (docs/semantics.md, "Mixed precision").

use tl_ir::Op;
use tl_spec::bf16::round;
#[cfg(target_arch = "x86_64")]
use tl_spec::bf16::to_bits;

#[cfg(target_arch = "x86_64")]
use super::split_threads;
use super::{Mat, MatMut, product, row_major};
use crate::Result;
#[cfg(target_arch = "x86_64")]
use crate::precision::Bf16Kernel;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512;

/// Whether this CPU has the AVX512-BF16 kernel's instructions.
pub(crate) fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::Token::try_new().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c ← alpha·bf16(a)·bf16(b)` (`+ c` when `accumulate`), views checked and `c` not empty.
pub(super) fn matmul(
    op: &Op,
    c: MatMut<'_, f32>,
    accumulate: bool,
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    alpha: f32,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if Bf16Kernel::current() == Bf16Kernel::Avx512Bf16
        && let Some(token) = avx512::Token::try_new()
    {
        return packed(op, token, c, accumulate, a, b, alpha);
    }
    portable(op, c, accumulate, a, b, alpha)
}

/// The portable kernel: rounded f32 copies, then the f32 GEMM.
fn portable(
    op: &Op,
    c: MatMut<'_, f32>,
    accumulate: bool,
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    alpha: f32,
) -> Result<()> {
    let (m, k, n) = (a.g.rows, a.g.cols, b.g.cols);
    let ar = rounded(op, "bf16 copy of a", a)?;
    // A column-major b (x·wᵀ) stays column-major: its transpose copied row-major.
    let b_column_major = b.g.rs == 1 && b.g.cs != 1;
    let br = match b_column_major {
        true => rounded(op, "bf16 copy of b", b.t())?,
        false => rounded(op, "bf16 copy of b", b)?,
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

/// `v` rounded to bf16, row-major.
fn rounded(op: &Op, what: &str, v: Mat<'_, f32>) -> Result<Vec<f32>> {
    let (r, c) = (v.g.rows, v.g.cols);
    let mut out = tl_spec::alloc::try_for_overwrite(op.name(), what, r * c)?;
    let contiguous = v.g.cs == 1 && v.g.rs == c;
    match v.data.get(v.g.offset..v.g.offset + r * c) {
        Some(src) if contiguous => {
            for (o, &x) in out.iter_mut().zip(src) {
                *o = round(x);
            }
        }
        _ => {
            for (i, row) in out.chunks_exact_mut(c.max(1)).enumerate().take(r) {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = round(v.data[v.g.at(i, j)]);
                }
            }
        }
    }
    Ok(out)
}

/// The pair of bf16 values `(lo, hi)` as one 32-bit lane, `lo` in the low half.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(to_bits(lo)) | (u32::from(to_bits(hi)) << 16)
}

/// The AVX512-BF16 kernel (see the module docs).
#[cfg(target_arch = "x86_64")]
fn packed(
    op: &Op,
    token: avx512::Token,
    c: MatMut<'_, f32>,
    accumulate: bool,
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    alpha: f32,
) -> Result<()> {
    use avx512::{MR, NR};
    let (m, k, n) = (a.g.rows, a.g.cols, b.g.cols);
    let kp = k.div_ceil(2);
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let name = op.name();
    let too_big = || {
        tl_spec::Error::shape(
            name,
            format!("bf16 packing of ({m}, {k}) · ({k}, {n}) overflows usize"),
        )
    };
    let a_len = mp.checked_mul(kp).ok_or_else(too_big)?;
    let b_len = np.checked_mul(kp).ok_or_else(too_big)?;
    let mut ap = tl_spec::alloc::try_vec(name, "packed bf16 a", a_len, [0u32; MR])?;
    let mut bp = tl_spec::alloc::try_vec(name, "packed bf16 b", b_len, [0u32; NR])?;
    // a's lines are its rows (k along its columns), b's its columns.
    let (ag, bg) = (a.g, b.g);
    let a_lines = Lines {
        data: a.data,
        offset: ag.offset,
        count: m,
        stride: ag.rs,
        k,
        k_stride: ag.cs,
    };
    let b_lines = Lines {
        data: b.data,
        offset: bg.offset,
        count: n,
        stride: bg.cs,
        k,
        k_stride: bg.rs,
    };
    let mut sums = tl_spec::alloc::try_for_overwrite::<f32>(name, "bf16 product", m * n)?;
    if kp == 0 {
        sums.fill(0.0);
    } else {
        crate::simd::vectorize(Pack {
            lines: a_lines,
            kp,
            out: &mut ap,
        });
        crate::simd::vectorize(Pack {
            lines: b_lines,
            kp,
            out: &mut bp,
        });
        let panels = Panels {
            token,
            a: &ap,
            b: &bp,
            kp,
            n,
        };
        panels.run(0, &mut sums, split_threads(m, n, k));
    }
    // c ← alpha·sum (+ c).
    for (i, row) in sums.chunks_exact(n).enumerate() {
        for (j, &s) in row.iter().enumerate() {
            let o = &mut c.data[c.g.at(i, j)];
            *o = match accumulate {
                true => *o + alpha * s,
                false => alpha * s,
            };
        }
    }
    tl_spec::pool::give(sums);
    Ok(())
}

/// An operand as `count` lines of `k` values: value `l` of line `x` at
/// `data[offset + x·stride + l·k_stride]` (a's rows, b's columns; views already checked).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Lines<'a> {
    data: &'a [f32],
    offset: usize,
    count: usize,
    stride: usize,
    k: usize,
    k_stride: usize,
}

#[cfg(target_arch = "x86_64")]
impl Lines<'_> {
    #[inline(always)]
    fn at(&self, x: usize, l: usize) -> f32 {
        match l < self.k {
            true => self.data[self.offset + x * self.stride + l * self.k_stride],
            false => 0.0,
        }
    }
}

/// The packing of one operand into panels of `W` lines (a kernel for
/// [`crate::simd::vectorize`]): panel `q`, pair `p`, lane `w` holds values `2p` and `2p + 1`
/// of line `q·W + w`, rounded ([`pair`]); lanes past the last line and the pair past an odd
/// k are left as they are (zero).
#[cfg(target_arch = "x86_64")]
struct Pack<'a, 'o, const W: usize> {
    lines: Lines<'a>,
    kp: usize,
    out: &'o mut [[u32; W]],
}

#[cfg(target_arch = "x86_64")]
impl<const W: usize> crate::simd::Kernel for Pack<'_, '_, W> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let (v, kp) = (self.lines, self.kp);
        for (q, panel) in self.out.chunks_exact_mut(kp).enumerate() {
            let x0 = q * W;
            let w = W.min(v.count.saturating_sub(x0));
            if v.k_stride == 1 {
                // Each line contiguous along k: its pairs in turn.
                for (lane, x) in (x0..x0 + w).enumerate() {
                    let start = v.offset + x * v.stride;
                    let line = &v.data[start..start + v.k];
                    let (pairs, rest) = line.as_chunks::<2>();
                    for (lanes, &[lo, hi]) in panel.iter_mut().zip(pairs) {
                        lanes[lane] = pair(lo, hi);
                    }
                    if let ([last], Some(lanes)) = (rest, panel.last_mut()) {
                        lanes[lane] = pair(*last, 0.0);
                    }
                }
            } else if v.stride == 1 {
                // The lines side by side: each pair of k is two contiguous runs.
                let run = |l: usize| {
                    let start = v.offset + l * v.k_stride + x0;
                    (l < v.k).then(|| &v.data[start..start + w])
                };
                for (p, lanes) in panel.iter_mut().enumerate() {
                    match (run(2 * p), run(2 * p + 1)) {
                        (Some(r0), Some(r1)) => {
                            for ((o, &lo), &hi) in lanes.iter_mut().zip(r0).zip(r1) {
                                *o = pair(lo, hi);
                            }
                        }
                        (Some(r0), None) => {
                            for (o, &lo) in lanes.iter_mut().zip(r0) {
                                *o = pair(lo, 0.0);
                            }
                        }
                        _ => {}
                    }
                }
            } else {
                for (p, lanes) in panel.iter_mut().enumerate() {
                    for (lane, x) in (x0..x0 + w).enumerate() {
                        lanes[lane] = pair(v.at(x, 2 * p), v.at(x, 2 * p + 1));
                    }
                }
            }
        }
    }
}

/// The packed operands of one AVX512-BF16 product.
#[cfg(target_arch = "x86_64")]
struct Panels<'a> {
    token: avx512::Token,
    a: &'a [[u32; avx512::MR]],
    b: &'a [[u32; avx512::NR]],
    /// Pairs of k per panel.
    kp: usize,
    /// Columns of the output.
    n: usize,
}

#[cfg(target_arch = "x86_64")]
impl Panels<'_> {
    /// The sums of rows `row0..row0 + out.len() / n` (whole panels but maybe the last) into
    /// `out` (row-major, `n` a row), on up to `threads` threads: the row panels halved
    /// across [`crate::par::join`], each output computed by one micro-kernel call whatever
    /// the split.
    fn run(&self, row0: usize, out: &mut [f32], threads: usize) {
        use avx512::MR;
        let n = self.n;
        let rows = out.len() / n;
        let panels = rows.div_ceil(MR);
        if threads > 1 && panels > 1 {
            let t1 = threads / 2;
            let mid = (panels * t1 / threads).max(1) * MR;
            let (top, bottom) = out.split_at_mut(mid * n);
            crate::par::join(
                || self.run(row0, top, t1),
                || self.run(row0 + mid, bottom, threads - t1),
            );
            return;
        }
        let kp = self.kp;
        for (jb, bpanel) in self.b.chunks_exact(kp).enumerate() {
            let (c0, c1) = (jb * avx512::NR, ((jb + 1) * avx512::NR).min(n));
            for (ip, rows_out) in out.chunks_mut(MR * n).enumerate() {
                let ib = row0 / MR + ip;
                let apanel = &self.a[ib * kp..(ib + 1) * kp];
                let sums = self.token.tile(apanel, bpanel);
                for (dst, src) in rows_out.chunks_exact_mut(n).zip(&sums) {
                    dst[c0..c1].copy_from_slice(&src[..c1 - c0]);
                }
            }
        }
    }
}
