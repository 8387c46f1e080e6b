//! Kernels that split their work across threads (the GEMM, pool planes, conv batch entries,
//! element-wise maps, the spectral conv's transforms and modes: `tl_tape_cpu::par`) give the same bits at every thread count, forward and backward, on
//! sizes above the thresholds where the split happens.

use tl_ir::Op;
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::{ops, par};

use crate::common::{Dom, Rng, at_threads, kernel_bits, pool2d, random};

#[test]
fn split_kernels_give_the_one_thread_bits_at_every_thread_count() {
    let mut rng = Rng(0x7e4d);
    let mut t =
        |dims: &[usize]| -> Tensor<f32> { random(&mut rng, &Shape::new(dims), Dom::Any).cast() };
    // 33 batch entries / 264 planes: blocks of unequal size. With each case, the work the
    // kernel counts (conv: batch · A · C·K · O; pool: input cells + output cells · K).
    let planes = 33 * 8 * 1600;
    let cases: Vec<(Op, Vec<Tensor<f32>>, usize)> = vec![
        (
            Op::conv2d(1, 1),
            vec![t(&[8, 3, 3, 3]), t(&[8]), t(&[33, 3, 20, 20])],
            33 * 8 * 27 * 400,
        ),
        (
            Op::conv_transpose2d(1, 1),
            vec![t(&[3, 8, 3, 3]), t(&[8]), t(&[33, 3, 20, 20])],
            33 * 3 * 72 * 400,
        ),
        (
            pool2d(2, 2, 0, false),
            vec![t(&[33, 8, 40, 40])],
            planes * 2,
        ),
        (
            pool2d(3, 2, 1, false),
            vec![t(&[33, 8, 40, 40])],
            planes + planes / 4 * 9,
        ),
        (
            pool2d(3, 1, 1, true),
            vec![t(&[33, 8, 40, 40])],
            planes * 10,
        ),
        // Element-wise maps (tl_tape_cpu::simd): output + operands streamed; an odd length, so
        // the last block has a tail.
        (Op::Relu, vec![t(&[3, 176_001])], 528_003 * 2),
        (Op::Tanh, vec![t(&[3, 176_001])], 528_003 * 2),
        (
            Op::Mul,
            vec![t(&[3, 176_001]), t(&[3, 176_001])],
            528_003 * 3,
        ),
        (
            Op::Max,
            vec![t(&[3, 176_001]), t(&[3, 176_001])],
            528_003 * 3,
        ),
        // The FNO's spectral conv: transforms split by slice (33), the mix by mode (17); the
        // work of the mix, B·W²·M (the transforms' B·N·W·log₂N is more).
        (
            Op::SpectralConv1dRfft { modes: 17 },
            vec![t(&[33, 64, 24]), t(&[17, 24, 24]), t(&[17, 24, 24])],
            33 * 24 * 24 * 17,
        ),
    ];
    for (op, inputs, work) in &cases {
        assert!(
            *work >= par::PARALLEL_MIN_ELEMENTS,
            "{op}: too small to split"
        );
        let x: Vec<&Tensor<f32>> = inputs.iter().collect();
        let y = ops::forward(op, &x, &[]).unwrap();
        let g = t(y.shape().dims());
        let want = at_threads(1, || kernel_bits(op, inputs, &g));
        for threads in [2, 3, 4] {
            assert!(
                at_threads(threads, || kernel_bits(op, inputs, &g)) == want,
                "{op} at {threads} threads"
            );
        }
    }
}

/// `TL_NUM_THREADS` (or `set_threads`) of any size: an absurd count (2⁶⁴ − 1, 2³²) splits no
/// further than the work allows and gives the one-thread bits, never an overflow or a panic.
#[test]
fn absurd_thread_counts_give_the_one_thread_bits() {
    use tl_tape_cpu::gates::{Gates, force};
    let mut rng = Rng(0x7e4e);
    let mut t =
        |dims: &[usize]| -> Tensor<f32> { random(&mut rng, &Shape::new(dims), Dom::Any).cast() };
    let cases: Vec<(Op, Vec<Tensor<f32>>)> = vec![
        (Op::Matmul, vec![t(&[37, 29]), t(&[29, 41])]),
        (Op::Relu, vec![t(&[3, 1001])]),
        (Op::Mul, vec![t(&[3, 1001]), t(&[3, 1001])]),
        (pool2d(2, 2, 0, false), vec![t(&[5, 3, 8, 8])]),
        (
            Op::conv2d(1, 1),
            vec![t(&[4, 3, 3, 3]), t(&[4]), t(&[5, 3, 6, 6])],
        ),
    ];
    for (op, inputs) in &cases {
        let x: Vec<&Tensor<f32>> = inputs.iter().collect();
        let y = ops::forward(op, &x, &[]).unwrap();
        let g = t(y.shape().dims());
        let want = {
            let _g = force(Gates::fast_paths_on(1));
            kernel_bits(op, inputs, &g)
        };
        for threads in [usize::MAX, usize::MAX / 2 + 1, 1 << 32, 1000] {
            let _g = force(Gates::fast_paths_on(threads));
            assert!(
                kernel_bits(op, inputs, &g) == want,
                "{op} at {threads} threads"
            );
        }
    }
}
