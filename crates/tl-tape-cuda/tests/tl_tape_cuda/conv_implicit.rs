//! The implicit-GEMM conv forward (`Device::conv_implicit`; kernels/conv.cu `tl_conv_implicit`),
//! input cotangent (`Device::conv_implicit_dx`, `tl_conv_implicit_dx`) and weight cotangent
//! (`Device::conv_implicit_dw`, `tl_conv_implicit_dw`) on the simulation device: the bits of
//! `matmul(w, im2col(x))` (permuted to (N, A, L)), and of `col2im(wᵀ·g')`, where that product
//! is not split along `k`, within f32 rounding of it where it is; the bits of
//! `matmul(g', im2col(x)ᵀ)` split or not; the tape's selection rule (`tl_tape_cuda::gates`)
//! forced both ways, values and gradients against the CPU tape, and the weight cotangent's
//! device memory without the column matrix; its errors. The kernels against these twins:
//! `gpu::the_implicit_conv_kernel_gives_the_sims_bits`.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cuda::device::{Windows, split_tile};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Error, Gemm, Precision, Result, SimDevice, gates};

use crate::common::Gen;

/// One conv geometry: the windows and the output channels.
pub struct Case {
    pub name: &'static str,
    pub win: Windows,
    pub out_channels: usize,
}

fn case(
    name: &'static str,
    (batch, channels, out_channels): (usize, usize, usize),
    big: &[usize],
    k: &[usize],
    s: &[usize],
    p: &[usize],
) -> Case {
    let small = (0..big.len())
        .map(|i| (big[i] + 2 * p[i] - k[i]) / s[i] + 1)
        .collect();
    Case {
        name,
        win: Windows {
            batch,
            channels,
            big: big.to_vec(),
            small,
            kernel: k.to_vec(),
            stride: s.to_vec(),
            padding: p.to_vec(),
        },
        out_channels,
    }
}

/// Ranks 1 to 4 (4: the kernel's any-rank path), stride and padding, batch 1, tiles cut by
/// every edge (output channels and positions not multiples of 64, `C·K` not a multiple of the
/// 16-deep slice), many channels, one forward product the im2col GEMM splits along `k`, and
/// three weight cotangents it splits (`N·L` = 297 over 20 tiles in runs of 160 and 137; 429 in
/// runs of 144, 144, 141; 602 over two row tiles in runs of 160, the last 122).
pub fn cases() -> Vec<Case> {
    vec![
        case(
            "2d stride 2x1 pad 1",
            (2, 5, 7),
            &[10, 10],
            &[3, 2],
            &[2, 1],
            &[1, 1],
        ),
        case(
            "2d 67 -> 70 channels",
            (3, 67, 70),
            &[9, 11],
            &[3, 3],
            &[1, 1],
            &[1, 1],
        ),
        case("1d batch 1", (1, 3, 4), &[130], &[5], &[3], &[2]),
        case(
            "3d",
            (1, 4, 9),
            &[5, 5, 5],
            &[2, 3, 2],
            &[1, 2, 2],
            &[1, 1, 0],
        ),
        case(
            "4d",
            (2, 2, 3),
            &[3, 4, 3, 3],
            &[2, 2, 1, 2],
            &[1; 4],
            &[0, 1, 0, 1],
        ),
        case(
            "2d 1x1 kernel",
            (2, 16, 65),
            &[8, 8],
            &[1, 1],
            &[1, 1],
            &[0, 0],
        ),
        case("2d split k", (1, 64, 8), &[6, 6], &[3, 3], &[1, 1], &[1, 1]),
        case(
            "2d dw split k",
            (3, 5, 6),
            &[13, 11],
            &[3, 3],
            &[1, 1],
            &[1, 1],
        ),
        case("1d dw split k", (2, 3, 70), &[300], &[4], &[1], &[2]),
    ]
}

/// Seeded operands of `c`: `(w, x)` as host vectors.
pub fn operands(c: &Case, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let l = c.win.check("test").unwrap();
    let mut r = Gen::new(seed);
    let mut v = |n: usize| {
        (0..n)
            .map(|_| r.range(-2.0, 2.0) as f32)
            .collect::<Vec<_>>()
    };
    let w = v(c.out_channels * c.win.channels * l.kernel);
    let x = v(l.big_len());
    (w, x)
}

