//! The real CUDA device against the simulation device and the reference (feature `cuda`).
//!
//! Where `CudaDevice::new` reports no device (no GPU, or the stub libcuda of
//! `cargo xtask cuda-stub`), each test prints "no CUDA device: skipping" and passes. On a GPU,
//! and with feature `cuda-emu` on the kernel emulator (the same kernels compiled for the host):
//!
//! 1. every `Device` primitive on seeded random inputs, CUDA vs sim: structure-only primitives
//!    (no transcendental function) bit for bit in deterministic mode, the others within a
//!    relative f32 tolerance; a summary line per op family (`GPU-SUMMARY family max_err
//!    pass|FAIL`), which the GPU bundle's run.sh collects into its table; then the same with
//!    deterministic reductions off, through the atomic kernels, within the tolerance;
//! 2. the CUDA tape (forward values and dense gradients) against the f64 IR reference for the
//!    first op set and an MLP-shaped DAG, as the `ops` module does on sim.
#![cfg(any(feature = "cuda", feature = "cuda-emu"))]

use crate::common::{self, Domain, Gen, check_graph_on, draw};
use tl_ir::{GraphBuilder, Op};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::device::{Act, BiasLayout, NormLayout, PointAct, PoolKind, Windows};
use tl_tape_cuda::{
    Batch, Buffer, CudaDevice, Device, Error, FlashProducts, FlashTiles, Gemm, GemmTiles,
    Precision, Result, SimDevice, determinism, gates,
};

// The fused attention kernels against their sim twins.
mod flash;
// The tensor-core GEMM under autocast (bf16 / TF32).
mod tensor_cores;
// The sim counts the split passes' launches and workspaces as the device does.
mod split_passes;

/// The CUDA device, or `None` (after saying so) when there is none.
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new() {
        Ok(d) => Some(d),
        Err(e @ Error::NoDevice { .. }) => {
            println!("no CUDA device: skipping ({e})");
            None
        }
        Err(e) => panic!("CUDA device init failed: {e}"),
    }
}

/// Seeded inputs shared by both devices.
struct Inputs {
    x: Vec<f32>,
    y: Vec<f32>,
    g: Vec<f32>,
    pos: Vec<f32>,
    big: Vec<f32>,
}

fn inputs() -> Inputs {
    let mut r = Gen::new(0x9e37);
    let mut v = |n: usize, lo: f64, hi: f64| -> Vec<f32> {
        (0..n).map(|_| r.range(lo, hi) as f32).collect()
    };
    let mut y = v(1000, -3.0, 3.0);
    let x = v(1000, -3.0, 3.0);
    for i in (0..1000).step_by(7) {
        y[i] = x[i]; // ties for max/min
    }
    Inputs {
        g: v(1000, -1.0, 1.0),
        pos: v(1000, 0.25, 4.0),
        big: v(300_001, -1.0, 1.0),
        x,
        y,
    }
}

/// One primitive's result: (family, name, exact in deterministic mode, values).
type Out = (&'static str, &'static str, bool, Vec<f32>);

