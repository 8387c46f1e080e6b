//! The conv family's primitives on the simulation device (the twins of kernels/conv.cu) with
//! hand-worked values: window geometry, im2col/col2im layouts and adjointness, the pooling
//! conventions of SEMANTICS.md (max ties and padding, avg divisor, smooth max).

use tl_tape_cuda::device::{PoolKind, Windows};
use tl_tape_cuda::{Buffer, Device, Error, Result, SimDevice};

fn win(
    batch: usize,
    channels: usize,
    big: &[usize],
    k: &[usize],
    s: &[usize],
    p: &[usize],
) -> Windows {
    let small = (0..big.len())
        .map(|i| (big[i] + 2 * p[i] - k[i]) / s[i] + 1)
        .collect();
    Windows {
        batch,
        channels,
        big: big.to_vec(),
        small,
        kernel: k.to_vec(),
        stride: s.to_vec(),
        padding: p.to_vec(),
    }
}

fn run(
    dev: &mut SimDevice,
    data: &[f32],
    f: impl FnOnce(&mut SimDevice, Buffer) -> Result<Buffer>,
) -> Vec<f32> {
    let x = dev.upload(data).unwrap();
    let y = f(dev, x).unwrap();
    dev.download(y).unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn window_cells_and_their_inverse_by_hand() {
    // 3×3 input, 2×2 kernel, stride 1: small cell (1,0) = 2, kernel cell (1,1) = 3 reads (2,1).
    let w = win(1, 1, &[3, 3], &[2, 2], &[1, 1], &[0, 0]);
    assert_eq!(w.small, vec![2, 2]);
    assert_eq!(w.cell(2, 3), Some(7));
    assert_eq!(w.window_of(7, 3), Some(2));
    assert_eq!(w.window_of(7, 0), None); // (2,1) − (0,0) = (2,1) is outside the 2×2 small block
    // Padding 1, stride 2 along one axis of 3: o = 0, k = 0 reads −1 (padding).
    let w = win(1, 1, &[3], &[3], &[2], &[1]);
    assert_eq!(w.small, vec![2]);
    assert_eq!(w.cell(0, 0), None);
    assert_eq!(w.cell(1, 0), Some(1));
    assert_eq!(w.window_of(1, 1), None); // 1 + 1 − 1 = 1 is not a multiple of the stride
}

#[test]
fn im2col_layout_is_channel_kernel_batch_cell() {
    let mut dev = SimDevice::new();
    // x = [1, 2, 3], kernel 2, stride 1, padding 1: windows [pad,1] [1,2] [2,3] [3,pad].
    let w = win(1, 1, &[3], &[2], &[1], &[1]);
    let cols = run(&mut dev, &[1.0, 2.0, 3.0], |d, x| d.im2col(x, &w));
    assert_eq!(cols, [0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 0.0]);
    // Batch 2, channels 2, length 4, kernel 2, stride 2: rows (c, k), columns (n, o).
    let w = win(2, 2, &[4], &[2], &[2], &[0]);
    let x: Vec<f32> = (1..=16).map(|v| v as f32).collect();
    let cols = run(&mut dev, &x, |d, x| d.im2col(x, &w));
    let want = [
        1.0, 3.0, 9.0, 11.0, // c0 k0
        2.0, 4.0, 10.0, 12.0, // c0 k1
        5.0, 7.0, 13.0, 15.0, // c1 k0
        6.0, 8.0, 14.0, 16.0, // c1 k1
    ];
    assert_eq!(cols, want);
}

#[test]
fn col2im_sums_the_cells_reading_each_element() {
    let mut dev = SimDevice::new();
    let w = win(1, 1, &[3], &[2], &[1], &[1]);
    // Rows k0 = [10, 20, 30, 40], k1 = [1, 2, 3, 4]; (k0, o0) and (k1, o3) are padding.
    let cols = [10.0, 20.0, 30.0, 40.0, 1.0, 2.0, 3.0, 4.0];
    let x = run(&mut dev, &cols, |d, c| d.col2im(c, &w));
    assert_eq!(x, [1.0 + 20.0, 2.0 + 30.0, 3.0 + 40.0]);
}

#[test]
fn col2im_is_the_adjoint_of_im2col_in_three_dims() {
    let mut dev = SimDevice::new();
    let w = win(2, 3, &[4, 3, 5], &[2, 3, 2], &[2, 1, 3], &[1, 1, 1]);
    let lens = w.check("test").unwrap();
    let x: Vec<f32> = (0..lens.big_len())
        .map(|i| ((i * 7 % 13) as f32) - 6.0)
        .collect();
    let c: Vec<f32> = (0..lens.cols_len())
        .map(|i| ((i * 5 % 11) as f32) - 5.0)
        .collect();
    let ix = run(&mut dev, &x, |d, b| d.im2col(b, &w));
    let tc = run(&mut dev, &c, |d, b| d.col2im(b, &w));
    let lhs: f64 = ix
        .iter()
        .zip(&c)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let rhs: f64 = x
        .iter()
        .zip(&tc)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    assert_eq!(lhs, rhs);
    assert!(lhs != 0.0);
}

#[test]
fn max_pool_ignores_padding_and_routes_ties_to_the_first_cell() {
    let mut dev = SimDevice::new();
    let w = win(1, 1, &[3], &[2], &[1], &[1]);
    let y = run(&mut dev, &[-3.0, -1.0, -2.0], |d, x| {
        d.pool(x, &w, PoolKind::Max)
    });
    assert_eq!(y, [-3.0, -1.0, -1.0, -2.0]);
    // Windows [1,3] [3,3] [3,2]: the tie goes to the first 3.
    let w = win(1, 1, &[4], &[2], &[1], &[0]);
    let x = dev.upload(&[1.0, 3.0, 3.0, 2.0]).unwrap();
    let g = dev.upload(&[1.0, 10.0, 100.0]).unwrap();
    let y = dev.pool(x, &w, PoolKind::Max).unwrap();
    assert_eq!(dev.download(y).unwrap(), [3.0, 3.0, 3.0]);
    let dx = dev.pool_bwd(x, g, &w, PoolKind::Max).unwrap();
    assert_eq!(dev.download(dx).unwrap(), [0.0, 11.0, 100.0, 0.0]);
}

#[test]
fn avg_pool_divides_by_the_kernel_volume() {
    let mut dev = SimDevice::new();
    let w = win(1, 1, &[3], &[2], &[1], &[1]);
    let y = run(&mut dev, &[-3.0, -1.0, -2.0], |d, x| {
        d.pool(x, &w, PoolKind::Avg)
    });
    assert_eq!(y, [-1.5, -2.0, -1.5, -1.0]);
    let x = dev.upload(&[-3.0, -1.0, -2.0]).unwrap();
    let g = dev.upload(&[1.0, 2.0, 4.0, 8.0]).unwrap();
    let dx = dev.pool_bwd(x, g, &w, PoolKind::Avg).unwrap();
    assert_eq!(dev.download(dx).unwrap(), [1.5, 3.0, 6.0]);
}

#[test]
fn smooth_max_pool_by_hand() {
    let mut dev = SimDevice::new();
    let w = win(1, 1, &[3], &[2], &[1], &[0]);
    let l = (1.0f32 + (-1.0f32).exp()).ln();
    let y = run(&mut dev, &[1.0, 2.0, 3.0], |d, x| {
        d.pool(x, &w, PoolKind::SmoothMax(1.0))
    });
    close(&y, &[2.0 + l, 3.0 + l]);
    let y = run(&mut dev, &[1.0, 2.0, 3.0], |d, x| {
        d.pool(x, &w, PoolKind::SmoothMax(-1.0))
    });
    close(&y, &[1.0 - l, 2.0 - l]);
    let x = dev.upload(&[1.0, 2.0, 3.0]).unwrap();
    let g = dev.upload(&[1.0, 1.0]).unwrap();
    let dx = dev.pool_bwd(x, g, &w, PoolKind::SmoothMax(1.0)).unwrap();
    let s = 1.0 / (1.0 + (-1.0f32).exp()); // softmax weight of the larger cell
    close(&dev.download(dx).unwrap(), &[1.0 - s, 1.0, s]);
    // Padded cells are the value 0: a window [pad, −3] has a smooth max near 0.
    let w = win(1, 1, &[1], &[2], &[1], &[1]);
    let y = run(&mut dev, &[-3.0], |d, x| {
        d.pool(x, &w, PoolKind::SmoothMax(50.0))
    });
    assert!(y[0].abs() < 0.05, "{y:?}");
}

#[test]
fn bad_geometry_and_lengths_are_errors_naming_the_primitive() {
    let mut dev = SimDevice::new();
    let x = dev.zeros(3).unwrap();
    let mut w = win(1, 1, &[3], &[2], &[1], &[0]);
    w.small = vec![3];
    let e = dev.im2col(x, &w).unwrap_err();
    assert!(matches!(e, Error::Kernel { op: "im2col", .. }), "{e}");
    let w = win(1, 1, &[4], &[2], &[1], &[0]);
    let e = dev.pool(x, &w, PoolKind::Max).unwrap_err();
    assert!(matches!(e, Error::Kernel { op: "pool", .. }), "{e}");
    let e = dev.col2im(x, &w).unwrap_err();
    assert!(matches!(e, Error::Kernel { op: "col2im", .. }), "{e}");
    let mut w9 = win(1, 1, &[1; 9], &[1; 9], &[1; 9], &[0; 9]);
    w9.small = vec![1; 9];
    let one = dev.zeros(1).unwrap();
    assert!(dev.pool_bwd(one, one, &w9, PoolKind::Avg).is_err());
}

/// Issue 37: any stride the shape rule accepts, however large (past the padded input, past the
/// kernels' u32 arguments, `usize::MAX`), pools on the sim as on the CPU tape: an axis with
/// one window reads the same cells whatever its stride (SEMANTICS.md: out = (in + 2p − k)/s
/// + 1). Values and input cotangents, max, avg and smooth max, batched and 2-D.
#[test]
fn pools_with_a_stride_past_the_input_agree_with_the_cpu_tape() {
    use tl_ir::Op;
    use tl_spec::Tensor;
    use tl_tape_cuda::{AnyBuffer, CudaTape};
    let x = Tensor::<f32>::from_fn([2, 3, 5, 4], |i| ((i * 7 % 11) as f32 - 5.0) * 0.3);
    for s in [6, 1 << 33, usize::MAX] {
        for (kernel, stride, padding) in [
            (vec![2, 3], vec![s, 1], vec![1, 1]),
            (vec![3, 2], vec![2, s], vec![0, 1]),
            (vec![5, 4], vec![s, s], vec![0, 0]),
        ] {
            let ops = [
                Op::MaxPool {
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    padding: padding.clone(),
                },
                Op::AvgPool {
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    padding: padding.clone(),
                },
                Op::SmoothMaxPool {
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    padding: padding.clone(),
                    beta: 2.0,
                },
            ];
            for op in ops {
                let mut cpu = tl_tape_cpu::Tape::<f32>::new();
                let cx = cpu.leaf(x.clone(), Some("x"), true);
                let cy = cpu.apply(&op, &[cx]).unwrap();
                let want = cpu.get(cy).unwrap().clone();
                let g = Tensor::<f32>::from_fn(want.shape().clone(), |i| 1.0 + i as f32 * 0.5);
                let want_dx = cpu.backward_dense(cy, &g).unwrap()[cx].clone();

                let mut sim = CudaTape::new(SimDevice::new());
                let xi = sim.upload_leaf(&x, Some("x"), true).unwrap();
                let yi = sim
                    .apply(&op, &[xi])
                    .unwrap_or_else(|e| panic!("{op}: the CPU pools, the sim says {e}"));
                let y: Tensor<f32> = sim.read(yi).unwrap();
                let seed = AnyBuffer::upload(sim.device_mut(), &g).unwrap();
                let grads = sim.backward_dense(yi, &seed).unwrap();
                let dx: Tensor<f32> = grads[xi].download(sim.device()).unwrap();
                assert_eq!(y.shape(), want.shape(), "{op}");
                // f32 on both sides, by different algorithms: a few ulps apart at most.
                let near = |a: &[f32], b: &[f32]| {
                    a.len() == b.len()
                        && a.iter()
                            .zip(b)
                            .all(|(u, v)| (u - v).abs() <= 1e-5 * (1.0 + v.abs()))
                };
                assert!(near(y.data(), want.data()), "{op}: {y:?} vs {want:?}");
                assert!(
                    near(dx.data(), want_dx.data()),
                    "{op}: {dx:?} vs {want_dx:?}"
                );
                sim.release_grads(grads);
                seed.release(sim.device_mut());
            }
        }
    }
}