/// `conv_implicit` on `d`, downloaded.
pub fn implicit<D: Device>(d: &mut D, c: &Case, w: &[f32], x: &[f32]) -> Result<Vec<f32>> {
    let (wb, xb) = (d.upload(w)?, d.upload(x)?);
    let y = d.conv_implicit(wb, xb, &c.win, c.out_channels)?;
    let out = d.download(y);
    d.release_all([wb, xb, y]);
    out
}

/// A seeded cotangent of `c`'s output `(batch, out_channels, small)`.
pub fn cotangent(c: &Case, seed: u64) -> Vec<f32> {
    let l = c.win.check("test").unwrap();
    let mut r = Gen::new(seed);
    (0..c.win.batch * c.out_channels * l.small)
        .map(|_| r.range(-2.0, 2.0) as f32)
        .collect()
}

/// `conv_implicit_dx` on `d`, downloaded.
pub fn implicit_dx<D: Device>(d: &mut D, c: &Case, w: &[f32], g: &[f32]) -> Result<Vec<f32>> {
    let (wb, gb) = (d.upload(w)?, d.upload(g)?);
    let dx = d.conv_implicit_dx(wb, gb, &c.win, c.out_channels)?;
    let out = d.download(dx);
    d.release_all([wb, gb, dx]);
    out
}

/// `conv_implicit_dw` on `d`, downloaded.
pub fn implicit_dw<D: Device>(d: &mut D, c: &Case, g: &[f32], x: &[f32]) -> Result<Vec<f32>> {
    let (gb, xb) = (d.upload(g)?, d.upload(x)?);
    let dw = d.conv_implicit_dw(gb, xb, &c.win, c.out_channels)?;
    let out = d.download(dw);
    d.release_all([gb, xb, dw]);
    out
}

/// The im2col path of the weight cotangent on `d`: `g' · im2col(x)ᵀ` with `g'` the cotangent
/// as (A, N·L), and its GEMM.
fn by_im2col_dw<D: Device>(d: &mut D, c: &Case, g: &[f32], x: &[f32]) -> (Vec<f32>, Gemm) {
    let l = c.win.check("test").unwrap();
    let gm = c.win.dw_gemm(c.out_channels);
    let (gb, xb) = (d.upload(g).unwrap(), d.upload(x).unwrap());
    let gr = d
        .permute(gb, &[c.win.batch, c.out_channels, l.small], &[1, 0, 2])
        .unwrap();
    let cols = d.im2col(xb, &c.win).unwrap();
    let dw = d.matmul(gr, cols, gm).unwrap();
    let out = d.download(dw).unwrap();
    d.release_all([gb, xb, gr, cols, dw]);
    (out, gm)
}

#[test]
fn the_implicit_weight_cotangent_gives_the_im2col_gemms_bits_split_or_not() {
    let mut d = SimDevice::new();
    let mut split = Vec::new();
    for c in cases() {
        let (_, x) = operands(&c, 12);
        let g = cotangent(&c, 13);
        let got = implicit_dw(&mut d, &c, &g, &x).unwrap();
        let (want, gm) = by_im2col_dw(&mut d, &c, &g, &x);
        if gm.k_splits(1) > 1 {
            split.push((c.name, gm.k_chunk(1), gm.k_splits(1)));
        }
        agree(c.name, &got, &want, true);
    }
    assert_eq!(
        split,
        [
            ("2d 67 -> 70 channels", 160, 2),
            ("2d dw split k", 144, 3),
            ("1d dw split k", 160, 4)
        ],
        "the cases' splits"
    );
    assert_eq!(d.memory_usage().live_buffers(), 0);
}

/// The col2im path on `d`: `col2im(wᵀ · g')` with `g'` the cotangent as (A, N·L), and its GEMM.
fn by_col2im<D: Device>(d: &mut D, c: &Case, w: &[f32], g: &[f32]) -> (Vec<f32>, Gemm) {
    let l = c.win.check("test").unwrap();
    let (n, a) = (c.win.batch, c.out_channels);
    let gm = Gemm::nn(c.win.channels * l.kernel, a, n * l.small).with_t(true, false);
    let (wb, gb) = (d.upload(w).unwrap(), d.upload(g).unwrap());
    let gr = d.permute(gb, &[n, a, l.small], &[1, 0, 2]).unwrap();
    let dcols = d.matmul(wb, gr, gm).unwrap();
    let dx = d.col2im(dcols, &c.win).unwrap();
    let out = d.download(dx).unwrap();
    d.release_all([wb, gb, gr, dcols, dx]);
    (out, gm)
}

