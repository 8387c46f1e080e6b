//! The element-wise loops (and the GEMM's operand copies) give the same bits at every
//! instruction set this CPU has (`tl_tape_cpu::simd`): AVX-512 and AVX2 against the baseline,
//! forward and backward, f32 and f64, on lengths that leave a vector tail and on the values
//! where the formulas switch branches. This is the only module that changes the level (others
//! run at the default); its tests take [`LEVEL`] first, so they never change it under each
//! other.

use tl_ir::Op;
use tl_spec::ops::attention::Mask;
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::ops;
use tl_tape_cpu::simd::{self, Level};

use crate::common::{Dom, Rng, kernel_bits, pool2d, random};

/// Values where the kernels' formulas change branch or saturate, then random ones.
fn edgy(rng: &mut Rng, shape: &[usize], wide: f64) -> Tensor<f64> {
    let special = [
        0.0, -0.0, 0.625, -0.625, -0.75, 1e-8, -1e-8, 4.0, -4.0, 9.5, -9.5, 30.0, -30.0, 1e30,
        -1e30, 89.0, -104.0,
    ];
    let mut t = random(rng, &Shape::new(shape), Dom::Wide(wide));
    let data: Vec<f64> = t
        .data()
        .iter()
        .enumerate()
        .map(|(i, &v)| special.get(i).copied().unwrap_or(v))
        .collect();
    t = Tensor::new(Shape::new(shape), data).unwrap();
    t
}

/// `t` (at least 2-D) with its last row set to −∞.
fn neg_inf_row(t: Tensor<f64>) -> Tensor<f64> {
    let c = *t.shape().dims().last().unwrap_or(&1);
    let mut data = t.data().to_vec();
    let n = data.len();
    data[n - c..].fill(f64::NEG_INFINITY);
    Tensor::new(t.shape().clone(), data).unwrap()
}

/// Held by each test that sets the process-wide level.
static LEVEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`kernel_bits`] in `T` for inputs and cotangent given in f64.
fn run<T: Scalar>(op: &Op, inputs: &[Tensor<f64>], g: &Tensor<f64>) -> Vec<Vec<u64>> {
    let x: Vec<Tensor<T>> = inputs.iter().map(|t| t.cast()).collect();
    kernel_bits(op, &x, &g.cast())
}

