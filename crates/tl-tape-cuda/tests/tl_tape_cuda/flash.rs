//! The fused ("flash") attention core (`Device::flash_attention`, `flash_attention_bwd`;
//! kernels/attention.cu and its sim twin) against an f64 reference of softmax attention, as
//! many keys as queries or not (nq ≠ nk: cross-attention, a KV cache), and
//! `multiHeadAttention { fused: true }` on the CUDA tape: its value and gradients against the
//! composed path and the IR, the memory it keeps, its launches, its errors.
//!
//! The shared cases ([`cases`], [`run_core`]) also run on the kernel emulator and a GPU
//! (gpu.rs), where they must give the sim's bits (emulator) or its values within 1e-5 (GPU).

use crate::common::{Domain, Gen, check_graph, draw, random_leaves};
use tl_ir::{GraphBuilder, Op};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::device::{
    FLASH_MAX_HEAD, FLASH_TC_MAX_HEAD, Flash, FlashDims, FlashMask, FlashProducts,
};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Precision, Result, SimDevice};

/// One core: sizes and the (nq, nk) mask (`None`: every key), shared by every batch element
/// or one per batch element ([`Mask::batch`] = B).
pub struct Case {
    pub name: &'static str,
    pub dims: FlashDims,
    pub mask: Option<Mask>,
    /// A causal diagonal the kernels take directly (a [`FlashMask`] of mode causal with this
    /// offset, where the mask's own form would be bits: its form knows the diagonals 0 and
    /// nk − nq only); `mask` then holds exactly its entries ([`diagonal`]).
    pub offset: Option<i64>,
}

impl Case {
    /// The mask as the kernels take it.
    pub fn flash_mask(&self) -> Result<FlashMask> {
        let FlashDims { batch, nq, nk, .. } = self.dims;
        match self.offset {
            Some(offset) => Ok(FlashMask::causal_diagonal(nq, nk, offset)),
            None => FlashMask::of("test", self.mask.as_ref(), nq, nk, batch),
        }
    }
}

fn dims(batch: usize, n: usize, heads: usize, d: usize) -> FlashDims {
    rect(batch, n, n, heads, d)
}

/// Sizes of nq queries over nk keys.
pub fn rect(batch: usize, nq: usize, nk: usize, heads: usize, d: usize) -> FlashDims {
    grouped(batch, nq, nk, heads, heads, d)
}

/// Sizes of nq queries of `heads` heads over nk keys of `kv_heads` heads (grouped-query
/// attention: query head h reads key head h / (heads / kv_heads)).
pub fn grouped(
    batch: usize,
    nq: usize,
    nk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
) -> FlashDims {
    FlashDims {
        batch,
        nq,
        nk,
        heads,
        kv_heads,
        d,
    }
}

/// A case whose kernels take `mask`'s own form ([`FlashMask::of`]).
pub fn case(name: &'static str, dims: FlashDims, mask: Option<Mask>) -> Case {
    Case {
        name,
        dims,
        mask,
        offset: None,
    }
}

/// A case of a causal mask with diagonal `offset` (query i sees keys j ≤ i + offset) given to
/// the kernels as such.
pub fn diagonal(name: &'static str, dims: FlashDims, offset: i64) -> Case {
    let mask =
        Mask::from_fn_rectangular(dims.nq, dims.nk, |i, j| j as i64 <= i as i64 + offset).unwrap();
    Case {
        name,
        dims,
        mask: Some(mask),
        offset: Some(offset),
    }
}

/// Lengths that are and are not multiples of the tile (16), head sizes 1 to 128, and every
/// mask form: none, causal, key padding, both, and a general mask with fully masked rows; then
/// keys of another length than the queries (more and fewer, one query row against 37 keys)
/// with each form, the causal ones at the diagonals nk − nq (lower right; negative when the
/// queries outnumber the keys, so that the first rows see nothing), 0 (upper left) and others
/// given directly, on both kernel families (d ≤ 64 and d > 64); then masks of one matrix per
/// batch element ([`batched_cases`]); then keys of fewer heads than the queries
/// ([`grouped_cases`]).
pub fn cases() -> Vec<Case> {
    let mut cases = shared_cases();
    cases.extend(batched_cases());
    cases.extend(grouped_cases());
    cases
}

/// Grouped-query attention: K and V of fewer heads than Q (query head h reads key head
/// h / (heads / kv_heads)), a key head's dK and dV the sum of its group's: multi-query (one key
/// head for 3 or 4 query heads) and groups of 2 and 3 (4 over 2, 6 over 3, 6 over 2, 8 over
/// 2); lengths off the tile, several query tiles and key blocks per head, nq ≠ nk, causal
/// diagonals (upper left, lower right, −5), key padding, a dense mask with fully masked rows,
/// masks per batch element; both kernel families (d ≤ 64 and d > 64, up to 128).
pub fn grouped_cases() -> Vec<Case> {
    let causal = |n: usize| Mask::causal(n).unwrap();
    let lower_pad = |nq: usize, nk: usize| {
        let o = nk as i64 - nq as i64;
        Mask::from_fn_rectangular(nq, nk, |i, j| j as i64 <= i as i64 + o && j % 4 != 1).unwrap()
    };
    // Rows 0 and 7 see nothing.
    let rodd = |nq, nk| {
        Mask::from_fn_rectangular(nq, nk, |i, j| i != 0 && i != 7 && (i * 3 + j) % 5 != 0).unwrap()
    };
    let pad = |n: usize| Mask::from_fn(n, |_, j| j % 5 != 2).unwrap();
    let upper = |nq, nk| Mask::causal_upper_left(nq, nk).unwrap();
    vec![
        case(
            "gqa H4 Hk2 causal n17 d7",
            grouped(2, 17, 17, 4, 2, 7),
            Some(causal(17)),
        ),
        case("mqa H4 Hk1 n40 d16", grouped(1, 40, 40, 4, 1, 16), None),
        case(
            "mqa H4 Hk1 lower right+padding nq20 nk70 d16",
            grouped(2, 20, 70, 4, 1, 16),
            Some(lower_pad(20, 70)),
        ),
        case(
            "gqa H6 Hk3 general nq33 nk5 d64",
            grouped(1, 33, 5, 6, 3, 64),
            Some(rodd(33, 5)),
        ),
        case(
            "gqa H6 Hk2 causal n130 d32",
            grouped(1, 130, 130, 6, 2, 32),
            Some(causal(130)),
        ),
        case(
            "gqa H8 Hk2 padding n40 d65",
            grouped(1, 40, 40, 8, 2, 65),
            Some(pad(40)),
        ),
        case(
            "gqa H4 Hk2 upper left nq20 nk37 d128",
            grouped(1, 20, 37, 4, 2, FLASH_MAX_HEAD),
            Some(upper(20, 37)),
        ),
        case("mqa H3 Hk1 nq1 nk37 d8", grouped(2, 1, 37, 3, 1, 8), None),
        diagonal(
            "gqa H4 Hk2 diagonal -5 nq40 nk33 d100",
            grouped(1, 40, 33, 4, 2, 100),
            -5,
        ),
        case(
            "gqa H4 Hk2 padding per sequence B3 nq7 nk23 d5",
            grouped(3, 7, 23, 4, 2, 5),
            Some(padded(7, 23, &[23, 9, 0], None)),
        ),
        case(
            "mqa H2 Hk1 general per sequence B2 nq20 nk19 d9",
            grouped(2, 20, 19, 2, 1, 9),
            Some(dense_batched(2, 20, 19)),
        ),
    ]
}

/// Key padding per sequence of a padded batch: batch element b keeps its first `lens[b]` of
/// the nk keys (`lens.len()` elements), under the causal diagonal `diagonal` where given.
pub fn padded(nq: usize, nk: usize, lens: &[usize], diagonal: Option<i64>) -> Mask {
    Mask::from_fn_batched(lens.len(), nq, nk, |b, i, j| {
        j < lens[b] && diagonal.is_none_or(|o| j as i64 <= i as i64 + o)
    })
    .unwrap()
}

/// A dense mask of one irregular (nq, nk) matrix per batch element (the pattern shifts with
/// b), row 5 of element 1 fully masked (the same row of the other elements is not).
pub fn dense_batched(batch: usize, nq: usize, nk: usize) -> Mask {
    Mask::from_fn_batched(batch, nq, nk, |b, i, j| {
        (b, i) != (1, 5) && (i * 3 + j + 2 * b) % 5 != 0
    })
    .unwrap()
}

