//! Where operand values are drawn from, and how far a point is from an op's kinks and poles.
//!
//! Checks that compare derivatives with finite differences (3), or f32 with f64 (1, 2), need
//! operands away from the points where an op is not smooth: 0 for abs/relu/sqrt, the bounds for
//! clamp, ties for max/min, and the poles of log/inv/div. The registry draws from these domains;
//! [`kink_margin`] measures the distance, so tests and the random-DAG filter can enforce it.

use proptest::prelude::*;
use tl_ir::Op;
use tl_spec::Tensor;

/// A set of element values, with a proptest strategy over it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Domain {
    /// Uniform in `[-r, r]`.
    Any(f64),
    /// Uniform in `[lo, hi]` with `0 < lo`.
    Positive(f64, f64),
    /// `±[lo, hi]` with `0 < lo`: both signs, never near 0.
    AwayFromZero(f64, f64),
}

/// The default operand range: `[-2, 2]`.
pub const ANY: Domain = Domain::Any(2.0);

impl Domain {
    /// Whether the domain is a set values can be drawn from: `Any(r)` with a finite `r ≥ 0`,
    /// `Positive(lo, hi)` and `AwayFromZero(lo, hi)` with finite `0 < lo ≤ hi`. The error
    /// names the domain and what is wrong.
    pub fn check(self) -> Result<(), String> {
        let ok = match self {
            Domain::Any(r) => r.is_finite() && r >= 0.0,
            Domain::Positive(lo, hi) | Domain::AwayFromZero(lo, hi) => {
                lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi
            }
        };
        match ok {
            true => Ok(()),
            false => Err(format!(
                "{self:?} is not a domain: Any(r) takes a finite r ≥ 0, Positive(lo, hi) and \
                 AwayFromZero(lo, hi) finite 0 < lo ≤ hi"
            )),
        }
    }

    /// A strategy for one element (the domain must pass [`Domain::check`]).
    pub fn element(self) -> BoxedStrategy<f64> {
        match self {
            Domain::Any(r) => (-r..=r).boxed(),
            Domain::Positive(lo, hi) => (lo..=hi).boxed(),
            Domain::AwayFromZero(lo, hi) => (any::<bool>(), lo..=hi)
                .prop_map(|(neg, m)| if neg { -m } else { m })
                .boxed(),
        }
    }

    /// An element from 64 random bits (for tensors generated from one seed; see
    /// [`crate::generate::elements`]): the same distribution as [`Domain::element`].
    pub fn from_bits(self, bits: u64) -> f64 {
        let u = unit(bits);
        match self {
            Domain::Any(r) => -r + 2.0 * r * u,
            Domain::Positive(lo, hi) => lo + (hi - lo) * u,
            Domain::AwayFromZero(lo, hi) => {
                let m = lo + (hi - lo) * u;
                if bits & 1 == 1 { -m } else { m }
            }
        }
    }

    /// Whether `v` lies in the domain.
    pub fn contains(self, v: f64) -> bool {
        match self {
            Domain::Any(r) => v.abs() <= r,
            Domain::Positive(lo, hi) => (lo..=hi).contains(&v),
            Domain::AwayFromZero(lo, hi) => (lo..=hi).contains(&v.abs()),
        }
    }
}

