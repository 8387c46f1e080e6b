//! Conv and pool conventions worked by hand, checked on the IR reference rules and the CPU
//! kernels alike: a 2-D conv with stride and padding, convTranspose as the adjoint of conv,
//! maxPool ties and padding, the avgPool divisor, smoothMaxPool limits and padding, rank 8 vs 9,
//! and an error naming the op for every kind of bad input.

use tl_ir::{Op, rules};
use tl_spec::{Shape, Tensor};
use tl_tape_cpu::ops;

fn t(shape: &[usize], data: &[f64]) -> Tensor<f64> {
    Tensor::new(shape, data.to_vec()).unwrap()
}

/// A deterministic, irregular fill.
fn fill(shape: &[usize], seed: usize) -> Tensor<f64> {
    Tensor::from_fn(shape, |i| (((i + seed) * 37 % 23) as f64 - 11.0) / 7.0)
}

/// The value on the IR and on the CPU tape (which must agree to rounding).
fn value(op: &Op, x: &[&Tensor<f64>]) -> Tensor<f64> {
    let ir = rules::value(op, x, &[]).unwrap();
    let cpu = ops::forward(op, x, &[]).unwrap();
    assert_eq!(ir.shape(), cpu.shape(), "{op:?}");
    close(cpu.data(), ir.data(), 1e-12);
    ir
}

/// Operand cotangents on the IR and on the CPU tape (which must agree to rounding).
fn grads(op: &Op, x: &[&Tensor<f64>], g: &Tensor<f64>) -> Vec<Tensor<f64>> {
    let ir = rules::vjp(op, x, g, &[]).unwrap();
    let y = ops::forward(op, x, &[]).unwrap();
    let cpu = ops::backward(op, x, &y, g, &[]).unwrap();
    ir.into_iter()
        .zip(cpu)
        .map(|(a, b)| {
            let (a, b) = (a.unwrap(), b.unwrap());
            close(b.data(), a.data(), 1e-12);
            a
        })
        .collect()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "got {got:?}, want {want:?}");
    }
}

fn dot(a: &Tensor<f64>, b: &Tensor<f64>) -> f64 {
    a.data().iter().zip(b.data()).map(|(x, y)| x * y).sum()
}

