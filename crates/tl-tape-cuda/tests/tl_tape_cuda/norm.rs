//! The norm family's primitives on the simulation device, with hand-worked values: statistics
//! (each group centred on its first element x₀: the mean d̄ of x − x₀, then the two-pass biased
//! variance), the affine map, the closed-form backward and the masked softmax; and rmsNorm's
//! layout (not centred, no β) against the f64 reference, on the primitives and on the tape.

use crate::common::{Domain, Gen, check_graph, draw};
use tl_ir::{GraphBuilder, Op};
use tl_spec::ops::attention::Mask;
use tl_spec::ops::norm::{Groups, normalize_vjp, rms_norm};
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::device::NormLayout;
use tl_tape_cuda::device::norm::NORM_FUSED_MAX;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Error, SimDevice};

fn close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (a, w) in got.iter().zip(want) {
        assert!((f64::from(*a) - w).abs() <= tol, "{got:?} vs {want:?}");
    }
}

#[test]
fn layer_statistics_and_affine_map_by_hand() {
    let mut d = SimDevice::new();
    // Rows [1, 2, 3, 6] (μ 3 = x₀ 1 + d̄ 2, var 3.5) and [2, 2, 2, 2] (μ 2 = x₀ 2 + d̄ 0, var 0:
    // rstd = 1/sqrt(ε)).
    let x = d.upload(&[1.0, 2.0, 3.0, 6.0, 2.0, 2.0, 2.0, 2.0]).unwrap();
    let l = NormLayout::layer(2, 4);
    let st = d.norm_stats(x, l, 0.25).unwrap();
    let r = 1.0 / (3.5f64 + 0.25).sqrt();
    close(&d.download(st).unwrap(), &[2.0, 0.0, r, 2.0], 1e-6);
    let ga = d.upload(&[1.0, 2.0, 1.0, 0.5]).unwrap();
    let be = d.upload(&[0.0, 0.0, 1.0, -1.0]).unwrap();
    let y = d.norm_apply(x, st, ga, Some(be), l).unwrap();
    let want = [-2.0 * r, -2.0 * r, 1.0, 1.5 * r - 1.0, 0.0, 0.0, 1.0, -1.0];
    close(&d.download(y).unwrap(), &want, 1e-6);
}

#[test]
fn batch_statistics_span_samples_and_gamma_is_per_channel() {
    let mut d = SimDevice::new();
    // (N=2, C=2, HW=2): channel 0 = [0, 2, 4, 6] (μ 3 = x₀ 0 + d̄ 3, var 5), channel 1 =
    // [1, 1, 3, 3] (μ 2 = x₀ 1 + d̄ 1, var 1).
    let x = d.upload(&[0.0, 2.0, 1.0, 1.0, 4.0, 6.0, 3.0, 3.0]).unwrap();
    let l = NormLayout::channels(2, 2, 2);
    let st = d.norm_stats(x, l, 1e-6).unwrap();
    let (r0, r1) = (1.0 / (5.0f64 + 1e-6).sqrt(), 1.0 / (1.0f64 + 1e-6).sqrt());
    close(&d.download(st).unwrap(), &[3.0, 1.0, r0, r1], 1e-6);
    let ga = d.upload(&[2.0, 1.0]).unwrap();
    let be = d.upload(&[1.0, 0.0]).unwrap();
    let y = d.norm_apply(x, st, ga, Some(be), l).unwrap();
    let want = [
        1.0 - 6.0 * r0,
        1.0 - 2.0 * r0,
        -r1,
        -r1,
        1.0 + 2.0 * r0,
        1.0 + 6.0 * r0,
        r1,
        r1,
    ];
    close(&d.download(y).unwrap(), &want, 1e-5);
    // dβ = Σ g per channel, dγ = Σ g·x̂ per channel.
    let g = d.upload(&[1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 3.0]).unwrap();
    let (dg, db) = d.norm_bwd_affine(x, st, g, l).unwrap();
    close(&d.download(db).unwrap(), &[2.0, 5.0], 0.0);
    close(
        &d.download(dg).unwrap(),
        &[-3.0 * r0 + 3.0 * r0, -2.0 * r1 + 3.0 * r1],
        1e-6,
    );
}

