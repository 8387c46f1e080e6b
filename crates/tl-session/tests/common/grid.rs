//! The regression task of the session tests and the `train_mlp` example.

use tl_spec::{Scalar, Tensor};

/// `(x, y)` of the task `y = sin(2x₀) + x₁²/2` on an n × n grid of [−1, 1]²: x (n·n, 2),
/// y (n·n, 1).
pub fn regression_grid<T: Scalar>(n: usize) -> (Tensor<T>, Tensor<T>) {
    let coord = |k: usize| -1.0 + 2.0 * k as f64 / (n.max(2) - 1) as f64;
    let pts: Vec<(f64, f64)> = (0..n * n).map(|i| (coord(i / n), coord(i % n))).collect();
    let x = Tensor::from_fn([n * n, 2], |i| {
        let (a, b) = pts[i / 2];
        T::lit(if i % 2 == 0 { a } else { b })
    });
    let y = Tensor::from_fn([n * n, 1], |i| {
        let (a, b) = pts[i];
        T::lit((2.0 * a).sin() + b * b / 2.0)
    });
    (x, y)
}
