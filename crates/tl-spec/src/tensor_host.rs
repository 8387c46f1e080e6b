//! Host conveniences on [`Tensor`] that are not ops of the graph: `argmax` along an axis and
//! seeded random tensors from the project's counter RNG ([`crate::rng`]), so the same seed
//! gives the same tensor on every machine.

use crate::{Error, Result, Scalar, Shape, Tensor, rng};

impl<T: Scalar> Tensor<T> {
    /// The index of the largest element along `axis`, for every position of the other axes:
    /// a row-major `Vec` over the shape without `axis` (the remaining axes in order). Ties go to the first index; NaN counts as the
    /// largest (as PyTorch's `argmax` does). An axis out of range or of length 0 is an error.
    /// PyTorch: `x.argmax(dim=axis)`.
    pub fn argmax(&self, axis: usize) -> Result<Vec<usize>> {
        let dims = self.shape().dims();
        let Some(&len) = dims.get(axis) else {
            return Err(Error::Param {
                op: "Tensor::argmax",
                detail: format!("axis {axis} is out of range for shape {}", self.shape()),
            });
        };
        if len == 0 {
            return Err(Error::Param {
                op: "Tensor::argmax",
                detail: format!(
                    "axis {axis} of shape {} is empty: no largest element",
                    self.shape()
                ),
            });
        }
        if self.numel() == 0 {
            // Another axis is 0: no position, so no index (the other dims' product may
            // overflow, and a loop over them would run for nothing).
            return Ok(Vec::new());
        }
        let inner: usize = dims[axis + 1..].iter().product();
        let outer: usize = dims[..axis].iter().product();
        let data = self.data();
        let mut out = crate::alloc::try_with_capacity("Tensor::argmax", "indices", outer * inner)?;
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| data[(o * len + k) * inner + i];
                let mut best = 0;
                for k in 1..len {
                    let (v, b) = (at(k), at(best));
                    if !b.is_nan() && (v.is_nan() || v > b) {
                        best = k;
                    }
                }
                out.push(best);
            }
        }
        Ok(out)
    }

    /// Uniform values in `[0, 1)`, element `i` from the counter RNG under `seed`
    /// (`rng::uniform(rng::key(seed, 0), i)`). PyTorch: `torch.rand(shape,
    /// generator=torch.Generator().manual_seed(seed))`, with our generator.
    pub fn rand(shape: impl Into<Shape>, seed: u64) -> Self {
        Self::rand_keyed(shape, rng::key(seed, 0))
    }

    /// [`Tensor::rand`] from a draw's key (`rng::key(seed, counter)`).
    ///
    /// [`Tensor::rand`], [`Tensor::rand_keyed`], [`Tensor::randn`] and [`Tensor::randn_keyed`]
    /// are for shapes the caller controls and panic as [`Tensor::from_fn`] does; the `try_`
    /// variants return [`Error::TooLarge`] instead (shapes from input).
    pub fn rand_keyed(shape: impl Into<Shape>, key: u64) -> Self {
        Self::try_rand_keyed("Tensor::rand", shape, key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::rand_keyed`], checked against the allocation cap ([`crate::alloc`]): an
    /// [`Error::TooLarge`] naming `op` when the shape cannot be allocated.
    pub fn try_rand_keyed(op: &'static str, shape: impl Into<Shape>, key: u64) -> Result<Self> {
        Tensor::try_from_fn(op, shape, |i| rng::uniform(key, i as u64))
    }

    /// Standard normal values, element `i` from [`rng::normal`] under `seed`. PyTorch:
    /// `torch.randn(shape, generator=...)`, with our generator.
    pub fn randn(shape: impl Into<Shape>, seed: u64) -> Self {
        Self::randn_keyed(shape, rng::key(seed, 0), 0.0, 1.0)
    }

    /// Normal values with `mean` and `std` from a draw's key. Panics as [`Tensor::from_fn`];
    /// [`Tensor::try_randn_keyed`] for shapes from input.
    pub fn randn_keyed(shape: impl Into<Shape>, key: u64, mean: f64, std: f64) -> Self {
        Self::try_randn_keyed("Tensor::randn", shape, key, mean, std)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::randn_keyed`], checked against the allocation cap ([`crate::alloc`]): an
    /// [`Error::TooLarge`] naming `op` when the shape cannot be allocated.
    pub fn try_randn_keyed(
        op: &'static str,
        shape: impl Into<Shape>,
        key: u64,
        mean: f64,
        std: f64,
    ) -> Result<Self> {
        Tensor::try_from_fn(op, shape, |i| {
            T::lit(mean + std * rng::normal(key, i as u64))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_along_each_axis() {
        // [[1, 5, 5], [7, 0, NaN]]
        let t = Tensor::new([2, 3], vec![1.0, 5.0, 5.0, 7.0, 0.0, f64::NAN]).unwrap();
        assert_eq!(
            t.argmax(1).unwrap(),
            [1, 2],
            "ties to the first, NaN is largest"
        );
        assert_eq!(t.argmax(0).unwrap(), [1, 0, 1]);
        let t3 = Tensor::from_fn([2, 3, 2], |i| ((i * 7) % 5) as f64);
        // Axis 1 of (2,3,2): positions (o, i) pick k with the largest t[o, k, i].
        let want: Vec<usize> = (0..2)
            .flat_map(|o| {
                (0..2).map(move |i| {
                    (0..3)
                        .max_by(|&a, &b| {
                            let v = |k: usize| ((((o * 3 + k) * 2 + i) * 7) % 5) as f64;
                            v(a).partial_cmp(&v(b)).unwrap().then(b.cmp(&a))
                        })
                        .unwrap()
                })
            })
            .collect();
        assert_eq!(t3.argmax(1).unwrap(), want);
        assert!(t.argmax(2).unwrap_err().to_string().contains("axis 2"));
        assert!(Tensor::<f64>::zeros([2, 0]).argmax(1).is_err());
    }

    #[test]
    fn seeded_random_tensors() {
        let a = Tensor::<f32>::rand([1000], 7);
        assert_eq!(a, Tensor::<f32>::rand([1000], 7), "same seed, same tensor");
        assert_ne!(a, Tensor::<f32>::rand([1000], 8));
        assert!(a.data().iter().all(|v| (0.0..1.0).contains(v)));
        let mean = a.data().iter().map(|v| f64::from(*v)).sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        let n = Tensor::<f64>::randn([20_000], 3);
        let m = n.data().iter().sum::<f64>() / 20_000.0;
        let var = n.data().iter().map(|v| (v - m) * (v - m)).sum::<f64>() / 20_000.0;
        assert!(
            m.abs() < 0.03 && (var - 1.0).abs() < 0.03,
            "mean {m}, var {var}"
        );
        assert!(n.data().iter().all(|v| v.is_finite()));
    }
}
