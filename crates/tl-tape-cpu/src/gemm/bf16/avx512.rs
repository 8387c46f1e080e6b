//! The AVX512-BF16 micro-kernel of the bf16 products: an `MR × NR` block of outputs over
//! packed bf16 operand pairs, one `vdpbf16ps` per row and half-block per pair of k.
//!
//! The crate's only `unsafe`: calling [`tile`], a function compiled for `avx512f` and
//! `avx512bf16`, from code compiled for the baseline, which Rust allows only in an `unsafe`
//! block. A [`Token`] exists only where both features were detected at run time, and
//! [`Token::tile`] is the one call. Inside, every intrinsic used is a safe function in a
//! function with its features (Rust ≥ 1.87), and the vectors are built and read with
//! `pulp::cast` (bytemuck's checked plain-data casts), not `transmute`.

use core::arch::x86_64::{
    __m512, __m512bh, _mm512_dpbf16_ps, _mm512_set1_epi32, _mm512_setzero_ps,
};

/// Rows of a block (one register of a broadcast operand pair each).
pub(crate) const MR: usize = 8;
/// Columns of a block (two registers of 16 f32 sums).
pub(crate) const NR: usize = 32;

/// Proof that this CPU has `avx512f` and `avx512bf16`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Token(());

impl Token {
    /// A token where the CPU has both features.
    pub(crate) fn try_new() -> Option<Token> {
        let has =
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16");
        has.then_some(Token(()))
    }

    /// The block of sums `Σ_p a[p][i] · b[p][j]` over the packed pairs (see [`tile`]).
    #[inline]
    pub(crate) fn tile(self, a: &[[u32; MR]], b: &[[u32; NR]]) -> [[f32; NR]; MR] {
        // SAFETY: `tile` only needs the CPU features it is compiled for (its body is safe
        // code), and a `Token` is made only by `try_new` after detecting both of them.
        unsafe { tile(a, b) }
    }
}

/// `out[i][j] = Σ_p` (the two products of pair `a[p][i]` and pair `b[p][j]`), each output one
/// f32 accumulator over `p` in increasing order (within a pair, as `vdpbf16ps` adds them);
/// every pair is two bf16 values, element `2p` in the low half and `2p + 1` in the high half.
/// `a` and `b` are read up to the shorter length.
#[target_feature(enable = "avx512f,avx512bf16")]
fn tile(a: &[[u32; MR]], b: &[[u32; NR]]) -> [[f32; NR]; MR] {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for (ap, bp) in a.iter().zip(b) {
        let halves: [[u32; 16]; 2] = pulp::cast(*bp);
        let (b0, b1): (__m512bh, __m512bh) = (pulp::cast(halves[0]), pulp::cast(halves[1]));
        for (acc, &x) in acc.iter_mut().zip(ap) {
            let x: __m512bh = pulp::cast(_mm512_set1_epi32(x as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], x, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], x, b1);
        }
    }
    acc.map(|row: [__m512; 2]| pulp::cast(row))
}
