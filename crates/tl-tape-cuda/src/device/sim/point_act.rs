//! Per-element bodies of the `leakyRelu`, `elu` and exact-GELU kernels
//! (`kernels/activation.cu`, [`PointAct`]), with the kernels' operation order. The GELU's erf
//! and exp are [`erf_f32`](tl_spec::approx::erf_f32) and [`exp_f32`] (the kernels'
//! `tl_erf_approx`, `tl_exp_approx`, and the CPU tape's f32 kernel): the same bits on all
//! three. `elu` calls libm's `expm1f`/`expf` where the kernels call CUDA's (the host libm's on
//! the emulator): a few ulps apart on a GPU.

use tl_spec::approx::{erf_f32 as erf, exp_f32};

use crate::device::PointAct;

/// `1/√2` as the kernel's `f32` literal.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)` as the kernel's `f32` literal.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// The forward value at `v`.
pub fn forward(act: PointAct, v: f32) -> f32 {
    match act {
        PointAct::LeakyRelu { negative_slope } => {
            if v > 0.0 {
                v
            } else {
                negative_slope * v
            }
        }
        PointAct::Elu { alpha } => {
            if v > 0.0 {
                v
            } else {
                alpha * v.exp_m1()
            }
        }
        PointAct::GeluErf => 0.5 * v * (1.0 + erf(v * FRAC_1_SQRT_2)),
    }
}

/// The operand cotangent at `v` for the cotangent `g`.
pub fn backward(act: PointAct, v: f32, g: f32) -> f32 {
    match act {
        PointAct::LeakyRelu { negative_slope } => {
            if v > 0.0 {
                g
            } else {
                negative_slope * g
            }
        }
        PointAct::Elu { alpha } => {
            if v > 0.0 {
                g
            } else {
                alpha * v.exp() * g
            }
        }
        PointAct::GeluErf => {
            let cdf = 0.5 * (1.0 + erf(v * FRAC_1_SQRT_2));
            let pdf = FRAC_1_SQRT_2PI * exp_f32(-(0.5 * v * v));
            (cdf + v * pdf) * g
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_kernels_f32_literals() {
        assert_eq!(FRAC_1_SQRT_2, std::f64::consts::FRAC_1_SQRT_2 as f32);
        assert_eq!(FRAC_1_SQRT_2PI, 0.398_942_280_401_432_7_f64 as f32);
    }
}