/// Run every primitive of the `Device` trait on `d` and download the results.
fn run_all<D: Device>(d: &mut D, i: &Inputs) -> Result<Vec<Out>> {
    let x = d.upload(&i.x)?;
    let y = d.upload(&i.y)?;
    let g = d.upload(&i.g)?;
    let p = d.upload(&i.pos)?;
    let big = d.upload(&i.big)?;
    let a_odd = d.upload(&i.x[..70 * 13])?;
    let b_odd = d.upload(&i.y[..13 * 75])?;
    let rows_g = d.upload(&i.big[..3000])?;
    let short = d.upload(&i.g[..37])?;
    let scalar = d.upload(&[1.7])?;
    let mut outs: Vec<(&'static str, &'static str, bool, Buffer)> = Vec::new();
    macro_rules! one {
        ($fam:expr, $name:expr, $exact:expr, $e:expr) => {
            outs.push(($fam, $name, $exact, $e));
        };
    }
    let pw = "pointwise";
    one!(pw, "abs", true, d.abs(x)?);
    one!(pw, "sqrt", true, d.sqrt(x)?);
    one!(pw, "exp", false, d.exp(x)?);
    one!(pw, "log", false, d.log(p)?);
    one!(pw, "inv", true, d.inv(p)?);
    one!(pw, "relu", true, d.relu(x)?);
    one!(pw, "sigmoid", false, d.sigmoid(x)?);
    one!(pw, "tanh", false, d.tanh(x)?);
    one!(pw, "softplus", false, d.softplus(x)?);
    one!(pw, "safe_log", false, d.safe_log(x, 1e-6)?);
    one!(pw, "clamp", true, d.clamp(x, -0.5, 0.7)?);
    one!(pw, "scale", true, d.scale(x, -1.5)?);
    one!(pw, "full", true, d.full(37, 2.5)?);
    one!(pw, "abs_bwd", true, d.abs_bwd(x, g)?);
    one!(pw, "sqrt_bwd", true, d.sqrt_bwd(p, g)?);
    one!(pw, "relu_bwd", true, d.relu_bwd(x, g)?);
    one!(pw, "clamp_bwd", true, d.clamp_bwd(x, g, -0.5, 0.7)?);
    one!(pw, "inv_bwd", true, d.inv_bwd(p, g)?);
    one!(pw, "sigmoid_bwd", true, d.sigmoid_bwd(x, g)?);
    one!(pw, "tanh_bwd", true, d.tanh_bwd(x, g)?);
    one!(pw, "softplus_bwd", false, d.softplus_bwd(x, g)?);
    one!(pw, "safe_log_bwd", false, d.safe_log_bwd(x, g, 1e-6)?);
    one!(pw, "add", true, d.add(x, y)?);
    one!(pw, "sub", true, d.sub(x, y)?);
    one!(pw, "mul", true, d.mul(x, y)?);
    one!(pw, "div", true, d.div(x, p)?);
    one!(pw, "max", true, d.max(x, y)?);
    one!(pw, "min", true, d.min(x, y)?);
    one!(pw, "axpy", true, d.axpy(x, y, 0.3)?);
    let acc = d.copy(x)?;
    d.axpy_assign(acc, -2.0, y)?;
    one!(pw, "axpy_assign", true, acc);
    for (name, (da, db)) in [
        ("div_bwd", d.div_bwd(x, p, g)?),
        ("max_bwd", d.max_bwd(x, y, g)?),
        ("min_bwd", d.min_bwd(x, y, g)?),
    ] {
        one!(pw, name, true, da);
        one!(pw, name, true, db);
    }
    let rd = "reduce";
    one!(rd, "reduce_sum", true, d.reduce_sum(big)?);
    one!(rd, "reduce_mean", true, d.reduce_mean(x)?);
    one!(
        rd,
        "reduce_axis_sum",
        true,
        d.reduce_axis_sum(x, 10, 20, 5)?
    );
    one!(
        rd,
        "reduce_axis_mean",
        true,
        d.reduce_axis_mean(x, 4, 50, 5)?
    );
    // A long axis into few outputs: one block per output (axis_sum_by_block).
    let long = d.upload(&i.big[..21_000])?;
    one!(
        rd,
        "reduce_axis_sum_block",
        true,
        d.reduce_axis_sum(long, 3, 1000, 7)?
    );
    one!(
        rd,
        "reduce_axis_mean_block",
        true,
        d.reduce_axis_mean(long, 1, 21_000, 1)?
    );
    let sh = "shape";
    one!(
        sh,
        "broadcast",
        true,
        d.broadcast(x, &[10, 1, 100], &[3, 10, 7, 100])?
    );
    let wide = d.broadcast(x, &[10, 1, 100], &[3, 10, 7, 100])?;
    one!(
        sh,
        "reduce_broadcast",
        true,
        d.reduce_broadcast(wide, &[10, 1, 100], &[3, 10, 7, 100])?
    );
    d.release(wide);
    one!(
        sh,
        "permute",
        true,
        d.permute(x, &[2, 5, 10, 10], &[3, 1, 0, 2])?
    );
    one!(sh, "transpose2d", true, d.transpose2d(x, 40, 25)?);
    let rw = "rows";
    one!(rw, "softmax_rows", false, d.softmax_rows(x, 4, 250)?);
    one!(
        rw,
        "log_softmax_rows",
        false,
        d.log_softmax_rows(x, 10, 100)?
    );
    let sm = d.softmax_rows(x, 4, 250)?;
    one!(
        rw,
        "softmax_rows_bwd",
        false,
        d.softmax_rows_bwd(sm, g, 4, 250)?
    );
    d.release(sm);
    let c = 0.125f32;
    let ssm = d.scaled_softmax_rows(x, c, 4, 250)?;
    one!(rw, "scaled_softmax_rows", false, d.copy(ssm)?);
    one!(
        rw,
        "scaled_softmax_rows_bwd",
        false,
        d.scaled_softmax_rows_bwd(ssm, g, c, 4, 250)?
    );
    d.release(ssm);
    let ls = d.log_softmax_rows(x, 10, 100)?;
    one!(
        rw,
        "log_softmax_rows_bwd",
        false,
        d.log_softmax_rows_bwd(ls, g, 10, 100)?
    );
    d.release(ls);
    let nm = "norm";
    // BatchNorm's running-statistics update, both statistics in one launch: in f64, one
    // rounding, so bit for bit; variances with NaN entries (kept), and of one element (kept).
    let nan_var = i.pos.iter().enumerate();
    let nan_var = nan_var.map(|(k, &v)| if k % 5 == 0 { f32::NAN } else { v });
    let moments: Vec<f32> = i.y.iter().copied().chain(nan_var).collect();
    let moments = d.upload(&moments)?;
    for count in [7, 1000, 1] {
        for m in [0.1, 1.0 / 3.0] {
            let (rm, rv) = d.running_update_moments(x, p, moments, m, count)?;
            one!(nm, "running_update_moments mean", true, rm);
            one!(nm, "running_update_moments var", true, rv);
        }
    }
    // BatchNorm's eval scale 1/sqrt(var + eps), in f64 and rounded once: bit for bit.
    for eps in [1e-5, 0.25] {
        one!(nm, "running_inv_std", true, d.running_inv_std(p, eps)?);
    }
    let layouts = [
        NormLayout::layer(10, 100),
        NormLayout::layer(2, 500),
        // 100 rows per feature: dγ and dβ by one block per feature (affine_by_block).
        NormLayout::layer(100, 10),
        NormLayout::channels(2, 5, 100),
        NormLayout::channels(1, 4, 250),
        // rmsNorm: layer norm's rows, not centred, no β (dγ by thread, then by block).
        NormLayout::rms(10, 100),
        NormLayout::rms(100, 10),
    ];
    for l in layouts {
        let f = l.features();
        let ga = d.upload(&i.pos[..f])?;
        let be = if l.centred {
            Some(d.upload(&i.y[..f])?)
        } else {
            None
        };
        let st = d.norm_stats(x, l, 1e-6)?;
        one!(nm, "norm_apply", false, d.norm_apply(x, st, ga, be, l)?);
        one!(nm, "norm_bwd_x", false, d.norm_bwd_x(x, st, ga, g, l)?);
        let (dg, db) = d.norm_bwd_affine(x, st, g, l)?;
        one!(nm, "norm_bwd_affine", false, dg);
        one!(nm, "norm_bwd_affine", true, db);
        one!(nm, "norm_stats", false, st);
        let (fy, fst) = d.norm_forward(x, ga, be, l, 1e-6)?;
        one!(nm, "norm_forward", false, fy);
        one!(nm, "norm_forward", false, fst);
        d.release_all([ga].into_iter().chain(be));
    }
    // Groups longer than NORM_FUSED_MAX: norm_forward not in one launch (these five channels
    // of 60 000 split their sums over 15 blocks each, tl_norm_split_*).
    let l = NormLayout::channels(2, 5, 30_000);
    assert!(!l.fused_forward());
    let xl = d.upload(&i.big[..300_000])?;
    let ga = d.upload(&i.pos[..5])?;
    let be = d.upload(&i.y[..5])?;
    let (ly, lst) = d.norm_forward(xl, ga, Some(be), l, 1e-6)?;
    one!(nm, "norm_forward", false, ly);
    one!(nm, "norm_forward", false, lst);
    d.release_all([ga, be]);
    // rmsNorm's rows longer than NORM_FUSED_MAX: not one launch either (60 rows of 5000 split
    // in 2 chunks each).
    let l = NormLayout::rms(60, 5000);
    assert!(!l.fused_forward());
    let ga = d.upload(&i.big[..5000])?;
    let (ly, lst) = d.norm_forward(xl, ga, None, l, 1e-6)?;
    one!(nm, "norm_forward", false, ly);
    one!(nm, "norm_forward", false, lst);
    d.release_all([xl, ga]);
    // A (10, 10) mask with an empty row 3 and a lone entry in row 7.
    let mask: Vec<bool> = (0..100)
        .map(|k| {
            let (r, c) = (k / 10, k % 10);
            r != 3 && (r != 7 || c == 2) && (r + c) % 3 != 1
        })
        .collect();
    one!(
        nm,
        "masked_softmax_rows",
        false,
        d.masked_softmax_rows(x, &mask, 100, 10, 10)?
    );
    // A (4, 10) mask (rows 0..4 of the square one): an (nq, nk) attention mask, nq ≠ nk.
    one!(
        nm,
        "masked_softmax_rows",
        false,
        d.masked_softmax_rows(x, &mask[..40], 100, 10, 4)?
    );
    // One (4, 10) matrix per batch element, 5 of them over shares of 20 rows (B = 5, H = 5,
    // nq = 4), the patterns shifting with b; row 1 of element 3 only sees nothing.
    let batched: Vec<bool> = (0..200)
        .map(|k| {
            let (b, r, c) = (k / 40, k / 10 % 4, k % 10);
            (b, r) != (3, 1) && (r + c + b) % 3 != 1
        })
        .collect();
    one!(
        nm,
        "masked_softmax_rows",
        false,
        d.masked_softmax_rows(x, &batched, 100, 10, 4)?
    );
    let la = "linalg";
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        one!(
            la,
            "matmul",
            true,
            d.matmul(x, y, Gemm::nn(20, 50, 20).with_t(ta, tb))?
        );
        one!(
            la,
            "matmul_odd",
            true,
            d.matmul(a_odd, b_odd, Gemm::nn(70, 13, 75).with_t(ta, tb))?
        );
    }
    one!(la, "bmm", true, d.bmm(x, y, 5, Gemm::nn(10, 20, 10))?);
    // Few output tiles over a long k: split along k (Gemm::k_chunk), two kernels.
    let ka = d.upload(&i.big[..16_000])?;
    let kb = d.upload(&i.big[16_000..40_000])?;
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = Gemm::nn(16, 1000, 24).with_t(ta, tb);
        assert!(g.k_splits(1) > 1, "the case must split");
        one!(la, "matmul_split_k", true, d.matmul(ka, kb, g)?);
    }
    one!(
        la,
        "bmm_split_k",
        true,
        d.bmm(ka, kb, 2, Gemm::nn(8, 1000, 12))?
    );
    // Head-merged operands (attention's layout) in every combination, 2 groups of 5 heads;
    // then a split product writing a merged result.
    let ha = d.upload(&i.big[..10 * 6 * 20])?;
    let hb = d.upload(&i.big[3000..3000 + 10 * 20 * 10])?;
    for bits in 0..8u32 {
        let bt = Batch::heads(2, 5, [bits & 1 != 0, bits & 2 != 0, bits & 4 != 0]);
        for (ta, tb) in [(false, false), (true, true)] {
            let hg = Gemm::nn(6, 20, 10).with_t(ta, tb);
            one!(la, "bmm_heads", true, d.bmm_heads(ha, hb, bt, hg)?);
        }
    }
    // Grouped operands (grouped-query attention's K and V): 5 heads reading one stored head
    // (a or b), or 6 heads reading 3 (b, as attention's scores read K).
    let (ga, gb) = (
        d.upload(&i.big[..2 * 6 * 20])?,
        d.upload(&i.big[3000..3000 + 2 * 20 * 10])?,
    );
    for (a, b, grouped) in [(ga, hb, [true, false]), (ha, gb, [false, true])] {
        let bt = Batch::heads(2, 5, [true, true, true]).grouped(1, grouped);
        let hg = Gemm::nn(6, 20, 10);
        one!(la, "bmm_heads_grouped", true, d.bmm_heads(a, b, bt, hg)?);
    }
    let g3 = Batch::heads(2, 6, [true, true, false]).grouped(3, [false, true]);
    let scores = Gemm::nn(7, 4, 9).with_t(false, true);
    let (qa, kb3) = (
        d.upload(&i.big[..12 * 7 * 4])?,
        d.upload(&i.big[500..500 + 6 * 9 * 4])?,
    );
    one!(
        la,
        "bmm_heads_grouped",
        true,
        d.bmm_heads(qa, kb3, g3, scores)?
    );
    let sg = Gemm::nn(8, 500, 12);
    assert!(sg.k_splits(4) > 1, "the case must split");
    let merged = Batch::heads(2, 2, [true, false, true]);
    one!(
        la,
        "bmm_heads_split_k",
        true,
        d.bmm_heads(ka, kb, merged, sg)?
    );
    // Split, b grouped: 2 heads over 1 stored head (b of 2 matrices).
    let kb1 = d.upload(&i.big[16_000..16_000 + 2 * 500 * 12])?;
    let split_grouped = Batch::heads(2, 2, [true, true, true]).grouped(1, [false, true]);
    one!(
        la,
        "bmm_heads_split_k_grouped",
        true,
        d.bmm_heads(ka, kb1, split_grouped, sg)?
    );
    let c = d.upload(&i.g[..16 * 24])?;
    d.matmul_acc(c, ka, kb, Gemm::nn(16, 1000, 24))?;
    one!(la, "matmul_acc_split_k", true, c);
    let act = "activation";
    one!(act, "gelu", false, d.gelu(x)?);
    one!(act, "gelu_bwd", false, d.gelu_bwd(x, g)?);
    one!(act, "silu", false, d.silu(x)?);
    one!(act, "silu_bwd", false, d.silu_bwd(x, g)?);
    for pa in [
        PointAct::LeakyRelu {
            negative_slope: 0.2,
        },
        PointAct::Elu { alpha: 0.7 },
        PointAct::GeluErf,
    ] {
        let (fwd, bwd, _) = pa.kernels();
        // leakyRelu has no transcendental: the same bits.
        let exact = matches!(pa, PointAct::LeakyRelu { .. });
        one!(act, fwd, exact, d.point_act(x, pa)?);
        one!(act, bwd, exact, d.point_act_bwd(x, g, pa)?);
    }
    // The bias epilogue: (outer, ch, inner) = (10, 20, 5) and a linear's (50, 20, 1).
    let bias = d.upload(&i.y[..20])?;
    for layout in [BiasLayout::new(10, 20, 5), BiasLayout::new(50, 20, 1)] {
        one!(act, "add_bias", true, d.add_bias(x, bias, layout)?);
        for (name, a, exact) in [
            ("add_bias_act relu", Act::Relu, true),
            ("add_bias_act gelu", Act::Gelu, false),
        ] {
            let (pre, post) = d.add_bias_act(x, bias, layout, a)?;
            one!(act, name, true, pre);
            one!(act, name, exact, post);
        }
        for r_first in [true, false] {
            let (pre, out) = d.add_bias_residual(x, bias, layout, g, r_first)?;
            one!(act, "add_bias_residual", true, pre);
            one!(act, "add_bias_residual", true, out);
        }
    }
    d.release(bias);
    let ix = "index";
    // 300 indices into 100 rows: repeats, and 100..102 out of range (zero rows, no scatter).
    let idx: Vec<usize> = (0..300).map(|k| (k * 37) % 103).collect();
    one!(ix, "gather_rows", true, d.gather_rows(x, 100, 10, &idx)?);
    one!(
        ix,
        "scatter_add_rows",
        true,
        d.scatter_add_rows(rows_g, 100, 10, &idx)?
    );
    one!(ix, "copy_range", true, d.copy_range(x, 17, 500)?);
    one!(ix, "place_range", true, d.place_range(g, 1500, 250)?);
    one!(ix, "concat", true, d.concat(x, y)?);
    one!(ix, "add_range", true, d.add_range(x, short, 400)?);
    let labels: Vec<usize> = (0..10).map(|r| (r * 23) % 110).collect();
    one!(
        ix,
        "cross_entropy_rows",
        false,
        d.cross_entropy_rows(x, 10, 100, &labels)?
    );
    one!(
        ix,
        "cross_entropy_rows_bwd",
        false,
        d.cross_entropy_rows_bwd(x, scalar, 10, 100, &labels)?
    );
    let rg = "rng";
    one!(rg, "rand_uniform", true, d.rand_uniform(5000, 42)?);
    one!(rg, "bernoulli_mask", true, d.bernoulli_mask(5000, 43, 0.3)?);
    outs.extend(conv_family(d, i)?);
    let mut res = Vec::new();
    for (fam, name, exact, b) in outs {
        res.push((fam, name, exact, d.download(b)?));
        d.release(b);
    }
    d.release_all([
        x, y, g, p, big, a_odd, b_odd, rows_g, short, scalar, long, ka, kb, ha, hb, ga, gb, qa,
        kb3, kb1, moments,
    ]);
    Ok(res)
}

