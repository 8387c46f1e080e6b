//! `multiHeadAttention` under autocast, held to its composition on the same tape.
//!
//! An f64 reference of the whole op cannot hold it tightly: the op rounds its projections
//! Q, K and V (f32 sums) before the core's products read them, and the reference's f64 sums
//! round to the neighbouring bf16 value at a few elements, which moves a whole row of the
//! output (and every key's dK, dV) by a unit of the rounding. So the op is held to the ops it
//! is made of, run one at a time on the same tape: each projection a `matmul`, the core a
//! `scaledDotProductAttention`, the output a `matmul`. Those are held to the f64 reference by
//! the module above ([`super::check_products`], [`super::tape_attention_matches_the_reference`]),
//! so the op is too, without a tolerance where a rounding flips.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_spec::ops::attention::Mask;
use tl_spec::ops::shape::transpose2d;
use tl_spec::precision::Precision;

use super::{Draw, TapeRun, expect, within};

/// The check: `run` at `p` on `multiHeadAttention`, fused and composed (the seeds'
/// `useFlash`), on a padded causal batch (B = 2, 19 positions of width 24, 4 heads of 8, the
/// second sequence's last 7 keys hidden), on 33 unbatched positions of width 16 (2 heads of
/// 16, no mask) and on one causal sequence of 21 (4 heads of 4), operands and cotangent drawn
/// from `seed`, against the same tape's composition: `matmul` of x's rows by each of wq, wk
/// and wv, `scaledDotProductAttention` (the op's heads, mask and `fused`) on the three,
/// `matmul` of its rows by wo, each run by `run` on its own and the backward chained by hand
/// (the cotangent into the last product, its operand's gradient dC into the core, the core's
/// dQ, dK and dV into the projections).
///
/// The value and the gradients of wq, wk, wv and wo must equal the composition's bit for bit:
/// the op runs the same products on the same rounded operands. x's gradient sums three
/// products, which the op may add in another order: it must be within the accumulation bound
/// (3·P terms) of the f64 sum `Σ round(dQ)·round(wq)ᵀ + …` on the composition's dQ, dK and dV.
/// `Err` names the op, the path, the result and the first element that misses.
pub fn tape_mha_matches_its_composition(
    run: &mut TapeRun<'_>,
    p: Precision,
    seed: u64,
) -> Result<(), String> {
    let s = |e: tl_spec::Error| e.to_string();
    let padded =
        Mask::from_fn_batched(2, 19, 19, |b, i, j| j <= i && j < [19, 12][b]).map_err(s)?;
    let causal = Mask::causal(21).map_err(s)?;
    // Batch (none: an unbatched x), positions, model width, projection width P, heads, mask.
    let cases = [
        (Some(2), 19, 24, 32, 4, Some(padded)),
        (None, 33, 16, 32, 2, None),
        (Some(1), 21, 8, 16, 4, Some(causal)),
    ];
    let mut draw = Draw(seed);
    for (batch, n, dm, width, heads, mask) in cases {
        let x_shape: Vec<usize> = batch.into_iter().chain([n, dm]).collect();
        let x = Operands {
            w: [
                draw.tensor(&[dm, width]),
                draw.tensor(&[dm, width]),
                draw.tensor(&[dm, width]),
                draw.tensor(&[width, dm]),
            ],
            x: draw.tensor(&x_shape),
        };
        let g = draw.tensor(&x_shape);
        for fused in [false, true] {
            let what = format!(
                "multiHeadAttention (fused = {fused}, {p:?}, x {x_shape:?}, {heads} heads)"
            );
            let op = Op::MultiHeadAttention {
                heads,
                mask: mask.clone(),
                fused,
            };
            let [wq, wk, wv, wo] = x.w.clone();
            let got = run(p, &op, &[wq, wk, wv, wo, x.x.clone()], &g)?;
            expect(&got, 6, &what)?;
            let sdpa = Op::ScaledDotProductAttention {
                heads,
                mask: mask.clone(),
                fused,
            };
            let want = composed(run, p, &sdpa, &x, &g).map_err(|e| format!("{what}: {e}"))?;
            let names = [
                "value",
                "wq's gradient",
                "wk's gradient",
                "wv's gradient",
                "wo's gradient",
            ];
            for (name, (got, want)) in names.iter().zip(got.iter().zip(&want.exact)) {
                identical(&format!("{what}: {name}"), got, want)?;
            }
            let (dx, dx_abs) = &want.dx;
            within(
                &format!("{what}: x's gradient"),
                &got[5],
                dx,
                dx_abs,
                3 * width,
            )?;
        }
    }
    Ok(())
}