/// Masks of one (nq, nk) matrix per batch element, B = 2 and 3 (PyTorch's `attn_mask` (B, 1,
/// L, S)): a key padding that differs per sequence (one sequence of no keys at all), causal
/// with it (the diagonals 0 and nk − nq), and dense masks with a fully masked row in one
/// element only; lengths past the tiles, nq ≠ nk, both kernel families (d ≤ 64 and d > 64).
pub fn batched_cases() -> Vec<Case> {
    let lower = |nq: usize, nk: usize| Some(nk as i64 - nq as i64);
    vec![
        case(
            "padding per sequence B3 n40 d5",
            dims(3, 40, 2, 5),
            Some(padded(40, 40, &[40, 17, 0], None)),
        ),
        case(
            "causal+padding per sequence B2 n33 d33",
            dims(2, 33, 1, 33),
            Some(padded(33, 33, &[33, 20], Some(0))),
        ),
        case(
            "general per sequence B2 n20 d3",
            dims(2, 20, 2, 3),
            Some(dense_batched(2, 20, 20)),
        ),
        case(
            "padding per sequence B2 nq20 nk70 d16",
            rect(2, 20, 70, 1, 16),
            Some(padded(20, 70, &[70, 45], None)),
        ),
        case(
            "lower right+padding per sequence B3 nq33 nk5 d4",
            rect(3, 33, 5, 1, 4),
            Some(padded(33, 5, &[5, 3, 1], lower(33, 5))),
        ),
        case(
            "general per sequence B3 nq33 nk5 d9",
            rect(3, 33, 5, 1, 9),
            Some(dense_batched(3, 33, 5)),
        ),
        case(
            "lower right+padding per sequence B2 nq100 nk130 d64",
            rect(2, 100, 130, 1, 64),
            Some(padded(100, 130, &[130, 77], lower(100, 130))),
        ),
        case(
            "padding per sequence B2 n70 d65",
            dims(2, 70, 1, 65),
            Some(padded(70, 70, &[70, 37], None)),
        ),
        case(
            "general per sequence B3 nq40 nk19 d80",
            rect(3, 40, 19, 1, 80),
            Some(dense_batched(3, 40, 19)),
        ),
        case(
            "causal+padding per sequence B2 n81 d100",
            dims(2, 81, 1, 100),
            Some(padded(81, 81, &[50, 81], Some(0))),
        ),
    ]
}

/// The cases of one mask shared by every batch element ([`cases`]).
fn shared_cases() -> Vec<Case> {
    let pad = |n: usize| Mask::from_fn(n, |_, j| j % 5 != 2).unwrap();
    let both = |n: usize| Mask::from_fn(n, |i, j| j <= i && j % 4 != 1).unwrap();
    // Rows 0 and 7 see nothing; the others an irregular pattern.
    let odd = |n: usize| Mask::from_fn(n, |i, j| i != 0 && i != 7 && (i * 3 + j) % 5 != 0).unwrap();
    let causal = |n: usize| Mask::causal(n).unwrap();
    let rpad = |nq, nk| Mask::from_fn_rectangular(nq, nk, |_, j| j % 5 != 2).unwrap();
    let lower = |nq, nk| Mask::causal_lower_right(nq, nk).unwrap();
    let upper = |nq, nk| Mask::causal_upper_left(nq, nk).unwrap();
    let lower_pad = |nq: usize, nk: usize| {
        let o = nk as i64 - nq as i64;
        Mask::from_fn_rectangular(nq, nk, |i, j| j as i64 <= i as i64 + o && j % 4 != 1).unwrap()
    };
    // Rows 0 and 7 see nothing.
    let rodd = |nq, nk| {
        Mask::from_fn_rectangular(nq, nk, |i, j| i != 0 && i != 7 && (i * 3 + j) % 5 != 0).unwrap()
    };
    vec![
        case("n1 d1", dims(1, 1, 1, 1), None),
        case("n16 d16", dims(1, 16, 2, 16), None),
        case("causal n17 d7", dims(2, 17, 2, 7), Some(causal(17))),
        case("padding n40 d5", dims(1, 40, 3, 5), Some(pad(40))),
        case("causal+padding n33 d33", dims(2, 33, 1, 33), Some(both(33))),
        case("general n20 d3", dims(1, 20, 2, 3), Some(odd(20))),
        case("causal n150 d64", dims(1, 150, 2, 64), Some(causal(150))),
        case("general n100 d64", dims(1, 100, 1, 64), Some(odd(100))),
        case("padding n70 d65", dims(1, 70, 1, 65), Some(pad(70))),
        case(
            "causal+padding n81 d100",
            dims(1, 81, 1, 100),
            Some(both(81)),
        ),
        case("n5 d128", dims(1, 5, 1, FLASH_MAX_HEAD), Some(causal(5))),
        // Keys of another length.
        case("nq1 nk37 d8", rect(2, 1, 37, 2, 8), None),
        case(
            "padding nq1 nk37 d8",
            rect(1, 1, 37, 3, 8),
            Some(rpad(1, 37)),
        ),
        case("nq20 nk70 d5", rect(1, 20, 70, 2, 5), None),
        case(
            "padding nq20 nk70 d16",
            rect(2, 20, 70, 1, 16),
            Some(rpad(20, 70)),
        ),
        case(
            "lower right nq20 nk70 d5",
            rect(1, 20, 70, 2, 5),
            Some(lower(20, 70)),
        ),
        case(
            "general nq20 nk70 d3",
            rect(1, 20, 70, 2, 3),
            Some(rodd(20, 70)),
        ),
        case(
            "lower right nq33 nk5 d7",
            rect(2, 33, 5, 2, 7),
            Some(lower(33, 5)),
        ),
        case(
            "lower right+padding nq33 nk5 d4",
            rect(1, 33, 5, 1, 4),
            Some(lower_pad(33, 5)),
        ),
        case(
            "upper left nq33 nk5 d6",
            rect(1, 33, 5, 2, 6),
            Some(upper(33, 5)),
        ),
        case(
            "padding nq33 nk5 d64",
            rect(1, 33, 5, 1, 64),
            Some(rpad(33, 5)),
        ),
        case(
            "general nq33 nk5 d9",
            rect(1, 33, 5, 1, 9),
            Some(rodd(33, 5)),
        ),
        case(
            "lower right nq3 nk40 d64",
            rect(1, 3, 40, 2, 64),
            Some(lower(3, 40)),
        ),
        case(
            "lower right+padding nq100 nk130 d64",
            rect(1, 100, 130, 1, 64),
            Some(lower_pad(100, 130)),
        ),
        case(
            "lower right nq130 nk37 d32",
            rect(1, 130, 37, 1, 32),
            Some(lower(130, 37)),
        ),
        case(
            "lower right nq70 nk20 d65",
            rect(1, 70, 20, 1, 65),
            Some(lower(70, 20)),
        ),
        case(
            "upper left nq20 nk70 d100",
            rect(1, 20, 70, 1, 100),
            Some(upper(20, 70)),
        ),
        case(
            "general nq40 nk19 d80",
            rect(1, 40, 19, 1, 80),
            Some(rodd(40, 19)),
        ),
        case("nq1 nk37 d128", rect(1, 1, 37, 1, FLASH_MAX_HEAD), None),
        diagonal("diagonal -5 nq40 nk33 d16", rect(1, 40, 33, 2, 16), -5),
        diagonal("diagonal 7 nq20 nk70 d100", rect(1, 20, 70, 1, 100), 7),
        diagonal("diagonal -40 nq130 nk37 d8", rect(1, 130, 37, 1, 8), -40),
        diagonal("diagonal 3 n50 d64", dims(1, 50, 1, 64), 3),
        diagonal("diagonal -17 n50 d70", dims(1, 50, 1, 70), -17),
    ]
}

/// Seeded Q, K, V and dO for `dims` (Q and dO of nq rows, K and V of nk), in [−1.5, 1.5].
pub fn inputs(dims: &FlashDims, seed: u64) -> [Vec<f32>; 4] {
    let mut g = Gen::new(seed);
    let mut v = |len: usize| -> Vec<f32> { (0..len).map(|_| g.range(-1.5, 1.5) as f32).collect() };
    let (q, kv) = (dims.q_len(), dims.kv_len());
    [v(q), v(kv), v(kv), v(q)]
}

/// `[O, lse, dQ, dK, dV]` of the fused core on `dev`; everything it allocated released.
pub fn run_core<D: Device>(
    dev: &mut D,
    case: &Case,
    data: &[Vec<f32>; 4],
) -> Result<[Vec<f32>; 5]> {
    run_core_at(dev, case, data, Precision::F32)
}

/// [`run_core`] with the core's products at `round` (autocast: the forward's
/// `flash_attention_rounded`, whose Ō the backward reads).
pub fn run_core_at<D: Device>(
    dev: &mut D,
    case: &Case,
    data: &[Vec<f32>; 4],
    round: Precision,
) -> Result<[Vec<f32>; 5]> {
    run_core_with(dev, case, data, (round, FlashProducts::Fma))
}

/// [`run_core`] with the core's products as `products` says, forward and backward.
pub fn run_core_products<D: Device>(
    dev: &mut D,
    case: &Case,
    data: &[Vec<f32>; 4],
    products: FlashProducts,
) -> Result<[Vec<f32>; 5]> {
    run_core_with(dev, case, data, (Precision::F32, products))
}