#[test]
fn input_gradient_is_the_closed_form() {
    let mut d = SimDevice::new();
    // One row [1, 2, 3, 6], γ = 1, g = e0: ĝ = g, Σ ĝ = 1, Σ ĝ·x̂ = x̂0 = −2r, so
    // dx_i = r/4 · (4·g_i − 1 + 2r·x̂_i).
    let x = d.upload(&[1.0, 2.0, 3.0, 6.0]).unwrap();
    let l = NormLayout::layer(1, 4);
    let st = d.norm_stats(x, l, 1e-6).unwrap();
    let ga = d.upload(&[1.0; 4]).unwrap();
    let g = d.upload(&[1.0, 0.0, 0.0, 0.0]).unwrap();
    let dx = d.norm_bwd_x(x, st, ga, g, l).unwrap();
    let r = 1.0 / (3.5f64 + 1e-6).sqrt();
    let h = [-2.0 * r, -r, 0.0, 3.0 * r];
    let gi = [1.0, 0.0, 0.0, 0.0];
    let want: Vec<f64> = (0..4)
        .map(|i| r / 4.0 * (4.0 * gi[i] - 1.0 + 2.0 * r * h[i]))
        .collect();
    close(&d.download(dx).unwrap(), &want, 1e-6);
    // The gradient is orthogonal to 1 and to x̂ (the normalization's invariances).
    let v = d.download(dx).unwrap();
    let s: f64 = v.iter().map(|&a| f64::from(a)).sum();
    let sh: f64 = v.iter().zip(h).map(|(&a, h)| f64::from(a) * h).sum();
    assert!(s.abs() < 1e-6 && sh.abs() < 1e-6, "{s} {sh}");
}

#[test]
fn masked_softmax_zeroes_masked_entries_and_empty_rows() {
    let mut d = SimDevice::new();
    // Two (2, 2) blocks; mask row 0 = [1, 1], row 1 = [0, 0].
    let x = d
        .upload(&[0.0, 3f32.ln(), 5.0, 1e30, -1.0, 1.0, 7.0, 8.0])
        .unwrap();
    let y = d
        .masked_softmax_rows(x, &[true, true, false, false], 4, 2, 2)
        .unwrap();
    close(
        &d.download(y).unwrap(),
        &[0.25, 0.75, 0.0, 0.0, 0.119_202_922, 0.880_797_078, 0.0, 0.0],
        1e-6,
    );
    // A masked huge score never leaks: mask [[1, 0], [0, 1]].
    let y = d
        .masked_softmax_rows(x, &[true, false, false, true], 4, 2, 2)
        .unwrap();
    close(
        &d.download(y).unwrap(),
        &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
        0.0,
    );
}

#[test]
fn bad_operands_are_errors_naming_the_primitive() {
    let mut d = SimDevice::new();
    let x = d.upload(&[1.0; 6]).unwrap();
    let two = d.upload(&[1.0; 2]).unwrap();
    let e = d.norm_stats(x, NormLayout::layer(2, 4), 1e-6).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "norm_stats",
                ..
            }
        ),
        "{e}"
    );
    let l = NormLayout::layer(2, 3);
    let st = d.norm_stats(x, l, 1e-6).unwrap();
    let e = d.norm_apply(x, st, two, Some(two), l).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "norm_apply",
                ..
            }
        ),
        "{e}"
    );
    let e = d.norm_bwd_x(x, two, two, x, l).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "norm_bwd_x",
                ..
            }
        ),
        "{e}"
    );
    let e = d.masked_softmax_rows(x, &[true; 3], 3, 2, 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "masked_softmax_rows",
                ..
            }
        ),
        "{e}"
    );
    // 3 rows of 2 are not whole (2, 2) blocks.
    let e = d.masked_softmax_rows(x, &[true; 4], 3, 2, 2).unwrap_err();
    assert!(e.to_string().contains("(2, 2) score blocks"), "{e}");
    // 3 mask entries are not whole (1, 2) matrices.
    let e = d.masked_softmax_rows(x, &[true; 3], 3, 2, 1).unwrap_err();
    assert!(
        e.to_string().contains("3 entries, not a whole number")
            && e.to_string().contains("(1, 2) matrices"),
        "{e}"
    );
}

/// A rectangular mask (m rows of n, an (nq, nk) attention mask): row r of x takes mask row
/// r mod m; masked entries and rows with nothing allowed are exactly 0.
#[test]
fn masked_softmax_takes_a_mask_of_other_rows_than_columns() {
    let mut d = SimDevice::new();
    // Two blocks of a (1, 3) mask, then (3, 2): the rows take mask rows 0, 0 / 0, 1, 2, 0.
    let x = d.upload(&[0.0, 5.0, 3f32.ln(), 1.0, 2.0, 3.0]).unwrap();
    let y = d
        .masked_softmax_rows(x, &[true, false, true], 2, 3, 1)
        .unwrap();
    close(
        &d.download(y).unwrap(),
        &[0.25, 0.0, 0.75, 0.119_202_922, 0.0, 0.880_797_078],
        1e-6,
    );
    let y = d
        .masked_softmax_rows(x, &[true, true, false, false, false, true], 3, 2, 3)
        .unwrap();
    close(
        &d.download(y).unwrap(),
        &[0.006_692_851, 0.993_307_149, 0.0, 0.0, 0.0, 1.0],
        1e-6,
    );
    // 6 rows are not whole blocks of a (4, 1) mask.
    let e = d.masked_softmax_rows(x, &[true; 4], 6, 1, 4).unwrap_err();
    assert!(
        e.to_string()
            .contains("6 rows are not a whole number of (4, 1)"),
        "{e}"
    );
}

