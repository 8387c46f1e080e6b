//! The CPU kernels, one module per op family, and the dispatch from an [`Op`] to them.
//!
//! Each family module exposes `forward(op, x)` and `backward(op, x, y, g)` with the signatures of
//! [`forward`] and [`backward`]; a family whose backward can skip work or reuse what the forward
//! kept has that form instead (`backward_masked(.., needed)`: [`linalg`], [`conv`];
//! `backward_saved(.., saved)`: [`activation`], [`attention`], [`norm`], [`cross_entropy`]),
//! where an empty list means every cotangent and nothing saved. The kernels are an implementation independent of the reference
//! rules (`tl_spec::ops`, `tl_ir::rules`), which the verification harness compares them against:
//! they never call those functions.
//!
//! - [`elementwise`] — pointwise maps, binary ops, `detach`, `constant`
//! - [`shape`] — reshape/flatten (no copy), permutations (blocked transposes), `broadcastTo`
//! - [`reduce`] — `sum`, `reduceSum`, `reduceMean`
//! - [`linalg`] — `matmul`, `bmm`, `linear` through [`crate::gemm`]
//! - [`softmax`] — row softmax and log-softmax along the last axis
//! - [`loss`] — `mseLoss`; [`cross_entropy`] — `crossEntropy` (labels from the Nat environment)
//! - [`mod@concat`] — `concat0`, `sliceRange0` (Shape family); [`activation`] — `gelu`, `silu`
//!   (Elementwise family)
//! - [`index`] — gathers (static, raw, Nat-environment, index-tensor) and scatter-adds
//! - [`loss`] — `mseLoss`
//! - [`norm`] — `layerNorm`, `batchnormChannelFirst` (two passes per group)
//! - [`attention`] — `maskedSoftmax`, `multiHeadAttention` (a GEMM core over blocks of query
//!   rows: all rows at once unfused, bounded blocks fused)
//! - [`conv`] — N-D `conv` and `convTranspose` through im2col + GEMM
//! - [`pool`] — N-D `maxPool`, `avgPool`, `smoothMaxPool` in one pass per channel plane
//! - [`spectral`] — `spectralConv1dRfft` (direct DFT over the kept modes)
//! - [`random`] — `randUniform`, `bernoulliMask`, `dropout` (bits from [`tl_spec::rng`])
//! - [`user`] — user ops ([`tl_ir::UserOp`]): their own kernels, results checked
//!
//! Shapes are checked by [`Op::infer_shape`] before a kernel runs; the kernels check again where
//! an inconsistency could otherwise index out of bounds, and return an error naming the op and the
//! shapes rather than panic.

pub mod activation;
mod approx;
pub mod attention;
pub mod concat;
pub mod conv;
pub mod cross_entropy;
pub mod elementwise;
pub mod index;
pub mod linalg;
pub mod loss;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod spectral;
pub mod user;
mod window;

use smallvec::SmallVec;
use tl_ir::{Family, Op};
use tl_spec::{Error as SpecError, Scalar, Shape, Tensor};

use crate::Result;

/// Operand cotangents of one node: one entry per operand, `None` where no gradient flows.
pub type Grads<T> = SmallVec<[Option<Tensor<T>>; 3]>;

/// Forward value of `op` on `x`, after its shape rule ([`Op::infer_shape`], whose error is
/// returned); `nats` is the Nat environment, read by the families that take runtime indices or
/// labels.
///
/// An output with no element is returned without running the kernel: there is nothing to
/// compute, and a kernel's loops over its operands' dims could run for hours (the rows of an
/// empty `[2⁶², 0]`).
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>], nats: &[usize]) -> Result<Tensor<T>> {
    // The shape rule first (the kernels are public: their operands may not have been checked).
    check_arity(op, x)?;
    let shape = out_shape(op, x)?;
    if shape.checked_numel() == Some(0) {
        return tensor(shape, Vec::new());
    }
    match op {
        Op::Concat | Op::Slice { .. } => return concat::forward(op, x),
        Op::Gelu | Op::Silu => return activation::forward(op, x),
        Op::CrossEntropy { .. } => return cross_entropy::forward(op, x, nats),
        _ => {}
    }
    match op.family() {
        Family::Elementwise => elementwise::forward(op, x),
        Family::Shape => shape::forward(op, x),
        Family::Reduce => reduce::forward(op, x),
        Family::Linalg => linalg::forward(op, x),
        Family::Softmax => softmax::forward(op, x),
        Family::Loss => loss::forward(op, x),
        Family::Index => index::forward(op, x, nats),
        Family::Norm => norm::forward(op, x),
        Family::Attention => attention::forward(op, x),
        Family::Conv => conv::forward(op, x),
        Family::Pool => pool::forward(op, x),
        Family::Spectral => spectral::forward(op, x),
        Family::Random => random::forward(op, x),
        Family::User => user::forward(op, x),
    }
}