/// [`run_core`] at `round` with `products`.
pub fn run_core_with<D: Device>(
    dev: &mut D,
    case: &Case,
    data: &[Vec<f32>; 4],
    (round, products): (Precision, FlashProducts),
) -> Result<[Vec<f32>; 5]> {
    run_flash(dev, &core(case, round, products)?, data)
}

/// The core of `case` at `round` with `products`.
fn core(case: &Case, round: Precision, products: FlashProducts) -> Result<Flash> {
    let f = Flash::new(case.dims, case.flash_mask()?);
    Ok(f.with_round(round).with_products(products))
}

/// `[O, lse, dQ, dK, dV]` of the core `f` on `dev` (under autocast the forward's
/// `flash_attention_rounded`, whose Ō the backward reads); everything it allocated released.
fn run_flash<D: Device>(dev: &mut D, f: &Flash, data: &[Vec<f32>; 4]) -> Result<[Vec<f32>; 5]> {
    let round = f.round;
    let [q, k, v, go] = [0, 1, 2, 3].map(|i| dev.upload(&data[i]));
    let (q, k, v, go) = (q?, k?, v?, go?);
    let (o, lse, exact) = match round.is_autocast() {
        true => {
            let [o, lse, exact] = dev.flash_attention_rounded([q, k, v], f)?;
            (o, lse, exact)
        }
        false => {
            let (o, lse) = dev.flash_attention([q, k, v], f)?;
            (o, lse, o)
        }
    };
    let [dq, dk, dv] = dev.flash_attention_bwd([q, k, v], exact, lse, go, f)?;
    let mut out = Vec::new();
    for b in [o, lse, dq, dk, dv] {
        out.push(dev.download(b)?);
    }
    dev.release_all([q, k, v, go, o, lse, exact, dq, dk, dv]);
    Ok([
        out.remove(0),
        out.remove(0),
        out.remove(0),
        out.remove(0),
        out.remove(0),
    ])
}

/// `[O, lse]` of `Device::flash_attention` on `dev` with the core's products at `round` (under
/// autocast its first pass keeps the statistics alone) with `products`; everything it
/// allocated released.
pub fn value_with<D: Device>(
    dev: &mut D,
    case: &Case,
    data: &[Vec<f32>; 4],
    (round, products): (Precision, FlashProducts),
) -> Result<[Vec<f32>; 2]> {
    let f = core(case, round, products)?;
    let [q, k, v] = [0, 1, 2].map(|i| dev.upload(&data[i]));
    let (q, k, v) = (q?, k?, v?);
    let (o, lse) = dev.flash_attention([q, k, v], &f)?;
    let out = [dev.download(o)?, dev.download(lse)?];
    dev.release_all([q, k, v, o, lse]);
    Ok(out)
}

/// The f64 reference: `[O, lse, dQ, dK, dV]` of softmax attention per head, masked entries
/// exactly 0, a row with nothing allowed 0 (lse −∞) and passing no gradient; query head h
/// reads key head h / (heads / kv_heads), whose dK and dV sum its query heads'.
fn reference(case: &Case, data: &[Vec<f32>; 4]) -> [Vec<f64>; 5] {
    reference_at(case, data, Precision::F32)
}

/// [`reference`] on the operands Q, K, V and dO rounded as `round` says, nothing else rounded:
/// what a core that forgot to round the probabilities and dS under autocast would compute (the
/// autocast reference itself is the spec's, [`spec_autocast`]).
fn reference_at(case: &Case, data: &[Vec<f32>; 4], round: Precision) -> [Vec<f64>; 5] {
    let FlashDims {
        batch,
        nq,
        nk,
        heads,
        kv_heads,
        d,
    } = case.dims;
    let aq = |b: usize, i: usize, h: usize, c: usize| ((b * nq + i) * heads + h) * d + c;
    // Key j of the key head query head h reads.
    let ak = |b: usize, j: usize, h: usize, c: usize| {
        ((b * nk + j) * kv_heads + h / (heads / kv_heads)) * d + c
    };
    let x = |k: usize, i: usize| f64::from(round.round(data[k][i]));
    // Batch element b's matrix of the mask (the one matrix of a shared mask).
    let ok =
        |b: usize, i: usize, j: usize| case.mask.as_ref().is_none_or(|m| m.allowed_in(b, i, j));
    let scale = 1.0 / (d as f64).sqrt();
    let (lq, lkv) = (case.dims.q_len(), case.dims.kv_len());
    let (mut o, mut lse) = (vec![0.0; lq], vec![f64::NEG_INFINITY; batch * heads * nq]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; lq], vec![0.0; lkv], vec![0.0; lkv]);
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..nq {
                let s: Vec<Option<f64>> = (0..nk)
                    .map(|j| {
                        ok(b, i, j).then(|| {
                            (0..d)
                                .map(|c| x(0, aq(b, i, h, c)) * x(1, ak(b, j, h, c)))
                                .sum::<f64>()
                                * scale
                        })
                    })
                    .collect();
                let m = s.iter().flatten().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let z: f64 = s.iter().flatten().map(|v| (v - m).exp()).sum();
                lse[(b * heads + h) * nq + i] = m + z.ln();
                let p: Vec<f64> = s
                    .iter()
                    .map(|v| v.map_or(0.0, |v| (v - m).exp() / z))
                    .collect();
                for c in 0..d {
                    o[aq(b, i, h, c)] = (0..nk).map(|j| p[j] * x(2, ak(b, j, h, c))).sum();
                }
                // dP = dO·Vᵀ, dS = P(dP − Σ P dP)·scale.
                let dp: Vec<f64> = (0..nk)
                    .map(|j| {
                        (0..d)
                            .map(|c| x(3, aq(b, i, h, c)) * x(2, ak(b, j, h, c)))
                            .sum()
                    })
                    .collect();
                let dot: f64 = (0..nk).map(|j| p[j] * dp[j]).sum();
                for j in 0..nk {
                    let ds = p[j] * (dp[j] - dot) * scale;
                    for c in 0..d {
                        dq[aq(b, i, h, c)] += ds * x(1, ak(b, j, h, c));
                        dk[ak(b, j, h, c)] += ds * x(0, aq(b, i, h, c));
                        dv[ak(b, j, h, c)] += p[j] * x(3, aq(b, i, h, c));
                    }
                }
            }
        }
    }
    [o, lse, dq, dk, dv]
}

/// The largest error of `got` against `want`, relative to `max(1, ‖want‖∞)`; −∞ must match
/// −∞, a NaN is an infinite error.
fn max_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |e, (&g, &w)| {
        if w == f64::NEG_INFINITY {
            return if g == f32::NEG_INFINITY {
                e
            } else {
                f64::INFINITY
            };
        }
        let d = (f64::from(g) - w).abs() / scale;
        // A NaN is an infinite error (`max` would skip it).
        e.max(if d.is_nan() { f64::INFINITY } else { d })
    })
}

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

/// The cases the tensor-core kernels take (d ≤ [`FLASH_TC_MAX_HEAD`]).
pub fn tc_cases() -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|c| c.dims.d <= FLASH_TC_MAX_HEAD)
        .collect()
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

/// `[O, dQ, dK, dV]` of the spec's autocast reference
/// (`tl_spec::ops::attention::sdpa::autocast_reference`) on `case`: q (B, nq, H·d), k and v
/// (B, nk, Hk·d), the cotangent dO.
fn spec_autocast(case: &Case, data: &[Vec<f32>; 4], round: Precision) -> [Vec<f64>; 4] {
    let f = case.dims;
    let t = |shape: [usize; 3], k: usize| Tensor::new(&shape[..], data[k].clone()).unwrap();
    let qs = [f.batch, f.nq, f.heads * f.d];
    let ks = [f.batch, f.nk, f.kv_heads * f.d];
    let [q, k, v, g] = [t(qs, 0), t(ks, 1), t(ks, 2), t(qs, 3)];
    let r = tl_spec::ops::attention::sdpa::autocast_reference(
        round,
        [&q, &k, &v],
        f.heads,
        case.mask.as_ref(),
        &g,
    )
    .unwrap();
    r.map(|x| x.data().to_vec())
}

/// The elements of `got` off `want` by more than `tol` relative to `max(1, ‖want‖∞)` (−∞
/// must match −∞; NaN is off), and how many there are.
fn beyond(got: &[f32], want: &[f64], tol: f64) -> (usize, usize) {
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    let off = got
        .iter()
        .zip(want)
        .filter(|&(&g, &w)| match w == f64::NEG_INFINITY {
            true => g != f32::NEG_INFINITY,
            false => (f64::from(g) - w).abs() / scale > tol || g.is_nan(),
        })
        .count();
    (off, got.len())
}