/// `got` against `want`: the same bits where `same_bits`, else within 1e-5 of the largest
/// magnitude and not the same bits (the split sums in another order).
fn agree(name: &str, got: &[f32], want: &[f32], same_bits: bool) {
    assert_eq!(got.len(), want.len(), "{name}");
    if same_bits {
        let differ = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{name}: {differ} of {} differ", got.len());
    } else {
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() <= 1e-5 * scale, "{name}: {a} vs {b}");
        }
        assert_ne!(got, want, "{name}: the split sums in another order");
    }
}

#[test]
fn the_implicit_input_cotangent_gives_col2ims_bits_where_its_gemm_is_not_split() {
    let mut d = SimDevice::new();
    for c in cases() {
        let (w, _) = operands(&c, 8);
        let g = cotangent(&c, 9);
        let got = implicit_dx(&mut d, &c, &w, &g).unwrap();
        let (want, gm) = by_col2im(&mut d, &c, &w, &g);
        // k = A here, under 256 in every case: never split.
        assert_eq!(gm.k_splits(1), 1, "{}", c.name);
        agree(c.name, &got, &want, true);
    }
    // A split one: 300 output channels summed over one tile of outputs.
    let c = case("2d a300", (1, 2, 300), &[4, 4], &[2, 2], &[2, 2], &[0, 0]);
    let (w, _) = operands(&c, 10);
    let g = cotangent(&c, 11);
    let got = implicit_dx(&mut d, &c, &w, &g).unwrap();
    let (want, gm) = by_col2im(&mut d, &c, &w, &g);
    assert!(gm.k_splits(1) > 1);
    agree(c.name, &got, &want, false);
    assert_eq!(d.memory_usage().live_buffers(), 0);
}

/// The im2col path on `d`: `matmul(w, im2col(x))` permuted to (N, A, L), and its GEMM.
fn by_im2col<D: Device>(d: &mut D, c: &Case, w: &[f32], x: &[f32]) -> (Vec<f32>, Gemm) {
    let l = c.win.check("test").unwrap();
    let (n, a) = (c.win.batch, c.out_channels);
    let g = Gemm::nn(a, c.win.channels * l.kernel, n * l.small);
    let (wb, xb) = (d.upload(w).unwrap(), d.upload(x).unwrap());
    let cols = d.im2col(xb, &c.win).unwrap();
    let y = d.matmul(wb, cols, g).unwrap();
    let p = d.permute(y, &[a, n, l.small], &[1, 0, 2]).unwrap();
    let out = d.download(p).unwrap();
    d.release_all([wb, xb, cols, y, p]);
    (out, g)
}

#[test]
fn the_implicit_conv_gives_the_im2col_gemms_bits_where_that_is_not_split() {
    let mut d = SimDevice::new();
    let mut split = 0;
    for c in cases() {
        let (w, x) = operands(&c, 7);
        let got = implicit(&mut d, &c, &w, &x).unwrap();
        let (want, g) = by_im2col(&mut d, &c, &w, &x);
        assert_eq!(got.len(), want.len(), "{}", c.name);
        if g.k_splits(1) == 1 {
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{}: {differ} of {} differ", c.name, got.len());
        } else {
            split += 1;
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * scale, "{}: {a} vs {b}", c.name);
            }
            assert_ne!(got, want, "{}: the split sums in another order", c.name);
        }
    }
    assert!(
        split >= 2 && split + 4 <= cases().len(),
        "{split} cases split k"
    );
    assert_eq!(d.memory_usage().live_buffers(), 0);
}