/// [`forward`], plus the buffers the op's backward reads instead of computing them again
/// (PyTorch's saved tensors; hand them to [`backward_needed`]): `multiHeadAttention` keeps its
/// intermediates ([`attention::forward_saving`]), `gelu` its tanh term
/// ([`activation::forward_saving`]), `layerNorm` and `batchnormChannelFirst` each group's mean
/// and rstd ([`norm::forward_saving`]), `crossEntropy` each row's log-sum-exp
/// ([`cross_entropy::forward_saving`]), `safeLog` its `softplus(x) + ε`
/// ([`elementwise::forward_saving`]); every other op returns an empty list. The cotangents
/// have the same bits with or without them.
pub fn forward_saving<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    nats: &[usize],
) -> Result<(Tensor<T>, Vec<Vec<T>>)> {
    let keeps = matches!(
        op,
        Op::MultiHeadAttention { .. }
            | Op::ScaledDotProductAttention { .. }
            | Op::Gelu
            | Op::CrossEntropy { .. }
            | Op::SafeLog { .. }
    ) || op.family() == Family::Norm;
    if !keeps || out_shape(op, x)?.checked_numel() == Some(0) {
        return Ok((forward(op, x, nats)?, Vec::new()));
    }
    match op {
        Op::Gelu => activation::forward_saving(op, x),
        Op::CrossEntropy { .. } => cross_entropy::forward_saving(op, x, nats),
        Op::SafeLog { .. } => elementwise::forward_saving(op, x),
        _ if op.family() == Family::Norm => norm::forward_saving(op, x),
        _ => attention::forward_saving(op, x),
    }
}

/// Operand cotangents of `op` at `x` with output `y` and output cotangent `g`; `nats` is the
/// Nat environment the node's forward read. ([`backward_needed`] with every cotangent needed
/// and nothing saved.)
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    nats: &[usize],
) -> Result<Grads<T>> {
    backward_needed(op, x, y, g, &[], nats, &[])
}

/// Like [`backward`], computing only the cotangents whose `needed` entry is true (missing
/// entries count as true; the others are `None`), and reading what [`forward_saving`] kept in
/// `saved` (empty: computed again). The tape passes each parent's `requires_grad`. Matrix
/// products and convolutions skip the unneeded work; other families compute and discard.
pub fn backward_needed<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
    needed: &[bool],
    nats: &[usize],
    saved: &[Vec<T>],
) -> Result<Grads<T>> {
    let mut grads = match (op, op.family()) {
        (_, Family::Linalg) => return linalg::backward_masked(op, x, y, g, needed),
        (_, Family::Conv) => return conv::backward_masked(op, x, y, g, needed),
        (_, Family::Attention) => attention::backward_saved(op, x, y, g, saved)?,
        (Op::Gelu | Op::Silu, _) => activation::backward_saved(op, x, y, g, saved)?,
        (_, Family::Norm) => norm::backward_saved(op, x, y, g, saved)?,
        (Op::CrossEntropy { .. }, _) => cross_entropy::backward_saved(op, x, y, g, nats, saved)?,
        (Op::SafeLog { .. }, _) => elementwise::backward_saved(op, x, y, g, saved)?,
        (Op::Concat | Op::Slice { .. }, _) => concat::backward(op, x, y, g)?,
        (_, Family::Elementwise) => elementwise::backward(op, x, y, g)?,
        (_, Family::Shape) => shape::backward(op, x, y, g)?,
        (_, Family::Reduce) => reduce::backward(op, x, y, g)?,
        (_, Family::Softmax) => softmax::backward(op, x, y, g)?,
        (_, Family::Loss) => loss::backward(op, x, y, g)?,
        (_, Family::Index) => index::backward(op, x, y, g, nats)?,
        (_, Family::Pool) => pool::backward(op, x, y, g)?,
        (_, Family::Spectral) => spectral::backward(op, x, y, g)?,
        (_, Family::Random) => random::backward(op, x, y, g)?,
        (_, Family::User) => user::backward(op, x, y, g)?,
    };
    for (d, &n) in grads.iter_mut().zip(needed) {
        if !n {
            *d = None;
        }
    }
    Ok(grads)
}