/// Under autocast (bf16, TF32) the fused core is the composed path's products on rounded
/// operands (`flash_attention_rounded` and its backward, every case: every mask form, nq ≠ nk,
/// masks per batch element, grouped heads, d up to 128): against the spec's f64 reference
/// (`autocast_reference`: Q, K, V, dO rounded, the normalized probabilities where A·V and dV
/// read them and dS where dQ and dK read it), lse (of the rounded operands) within 1e-5
/// everywhere and O, dQ, dK, dV within 1e-5 but where the device's f32
/// probability or dS and the reference's f64 one round to neighbouring values (one term off by
/// one unit of the rounding, at most 2⁻⁷ of its size): at most 2% of the elements, none off by
/// more than 2⁻⁶ of the scale. The reference that rounds the operands but not the
/// probabilities and dS (a core that forgot them, or rounded the online softmax's unnormalized
/// p) is off beyond 1e-5 on more than a fifth of the elements (ten times the flips'
/// allowance; measured: 82% in bf16, 54% in TF32, against 0.1% and 0.3% flips): the check
/// sees the rounding. `flash_attention` (no Ō: its first pass keeps the statistics alone)
/// gives the same O and lse bit for bit.
#[test]
fn under_autocast_the_core_rounds_as_the_composed_products() {
    autocast_check(FlashProducts::Fma, cases());
}

/// [`under_autocast_the_core_rounds_as_the_composed_products`] on the tensor cores
/// (`FlashProducts::Tf32x3` under autocast: the rounded operands' exact products, the sim twins
/// of `tl_flash_fwd_tc` and the backward's two kernels with the pass and rounding bits), every
/// case with d ≤ 64; and not the FMA core's bits: lse differs on most cases (the online
/// softmax over steps of 64 keys, p summed in two halves), so the setting reached the core.
/// (With one exact product a pair, the emulator's `mma_sync` sums a chunk in the FMA chain's
/// order, so O, whose probabilities are rounded, and the backward's sums mostly agree with the
/// FMA core's bits; the f32 first pass's `P·V` keeps its split.)
#[test]
fn under_autocast_on_the_tensor_cores_the_core_rounds_as_the_composed_products() {
    autocast_check(FlashProducts::Tf32x3, tc_cases());
}

/// The autocast checks above for the core with `products`, on `cases`.
fn autocast_check(products: FlashProducts, cases: Vec<Case>) {
    for round in [Precision::Bf16, Precision::Tf32] {
        let (mut off, mut unrounded_off, mut total) = (0, 0, 0);
        let (mut differ, mut differ_dq) = (0, 0);
        for (k, case) in cases.iter().enumerate() {
            let data = inputs(&case.dims, 300 + k as u64);
            let mut dev = SimDevice::new();
            let got = run_core_with(&mut dev, case, &data, (round, products)).unwrap();
            let fma = run_core_at(&mut dev, case, &data, round).unwrap();
            differ += usize::from(bits_of(&got[1]) != bits_of(&fma[1]));
            differ_dq += usize::from(bits_of(&got[2]) != bits_of(&fma[2]));
            // Without Ō (a first pass of statistics alone): the same O and lse.
            let value = value_with(&mut dev, case, &data, (round, products)).unwrap();
            assert_eq!(value[0], got[0], "{round:?} {}: O", case.name);
            assert_eq!(value[1], got[1], "{round:?} {}: lse", case.name);
            let want = spec_autocast(case, &data, round);
            let unrounded = reference_at(case, &data, round);
            let e = max_err(&got[1], &unrounded[1]);
            assert!(e <= 1e-5, "{round:?} {}: lse off by {e:e}", case.name);
            let results = [(0, "O"), (2, "dQ"), (3, "dK"), (4, "dV")];
            for (w, (r, name)) in results.into_iter().enumerate() {
                let e = max_err(&got[r], &want[w]);
                assert!(
                    e <= 1.0 / 64.0,
                    "{round:?} {}: {name} off by {e:e}",
                    case.name
                );
                let (n, len) = beyond(&got[r], &want[w], 1e-5);
                off += n;
                total += len;
                unrounded_off += beyond(&got[r], &unrounded[r], 1e-5).0;
            }
            let u = dev.memory_usage();
            assert_eq!(u.live_bytes, 0, "{round:?} {}: leaked {u}", case.name);
        }
        assert!(
            off * 50 <= total,
            "{round:?}: {off} of {total} elements beyond 1e-5 of the reference"
        );
        assert!(
            unrounded_off * 5 > total,
            "{round:?}: only {unrounded_off} of {total} elements tell the probabilities' \
             rounding apart"
        );
        if products != FlashProducts::Fma {
            let n = cases.len();
            assert!(
                differ * 2 > n,
                "{round:?}: the FMA core's lse on {} of {n}",
                n - differ
            );
        }
        println!(
            "{products:?} {round:?}: {off} of {total} off by a flip; {unrounded_off} tell the \
             rounding; {differ} lse and {differ_dq} dQ not the FMA core's of {}",
            cases.len()
        );
    }
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

/// `multiHeadAttention` over leaves `[wq, wk, wv, wo, x]` (x (B, n, dModel)), then a weighted
/// sum, as one graph.
fn mha_graph(op: Op, batch: usize, n: usize, dm: usize, p: usize) -> (tl_ir::GraphData, usize) {
    let mut b = GraphBuilder::new();
    let w = [[dm, p], [dm, p], [dm, p], [p, dm]].map(|s| b.leaf(s, None).unwrap());
    let x = b.leaf([batch, n, dm], None).unwrap();
    let r = b.leaf([batch, n, dm], None).unwrap();
    let y = b.apply(op, &[w[0], w[1], w[2], w[3], x]).unwrap();
    let yr = b.apply(Op::Mul, &[y, r]).unwrap();
    let out = b.apply(Op::Sum, &[yr]).unwrap();
    (b.finish(), out)
}

fn mha(heads: usize, mask: Option<Mask>, fused: bool) -> Op {
    Op::MultiHeadAttention { heads, mask, fused }
}

/// The fused op on the CUDA tape (sim) against the IR (check 1 and 2), for lengths that are
/// not multiples of the tile, every mask form, a fully masked row; under masks of one matrix
/// per batch element, fused and composed.
#[test]
fn the_fused_op_on_the_tape_matches_ir_eval_and_backprop() {
    let mut g = Gen::new(5);
    let odd = Mask::from_fn(19, |i, j| i != 4 && (i + 2 * j) % 3 != 0).unwrap();
    let pad = Mask::from_fn(19, |_, j| j != 0 && j != 11).unwrap();
    let both = Mask::from_fn(19, |i, j| j <= i && j != 3).unwrap();
    for mask in [
        None,
        Some(Mask::causal(19).unwrap()),
        Some(pad),
        Some(both),
        Some(odd),
    ] {
        let (graph, out) = mha_graph(mha(2, mask.clone(), true), 2, 19, 5, 6);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        check_graph(
            &format!("fused attention {mask:?}"),
            &graph,
            &leaves,
            out,
            &Tensor::scalar(1.0),
        );
    }
    // One mask per sequence: causal with a key padding (element 1 keeps 11 of 19 positions),
    // and dense with row 5 fully masked in element 1 only; fused and composed.
    for mask in [padded(19, 19, &[19, 11], Some(0)), dense_batched(2, 19, 19)] {
        for fused in [true, false] {
            let (graph, out) = mha_graph(mha(2, Some(mask.clone()), fused), 2, 19, 5, 6);
            let leaves: Vec<Tensor<f64>> = graph
                .leaves()
                .iter()
                .map(|l| draw(&mut g, &l.shape, Domain::Any))
                .collect();
            check_graph(
                &format!("attention fused {fused} {mask:?}"),
                &graph,
                &leaves,
                out,
                &Tensor::scalar(1.0),
            );
        }
    }
}

/// The fused op on a tape whose device runs the f32 forward on the tensor cores
/// (`SimDevice::set_flash_products(FlashProducts::Tf32x3)`): value and every gradient against
/// the IR's eval and backprop, for `multiHeadAttention` (masks of every form, a fully masked
/// row, lengths of several steps of 64 keys) and `scaledDotProductAttention` with keys of
/// another length and fewer heads; a head past 64 takes the FMA forward (the same bits as a
/// tape without the setting). And the setting reaches the node: the value differs from the
/// FMA tape's in its bits.
#[test]
fn on_the_tensor_cores_the_fused_op_matches_ir_eval_and_backprop() {
    use crate::common::check_graph_on_tape;
    let tc_tape = || {
        let mut d = SimDevice::new();
        d.set_flash_products(FlashProducts::Tf32x3);
        CudaTape::new(d)
    };
    let mut g = Gen::new(11);
    let n = 70;
    let both = Mask::from_fn(n, |i, j| j <= i && j % 9 != 4 && i != 6).unwrap();
    for mask in [None, Some(Mask::causal(n).unwrap()), Some(both)] {
        let (graph, out) = mha_graph(mha(2, mask.clone(), true), 2, n, 5, 8);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        let what = format!("tensor-core attention {mask:?}");
        check_graph_on_tape(tc_tape(), &what, &graph, &leaves, out, &Tensor::scalar(1.0));
        // The setting reaches the node: O's bits differ from the FMA forward's.
        let value = |tape| node_bits(tape, &graph, &leaves, out - 2);
        assert_ne!(
            value(tc_tape()),
            value(CudaTape::new(SimDevice::new())),
            "{what}: the tensor-core tape gave the FMA forward's bits"
        );
    }
    // A head of 72 (past 64): the FMA forward, bit for bit.
    let (graph, out) = mha_graph(mha(1, None, true), 1, 20, 5, 72);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(&mut g, &l.shape, Domain::Any))
        .collect();
    let value = |tape| node_bits(tape, &graph, &leaves, out - 2);
    assert_eq!(value(tc_tape()), value(CudaTape::new(SimDevice::new())));
    let op = Op::ScaledDotProductAttention {
        heads: 4,
        mask: Some(Mask::causal_lower_right(20, 70).unwrap()),
        fused: true,
    };
    // 4 query heads of 16 over 2 key heads.
    let (graph, out) = sdpa_graph(op, 2, (20, 70), (64, 32));
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(&mut g, &l.shape, Domain::Any))
        .collect();
    check_graph_on_tape(
        tc_tape(),
        "tensor-core sdpa",
        &graph,
        &leaves,
        out,
        &Tensor::scalar(1.0),
    );
}

