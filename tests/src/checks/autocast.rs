//! Autocast's products on a tape (docs/semantics.md, "Mixed precision"), one check for every
//! backend: under a precision, the tape's matmul, linear and conv (their values and every
//! gradient, the cotangent rounded as an operand, the bias unrounded) equal the f64 reference
//! on rounded operands within the f32 accumulation bound
//! ([`tl_spec::bf16::accumulation_bound`], valid for every summation order). The caller
//! supplies the tape: [`TapeRun`] runs one op and returns its value and its operands'
//! gradients. The conformance suite runs it on the CPU tape (every bf16 kernel), the CUDA
//! tape on the simulation device and, with `cuda-emu`, on the emulated kernels.
//!
//! [`tape_attention_matches_the_reference`] does the same for attention's core, fused and
//! composed, against the spec's `autocast_reference`, where a probability's rounding may
//! differ by one unit between a path's f32 value and the reference's f64 one.
//! [`mha::tape_mha_matches_its_composition`] holds `multiHeadAttention` to its pieces (the
//! projections' `matmul`s, the core, the output `matmul`) run one at a time on the same tape.
//!
//! [`check_products`] runs the product ops' registry entries (matmul, bmm, linear, conv,
//! convTranspose: [`rounded_operands`]) through a tape at a precision on every case the
//! registry generates, small and large (every rank, stride, padding and batch the entries
//! draw, past the CPU GEMM's layout and thread-split sizes), the value and every operand's
//! gradient against the op's own value and VJP rules (the IR's) on the rounded operands,
//! within the accumulation bound.

use std::cell::RefCell;

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Tensor;
use tl_spec::bf16::accumulation_bound;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::attention::sdpa::autocast_reference;
use tl_spec::precision::Precision;

use crate::checks::reduction_len;
use crate::generate::direction;
use crate::{CaseResult, Measured, OpCase, OpInfo, Report, RunConfig, run_check};

pub mod mha;

/// One op on a tape at a precision: `run(p, op, operands, cotangent)` → the value, then each
/// operand's gradient (dense backward seeded with the cotangent).
pub type TapeRun<'a> = dyn FnMut(Precision, &Op, &[Tensor<f32>], &Tensor<f32>) -> Result<Vec<Tensor<f32>>, String>
    + 'a;

/// The check: `run` at `p` on matmul (9×37·37×33), linear (45 → 11, batch 6) and a 2-D conv
/// (3 → 4 channels, 3×3, padding 1, batch 2 of 7×6), operands and cotangents drawn from
/// `seed`, each as [`product_case`] holds it: the value and every operand's gradient. `Err`
/// names the product, the result, the element and the bound on the first miss.
pub fn tape_products_match_the_reference(
    run: &mut TapeRun<'_>,
    p: Precision,
    seed: u64,
) -> Result<(), String> {
    let mut draw = Draw(seed);
    let conv = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    // Each product: the op, its operands' shapes, its output's.
    type Fixed = (Op, &'static [&'static [usize]], &'static [usize]);
    let cases: [Fixed; 3] = [
        (Op::Matmul, &[&[9, 37], &[37, 33]], &[9, 33]),
        (Op::Linear, &[&[11, 45], &[11], &[6, 45]], &[6, 11]),
        (conv, &[&[4, 3, 3, 3], &[4], &[2, 3, 7, 6]], &[2, 4, 7, 6]),
    ];
    for (op, shapes, out) in cases {
        let inputs = shapes.iter().map(|s| draw.tensor(s).cast()).collect();
        let g = draw.tensor(out).cast();
        product_case(run, p, &OpCase::new(op, inputs), &g)?;
    }
    Ok(())
}