/// `acc += c` elementwise (same shape, checked by the caller).
pub fn accumulate<T: Scalar>(acc: &mut Tensor<T>, c: &Tensor<T>) {
    for (a, &b) in acc.data_mut().iter_mut().zip(c.data()) {
        *a += b;
    }
}

// ---------------------------------------------------------------------------------------------
// helpers shared by the family modules

/// Check the operand count of `op` (the family modules are public, so they check it themselves).
pub(crate) fn check_arity<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<()> {
    if x.len() == op.arity() {
        Ok(())
    } else {
        Err(SpecError::Arity {
            op: op.name(),
            expected: op.arity(),
            got: x.len(),
        }
        .into())
    }
}

/// The error for an op handed to the kernels of another family.
pub(crate) fn wrong_family(op: &Op, family: &str) -> crate::Error {
    SpecError::param(op.name(), format!("not an op of the {family} family")).into()
}

/// Check that the buffers [`forward_saving`] kept for `op` (`saved`, non-empty) have the
/// `expected` lengths; a list that does not fit is an error naming the op.
pub(crate) fn check_saved<T>(op: &Op, saved: &[Vec<T>], expected: &[usize]) -> Result<()> {
    let fits =
        saved.len() == expected.len() && saved.iter().zip(expected).all(|(s, &e)| s.len() == e);
    if fits {
        return Ok(());
    }
    let got: Vec<usize> = saved.iter().map(Vec::len).collect();
    Err(SpecError::shape(
        op.name(),
        format!("saved buffers of lengths {got:?}, the forward keeps {expected:?}"),
    )
    .into())
}

/// Check a backward's operands: their count, and the cotangent `g` against the output `y`'s
/// shape.
pub(crate) fn check_backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<()> {
    check_arity(op, x)?;
    check_shape(op, "cotangent", g, y.shape())
}

/// Check that `t` (named `what` in the message) has shape `expected`.
pub(crate) fn check_shape<T: Scalar>(
    op: &Op,
    what: &str,
    t: &Tensor<T>,
    expected: &Shape,
) -> Result<()> {
    if t.shape() == expected {
        Ok(())
    } else {
        Err(SpecError::shape(
            op.name(),
            format!("{what} has shape {}, expected {expected}", t.shape()),
        )
        .into())
    }
}

/// The output shape of `op` on `x` by its shape rule, re-checked by kernels whose copies index
/// by it (an error rather than an out-of-bounds panic).
pub(crate) fn out_shape<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Shape> {
    let shapes: Vec<&Shape> = x.iter().map(|t| t.shape()).collect();
    Ok(op.infer_shape(&shapes)?)
}

/// A tensor of `shape` from a vector whose length is right by construction; the check stays, so
/// a kernel bug surfaces as an error rather than a panic.
pub(crate) fn tensor<T: Scalar>(shape: impl Into<Shape>, data: Vec<T>) -> Result<Tensor<T>> {
    Ok(Tensor::new(shape, data)?)
}

/// Sum of a slice with eight independent accumulators, so the compiler can vectorize it.
#[inline(always)]
pub(crate) fn sum_slice<T: Scalar>(v: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &x in rest {
        s += x;
    }
    s
}

/// ⟨a, b⟩ with eight independent accumulators (the slices have equal length); inlined, so that
/// inside a [`crate::simd::vectorize`] kernel it runs at the kernel's width.
#[inline(always)]
pub(crate) fn dot_slice<T: Scalar>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(xa).zip(xb) {
            *s += p * q;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (&p, &q) in ra.iter().zip(rb) {
        s += p * q;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_sums_equal_plain_sums_on_integers() {
        // Integers are summed exactly in any order, so the blocked sums must match exactly.
        for n in [0usize, 1, 7, 8, 9, 33] {
            let v: Vec<f64> = (0..n).map(|i| (i as f64) - 3.0).collect();
            let w: Vec<f64> = (0..n).map(|i| (i % 5) as f64).collect();
            assert_eq!(sum_slice(&v), v.iter().sum::<f64>());
            assert_eq!(
                dot_slice(&v, &w),
                v.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>()
            );
        }
    }

    #[test]
    fn arity_and_family_errors_name_the_op() {
        let x = Tensor::<f64>::zeros([2]);
        let e = forward(&Op::Add, &[&x], &[]).unwrap_err().to_string();
        assert!(e.contains("add") && e.contains("expected 2"), "{e}");
        let e = elementwise::forward(&Op::Matmul, &[&x, &x])
            .unwrap_err()
            .to_string();
        assert!(e.contains("matmul") && e.contains("elementwise"), "{e}");
    }
}
