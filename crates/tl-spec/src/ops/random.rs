//! Seeded randomness: `randUniform`, `bernoulliMask` and `dropout`, keyed by `(seed, counter)`
//! through [`crate::rng`] (SEMANTICS.md, "Randomness"), so every backend draws the same bits.
//!
//! Element `i` (row-major) of a draw uses `u_i = bits(key(seed, counter), i)`. The mask never
//! carries a gradient; `dropout` is linear in `x` for a fixed key.

use super::same_shape;
use crate::{Error, Result, Scalar, Shape, Tensor, rng};

/// Parameter check of `bernoulliMask`: `keep` in `[0, 1]` (NaN is rejected).
pub fn bernoulli_params(keep: f64) -> Result<()> {
    if (0.0..=1.0).contains(&keep) {
        Ok(())
    } else {
        Err(Error::param(
            "bernoulliMask",
            format!("keep probability must lie in [0, 1], got {keep}"),
        ))
    }
}

/// Parameter check of `dropout`: `keep` in `(0, 1]` (keep = 0 would divide by zero; PyTorch's
/// `p = 1 − keep`, so PyTorch's p = 1 is rejected here).
pub fn dropout_params(keep: f64) -> Result<()> {
    if keep > 0.0 && keep <= 1.0 {
        Ok(())
    } else {
        Err(Error::param(
            "dropout",
            format!("keep probability must lie in (0, 1], got {keep}"),
        ))
    }
}

/// Uniform values in `[0, 1)`: element `i` is `rng::uniform(key(seed, counter), i)` (exactly
/// `u/2³²` in f64; rounded and kept below 1 in f32). PyTorch: `torch.rand(shape)` (other bits).
///
/// The shape comes from the op's parameter: an [`Error::TooLarge`] when
/// it cannot be allocated (see [`crate::alloc`]).
pub fn rand_uniform<T: Scalar>(shape: &Shape, seed: u64, counter: u64) -> Result<Tensor<T>> {
    let k = rng::key(seed, counter);
    Tensor::try_from_fn("randUniform", shape.clone(), |i| rng::uniform(k, i as u64))
}

/// The 0/1 mask: element `i` is 1 if `keep > u_i/2³²`, else 0. PyTorch:
/// `torch.bernoulli(torch.full(shape, keep))` (other bits).
///
/// An [`Error::TooLarge`] when the shape cannot be allocated.
pub fn bernoulli_mask<T: Scalar>(
    shape: &Shape,
    keep: f64,
    seed: u64,
    counter: u64,
) -> Result<Tensor<T>> {
    let k = rng::key(seed, counter);
    Tensor::try_from_fn("bernoulliMask", shape.clone(), |i| {
        if rng::keep(k, i as u64, keep) {
            T::one()
        } else {
            T::zero()
        }
    })
}

/// `(x · mask) · s` with `s = 1/keep` rounded to `T` and the mask of [`bernoulli_mask`] over x's
/// shape: kept elements are scaled by `1/keep`, dropped ones are 0. PyTorch:
/// `F.dropout(x, p = 1 − keep, training=True)` (other bits).
pub fn dropout<T: Scalar>(x: &Tensor<T>, keep: f64, seed: u64, counter: u64) -> Result<Tensor<T>> {
    let k = rng::key(seed, counter);
    let s = T::lit(1.0 / keep);
    let mut out = crate::alloc::try_copy("dropout", "output", x.data())?;
    for (i, v) in out.iter_mut().enumerate() {
        *v = if rng::keep(k, i as u64, keep) {
            *v * s
        } else {
            T::zero()
        };
    }
    Tensor::new(x.shape().clone(), out)
}

/// VJP of `dropout`: `(g · mask) · s`, the same mask as the forward (same key, same shape).
pub fn dropout_vjp<T: Scalar>(
    x: &Tensor<T>,
    keep: f64,
    seed: u64,
    counter: u64,
    g: &Tensor<T>,
) -> Result<Tensor<T>> {
    same_shape("dropout", x, g)?;
    dropout(g, keep, seed, counter)
}

/// JVP of `dropout`: `(dx · mask) · s` (dropout is linear in x for a fixed key).
pub fn dropout_jvp<T: Scalar>(
    x: &Tensor<T>,
    keep: f64,
    seed: u64,
    counter: u64,
    dx: &Tensor<T>,
) -> Result<Tensor<T>> {
    same_shape("dropout", x, dx)?;
    dropout(dx, keep, seed, counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_keyed_bits() {
        let s = Shape::new(&[3, 4]);
        let u = rand_uniform::<f64>(&s, 42, 7).unwrap();
        let k = rng::key(42, 7);
        for (i, &v) in u.data().iter().enumerate() {
            assert_eq!(v * 4_294_967_296.0, f64::from(rng::bits(k, i as u64)));
        }
        // Another counter is another draw; seed + counter is what is keyed.
        assert_ne!(rand_uniform::<f64>(&s, 42, 8).unwrap(), u);
        assert_eq!(rand_uniform::<f64>(&s, 43, 6).unwrap(), u);
        let m = bernoulli_mask::<f64>(&s, 0.5, 42, 7).unwrap();
        for (&mv, &uv) in m.data().iter().zip(u.data()) {
            assert_eq!(mv, if 0.5 > uv { 1.0 } else { 0.0 });
        }
        let all = bernoulli_mask::<f32>(&s, 1.0, 1, 2).unwrap();
        assert!(all.data().iter().all(|&v| v == 1.0));
        let none = bernoulli_mask::<f32>(&s, 0.0, 1, 2).unwrap();
        assert!(none.data().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn dropout_scales_kept_elements_and_its_gradient_uses_the_same_mask() {
        let x = Tensor::<f64>::from_fn([50], |i| i as f64 + 1.0);
        let y = dropout(&x, 0.25, 3, 0).unwrap();
        let m = bernoulli_mask::<f64>(x.shape(), 0.25, 3, 0).unwrap();
        for ((&y, &m), &x) in y.data().iter().zip(m.data()).zip(x.data()) {
            assert_eq!(y, m * x * 4.0);
        }
        let g = Tensor::<f64>::ones([50]);
        assert_eq!(dropout_vjp(&x, 0.25, 3, 0, &g).unwrap(), m.map(|v| v * 4.0));
        assert!(bernoulli_params(1.5).is_err() && bernoulli_params(f64::NAN).is_err());
        assert!(bernoulli_params(0.0).is_ok() && dropout_params(0.0).is_err());
        assert!(dropout_params(1.0).is_ok() && dropout_params(-0.1).is_err());
    }

    /// Issue 14: a draw whose shape cannot be allocated is an error naming the op, not an abort
    /// ("memory allocation of … bytes failed") or a "capacity overflow" panic.
    #[test]
    fn draws_too_large_to_allocate_are_errors() {
        for dims in [vec![1usize << 62], vec![1 << 40, 1 << 20]] {
            let s = Shape::new(&dims);
            let e = rand_uniform::<f32>(&s, 1, 0).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::TooLarge {
                        op: "randUniform",
                        ..
                    }
                ),
                "{e}"
            );
            let e = bernoulli_mask::<f64>(&s, 0.5, 1, 0).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::TooLarge {
                        op: "bernoulliMask",
                        ..
                    }
                ),
                "{e}"
            );
        }
        // An empty draw is fine whatever the other dims.
        let empty = rand_uniform::<f32>(&Shape::new(&[1 << 62, 0]), 1, 0).unwrap();
        assert_eq!(empty.numel(), 0);
    }
}
