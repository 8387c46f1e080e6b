//! Picking the next token from a language model's logits: [`argmax`] (greedy) and [`sample`]
//! (temperature and top-k), on the last position of each sequence. The logits are (B, n, V)
//! (the last of the n positions is used), (B, V), or (V) (one row); the result has one token
//! per row. PyTorch: `logits[:, -1, :].argmax(-1)` and the usual
//! `torch.multinomial(softmax(topk(logits[:, -1] / temperature)), 1)`.

use tl_spec::{Scalar, Tensor};

use crate::error::usage;
use crate::{Result, Rng};

/// The last position's logits of each row: `(rows, V)` values in f64.
fn last_rows<T: Scalar>(
    what: &'static str,
    logits: &Tensor<T>,
) -> Result<(usize, usize, Vec<f64>)> {
    let dims = logits.shape().dims();
    let (rows, n, v) = match *dims {
        [v] => (1, 1, v),
        [b, v] => (b, 1, v),
        [b, n, v] => (b, n, v),
        _ => {
            return Err(usage(
                what,
                format!(
                    "logits must be (B, n, V), (B, V) or (V), got {}",
                    logits.shape()
                ),
            ));
        }
    };
    if v == 0 || n == 0 {
        return Err(usage(
            what,
            format!("logits {} have no position or no token", logits.shape()),
        ));
    }
    let data = logits.data();
    let last = (0..rows).flat_map(|b| {
        let at = (b * n + n - 1) * v;
        data[at..at + v].iter().map(|x| x.as_f64())
    });
    let mut out = tl_spec::alloc::try_with_capacity(what, "logits", rows * v)?;
    out.extend(last);
    if let Some(i) = out.iter().position(|x| x.is_nan()) {
        return Err(usage(
            what,
            format!("logit {} of row {} is NaN", i % v, i / v),
        ));
    }
    Ok((rows, v, out))
}

/// The most likely token of each row's last position (ties: the lowest token).
/// PyTorch: `logits[:, -1, :].argmax(-1)`.
pub fn argmax<T: Scalar>(logits: &Tensor<T>) -> Result<Vec<usize>> {
    let (rows, v, last) = last_rows("sample::argmax", logits)?;
    Ok(Tensor::new(vec![rows, v], last)?.argmax(1)?)
}

/// A token drawn for each row's last position from `softmax(logits / temperature)` restricted
/// to the `top_k` most likely tokens (ties at the cut: the lower tokens; a `top_k` at least V
/// keeps every token), one uniform draw of `rng` per row. `top_k = 0` is an error, and so is a
/// temperature that is not positive and finite (for greedy decoding call [`argmax`]); NaN
/// logits are an error naming the row. `top_k = 1` is [`argmax`], and as the temperature goes
/// to 0 the draw goes to it too. No rows (a batch of 0) give no tokens.
pub fn sample<T: Scalar>(
    logits: &Tensor<T>,
    temperature: f64,
    top_k: usize,
    rng: &mut Rng,
) -> Result<Vec<usize>> {
    const WHAT: &str = "sample::sample";
    if top_k == 0 {
        return Err(usage(WHAT, "top_k must be at least 1, got 0"));
    }
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(usage(
            WHAT,
            format!(
                "the temperature must be positive and finite, got {temperature} (argmax is the greedy choice)"
            ),
        ));
    }
    let (rows, v, last) = last_rows(WHAT, logits)?;
    if rows == 0 {
        // No row, no token (as `argmax`), and no token order of V to allocate: V can be of
        // any size in an empty (0, V).
        return Ok(Vec::new());
    }
    let mut order: Vec<usize> = tl_spec::alloc::try_collect(WHAT, "the token order", v, 0..v)?;
    last.chunks(v)
        .map(|row| {
            // Stable from token order: equal logits keep the lower token first (the order
            // starts over each row, not from the previous row's sort).
            order.iter_mut().enumerate().for_each(|(i, t)| *t = i);
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let kept = &order[..top_k.min(v)];
            let top = row[kept[0]];
            let weights: Vec<f64> = kept
                .iter()
                // Equal to the top (an infinite top included): weight 1.
                .map(|&t| match row[t] == top {
                    true => 1.0,
                    false => ((row[t] - top) / temperature).exp(),
                })
                .collect();
            let mut u = rng.uniform() * weights.iter().sum::<f64>();
            for (&t, w) in kept.iter().zip(&weights) {
                if u < *w {
                    return Ok(t);
                }
                u -= w;
            }
            // Rounding left u at the total: the last kept token with any weight.
            let last = kept.iter().zip(&weights).rev().find(|(_, w)| **w > 0.0);
            Ok(*last.map_or(&kept[0], |(t, _)| t))
        })
        .collect()
}
