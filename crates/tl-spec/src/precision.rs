//! The arithmetic of a tape's matrix products: the autocast setting every tape shares
//! (`tl_tape_cpu::Precision`, `tl_tape_cuda::Precision` and `tl_session::Precision` are this
//! type). docs/semantics.md, "Mixed precision".

use crate::{Result, Tensor};

/// The arithmetic of a tape's matrix products (matmul, bmm, linear, conv, attention's
/// products), forward and backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 operands, f32 sums (and f64 on an f64 tape): the default.
    #[default]
    F32,
    /// bf16 autocast: f32 operands rounded to bf16 (nearest, ties to even:
    /// [`crate::bf16::round`]), f32 sums. PyTorch: `torch.autocast(dtype=torch.bfloat16)`
    /// around the products.
    Bf16,
    /// TF32: f32 operands rounded to TF32 (nearest, ties away from zero:
    /// [`crate::tf32::round`]), f32 sums. PyTorch: `torch.backends.cuda.matmul.allow_tf32`.
    Tf32,
}

impl Precision {
    /// The setting's name (`"f32"`, `"bf16"`, `"tf32"`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Tf32 => "tf32",
        }
    }

    /// `x` as a product reads it: unchanged for [`Precision::F32`], else rounded.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::Bf16 => crate::bf16::round(x),
            Precision::Tf32 => crate::tf32::round(x),
        }
    }

    /// Whether products round their operands (every setting but [`Precision::F32`]).
    pub fn is_autocast(self) -> bool {
        self != Precision::F32
    }

    /// The reference of a product under this setting: `(m, k)·(k, n)` of the operands rounded
    /// ([`round`](Self::round)), each product and the sum in f64. A path's f32 result differs
    /// from it by at most [`crate::bf16::accumulation_bound`] (products of two rounded values
    /// are exact in f32 for every setting but `F32`).
    pub fn matmul_reference(self, a: &Tensor<f32>, b: &Tensor<f32>) -> Result<Tensor<f64>> {
        let op = "matmul";
        let r = |t: &Tensor<f32>| t.try_map(op, |x| self.round(x))?.try_cast::<f64>(op);
        crate::ops::linalg::matmul(&r(a)?, &r(b)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_rounds_as_its_module() {
        let x = 1.0 + 2f32.powi(-11) + 2f32.powi(-20);
        assert_eq!(Precision::F32.round(x), x);
        assert_eq!(Precision::Bf16.round(x), crate::bf16::round(x));
        assert_eq!(Precision::Tf32.round(x), crate::tf32::round(x));
        assert_ne!(Precision::Bf16.round(x), Precision::Tf32.round(x));
        assert_eq!(Precision::default(), Precision::F32);
        assert!(!Precision::F32.is_autocast() && Precision::Tf32.is_autocast());
        let names: Vec<_> = [Precision::F32, Precision::Bf16, Precision::Tf32]
            .map(Precision::name)
            .to_vec();
        assert_eq!(names, ["f32", "bf16", "tf32"]);
        let a = Tensor::new([1, 1], vec![x]).unwrap();
        let one = Tensor::new([1, 1], vec![1.0f32]).unwrap();
        let r = Precision::Tf32.matmul_reference(&a, &one).unwrap();
        assert_eq!(r.data(), &[f64::from(crate::tf32::round(x))]);
        assert_eq!(
            Precision::Bf16.matmul_reference(&a, &one).unwrap().data(),
            crate::bf16::matmul(&a, &one).unwrap().data()
        );
    }
}