/// The conv family's primitives (kernels/conv.cu): a 2-D geometry with stride and padding, and
/// a 3-D one on values rounded to 0.1 (many max-pool ties).
fn conv_family<D: Device>(
    d: &mut D,
    i: &Inputs,
) -> Result<Vec<(&'static str, &'static str, bool, Buffer)>> {
    let fam = "conv";
    let geo = |batch, channels, big: &[usize], k: &[usize], s: &[usize], p: &[usize]| Windows {
        batch,
        channels,
        big: big.to_vec(),
        small: (0..big.len())
            .map(|a| (big[a] + 2 * p[a] - k[a]) / s[a] + 1)
            .collect(),
        kernel: k.to_vec(),
        stride: s.to_vec(),
        padding: p.to_vec(),
    };
    let w2 = geo(2, 5, &[10, 10], &[3, 2], &[2, 1], &[1, 1]);
    let w3 = geo(1, 8, &[5, 5, 5], &[2, 3, 2], &[1, 2, 2], &[1, 1, 0]);
    let ties: Vec<f32> = i.x.iter().map(|v| (v * 10.0).round() / 10.0).collect();
    let mut out = Vec::new();
    for (w, data) in [(&w2, &i.x), (&w3, &ties)] {
        let l = w.check("test")?;
        let x = d.upload(&data[..l.big_len()])?;
        let g = d.upload(&i.g[..l.small_len()])?;
        let cols = d.im2col(x, w)?;
        out.push((fam, "col2im", true, d.col2im(cols, w)?));
        out.push((fam, "im2col", true, cols));
        for (name, kind, exact) in [
            ("max", PoolKind::Max, true),
            ("avg", PoolKind::Avg, true),
            ("smooth_max", PoolKind::SmoothMax(2.5), false),
            ("smooth_min", PoolKind::SmoothMax(-0.5), false),
        ] {
            out.push((fam, name, exact, d.pool(x, w, kind)?));
            out.push((fam, name, exact, d.pool_bwd(x, g, w, kind)?));
        }
        d.release_all([x, g]);
    }
    Ok(out)
}

