//! Autocast's products on a tape (docs/semantics.md, "Mixed precision"), one check for every
//! backend: under a precision, the tape's matmul (its value and both gradients, the cotangent
//! rounded as an operand), linear and conv (the bias unrounded) equal the f64 reference on
//! rounded operands within the f32 accumulation bound
//! ([`tl_spec::bf16::accumulation_bound`], valid for every summation order). The caller
//! supplies the tape: [`TapeRun`] runs one op and returns its value and its operands'
//! gradients. The conformance suite runs it on the CPU tape (every bf16 kernel), the CUDA
//! tape on the simulation device and, with `cuda-emu`, on the emulated kernels.
//!
//! [`tape_attention_matches_the_reference`] does the same for attention's core, fused and
//! composed, against the spec's `autocast_reference`, where a probability's rounding may
//! differ by one unit between a path's f32 value and the reference's f64 one.

use tl_ir::Op;
use tl_spec::bf16::accumulation_bound;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::attention::sdpa::autocast_reference;
use tl_spec::ops::conv::ConvParams;
use tl_spec::precision::Precision;
use tl_spec::{Tensor, ops as spec};

/// One op on a tape at a precision: `run(p, op, operands, cotangent)` → the value, then each
/// operand's gradient (dense backward seeded with the cotangent).
pub type TapeRun<'a> = dyn FnMut(Precision, &Op, &[Tensor<f32>], &Tensor<f32>) -> Result<Vec<Tensor<f32>>, String>
    + 'a;

/// The check: `run` at `p` on matmul (9×37·37×33), linear (45 → 11, batch 6) and a 2-D conv
/// (3 → 4 channels, 3×3, padding 1, batch 2 of 7×6), operands drawn from `seed`. `Err` names
/// the product, the element and the bound on the first miss.
pub fn tape_products_match_the_reference(
    run: &mut TapeRun<'_>,
    p: Precision,
    seed: u64,
) -> Result<(), String> {
    let mut draw = Draw(seed);
    let (a, b, g) = (
        draw.tensor(&[9, 37]),
        draw.tensor(&[37, 33]),
        draw.tensor(&[9, 33]),
    );
    let r = run(p, &Op::Matmul, &[a.clone(), b.clone()], &g)?;
    let (ar, br, gr) = (rounded(p, &a), rounded(p, &b), rounded(p, &g));
    let t = |x: &Tensor<f64>| spec::shape::transpose2d(x).map_err(|e| e.to_string());
    let mm =
        |x: &Tensor<f64>, y: &Tensor<f64>| spec::linalg::matmul(x, y).map_err(|e| e.to_string());
    expect(&r, 3, "matmul")?;
    within(
        "matmul",
        &r[0],
        &mm(&ar, &br)?,
        &mm(&abs(&ar), &abs(&br))?,
        37,
    )?;
    let (bt, abs_bt) = (t(&br)?, t(&abs(&br))?);
    within(
        "matmul da",
        &r[1],
        &mm(&gr, &bt)?,
        &mm(&abs(&gr), &abs_bt)?,
        33,
    )?;
    let (at, abs_at) = (t(&ar)?, t(&abs(&ar))?);
    within(
        "matmul db",
        &r[2],
        &mm(&at, &gr)?,
        &mm(&abs_at, &abs(&gr))?,
        9,
    )?;

    let (w, bias, x) = (
        draw.tensor(&[11, 45]),
        draw.tensor(&[11]),
        draw.tensor(&[6, 45]),
    );
    let gy = draw.tensor(&[6, 11]);
    let r = run(p, &Op::Linear, &[w.clone(), bias.clone(), x.clone()], &gy)?;
    expect(&r, 1, "linear")?;
    let b64: Tensor<f64> = bias.cast();
    let (wr, xr) = (rounded(p, &w), rounded(p, &x));
    let lin = |w: &Tensor<f64>, b: &Tensor<f64>, x: &Tensor<f64>| {
        spec::linalg::linear(w, b, x).map_err(|e| e.to_string())
    };
    within(
        "linear",
        &r[0],
        &lin(&wr, &b64, &xr)?,
        &lin(&abs(&wr), &abs(&b64), &abs(&xr))?,
        45,
    )?;

    let (w, bias, x) = (
        draw.tensor(&[4, 3, 3, 3]),
        draw.tensor(&[4]),
        draw.tensor(&[2, 3, 7, 6]),
    );
    let gy = draw.tensor(&[2, 4, 7, 6]);
    let op = Op::Conv {
        stride: vec![1, 1],
        padding: vec![1, 1],
    };
    let r = run(p, &op, &[w.clone(), bias.clone(), x.clone()], &gy)?;
    expect(&r, 1, "conv")?;
    let b64: Tensor<f64> = bias.cast();
    let (wr, xr) = (rounded(p, &w), rounded(p, &x));
    let conv = |w: &Tensor<f64>, b: &Tensor<f64>, x: &Tensor<f64>| {
        let cp = ConvParams {
            stride: &[1, 1],
            padding: &[1, 1],
        };
        spec::conv::conv(w, b, x, cp).map_err(|e| e.to_string())
    };
    within(
        "conv",
        &r[0],
        &conv(&wr, &b64, &xr)?,
        &conv(&abs(&wr), &abs(&b64), &abs(&xr))?,
        27,
    )
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
                flips_only(&format!("{what}: {name}"), got, want)?;
            }
        }
    }
    Ok(())
}

/// `got` within 1e-5 of `want`'s scale (`max(1, ‖want‖∞)`) but on at most 2% of the elements,
/// and within 2⁻⁶ of it everywhere.
fn flips_only(what: &str, got: &Tensor<f32>, want: &Tensor<f64>) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} against the reference's {}",
            got.shape(),
            want.shape()
        ));
    }
    let scale = want.data().iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let mut off = 0;
    for (i, (&g, &w)) in got.data().iter().zip(want.data()).enumerate() {
        let e = (f64::from(g) - w).abs() / scale;
        if e.is_nan() || e > 1.0 / 64.0 {
            return Err(format!("{what} at {i}: {g} against {w} (scale {scale})"));
        }
        off += usize::from(e > 1e-5);
    }
    match off * 50 <= got.data().len() {
        true => Ok(()),
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
fn within(
    what: &str,
    got: &Tensor<f32>,
    want: &Tensor<f64>,
    abs_sum: &Tensor<f64>,
    terms: usize,
) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} against the reference's {}",
            got.shape(),
            want.shape()
        ));
    }
    let all = got.data().iter().zip(want.data()).zip(abs_sum.data());
    for (i, ((&g, &w), &s)) in all.enumerate() {
        let bound = accumulation_bound(terms, s);
        if (f64::from(g) - w).abs() > bound {
            return Err(format!("{what} at {i}: {g} against {w} (bound {bound:e})"));
        }
    }
    Ok(())
}
