//! Seeded randomness: `randUniform`, `bernoulliMask` (no operands, no gradient) and `dropout`.
//!
//! The bits come from [`tl_spec::rng`], the one copy of the SplitMix64 keying that every backend
//! shares (it is a convention, not a reference rule: the CPU, the IR and the CUDA simulation must
//! draw the same bits). Dropout is `(x · mask) · s` with `s = 1/keep` rounded to `T`, the same
//! arithmetic as the CUDA tape's `mul` then `scale`, so f32 results agree bit for bit.

use smallvec::smallvec;
use tl_ir::Op;
use tl_spec::{Scalar, Tensor, rng};

use super::{Grads, check_arity, check_shape, tensor, wrong_family};
use crate::Result;

/// Forward value of `randUniform`, `bernoulliMask` or `dropout`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    check_arity(op, x)?;
    match op {
        Op::RandUniform {
            shape,
            seed,
            counter,
        } => {
            tl_spec::alloc::check_shape::<T>(op.name(), shape)?;
            let k = rng::key(*seed, *counter);
            let n = shape.numel();
            let draws = (0..n as u64).map(|i| rng::uniform::<T>(k, i));
            let data = tl_spec::alloc::try_collect(op.name(), "output", n, draws)?;
            tensor(shape.clone(), data)
        }
        Op::BernoulliMask {
            shape,
            keep,
            seed,
            counter,
        } => {
            tl_spec::alloc::check_shape::<T>(op.name(), shape)?;
            let k = rng::key(*seed, *counter);
            let n = shape.numel();
            let draws = (0..n as u64).map(|i| {
                if rng::keep(k, i, *keep) {
                    T::one()
                } else {
                    T::zero()
                }
            });
            let data = tl_spec::alloc::try_collect(op.name(), "output", n, draws)?;
            tensor(shape.clone(), data)
        }
        Op::Dropout {
            keep,
            seed,
            counter,
        } => masked(op, x[0], *keep, *seed, *counter),
        _ => Err(wrong_family(op, "random")),
    }
}

/// Operand cotangents: none for the draws, `(g · mask) · s` with the forward's mask for dropout.
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    _y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    check_arity(op, x)?;
    match op {
        Op::RandUniform { .. } | Op::BernoulliMask { .. } => Ok(Grads::new()),
        Op::Dropout {
            keep,
            seed,
            counter,
        } => {
            check_shape(op, "cotangent", g, x[0].shape())?;
            Ok(smallvec![Some(masked(op, g, *keep, *seed, *counter)?)])
        }
        _ => Err(wrong_family(op, "random")),
    }
}

/// `(v · mask) · (1/keep)` elementwise, the mask keyed by `(seed, counter)` over v's shape.
fn masked<T: Scalar>(
    op: &Op,
    v: &Tensor<T>,
    keep: f64,
    seed: u64,
    counter: u64,
) -> Result<Tensor<T>> {
    let k = rng::key(seed, counter);
    let s = T::lit(1.0 / keep);
    let values = v.data().iter().enumerate().map(|(i, &a)| {
        let m = if rng::keep(k, i as u64, keep) {
            T::one()
        } else {
            T::zero()
        };
        (a * m) * s
    });
    let data = tl_spec::alloc::try_collect(op.name(), "output", v.numel(), values)?;
    tensor(v.shape().clone(), data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tl_spec::Shape;

    #[test]
    fn draws_are_keyed_by_seed_plus_counter() {
        let shape = Shape::new(&[4, 5]);
        let op = |seed, counter| Op::RandUniform {
            shape: shape.clone(),
            seed,
            counter,
        };
        let a = forward::<f32>(&op(10, 2), &[]).unwrap();
        assert_eq!(a, forward::<f32>(&op(11, 1), &[]).unwrap());
        assert_ne!(a, forward::<f32>(&op(10, 3), &[]).unwrap());
        let k = rng::key(10, 2);
        for (i, &v) in a.data().iter().enumerate() {
            let u = f64::from(rng::bits(k, i as u64)) / 4_294_967_296.0;
            assert_eq!(v, (u as f32).min(1.0 - f32::EPSILON / 2.0));
        }
    }

    #[test]
    fn dropout_backward_reuses_the_forward_mask() {
        let op = Op::Dropout {
            keep: 0.5,
            seed: 1,
            counter: 9,
        };
        let x = Tensor::<f64>::full([64], 3.0);
        let y = forward(&op, &[&x]).unwrap();
        let g = Tensor::<f64>::ones([64]);
        let dx = backward(&op, &[&x], &y, &g).unwrap()[0].clone().unwrap();
        let mut kept = 0;
        for (&y, &d) in y.data().iter().zip(dx.data()) {
            assert!((y == 6.0 && d == 2.0) || (y == 0.0 && d == 0.0), "{y} {d}");
            kept += usize::from(y != 0.0);
        }
        assert!(kept > 10 && kept < 54, "{kept} of 64 kept at keep = 0.5");
    }
}