/// A mask of one (m, n) matrix per batch element: x's rows split in order into one share per
/// matrix (attention's (B·H, nq, nk) scores: the H·nq rows of element b under matrix b), row r
/// of a share under its matrix's row r mod m; a row fully masked in one element only gives
/// zeros there alone. The same rows under matrix 0 shared by all differ exactly in the second
/// share.
#[test]
fn masked_softmax_takes_one_mask_matrix_per_batch_element() {
    let mut d = SimDevice::new();
    // 8 rows of 3 = 2 batch elements · 2 heads · 2 query rows; all scores 0 but one: each
    // allowed entry gets 1 / (allowed in its row).
    let mut xs = [0f32; 24];
    xs[12] = 3f32.ln(); // row 4, key 0
    let x = d.upload(&xs).unwrap();
    let (o, h, t) = (0.0, 0.5, 1.0 / 3.0);
    // Element 0: rows [1 0 1], [1 1 1]; element 1: [1 0 1] (key 0 scored ln 3 in row 4),
    // [0 0 0] (fully masked in element 1 only).
    let mask = [
        true, false, true, true, true, true, //
        true, false, true, false, false, false,
    ];
    let y = d.masked_softmax_rows(x, &mask, 8, 3, 2).unwrap();
    #[rustfmt::skip]
    let want = [
        h, o, h, t, t, t, h, o, h, t, t, t, // element 0, heads 0 and 1
        0.75, o, 0.25, o, o, o, h, o, h, o, o, o, // element 1
    ];
    close(&d.download(y).unwrap(), &want, 1e-6);
    // Matrix 0 alone, shared by both elements: the second share takes it too.
    let y = d.masked_softmax_rows(x, &mask[..6], 8, 3, 2).unwrap();
    let mut shared = want;
    shared[12..].copy_from_slice(&[0.75, o, 0.25, t, t, t, h, o, h, t, t, t]);
    close(&d.download(y).unwrap(), &shared, 1e-6);
    // Two (1, 3) matrices over the same rows: shares of 4, each row its matrix's only row.
    let y = d.masked_softmax_rows(x, &mask[..6], 8, 3, 1).unwrap();
    let got = d.download(y).unwrap();
    close(&got[..12], &[h, o, h, h, o, h, h, o, h, h, o, h], 1e-6);
    close(
        &got[12..],
        &[0.6, 0.2, 0.2, t, t, t, t, t, t, t, t, t],
        1e-6,
    );
    // Three matrices cannot split 8 rows; 4 rows are not a whole share of (2, 3) blocks each.
    let e = d.masked_softmax_rows(x, &[true; 18], 8, 3, 2).unwrap_err();
    assert!(
        e.to_string().contains("8 rows") && e.to_string().contains("3 matrices"),
        "{e}"
    );
    let x6 = d.upload(&xs[..18]).unwrap();
    let e = d.masked_softmax_rows(x6, &mask, 6, 3, 2).unwrap_err();
    assert!(
        e.to_string().contains("6 rows") && e.to_string().contains("(2, 3) score blocks"),
        "{e}"
    );
}

/// `maskedSoftmax` under a mask of one (3, 5) matrix per batch element (x's first axis, PyTorch's
/// (B, 1, L, S) broadcast), x (2, 3, 5) and (2, 2, 3, 5), row 2 fully masked in element 1
/// only; and under the same mask's first matrix shared: the CUDA tape (sim) against IR eval
/// and backprop (check 1 and 2).
#[test]
fn masked_softmax_on_the_tape_takes_a_mask_per_batch_element() {
    let mut rnd = Gen::new(0x3a5c);
    let batched =
        Mask::from_fn_batched(2, 3, 5, |b, i, j| (b, i) != (1, 2) && (i + j + b) % 3 != 0).unwrap();
    let shared = Mask::rectangular(3, 5, batched.as_slice()[..15].to_vec()).unwrap();
    for mask in [batched, shared] {
        for dims in [&[2, 3, 5][..], &[2, 2, 3, 5]] {
            let xs = Shape::new(dims);
            let mut g = GraphBuilder::new();
            let x = g.leaf(xs.clone(), None).unwrap();
            let y = g
                .apply(Op::MaskedSoftmax { mask: mask.clone() }, &[x])
                .unwrap();
            let graph = g.finish();
            let leaves = [draw(&mut rnd, &xs, Domain::Any)];
            let seed = draw(&mut rnd, &xs, Domain::Any);
            check_graph(
                &format!("maskedSoftmax {dims:?} {mask:?}"),
                &graph,
                &leaves,
                y,
                &seed,
            );
        }
    }
}

