//! The exact GELU, `x·Φ(x) = ½·x·(1 + erf(x/√2))` (PyTorch's default `F.gelu`; the catalogue
//! has it too, as `geluErf`: this example shows how you would add it yourself), as a user op: shape rule, reference value / VJP / JVP generic over
//! the scalar, and the harness entry that describes it. `wrong: true` plants a bug in the VJP
//! (the `x·φ(x)` term dropped, a classic slip), to show the harness failing.

use tl_conformance::user::UserEntry;
use tl_conformance::{Domain, Tol};
use tl_ir::{UserOp, UserOpRef};
use tl_spec::{Scalar, Shape, Tensor};

/// The exact (erf) GELU.
pub struct GeluErf {
    /// Plant the bug in the VJP.
    pub wrong: bool,
}

/// `Φ(x)`, the standard normal CDF, in f64 (the catalogue's erf, libm's: within an ulp).
fn cdf(x: f64) -> f64 {
    0.5 * (1.0 + tl_spec::special::erf(x / std::f64::consts::SQRT_2))
}

/// `φ(x)`, the standard normal density.
fn pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// `dy/dx = Φ(x) + x·φ(x)` (without the second term when `wrong`).
fn slope(x: f64, wrong: bool) -> f64 {
    if wrong { cdf(x) } else { cdf(x) + x * pdf(x) }
}

impl UserOp for GeluErf {
    fn name(&self) -> &'static str {
        if self.wrong {
            "geluErf (wrong VJP)"
        } else {
            "geluErf"
        }
    }
    fn arity(&self) -> usize {
        1
    }
    fn infer_shape(&self, shapes: &[&Shape]) -> tl_spec::Result<Shape> {
        Ok(shapes[0].clone())
    }
    fn value<T: Scalar>(&self, x: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        Ok(x[0].map(|v| T::lit(v.as_f64() * cdf(v.as_f64()))))
    }
    fn vjp<T: Scalar>(
        &self,
        x: &[&Tensor<T>],
        g: &Tensor<T>,
    ) -> tl_spec::Result<Vec<Option<Tensor<T>>>> {
        let d = x[0].zip_map(self.name(), g, |v, g| {
            T::lit(slope(v.as_f64(), self.wrong) * g.as_f64())
        })?;
        Ok(vec![Some(d)])
    }
    fn jvp<T: Scalar>(&self, x: &[&Tensor<T>], dx: &[&Tensor<T>]) -> tl_spec::Result<Tensor<T>> {
        x[0].zip_map(self.name(), dx[0], |v, d| {
            T::lit(slope(v.as_f64(), false) * d.as_f64())
        })
    }
}

/// The op as a handle.
pub fn gelu_erf(wrong: bool) -> UserOpRef {
    UserOpRef::new(GeluErf { wrong })
}

/// What the harness holds the op to: pointwise, operands in `[-4, 4]` (smooth everywhere),
/// the sim and the device within 8 ulps of the CPU f32 tape (each evaluates erf in its own
/// precision), the default tolerances otherwise.
pub fn entry(op: UserOpRef) -> UserEntry {
    UserEntry::elementwise(op)
        .domains(Domain::Any(4.0))
        .ulps(8)
        .tol(Tol::DEFAULT)
}