#[test]
fn two_d_conv_with_stride_2_and_padding_1_by_hand() {
    // x = [[1,2,3],[4,5,6],[7,8,9]], w = [[1,2],[3,4]], b = 0.5; windows start at (−1,−1),
    // (−1,1), (1,−1), (1,1) of the zero-padded input.
    let x = t(&[1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = t(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let b = t(&[1], &[0.5]);
    let op = Op::conv2d(2, 1);
    let y = value(&op, &[&w, &b, &x]);
    assert_eq!(y.shape().dims(), &[1, 2, 2]);
    // (0,0): 4·1; (0,1): 3·2 + 4·3; (1,0): 2·4 + 4·7; (1,1): 1·5 + 2·6 + 3·8 + 4·9.
    close(y.data(), &[4.5, 18.5, 36.5, 77.5], 1e-12);
    // With g = 1 everywhere: db = 4, dw[k] = Σ of the cells k reads, dx = Σ of the weights
    // that read each cell.
    let g = Tensor::ones([1, 2, 2]);
    let d = grads(&op, &[&w, &b, &x], &g);
    close(
        d[0].data(),
        &[5.0, 6.0 + 4.0, 8.0 + 2.0, 1. + 3. + 7. + 9.],
        1e-12,
    );
    close(d[1].data(), &[4.0], 1e-12);
    close(d[2].data(), &[4., 3., 4., 2., 1., 2., 4., 3., 4.], 1e-12);
}

#[test]
fn conv_transpose_is_the_adjoint_of_conv() {
    // ⟨conv(w, 0, x), y⟩ = ⟨x, convT(w, 0, y)⟩ with the same weight, unbatched and batched.
    let (stride, padding) = (vec![2, 1], vec![1, 0]);
    let conv = Op::Conv {
        stride: stride.clone(),
        padding: padding.clone(),
    };
    let convt = Op::ConvTranspose { stride, padding };
    let w = fill(&[2, 3, 3, 2], 1);
    for batch in [None, Some(2)] {
        let lead: Vec<usize> = batch.into_iter().collect();
        let xs = Shape::from([lead.clone(), vec![3, 5, 4]].concat());
        let ys = Shape::from([lead, vec![2, 3, 3]].concat());
        let x = fill(xs.dims(), 5);
        let y = fill(ys.dims(), 11);
        let cx = value(&conv, &[&w, &Tensor::zeros([2]), &x]);
        assert_eq!(cx.shape(), &ys);
        let ty = value(&convt, &[&w, &Tensor::zeros([3]), &y]);
        assert_eq!(ty.shape(), &xs);
        let (l, r) = (dot(&cx, &y), dot(&x, &ty));
        assert!((l - r).abs() < 1e-10 * l.abs().max(1.0), "{l} vs {r}");
    }
}

#[test]
fn max_pool_tie_sends_the_whole_gradient_to_the_first_cell() {
    let x = t(&[1, 4], &[1.0, 3.0, 3.0, 0.0]);
    let op = Op::MaxPool {
        kernel: vec![4],
        stride: vec![1],
        padding: vec![0],
    };
    assert_eq!(value(&op, &[&x]).data(), &[3.0]);
    let d = grads(&op, &[&x], &t(&[1, 1], &[2.5]));
    assert_eq!(d[0].data(), &[0.0, 2.5, 0.0, 0.0]);
    // 2-D: a tie between (0,1) and (1,0): row-major order picks (0,1).
    let x2 = t(&[1, 2, 2], &[0.0, 7.0, 7.0, 1.0]);
    let d2 = grads(&Op::max_pool2d([2, 2], 1), &[&x2], &t(&[1, 1, 1], &[1.0]));
    assert_eq!(d2[0].data(), &[0.0, 1.0, 0.0, 0.0]);
    // Padded windows (the general argmax): [2, 5, 5] with kernel 2, padding 1 has windows
    // [pad, 2], [2, 5], [5, 5], [5, pad]; the tie [5, 5] goes to its first cell.
    let op = Op::MaxPool {
        kernel: vec![2],
        stride: vec![1],
        padding: vec![1],
    };
    let d = grads(&op, &[&t(&[1, 3], &[2.0, 5.0, 5.0])], &Tensor::ones([1, 4]));
    assert_eq!(d[0].data(), &[1.0, 2.0, 1.0]);
    // 2×2/2 (the pair kernel): three 3s tie in the first window, three 2s in the second.
    let x3 = t(&[1, 2, 4], &[3.0, 3.0, 1.0, 2.0, 3.0, 0.0, 2.0, 2.0]);
    let op = Op::max_pool2d([2, 2], 2);
    assert_eq!(value(&op, &[&x3]).data(), &[3.0, 2.0]);
    let d3 = grads(&op, &[&x3], &t(&[1, 1, 2], &[1.0, 2.0]));
    assert_eq!(d3[0].data(), &[1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    // A tie of −0 and +0 keeps the first cell's sign, on the IR and on the CPU.
    let x4 = t(&[1, 2, 2], &[-0.0, 0.0, -1.0, -2.0]);
    let ir = rules::value(&op, &[&x4], &[]).unwrap();
    let cpu = ops::forward(&op, &[&x4], &[]).unwrap();
    assert!(ir.data()[0] == 0.0 && ir.data()[0].is_sign_negative());
    assert_eq!(cpu.data()[0].to_bits(), ir.data()[0].to_bits());
}

#[test]
fn max_pool_ignores_padding() {
    // All negative with padding 1: every output is a real value, never the padded 0.
    let x = t(&[1, 2, 2], &[-3.0, -1.0, -4.0, -2.0]);
    let op = Op::max_pool2d_pad([2, 2], 1, 1);
    let y = value(&op, &[&x]);
    assert_eq!(y.shape().dims(), &[1, 3, 3]);
    assert_eq!(y.data(), &[-3., -1., -1., -3., -1., -1., -4., -2., -2.]);
    let d = grads(&op, &[&x], &Tensor::ones([1, 3, 3]));
    // Cell counts as argmax: −3 in 2 windows, −1 in 4, −4 in 1, −2 in 2.
    assert_eq!(d[0].data(), &[2.0, 4.0, 1.0, 2.0]);
}

#[test]
fn avg_pool_divides_by_the_kernel_volume_at_the_border() {
    let x = t(&[1, 2], &[2.0, 4.0]);
    let op = Op::AvgPool {
        kernel: vec![3],
        stride: vec![1],
        padding: vec![1],
    };
    // Windows [pad, 2, 4] and [2, 4, pad]: 6/3 each (not 6/2).
    assert_eq!(value(&op, &[&x]).data(), &[2.0, 2.0]);
    let d = grads(&op, &[&x], &t(&[1, 2], &[3.0, 6.0]));
    close(d[0].data(), &[3.0, 3.0], 1e-12);
    // 2-D corner: the 2×2 window at (−1,−1) holds one real cell and divides by 4.
    let y = value(&Op::avg_pool2d_pad([2, 2], 1, 1), &[&t(&[1, 1, 1], &[8.0])]);
    assert_eq!(y.data(), &[2.0, 2.0, 2.0, 2.0]);
}

#[test]
fn smooth_max_pool_tends_to_max_and_min_pool() {
    let x = fill(&[2, 3, 4], 3);
    let (k, s, p) = (vec![2, 3], vec![1, 1], vec![0, 0]);
    let max = value(
        &Op::MaxPool {
            kernel: k.clone(),
            stride: s.clone(),
            padding: p.clone(),
        },
        &[&x],
    );
    let neg = x.map(|v| -v);
    let min = value(
        &Op::MaxPool {
            kernel: k.clone(),
            stride: s.clone(),
            padding: p.clone(),
        },
        &[&neg],
    )
    .map(|v| -v);
    for beta in [200.0, -200.0] {
        let op = Op::SmoothMaxPool {
            kernel: k.clone(),
            stride: s.clone(),
            padding: p.clone(),
            beta,
        };
        let y = value(&op, &[&x]);
        let want = if beta > 0.0 { &max } else { &min };
        // |smooth − hard| ≤ ln(window volume)/|β|.
        close(y.data(), want.data(), 6f64.ln() / 200.0 + 1e-12);
        // The gradient concentrates on the argmax (argmin) cell: it matches the hard pool's.
        let g = fill(y.shape().dims(), 7);
        let hard = if beta > 0.0 {
            grads(
                &Op::MaxPool {
                    kernel: k.clone(),
                    stride: s.clone(),
                    padding: p.clone(),
                },
                &[&x],
                &g,
            )
        } else {
            grads(
                &Op::MaxPool {
                    kernel: k.clone(),
                    stride: s.clone(),
                    padding: p.clone(),
                },
                &[&neg],
                &g,
            )
        };
        close(grads(&op, &[&x], &g)[0].data(), hard[0].data(), 1e-6);
    }
}

#[test]
fn smooth_max_pool_padded_cells_contribute_zero() {
    // Window [pad, −5] with β = 1: y = log(e⁰ + e⁻⁵); the real cell's weight is e⁻⁵/(1 + e⁻⁵).
    let x = t(&[1, 1], &[-5.0]);
    let op = Op::SmoothMaxPool {
        kernel: vec![2],
        stride: vec![1],
        padding: vec![1],
        beta: 1.0,
    };
    let e = (-5f64).exp();
    close(
        value(&op, &[&x]).data(),
        &[(1.0 + e).ln(), (1.0 + e).ln()],
        1e-12,
    );
    let d = grads(&op, &[&x], &t(&[1, 2], &[1.0, 1.0]));
    close(d[0].data(), &[2.0 * e / (1.0 + e)], 1e-12);
    // β < 0: the pivot is the min, and the padded 0 still counts: y = −log(e⁰ + e⁵) ≈ −5.
    let opn = Op::SmoothMaxPool {
        kernel: vec![2],
        stride: vec![1],
        padding: vec![1],
        beta: -1.0,
    };
    close(
        value(&opn, &[&x]).data(),
        &[-(1.0 + 1.0 / e).ln(); 2],
        1e-12,
    );
}

#[test]
fn rank_8_conv_works_and_rank_9_is_an_error() {
    let mut wd = vec![1, 1];
    wd.extend([1; 8]);
    let w = Tensor::full(wd, 2.0);
    let mut xd = vec![1];
    xd.extend([2; 8]);
    let x = fill(&xd, 1);
    let op = Op::Conv {
        stride: vec![1; 8],
        padding: vec![0; 8],
    };
    let y = value(&op, &[&w, &t(&[1], &[0.5]), &x]);
    assert_eq!(y.shape(), x.shape());
    close(y.data(), x.map(|v| 2.0 * v + 0.5).data(), 1e-12);
    let pool = Op::MaxPool {
        kernel: vec![2; 8],
        stride: vec![1; 8],
        padding: vec![0; 8],
    };
    let m = value(&pool, &[&x]);
    assert_eq!(
        m.data(),
        &[x.data().iter().copied().fold(f64::MIN, f64::max)]
    );

    let nine = Op::Conv {
        stride: vec![1; 9],
        padding: vec![0; 9],
    };
    let e = nine
        .infer_shape(&[
            &Shape::new(&[1; 11]),
            &Shape::new(&[1]),
            &Shape::new(&[1; 10]),
        ])
        .unwrap_err()
        .to_string();
    assert!(e.contains("conv") && e.contains("spatial rank 9"), "{e}");
    let pool9 = Op::AvgPool {
        kernel: vec![1; 9],
        stride: vec![1; 9],
        padding: vec![0; 9],
    };
    let e = pool9
        .infer_shape(&[&Shape::new(&[1; 10])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("avgPool") && e.contains("spatial rank 9"), "{e}");
}

fn err(op: &Op, shapes: &[&[usize]], parts: &[&str]) {
    let shapes: Vec<Shape> = shapes.iter().map(|s| Shape::new(s)).collect();
    let refs: Vec<&Shape> = shapes.iter().collect();
    let e = match op.infer_shape(&refs) {
        Ok(s) => panic!("{op:?} on {shapes:?} should be an error, got {s}"),
        Err(e) => e.to_string(),
    };
    for p in parts {
        assert!(e.contains(p), "{e:?} should mention {p:?}");
    }
    // The kernels refuse it too, with an error rather than a panic.
    let ts: Vec<Tensor<f64>> = shapes.iter().map(|s| Tensor::zeros(s.clone())).collect();
    let tr: Vec<&Tensor<f64>> = ts.iter().collect();
    assert!(ops::forward(op, &tr, &[]).is_err(), "{op:?}");
    assert!(rules::value(op, &tr, &[]).is_err(), "{op:?}");
}

#[test]
fn bad_input_is_an_error_naming_the_op() {
    let conv = |s: &[usize], p: &[usize]| Op::Conv {
        stride: s.to_vec(),
        padding: p.to_vec(),
    };
    let convt = |s: &[usize], p: &[usize]| Op::ConvTranspose {
        stride: s.to_vec(),
        padding: p.to_vec(),
    };
    let c1 = conv(&[1], &[0]);
    // Kernel larger than the padded input.
    err(
        &c1,
        &[&[1, 1, 5], &[1], &[1, 3]],
        &["conv", "[1, 3]", "larger"],
    );
    // Zero stride, zero kernel dim, stride/padding length ≠ spatial rank.
    err(
        &conv(&[0], &[0]),
        &[&[1, 1, 2], &[1], &[1, 3]],
        &["conv", "stride"],
    );
    err(&c1, &[&[1, 1, 0], &[1], &[1, 3]], &["conv", "kernel"]);
    err(
        &conv(&[1, 1], &[0]),
        &[&[1, 1, 2], &[1], &[1, 3]],
        &["conv", "stride"],
    );
    err(
        &conv(&[1], &[0, 0]),
        &[&[1, 1, 2], &[1], &[1, 3]],
        &["conv", "padding"],
    );
    // Channel mismatch, bias of the wrong length, input of the wrong rank.
    err(
        &c1,
        &[&[1, 2, 2], &[1], &[3, 4]],
        &["conv", "[3, 4]", "channel"],
    );
    err(&c1, &[&[1, 2, 2], &[2], &[2, 4]], &["conv", "bias", "[2]"]);
    err(&c1, &[&[1, 2, 2], &[1], &[2]], &["conv", "input", "[2]"]);
    // convTranspose: its channel check is against weight dim 0; an empty output is an error.
    let t1 = convt(&[1], &[0]);
    err(
        &t1,
        &[&[2, 1, 2], &[1], &[1, 4]],
        &["convTranspose", "channel"],
    );
    err(
        &t1,
        &[&[2, 1, 2], &[2], &[2, 4]],
        &["convTranspose", "bias"],
    );
    err(
        &convt(&[1], &[1]),
        &[&[1, 1, 1], &[1], &[1, 1]],
        &["convTranspose", "empty"],
    );
    err(
        &convt(&[0], &[0]),
        &[&[1, 1, 1], &[1], &[1, 1]],
        &["convTranspose", "stride"],
    );

    let pool = |k: &[usize], s: &[usize], p: &[usize]| Op::MaxPool {
        kernel: k.to_vec(),
        stride: s.to_vec(),
        padding: p.to_vec(),
    };
    err(
        &pool(&[4], &[1], &[0]),
        &[&[1, 3]],
        &["maxPool", "[1, 3]", "larger"],
    );
    err(&pool(&[2], &[0], &[0]), &[&[1, 3]], &["maxPool", "stride"]);
    err(&pool(&[0], &[1], &[0]), &[&[1, 3]], &["maxPool", "kernel"]);
    err(
        &pool(&[2], &[1, 1], &[0]),
        &[&[1, 3]],
        &["maxPool", "stride"],
    );
    err(&pool(&[2], &[1], &[2]), &[&[1, 3]], &["maxPool", "padding"]);
    err(&pool(&[3], &[1], &[2]), &[&[1, 3]], &["maxPool", "padding"]);
    err(
        &pool(&[2, 2], &[1, 1], &[0, 0]),
        &[&[3]],
        &["maxPool", "[3]"],
    );
    let avg = Op::AvgPool {
        kernel: vec![2],
        stride: vec![1],
        padding: vec![2],
    };
    err(&avg, &[&[1, 3]], &["avgPool", "padding"]);
    for beta in [0.0, f64::NAN, f64::INFINITY] {
        let op = Op::SmoothMaxPool {
            kernel: vec![2],
            stride: vec![1],
            padding: vec![0],
            beta,
        };
        err(&op, &[&[1, 3]], &["smoothMaxPool", "beta"]);
    }
}

#[test]
fn two_d_constructors_build_the_n_d_variants() {
    assert_eq!(
        Op::conv2d(2, 1),
        Op::Conv {
            stride: vec![2, 2],
            padding: vec![1, 1]
        }
    );
    assert_eq!(
        Op::conv_transpose2d(3, 0),
        Op::ConvTranspose {
            stride: vec![3, 3],
            padding: vec![0, 0]
        }
    );
    assert_eq!(Op::max_pool2d([2, 3], 2), Op::max_pool2d_pad([2, 3], 2, 0));
    assert_eq!(
        Op::avg_pool2d_pad([2, 2], 1, 1),
        Op::AvgPool {
            kernel: vec![2, 2],
            stride: vec![1, 1],
            padding: vec![1, 1]
        }
    );
    assert_eq!(
        Op::smooth_max_pool2d([2, 2], 2, 1.5),
        Op::SmoothMaxPool {
            kernel: vec![2, 2],
            stride: vec![2, 2],
            padding: vec![0, 0],
            beta: 1.5
        }
    );
    assert_eq!(Op::avg_pool2d([2, 2], 2).name(), "avgPool");
}