/// The top 53 bits of `bits` as a number in `[0, 1)`.
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// How far the operands are from the nearest point where `op` is not smooth (a kink, a tie, a
/// bound, a pole or the edge of its domain); negative when outside the domain (e.g. `log` of a
/// negative value). `None` when the op is smooth everywhere on its domain.
///
/// For `max`/`min` the distance is `min |a − b|`, for `clamp` the distance to either bound,
/// for `div` the distance of the denominator from 0.
pub fn kink_margin(op: &Op, x: &[&Tensor<f64>]) -> Option<f64> {
    let min_over = |t: &Tensor<f64>, f: &dyn Fn(f64) -> f64| {
        t.data().iter().map(|&v| f(v)).fold(f64::INFINITY, f64::min)
    };
    use Op::*;
    match op {
        // elu's slope is continuous at 0 only for alpha = 1: every alpha counts as a kink.
        Abs | Relu | Inv | LeakyRelu { .. } | Elu { .. } => Some(min_over(x[0], &|v| v.abs())),
        Sqrt | Log => Some(min_over(x[0], &|v| v)),
        Div => Some(min_over(x[1], &|v| v.abs())),
        Clamp { lo, hi } => Some(min_over(x[0], &|v| (v - lo).abs().min((v - hi).abs()))),
        Max | Min => Some(
            x[0].data()
                .iter()
                .zip(x[1].data())
                .map(|(a, b)| (a - b).abs())
                .fold(f64::INFINITY, f64::min),
        ),
        Add
        | Sub
        | Mul
        | Scale(_)
        | Exp
        | Sigmoid
        | Tanh
        | Softplus
        | SafeLog { .. }
        | Detach
        | Constant(_)
        | Reshape(_)
        | Flatten
        | Transpose2d
        | PermuteBca
        | PermuteCab
        | SwapLastTwo
        | SwapAdjacent(_)
        | BroadcastTo(_)
        | Sum
        | ReduceSum(_)
        | ReduceMean(_)
        | Matmul
        | Bmm
        | Linear
        | Softmax
        | LogSoftmax
        | MseLoss
        | Gelu
        | Silu
        | GeluErf
        | Concat
        | Slice { .. }
        | CrossEntropy { .. }
        // The index operand of `gather` is never perturbed (it is an index operand).
        | tl_ir::gather_ops!()
        | ScatterAddVec { .. }
        | ScatterAddRow { .. }
        | LayerNorm { .. }
        | RmsNorm { .. }
        | BatchNorm { .. }
        | BatchMoments
        | MaskedSoftmax { .. }
        | MultiHeadAttention { .. }
        | ScaledDotProductAttention { .. }
        | Conv { .. }
        | ConvTranspose { .. }
        | AvgPool { .. }
        | SmoothMaxPool { .. } => None,
        // Padded cells are ignored, so the only kinks are ties inside a window.
        MaxPool {
            kernel,
            stride,
            padding,
        } => {
            let p = tl_spec::ops::pool::PoolParams {
                kernel,
                stride,
                padding,
            };
            tl_spec::ops::pool::max_pool_tie_gap(x[0], p).ok()
        }
        SpectralConv1dRfft { .. }
        | RandUniform { .. }
        | BernoulliMask { .. }
        | Dropout { .. } => None,
        // A user op declares its own kinks to the harness (`crate::user::UserEntry::margin`).
        User(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_measure_distance_to_the_kink() {
        let t = |v: &[f64]| Tensor::vector(v.to_vec());
        let x = t(&[-0.5, 0.25, 2.0]);
        assert_eq!(kink_margin(&Op::Relu, &[&x]), Some(0.25));
        assert_eq!(kink_margin(&Op::Log, &[&x]), Some(-0.5));
        let c = Op::Clamp { lo: 0.0, hi: 1.0 };
        assert_eq!(kink_margin(&c, &[&x]), Some(0.25));
        let y = t(&[-0.25, 0.25, 1.0]);
        assert_eq!(kink_margin(&Op::Max, &[&x, &y]), Some(0.0));
        assert_eq!(kink_margin(&Op::Div, &[&y, &x]), Some(0.25));
        assert_eq!(kink_margin(&Op::Tanh, &[&x]), None);
    }

    #[test]
    fn domains_contain_what_they_generate() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        for d in [
            ANY,
            Domain::Positive(0.2, 3.0),
            Domain::AwayFromZero(0.3, 2.0),
        ] {
            for _ in 0..200 {
                let v = d.element().new_tree(&mut runner).unwrap().current();
                assert!(d.contains(v), "{d:?} generated {v}");
            }
        }
        assert!(!Domain::AwayFromZero(0.3, 2.0).contains(0.1));
        for d in [
            ANY,
            Domain::Positive(0.2, 3.0),
            Domain::AwayFromZero(0.3, 2.0),
        ] {
            for k in 0..200u64 {
                let v = d.from_bits(crate::config::splitmix64(k));
                assert!(d.contains(v), "{d:?} from bits gave {v}");
            }
        }
    }
}