/// The operands a product op reads rounded under autocast, by position: both of `matmul`'s
/// and `bmm`'s; the weight and the input of `linear`, `conv` and `convTranspose` (operands
/// `(w, b, x)`: the bias is added to the f32 product unrounded, and its gradient is the sum
/// of the unrounded cotangent). `None` for every other op: attention rounds inside the op
/// ([`tape_attention_matches_the_reference`]), the rest read f32 operands.
pub fn rounded_operands(op: &Op) -> Option<&'static [usize]> {
    match op {
        Op::Matmul | Op::Bmm => Some(&[0, 1]),
        Op::Linear | Op::Conv { .. } | Op::ConvTranspose { .. } => Some(&[0, 2]),
        _ => None,
    }
}

/// The registry entries [`check_products`] runs: those of the ops with
/// [`rounded_operands`].
pub fn product_entries() -> Vec<OpInfo> {
    // One op of each kind: `entry_of` matches any parameters.
    [
        Op::Matmul,
        Op::Bmm,
        Op::Linear,
        Op::Conv {
            stride: Vec::new(),
            padding: Vec::new(),
        },
        Op::ConvTranspose {
            stride: Vec::new(),
            padding: Vec::new(),
        },
    ]
    .iter()
    .filter_map(crate::registry::entry_of)
    .collect()
}

/// `autocast <p> <op> <name>`: `run` at `p` on `cfg.cases` cases of `entry` (three small
/// for every large one, as checks 1 and 2 draw them) with a cotangent in `[-1, 1]`
/// ([`product_case`]).
pub fn check_products(
    entry: &OpInfo,
    cfg: &RunConfig,
    p: Precision,
    name: &str,
    run: &mut TapeRun<'_>,
) -> Report {
    let run = RefCell::new(run);
    let cases = entry
        .mixed_cases()
        .prop_flat_map(|c| {
            let g = direction(c.out_shape());
            (Just(c), g)
        })
        .boxed();
    run_check(
        format!("autocast {} {} {name}", p.name(), entry.name),
        cfg,
        cases,
        |(c, g)| product_case(&mut **run.borrow_mut(), p, c, g),
    )
}

/// One case of [`check_products`]: `run` at `p` on `case.op` with the case's operands and
/// the cotangent `g`, both rounded to f32. The value and the gradients of the rounded
/// operands ([`rounded_operands`]) against the op's value and VJP (the IR's rules, in f64)
/// on the rounded operands and cotangent; the bias's gradient against the VJP at the
/// unrounded cotangent. Each element within [`accumulation_bound`] of the products it sums
/// (the same rules on the operands' absolute values), counting the case's longest reduction
/// ([`reduction_len`]) as its terms. The measurement is the largest error over its bound
/// (tolerance 1). `Err` names the op, the result and the element.
pub fn product_case(
    run: &mut TapeRun<'_>,
    p: Precision,
    case: &OpCase,
    g: &Tensor<f64>,
) -> CaseResult {
    let op = &case.op;
    let rounds = rounded_operands(op).ok_or_else(|| format!("{op}: not a product op"))?;
    let x: Vec<Tensor<f32>> = case.inputs.iter().map(Tensor::cast).collect();
    let g32: Tensor<f32> = g.cast();
    let got = run(p, op, &x, &g32)?;
    expect(&got, 1 + x.len(), &op.to_string())?;
    let xr: Vec<Tensor<f64>> = x
        .iter()
        .enumerate()
        .map(|(k, t)| match rounds.contains(&k) {
            true => rounded(p, t),
            false => t.cast(),
        })
        .collect();
    let xa: Vec<Tensor<f64>> = xr.iter().map(abs).collect();
    let (graph, out) = case.graph(&vec![true; x.len()]);
    let terms = reduction_len(&graph);
    let err = |e: tl_ir::Error| format!("{op}: the reference: {e}");
    let eval = |leaves: &[Tensor<f64>]| graph.eval(leaves, &case.nats).map_err(err);
    let (vr, va) = (eval(&xr)?, eval(&xa)?);
    let grads = |values: &[Tensor<f64>], seed: &Tensor<f64>| {
        let g = graph.backprop_values(values, &case.nats, out, seed);
        g.map_err(err)
    };
    let mut worst = within(&format!("{op} value"), &got[0], &vr[out], &va[out], terms)?;
    // The rounded operands' gradients at the rounded cotangent; the bias's (linear, conv,
    // convTranspose) at the unrounded one.
    let gr = rounded(p, &g32);
    let (at_rounded, at_rounded_abs) = (grads(&vr, &gr)?, grads(&va, &abs(&gr))?);
    let plain = match rounds.len() < x.len() {
        true => {
            let g64: Tensor<f64> = g32.cast();
            Some((grads(&vr, &g64)?, grads(&va, &abs(&g64))?))
        }
        false => None,
    };
    for (k, got) in got[1..].iter().enumerate() {
        let (want, abs_sum) = match (rounds.contains(&k), &plain) {
            (false, Some((g, a))) => (&g[k], &a[k]),
            _ => (&at_rounded[k], &at_rounded_abs[k]),
        };
        let what = format!("{op} gradient of operand {k}");
        worst = worst.max(within(&what, got, want, abs_sum, terms)?);
    }
    Ok(worst)
}

