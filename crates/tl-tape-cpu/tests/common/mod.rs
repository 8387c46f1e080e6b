//! Shared test helpers: a deterministic generator, input domains and closeness checks.

#![allow(dead_code)]

use tl_spec::{Scalar, Shape, Tensor};

/// splitmix64: a tiny deterministic generator (no external RNG needed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }
}

/// Where an operand's values are drawn from.
#[derive(Clone, Copy, Debug)]
pub enum Dom {
    /// Uniform in [-2, 2].
    Any,
    /// Uniform in [-w, w] (wide: exercises the stable forms).
    Wide(f64),
    /// Uniform in [0.2, 3] (log).
    Pos,
    /// ±[0.5, 2] (denominators, inv).
    AwayFromZero,
}

pub fn random(rng: &mut Rng, shape: &Shape, dom: Dom) -> Tensor<f64> {
    Tensor::from_fn(shape.clone(), |_| match dom {
        Dom::Any => rng.uniform(-2.0, 2.0),
        Dom::Wide(w) => rng.uniform(-w, w),
        Dom::Pos => rng.uniform(0.2, 3.0),
        Dom::AwayFromZero => {
            let m = rng.uniform(0.5, 2.0);
            if rng.next_u64() & 1 == 0 { m } else { -m }
        }
    })
}

/// Relative tolerance used when comparing kernels with the reference in type `T`.
pub fn tol<T: Scalar>() -> f64 {
    if T::NAME == "f64" { 1e-12 } else { 2e-5 }
}

/// Assert `got` ≈ `want` elementwise: |got − want| ≤ tol · (1 + |want|), same shapes, and NaN
/// exactly where the reference has NaN.
pub fn assert_close<T: Scalar>(what: &str, got: &Tensor<T>, want: &Tensor<T>) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    let t = tol::<T>();
    for (i, (&g, &w)) in got.data().iter().zip(want.data()).enumerate() {
        let (g, w) = (g.as_f64(), w.as_f64());
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, reference NaN");
            continue;
        }
        assert!(
            (g - w).abs() <= t * (1.0 + w.abs()) || g == w,
            "{what}[{i}]: got {g}, reference {w} (tolerance {t})"
        );
    }
}

/// Forward value and every operand cotangent of `op` on the CPU kernels (`ops::forward`,
/// `ops::backward` with output cotangent `g`), as bit patterns: for checks that two runs
/// (another SIMD level, another thread count) give exactly the same result.
pub fn kernel_bits<T: Scalar>(
    op: &tl_ir::Op,
    inputs: &[Tensor<T>],
    g: &Tensor<T>,
) -> Vec<Vec<u64>> {
    use tl_tape_cpu::ops;
    let x: Vec<&Tensor<T>> = inputs.iter().collect();
    let y = ops::forward(op, &x, &[]).unwrap();
    let grads = ops::backward(op, &x, &y, g, &[]).unwrap();
    let bits = |t: &Tensor<T>| t.data().iter().map(|v| v.as_f64().to_bits()).collect();
    let mut out = vec![bits(&y)];
    out.extend(grads.iter().flatten().map(bits));
    out
}

/// `f` run with `threads` threads for every product and split it makes
/// ([`tl_tape_cpu::gates::force_threads`]: this thread's override, not the process-wide one).
pub fn at_threads<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    let _forced = tl_tape_cpu::gates::force_threads(threads);
    f()
}

/// A 2-D max-pool (`avg` false) or avg-pool with square kernel, stride and padding.
pub fn pool2d(kernel: usize, stride: usize, padding: usize, avg: bool) -> tl_ir::Op {
    let (kernel, stride, padding) = (vec![kernel; 2], vec![stride; 2], vec![padding; 2]);
    if avg {
        tl_ir::Op::AvgPool {
            kernel,
            stride,
            padding,
        }
    } else {
        tl_ir::Op::MaxPool {
            kernel,
            stride,
            padding,
        }
    }
}