/// `norm_forward` gives the bits of `norm_stats` then `norm_apply`: one launch for short groups
/// (a layer norm's rows), two for groups longer than `NORM_FUSED_MAX`, four where the
/// statistics' sums are split over blocks (`tl_norm_split_mean`, `_sq`, `_finish`, then the
/// apply); operands checked under its own name.
#[test]
fn norm_forward_is_stats_then_apply_in_one_launch_for_short_groups() {
    let mut d = SimDevice::new();
    for l in [
        NormLayout::layer(3, 7),
        NormLayout::channels(2, 3, 5),
        NormLayout::channels(2, 3, 4000),
    ] {
        let n = l.outer * l.groups * l.seg;
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin() * 3.0 + 1.0).collect();
        let f = l.features();
        let x = d.upload(&xs).unwrap();
        let ga = d
            .upload(&(0..f).map(|i| 0.5 + i as f32).collect::<Vec<_>>())
            .unwrap();
        let be = d
            .upload(&(0..f).map(|i| 0.25 * i as f32).collect::<Vec<_>>())
            .unwrap();
        let st = d.norm_stats(x, l, 1e-5).unwrap();
        let y = d.norm_apply(x, st, ga, Some(be), l).unwrap();
        let before = d.traffic().launches;
        let (fy, fst) = d.norm_forward(x, ga, Some(be), l, 1e-5).unwrap();
        let launches = d.traffic().launches - before;
        let split = l.split_parts() > 1;
        let want = match (l.fused_forward(), split) {
            (true, _) => 1,
            (false, false) => 2,
            (false, true) => 4,
        };
        assert_eq!(launches, want, "{l:?}");
        assert_eq!(l.fused_forward(), l.group_len() <= 4096, "{l:?}");
        // 3 channels of 8000: two chunks of 4000 a channel.
        assert_eq!(split, l.group_len() == 8000, "{l:?}");
        let bits = |d: &SimDevice, b| -> Vec<u32> { crate::common::bits(&d.download(b).unwrap()) };
        assert_eq!(bits(&d, fy), bits(&d, y), "{l:?}");
        assert_eq!(bits(&d, fst), bits(&d, st), "{l:?}");
    }
    let x = d.upload(&[1.0; 8]).unwrap();
    let short = d.upload(&[1.0; 3]).unwrap();
    let e = d
        .norm_forward(x, short, Some(short), NormLayout::layer(2, 4), 1e-5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("norm_forward") && e.contains("gamma"), "{e}");
}

