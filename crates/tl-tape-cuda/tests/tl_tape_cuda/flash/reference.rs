//! The fused core (`Device::flash_attention`, `flash_attention_bwd`) against the f64
//! reference: every case forward and backward, FMA and tensor-core products, the reference
//! against the spec, fully masked rows, and bad input refused before launch.

use super::*;

#[test]
fn the_fused_core_matches_the_f64_reference_forward_and_backward() {
    for (k, case) in cases().iter().enumerate() {
        let data = inputs(&case.dims, 100 + k as u64);
        let mut dev = SimDevice::new();
        let got = run_core(&mut dev, case, &data).unwrap();
        let want = reference(case, &data);
        for (name, (g, w)) in ["O", "lse", "dQ", "dK", "dV"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            let e = max_err(g, w);
            assert!(e <= 1e-5, "{}: {name} off by {e:e}", case.name);
        }
        let u = dev.memory_usage();
        assert_eq!(u.live_bytes, 0, "{}: leaked {u}", case.name);
    }
}

/// The core with its products on the tensor cores as three TF32 products each
/// (`FlashProducts::Tf32x3`: the sim twins of `tl_flash_fwd_tc`, `tl_flash_bwd_q_tc` and
/// `tl_flash_bwd_kv_tc`), forward and backward, on every case with d ≤ 64 (masks of every
/// form, nq ≠ nk, several blocks of 128 rows and steps of 64 keys, grouped heads, masks per
/// batch element): O, lse, dQ, dK, dV within 1e-5 of the f64 reference, as the FMA core. The
/// split matters: products of the big TF32 parts alone (one TF32 product) would be about
/// 2⁻¹¹ off, and a core that ignored the setting would give the FMA core's bits, which it
/// does not on most cases.
#[test]
fn on_the_tensor_cores_the_core_matches_the_f64_reference() {
    let (mut differ, mut differ_dq, mut worst) = (0, 0, 0.0f64);
    let cases = tc_cases();
    for (k, case) in cases.iter().enumerate() {
        let data = inputs(&case.dims, 100 + k as u64);
        let mut dev = SimDevice::new();
        let got = run_core_products(&mut dev, case, &data, FlashProducts::Tf32x3).unwrap();
        let fma = run_core(&mut dev, case, &data).unwrap();
        let want = reference(case, &data);
        for (name, (g, w)) in ["O", "lse", "dQ", "dK", "dV"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            let e = max_err(g, w);
            worst = worst.max(e);
            assert!(e <= 1e-5, "{}: {name} off by {e:e}", case.name);
        }
        differ += usize::from(bits_of(&got[0]) != bits_of(&fma[0]));
        differ_dq += usize::from(bits_of(&got[2]) != bits_of(&fma[2]));
        let u = dev.memory_usage();
        assert_eq!(u.live_bytes, 0, "{}: leaked {u}", case.name);
    }
    assert!(
        differ * 2 > cases.len(),
        "the tensor cores gave the FMA core's O on {} of {} cases",
        cases.len() - differ,
        cases.len()
    );
    assert!(
        differ_dq * 2 > cases.len(),
        "the tensor cores gave the FMA core's dQ on {} of {} cases",
        cases.len() - differ_dq,
        cases.len()
    );
    println!(
        "tensor cores: worst error {worst:e} over {} cases",
        cases.len()
    );
}

/// The f64 reference above is the spec's (`tl_spec::ops::attention::sdpa`: the op's value and
/// VJP, the cotangent dO) on the grouped cases, whose key heads serve several query heads, and
/// on cases of one key head per query head (every mask form, nq ≠ nk, masks per batch element).
#[test]
fn the_reference_is_the_specs_scaled_dot_product_attention() {
    use tl_spec::ops::attention::sdpa::{
        scaled_dot_product_attention, scaled_dot_product_attention_vjp,
    };
    let some_shared = shared_cases().into_iter().step_by(5);
    let some_batched = batched_cases().into_iter().step_by(3);
    let cases: Vec<Case> = grouped_cases()
        .into_iter()
        .chain(some_shared)
        .chain(some_batched)
        .collect();
    for (k, case) in cases.iter().enumerate() {
        let FlashDims {
            batch,
            nq,
            nk,
            heads,
            kv_heads,
            d,
        } = case.dims;
        let data = inputs(&case.dims, 500 + k as u64);
        let t = |i: usize, n: usize, hs: usize| {
            let x = data[i].iter().map(|&x| f64::from(x)).collect();
            Tensor::new(Shape::new(&[batch, n, hs * d]), x).unwrap()
        };
        let (q, kk, v, go) = (
            t(0, nq, heads),
            t(1, nk, kv_heads),
            t(2, nk, kv_heads),
            t(3, nq, heads),
        );
        let mask = case.mask.as_ref();
        let o = scaled_dot_product_attention([&q, &kk, &v], heads, mask).unwrap();
        let [dq, dk, dv] =
            scaled_dot_product_attention_vjp([&q, &kk, &v], heads, mask, &go).unwrap();
        let want = reference(case, &data);
        for (name, spec, ours) in [
            ("O", &o, &want[0]),
            ("dQ", &dq, &want[2]),
            ("dK", &dk, &want[3]),
            ("dV", &dv, &want[4]),
        ] {
            let err = spec
                .data()
                .iter()
                .zip(ours)
                .fold(0.0f64, |e, (a, b)| e.max((a - b).abs()));
            assert!(err <= 1e-12, "{}: {name} off by {err:e}", case.name);
        }
    }
}

