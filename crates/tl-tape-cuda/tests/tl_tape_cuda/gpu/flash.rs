//! The fused attention kernels (`tl_flash_*`, FMA and tensor-core products, both tilings, the
//! one-pass backward) on the CUDA device against their sim twins, on the shared cases of
//! `crate::flash`: on the kernel emulator the sim's bits (both schedules in CI), on a GPU
//! within 1e-5.

use super::*;

/// `[O, lse, dQ, dK, dV]` of `case` on `cuda` against its sim twin, the core's products at
/// `round` (autocast: `flash_attention_rounded` and its backward): each result's largest
/// error relative to `max(1, ‖sim‖∞)` (NaN: infinite) and whether its bits are the sim's.
fn flash_vs_sim(
    cuda: &mut CudaDevice,
    case: &crate::flash::Case,
    seed: u64,
    round: Precision,
) -> [(&'static str, f64, bool); 5] {
    use crate::flash::run_core_at;
    let data = crate::flash::inputs(&case.dims, seed);
    let want = run_core_at(&mut SimDevice::new(), case, &data, round).unwrap();
    let got = run_core_at(cuda, case, &data, round).unwrap();
    core_errors(&want, &got)
}

/// Per result of a core (`[O, lse, dQ, dK, dV]`): its name, the largest difference of `got`
/// from `want` relative to `want`'s scale (`max(1, ‖want‖∞)`; a NaN is infinite), and whether
/// the bits are the same.
fn core_errors(want: &[Vec<f32>; 5], got: &[Vec<f32>; 5]) -> [(&'static str, f64, bool); 5] {
    let names = ["O", "lse", "dQ", "dK", "dV"];
    std::array::from_fn(|k| {
        let (err, same) = max_rel(&want[k], &got[k]);
        (names[k], err, same)
    })
}

/// The largest error of `got` against `want` relative to `max(1, ‖want‖∞)` (NaN: infinite),
/// and whether the two are the same bits.
fn max_rel(want: &[f32], got: &[f32]) -> (f64, bool) {
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, &v| m.max(f64::from(v).abs()));
    let mut err = 0.0f64;
    let mut same = want.len() == got.len();
    for (&a, &b) in want.iter().zip(got) {
        same &= a.to_bits() == b.to_bits();
        let e = if a == b {
            0.0
        } else {
            (f64::from(a) - f64::from(b)).abs() / scale
        };
        err = err.max(if e.is_nan() { f64::INFINITY } else { e });
    }
    (err, same)
}

/// The fused attention core (kernels/attention.cu) against its sim twin on every case of
/// the `flash` module (lengths off the tile, head sizes 1 to 128, every mask form, fully
/// masked rows, keys of another length than the queries with causal diagonals of either
/// sign, masks of one matrix per batch element), forward and backward, with either tiling
/// (`FlashTiles`), the backward forced onto the two fixed-order kernels
/// (`gates::force_flash_bwd_one_pass(Some(false))`; the one-pass backward has its own test
/// below): bit for bit on the kernel emulator (its `expf`/`logf` are the host's, as the
/// sim's), within 1e-5 on a GPU (CUDA's differ by a few ulps). Those kernels use no atomics, so the reduction mode changes nothing.
/// Under autocast (every third case in bf16, the next in TF32, both tilings: the rounding
/// copies, the second forward pass `TL_FA_OUT`, p and dS rounded backward) bit for bit on the
/// emulator too; on a GPU within 2⁻⁶ (an f32 probability a few ulps off may round to the
/// neighbouring bf16 value: one term off by a unit of the rounding).
#[test]
fn the_fused_attention_kernels_match_their_sim_twin() {
    let Some(mut cuda) = gpu() else { return };
    let _two = gates::force_flash_bwd_one_pass(Some(false));
    let exact = cfg!(feature = "cuda-emu");
    let mut worst = 0.0f64;
    let mut bad = Vec::new();
    let cases = crate::flash::cases();
    let runs = [FlashTiles::Narrow, FlashTiles::Wide]
        .into_iter()
        .flat_map(|t| cases.iter().enumerate().map(move |(k, c)| (t, k, c)))
        .flat_map(|(t, k, c)| {
            let autocast = [Precision::Bf16, Precision::Tf32].get(k % 3).copied();
            [Some(Precision::F32), autocast]
                .into_iter()
                .flatten()
                .map(move |p| (t, k, c, p))
        });
    for (tiles, k, case, round) in runs {
        cuda.set_flash_tiles(tiles);
        let tol = if round.is_autocast() && !exact {
            1.0 / 64.0
        } else {
            1e-5
        };
        for (name, err, same) in flash_vs_sim(&mut cuda, case, 100 + k as u64, round) {
            worst = worst.max(err);
            if (exact && !same) || err > tol {
                bad.push(format!(
                    "{tiles:?} {round:?} {}: {name}: max rel error {err:e} (bit-exact \
                     expected: {exact})",
                    case.name
                ));
            }
        }
        if round.is_autocast() {
            // `flash_attention` alone: its first pass keeps the statistics alone
            // (`TL_FA_STATS`), then O as above.
            let data = crate::flash::inputs(&case.dims, 100 + k as u64);
            let how = (round, FlashProducts::Fma);
            let want = crate::flash::value_with(&mut SimDevice::new(), case, &data, how).unwrap();
            let got = crate::flash::value_with(&mut cuda, case, &data, how).unwrap();
            for (name, (w, g)) in ["O (value)", "lse (value)"]
                .iter()
                .zip(want.iter().zip(&got))
            {
                let same = w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits());
                let err = w.iter().zip(g).fold(0.0f64, |e, (a, b)| {
                    e.max(if a == b {
                        0.0
                    } else {
                        f64::from((a - b).abs())
                    })
                });
                if (exact && !same) || err.is_nan() || err > tol * 4.0 {
                    bad.push(format!(
                        "{tiles:?} {round:?} {}: {name}: error {err:e}",
                        case.name
                    ));
                }
            }
        }
    }
    println!(
        "GPU-SUMMARY attention {worst:.3e} {}",
        verdict(bad.is_empty())
    );
    let u = cuda.memory_usage();
    assert_eq!(u.live_bytes, 0, "leaked on the GPU: {u}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The tensor-core kernels (`FlashProducts::Tf32x3`: `tl_flash_fwd_tc`, `tl_flash_bwd_q_tc`,
/// `tl_flash_bwd_kv_tc`, 3xTF32 WMMA products) against their sim twins on every case of the
/// `flash` module with d ≤ 64 (several blocks of 128 rows or keys, steps of 64, every mask
/// form, fully masked rows, nq ≠ nk, grouped heads, masks per batch element), in f32 and under
/// autocast (bf16 and TF32 by turns: the rounded core's two passes, the backward's rounded p
/// and dS, and `flash_attention`'s statistics pass): O, lse, dQ, dK and dV bit for bit on the
/// kernel emulator (whose `mma_sync` sums in the order the sim follows), on a GPU within 1e-5
/// in f32 and 2⁻⁶ under autocast (the tensor cores sum in their own order; a probability or dS
/// near a rounding boundary may round to its neighbour). Also `TL_EMU_SCHEDULE=reverse` (CI).
#[test]
fn the_tensor_core_kernels_match_their_sim_twin() {
    let Some(mut cuda) = gpu() else { return };
    // The reduction mode changes nothing here: the tensor cores' backward is two fixed-order
    // kernels; the one-pass override would be ignored.
    let _one = gates::force_flash_bwd_one_pass(Some(true));
    let exact = cfg!(feature = "cuda-emu");
    let (mut worst, mut bad) = (0.0f64, Vec::new());
    for (k, case) in crate::flash::tc_cases().iter().enumerate() {
        let data = crate::flash::inputs(&case.dims, 300 + k as u64);
        let autocast = [Precision::Bf16, Precision::Tf32][k % 2];
        for round in [Precision::F32, autocast] {
            let how = (round, FlashProducts::Tf32x3);
            let tol = if round.is_autocast() {
                1.0 / 64.0
            } else {
                1e-5
            };
            let sim = &mut SimDevice::new();
            let want = crate::flash::run_core_with(sim, case, &data, how).unwrap();
            let got = crate::flash::run_core_with(&mut cuda, case, &data, how).unwrap();
            let mut errors = core_errors(&want, &got).to_vec();
            if round.is_autocast() {
                // `flash_attention` alone: the statistics pass, then O.
                let want = crate::flash::value_with(sim, case, &data, how).unwrap();
                let got = crate::flash::value_with(&mut cuda, case, &data, how).unwrap();
                for (name, (w, g)) in ["O (value)", "lse (value)"]
                    .into_iter()
                    .zip(want.iter().zip(&got))
                {
                    let (err, same) = max_rel(w, g);
                    errors.push((name, err, same));
                }
            }
            for (name, err, same) in errors {
                worst = worst.max(err);
                if (exact && !same) || err > tol || err.is_nan() {
                    bad.push(format!(
                        "{round:?} {}: {name}: max rel error {err:e}",
                        case.name
                    ));
                }
            }
        }
    }
    println!(
        "GPU-SUMMARY attention-tc {worst:.3e} {}",
        verdict(bad.is_empty())
    );
    let u = cuda.memory_usage();
    assert_eq!(u.live_bytes, 0, "leaked on the GPU: {u}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The one-pass backward (`tl_flash_bwd_delta`, `tl_flash_bwd_atomic`: dQ added over the
/// blocks of 64 keys with `atomicAdd`), forced with `gates::force_flash_bwd_one_pass`, against
/// the sim's fixed-order twin: on every case of the `flash` module and on longer ones (n up to
/// 257, several blocks of keys, B and H > 1, d in {8, 16, 64}, every mask form, fully masked
/// rows, keys of another length than the queries, masks per batch element). dQ within 1e-5
/// (its sum over the key blocks is in the order the atomics land); on the kernel emulator O,
/// lse, dK and dV bit for bit (the same code and order as the two kernels), and heads over 64
/// (the two kernels, the fallback) every result bit for bit. On a GPU everything within 1e-5.
/// Also `TL_EMU_SCHEDULE=reverse` (CI): a missing barrier or a dQ sum that depends on the
/// thread order shows there.
#[test]
fn the_one_pass_flash_backward_matches_the_sim_within_tolerance() {
    use crate::flash::{case, dense_batched, padded, rect};
    use tl_tape_cuda::device::FLASH_ONE_PASS_MAX_HEAD;
    let Some(mut cuda) = gpu() else { return };
    let _one = gates::force_flash_bwd_one_pass(Some(true));
    let exact = cfg!(feature = "cuda-emu");
    let dims = |batch, n, heads, d| rect(batch, n, n, heads, d);
    let pad = |n: usize| Mask::from_fn(n, |_, j| j % 7 != 3).unwrap();
    let both = |n: usize| Mask::from_fn(n, |i, j| j <= i && j % 3 != 1).unwrap();
    // Rows 0, 7 and 70 see nothing.
    let odd = |n: usize| {
        Mask::from_fn(n, |i, j| ![0, 7, 70].contains(&i) && (i * 5 + j) % 7 != 0).unwrap()
    };
    let lower = |nq, nk| Some(Mask::causal_lower_right(nq, nk).unwrap());
    let mut cases = crate::flash::cases();
    cases.extend([
        case(
            "causal n200 B2 H3 d8",
            dims(2, 200, 3, 8),
            Some(Mask::causal(200).unwrap()),
        ),
        case("padding n130 H2 d16", dims(1, 130, 2, 16), Some(pad(130))),
        case("general n97 B2 H2 d64", dims(2, 97, 2, 64), Some(odd(97))),
        case(
            "causal+padding n65 H2 d16",
            dims(1, 65, 2, 16),
            Some(both(65)),
        ),
        case("n257 d8", dims(1, 257, 1, 8), None),
        case(
            "causal n80 d66 (two kernels)",
            dims(1, 80, 1, 66),
            Some(Mask::causal(80).unwrap()),
        ),
        // Keys of another length, several blocks of 64 keys (and of query rows).
        case(
            "lower right nq150 nk257 B2 H2 d8",
            rect(2, 150, 257, 2, 8),
            lower(150, 257),
        ),
        case(
            "lower right nq257 nk70 d16",
            rect(1, 257, 70, 1, 16),
            lower(257, 70),
        ),
        case("nq1 nk300 H3 d64", rect(1, 1, 300, 3, 64), None),
        // A mask per batch element over several blocks of keys.
        case(
            "padding per sequence n130 B3 H2 d16",
            dims(3, 130, 2, 16),
            Some(padded(130, 130, &[130, 64, 65], None)),
        ),
        case(
            "general per sequence nq150 nk257 B2 d8",
            rect(2, 150, 257, 1, 8),
            Some(dense_batched(2, 150, 257)),
        ),
        case(
            "causal+padding per sequence n200 B2 d64",
            dims(2, 200, 1, 64),
            Some(padded(200, 200, &[200, 129], Some(0))),
        ),
    ]);
    let mut worst = 0.0f64;
    let mut bad = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let one_pass = case.dims.d <= FLASH_ONE_PASS_MAX_HEAD;
        // Every fourth case under bf16 autocast too (dQ, dK, dV from rounded p and dS).
        let autocast = (k % 4 == 0).then_some(Precision::Bf16);
        for round in [Some(Precision::F32), autocast].into_iter().flatten() {
            // On a GPU an f32 probability a few ulps off may round to its neighbour (a flip).
            let tol = if round.is_autocast() && !exact {
                1.0 / 64.0
            } else {
                1e-5
            };
            for (name, err, same) in flash_vs_sim(&mut cuda, case, 300 + k as u64, round) {
                worst = worst.max(err);
                let bits = exact && (name != "dQ" || !one_pass);
                if (bits && !same) || err > tol {
                    bad.push(format!(
                        "{round:?} {}: {name}: max rel error {err:e} (bit-exact expected: \
                         {bits})",
                        case.name
                    ));
                }
            }
        }
    }
    println!(
        "GPU-SUMMARY attention-one-pass {worst:.3e} {}",
        verdict(bad.is_empty())
    );
    let u = cuda.memory_usage();
    assert_eq!(u.live_bytes, 0, "leaked on the GPU: {u}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