/// `norm_moments` (`batchMoments`): the means and biased variances by hand, the means the bits
/// of each channel's first element plus the d̄ `norm_stats` keeps, the variances those of its
/// rstd once ε is added (one statistics code path),
/// one launch; `norm_moments_bwd` the closed form `(gμ + 2·gv·(x − μ))/m`; bad operands are
/// errors naming the primitive.
#[test]
fn moments_are_the_statistics_without_eps_and_their_vjp_is_the_closed_form() {
    let mut d = SimDevice::new();
    // (N=2, C=2, HW=2): channel 0 = [0, 2, 4, 6] (μ 3, var 5), channel 1 = [1, 1, 3, 3] (μ 2,
    // var 1).
    let x = d.upload(&[0.0, 2.0, 1.0, 1.0, 4.0, 6.0, 3.0, 3.0]).unwrap();
    let l = NormLayout::channels(2, 2, 2);
    let before = d.traffic().launches;
    let mo = d.norm_moments(x, l).unwrap();
    assert_eq!(d.traffic().launches, before + 1);
    let got = d.download(mo).unwrap();
    close(&got, &[3.0, 2.0, 5.0, 1.0], 0.0);
    let eps = 0.5f32;
    let st = d.norm_stats(x, l, eps).unwrap();
    let st = d.download(st).unwrap();
    let first = [0.0f32, 1.0];
    for k in 0..2 {
        assert_eq!((first[k] + st[k]).to_bits(), got[k].to_bits());
    }
    for k in 0..2 {
        assert_eq!(
            st[2 + k].to_bits(),
            (1.0 / (got[2 + k] + eps).sqrt()).to_bits()
        );
    }
    // g = (gμ, gv) = ((1, 0), (0.5, 2)): channel 0 dx = (1 + (x − 3))/4, channel 1
    // dx = 4·(x − 2)/4.
    let g = d.upload(&[1.0, 0.0, 0.5, 2.0]).unwrap();
    let dx = d.norm_moments_bwd(x, mo, g, l).unwrap();
    let want = [-0.5, 0.0, -1.0, -1.0, 0.5, 1.0, 1.0, 1.0];
    close(&d.download(dx).unwrap(), &want, 0.0);
    // Errors name the primitive: x of the wrong length, moments or cotangent not 2·C.
    let e = d
        .norm_moments(x, NormLayout::channels(3, 2, 2))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Kernel {
                op: "norm_moments",
                ..
            }
        ),
        "{e}"
    );
    for (m, g) in [(x, g), (mo, x)] {
        let e = d.norm_moments_bwd(x, m, g, l).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Kernel {
                    op: "norm_moments_bwd",
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// `running_update_moments`: BatchNorm's two running statistics in one launch from the
/// (2, n) moments: the running mean takes the first row as it is, the running variance the
/// second made unbiased (·count/(count − 1)), each PyTorch's rule per element in f64 rounded
/// once to f32 (not f32 arithmetic), into two fresh buffers; a NaN or one-element variance
/// keeps the running value; bad operands are errors naming the primitive.
#[test]
fn running_update_moments_is_the_f64_rule_rounded_once() {
    let mut d = SimDevice::new();
    let mean = [1.0f32, 0.3, -2.5, 7.0];
    let var = [0.5f32, 2.0, 1.25, 3.0];
    // The batch means, then the biased batch variances.
    let mo = [3.0f32, 1.7, f32::NAN, 0.7, 2.0, 0.4, f32::NAN, 5.5];
    let (rm, rv) = (d.upload(&mean).unwrap(), d.upload(&var).unwrap());
    let moments = d.upload(&mo).unwrap();
    let m = 0.1;
    let f64_rule = |o: f32, v: f64| ((1.0 - m) * f64::from(o) + m * v) as f32;
    let unbiased = |v: f32| f64::from(v) * 4.0 / 3.0;
    let before = d.traffic().launches;
    let (nm, nv) = d.running_update_moments(rm, rv, moments, m, 4).unwrap();
    assert_eq!(d.traffic().launches, before + 1, "one launch for both");
    let (got_m, got_v) = (d.download(nm).unwrap(), d.download(nv).unwrap());
    for k in [0, 1, 3] {
        let want = f64_rule(mean[k], f64::from(mo[k]));
        assert_eq!(got_m[k].to_bits(), want.to_bits(), "mean {k}");
        let want = f64_rule(var[k], unbiased(mo[4 + k]));
        assert_eq!(got_v[k].to_bits(), want.to_bits(), "var {k}");
    }
    assert!(got_m[2].is_nan(), "a NaN mean propagates");
    assert_eq!(got_v[2], var[2], "a NaN variance keeps the running value");
    // 0.9·0.3 + 0.1·1.7 in f32 arithmetic is another float.
    let f32_rule = 0.9f32 * 0.3 + 0.1f32 * 1.7;
    assert_ne!(got_m[1].to_bits(), f32_rule.to_bits());
    // The mean row as it is, the variance row unbiased with this count: the other pairing or
    // another count gives other bits.
    assert_ne!(got_v[0], f64_rule(var[0], f64::from(mo[4])));
    assert_ne!(got_v[0], f64_rule(var[0], f64::from(mo[0]) * 4.0 / 3.0));
    assert_ne!(got_m[0], f64_rule(mean[0], f64::from(mo[4])));
    let (om, ov) = d.running_update_moments(rm, rv, moments, m, 1).unwrap();
    use crate::common::bits;
    let mean_one = d.download(om).unwrap();
    assert_eq!(bits(&mean_one), bits(&got_m), "the mean ignores the count");
    assert_eq!(
        d.download(ov).unwrap(),
        var,
        "one element keeps every running variance"
    );
    assert_eq!(
        d.download(rm).unwrap(),
        mean,
        "the running mean is not written"
    );
    assert_eq!(
        d.download(rv).unwrap(),
        var,
        "the running variance is not written"
    );
    // Errors: a variance of another length, moments not twice as long, a momentum outside
    // [0, 1].
    let short = d.upload(&[1.0]).unwrap();
    for (a, b, mo) in [(rm, short, moments), (rm, rv, rv)] {
        let e = d.running_update_moments(a, b, mo, m, 4).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Kernel {
                    op: "running_update_moments",
                    ..
                }
            ),
            "{e}"
        );
    }
    for bad in [-0.5, 1.5, f64::NAN] {
        let e = (d.running_update_moments(rm, rv, moments, bad, 4)).unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("running_update_moments") && t.contains("momentum"),
            "{t}"
        );
    }
}