/// Every row that sees no key (a general mask's rows 0 and 7; the rows before a negative
/// causal diagonal, of queries outnumbering the keys; under a mask per batch element, the
/// rows of one element only, or every row of a sequence of no keys) gives O = +0, lse = −∞ and
/// dQ = +0.
#[test]
fn fully_masked_rows_give_zeros_and_pass_no_gradient() {
    let mut checked = Vec::new();
    for (k, case) in cases().iter().enumerate() {
        let Some(mask) = &case.mask else { continue };
        let FlashDims {
            batch,
            nq,
            heads,
            d,
            ..
        } = case.dims;
        // (b, i): row i of batch element b sees no key.
        let empty: Vec<(usize, usize)> = (0..batch)
            .flat_map(|b| (0..nq).map(move |i| (b, i)))
            .filter(|&(b, i)| !mask.row_in(b, i).contains(&true))
            .collect();
        if empty.is_empty() {
            continue;
        }
        let data = inputs(&case.dims, 7 + k as u64);
        let [o, lse, dq, ..] = run_core(&mut SimDevice::new(), case, &data).unwrap();
        for &(b, i) in &empty {
            for h in 0..heads {
                let at = (b * heads + h) * nq + i;
                assert_eq!(lse[at], f32::NEG_INFINITY, "{}: row {i}", case.name);
                for c in 0..d {
                    let at = ((b * nq + i) * heads + h) * d + c;
                    assert_eq!(
                        (o[at].to_bits(), dq[at].to_bits()),
                        (0, 0),
                        "{}: batch element {b} head {h} row {i}",
                        case.name
                    );
                }
            }
        }
        checked.push((case.name, empty.len()));
    }
    let names: Vec<&str> = checked.iter().map(|c| c.0).collect();
    for want in [
        "general n20 d3",
        "lower right nq33 nk5 d7",
        "diagonal -40 nq130 nk37 d8",
        "diagonal -17 n50 d70",
        "padding per sequence B3 n40 d5",
        "general per sequence B2 n20 d3",
        "general per sequence B3 nq40 nk19 d80",
    ] {
        assert!(names.contains(&want), "{want} not checked: {checked:?}");
    }
    for want in [
        // 28 rows before the diagonal, in each of 2 batch elements.
        ("lower right nq33 nk5 d7", 56),
        // Element 2 has no keys: its 40 rows.
        ("padding per sequence B3 n40 d5", 40),
        // Row 5 of element 1 only.
        ("general per sequence B2 n20 d3", 1),
    ] {
        assert!(checked.contains(&want), "{want:?}: {checked:?}");
    }
}

