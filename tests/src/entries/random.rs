//! Case generators for the random family: `randUniform`, `bernoulliMask` (no operands) and
//! `dropout`, with seeds and counters over the whole `u64` range (keying wraps).

use proptest::prelude::*;
use tl_ir::Op;

use crate::OpCase;
use crate::generate::{Size, any_shape, tensor};

/// `randUniform` of any shape under any `(seed, counter)`.
pub fn rand_uniform(z: Size) -> BoxedStrategy<OpCase> {
    (any_shape(z), any::<u64>(), any::<u64>())
        .prop_map(|(shape, seed, counter)| {
            let op = Op::RandUniform {
                shape,
                seed,
                counter,
            };
            OpCase::new(op, vec![])
        })
        .boxed()
}

/// `bernoulliMask` of any shape, keep 0, 1 or in between.
pub fn bernoulli_mask(z: Size) -> BoxedStrategy<OpCase> {
    let keep = prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0];
    (any_shape(z), keep, any::<u64>(), any::<u64>())
        .prop_map(|(shape, keep, seed, counter)| {
            let op = Op::BernoulliMask {
                shape,
                keep,
                seed,
                counter,
            };
            OpCase::new(op, vec![])
        })
        .boxed()
}

/// `dropout` of any operand, keep 1 or in `[0.05, 1]`.
pub fn dropout(z: Size) -> BoxedStrategy<OpCase> {
    let keep = prop_oneof![Just(1.0), 0.05f64..=1.0];
    (any_shape(z), keep, any::<u64>(), any::<u64>())
        .prop_flat_map(|(s, keep, seed, counter)| {
            let op = Op::Dropout {
                keep,
                seed,
                counter,
            };
            tensor(s, crate::ANY).prop_map(move |x| OpCase::new(op.clone(), vec![x]))
        })
        .boxed()
}