/// `running_inv_std`: BatchNorm's eval scale `1/sqrt(var + eps)` per element in f64, rounded
/// once to f32 (the host's rule), one launch into a fresh buffer; a bad ε is an error naming
/// the primitive.
#[test]
fn running_inv_std_is_the_f64_rule_rounded_once() {
    let mut d = SimDevice::new();
    let var: Vec<f32> = (0..64)
        .map(|k| k as f32 * 0.37 + 0.01)
        .chain([0.0])
        .collect();
    let v = d.upload(&var).unwrap();
    let eps = 1e-5;
    let before = d.traffic().launches;
    let s = d.running_inv_std(v, eps).unwrap();
    assert_eq!(d.traffic().launches, before + 1);
    let got = d.download(s).unwrap();
    let rule = |v: f32| (1.0 / (f64::from(v) + eps).sqrt()) as f32;
    for (k, (&g, &v)) in got.iter().zip(&var).enumerate() {
        assert_eq!(g.to_bits(), rule(v).to_bits(), "{k}: var {v}");
    }
    // f32 arithmetic (add, sqrt, reciprocal: three roundings) differs somewhere.
    let f32_rule = |v: f32| 1.0 / (v + eps as f32).sqrt();
    assert!(
        got.iter()
            .zip(&var)
            .any(|(g, &v)| g.to_bits() != f32_rule(v).to_bits())
    );
    for bad in [0.0, -1e-5, f64::NAN, f64::INFINITY] {
        let e = d.running_inv_std(v, bad).unwrap_err().to_string();
        assert!(e.contains("running_inv_std") && e.contains("eps"), "{e}");
    }
}

fn bits(d: &SimDevice, b: tl_tape_cuda::Buffer) -> Vec<u32> {
    crate::common::bits(&d.download(b).unwrap())
}

/// rmsNorm's layout by hand: no mean pass (the statistics' d̄s are +0), `rstd = 1/sqrt(Σ
/// x²/m + ε)`, `y = x·rstd·γ` with no β (a −0 product stays −0: nothing is added).
#[test]
fn rms_statistics_and_map_by_hand() {
    let mut d = SimDevice::new();
    // Rows [1, 2, 2, 4] and [−3, 0, 0, 4]: Σ x²/4 = 6.25 in both (layer norm would centre on
    // 2.25 and 0.25).
    let x = d
        .upload(&[1.0, 2.0, 2.0, 4.0, -3.0, 0.0, 0.0, 4.0])
        .unwrap();
    let l = NormLayout::rms(2, 4);
    assert!(!l.centred && l.per_column && l.features() == 4);
    let st = d.norm_stats(x, l, 0.25).unwrap();
    let r = 1.0 / (6.25f64 + 0.25).sqrt();
    let got = d.download(st).unwrap();
    assert_eq!([got[0].to_bits(), got[1].to_bits()], [0, 0], "d̄ = +0");
    close(&got, &[0.0, 0.0, r, r], 1e-6);
    let ga = d.upload(&[1.0, 2.0, -1.0, 0.5]).unwrap();
    let y = d.norm_apply(x, st, ga, None, l).unwrap();
    let want = [r, 4.0 * r, -2.0 * r, 2.0 * r, -3.0 * r, 0.0, 0.0, 2.0 * r];
    let y = d.download(y).unwrap();
    close(&y, &want, 1e-6);
    assert!(
        y[6] == 0.0 && y[6].is_sign_negative(),
        "0·rstd·(−1) = −0, no β added"
    );
    // The one-launch forward: the same bits.
    let before = d.traffic().launches;
    let (fy, fst) = d.norm_forward(x, ga, None, l, 0.25).unwrap();
    assert_eq!(d.traffic().launches - before, 1);
    let fy = d.download(fy).unwrap();
    assert_eq!(crate::common::bits(&fy), crate::common::bits(&y));
    assert_eq!(bits(&d, fst), bits(&d, st));
}

