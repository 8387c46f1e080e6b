//! The device primitives on the simulation device, checked directly: the u32 ABI limit,
//! argument checks that name the primitive, and primitives the tape ops do not reach (RNG,
//! general permutations up to rank 8, matmul transpose flags, broadcast reduction order).

use tl_tape_cuda::{Batch, Device, Error, Gemm, GemmTiles, SimDevice, rng};

#[test]
fn counts_of_two_to_the_32_are_refused_before_any_allocation() {
    let mut dev = SimDevice::new();
    for r in [
        dev.zeros(1 << 32),
        dev.full(1 << 32, 1.0),
        dev.rand_uniform(1 << 32, 0),
    ] {
        assert!(
            matches!(
                r,
                Err(Error::U32Overflow {
                    value: 4_294_967_296,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    let one = dev.full(1, 1.0).unwrap();
    let e = dev.broadcast(one, &[], &[1 << 16, 1 << 16]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::U32Overflow {
                op: "broadcast",
                ..
            }
        ),
        "{e}"
    );
    let x = dev.zeros(4).unwrap();
    let e = dev.matmul(x, x, Gemm::nn(1 << 32, 0, 1)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::U32Overflow {
                op: "matmul",
                what: "m",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("u32"));
    assert_eq!(
        dev.memory_usage().alloc_count,
        2,
        "only the two small buffers"
    );
}

#[test]
fn mismatched_operands_are_errors_naming_the_primitive_and_lengths() {
    let mut dev = SimDevice::new();
    let (a, b) = (dev.zeros(3).unwrap(), dev.zeros(4).unwrap());
    let e = dev.add(a, b).unwrap_err().to_string();
    assert!(
        e.contains("add") && e.contains('3') && e.contains('4'),
        "{e}"
    );
    assert!(dev.max_bwd(a, a, b).is_err());
    assert!(dev.axpy_assign(a, 1.0, b).is_err());
    let e = dev.permute(a, &[3], &[1]).unwrap_err().to_string();
    assert!(e.contains("permute") && e.contains("[1]"), "{e}");
    assert!(dev.softmax_rows(a, 2, 2).is_err());
    let e = dev.matmul(a, b, Gemm::nn(1, 3, 2)).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("right operand"), "{e}");
    let e = dev.reduce_axis_sum(a, 2, 2, 1).unwrap_err().to_string();
    assert!(e.contains("reduce_axis_sum"), "{e}");
    assert_eq!(dev.live_buffers(), 2);
}

#[test]
fn rand_and_bernoulli_follow_the_splitmix64_keying() {
    let mut dev = SimDevice::new();
    let key = rng::key(42, 7);
    let u = {
        let b = dev.rand_uniform(1000, key).unwrap();
        dev.download(b).unwrap()
    };
    for (i, &v) in u.iter().enumerate() {
        let want = rng::splitmix64(key.wrapping_add(i as u64)) as u32 as f64 / 4_294_967_296.0;
        assert!((0.0..1.0).contains(&v));
        assert_eq!(v, want as f32);
    }
    let mean = u.iter().map(|&v| f64::from(v)).sum::<f64>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "{mean}");
    let m = {
        let b = dev.bernoulli_mask(1000, key, 0.3).unwrap();
        dev.download(b).unwrap()
    };
    for (&k, &v) in m.iter().zip(&u) {
        assert_eq!(k, if f64::from(v) < 0.3 { 1.0 } else { 0.0 });
    }
    let again = {
        let b = dev.rand_uniform(1000, key).unwrap();
        dev.download(b).unwrap()
    };
    assert_eq!(u, again, "same key, same draw");
    let other = {
        let b = dev.rand_uniform(1000, rng::key(42, 8)).unwrap();
        dev.download(b).unwrap()
    };
    assert_ne!(u, other);
}

#[test]
fn permute_handles_rank_eight_and_refuses_rank_nine() {
    let mut dev = SimDevice::new();
    let dims = [2, 1, 3, 1, 2, 1, 2, 1];
    let n: usize = dims.iter().product();
    let x = dev
        .upload(&(0..n).map(|i| i as f32).collect::<Vec<_>>())
        .unwrap();
    let perm = [7, 6, 5, 4, 3, 2, 1, 0];
    let y = dev.permute(x, &dims, &perm).unwrap();
    // Reversing all axes of a row-major tensor reads it in column-major order.
    let got = dev.download(y).unwrap();
    let mut strides = [1usize; 8];
    for k in (0..7).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    assert_eq!(strides, [12, 12, 4, 4, 2, 2, 1, 1]);
    let rev: Vec<usize> = dims.iter().rev().copied().collect();
    for (flat, &v) in got.iter().enumerate() {
        let mut rem = flat;
        let mut src = 0;
        for k in (0..8).rev() {
            let i = rem % rev[k];
            rem /= rev[k];
            src += i * strides[7 - k];
        }
        assert_eq!(v, src as f32);
    }
    let nine: Vec<usize> = vec![1; 9];
    let p9: Vec<usize> = (0..9).collect();
    let one = dev.zeros(1).unwrap();
    assert!(matches!(
        dev.permute(one, &nine, &p9),
        Err(Error::Kernel { op: "permute", .. })
    ));
}

#[test]
fn matmul_transpose_flags_and_bmm_agree_with_explicit_transposes() {
    let mut dev = SimDevice::new();
    let a: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect(); // (2, 3)
    let b: Vec<f32> = (0..12).map(|i| 0.5 * i as f32).collect(); // (3, 4)
    let (ab, bb) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let c = {
        let b = dev.matmul(ab, bb, Gemm::nn(2, 3, 4)).unwrap();
        dev.download(b).unwrap()
    };
    let at = dev.transpose2d(ab, 2, 3).unwrap();
    let bt = dev.transpose2d(bb, 3, 4).unwrap();
    let c_tt = dev
        .matmul(at, bt, Gemm::nn(2, 3, 4).with_t(true, true))
        .unwrap();
    assert_eq!(dev.download(c_tt).unwrap(), c);
    let a2: Vec<f32> = a.iter().chain(&a).map(|v| v * 2.0).collect();
    let b2: Vec<f32> = b.iter().chain(&b).copied().collect();
    let (a2b, b2b) = (dev.upload(&a2).unwrap(), dev.upload(&b2).unwrap());
    let batched = {
        let b = dev.bmm(a2b, b2b, 2, Gemm::nn(2, 3, 4)).unwrap();
        dev.download(b).unwrap()
    };
    let twice: Vec<f32> = c.iter().chain(&c).map(|v| v * 2.0).collect();
    assert_eq!(batched, twice);
}

/// `bmm_heads` on head-merged operands gives, bit for bit, `bmm` on the operands permuted from
/// (groups, rows, heads, cols) to (groups, heads, rows, cols), with the result permuted back
/// where it is merged: every layout of the three operands, every transpose, and a product split
/// along k. One launch (two when split), no permutes.
#[test]
fn bmm_heads_reads_and_writes_the_merged_layout_as_permutes_would() {
    let mut dev = SimDevice::new();
    let (groups, heads) = (2, 3);
    let count = groups * heads;
    let swap = [0, 2, 1, 3];
    for (m, k, n) in [(5, 7, 4), (2, 600, 3)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let g = Gemm::nn(m, k, n).with_t(ta, tb);
            let split = g.k_splits(count) > 1;
            assert_eq!(split, k == 600, "{g:?}");
            let data = |which: usize, seed: f32| -> Vec<f32> {
                let (r, c) = g.stored(which);
                (0..count * r * c)
                    .map(|i| (i as f32 * seed).sin() + 0.1 * which as f32)
                    .collect()
            };
            let (av, bv) = (data(0, 0.37), data(1, 0.23));
            for bits in 0..8u32 {
                let merged = [bits & 1 != 0, bits & 2 != 0, bits & 4 != 0];
                let bt = Batch::heads(groups, heads, merged);
                assert_eq!(bt.merged_bits(), bits);
                let (ab, bb) = (dev.upload(&av).unwrap(), dev.upload(&bv).unwrap());
                // The reference: permute the merged operands to product-major, bmm, permute back.
                let plain = |dev: &mut SimDevice, x, which: usize| {
                    let (r, c) = g.stored(which);
                    if merged[which] {
                        dev.permute(x, &[groups, r, heads, c], &swap).unwrap()
                    } else {
                        x
                    }
                };
                let (pa, pb) = (plain(&mut dev, ab, 0), plain(&mut dev, bb, 1));
                let mut want = dev.bmm(pa, pb, count, g).unwrap();
                if merged[2] {
                    want = dev.permute(want, &[groups, heads, m, n], &swap).unwrap();
                }
                let want = dev.download(want).unwrap();
                let before = dev.traffic().launches;
                let got = dev.bmm_heads(ab, bb, bt, g).unwrap();
                let launches = dev.traffic().launches - before;
                assert_eq!(launches, if split { 2 } else { 1 }, "{g:?} {merged:?}");
                let got = dev.download(got).unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{g:?} merged {merged:?}: {got:?} vs {want:?}");
            }
        }
    }
    // Bad layouts and lengths are errors naming the primitive.
    let x = dev.zeros(6 * 4).unwrap();
    for (bt, what) in [
        (Batch::heads(2, 0, [true; 3]), "heads"),
        (
            Batch {
                count: 5,
                ..Batch::heads(1, 2, [true; 3])
            },
            "heads",
        ),
        (Batch::heads(2, 3, [true; 3]), "element"),
    ] {
        let e = dev.bmm_heads(x, x, bt, Gemm::nn(2, 3, 2)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("bmm_heads") && msg.contains(what), "{msg}");
    }
}

/// A grouped operand ([`Batch::grouped`]: `kv_heads` heads a row, product z reading head
/// `(z % heads) / (heads / kv_heads)`; grouped-query attention's K and V) gives, bit for bit,
/// `bmm_heads` on the operand with each of its heads repeated `heads / kv_heads` times
/// (PyTorch's `repeat_interleave`): `a` or `b` grouped, two transposes, 6 heads over 1, 2, 3
/// and 6 stored heads, a product split along k. A grouped operand that is not head-merged, a
/// kv_heads that does not divide heads, or an operand of the repeated length, is an error
/// naming the primitive.
#[test]
fn bmm_heads_reads_a_grouped_operand_as_its_heads_repeated() {
    let mut dev = SimDevice::new();
    let (groups, heads) = (2, 6);
    let merged = Batch::heads(groups, heads, [true; 3]);
    for (m, k, n) in [(5, 7, 4), (2, 600, 3)] {
        for (ta, tb) in [(false, false), (true, true)] {
            let g = Gemm::nn(m, k, n).with_t(ta, tb);
            for kv_heads in [1, 2, 3, 6] {
                for which in [0, 1] {
                    let (r, c) = g.stored(which);
                    let (ro, co) = g.stored(1 - which);
                    // (groups, r, kv_heads, c), and the same with each head repeated.
                    let x: Vec<f32> = (0..groups * r * kv_heads * c)
                        .map(|i| (i as f32 * 0.37).sin())
                        .collect();
                    let repeated: Vec<f32> = (0..groups * r * heads * c)
                        .map(|e| {
                            let (row, h, col) = (e / (heads * c), e / c % heads, e % c);
                            x[(row * kv_heads + h / (heads / kv_heads)) * c + col]
                        })
                        .collect();
                    let other: Vec<f32> = (0..groups * heads * ro * co)
                        .map(|i| (i as f32 * 0.23).cos())
                        .collect();
                    let (xb, rb, ob) = (
                        dev.upload(&x).unwrap(),
                        dev.upload(&repeated).unwrap(),
                        dev.upload(&other).unwrap(),
                    );
                    let bt = merged.grouped(kv_heads, [which == 0, which == 1]);
                    assert_eq!(bt.merged_bits(), 0b111 | 8 << which);
                    let pair = |x| if which == 0 { (x, ob) } else { (ob, x) };
                    let (a, b) = pair(xb);
                    let got = dev.bmm_heads(a, b, bt, g).unwrap();
                    let (a, b) = pair(rb);
                    let want = dev.bmm_heads(a, b, merged, g).unwrap();
                    let (got, want) = (dev.download(got).unwrap(), dev.download(want).unwrap());
                    assert_eq!(
                        crate::common::bits(&got),
                        crate::common::bits(&want),
                        "{g:?} kv_heads {kv_heads} operand {which}"
                    );
                    // The repeated operand's length is not the grouped one's.
                    if kv_heads < heads {
                        let (a, b) = pair(rb);
                        let e = dev.bmm_heads(a, b, bt, g).unwrap_err().to_string();
                        assert!(e.contains("bmm_heads") && e.contains("element"), "{e}");
                    }
                }
            }
        }
    }
    let x = dev.zeros(2 * 6 * 4).unwrap();
    let g = Gemm::nn(2, 2, 2);
    for (bt, what) in [
        (merged.grouped(4, [false, true]), "divide heads = 6"),
        (merged.grouped(0, [true, false]), "kv_heads = 0"),
        (
            Batch::heads(groups, heads, [true, false, true]).grouped(3, [false, true]),
            "head-merged",
        ),
    ] {
        let e = dev.bmm_heads(x, x, bt, g).unwrap_err().to_string();
        assert!(e.contains("bmm_heads") && e.contains(what), "{e}");
    }
}

#[test]
fn reduce_broadcast_sums_each_preimage_in_row_major_order() {
    let mut dev = SimDevice::new();
    // g of shape (3, 2) reduced to (1, 2) and to (): order 0, 2, 4 then 1, 3, 5.
    let g = [1e8f32, 1.0, 1.0, 2.0, -1e8, 3.0];
    let gb = dev.upload(&g).unwrap();
    let cols = {
        let b = dev.reduce_broadcast(gb, &[1, 2], &[3, 2]).unwrap();
        dev.download(b).unwrap()
    };
    assert_eq!(cols, vec![((0.0 + 1e8f32) + 1.0) + -1e8, 6.0]);
    assert_eq!(
        cols[0], 0.0,
        "1e8 + 1 rounds back to 1e8 in f32: left-to-right order"
    );
    let all = {
        let b = dev.reduce_broadcast(gb, &[], &[3, 2]).unwrap();
        dev.download(b).unwrap()
    };
    let seq = g.iter().fold(0.0f32, |a, &v| a + v);
    assert_eq!(all, vec![seq]);
}

#[test]
fn axpy_out_of_place_and_in_place_including_aliasing() {
    let mut dev = SimDevice::new();
    let a = dev.upload(&[1.0, 2.0, 3.0]).unwrap();
    let b = dev.upload(&[0.5, -1.0, 4.0]).unwrap();
    let c = dev.axpy(a, b, 2.0).unwrap();
    assert_eq!(dev.download(c).unwrap(), vec![2.0, 0.0, 11.0]);
    assert_eq!(
        dev.download(a).unwrap(),
        vec![1.0, 2.0, 3.0],
        "operands untouched"
    );
    dev.axpy_assign(a, -1.0, b).unwrap();
    assert_eq!(dev.download(a).unwrap(), vec![0.5, 3.0, -1.0]);
    // y and x the same buffer: y ← y + 3y.
    dev.axpy_assign(b, 3.0, b).unwrap();
    assert_eq!(dev.download(b).unwrap(), vec![2.0, -4.0, 16.0]);
    assert_eq!(dev.live_buffers(), 3, "in place: no new buffer");
}

/// One launch per eight parameters for an optimizer step: the bits of one `axpy_assign` per
/// pair (the kernel emulator runs the same check in `gpu.rs`).
#[test]
fn axpy_assign_list_gives_the_bits_of_one_launch_per_pair() {
    let mut dev = SimDevice::new();
    let bad = crate::common::axpy_list_mismatches(&mut dev);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(dev.live_buffers(), 0, "every buffer released");
}

/// An Adam(W) or momentum SGD step in one launch: the bits of the chain of primitives the
/// session's device path composed before (the kernel emulator runs the same check in
/// `gpu.rs`).
#[test]
fn fused_optimizer_steps_give_the_bits_of_their_primitives() {
    let mut dev = SimDevice::new();
    let bad = crate::common::optim::optimizer_update_mismatches(&mut dev);
    assert!(bad.is_empty(), "fused != composed: {bad:?}");
    assert_eq!(dev.live_buffers(), 0, "every buffer released");
}

/// The list forms of the fused optimizer steps: the bits of one launch per parameter, in one
/// launch per eight parameters whose coefficients agree but for the bias corrections; shared
/// buffers fall back to one launch a parameter; bad slots refused by name (the kernel
/// emulator runs the same check in `gpu.rs`).
#[test]
fn fused_optimizer_lists_give_the_bits_of_one_launch_per_parameter() {
    let mut dev = SimDevice::new();
    let bad = crate::common::optim::optimizer_list_mismatches(&mut dev);
    assert!(bad.is_empty(), "list != one launch per parameter: {bad:?}");
    assert_eq!(dev.live_buffers(), 0, "every buffer released");
}

/// The fused optimizer steps refuse operands of other lengths and buffers passed twice, by
/// name, before writing anything.
#[test]
fn fused_optimizer_steps_refuse_mismatched_or_shared_buffers() {
    use crate::common::optim::{adam_cases, momentum_cases};
    let mut dev = SimDevice::new();
    let [w, m, v, g] = [1.0f32, 2.0, 3.0, 4.0].map(|x| dev.upload(&[x; 3]).unwrap());
    let short = dev.zeros(2).unwrap();
    let (a, s) = (adam_cases()[0], momentum_cases()[0]);
    let errors = [
        dev.adam_update(w, m, v, short, &a).unwrap_err(),
        dev.adam_update(w, m, m, g, &a).unwrap_err(),
        dev.adam_update(w, m, v, w, &a).unwrap_err(),
        dev.momentum_update(w, short, g, &s).unwrap_err(),
        dev.momentum_update(w, w, g, &s).unwrap_err(),
    ];
    let wanted = [
        ("adam_update", "3 and 2 elements"),
        ("adam_update", "m and v are the same buffer"),
        ("adam_update", "w and g are the same buffer"),
        ("momentum_update", "3 and 2 elements"),
        ("momentum_update", "w and b are the same buffer"),
    ];
    for (e, (op, what)) in errors.iter().zip(wanted) {
        let msg = e.to_string();
        assert!(msg.contains(op) && msg.contains(what), "{msg}");
    }
    for (b, x) in [(w, 1.0), (m, 2.0), (v, 3.0), (g, 4.0)] {
        assert_eq!(dev.download(b).unwrap(), vec![x; 3], "nothing written");
    }
}

/// A product added into an accumulator in its epilogue: the bits of `add(c, matmul(a, b))`
/// (the kernel emulator runs the same check in `gpu.rs`).
#[test]
fn matmul_acc_gives_the_bits_of_a_product_then_an_add() {
    let mut dev = SimDevice::new();
    let bad = crate::common::matmul_acc_mismatches(&mut dev);
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(dev.live_buffers(), 0, "every buffer released");
}

/// The fused launches (bias epilogue, scaled softmax rows) give the bits of the chains of
/// launches they replace (the kernel emulator runs the same check in `gpu.rs`).
#[test]
fn fused_chains_give_the_bits_of_their_separate_launches() {
    let mut dev = SimDevice::new();
    let bad = crate::common::fused_chain_mismatches(&mut dev);
    assert!(bad.is_empty(), "fused != unfused: {bad:?}");
    assert_eq!(dev.live_buffers(), 0, "every buffer released");
}

/// The bias epilogues check their operands against the layout before launching and name
/// themselves: a bias or residual of the wrong length, an input that is not (outer, ch, inner).
#[test]
fn bias_epilogues_refuse_mismatched_operands_by_name() {
    use tl_tape_cuda::device::{Act, BiasLayout};
    let mut dev = SimDevice::new();
    let x = dev.zeros(12).unwrap();
    let b = dev.zeros(3).unwrap();
    let (short, long) = (dev.zeros(11).unwrap(), dev.zeros(4).unwrap());
    let layout = BiasLayout::new(2, 3, 2);
    let live = dev.live_buffers();
    let errors = [
        dev.add_bias_residual(x, b, layout, short, true)
            .unwrap_err(),
        dev.add_bias_residual(x, long, layout, x, false)
            .unwrap_err(),
        dev.add_bias_residual(short, b, layout, x, false)
            .unwrap_err(),
        dev.add_bias_act(x, long, layout, Act::Relu).unwrap_err(),
        dev.add_bias(short, b, layout).unwrap_err(),
    ];
    let names = [
        ("add_bias_residual", "residual"),
        ("add_bias_residual", "bias"),
        ("add_bias_residual", "input"),
        ("add_bias_act", "bias"),
        ("add_bias", "input"),
    ];
    for (e, (op, what)) in errors.iter().zip(names) {
        let msg = e.to_string();
        assert!(msg.contains(op) && msg.contains(what), "{msg}");
    }
    assert_eq!(dev.live_buffers(), live, "nothing allocated");
}

/// `GemmTiles::Auto` takes the wide tiles once a launch has `WIDE_MIN_TILES` of them (the
/// jobs of a batch or of a split product counted), the forced choices whatever the shape.
#[test]
fn the_automatic_gemm_tiling_goes_wide_for_large_launches_only() {
    use tl_tape_cuda::device::WIDE_MIN_TILES;
    assert_eq!(WIDE_MIN_TILES, 256, "the doc's measurements are for 256");
    let auto = GemmTiles::Auto;
    assert_eq!(auto.side(2048, 2048, 1), 128, "16 x 16 wide tiles");
    assert_eq!(auto.side(2047, 2048, 1), 128, "partial tiles count");
    assert_eq!(auto.side(1920, 2048, 1), 64, "15 x 16 = 240");
    assert_eq!(auto.side(1024, 1024, 1), 64);
    assert_eq!(auto.side(512, 512, 16), 128, "16 products of 4 x 4");
    assert_eq!(auto.side(64, 784, 1), 64, "the mlp's first layer");
    assert_eq!(auto.side(0, 4096, 1), 64, "nothing to tile");
    assert_eq!(
        auto.side(usize::MAX, usize::MAX, usize::MAX),
        128,
        "no overflow"
    );
    assert_eq!(GemmTiles::Narrow.side(4096, 4096, 1), 64);
    assert_eq!(GemmTiles::Wide.side(1, 1, 1), 128);
    assert_eq!(GemmTiles::default(), auto);
}

/// A product with few output tiles over a long `k` is two launches (the runs of `k`, then their
/// sums added in order) with the documented order's bits, and so is `matmul_acc`'s; a long
/// axis into few outputs is one launch in the block order. Counted here because the sim's
/// launch counts stand in for the GPU's (docs/performance.md).
#[test]
fn few_tile_products_split_k_in_two_launches_and_long_axis_sums_take_a_block() {
    let mut dev = SimDevice::new();
    let (m, k, n) = (4, 2048, 3);
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.013).sin()).collect();
    let b: Vec<f32> = (0..k * n).map(|i| 1.0 + (i as f32 * 0.007).cos()).collect();
    let (ab, bb) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let g = Gemm::nn(m, k, n);
    let chunk = g.k_chunk(1);
    assert!(chunk < k, "the case must split");
    let launches = |dev: &SimDevice| dev.traffic().launches;
    let before = launches(&dev);
    let c = dev.matmul(ab, bb, g).unwrap();
    assert_eq!(launches(&dev) - before, 2, "a split product is two kernels");
    let got = dev.download(c).unwrap();
    for i in 0..m {
        for j in 0..n {
            let run = |p0: usize| {
                (p0..(p0 + chunk).min(k)).fold(0.0f32, |s, p| a[i * k + p].mul_add(b[p * n + j], s))
            };
            let want = (0..k).step_by(chunk).fold(0.0f32, |s, p0| s + run(p0));
            assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "({i}, {j})");
        }
    }
    // matmul_acc: c + the split sum, one rounding, two kernels.
    let c0: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.5).collect();
    let cb = dev.upload(&c0).unwrap();
    let before = launches(&dev);
    dev.matmul_acc(cb, ab, bb, g).unwrap();
    assert_eq!(launches(&dev) - before, 2);
    let acc = dev.download(cb).unwrap();
    for (e, (o, (c, v))) in acc.iter().zip(c0.iter().zip(&got)).enumerate() {
        assert_eq!(o.to_bits(), (c + v).to_bits(), "element {e}");
    }
    // A short k is not split: one kernel (many tiles: the unit test in sim/linalg.rs).
    let short = Gemm::nn(m, 200, n);
    let (sa, sb) = (
        dev.upload(&a[..m * 200]).unwrap(),
        dev.upload(&b[..200 * n]).unwrap(),
    );
    let before = launches(&dev);
    dev.matmul(sa, sb, short).unwrap();
    assert_eq!(
        launches(&dev) - before,
        1,
        "an unsplit product is one kernel"
    );
    // Axis sums: (3, 1000, 1) takes the block order; (3, 40, 1) the sequential one.
    let x: Vec<f32> = (0..3000).map(|i| (i as f32 * 0.31).sin() * 1e3).collect();
    let xb = dev.upload(&x).unwrap();
    let before = launches(&dev);
    let s = dev.reduce_axis_sum(xb, 3, 1000, 1).unwrap();
    assert_eq!(launches(&dev) - before, 1);
    let s = dev.download(s).unwrap();
    for o in 0..3 {
        let row = &x[o * 1000..(o + 1) * 1000];
        let mut lanes = [0.0f32; 256];
        for (kk, v) in row.iter().enumerate() {
            lanes[kk % 256] += v;
        }
        let tree = tl_tape_cuda::device::sim::reduce::block_tree(&lanes, 0.0, |p, q| p + q);
        assert_eq!(s[o].to_bits(), tree.to_bits(), "block order, row {o}");
        let seq = row.iter().fold(0.0f32, |p, q| p + q);
        assert_ne!(
            tree.to_bits(),
            seq.to_bits(),
            "the orders must differ here ({o})"
        );
    }
    let xs = dev.upload(&x[..120]).unwrap();
    let s = dev.reduce_axis_sum(xs, 3, 40, 1).unwrap();
    let s = dev.download(s).unwrap();
    let seq = x[..40].iter().fold(0.0f32, |p, q| p + q);
    assert_eq!(
        s[0].to_bits(),
        seq.to_bits(),
        "a short axis stays sequential"
    );
}
