//! Autocast's products on a tape (docs/semantics.md, "Mixed precision"), one check for every
//! backend: under a precision, the tape's matmul (its value and both gradients, the cotangent
//! rounded as an operand), linear and conv (the bias unrounded) equal the f64 reference on
//! rounded operands within the f32 accumulation bound
//! ([`tl_spec::bf16::accumulation_bound`], valid for every summation order). The caller
//! supplies the tape: [`TapeRun`] runs one op and returns its value and its operands'
//! gradients. The conformance suite runs it on the CPU tape (every bf16 kernel), the CUDA
//! tape on the simulation device and, with `cuda-emu`, on the emulated kernels.

use tl_ir::Op;
use tl_spec::bf16::accumulation_bound;
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