/// rmsNorm's primitives against the f64 reference (`rms_norm`, `normalize_vjp` with
/// `Groups::rms`) within f32 tolerance: the value, dx (no `Σ ĝ` term: the mean is no function
/// of x, so dx is orthogonal to x̂ but not to 1) and dγ = Σ g·x̂, on rows short and long
/// (`norm_forward` one launch, or two past `NORM_FUSED_MAX`), and many rows per feature (dγ by
/// one block per feature, `affine_by_block`). dβ, still `Σ g`, is released by the tape.
#[test]
fn rms_primitives_match_the_reference() {
    let mut rnd = Gen::new(0x5e5);
    for (rows, cols, eps) in [
        (3, 7, 1e-5),
        (1, 1, 1e-3),
        (2, NORM_FUSED_MAX + 904, 1e-6),
        (600, 8, 1e-5),
    ] {
        let l = NormLayout::rms(rows, cols);
        let xt = draw(&mut rnd, &Shape::new(&[rows, cols]), Domain::Any);
        let gt = draw(&mut rnd, &Shape::new(&[cols]), Domain::Any);
        let ct = draw(&mut rnd, &Shape::new(&[rows, cols]), Domain::Any);
        let want_y = rms_norm(&xt, &gt, eps).unwrap();
        let gr = Groups::rms(xt.shape());
        let (want_dx, want_dg, no_db) = normalize_vjp(gr, &xt, &gt, false, eps, &ct).unwrap();
        assert!(no_db.is_none());
        let up = |d: &mut SimDevice, t: &Tensor<f64>| {
            let v: Vec<f32> = t.data().iter().map(|&v| v as f32).collect();
            d.upload(&v).unwrap()
        };
        let mut d = SimDevice::new();
        let (x, ga, g) = (up(&mut d, &xt), up(&mut d, &gt), up(&mut d, &ct));
        let before = d.traffic().launches;
        let (y, st) = d.norm_forward(x, ga, None, l, eps as f32).unwrap();
        let launches = d.traffic().launches - before;
        // Past NORM_FUSED_MAX the two rows split in two chunks each: tl_norm_split_sq and
        // tl_norm_split_finish (no mean pass: not centred), then the apply.
        assert_eq!(l.split_parts() > 1, cols > NORM_FUSED_MAX, "{l:?}");
        assert_eq!(
            launches,
            if cols <= NORM_FUSED_MAX { 1 } else { 3 },
            "{l:?}"
        );
        let what = format!("rms({rows}, {cols})");
        let tol = |t: &Tensor<f64>| 1e-4 * t.data().iter().fold(1.0f64, |m, v| m.max(v.abs()));
        close(&d.download(y).unwrap(), want_y.data(), tol(&want_y));
        let dx = d.norm_bwd_x(x, st, ga, g, l).unwrap();
        let dxv = d.download(dx).unwrap();
        close(&dxv, want_dx.data(), tol(&want_dx));
        assert_eq!(l.affine_by_block(), rows == 600, "{what}");
        let (dg, db) = d.norm_bwd_affine(x, st, g, l).unwrap();
        close(&d.download(dg).unwrap(), want_dg.data(), tol(&want_dg));
        // dβ is Σ g per column all the same.
        let sum_g: Vec<f64> = (0..cols)
            .map(|c| (0..rows).map(|r| ct.data()[r * cols + c]).sum())
            .collect();
        close(&d.download(db).unwrap(), &sum_g, 1e-4 * rows as f64);
        // Centring would subtract Σ ĝ/m·rstd from each element: the reference's rows do not
        // sum to 0 (a layer norm's do), so the comparison above sees it.
        if cols > 1 {
            let row0: f64 = want_dx.data()[..cols].iter().sum();
            assert!(row0.abs() > 1e-3, "{what}: {row0}");
        }
        d.release_all([x, ga, g, y, st, dx, dg, db]);
        assert_eq!(d.memory_usage().live_bytes, 0, "{what}");
    }
}

/// β is given exactly where the layout is centred: `norm_apply` and `norm_forward` with a β
/// for rmsNorm's layout, or without one for layer and batch norm's, are errors naming the
/// primitive (before any launch).
#[test]
fn beta_presence_must_match_the_layout() {
    let mut d = SimDevice::new();
    let x = d.upload(&[1.0; 6]).unwrap();
    let three = d.upload(&[1.0; 3]).unwrap();
    let (rms, layer) = (NormLayout::rms(2, 3), NormLayout::layer(2, 3));
    let st = d.norm_stats(x, rms, 1e-6).unwrap();
    let before = d.traffic().launches;
    let is = |e: Error, name: &str| match e {
        Error::Kernel { op, detail } => assert!(op == name && detail.contains("beta"), "{detail}"),
        e => panic!("{e}"),
    };
    is(
        d.norm_apply(x, st, three, Some(three), rms).unwrap_err(),
        "norm_apply",
    );
    is(
        d.norm_apply(x, st, three, None, layer).unwrap_err(),
        "norm_apply",
    );
    is(
        d.norm_forward(x, three, Some(three), rms, 1e-6)
            .unwrap_err(),
        "norm_forward",
    );
    is(
        d.norm_forward(x, three, None, layer, 1e-6).unwrap_err(),
        "norm_forward",
    );
    let chan = NormLayout::channels(1, 2, 3);
    let two = d.upload(&[1.0; 2]).unwrap();
    is(
        d.norm_forward(x, two, None, chan, 1e-6).unwrap_err(),
        "norm_forward",
    );
    assert_eq!(d.traffic().launches, before, "no launch");
    // The centred layouts still check β's length.
    let e = d
        .norm_forward(x, three, Some(two), layer, 1e-6)
        .unwrap_err();
    assert!(e.to_string().contains("beta"), "{e}");
}