#[test]
fn every_simd_level_gives_the_baseline_bits() {
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(0x51d);
    let (n, dm) = (37, 12); // 37: a vector tail at every width
    let w = |rng: &mut Rng| random(rng, &Shape::new(&[dm, dm]), Dom::Wide(0.5));
    let mha = |heads, mask, fused, rng: &mut Rng| {
        let op = Op::MultiHeadAttention { heads, mask, fused };
        let x = random(rng, &Shape::new(&[n, dm]), Dom::Any);
        (op, vec![w(rng), w(rng), w(rng), w(rng), x])
    };
    let cases: Vec<(Op, Vec<Tensor<f64>>)> = vec![
        (Op::Gelu, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Silu, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::GeluErf, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (
            Op::LeakyRelu {
                negative_slope: 0.2,
            },
            vec![edgy(&mut rng, &[3, n], 6.0)],
        ),
        (Op::Elu { alpha: 0.7 }, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Exp, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Relu, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Abs, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Sqrt, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Inv, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Tanh, vec![edgy(&mut rng, &[3, n], 6.0)]),
        // Positive (log refuses the rest): 0 becomes 1e-40, a subnormal in f32.
        (
            Op::Log,
            vec![edgy(&mut rng, &[3, n], 6.0).map(|v| v.abs().max(1e-40))],
        ),
        (Op::Sigmoid, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (Op::Softplus, vec![edgy(&mut rng, &[3, n], 6.0)]),
        (
            Op::SafeLog { eps: 1e-6 },
            vec![edgy(&mut rng, &[3, n], 6.0)],
        ),
        (Op::Scale(-0.3), vec![edgy(&mut rng, &[3, n], 6.0)]),
        (
            Op::Clamp {
                lo: -0.625,
                hi: 4.0,
            },
            vec![edgy(&mut rng, &[3, n], 6.0)],
        ),
        (
            Op::Mul,
            vec![edgy(&mut rng, &[3, n], 6.0), edgy(&mut rng, &[3, n], 6.0)],
        ),
        (
            Op::Div,
            vec![edgy(&mut rng, &[3, n], 6.0), edgy(&mut rng, &[3, n], 6.0)],
        ),
        (
            Op::Max,
            vec![edgy(&mut rng, &[3, n], 6.0), edgy(&mut rng, &[3, n], 6.0)],
        ),
        (
            Op::Sub,
            vec![edgy(&mut rng, &[3, n], 6.0), edgy(&mut rng, &[3, n], 6.0)],
        ),
        // softmax / logSoftmax rows, one of them all −∞ (NaN out, as PyTorch).
        (Op::Softmax, vec![neg_inf_row(edgy(&mut rng, &[4, n], 8.0))]),
        (
            Op::LogSoftmax,
            vec![neg_inf_row(edgy(&mut rng, &[4, n], 8.0))],
        ),
        (
            Op::MaskedSoftmax {
                mask: Mask::causal(n).unwrap(),
            },
            vec![edgy(&mut rng, &[2, n, n], 8.0)],
        ),
        // x·wᵀ: at AVX-512 the column-major wᵀ is copied row-major first (every side ≥ 16).
        (
            Op::Linear,
            vec![
                edgy(&mut rng, &[24, 40], 1.0),
                edgy(&mut rng, &[24], 1.0),
                edgy(&mut rng, &[n, 40], 2.0),
            ],
        ),
        // A wide x·wᵀ (k ≫ m): at AVX-512 and AVX2 x and the bias-filled output are copied
        // column-major, the product is added in column-major form and the result copied back
        // (gemm::column_major_product); k = 600 spans more than one of the kernel's k blocks.
        (
            Op::Linear,
            vec![
                edgy(&mut rng, &[48, 600], 1.0),
                edgy(&mut rng, &[48], 1.0),
                edgy(&mut rng, &[20, 600], 2.0),
            ],
        ),
        // 2×2/2 max pooling runs its pair kernel at the chosen level (rows of 5 outputs and a
        // cell in no window on each axis; ±0 and repeated values tie).
        (
            pool2d(2, 2, 0, false),
            vec![edgy(&mut rng, &[2, 3, 11, 10], 6.0).map(|v| v.round())],
        ),
        mha(3, None, false, &mut rng),
        mha(2, Some(Mask::causal(n).unwrap()), true, &mut rng),
        (
            Op::LayerNorm { eps: 1e-5 },
            vec![
                edgy(&mut rng, &[5, n], 4.0),
                edgy(&mut rng, &[n], 2.0),
                edgy(&mut rng, &[n], 2.0),
            ],
        ),
    ];
    let levels = Level::available();
    for (op, inputs) in &cases {
        let shape = ops::forward::<f64>(op, &inputs.iter().collect::<Vec<_>>(), &[])
            .unwrap()
            .shape()
            .clone();
        let g = random(&mut rng, &shape, Dom::Any);
        assert!(simd::set_level(Some(Level::Scalar)));
        let want32 = run::<f32>(op, inputs, &g);
        let want64 = run::<f64>(op, inputs, &g);
        for &level in &levels[1..] {
            assert!(simd::set_level(Some(level)));
            assert_eq!(simd::level(), level);
            assert!(
                run::<f32>(op, inputs, &g) == want32,
                "{} f32 at {level:?}",
                op.name()
            );
            assert!(
                run::<f64>(op, inputs, &g) == want64,
                "{} f64 at {level:?}",
                op.name()
            );
        }
    }
    simd::set_level(None);
}

/// The loops that call `exp` outside a map (cross-entropy's backward rows, the smooth max-pool's
/// backward scatter) run inside `simd::vectorize` too: the same bits at every level, f32 and
/// f64, values and the operand's cotangent.
#[test]
fn cross_entropy_and_smooth_max_pool_give_the_baseline_bits_at_every_level() {
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(0xce5);
    // 6 rows of 37 classes (one label out of range: that row has no gradient), a large logit.
    let mut logits = edgy(&mut rng, &[6, 37], 8.0).data().to_vec();
    logits[40] = 80.0;
    let logits = Tensor::new(Shape::new(&[6, 37]), logits).unwrap();
    let planes = edgy(&mut rng, &[2, 3, 9, 11], 3.0);
    let cases = [
        (
            Op::CrossEntropy { labels_at: 1 },
            logits,
            vec![99, 3, 0, 36, 37, 12, 5],
        ),
        (
            Op::smooth_max_pool2d_pad([3, 2], 2, 1, 4.0),
            planes.clone(),
            vec![],
        ),
        (Op::smooth_max_pool2d([2, 3], 1, -2.5), planes, vec![]),
    ];
    fn bits<T: Scalar>(op: &Op, x: &Tensor<f64>, g: &Tensor<f64>, nats: &[usize]) -> Vec<u64> {
        let (x, g): (Tensor<T>, Tensor<T>) = (x.cast(), g.cast());
        let y = ops::forward(op, &[&x], nats).unwrap();
        let dx = ops::backward(op, &[&x], &y, &g, nats).unwrap();
        let dx = dx[0].as_ref().unwrap();
        y.data()
            .iter()
            .chain(dx.data())
            .map(|v| v.as_f64().to_bits())
            .collect()
    }
    for (op, x, nats) in &cases {
        let shape = ops::forward::<f64>(op, &[x], nats).unwrap().shape().clone();
        let g = random(&mut rng, &shape, Dom::Any);
        assert!(simd::set_level(Some(Level::Scalar)));
        let (want32, want64) = (bits::<f32>(op, x, &g, nats), bits::<f64>(op, x, &g, nats));
        for &level in &Level::available()[1..] {
            assert!(simd::set_level(Some(level)));
            assert!(
                bits::<f32>(op, x, &g, nats) == want32,
                "{} f32 at {level:?}",
                op.name()
            );
            assert!(
                bits::<f64>(op, x, &g, nats) == want64,
                "{} f64 at {level:?}",
                op.name()
            );
        }
    }
    simd::set_level(None);
}