/// The check for attention: `run` at `p` on `scaledDotProductAttention`, composed and fused
/// (the seeds' `useFlash`), on a padded batch (B = 2, 19 queries over 27 keys under the
/// lower-right causal mask, the second sequence's last 7 keys hidden, 4 query heads over 2 key
/// heads of 8) and on 33 positions of 2 heads of 16 with no mask, operands drawn from `seed`,
/// against [`autocast_reference`] (every product's operands rounded, the probabilities and
/// dS included). Each result within 1e-5 of its scale (`max(1, ‖reference‖∞)`) but where the
/// path's f32 probability (or dS) and the reference's round to neighbouring values, one term
/// off by one unit of the rounding: at most 2% of the elements, none off by more than 2⁻⁶ of
/// the scale. A path that does not round the probabilities and dS is off on far more. `Err`
/// names the op, the path, the result and the count (or the element) on the first miss.
pub fn tape_attention_matches_the_reference(
    run: &mut TapeRun<'_>,
    p: Precision,
    seed: u64,
) -> Result<(), String> {
    attention_case(run, p, seed).map(|_| ())
}

/// `autocast <p> scaledDotProductAttention <name>`: [`tape_attention_matches_the_reference`]
/// as a check of one case (its fixed shapes, the operands drawn from one seed: the flips'
/// allowance is for a fixed draw, not for any number of them). The measurement is the larger
/// of the elements off by more than 1e-5 of the scale over the 2% allowed and the worst error
/// over 2⁻⁶ of the scale (tolerance 1). `check_backend` runs it on a backend whose products
/// round ([`crate::Backend::precision`]) and which has the op.
pub fn check_attention(cfg: &RunConfig, p: Precision, name: &str, run: &mut TapeRun<'_>) -> Report {
    let run = RefCell::new(run);
    let one = RunConfig { cases: 1, ..*cfg };
    run_check(
        format!("autocast {} scaledDotProductAttention {name}", p.name()),
        &one,
        Just(47u64),
        |&seed| attention_case(&mut **run.borrow_mut(), p, seed),
    )
}

/// [`tape_attention_matches_the_reference`], measured as [`check_attention`] says.
fn attention_case(run: &mut TapeRun<'_>, p: Precision, seed: u64) -> CaseResult {
    let mut worst = Measured::ZERO;
    let mut draw = Draw(seed);
    let padded = Mask::from_fn_batched(2, 19, 27, |b, i, j| j <= i + 8 && j < [27, 20][b])
        .map_err(|e| e.to_string())?;
    let cases = [
        ([2, 19, 32], [2, 27, 16], 4, Some(padded)),
        ([1, 33, 32], [1, 33, 32], 2, None),
    ];
    for (qs, ks, heads, mask) in cases {
        let (q, k, v, g) = (
            draw.tensor(&qs),
            draw.tensor(&ks),
            draw.tensor(&ks),
            draw.tensor(&qs),
        );
        let want = autocast_reference(p, [&q, &k, &v], heads, mask.as_ref(), &g)
            .map_err(|e| e.to_string())?;
        for fused in [false, true] {
            let op = Op::ScaledDotProductAttention {
                heads,
                mask: mask.clone(),
                fused,
            };
            let what = format!("scaledDotProductAttention (fused = {fused}, {p:?})");
            let r = run(p, &op, &[q.clone(), k.clone(), v.clone()], &g)?;
            expect(&r, 4, &what)?;
            for (name, (got, want)) in ["value", "dq", "dk", "dv"].iter().zip(r.iter().zip(&want)) {
                worst = worst.max(flips_only(&format!("{what}: {name}"), got, want)?);
            }
        }
    }
    Ok(worst)
}