/// `multiHeadAttention`'s operands: the weights wq, wk, wv ((dModel, P)) and wo ((P, dModel)),
/// and x ((n, dModel) or (B, n, dModel)).
struct Operands {
    w: [Tensor<f32>; 4],
    x: Tensor<f32>,
}

/// What the composition gives: the value (x's shape) and wq's, wk's, wv's and wo's gradients,
/// which the op must match bit for bit; x's gradient as the f64 reference of its three
/// products and the same sums on absolute values ([`within`]'s bound).
struct Composed {
    exact: [Tensor<f32>; 5],
    dx: (Tensor<f64>, Tensor<f64>),
}

/// `multiHeadAttention` at `p` composed of `matmul`s and the core `sdpa`, each run by `run`.
fn composed(
    run: &mut TapeRun<'_>,
    p: Precision,
    sdpa: &Op,
    x: &Operands,
    g: &Tensor<f32>,
) -> Result<Composed, String> {
    let s = |e: tl_spec::Error| e.to_string();
    let dims = x.x.shape().dims();
    let (dm, width) = (dims[dims.len() - 1], x.w[0].shape().dims()[1]);
    let rows = x.x.numel() / dm;
    // The core's operands: x's leading axes, then P.
    let qkv_shape: Vec<usize> = dims[..dims.len() - 1]
        .iter()
        .copied()
        .chain([width])
        .collect();
    let x_rows = x.x.reshape([rows, dm]).map_err(s)?;
    let mut one = |op: &Op, operands: &[Tensor<f32>], g: &Tensor<f32>, n: usize| {
        let r = run(p, op, operands, g)?;
        expect(&r, n, &op.to_string())?;
        Ok::<_, String>(r)
    };
    // The forward: each projection's value (a zero cotangent), the core's value.
    let zeros = Tensor::zeros([rows, width]);
    let mut qkv = Vec::with_capacity(3);
    for w in &x.w[..3] {
        let r = one(&Op::Matmul, &[x_rows.clone(), w.clone()], &zeros, 3)?;
        qkv.push(r[0].reshape(qkv_shape.clone()).map_err(s)?);
    }
    let c = one(sdpa, &qkv, &Tensor::zeros(qkv_shape.clone()), 4)?;
    // The backward, from the output product down.
    let c_rows = c[0].reshape([rows, width]).map_err(s)?;
    let g_rows = g.reshape([rows, dm]).map_err(s)?;
    let out = one(&Op::Matmul, &[c_rows, x.w[3].clone()], &g_rows, 3)?;
    let dc = out[1].reshape(qkv_shape.clone()).map_err(s)?;
    let core = one(sdpa, &qkv, &dc, 4)?;
    let mut dw = Vec::with_capacity(3);
    let mut dx = Tensor::<f64>::zeros([rows, dm]);
    let mut dx_abs = Tensor::<f64>::zeros([rows, dm]);
    for (w, d) in x.w[..3].iter().zip(&core[1..]) {
        let d_rows = d.reshape([rows, width]).map_err(s)?;
        let r = one(&Op::Matmul, &[x_rows.clone(), w.clone()], &d_rows, 3)?;
        dw.push(r[2].clone());
        let wt = transpose2d(w).map_err(s)?;
        dx.add_assign(&p.matmul_reference(&d_rows, &wt).map_err(s)?)
            .map_err(s)?;
        let abs_ref = p
            .matmul_reference(&d_rows.map(f32::abs), &wt.map(f32::abs))
            .map_err(s)?;
        dx_abs.add_assign(&abs_ref).map_err(s)?;
    }
    let value = out[0].reshape(dims.to_vec()).map_err(s)?;
    let [dwq, dwk, dwv] = <[Tensor<f32>; 3]>::try_from(dw).map_err(|_| "three projections")?;
    let reshape = |t: Tensor<f64>| t.reshape(dims.to_vec()).map_err(s);
    Ok(Composed {
        exact: [value, dwq, dwk, dwv, out[2].clone()],
        dx: (reshape(dx)?, reshape(dx_abs)?),
    })
}

/// `got` equal to `want` bit for bit (shapes included).
fn identical(what: &str, got: &Tensor<f32>, want: &Tensor<f32>) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shape {} against the composition's {}",
            got.shape(),
            want.shape()
        ));
    }
    let pairs = got.data().iter().zip(want.data());
    match pairs
        .enumerate()
        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
    {
        None => Ok(()),
        Some((i, (a, b))) => Err(format!(
            "{what} at {i}: {a:e} against the composition's {b:e} (the same bits expected)"
        )),
    }
}