#[test]
fn bad_input_is_refused_before_launch() {
    let mut dev = SimDevice::new();
    let f = |d: usize, n: usize| Flash::new(dims(1, n, 1, d), FlashMask::none());
    let q = dev.upload(&vec![0.5; 2 * 129]).unwrap();
    let k = dev.upload(&[0.5; 3 * 2]).unwrap();
    let q65 = dev.upload(&[0.5; 130]).unwrap();
    let live = dev.memory_usage().live_bytes;
    let launches = dev.traffic().launches;
    // The error of the forward on Q and K = V under these sizes and mask.
    let refused = |dev: &mut SimDevice, dims, mask| {
        dev.flash_attention([q, k, k], &Flash::new(dims, mask))
            .unwrap_err()
            .to_string()
    };
    // A head of 129: not supported (the composed path takes it).
    let e = dev
        .flash_attention([q, q, q], &f(129, 2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flash_attention") && e.contains("d = 129") && e.contains("1..=128"),
        "{e}"
    );
    // Q of the wrong length.
    let e = dev
        .flash_attention([q, q, q], &f(128, 2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q has 258 element(s), expected 256"), "{e}");
    // K and V of nk = 3 keys where the sizes say 2.
    let g = Flash::new(rect(1, 129, 2, 1, 2), FlashMask::none());
    let e = dev.flash_attention([q, k, k], &g).unwrap_err().to_string();
    assert!(e.contains("K has 6 element(s), expected 4"), "{e}");
    // No keys.
    let e = refused(&mut dev, rect(1, 129, 0, 1, 2), FlashMask::none());
    assert!(e.contains("empty attention") && e.contains("nk: 0"), "{e}");
    // A mask made for other sizes.
    let causal = FlashMask::of("test", Some(&Mask::causal(3).unwrap()), 3, 3, 1).unwrap();
    let e = refused(&mut dev, rect(1, 129, 3, 1, 2), causal);
    assert!(
        e.contains("made for (3, 3)") && e.contains("nq = 129, nk = 3"),
        "{e}"
    );
    // (`FlashMask::of`'s own errors for a mask of other sizes or batch: the unit tests of
    // `device::flash`.)
    // Words made for batch 2 (key padding: 2·nk words) handed to the kernels for batch 3.
    let two = FlashMask::of("test", Some(&padded(129, 3, &[3, 1], None)), 129, 3, 2).unwrap();
    assert_eq!((two.batch, two.words.len(), two.stride()), (2, 6, 3));
    let e = refused(&mut dev, rect(3, 129, 3, 1, 2), two.clone());
    assert!(
        e.contains("flash_attention") && e.contains("2 batch element(s)") && e.contains("B = 3"),
        "{e}"
    );
    // ... or with a word missing.
    let mut short = two;
    short.words.pop();
    let e = refused(&mut dev, rect(2, 129, 3, 1, 2), short);
    assert!(
        e.contains("with 5 word(s)") && e.contains("expected 3 word(s)"),
        "{e}"
    );
    // Keep flags and bits at once, the words sized for the bits: the kernels would read a
    // keep flag per key past them.
    let both = FlashMask {
        mode: FLASH_KEEP | FLASH_BITS,
        words: vec![!0; 129],
        offset: 0,
        rows: 129,
        cols: 3,
        batch: 1,
    };
    let e = refused(&mut dev, rect(1, 129, 3, 1, 2), both);
    assert!(
        e.contains("flash_attention") && e.contains("FLASH_KEEP") && e.contains("FLASH_BITS"),
        "{e}"
    );
    // A causal offset past the kernels' int.
    let far = Flash::new(
        rect(1, 129, 3, 1, 2),
        FlashMask::causal_diagonal(129, 3, -(1 << 40)),
    );
    let e = dev
        .flash_attention([q, k, k], &far)
        .unwrap_err()
        .to_string();
    assert!(e.contains("flash_attention") && e.contains("offset"), "{e}");
    // The backward's lse of the wrong length (one per query row).
    let e = dev
        .flash_attention_bwd([q, k, k], q, q, q, &g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 6 element(s), expected 4"), "{e}");
    let g = f(2, 129);
    let e = dev
        .flash_attention_bwd([q, q, q], q, q, q, &g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lse has 258 element(s), expected 129"), "{e}");
    // The rounded forward of an f32 core (it has no rounded output), and of bad operands
    // under autocast: errors before anything is rounded.
    let e = dev
        .flash_attention_rounded([q, q, q], &g)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flash_attention_rounded") && e.contains("F32"),
        "{e}"
    );
    let bf16 = f(2, 129).with_round(Precision::Bf16);
    let e = dev
        .flash_attention_rounded([q, k, q], &bf16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 6 element(s), expected 258"), "{e}");
    let e = dev
        .flash_attention_bwd([q, q, q], q, k, q, &bf16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lse has 6 element(s), expected 129"), "{e}");
    // The tensor-core core of a head past 64 (Q of 129 rows of d = 2 is 258 floats: the
    // head of 65 over 2 rows is 130), in f32 and under autocast.
    for round in [Precision::F32, Precision::Bf16] {
        let tc = f(65, 2)
            .with_round(round)
            .with_products(FlashProducts::Tf32x3);
        let e = dev
            .flash_attention([q65, q65, q65], &tc)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flash_attention") && e.contains("d = 65") && e.contains("Tf32x3"),
            "{e}"
        );
    }
    assert_eq!(dev.memory_usage().live_bytes, live, "nothing allocated");
    assert_eq!(dev.traffic().launches, launches, "nothing launched");
}
