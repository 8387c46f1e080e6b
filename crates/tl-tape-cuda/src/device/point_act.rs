//! The pointwise activations with a parameter or a libm call: `leakyRelu`, `elu` and the exact
//! (erf) GELU, as one primitive pair ([`Device::point_act`](super::Device::point_act) and
//! [`Device::point_act_bwd`](super::Device::point_act_bwd)) over [`PointAct`]
//! (kernels/activation.cu; the sim's twins in `sim/point_act.rs`).

/// Which activation [`Device::point_act`](super::Device::point_act) applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PointAct {
    /// `v` for v > 0, else `negative_slope·v`. PyTorch: `F.leaky_relu`.
    LeakyRelu {
        /// The slope for v ≤ 0.
        negative_slope: f32,
    },
    /// `v` for v > 0, else `alpha·expm1(v)`. PyTorch: `F.elu`.
    Elu {
        /// The scale of the negative branch.
        alpha: f32,
    },
    /// `½·v·(1 + erf(v/√2))`. PyTorch: `F.gelu` (`approximate="none"`).
    GeluErf,
}

impl PointAct {
    /// The forward and backward kernels' names and the parameter they take (none for the GELU).
    pub fn kernels(self) -> (&'static str, &'static str, Option<f32>) {
        match self {
            PointAct::LeakyRelu { negative_slope } => {
                ("tl_leaky_relu", "tl_leaky_relu_bwd", Some(negative_slope))
            }
            PointAct::Elu { alpha } => ("tl_elu", "tl_elu_bwd", Some(alpha)),
            PointAct::GeluErf => ("tl_gelu_erf", "tl_gelu_erf_bwd", None),
        }
    }
}