/// Under autocast the implicit forward (the tensor-core kernel's twin: operands rounded as
/// staged) gives the im2col path's bits (its tensor-core GEMM, which rounds as it stages) where
/// that GEMM is not split along `k` (its split counting 128×128 tiles), the same sums within
/// f32 rounding where it is; the implicit weight cotangent gives the im2col path's bits on
/// every case, split or not (it splits as the tensor-core GEMM does); the implicit input
/// cotangent gives the col2im path's bits (its tensor-core GEMM over k = A, never split here);
/// and none is the f32 kernel's result on the operands as they are.
#[test]
fn under_autocast_the_implicit_conv_gives_the_tensor_core_gemms_bits() {
    use tl_tape_cuda::Precision;
    use tl_tape_cuda::device::TC_TILE;
    let mut d = SimDevice::new();
    for p in [Precision::Bf16, Precision::Tf32] {
        let (mut split, mut dw_split) = (0, 0);
        for c in cases() {
            let (w, x) = operands(&c, 17);
            let gy = cotangent(&c, 18);
            let as_is = implicit(&mut d, &c, &w, &x).unwrap();
            let dw_as_is = implicit_dw(&mut d, &c, &gy, &x).unwrap();
            let dx_as_is = implicit_dx(&mut d, &c, &w, &gy).unwrap();
            let _p = tl_tape_cuda::precision::install(p);
            let name = format!("{p:?} {}", c.name);
            let got = implicit(&mut d, &c, &w, &x).unwrap();
            let (want, g) = by_im2col(&mut d, &c, &w, &x);
            let unsplit = g.k_splits_tiled(1, TC_TILE) == 1;
            split += usize::from(!unsplit);
            agree(&name, &got, &want, unsplit);
            assert_ne!(got, as_is, "{name}: the operands were not rounded");
            let dw = implicit_dw(&mut d, &c, &gy, &x).unwrap();
            let (want_dw, gm) = by_im2col_dw(&mut d, &c, &gy, &x);
            dw_split += usize::from(gm.k_splits_tiled(1, TC_TILE) > 1);
            agree(&format!("{name} dw"), &dw, &want_dw, true);
            assert_ne!(dw, dw_as_is, "{name}: dw's operands were not rounded");
            let dx = implicit_dx(&mut d, &c, &w, &gy).unwrap();
            let (want_dx, gd) = by_col2im(&mut d, &c, &w, &gy);
            assert_eq!(gd.k_splits_tiled(1, TC_TILE), 1, "{name}");
            agree(&format!("{name} dx"), &dx, &want_dx, true);
            assert_ne!(dx, dx_as_is, "{name}: dx's operands were not rounded");
        }
        assert!(
            (1..cases().len()).contains(&split),
            "{p:?}: {split} cases split k"
        );
        assert!(dw_split > 0, "{p:?}: no weight cotangent split");
    }
    assert_eq!(d.memory_usage().live_buffers(), 0);
}

/// The value and the three gradients of a batched conv on a CUDA tape over the sim, with the
/// implicit kernel's threshold at `min_tiles`, and the launches of the forward.
fn on_tape(
    min_tiles: usize,
    op: &Op,
    xs: &[Tensor<f32>],
    g: &Tensor<f32>,
) -> (Vec<Tensor<f32>>, u64) {
    let _gate = gates::force_conv_implicit_min_tiles(Some(min_tiles));
    let mut t = CudaTape::new(SimDevice::new());
    let ids: Vec<_> = xs
        .iter()
        .map(|v| t.upload_leaf(v, None, true).unwrap())
        .collect();
    let before = t.device().traffic().launches;
    let y = t.apply(op, &ids).unwrap();
    let launches = t.device().traffic().launches - before;
    let seed = AnyBuffer::upload(t.device_mut(), g).unwrap();
    let grads = t.backward_dense(y, &seed).unwrap();
    let mut out = vec![t.read::<f32>(y).unwrap()];
    out.extend(
        ids.iter()
            .map(|&i| grads[i].download::<f32, _>(t.device()).unwrap()),
    );
    (out, launches)
}

fn tensor(r: &mut Gen, shape: &[usize]) -> Tensor<f32> {
    let n = shape.iter().product();
    Tensor::new(shape, (0..n).map(|_| r.range(-2.0, 2.0) as f32).collect()).unwrap()
}

