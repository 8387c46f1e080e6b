//! Seeded randomness (SEMANTICS.md, "Randomness"): the bits are SplitMix64 written out here
//! independently from the table; uniform values are exact in f64 and their rounding in f32 on
//! the IR and the CPU tape; Bernoulli masks are exact per element and have the right frequency;
//! dropout's gradient uses the forward's mask; bad keep probabilities are errors.

use tl_ir::{GraphBuilder, Op, rules};
use tl_spec::{Scalar, Shape, Tensor};
use tl_tape_cpu::Tape;

/// SplitMix64 from the SEMANTICS.md table, independent of `tl_spec::rng`.
fn sm(z: u64) -> u64 {
    let z1 = z.wrapping_add(0x9e3779b97f4a7c15);
    let z2 = (z1 ^ (z1 >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    let z3 = (z2 ^ (z2 >> 27)).wrapping_mul(0x94d049bb133111eb);
    z3 ^ (z3 >> 31)
}

fn u(seed: u64, counter: u64, i: u64) -> f64 {
    let key = sm(seed.wrapping_add(counter));
    (sm(key.wrapping_add(i)) & 0xffff_ffff) as f64 / 4294967296.0
}

fn run<T: Scalar>(op: &Op, args: &[Tensor<f64>]) -> Tensor<T> {
    let mut tape = Tape::<T>::new();
    let ids: Vec<usize> = args
        .iter()
        .map(|a| tape.leaf(a.cast(), None, true))
        .collect();
    let y = tape.apply(op, &ids).unwrap();
    tape.get(y).unwrap().clone()
}

#[test]
fn the_reference_splitmix64_sequence() {
    // The reference generator seeded with 0: outputs are splitmix64 of 0, γ, 2γ, ...
    assert_eq!(sm(0), 0xe220a8397b1dcdaf);
    assert_eq!(sm(0x9e3779b97f4a7c15), 0x6e789e6aa1b965f4);
    assert_eq!(tl_spec::rng::splitmix64(0), sm(0));
    assert_eq!(tl_spec::rng::key(3, 4), sm(7));
}

#[test]
fn uniform_is_exact_in_f64_and_rounded_below_one_in_f32() {
    let shape = Shape::new(&[13, 17]);
    for (seed, counter) in [(0, 0), (1, u64::MAX), (0xdead_beef, 12)] {
        let op = Op::RandUniform {
            shape: shape.clone(),
            seed,
            counter,
        };
        let ir = rules::value::<f64>(&op, &[], &[]).unwrap();
        let c64 = run::<f64>(&op, &[]);
        let c32 = run::<f32>(&op, &[]);
        let ir32 = rules::value::<f32>(&op, &[], &[]).unwrap();
        for i in 0..shape.numel() {
            let want = u(seed, counter, i as u64);
            assert_eq!(ir.data()[i], want);
            assert_eq!(c64.data()[i], want);
            let w32 = (want as f32).min(1.0 - f32::EPSILON / 2.0);
            assert_eq!(c32.data()[i].to_bits(), w32.to_bits());
            assert_eq!(ir32.data()[i].to_bits(), w32.to_bits());
            assert!(c32.data()[i] < 1.0);
        }
    }
}

#[test]
fn bernoulli_masks_are_exact_per_element_and_keep_the_right_fraction() {
    let n = 10_000;
    for keep in [0.1, 0.5, 0.9] {
        let op = Op::BernoulliMask {
            shape: Shape::new(&[n]),
            keep,
            seed: 2024,
            counter: 1,
        };
        let m = run::<f32>(&op, &[]);
        let mut kept = 0usize;
        for (i, &v) in m.data().iter().enumerate() {
            let want = if keep > u(2024, 1, i as u64) {
                1.0
            } else {
                0.0
            };
            assert_eq!(v, want, "element {i}");
            kept += usize::from(v == 1.0);
        }
        // Binomial(10⁴, keep): 5 standard deviations is at most 0.025.
        let frac = kept as f64 / n as f64;
        assert!((frac - keep).abs() < 0.025, "keep {keep}: kept {frac}");
    }
    for (keep, all) in [(0.0, 0.0), (1.0, 1.0)] {
        let op = Op::BernoulliMask {
            shape: Shape::new(&[500]),
            keep,
            seed: 1,
            counter: 1,
        };
        assert!(run::<f64>(&op, &[]).data().iter().all(|&v| v == all));
    }
}

#[test]
fn dropout_gradient_uses_the_forward_mask() {
    let x = Tensor::<f64>::from_fn([40, 5], |i| 1.0 + (i % 7) as f64);
    let g = Tensor::<f64>::from_fn([40, 5], |i| 0.5 + (i % 3) as f64);
    let op = Op::Dropout {
        keep: 0.4,
        seed: 77,
        counter: 3,
    };
    let mut tape = Tape::<f64>::new();
    let xi = tape.leaf(x.clone(), None, true);
    let yi = tape.apply(&op, &[xi]).unwrap();
    let dx = tape.backward_dense(yi, &g).unwrap()[xi].clone();
    let y = tape.get(yi).unwrap();
    let mut b = GraphBuilder::new();
    let l = b.leaf([40, 5], None).unwrap();
    let o = b.apply(op.clone(), &[l]).unwrap();
    let ir_dx = b
        .finish()
        .backprop_all(std::slice::from_ref(&x), &[], o, &g)
        .unwrap()[l]
        .clone();
    for i in 0..200 {
        let kept = 0.4 > u(77, 3, i as u64);
        let s = if kept { 1.0 / 0.4 } else { 0.0 };
        assert_eq!(y.data()[i], x.data()[i] * s, "value {i}");
        assert_eq!(dx.data()[i], g.data()[i] * s, "gradient {i}");
        assert_eq!(ir_dx.data()[i], dx.data()[i]);
    }
}

#[test]
fn keep_probabilities_out_of_range_are_errors() {
    let mut b = GraphBuilder::new();
    let x = b.leaf([3], None).unwrap();
    for keep in [0.0, -0.5, 1.5, f64::NAN] {
        let e = b
            .apply(
                Op::Dropout {
                    keep,
                    seed: 0,
                    counter: 0,
                },
                &[x],
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("dropout") && e.contains("keep"), "{e}");
    }
    for keep in [-0.1, 1.01, f64::NAN] {
        let op = Op::BernoulliMask {
            shape: Shape::new(&[2]),
            keep,
            seed: 0,
            counter: 0,
        };
        let e = b.apply(op, &[]).unwrap_err().to_string();
        assert!(e.contains("bernoulliMask"), "{e}");
    }
}