/// The bits of graph id `id`'s value, `graph` replayed on `tape` with `leaves`.
fn node_bits(
    mut tape: CudaTape<SimDevice>,
    graph: &tl_ir::GraphData,
    leaves: &[Tensor<f64>],
    id: usize,
) -> Vec<u32> {
    let ids = graph.replay(&mut tape, leaves, &[]).unwrap();
    bits_of(&tape.read::<f32>(ids[id]).unwrap().into_vec())
}

/// Values and gradients of `multiHeadAttention` on a fresh sim tape, as f64.
fn tape_run(op: &Op, leaves: &[Tensor<f64>]) -> Vec<Tensor<f64>> {
    let (graph, out) = mha_graph(op.clone(), 2, 21, 6, 8);
    value_and_first_grads(&graph, out, leaves, 5)
}

/// The value of `out` and the gradients of the first `n` leaves on a fresh sim tape, as f64.
fn value_and_first_grads(
    graph: &tl_ir::GraphData,
    out: usize,
    leaves: &[Tensor<f64>],
    n: usize,
) -> Vec<Tensor<f64>> {
    let mut tape = CudaTape::new(SimDevice::new());
    let ids = graph.replay(&mut tape, leaves, &[]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    let grads = tape.backward_dense(ids[out], &seed).unwrap();
    let mut res = vec![tape.read(ids[out]).unwrap()];
    for &id in &ids[..n] {
        res.push(grads[id].download(tape.device()).unwrap());
    }
    tape.release_grads(grads);
    res
}

/// fused = composed on the CUDA tape, value and every gradient (both within the f32
/// tolerance of each other; the summation orders differ).
#[test]
fn the_fused_and_composed_paths_agree_on_the_tape() {
    let mut g = Gen::new(9);
    for mask in [None, Some(Mask::causal(21).unwrap())] {
        let (graph, _) = mha_graph(mha(2, None, true), 2, 21, 6, 8);
        let leaves: Vec<Tensor<f64>> = graph
            .leaves()
            .iter()
            .map(|l| draw(&mut g, &l.shape, Domain::Any))
            .collect();
        let fused = tape_run(&mha(2, mask.clone(), true), &leaves);
        let composed = tape_run(&mha(2, mask.clone(), false), &leaves);
        for (k, (a, b)) in fused.iter().zip(&composed).enumerate() {
            crate::common::close(a, b).unwrap_or_else(|e| panic!("{mask:?} result {k}: {e}"));
        }
        // Deterministic: a second run gives the same bits.
        let again = tape_run(&mha(2, mask.clone(), true), &leaves);
        for (a, b) in fused.iter().zip(&again) {
            assert_eq!(
                a.data(),
                b.data(),
                "{mask:?}: not bit-identical across runs"
            );
        }
    }
}

/// [`crate::common::backward_from_workspace_then_recomputed`] of `sum(y)`.
fn backward_from_workspace_then_recomputed(
    tape: &mut CudaTape<SimDevice>,
    y: usize,
    leaves: &[usize],
    kept: &[tl_tape_cuda::device::Buffer],
) -> (u64, u64) {
    let loss = tape.apply(&Op::Sum, &[y]).unwrap();
    let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
    crate::common::backward_from_workspace_then_recomputed(tape, (loss, &seed), leaves, kept)
}

/// The fused node keeps Q, K, V, C and one log-sum-exp per row (no (n, n) buffer), runs one
/// core launch forward and two backward, and its backward recomputes only Q, K, V, C and the
/// statistics once the workspace is gone.
#[test]
fn the_fused_node_keeps_o_n_floats_and_runs_three_core_launches() {
    let mut rnd = Gen::new(23);
    let (dm, p, heads, n) = (6, 4, 2, 37);
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [n, dm]];
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &shapes);
    let op = mha(heads, Some(Mask::causal(n).unwrap()), true);
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    // Three projections, the fused core, the output projection.
    assert_eq!((tape.device().traffic() - before).launches, 5);
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(
        lens,
        [n * p, n * p, n * p, n * p, heads * n],
        "Q, K, V, C, lse"
    );
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(
        grown,
        4 * (4 * n * p + heads * n + n * dm),
        "kept + y, bytes"
    );
    assert!(
        grown < 4 * heads * n * n,
        "less than one (heads, n, n) score matrix"
    );
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(
        recomputed - reused,
        4,
        "three projections and the fused core"
    );
}

/// A head the kernels do not take is an error naming the op before anything runs; the
/// composed path takes it.
#[test]
fn a_head_past_the_kernel_is_an_error_and_the_composed_path_runs_it() {
    let (dm, heads, p) = (3, 1, FLASH_MAX_HEAD + 1);
    let mut g = Gen::new(4);
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [2, dm]];
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves: Vec<usize> = shapes
        .iter()
        .map(|s| {
            tape.upload_leaf(&draw(&mut g, &Shape::new(s), Domain::Any), None, true)
                .unwrap()
        })
        .collect();
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let nodes = tape.len();
    let e = tape
        .apply(&mha(heads, None, true), &leaves)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("multiHeadAttention") && e.contains("d = 129") && e.contains("fused = false"),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
    assert_eq!(tape.len(), nodes);
    assert!(tape.apply(&mha(heads, None, false), &leaves).is_ok());
}

/// `scaledDotProductAttention`, fused: one launch forward (no projection around the core),
/// the node keeps each row's log-sum-exp only (q, k, v are its operands, C its value: no (n, n)
/// buffer), the backward gives the same bits from that workspace or with the core run again
/// (one launch more); a head past the kernels is an error naming the op before anything is
/// allocated or launched, which the composed path takes.
#[test]
fn the_fused_core_op_keeps_the_log_sum_exp_only() {
    let mut rnd = Gen::new(29);
    let (heads, d, n) = (2, 3, 37);
    let p = heads * d;
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &[[n, p]; 3]);
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal(n).unwrap()),
        fused: true,
    };
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    assert_eq!(
        (tape.device().traffic() - before).launches,
        1,
        "the core alone"
    );
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * n], "lse");
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(grown, 4 * (n * p + heads * n), "y + lse, bytes");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 1, "the fused core again");

    let wide = |fused: bool| Op::ScaledDotProductAttention {
        heads: 1,
        mask: None,
        fused,
    };
    let q = random_leaves(&mut tape, &mut rnd, &[[3, FLASH_MAX_HEAD + 1]; 3]);
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let e = tape.apply(&wide(true), &q).unwrap_err().to_string();
    assert!(
        e.contains("scaledDotProductAttention") && e.contains("d = 129"),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
    assert!(tape.apply(&wide(false), &q).is_ok());
}

