//! [`Init`]: parameter initialisers with PyTorch's default formulas, drawn from the project's
//! counter RNG (`key(seed, counter)`, element `i` from `splitmix64(key + i)`; see
//! `tl_spec::rng`), so one session seed gives the same model bit for bit on every backend.
//!
//! | initialiser | element | PyTorch |
//! |---|---|---|
//! | `Uniform { lo, hi }` | `lo + (hi − lo)·u_i`, `u_i = bits(key, i)/2³²` | `nn.init.uniform_` |
//! | `Normal { mean, std }` | `mean + std·√(−2 ln(1 − u_{2i}))·cos(2π u_{2i+1})` (Box–Muller) | `nn.init.normal_` |
//! | `KaimingUniform { fan_in, a }` | uniform in ±`√(6/((1 + a²)·fan_in))` | `nn.init.kaiming_uniform_(w, a)` |
//! | `XavierUniform { fan_in, fan_out }` | uniform in ±`√(6/(fan_in + fan_out))` | `nn.init.xavier_uniform_` |
//! | `Zeros`, `Ones`, `Const(c)` | `0`, `1`, `c` (no draw) | `zeros_`, `ones_`, `constant_` |
//!
//! Layers use PyTorch's defaults: `kaiming_uniform(a = √5)` weights (a bound of `1/√fan_in`),
//! biases uniform in `±1/√fan_in`, norms ones and zeros, embeddings `N(0, 1)`.

use tl_spec::rng::unit;
use tl_spec::{Scalar, Tensor};

use crate::Result;

/// How a parameter's initial value is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// All `c`.
    Const(f64),
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// He/Kaiming uniform for a leaky-ReLU slope `a` (PyTorch's layer default uses `a = √5`).
    KaimingUniform {
        /// The number of inputs each output sees.
        fan_in: usize,
        /// The negative slope.
        a: f64,
    },
    /// Glorot/Xavier uniform.
    XavierUniform {
        /// Inputs per output.
        fan_in: usize,
        /// Outputs per input.
        fan_out: usize,
    },
}

impl Init {
    /// PyTorch's default weight initialiser of `nn.Linear` and `nn.ConvNd`:
    /// `kaiming_uniform_(w, a=√5)`, a bound of `1/√fan_in`.
    pub fn default_weight(fan_in: usize) -> Init {
        Init::KaimingUniform {
            fan_in,
            a: 5f64.sqrt(),
        }
    }

    /// PyTorch's default bias initialiser of `nn.Linear` and `nn.ConvNd`: uniform in
    /// `±1/√fan_in` (zeros when `fan_in` is 0).
    pub fn default_bias(fan_in: usize) -> Init {
        if fan_in == 0 {
            return Init::Zeros;
        }
        let b = 1.0 / (fan_in as f64).sqrt();
        Init::Uniform { lo: -b, hi: b }
    }

    /// A tensor of `dims` drawn from this initialiser; `key` is called once, only by the
    /// random initialisers.
    ///
    /// A shape too large to allocate is an [`Error::Spec`](crate::Error::Spec) holding
    /// `TooLarge` (see [`tl_spec::alloc`]).
    pub fn sample<T: Scalar>(
        self,
        dims: &[usize],
        key: impl FnOnce() -> Result<u64>,
    ) -> Result<Tensor<T>> {
        const OP: &str = "Init::sample";
        let lit = |v: f64| T::lit(v);
        Ok(match self {
            // The dims come from the layer's constructor (input): checked against the allocation
            // cap, so an absurd layer is an error, not an abort.
            Init::Zeros => Tensor::try_zeros(OP, dims)?,
            Init::Ones => Tensor::try_full(OP, dims, T::one())?,
            Init::Const(c) => Tensor::try_full(OP, dims, lit(c))?,
            Init::Uniform { lo, hi } => {
                let k = key()?;
                Tensor::try_from_fn(OP, dims, |i| lit(lo + (hi - lo) * unit(k, i as u64)))?
            }
            Init::Normal { mean, std } => Tensor::try_randn_keyed(OP, dims, key()?, mean, std)?,
            Init::KaimingUniform { fan_in, a } => {
                let bound = if fan_in == 0 {
                    0.0
                } else {
                    (6.0 / ((1.0 + a * a) * fan_in as f64)).sqrt()
                };
                return Init::Uniform {
                    lo: -bound,
                    hi: bound,
                }
                .sample(dims, key);
            }
            Init::XavierUniform { fan_in, fan_out } => {
                // In f64: the sum of two counts a caller gives may overflow usize.
                let n = (fan_in as f64 + fan_out as f64).max(1.0);
                let bound = (6.0 / n).sqrt();
                return Init::Uniform {
                    lo: -bound,
                    hi: bound,
                }
                .sample(dims, key);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14: a layer too large to allocate is an error naming the initialiser, not an
    /// abort; the key is not drawn for it.
    #[test]
    fn an_unallocatable_parameter_is_an_error() {
        for init in [
            Init::Zeros,
            Init::Ones,
            Init::Const(2.0),
            Init::default_weight(4),
        ] {
            let e = init
                .sample::<f32>(&[1 << 40, 1 << 20], || Ok(1))
                .unwrap_err()
                .to_string();
            assert!(e.contains("Init::sample") && e.contains("too large"), "{e}");
        }
    }

    fn draw(init: Init, n: usize) -> Vec<f64> {
        init.sample::<f64>(&[n], || Ok(tl_spec::rng::key(7, 0)))
            .unwrap()
            .into_vec()
    }

    #[test]
    fn kaiming_with_a_sqrt5_is_uniform_within_one_over_sqrt_fan_in() {
        let v = draw(Init::default_weight(16), 4000);
        let bound = 0.25;
        assert!(v.iter().all(|x| x.abs() < bound + 1e-12));
        // Spread over the whole interval: both ends are reached within 2%.
        let max = v.iter().cloned().fold(f64::MIN, f64::max);
        let min = v.iter().cloned().fold(f64::MAX, f64::min);
        assert!(max > 0.98 * bound && min < -0.98 * bound, "{min} {max}");
    }

    #[test]
    fn normal_has_the_asked_mean_and_spread() {
        let v = draw(
            Init::Normal {
                mean: 2.0,
                std: 3.0,
            },
            20_000,
        );
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        // Standard errors: 3/√n ≈ 0.021 for the mean, ≈ 0.09 for the variance.
        assert!((mean - 2.0).abs() < 0.1, "mean {mean}");
        assert!((var - 9.0).abs() < 0.5, "variance {var}");
    }

    #[test]
    fn the_same_key_gives_the_same_values_and_constants_draw_no_key() {
        assert_eq!(
            draw(
                Init::Normal {
                    mean: 0.0,
                    std: 1.0
                },
                9
            ),
            draw(
                Init::Normal {
                    mean: 0.0,
                    std: 1.0
                },
                9
            )
        );
        let t = Init::Ones
            .sample::<f32>(&[3], || panic!("a constant must not draw a key"))
            .unwrap();
        assert_eq!(t.data(), &[1.0, 1.0, 1.0]);
    }
}