/// The gate forced both ways on the tape: forced on, the forward is two launches (the kernel
/// and the bias) where the im2col path takes four (im2col, the GEMM, the permute, the bias);
/// both within f32 rounding of the CPU tape, values and gradients, and the weight cotangent
/// the same bits either way. Unforced, a small conv keeps im2col; the ResNet's first conv (64
/// channels over 32·32 positions, batch 4: 64 tiles) takes the implicit kernels (forward, the
/// input cotangent: 3 channels over 4·32·32 cells, and the weight cotangent: one tile summed
/// over 4·32·32 positions, which the GEMM splits along k), with the im2col path's bits, value
/// and every gradient.
#[test]
fn the_tape_takes_the_implicit_kernel_as_the_gate_says() {
    let mut r = Gen::new(3);
    let op = Op::Conv {
        stride: vec![2, 1],
        padding: vec![1, 0],
    };
    let xs = vec![
        tensor(&mut r, &[5, 3, 3, 2]),
        tensor(&mut r, &[5]),
        tensor(&mut r, &[2, 3, 7, 6]),
    ];
    let g = tensor(&mut r, &[2, 5, 4, 5]);
    let (on, on_launches) = on_tape(0, &op, &xs, &g);
    let (off, off_launches) = on_tape(usize::MAX, &op, &xs, &g);
    assert_eq!((on_launches, off_launches), (2, 4));
    let bits = |t: &Tensor<f32>| crate::common::bits(t.data());
    assert_eq!(bits(&on[1]), bits(&off[1]), "dw: the im2col path's bits");
    let mut cpu = tl_tape_cpu::Tape::<f32>::new();
    let ids: Vec<_> = xs.iter().map(|v| cpu.leaf(v.clone(), None, true)).collect();
    let y = cpu.apply(&op, &ids).unwrap();
    let grads = cpu.backward_dense(y, &g).unwrap();
    let mut want = vec![cpu.get(y).unwrap().clone()];
    want.extend(ids.iter().map(|&i| grads[i].clone()));
    for (name, got) in [("implicit", &on), ("im2col", &off)] {
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.shape(), b.shape());
            for (u, v) in a.data().iter().zip(b.data()) {
                assert!(
                    (u - v).abs() <= 1e-5 * (1.0 + v.abs()),
                    "{name} output {k}: {u} vs {v}"
                );
            }
        }
    }
    // Production threshold: a small conv keeps im2col, the ResNet's takes the kernel.
    let small = on_tape(gates::CONV_IMPLICIT_MIN_TILES, &op, &xs, &g);
    assert_eq!(small.1, 4);
    let resnet = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let rs = vec![
        tensor(&mut r, &[64, 3, 3, 3]),
        tensor(&mut r, &[64]),
        tensor(&mut r, &[4, 3, 32, 32]),
    ];
    let rg = tensor(&mut r, &[4, 64, 32, 32]);
    let (prod, prod_launches) = on_tape(gates::CONV_IMPLICIT_MIN_TILES, &resnet, &rs, &rg);
    let (old, old_launches) = on_tape(usize::MAX, &resnet, &rs, &rg);
    assert_eq!((prod_launches, old_launches), (2, 4));
    for k in 0..4 {
        assert_eq!(
            bits(&prod[k]),
            bits(&old[k]),
            "output {k}: the im2col path's bits"
        );
    }
}

/// The device memory of a conv's weight cotangent on the sim (the GPU's caching allocator, so
/// the telemetry counts what a GPU holds; peaks are bytes requested by live buffers). The
/// primitive: above its operands, `conv_implicit_dw` allocates its result and, split along
/// N·L as this case is, the runs' workspace (one result-sized matrix a run, as on the device);
/// the im2col path the permuted cotangent `(A, N·L)`, the column matrix `(C·K, N·L)`, the
/// result and its product's workspace of the same runs. On
/// the tape (the forward by the implicit kernel, then the backward with only the weight
/// needing its cotangent), the gate forced on lowers the backward's peak by at least the
/// column matrix, with the same bits. (`cargo run --release -p tl-tape-cuda --example
/// conv_memory` prints the ResNet's figures.)
#[test]
fn the_implicit_weight_cotangent_allocates_no_column_matrix() {
    let c = &cases()[1];
    let l = c.win.check("test").unwrap();
    let (_, x) = operands(c, 15);
    let g = cotangent(c, 16);
    let (dw, gr, cols) = (
        c.out_channels * c.win.channels * l.kernel * 4,
        c.out_channels * c.win.batch * l.small * 4,
        l.cols_len() * 4,
    );
    let splits = (c.win.dw_gemm(c.out_channels)).k_splits_tiled(1, split_tile(Precision::F32));
    assert_eq!(splits, 2, "the case splits its weight cotangent");
    let work = splits * dw;
    for (implicit, want) in [(true, dw + work), (false, gr + cols + dw + work)] {
        let mut d = SimDevice::new();
        let base = d.memory_usage().live_bytes;
        let got = if implicit {
            implicit_dw(&mut d, c, &g, &x).unwrap()
        } else {
            by_im2col_dw(&mut d, c, &g, &x).0
        };
        let above = d.memory_usage().peak_bytes - base - (g.len() + x.len()) * 4;
        assert_eq!(above, want, "implicit {implicit}");
        assert_eq!(got.len() * 4, dw);
    }

    let mut r = Gen::new(5);
    let op = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let (n, c, a, side) = (3, 4, 8, 9);
    let xs = [
        tensor(&mut r, &[a, c, 3, 3]),
        tensor(&mut r, &[a]),
        tensor(&mut r, &[n, c, side, side]),
    ];
    let g = tensor(&mut r, &[n, a, side, side]);
    let (on, on_peak) = dw_peak(&op, &xs, &g, 0);
    let (off, off_peak) = dw_peak(&op, &xs, &g, usize::MAX);
    let cols = c * 9 * n * side * side * 4;
    assert!(off_peak >= on_peak + cols, "on {on_peak}, off {off_peak}");
    let bits = |t: &Tensor<f32>| crate::common::bits(t.data());
    assert_eq!(bits(&on), bits(&off));
}