/// Under autocast (bf16) the fused nodes keep O(n·P) floats too: `scaledDotProductAttention`
/// its log-sum-exp and Ō (the output of the unrounded probabilities, which the backward's
/// delta reads) beside its value, `multiHeadAttention` Q, K, V, C, lse and Ō; a core forward
/// is Q, K, V rounded into copies and two passes over the keys; the backward reads the
/// workspace or recomputes it, with the same bits. Over n = 512 keys the fused core op's peak
/// (forward and backward) stays below one (heads, n, n) score matrix, where the composed core
/// at the same setting holds three.
#[test]
fn under_autocast_the_fused_nodes_keep_o_n_floats() {
    let mut rnd = Gen::new(31);
    let (heads, d, n) = (2, 3, 37);
    let p = heads * d;
    let causal = || Some(Mask::causal(n).unwrap());
    let mut tape = CudaTape::new(SimDevice::new());
    tape.set_precision(Precision::Bf16);
    let leaves = random_leaves(&mut tape, &mut rnd, &[[n, p]; 3]);
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: causal(),
        fused: true,
    };
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&op, &leaves).unwrap();
    let launches = (tape.device().traffic() - before).launches;
    assert_eq!(launches, 5, "Q, K, V rounded, then the core's two passes");
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * n, n * p], "lse, Ō");
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(grown, 4 * (2 * n * p + heads * n), "y + lse + Ō, bytes");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 5, "the rounded core again");

    let dm = 6;
    let shapes = [[dm, p], [dm, p], [dm, p], [p, dm], [n, dm]];
    let leaves = random_leaves(&mut tape, &mut rnd, &shapes);
    let before = tape.device().traffic();
    let live = tape.device().memory_usage().live_bytes;
    let y = tape.apply(&mha(heads, causal(), true), &leaves).unwrap();
    let launches = (tape.device().traffic() - before).launches;
    assert_eq!(
        launches, 9,
        "three projections, the rounded core, the output projection"
    );
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(
        lens,
        [n * p, n * p, n * p, n * p, heads * n, n * p],
        "Q, K, V, C, lse, Ō"
    );
    let grown = tape.device().memory_usage().live_bytes - live;
    assert_eq!(
        grown,
        4 * (5 * n * p + heads * n + n * dm),
        "kept + y, bytes"
    );
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(
        recomputed - reused,
        8,
        "three projections and the rounded core"
    );

    // The peak of a forward and backward over n = 512, fused and composed.
    let (n, d) = (512, 8);
    let p = heads * d;
    let peak = |fused: bool| {
        let mut tape = CudaTape::new(SimDevice::new());
        tape.set_precision(Precision::Bf16);
        let leaves = random_leaves(&mut tape, &mut Gen::new(32), &[[n, p]; 3]);
        let base = tape.device().memory_usage().live_bytes;
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: Some(Mask::causal(n).unwrap()),
            fused,
        };
        let y = tape.apply(&op, &leaves).unwrap();
        let loss = tape.apply(&Op::Sum, &[y]).unwrap();
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let g = tape.backward_dense(loss, &seed).unwrap();
        let peak = tape.device().memory_usage().peak_bytes - base;
        tape.release_grads(g);
        peak
    };
    let scores = 4 * heads * n * n;
    let (fused, composed) = (peak(true), peak(false));
    assert!(
        fused < scores,
        "fused peak {fused} B, one score matrix {scores} B"
    );
    assert!(composed >= 3 * scores, "composed peak {composed} B");
}

/// On the tensor cores under autocast the kernels round Q, K, V and dO as they stage them
/// (`Flash::rounds_on_read`): a fused core's forward is its two passes alone and its backward
/// the two kernels (three and four rounding launches fewer than the FMA core's), and neither
/// holds rounded copies: the forward's peak is three operands' bytes below the FMA core's,
/// the backward's four. The same kept buffers (lse, Ō).
#[test]
fn on_the_tensor_cores_under_autocast_the_core_makes_no_rounded_copies() {
    let (heads, d, n) = (2, 8, 96);
    let p = heads * d;
    // (forward launches, forward peak growth, backward launches, backward peak growth, kept).
    let run = |products| {
        let mut dev = SimDevice::new();
        dev.set_flash_products(products);
        let mut tape = CudaTape::new(dev);
        tape.set_precision(Precision::Bf16);
        let leaves = random_leaves(&mut tape, &mut Gen::new(34), &[[n, p]; 3]);
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: Some(Mask::causal(n).unwrap()),
            fused: true,
        };
        let (before, base) = (tape.device().traffic(), tape.device().memory_usage());
        let y = tape.apply(&op, &leaves).unwrap();
        let forward = (tape.device().traffic() - before).launches;
        let forward_peak = tape.device().memory_usage().peak_bytes - base.live_bytes;
        let kept: Vec<usize> = tape
            .node(y)
            .unwrap()
            .cleanup()
            .iter()
            .map(|b| b.len())
            .collect();
        let seed = Tensor::new(&[n, p][..], vec![0.5; n * p]).unwrap();
        let seed = AnyBuffer::upload(tape.device_mut(), &seed).unwrap();
        let (before, live) = (
            tape.device().traffic(),
            tape.device().memory_usage().live_bytes,
        );
        let g = tape.backward_dense(y, &seed).unwrap();
        let backward = (tape.device().traffic() - before).launches;
        let backward_peak = tape.device().memory_usage().peak_bytes.saturating_sub(live);
        tape.release_grads(g);
        (forward, forward_peak, backward, backward_peak, kept)
    };
    let (fma, tc) = (run(FlashProducts::Fma), run(FlashProducts::Tf32x3));
    assert_eq!(tc.0, 2, "the two passes");
    assert_eq!(fma.0 - tc.0, 3, "three rounding launches fewer forward");
    assert_eq!(fma.2 - tc.2, 4, "four rounding launches fewer backward");
    let operand = 4 * n * p;
    assert_eq!(
        fma.1 - tc.1,
        3 * operand,
        "forward peak: the copies of Q, K, V"
    );
    assert!(
        fma.3 >= tc.3 + 4 * operand,
        "backward peak {} against {}",
        tc.3,
        fma.3
    );
    assert_eq!(tc.4, fma.4, "kept: lse, Ō");
    assert_eq!(tc.4, [heads * n, n * p]);
}

/// Under autocast a fused node that will not be differentiated (no operand requires grad)
/// computes no Ō: its first pass keeps each row's statistics alone. Its value is the
/// differentiated node's bit for bit, and its forward's peak is at least Ō's bytes lower.
#[test]
fn under_autocast_a_node_without_gradients_keeps_no_exact_output() {
    let (heads, d, n) = (2, 8, 96);
    let p = heads * d;
    let data: Vec<Tensor<f32>> = (0..3)
        .map(|k| {
            let v = inputs(&rect(1, n, n, heads, d), 40 + k)[0].clone();
            Tensor::new(&[n, p][..], v).unwrap()
        })
        .collect();
    let op = Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal(n).unwrap()),
        fused: true,
    };
    let run = |requires_grad: bool| {
        let mut tape = CudaTape::new(SimDevice::new());
        tape.set_precision(Precision::Bf16);
        let ids: Vec<usize> = data
            .iter()
            .map(|t| tape.upload_leaf(t, None, requires_grad).unwrap())
            .collect();
        let base = tape.device().memory_usage().live_bytes;
        let y = tape.apply(&op, &ids).unwrap();
        let peak = tape.device().memory_usage().peak_bytes - base;
        let value: Tensor<f32> = tape.get(y).unwrap().download(tape.device()).unwrap();
        let kept = tape.node(y).unwrap().cleanup().len();
        (bits_of(value.data()), peak, kept)
    };
    let (with, peak_with, kept_with) = run(true);
    let (without, peak_without, kept_without) = run(false);
    assert_eq!(without, with, "the same value");
    assert_eq!((kept_with, kept_without), (2, 0), "lse and Ō, then nothing");
    assert!(
        peak_without + 4 * n * p <= peak_with,
        "peak {peak_without} B without gradients, {peak_with} B with"
    );
}

/// On the tape under autocast the fused core op is the rounded core bit for bit
/// (`flash_attention_rounded`, then the backward from its Ō, not from C), both from the
/// node's workspace and recomputed once the tape released it; a causal, grouped (4 query heads
/// over 2) case over keys of another length. With the device's `FlashProducts::Tf32x3` the
/// tape's core is the tensor cores' (in TF32 other bits than the FMA core's in the value or a
/// gradient: the setting reaches the autocast core).
#[test]
fn under_autocast_the_fused_core_op_on_the_tape_is_the_rounded_core() {
    let (nq, nk, heads, kv_heads, d) = (21, 37, 4, 2, 3);
    let case = case(
        "lower right 21 over 37, 4 over 2",
        grouped(1, nq, nk, heads, kv_heads, d),
        Some(Mask::causal_lower_right(nq, nk).unwrap()),
    );
    let data = inputs(&case.dims, 33);
    let settings = [
        (Precision::Bf16, FlashProducts::Fma),
        (Precision::Bf16, FlashProducts::Tf32x3),
        (Precision::Tf32, FlashProducts::Tf32x3),
    ];
    for (round, products) in settings {
        let how = (round, products);
        let want = run_core_with(&mut SimDevice::new(), &case, &data, how).unwrap();
        let fma = run_core_at(&mut SimDevice::new(), &case, &data, round).unwrap();
        if round == Precision::Tf32 {
            let seen = |x: &[Vec<f32>; 5]| [0, 2, 3, 4].map(|k| bits_of(&x[k]));
            assert_ne!(seen(&want), seen(&fma), "{how:?}: the FMA core's bits");
        }
        let mut dev = SimDevice::new();
        dev.set_flash_products(products);
        let mut tape = CudaTape::new(dev);
        tape.set_precision(round);
        let shapes = [
            [1, nq, heads * d],
            [1, nk, kv_heads * d],
            [1, nk, kv_heads * d],
        ];
        let ids: Vec<usize> = (0..3)
            .map(|k| {
                let t = Tensor::new(&shapes[k][..], data[k].clone()).unwrap();
                tape.upload_leaf(&t, None, true).unwrap()
            })
            .collect();
        let op = Op::ScaledDotProductAttention {
            heads,
            mask: case.mask.clone(),
            fused: true,
        };
        let y = tape.apply(&op, &ids).unwrap();
        let value: Tensor<f32> = tape.get(y).unwrap().download(tape.device()).unwrap();
        assert_eq!(bits_of(value.data()), bits_of(&want[0]), "{how:?}: O");
        let seed = Tensor::new(&shapes[0][..], data[3].clone()).unwrap();
        for pass in ["workspace", "recomputed"] {
            let seed = AnyBuffer::upload(tape.device_mut(), &seed).unwrap();
            let g = tape.backward_dense(y, &seed).unwrap();
            for (k, name) in ["dQ", "dK", "dV"].into_iter().enumerate() {
                let got: Tensor<f32> = g[ids[k]].download(tape.device()).unwrap();
                let want = bits_of(&want[2 + k]);
                assert_eq!(bits_of(got.data()), want, "{how:?} {pass}: {name}");
            }
            tape.release_grads(g);
            seed.release(tape.device_mut());
        }
    }
}