/// `rmsNorm` on the CUDA tape over the sim against the f64 IR reference (values and the dense
/// gradients of x and γ, within f32 tolerance): ranks 1 to 3, a row longer than
/// `NORM_FUSED_MAX`, many rows per feature (`affine_by_block`), and each operand frozen.
#[test]
fn rms_norm_on_the_tape_matches_the_reference() {
    let mut rnd = Gen::new(0x7a5e);
    let cases: [(&[usize], f64, [bool; 2]); 7] = [
        (&[3, 5], 1e-5, [true, true]),
        (&[5], 1e-3, [true, true]),
        (&[2, 3, 4], 1e-6, [true, true]),
        (&[2, NORM_FUSED_MAX + 1], 1e-5, [true, true]),
        (&[600, 8], 1e-5, [true, true]),
        (&[3, 5], 1e-5, [false, true]),
        (&[3, 5], 1e-5, [true, false]),
    ];
    for (k, (dims, eps, grads)) in cases.into_iter().enumerate() {
        let xs = Shape::new(dims);
        let gs = Shape::new(&[dims[dims.len() - 1]]);
        let mut g = GraphBuilder::new();
        let x = g.leaf_with(xs.clone(), None, grads[0]).unwrap();
        let ga = g.leaf_with(gs.clone(), None, grads[1]).unwrap();
        let y = g.apply(Op::RmsNorm { eps }, &[x, ga]).unwrap();
        let graph = g.finish();
        for draw_no in 0..2 {
            let leaves = [
                draw(&mut rnd, &xs, Domain::Any),
                draw(&mut rnd, &gs, Domain::Any),
            ];
            let seed = draw(&mut rnd, &xs, Domain::Any);
            let what = format!("rmsNorm case {k} {dims:?} draw {draw_no}");
            check_graph(&what, &graph, &leaves, y, &seed);
        }
    }
}

/// rmsNorm on the tape: one launch forward keeping its statistics (`2·rows` floats, the d̄s 0)
/// as workspace; the backward two launches (dx, then dγ with the dβ it releases) or one with γ
/// frozen; once the workspace is released a second backward recomputes the statistics (one
/// launch more) and gives the same bits; nothing leaks.
#[test]
fn rms_norm_keeps_its_statistics_and_recomputes_them_once_released() {
    let mut rnd = Gen::new(0xb0b);
    for gamma_grad in [true, false] {
        let mut tape = CudaTape::new(SimDevice::new());
        let xt = draw(&mut rnd, &Shape::new(&[4, 6]), Domain::Any);
        let gt = draw(&mut rnd, &Shape::new(&[6]), Domain::Any);
        let x = tape.upload_leaf(&xt, None, true).unwrap();
        let ga = tape.upload_leaf(&gt, None, gamma_grad).unwrap();
        let before = tape.device().traffic().launches;
        let y = tape.apply(&Op::RmsNorm { eps: 1e-5 }, &[x, ga]).unwrap();
        assert_eq!(tape.device().traffic().launches - before, 1);
        let kept = tape.node(y).unwrap().cleanup().to_vec();
        assert_eq!(kept.len(), 1);
        let st = tape.device().download(kept[0]).unwrap();
        assert_eq!(st.len(), 8);
        assert!(st[..4].iter().all(|v| v.to_bits() == 0), "{st:?}");
        let seed_t = draw(&mut rnd, &Shape::new(&[4, 6]), Domain::Any);
        let seed = AnyBuffer::upload(tape.device_mut(), &seed_t).unwrap();
        let (reused, recomputed) = crate::common::backward_from_workspace_then_recomputed(
            &mut tape,
            (y, &seed),
            &[x, ga],
            &kept,
        );
        // dx, and dγ (with dβ) where γ needs it; the dense gradients add their own launches
        // (the same both times).
        assert_eq!(recomputed - reused, 1, "the statistics once more");
        seed.release(tape.device_mut());
        tape.reset();
        let u = tape.device().memory_usage();
        assert_eq!(u.live_bytes, 0, "leaked: {u}");
    }
}