/// The weight cotangent of `op` on a CUDA tape over the sim with the implicit-GEMM threshold at
/// `min_tiles` for the backward (the forward forced on), and the peak bytes of the backward.
pub fn dw_peak(
    op: &Op,
    xs: &[Tensor<f32>],
    g: &Tensor<f32>,
    min_tiles: usize,
) -> (Tensor<f32>, usize) {
    let mut t = CudaTape::new(SimDevice::new());
    let ids: Vec<_> = xs
        .iter()
        .enumerate()
        .map(|(k, v)| t.upload_leaf(v, None, k == 0).unwrap())
        .collect();
    let y = {
        let _gate = gates::force_conv_implicit_min_tiles(Some(0));
        t.apply(op, &ids).unwrap()
    };
    let seed = AnyBuffer::upload(t.device_mut(), g).unwrap();
    let _gate = gates::force_conv_implicit_min_tiles(Some(min_tiles));
    let grads = t.backward_dense(y, &seed).unwrap();
    let peak = t.device().memory_usage().peak_bytes;
    (grads[ids[0]].download::<f32, _>(t.device()).unwrap(), peak)
}

#[test]
fn bad_operands_are_errors_naming_the_primitive() {
    let mut d = SimDevice::new();
    let c = &cases()[0];
    let (w, x) = operands(c, 1);
    let (wb, xb) = (d.upload(&w).unwrap(), d.upload(&x).unwrap());
    let short = d.upload(&w[1..]).unwrap();
    for (wb, xb, a) in [
        (short, xb, c.out_channels),
        (wb, wb, c.out_channels),
        (wb, xb, 6),
    ] {
        let e = d.conv_implicit(wb, xb, &c.win, a).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Kernel {
                    op: "conv_implicit",
                    ..
                }
            ),
            "{e}"
        );
    }
    let g = d.upload(&cotangent(c, 2)).unwrap();
    for (wb, gb, a) in [
        (short, g, c.out_channels),
        (wb, xb, c.out_channels),
        (wb, g, 6),
    ] {
        let e = d.conv_implicit_dx(wb, gb, &c.win, a).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Kernel {
                    op: "conv_implicit_dx",
                    ..
                }
            ),
            "{e}"
        );
    }
    for (gb, xb, a) in [
        (short, xb, c.out_channels),
        (g, wb, c.out_channels),
        (g, xb, 6),
    ] {
        let e = d.conv_implicit_dw(gb, xb, &c.win, a).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Kernel {
                    op: "conv_implicit_dw",
                    ..
                }
            ),
            "{e}"
        );
    }
    assert!(d.release(g));
    let mut bad = c.win.clone();
    bad.small[0] += 1;
    let e = d.conv_implicit(wb, xb, &bad, c.out_channels).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "conv_implicit",
                ..
            }
        ),
        "{e}"
    );
    d.release_all([wb, xb, short]);
    assert_eq!(d.memory_usage().live_buffers(), 0);
}