fn bits_of(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// `scaledDotProductAttention` over leaves `[q, k, v, r]` (q and r (B, nq, P), k and v
/// (B, nk, Pk)), then `sum(y·r)`, as one graph.
fn sdpa_graph(
    op: Op,
    batch: usize,
    (nq, nk): (usize, usize),
    (p, pk): (usize, usize),
) -> (tl_ir::GraphData, usize) {
    let mut b = GraphBuilder::new();
    let q = b.leaf([batch, nq, p], None).unwrap();
    let k = b.leaf([batch, nk, pk], None).unwrap();
    let v = b.leaf([batch, nk, pk], None).unwrap();
    let r = b.leaf([batch, nq, p], None).unwrap();
    let y = b.apply(op, &[q, k, v]).unwrap();
    let yr = b.apply(Op::Mul, &[y, r]).unwrap();
    let out = b.apply(Op::Sum, &[yr]).unwrap();
    (b.finish(), out)
}

/// The value of `out` and the gradients of q, k and v on a fresh sim tape, as f64.
fn sdpa_tape_run(graph: &tl_ir::GraphData, out: usize, leaves: &[Tensor<f64>]) -> Vec<Tensor<f64>> {
    value_and_first_grads(graph, out, leaves, 3)
}

/// `scaledDotProductAttention` of 2 heads of size 3 on q (batch, nq, P) and k, v
/// (batch, nk, P) under `mask`: [`check_sdpa_heads_on_the_tape`].
fn check_sdpa_on_the_tape(g: &mut Gen, batch: usize, nq: usize, nk: usize, mask: Option<Mask>) {
    check_sdpa_heads_on_the_tape(g, (2, 2), batch, (nq, nk), mask);
}

/// `scaledDotProductAttention` of `heads` query heads of size 3 on q (batch, nq, P) and k, v
/// (batch, nk, Pk) of `kv_heads` key heads under `mask`, fused and composed: the CUDA tape
/// (sim) against IR eval and backprop in f64 (check 1 and 2: the spec's reference) and in f32,
/// and fused against composed.
fn check_sdpa_heads_on_the_tape(
    g: &mut Gen,
    (heads, kv_heads): (usize, usize),
    batch: usize,
    (nq, nk): (usize, usize),
    mask: Option<Mask>,
) {
    let d = 3;
    let widths = (heads * d, kv_heads * d);
    let sdpa = |fused| Op::ScaledDotProductAttention {
        heads,
        mask: mask.clone(),
        fused,
    };
    let (graph, out) = sdpa_graph(sdpa(true), batch, (nq, nk), widths);
    let leaves: Vec<Tensor<f64>> = graph
        .leaves()
        .iter()
        .map(|l| draw(g, &l.shape, Domain::Any))
        .collect();
    // IR in f32: the value and the gradients of q, k, v.
    let l32: Vec<Tensor<f32>> = leaves.iter().map(|t| t.cast()).collect();
    let seed = Tensor::scalar(1.0f32);
    let v32 = graph.eval(&l32, &[]).unwrap();
    let g32 = graph.backprop_all(&l32, &[], out, &seed).unwrap();
    let ir32: Vec<Tensor<f64>> = [&v32[out], &g32[0], &g32[1], &g32[2]]
        .iter()
        .map(|t| t.cast())
        .collect();
    let mut runs = Vec::new();
    let heads = format!("H {heads} Hk {kv_heads}");
    for fused in [true, false] {
        let what = format!("sdpa {heads} B {batch} nq {nq} nk {nk} fused {fused} {mask:?}");
        let (graph, out) = sdpa_graph(sdpa(fused), batch, (nq, nk), widths);
        check_graph(&what, &graph, &leaves, out, &Tensor::scalar(1.0));
        let got = sdpa_tape_run(&graph, out, &leaves);
        for (k, (a, b)) in got.iter().zip(&ir32).enumerate() {
            crate::common::close(a, b)
                .unwrap_or_else(|e| panic!("{what}: result {k} against IR f32: {e}"));
        }
        runs.push(got);
    }
    for (k, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        crate::common::close(a, b).unwrap_or_else(|e| {
            panic!(
                "{heads} B {batch} nq {nq} nk {nk} {mask:?}: result {k}, fused against \
                 composed: {e}"
            )
        });
    }
}

/// `scaledDotProductAttention` with keys of another length than the queries (nq = 7 over
/// nk = 23, nq = 19 over nk = 5 and one query row over 37 keys, a KV-cache step), fused and
/// composed, every mask form (none, key padding, causal lower right and upper left, lower
/// right with padding, a dense mask with fully masked rows): [`check_sdpa_on_the_tape`].
#[test]
fn scaled_dot_product_attention_takes_keys_of_another_length() {
    let mut g = Gen::new(31);
    for (nq, nk) in [(7, 23), (19, 5), (1, 37)] {
        let lr_pad = Mask::from_fn_rectangular(nq, nk, |i, j| {
            j as i64 <= i as i64 + nk as i64 - nq as i64 && j % 3 != 1
        })
        .unwrap();
        // Rows 0 and 4 (where there are) see nothing.
        let dense =
            Mask::from_fn_rectangular(nq, nk, |i, j| i != 0 && i != 4 && (i + 2 * j) % 3 != 0)
                .unwrap();
        let masks = [
            None,
            Some(Mask::from_fn_rectangular(nq, nk, |_, j| j % 4 != 2).unwrap()),
            Some(Mask::causal_lower_right(nq, nk).unwrap()),
            Some(Mask::causal_upper_left(nq, nk).unwrap()),
            Some(lr_pad),
            Some(dense),
        ];
        for mask in masks {
            check_sdpa_on_the_tape(&mut g, 2, nq, nk, mask);
        }
    }
}

/// `scaledDotProductAttention` under a mask of one (nq, nk) matrix per batch element (a padded
/// batch's key padding, PyTorch's `attn_mask` (B, 1, L, S)), B = 2 and 3, square and
/// rectangular: a key padding per sequence (one sequence of no keys), lower right causal with
/// it, and a dense mask whose row 5 sees nothing in element 1 only: [`check_sdpa_on_the_tape`]
/// (the IR's reference takes each element's matrix).
#[test]
fn scaled_dot_product_attention_takes_a_mask_per_batch_element() {
    let mut g = Gen::new(41);
    for (batch, nq, nk, lens) in [(3, 7, 23, &[23, 9, 0][..]), (2, 19, 19, &[19, 4][..])] {
        let lower = Some(nk as i64 - nq as i64);
        let masks = [
            padded(nq, nk, lens, None),
            padded(nq, nk, lens, lower),
            dense_batched(batch, nq, nk),
        ];
        for mask in masks {
            check_sdpa_on_the_tape(&mut g, batch, nq, nk, Some(mask));
        }
    }
}

/// A mask of 2 batch elements for operands of batch 3 is an error naming the op and both
/// batch sizes, fused or not, before anything is allocated or launched.
#[test]
fn a_mask_of_another_batch_is_an_error_naming_both_sizes() {
    let mut rnd = Gen::new(43);
    let mut tape = CudaTape::new(SimDevice::new());
    let (n, p) = (4, 6);
    let mut leaves = |shapes: &[&[usize]]| -> Vec<usize> {
        shapes
            .iter()
            .map(|s| {
                let t = draw(&mut rnd, &Shape::new(s), Domain::Any);
                tape.upload_leaf(&t, None, true).unwrap()
            })
            .collect()
    };
    let qkv = leaves(&[&[3, n, p][..]; 3]);
    let w = leaves(&[&[5, p], &[5, p], &[5, p], &[p, 5], &[3, n, 5]]);
    let mask = padded(n, n, &[4, 2], None);
    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    for fused in [true, false] {
        let sdpa = Op::ScaledDotProductAttention {
            heads: 2,
            mask: Some(mask.clone()),
            fused,
        };
        for (op, leaves) in [(sdpa, &qkv), (mha(2, Some(mask.clone()), fused), &w)] {
            let e = tape.apply(&op, leaves).unwrap_err().to_string();
            assert!(
                e.contains(op.name()) && e.contains("2 batch") && e.contains("batch 3"),
                "{e}"
            );
        }
    }
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
}

/// A fused `scaledDotProductAttention` of nq queries over nk keys keeps one log-sum-exp per
/// query row (B·H·nq floats), its backward gives dK and dV of k's shape, with the same bits
/// from that workspace or recomputed; a mask made for other sizes is an error naming the op
/// and the sizes before anything is allocated or launched.
#[test]
fn the_fused_core_op_over_other_keys_keeps_one_statistic_per_query_row() {
    let mut rnd = Gen::new(37);
    let (heads, d, nq, nk) = (2, 3, 5, 41);
    let p = heads * d;
    let mut tape = CudaTape::new(SimDevice::new());
    let leaves = random_leaves(&mut tape, &mut rnd, &[[nq, p], [nk, p], [nk, p]]);
    let op = |mask| Op::ScaledDotProductAttention {
        heads,
        mask: Some(mask),
        fused: true,
    };
    let y = tape
        .apply(&op(Mask::causal_lower_right(nq, nk).unwrap()), &leaves)
        .unwrap();
    let kept = tape.node(y).unwrap().cleanup().to_vec();
    let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [heads * nq], "lse");
    let (reused, recomputed) =
        backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
    assert_eq!(recomputed - reused, 1, "the fused core again");

    let live = tape.device().memory_usage().live_bytes;
    let launches = tape.device().traffic().launches;
    let e = tape
        .apply(&op(Mask::causal_lower_right(nk, nq).unwrap()), &leaves)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("scaledDotProductAttention")
            && e.contains(&format!("({nk}, {nq})"))
            && e.contains(&nq.to_string())
            && e.contains(&nk.to_string()),
        "{e}"
    );
    assert_eq!(tape.device().memory_usage().live_bytes, live);
    assert_eq!(tape.device().traffic().launches, launches);
}

