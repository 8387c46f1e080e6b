//! The fused ("flash") attention core (`Device::flash_attention`, `flash_attention_bwd`;
//! kernels/attention.cu and its sim twin) against an f64 reference of softmax attention, as
//! many keys as queries or not (nq ≠ nk: cross-attention, a KV cache), and
//! `multiHeadAttention { fused: true }` on the CUDA tape: its value and gradients against the
//! composed path and the IR, the memory it keeps, its launches, its errors.
//!
//! The shared cases ([`cases`], [`run_core`]) also run on the kernel emulator and a GPU
//! (gpu.rs), where they must give the sim's bits (emulator) or its values within 1e-5 (GPU).
//!
//! Modules: [`reference`] (the core against the f64 reference), [`autocast`], [`tape`] (the fused
//! `multiHeadAttention` node), [`sdpa`] (`scaledDotProductAttention`: other key lengths,
//! masks per batch element, grouped heads).

mod autocast;
mod graphs;
mod reference;
mod sdpa;
mod tape;

use crate::common::{Domain, Gen, check_graph, draw, random_leaves};
use graphs::*;
use tl_ir::{GraphBuilder, Op};
use tl_spec::ops::attention::Mask;
use tl_spec::{Shape, Tensor};
use tl_tape_cuda::device::{
    FLASH_BITS, FLASH_KEEP, FLASH_MAX_HEAD, FLASH_TC_MAX_HEAD, Flash, FlashDims, FlashMask,
    FlashProducts,
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

/// The cases the tensor-core kernels take (d ≤ [`FLASH_TC_MAX_HEAD`]).
pub fn tc_cases() -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|c| c.dims.d <= FLASH_TC_MAX_HEAD)
        .collect()
}

fn bits_of(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}