/// Per family (max relative error, all passed) and the failures, comparing the device's
/// results `got` with the sim's `want`: bit for bit where `exact` says so and `bits` is on,
/// else within 1e-5 of each result's largest magnitude.
fn compare(want: &[Out], got: &[Out], bits: bool) -> (Vec<(&'static str, f64, bool)>, Vec<String>) {
    let mut families: Vec<(&'static str, f64, bool)> = Vec::new();
    let mut failures = Vec::new();
    for ((fam, name, exact, w), (_, _, _, c)) in want.iter().zip(got) {
        assert_eq!(w.len(), c.len(), "{name}: lengths");
        let scale = w.iter().fold(1.0f64, |m, &v| m.max(f64::from(v).abs()));
        let mut err = 0.0f64;
        let mut bits_equal = true;
        for (&a, &b) in w.iter().zip(c) {
            bits_equal &= a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let e = (f64::from(a) - f64::from(b)).abs() / scale;
            if e.is_nan() && !(a.is_nan() && b.is_nan()) {
                err = f64::INFINITY;
            } else if e > err {
                err = e;
            }
        }
        let exact = *exact && bits;
        let ok = if exact { bits_equal } else { err <= 1e-5 };
        if !ok {
            failures.push(format!(
                "{name}: max rel error {err:e} (bit-exact expected: {exact})"
            ));
        }
        match families.iter_mut().find(|f| f.0 == *fam) {
            Some(f) => {
                f.1 = f.1.max(err);
                f.2 &= ok;
            }
            None => families.push((fam, err, ok)),
        }
    }
    (families, failures)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "pass" } else { "FAIL" }
}

/// The fused launches give the bits of the chains they replace on the CUDA device too.
#[test]
fn fused_chains_give_the_bits_of_their_separate_launches_on_cuda() {
    let Some(mut cuda) = gpu() else { return };
    let bad = common::fused_chain_mismatches(&mut cuda);
    assert!(bad.is_empty(), "fused != unfused on CUDA: {bad:?}");
}

/// `axpy_assign_list` gives the bits of one `axpy_assign` per pair on the CUDA device too.
#[test]
fn axpy_assign_list_gives_the_bits_of_one_launch_per_pair_on_cuda() {
    let Some(mut cuda) = gpu() else { return };
    let bad = common::axpy_list_mismatches(&mut cuda);
    assert!(bad.is_empty(), "axpy_assign_list on CUDA: {bad:?}");
}

/// The fused optimizer steps give the bits of their primitives on the CUDA device too.
#[test]
fn fused_optimizer_steps_give_the_bits_of_their_primitives_on_cuda() {
    let Some(mut cuda) = gpu() else { return };
    let bad = common::optim::optimizer_update_mismatches(&mut cuda);
    assert!(bad.is_empty(), "fused != composed on CUDA: {bad:?}");
}

/// The list forms of the fused optimizer steps give the bits of one launch per parameter on
/// the CUDA device too (the list kernels' slots, per-slot bias corrections and grouping).
#[test]
fn fused_optimizer_lists_give_the_bits_of_one_launch_per_parameter_on_cuda() {
    let Some(mut cuda) = gpu() else { return };
    let bad = common::optim::optimizer_list_mismatches(&mut cuda);
    assert!(
        bad.is_empty(),
        "list != one launch per parameter on CUDA: {bad:?}"
    );
}

/// `matmul_acc` gives the bits of a product then an add on the CUDA device too.
#[test]
fn matmul_acc_gives_the_bits_of_a_product_then_an_add_on_cuda() {
    let Some(mut cuda) = gpu() else { return };
    let bad = common::matmul_acc_mismatches(&mut cuda);
    assert!(bad.is_empty(), "matmul_acc on CUDA: {bad:?}");
}

/// Both tilings of the matrix product (`tl_gemm`'s 64×64 and `tl_gemm_wide`'s 128×128) give
/// the sim's bits: partial tiles in both dimensions, `k` not a multiple of either k-slice,
/// every transpose, a split `k`, head-merged and grouped operands, an accumulating product, and ±∞ and NaN
/// among the inputs (a NaN matches any NaN, as the GPU's canonical NaN differs from the
/// host's payload).
#[test]
fn both_gemm_tilings_give_the_sims_bits() {
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let _flag = common::flag_lock();
    determinism::set_deterministic_reductions(true);
    let mut r = Gen::new(0x7e57);
    let mut data: Vec<f32> = (0..60_000).map(|_| r.range(-2.0, 2.0) as f32).collect();
    data[5] = f32::INFINITY;
    data[40_000] = f32::NEG_INFINITY;
    data[40_007] = f32::NAN;
    let mut bad = Vec::new();
    for tiles in [GemmTiles::Narrow, GemmTiles::Wide] {
        cuda.set_gemm_tiles(tiles);
        let got = gemm_cases(&mut cuda, &data).unwrap();
        let want = gemm_cases(&mut sim, &data).unwrap();
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            let diff = w
                .iter()
                .zip(g)
                .filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
                .count();
            if diff > 0 || w.len() != g.len() {
                bad.push(format!("{tiles:?} {name}: {diff} of {} differ", w.len()));
            }
        }
    }
    cuda.set_gemm_tiles(GemmTiles::Auto);
    assert_eq!(cuda.memory_usage().live_bytes, 0, "leaked on the GPU");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The implicit-GEMM conv kernels (`tl_conv_implicit`, `tl_conv_implicit_dx`,
/// `tl_conv_implicit_dw`) against their sim twins on every case of the `conv_implicit` module
/// (ranks 1 to 4, stride, padding, batch 1, partial tiles, many channels, weight cotangents
/// split along `N·L` into 2, 3 and 4 runs), ±∞ and NaN among the inputs: bit for bit (one FMA a
/// term, in the twin's order; split runs added by `tl_gemm_sum_splits`), emulated (both
/// schedules in CI) and on a GPU. No atomics: the reduction mode changes nothing.
#[test]
fn the_implicit_conv_kernel_gives_the_sims_bits() {
    use crate::conv_implicit::{cases, cotangent, implicit, implicit_dw, implicit_dx, operands};
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let mut bad = Vec::new();
    for (k, c) in cases().iter().enumerate() {
        let (w, mut x) = operands(c, 11 + k as u64);
        if k == 1 {
            x[3] = f32::INFINITY;
            x[500] = f32::NAN;
        }
        let mut g = cotangent(c, 31 + k as u64);
        if k == 1 {
            g[7] = f32::NEG_INFINITY;
        }
        for (what, want, got) in [
            (
                "forward",
                implicit(&mut sim, c, &w, &x).unwrap(),
                implicit(&mut cuda, c, &w, &x).unwrap(),
            ),
            (
                "dx",
                implicit_dx(&mut sim, c, &w, &g).unwrap(),
                implicit_dx(&mut cuda, c, &w, &g).unwrap(),
            ),
            (
                "dw",
                implicit_dw(&mut sim, c, &g, &x).unwrap(),
                implicit_dw(&mut cuda, c, &g, &x).unwrap(),
            ),
        ] {
            let diff = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
                .count();
            if diff > 0 || want.len() != got.len() {
                bad.push(format!(
                    "{} {what}: {diff} of {} differ",
                    c.name,
                    want.len()
                ));
            }
        }
    }
    println!(
        "GPU-SUMMARY conv-implicit {} cases {}",
        cases().len(),
        verdict(bad.is_empty())
    );
    assert_eq!(cuda.memory_usage().live_bytes, 0, "leaked on the GPU");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The tensor-core implicit conv kernels (`tl_conv_implicit_tc`, `tl_conv_implicit_dw_tc`,
/// `tl_conv_implicit_dx_tc`; autocast bf16 and TF32) on every case of the `conv_implicit`
/// module (ranks 1 to 4, stride, padding, batch 1, partial 128×128 tiles, depths not multiples
/// of the 16-deep slice, many channels, weight cotangents split along N·L), ±∞ and NaN among
/// the inputs, and one case whose every product underflows to −0 (the slice's zero padding
/// makes each forward and weight-cotangent sum +0), against their sim twins: emulated bit for bit (both schedules in CI), on a GPU within
/// the f32 sums' rounding (the tensor cores add in their own order).
#[test]
fn the_tensor_core_implicit_conv_kernels_give_the_sims_sums() {
    use crate::conv_implicit::{cases, cotangent, implicit, implicit_dw, implicit_dx, operands};
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let (mut bad, mut runs) = (Vec::new(), 0);
    for p in [Precision::Bf16, Precision::Tf32] {
        let _p = tl_tape_cuda::precision::install(p);
        for (k, c) in cases().iter().enumerate() {
            let (mut w, mut x) = operands(c, 61 + k as u64);
            let mut g = cotangent(c, 81 + k as u64);
            if k == 1 {
                x[3] = f32::INFINITY;
                x[500] = f32::NAN;
            }
            if k == 0 {
                // Every product underflows to −0 (C·K = 30, N·L = 110): the zero padding makes
                // the sums +0.
                w.iter_mut().for_each(|v| *v = -(2f32.powi(-100)));
                g.iter_mut().for_each(|v| *v = -(2f32.powi(-100)));
                x.iter_mut().for_each(|v| *v = 2f32.powi(-100));
            }
            for (what, want, got) in [
                (
                    "forward",
                    implicit(&mut sim, c, &w, &x).unwrap(),
                    implicit(&mut cuda, c, &w, &x).unwrap(),
                ),
                (
                    "dw",
                    implicit_dw(&mut sim, c, &g, &x).unwrap(),
                    implicit_dw(&mut cuda, c, &g, &x).unwrap(),
                ),
                (
                    "dx",
                    implicit_dx(&mut sim, c, &w, &g).unwrap(),
                    implicit_dx(&mut cuda, c, &w, &g).unwrap(),
                ),
            ] {
                if k == 0 && what != "dx" {
                    assert!(want.iter().all(|v| v.to_bits() == 0), "{p:?} {what}: +0");
                }
                let scale = want
                    .iter()
                    .filter(|v| v.is_finite())
                    .fold(1.0f32, |m, v| m.max(v.abs()));
                let differ = |a: &f32, b: &f32| {
                    if a.is_nan() || b.is_nan() {
                        a.is_nan() != b.is_nan()
                    } else if cfg!(feature = "cuda-emu") || !b.is_finite() {
                        a.to_bits() != b.to_bits()
                    } else {
                        (a - b).abs() > 1e-5 * scale
                    }
                };
                let diff = got.iter().zip(&want).filter(|(a, b)| differ(a, b)).count();
                if diff > 0 || want.len() != got.len() {
                    bad.push(format!(
                        "{p:?} {} {what}: {diff} of {} differ",
                        c.name,
                        want.len()
                    ));
                }
                runs += 1;
            }
        }
    }
    // No output channels: the input cotangent sums nothing (+0 everywhere), on both devices.
    let none = crate::conv_implicit::Case {
        name: "no output channels",
        out_channels: 0,
        ..crate::conv_implicit::cases().remove(0)
    };
    for p in [Precision::Bf16, Precision::Tf32] {
        let _p = tl_tape_cuda::precision::install(p);
        let (w, g) = (Vec::new(), Vec::new());
        let (want, got) = (
            implicit_dx(&mut sim, &none, &w, &g).unwrap(),
            implicit_dx(&mut cuda, &none, &w, &g).unwrap(),
        );
        if want.is_empty() || want.iter().chain(&got).any(|v| v.to_bits() != 0) {
            bad.push(format!("{p:?} no output channels: dx not +0"));
        }
        runs += 1;
    }
    println!(
        "GPU-SUMMARY conv-implicit-tc {runs} cases {}",
        verdict(bad.is_empty())
    );
    assert_eq!(cuda.memory_usage().live_bytes, 0, "leaked on the GPU");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Autocast's conv on the implicit kernels, all three on the tensor cores (rounding as they
/// stage): the f32 implicit conv of the host-rounded operands, bit for bit emulated (plus the
/// zero padding's `+ 0.0`), within the f32 sums' rounding on a GPU, as on the sim
/// (`autocast::autocast_rounds_the_implicit_convs_operands_on_the_sim`).
#[test]
fn autocast_rounds_the_implicit_convs_operands_on_the_device() {
    if gpu().is_none() {
        return;
    }
    crate::autocast::autocast_conv_rounds_the_implicit_operands(
        || CudaDevice::new().unwrap(),
        cfg!(feature = "cuda-emu"),
    );
    println!("GPU-SUMMARY conv-implicit-autocast - pass");
}

/// The norm kernels (kernels/norm.cu) against their sim twins (device/sim/norm.rs) on rmsNorm's
/// layouts (not centred, no β) and, beside them, layer and batch norm's: the statistics, the
/// apply, the forward in one launch (`tl_norm_fwd`, rows up to `NORM_FUSED_MAX`) and in two
/// (longer rows), dx, and dγ and dβ by thread and by block (`affine_by_block`), on inputs far
/// from 0 as well as around it; the sums of the longer groups split over blocks at the
/// production rule (`tl_norm_split_*`), and every layout's again with each group forced into
/// 7 chunks (some empty in the short groups). Bit for bit on the kernel emulator (its `sqrtf`
/// is the host's, as the sim's), within 1e-5 on a GPU. No atomics: the reduction mode changes
/// nothing.
#[test]
fn the_norm_kernels_give_the_sims_bits_on_rms_and_centred_layouts() {
    let Some(mut cuda) = gpu() else { return };
    let exact = cfg!(feature = "cuda-emu");
    let mut r = Gen::new(0x4a5);
    let data: Vec<f32> = (0..40_000).map(|_| r.range(-2.0, 2.0) as f32).collect();
    let cases = |d: &mut dyn FnMut() -> Result<Vec<(String, Vec<f32>)>>| {
        let mut all = d().unwrap();
        let _seven = gates::force_norm_split_parts(Some(7));
        all.extend(
            d().unwrap()
                .into_iter()
                .map(|(n, v)| (format!("split 7: {n}"), v)),
        );
        all
    };
    let want = cases(&mut || norm_cases(&mut SimDevice::new(), &data));
    let got = cases(&mut || norm_cases(&mut cuda, &data));
    assert_eq!(want.len(), got.len());
    let mut bad = Vec::new();
    let mut worst = 0.0f64;
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let scale = w.iter().fold(1.0f64, |m, &v| m.max(f64::from(v).abs()));
        let (mut diff, mut err) = (0, 0.0f64);
        for (&a, &b) in w.iter().zip(g) {
            let e = (f64::from(a) - f64::from(b)).abs() / scale;
            err = err.max(if e.is_nan() { f64::INFINITY } else { e });
            diff += usize::from(a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()));
        }
        worst = worst.max(err);
        let ok = w.len() == g.len() && if exact { diff == 0 } else { err <= 1e-5 };
        if !ok {
            bad.push(format!(
                "{name}: {diff} of {} differ (error {err:e})",
                w.len()
            ));
        }
    }
    println!(
        "GPU-SUMMARY norm-kernels {} results {worst:.3e} {}",
        want.len(),
        verdict(bad.is_empty())
    );
    assert_eq!(cuda.memory_usage().live_bytes, 0, "leaked on the GPU");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The results of [`the_norm_kernels_give_the_sims_bits_on_rms_and_centred_layouts`] on `d`,
/// named.
fn norm_cases<D: Device>(d: &mut D, data: &[f32]) -> Result<Vec<(String, Vec<f32>)>> {
    use tl_tape_cuda::device::norm::NORM_FUSED_MAX;
    let layouts = [
        NormLayout::rms(10, 100),
        NormLayout::rms(1, 1),
        NormLayout::rms(3, NORM_FUSED_MAX),
        NormLayout::rms(2, NORM_FUSED_MAX + 1),
        NormLayout::rms(600, 8),
        NormLayout::layer(10, 100),
        NormLayout::layer(600, 8),
        NormLayout::layer(2, NORM_FUSED_MAX + 1),
        NormLayout::channels(2, 5, 100),
        NormLayout::channels(2, 3, 5000),
    ];
    // One launch forward up to NORM_FUSED_MAX, two past it; dγ by one block per feature where
    // each feature has many rows; the longest groups' sums split (unless forced otherwise).
    if gates::norm_split_parts(1, 1) == 1 {
        assert!(layouts[2].fused_forward() && !layouts[3].fused_forward());
        assert!(layouts[4].affine_by_block() && !layouts[0].affine_by_block());
        assert_eq!(layouts[3].split_parts(), 2);
        assert_eq!(layouts[9].split_parts(), 3);
        assert!(layouts[9].affine_split() && layouts[7].split_parts() == 2);
    }
    let mut out = Vec::new();
    for (k, l) in layouts.into_iter().enumerate() {
        let n = l.outer * l.groups * l.seg;
        let f = l.features();
        // Every other case shifted far from 0 (the centred layouts' x₀ at work; rmsNorm's
        // rstd small).
        let off = if k % 2 == 1 { 1000.0 } else { 0.0 };
        let xs: Vec<f32> = data[..n].iter().map(|&v| v + off).collect();
        let x = d.upload(&xs)?;
        let g = d.upload(&data[data.len() - n..])?;
        let ga = d.upload(&data[1000..1000 + f])?;
        let be = if l.centred {
            Some(d.upload(&data[3000..3000 + f])?)
        } else {
            None
        };
        let eps = if k % 3 == 0 { 1e-5 } else { 0.25 };
        let st = d.norm_stats(x, l, eps)?;
        let y = d.norm_apply(x, st, ga, be, l)?;
        let (fy, fst) = d.norm_forward(x, ga, be, l, eps)?;
        let dx = d.norm_bwd_x(x, st, ga, g, l)?;
        let (dg, db) = d.norm_bwd_affine(x, st, g, l)?;
        for (what, b) in [
            ("stats", st),
            ("apply", y),
            ("forward y", fy),
            ("forward stats", fst),
            ("bwd_x", dx),
            ("dgamma", dg),
            ("dbeta", db),
        ] {
            out.push((format!("{l:?} {what}"), d.download(b)?));
        }
        d.release_all([x, g, ga, st, y, fy, fst, dx, dg, db].into_iter().chain(be));
    }
    Ok(out)
}

/// The products of [`both_gemm_tilings_give_the_sims_bits`] on `d`, named.
fn gemm_cases<D: Device>(d: &mut D, data: &[f32]) -> Result<Vec<(String, Vec<f32>)>> {
    // Operands of exactly `len` elements: a from the start of `data`, b from 30 000 on (the
    // ±∞ at 5 and 40 000, the NaN at 40 007).
    let operands = |d: &mut D, la: usize, lb: usize| -> Result<(Buffer, Buffer)> {
        Ok((
            d.upload(&data[..la])?,
            d.upload(&data[30_000..30_000 + lb])?,
        ))
    };
    let mut out = Vec::new();
    let mut keep = |d: &mut D, name: String, bufs: [Buffer; 3]| -> Result<()> {
        out.push((name, d.download(bufs[2])?));
        d.release_all(bufs);
        Ok(())
    };
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = Gemm::nn(130, 37, 150).with_t(ta, tb);
        let (a, b) = operands(d, 130 * 37, 37 * 150)?;
        let c = d.matmul(a, b, g)?;
        keep(d, format!("matmul 130x37x150 ta={ta} tb={tb}"), [a, b, c])?;
    }
    // Few tiles over a long k: split into runs (Gemm::k_chunk).
    let g = Gemm::nn(20, 1000, 24);
    assert!(g.k_splits(1) > 1, "the case must split");
    let (a, b) = operands(d, 20 * 1000, 1000 * 24)?;
    let c = d.matmul(a, b, g)?;
    keep(d, "matmul split k".into(), [a, b, c])?;
    // 2 groups of 3 heads, every operand head-merged, b transposed (attention's scores).
    let bt = Batch::heads(2, 3, [true, true, true]);
    let (a, b) = operands(d, 6 * 70 * 20, 6 * 40 * 20)?;
    let c = d.bmm_heads(a, b, bt, Gemm::nn(70, 20, 40).with_t(false, true))?;
    keep(d, "bmm_heads merged".into(), [a, b, c])?;
    // The same with b grouped: 6 heads reading 2 stored heads (grouped-query attention's K).
    let bt = Batch::heads(2, 6, [true, true, true]).grouped(2, [false, true]);
    let (a, b) = operands(d, 12 * 70 * 20, 4 * 40 * 20)?;
    let c = d.bmm_heads(a, b, bt, Gemm::nn(70, 20, 40).with_t(false, true))?;
    keep(d, "bmm_heads grouped".into(), [a, b, c])?;
    let (a, b) = operands(d, 130 * 37, 37 * 150)?;
    let c = d.upload(&data[10_000..10_000 + 130 * 150])?;
    d.matmul_acc(c, a, b, Gemm::nn(130, 37, 150))?;
    keep(d, "matmul_acc".into(), [a, b, c])?;
    Ok(out)
}

/// Every primitive against the sim twice: with deterministic reductions (bit for bit where no
/// transcendental function is involved), then without them, where the reductions, scatter-adds,
/// col2im and the pool backward take their atomic kernels (within the f32 tolerance). One test,
/// because the switch is process-wide; it holds `flag_lock` while it flips the switch.
#[test]
fn every_primitive_matches_the_simulation_device() {
    let i = inputs();
    let want = run_all(&mut SimDevice::new(), &i).unwrap();
    // Without a GPU, the line above has still checked that every launch of this test is valid.
    let Some(mut cuda) = gpu() else { return };
    let _flag = common::flag_lock();
    determinism::set_deterministic_reductions(true);
    let got = run_all(&mut cuda, &i).unwrap();
    let (families, mut failures) = compare(&want, &got, true);
    for (fam, err, ok) in &families {
        println!("GPU-SUMMARY {fam} {err:.3e} {}", verdict(*ok));
    }
    determinism::set_deterministic_reductions(false);
    let atomic = run_all(&mut cuda, &i);
    determinism::set_deterministic_reductions(true);
    let (families, atomic_failures) = compare(&want, &atomic.unwrap(), false);
    let worst = families.iter().fold(0.0f64, |m, f| m.max(f.1));
    let ok = atomic_failures.is_empty();
    println!("GPU-SUMMARY atomic-paths {worst:.3e} {}", verdict(ok));
    failures.extend(
        atomic_failures
            .into_iter()
            .map(|f| format!("{f} (atomic paths)")),
    );
    let u = cuda.memory_usage();
    assert_eq!(u.live_bytes, 0, "leaked on the GPU: {u}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A full reduction that fits one block (n ≤ 256) is one launch, with the bits of the sim (the
/// two-pass order) in both modes: −0 sums to +0 as the second pass and the atomic add give it,
/// NaN and ∞ propagate, the mean of nothing is NaN. Larger ones keep their two (or three)
/// launches. A NaN matches any NaN: IEEE 754 leaves its sign and payload open, and a GPU's
/// arithmetic returns its canonical `0x7fffffff` where the host keeps the input's payload (the
/// first run on an H100 showed it).
#[test]
fn a_reduction_of_one_block_is_one_launch_with_the_sims_bits() {
    let Some(mut cuda) = gpu() else { return };
    let mut sim = SimDevice::new();
    let _flag = common::flag_lock();
    let wave: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
    let cases: [(&str, Vec<f32>); 7] = [
        ("-0 x5", vec![-0.0; 5]),
        ("-0 x256", vec![-0.0; 256]),
        ("cancel", vec![1e30, -1e30, 3.0]),
        ("nan", vec![f32::NAN, 1.0]),
        ("inf", vec![f32::INFINITY, 1.0, -2.0]),
        ("empty", vec![]),
        ("256 values", wave),
    ];
    let mut bad = Vec::new();
    for deterministic in [true, false] {
        determinism::set_deterministic_reductions(deterministic);
        for (name, data) in &cases {
            for mean in [false, true] {
                let (s, _) = reduce_bits(&mut sim, data, mean);
                let (c, launches) = reduce_bits(&mut cuda, data, mean);
                let nans = f32::from_bits(s).is_nan() && f32::from_bits(c).is_nan();
                if (s != c && !nans) || launches != 1 {
                    bad.push(format!(
                        "{name} mean={mean} deterministic={deterministic}: {c:#x} vs sim {s:#x}, {launches} launches"
                    ));
                }
            }
        }
    }
    determinism::set_deterministic_reductions(true);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The bits of the sum (or mean) of `data` on `d`, and the launches it took.
fn reduce_bits<D: Device>(d: &mut D, data: &[f32], mean: bool) -> (u32, u64) {
    let x = d.upload(data).unwrap();
    let before = d.traffic().launches;
    let r = if mean {
        d.reduce_mean(x)
    } else {
        d.reduce_sum(x)
    }
    .unwrap();
    let launches = d.traffic().launches - before;
    let v = d.download(r).unwrap()[0];
    d.release_all([x, r]);
    (v.to_bits(), launches)
}

/// One op applied to leaves of the given shapes and domains.
fn single(op: Op, leaves: &[(&[usize], Domain)]) -> (Op, Vec<(Shape, Domain)>) {
    (
        op,
        leaves.iter().map(|(s, d)| (Shape::new(s), *d)).collect(),
    )
}

/// Each single-op case as a graph, its leaf values and output cotangent drawn in turn from
/// `Gen::new(seed)`, checked on a CUDA tape against the IR reference: over the CUDA device
/// when `on_gpu`, else over the sim (no GPU: the same graphs, so the case list itself stays
/// valid).
fn check_single_op_cases(cases: &[(Op, Vec<(Shape, Domain)>)], seed: u64, on_gpu: bool) {
    let mut rnd = Gen::new(seed);
    for (op, leaves) in cases {
        let mut g = GraphBuilder::new();
        let ids: Vec<usize> = leaves
            .iter()
            .map(|(s, _)| g.leaf_with(s.clone(), None, true).unwrap())
            .collect();
        let out = g.apply(op.clone(), &ids).unwrap();
        let graph = g.finish();
        let values: Vec<Tensor<f64>> = leaves.iter().map(|(s, d)| draw(&mut rnd, s, *d)).collect();
        let seed = draw(&mut rnd, graph.shape(out).unwrap(), Domain::Any);
        if on_gpu {
            let what = format!("{op:?} on CUDA");
            check_graph_on(
                CudaDevice::new().unwrap(),
                &what,
                &graph,
                &values,
                out,
                &seed,
            );
        } else {
            let what = format!("{op:?} on sim");
            check_graph_on(SimDevice::new(), &what, &graph, &values, out, &seed);
        }
    }
}

/// `(nq, nk, mask, fused)` of `scaledDotProductAttention` on operands of batch 2 under a mask
/// of one matrix per batch element: lower right with a key padding per sequence (element 1
/// keeps 4 of the 7 keys), and a dense mask whose row 2 sees nothing in element 1 only; fused
/// and composed.
fn batched_sdpa_masks() -> Vec<(usize, usize, Option<Mask>, bool)> {
    let lr_pad = Mask::from_fn_batched(2, 3, 7, |b, i, j| j <= i + 4 && j < [7, 4][b]).unwrap();
    let dense =
        Mask::from_fn_batched(2, 6, 2, |b, i, j| (b, i) != (1, 2) && (i + j + b) % 3 != 0).unwrap();
    [(3, 7, lr_pad), (6, 2, dense)]
        .into_iter()
        .flat_map(|(nq, nk, m)| [true, false].map(|fused| (nq, nk, Some(m.clone()), fused)))
        .collect()
}

/// The norm family's ops (issue 4): layer/batch/RMS norm, masked softmax (square and
/// rectangular masks, a mask per batch element), attention (both forms, masked and not, batched; the core alone over keys
/// of another length than the queries; masks of one matrix per batch element; keys and values
/// of fewer heads than the queries).
fn norm_family_cases() -> Vec<(Op, Vec<(Shape, Domain)>)> {
    use Domain::Any;
    let mut cases = vec![
        single(
            Op::LayerNorm { eps: 1e-3 },
            &[(&[3, 5], Any), (&[5], Any), (&[5], Any)],
        ),
        single(
            Op::BatchNorm { eps: 1e-3 },
            &[(&[2, 3, 2, 2], Any), (&[3], Any), (&[3], Any)],
        ),
        single(Op::RmsNorm { eps: 1e-3 }, &[(&[3, 5], Any), (&[5], Any)]),
        single(Op::RmsNorm { eps: 1e-5 }, &[(&[2, 2, 4], Any), (&[4], Any)]),
        single(Op::BatchMoments, &[(&[2, 3, 2, 2], Any)]),
        single(Op::BatchMoments, &[(&[4, 5, 3], Any)]),
        single(
            Op::MaskedSoftmax {
                mask: Mask::causal(4).unwrap(),
            },
            &[(&[2, 4, 4], Any)],
        ),
        // Rows other than columns: 3 queries over 5 keys, the last query seeing all.
        single(
            Op::MaskedSoftmax {
                mask: Mask::causal_lower_right(3, 5).unwrap(),
            },
            &[(&[2, 3, 5], Any)],
        ),
        // One matrix per batch element (x's first axis), row 1 fully masked in element 2 only.
        single(
            Op::MaskedSoftmax {
                mask: Mask::from_fn_batched(3, 3, 5, |b, i, j| {
                    (b, i) != (2, 1) && (i + 2 * j + b) % 4 != 0
                })
                .unwrap(),
            },
            &[(&[3, 2, 3, 5], Any)],
        ),
    ];
    // scaledDotProductAttention of 3 queries over 7 keys (and 6 over 2: the first rows of the
    // lower-right mask see nothing), fused (the kernels take nq and nk) and composed.
    for (nq, nk, mask, fused) in [
        (3, 7, None, true),
        (3, 7, Some(Mask::causal_lower_right(3, 7).unwrap()), true),
        (3, 7, Some(Mask::causal_lower_right(3, 7).unwrap()), false),
        (6, 2, Some(Mask::causal_lower_right(6, 2).unwrap()), true),
        (
            6,
            2,
            Some(Mask::from_fn_rectangular(6, 2, |i, j| i != 2 && (i + j) % 3 != 0).unwrap()),
            true,
        ),
        (6, 2, None, false),
    ]
    .into_iter()
    .chain(batched_sdpa_masks())
    {
        let op = Op::ScaledDotProductAttention {
            heads: 2,
            mask,
            fused,
        };
        let (q, kv): (&[usize], &[usize]) = (&[2, nq, 4], &[2, nk, 4]);
        cases.push(single(op, &[(q, Any), (kv, Any), (kv, Any)]));
    }
    // Grouped-query attention: 4 query heads of 2 over 1 and 2 key heads (k, v of width 2 and
    // 4), 3 queries over 7 keys, fused and composed, with no mask and a lower-right causal mask
    // with a key padding per sequence.
    for (kv_heads, mask) in [
        (1, None),
        (2, Some(Mask::causal_lower_right(3, 7).unwrap())),
        (1, batched_sdpa_masks()[0].2.clone()),
    ] {
        for fused in [true, false] {
            let op = Op::ScaledDotProductAttention {
                heads: 4,
                mask: mask.clone(),
                fused,
            };
            let (q, kv): (&[usize], &[usize]) = (&[2, 3, 8], &[2, 7, 2 * kv_heads]);
            cases.push(single(op, &[(q, Any), (kv, Any), (kv, Any)]));
        }
    }
    let causal_padded = Mask::from_fn_batched(2, 3, 3, |b, i, j| j <= i && j < [3, 2][b]).unwrap();
    for (mask, fused) in [
        (None, false),
        (Some(Mask::causal(3).unwrap()), false),
        (None, true),
        (Some(Mask::causal(3).unwrap()), true),
        (
            Some(Mask::from_fn(3, |i, j| i != 1 && j != 2).unwrap()),
            true,
        ),
        // Causal with a key padding per sequence (element 1 keeps 2 of its 3 positions).
        (Some(causal_padded.clone()), true),
        (Some(causal_padded), false),
    ] {
        let op = Op::MultiHeadAttention {
            heads: 2,
            mask,
            fused,
        };
        let w: &[usize] = &[4, 6];
        cases.push(single(
            op,
            &[
                (w, Any),
                (w, Any),
                (w, Any),
                (&[6, 4], Any),
                (&[2, 3, 4], Any),
            ],
        ));
    }
    cases
}

#[test]
fn the_cuda_tape_matches_the_reference_on_the_first_op_set() {
    let on_gpu = gpu().is_some();
    use Domain::{Any, NonZero, Positive};
    let m: &[usize] = &[3, 5];
    let mut cases = vec![];
    for op in [
        Op::Abs,
        Op::Exp,
        Op::Relu,
        Op::Sigmoid,
        Op::Tanh,
        Op::Softplus,
        Op::Scale(-1.5),
    ] {
        cases.push(single(op, &[(m, Any)]));
    }
    for op in [Op::Sqrt, Op::Log] {
        cases.push(single(op, &[(m, Positive)]));
    }
    cases.push(single(Op::Inv, &[(m, NonZero)]));
    cases.push(single(Op::Clamp { lo: -0.5, hi: 0.7 }, &[(m, Any)]));
    cases.push(single(Op::SafeLog { eps: 1e-6 }, &[(m, Any)]));
    cases.push(single(Op::GeluErf, &[(m, Any)]));
    for op in [
        Op::LeakyRelu {
            negative_slope: 0.2,
        },
        Op::Elu { alpha: 0.7 },
    ] {
        cases.push(single(op, &[(m, NonZero)]));
    }
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Max, Op::Min, Op::MseLoss] {
        cases.push(single(op, &[(m, Any), (m, Any)]));
    }
    cases.push(single(Op::Div, &[(m, Any), (m, NonZero)]));
    for op in [
        Op::Transpose2d,
        Op::Sum,
        Op::ReduceSum(1),
        Op::ReduceMean(0),
        Op::Softmax,
        Op::LogSoftmax,
    ] {
        cases.push(single(op, &[(m, Any)]));
    }
    cases.push(single(
        Op::BroadcastTo(Shape::new(&[2, 3, 5])),
        &[(&[3, 1], Any)],
    ));
    cases.push(single(Op::PermuteBca, &[(&[2, 3, 4], Any)]));
    cases.push(single(Op::Matmul, &[(&[3, 4], Any), (&[4, 70], Any)]));
    cases.push(single(Op::Bmm, &[(&[2, 3, 4], Any), (&[2, 4, 5], Any)]));
    cases.push(single(
        Op::Linear,
        &[(&[6, 4], Any), (&[6], Any), (&[5, 4], Any)],
    ));
    cases.extend(norm_family_cases());
    check_single_op_cases(&cases, 11, on_gpu);
    if !on_gpu {
        return;
    }
    println!(
        "GPU-SUMMARY tape(first-op-set) checked {} pass",
        cases.len()
    );
}

#[test]
fn the_cuda_tape_matches_the_reference_on_conv_pool_and_spectral() {
    let on_gpu = gpu().is_some();
    use Domain::Any;
    let (s2, p1) = (vec![2, 1], vec![1, 1]);
    let pool = |k: Vec<usize>| (k, s2.clone(), p1.clone());
    let (k, s, p) = pool(vec![3, 2]);
    let x: &[usize] = &[2, 3, 6, 5];
    let cases = vec![
        single(
            Op::Conv {
                stride: s2.clone(),
                padding: p1.clone(),
            },
            &[(&[4, 3, 3, 2], Any), (&[4], Any), (x, Any)],
        ),
        single(
            Op::ConvTranspose {
                stride: s2.clone(),
                padding: vec![1, 0],
            },
            &[(&[3, 4, 3, 2], Any), (&[4], Any), (x, Any)],
        ),
        single(
            Op::MaxPool {
                kernel: k.clone(),
                stride: s.clone(),
                padding: p.clone(),
            },
            &[(x, Any)],
        ),
        single(
            Op::AvgPool {
                kernel: k.clone(),
                stride: s.clone(),
                padding: p.clone(),
            },
            &[(x, Any)],
        ),
        single(
            Op::SmoothMaxPool {
                kernel: k,
                stride: s,
                padding: p,
                beta: 3.0,
            },
            &[(x, Any)],
        ),
        single(
            Op::SpectralConv1dRfft { modes: 4 },
            &[(&[2, 6, 3], Any), (&[4, 3, 3], Any), (&[4, 3, 3], Any)],
        ),
    ];
    check_single_op_cases(&cases, 12, on_gpu);
    if on_gpu {
        println!("GPU-SUMMARY tape(conv) checked {} pass", cases.len());
    }
}
