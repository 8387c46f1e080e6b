//! Per-element bodies of the activation kernels (`kernels/activation.cu`): GELU in PyTorch's
//! tanh form and SiLU, forward and backward, with the kernels' operation order.

use tl_spec::approx::tanh_f32;

use super::pointwise::sigmoid;

/// √(2/π) as the kernel's `f32` literal.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The GELU cubic coefficient.
const GELU_CUBIC: f32 = 0.044_715;

/// `tanh(√(2/π)(v + 0.044715·v³))`, the cubic as `((a·v)·v)·v`; the tanh is
/// [`tanh_f32`] (the kernel's `tl_tanh_approx`, and the CPU tape's f32 gelu), not libm's.
fn gelu_t(v: f32) -> f32 {
    tanh_f32(SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v))
}

/// `0.5·v·(1 + t)`.
pub fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + gelu_t(v))
}

/// `(0.5(1 + t) + 0.5·v·sech²·√(2/π)·(1 + 3a·v²)) · g`, the second term 0 once `sech² = 0`.
pub fn gelu_bwd(v: f32, g: f32) -> f32 {
    let t = gelu_t(v);
    let sech2 = 1.0 - t * t;
    let three_a = 3.0 * GELU_CUBIC;
    let tail = if sech2 == 0.0 {
        0.0
    } else {
        0.5 * v * sech2 * SQRT_2_OVER_PI * (1.0 + three_a * v * v)
    };
    (0.5 * (1.0 + t) + tail) * g
}

/// `v · sigmoid(v)`.
pub fn silu(v: f32) -> f32 {
    v * sigmoid(v)
}

/// `s·(1 + v(1 − s)) · g`, `s = sigmoid(v)`.
pub fn silu_bwd(v: f32, g: f32) -> f32 {
    let s = sigmoid(v);
    s * (1.0 + v * (1.0 - s)) * g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_kernels_f32_literals() {
        // activation.cu writes the f64 digits with an `f` suffix: the nearest f32 of each.
        assert_eq!(SQRT_2_OVER_PI, 0.797_884_560_802_865_4_f64 as f32);
        assert_eq!(GELU_CUBIC, 0.044_715_f64 as f32);
    }
}