/// `scaledDotProductAttention` with keys and values of fewer heads than the queries
/// (grouped-query attention: query head h reads key head h / (heads / kv_heads)): multi-query
/// (4 query heads over 1 key head) and groups of 2 and 3 (4 over 2, 6 over 3, 8 over 2), keys
/// of another length (7 over 23, 19 over 5) and the same (17, past the tile), with no mask, the
/// causal lower right and upper left, and a causal key padding per sequence (one sequence of no
/// keys): [`check_sdpa_heads_on_the_tape`], fused and composed against the IR (the spec's
/// reference) and each other.
#[test]
fn scaled_dot_product_attention_takes_keys_of_fewer_heads() {
    let mut g = Gen::new(47);
    for heads in [(4, 1), (4, 2), (6, 3), (8, 2)] {
        let runs = [
            (2, (7, 23), None),
            (2, (19, 5), Some(Mask::causal_lower_right(19, 5).unwrap())),
            (1, (17, 17), Some(Mask::causal(17).unwrap())),
            (3, (7, 23), Some(padded(7, 23, &[23, 9, 0], Some(16)))),
        ];
        for (batch, sizes, mask) in runs {
            check_sdpa_heads_on_the_tape(&mut g, heads, batch, sizes, mask);
        }
    }
}

/// A grouped `scaledDotProductAttention` node (6 query heads over 2 key heads, 5 queries over
/// 41 keys): fused, it keeps one log-sum-exp per query row (H·nq floats) and the backward gives
/// the same bits from it or with the core run again (one launch more); composed, it keeps the
/// (H, nq, nk) probabilities and its backward adds the two group sums (dK, dV) to the launches
/// of one key head per query head. Either way dK and dV have k's (nk, Pk) shape.
#[test]
fn a_grouped_node_keeps_what_the_ungrouped_keeps_and_gives_keys_their_shape() {
    let mut rnd = Gen::new(53);
    let (heads, kv_heads, d, nq, nk) = (6, 2, 3, 5, 41);
    let (p, pk) = (heads * d, kv_heads * d);
    let op = |fused| Op::ScaledDotProductAttention {
        heads,
        mask: Some(Mask::causal_lower_right(nq, nk).unwrap()),
        fused,
    };
    // The launches of a backward from the workspace: grouped fused, grouped composed, then
    // composed with a key head per query head.
    let mut launches = Vec::new();
    for (fused, kv) in [(true, pk), (false, pk), (false, p)] {
        let mut tape = CudaTape::new(SimDevice::new());
        let leaves = random_leaves(&mut tape, &mut rnd, &[[nq, p], [nk, kv], [nk, kv]]);
        let y = tape.apply(&op(fused), &leaves).unwrap();
        let kept = tape.node(y).unwrap().cleanup().to_vec();
        let lens: Vec<usize> = kept.iter().map(|b| b.len()).collect();
        let want = if fused { heads * nq } else { heads * nq * nk };
        assert_eq!(lens, [want], "fused {fused}: lse or the probabilities");
        let (reused, recomputed) =
            backward_from_workspace_then_recomputed(&mut tape, y, &leaves, &kept);
        if fused {
            assert_eq!(recomputed - reused, 1, "the fused core again");
        }
        launches.push(reused);
        let loss = tape.apply(&Op::Sum, &[y]).unwrap();
        let seed = AnyBuffer::full(tape.device_mut(), &Shape::scalar(), 1.0).unwrap();
        let grads = tape.backward_dense(loss, &seed).unwrap();
        for (&id, shape) in leaves.iter().zip([[nq, p], [nk, kv], [nk, kv]]) {
            assert_eq!(grads[id].shape(), &Shape::new(&shape), "fused {fused}");
        }
        tape.release_grads(grads);
    }
    assert_eq!(launches[1], launches[2] + 2, "the group sums of dK and dV");
}

/// k (and v) whose width is not kv_heads·d for a kv_heads dividing heads (P = 12 of 4 heads,
/// d = 3: a width of 9 is 3 key heads, which do not divide 4; 4 is not a multiple of d) is the
/// spec's shape error naming the op and the width, fused or not, before anything is allocated
/// or launched; on the device, sizes whose kv_heads do not divide heads, and K or V of another
/// length than B·nk·Hk·d, are errors naming the primitive before launch.
#[test]
fn keys_of_a_width_no_group_of_heads_has_are_refused_before_launch() {
    let mut rnd = Gen::new(59);
    let mut tape = CudaTape::new(SimDevice::new());
    let (heads, n) = (4, 5);
    let q = random_leaves(&mut tape, &mut rnd, &[[n, 12]])[0];
    for pk in [9, 4] {
        let kv = random_leaves(&mut tape, &mut rnd, &[[n, pk], [n, pk]]);
        let live = tape.device().memory_usage().live_bytes;
        let launches = tape.device().traffic().launches;
        let nodes = tape.len();
        for fused in [true, false] {
            let op = Op::ScaledDotProductAttention {
                heads,
                mask: None,
                fused,
            };
            let e = tape.apply(&op, &[q, kv[0], kv[1]]).unwrap_err().to_string();
            assert!(
                e.contains("scaledDotProductAttention")
                    && e.contains(&format!("Pk = {pk}"))
                    && e.contains("kv_heads"),
                "{e}"
            );
        }
        assert_eq!(tape.device().memory_usage().live_bytes, live);
        assert_eq!(tape.device().traffic().launches, launches);
        assert_eq!(tape.len(), nodes);
    }
    // The device's own checks.
    let mut dev = SimDevice::new();
    let dims = grouped(1, 5, 7, 6, 4, 2);
    let q = dev.upload(&vec![0.5; dims.q_len()]).unwrap();
    let k = dev.upload(&[0.5; 7 * 2 * 2]).unwrap();
    let live = dev.memory_usage().live_bytes;
    let launches = dev.traffic().launches;
    let flash = |dims| Flash::new(dims, FlashMask::none());
    let e = dev
        .flash_attention([q, k, k], &flash(dims))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("flash_attention") && e.contains("kv_heads = 4") && e.contains("heads = 6"),
        "{e}"
    );
    // 3 key heads of 2: K must have 7·3·2 = 42 elements, not the 28 of 2 key heads.
    let e = dev
        .flash_attention([q, k, k], &flash(grouped(1, 5, 7, 6, 3, 2)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 28 element(s), expected 42"), "{e}");
    let e = dev
        .flash_attention_bwd([q, k, k], q, q, q, &flash(grouped(1, 5, 7, 6, 1, 2)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("K has 28 element(s), expected 14"), "{e}");
    assert_eq!(dev.memory_usage().live_bytes, live, "nothing allocated");
    assert_eq!(dev.traffic().launches, launches, "nothing launched");
}