/// `got` within 1e-5 of `want`'s scale (`max(1, ‖want‖∞)`) but on at most 2% of the elements,
/// and within 2⁻⁶ of it everywhere. The measurement: the larger of the share off by more than
/// 1e-5 over 2% and the worst error over 2⁻⁶ of the scale (tolerance 1).
fn flips_only(what: &str, got: &Tensor<f32>, want: &Tensor<f64>) -> CaseResult {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} against the reference's {}",
            got.shape(),
            want.shape()
        ));
    }
    let scale = want.data().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let (mut off, mut worst) = (0, 0.0f64);
    for (i, (&g, &w)) in got.data().iter().zip(want.data()).enumerate() {
        let e = (f64::from(g) - w).abs() / scale;
        if e.is_nan() || e > 1.0 / 64.0 {
            return Err(format!("{what} at {i}: {g} against {w} (scale {scale})"));
        }
        off += usize::from(e > 1e-5);
        worst = worst.max(e * 64.0);
    }
    let len = got.data().len();
    match off * 50 <= len {
        true => Ok(Measured {
            err: worst.max((off * 50) as f64 / len.max(1) as f64),
            tol: 1.0,
        }),
        false => Err(format!(
            "{what}: {off} of {} elements beyond 1e-5 of the scale (at most 2%)",
            got.data().len()
        )),
    }
}

/// Uniform values in [−2, 2) from a SplitMix64 stream.
struct Draw(u64);

impl Draw {
    fn tensor(&mut self, shape: &[usize]) -> Tensor<f32> {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = self.0;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                ((z >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
            })
            .collect();
        Tensor::new(shape, data).expect("the data has the shape's length")
    }
}

fn rounded(p: Precision, t: &Tensor<f32>) -> Tensor<f64> {
    t.map(|x| p.round(x)).cast()
}

fn abs(t: &Tensor<f64>) -> Tensor<f64> {
    t.map(f64::abs)
}

fn expect(r: &[Tensor<f32>], at_least: usize, what: &str) -> Result<(), String> {
    match r.len() >= at_least {
        true => Ok(()),
        false => Err(format!(
            "{what}: the run gave {} tensors, expected {at_least}",
            r.len()
        )),
    }
}

/// `got` within the f32 accumulation bound (`terms` products) of `want`, with `abs_sum` the
/// same computation on absolute values.
/// The measurement is the largest error over its element's bound (tolerance 1).
fn within(
    what: &str,
    got: &Tensor<f32>,
    want: &Tensor<f64>,
    abs_sum: &Tensor<f64>,
    terms: usize,
) -> CaseResult {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} against the reference's {}",
            got.shape(),
            want.shape()
        ));
    }
    let mut worst = 0.0f64;
    let all = got.data().iter().zip(want.data()).zip(abs_sum.data());
    for (i, ((&g, &w), &s)) in all.enumerate() {
        let bound = accumulation_bound(terms, s);
        let e = (f64::from(g) - w).abs();
        if e.is_nan() || e > bound {
            return Err(format!("{what} at {i}: {g} against {w} (bound {bound:e})"));
        }
        worst = worst.max(e / bound);
    }
    Ok(Measured {
        err: worst,
        tol: 1.0,
    })
}
