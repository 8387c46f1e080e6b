//! [`Activation`]: PyTorch's activations as modules (element-wise, and the softmax family
//! and the gated linear unit along the last axis). The catalogue's own ops (ReLU, tanh, sigmoid, GELU, SiLU, softplus,
//! the exact GELU, LeakyReLU, ELU, softmax, log-softmax) run as one op each; the others are compositions of catalogue ops, chosen so that their gradients at the
//! kinks are PyTorch's autograd's (each composition's rule is in its arm below, and
//! `tests/nn/activations.rs` checks values and gradients at and around every kink against
//! PyTorch).

use tl_session::{Param, Train};

use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// SELU's `alpha` (PyTorch's `torch.nn.SELU`, from Klambauer et al. 2017).
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// SELU's `scale`.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// An activation as a module (the functions of the catalogue's ops are also methods of
/// [`Var`]). PyTorch: `nn.ReLU()`, `nn.Tanh()`, …
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `max(x, 0)`. PyTorch: `nn.ReLU`.
    Relu,
    /// `tanh x`. PyTorch: `nn.Tanh`.
    Tanh,
    /// `1/(1+exp(−x))`. PyTorch: `nn.Sigmoid`.
    Sigmoid,
    /// GELU, tanh form. PyTorch: `nn.GELU(approximate="tanh")`.
    Gelu,
    /// `x·sigmoid(x)`. PyTorch: `nn.SiLU`.
    Silu,
    /// `log(1+exp(x))`. PyTorch: `nn.Softplus`.
    Softplus,
    /// The exact GELU `½·x·(1 + erf(x/√2))`. PyTorch: `nn.GELU()` (its default).
    GeluErf,
    /// `x` for x > 0, else `negative_slope·x`. PyTorch: `nn.LeakyReLU(negative_slope)`
    /// (PyTorch's default 0.01: [`Activation::LEAKY_RELU`]).
    LeakyRelu(f64),
    /// `x` for x > 0, else `alpha·(eˣ − 1)`. PyTorch: `nn.ELU(alpha)` (PyTorch's default 1.0:
    /// [`Activation::ELU`]).
    Elu(f64),
    /// `min(max_val, max(min_val, x))`, gradient 1 strictly between the bounds and 0 at them.
    /// PyTorch: `nn.Hardtanh(min_val, max_val)` (its defaults −1, 1: [`Activation::HARDTANH`]).
    /// `min_val < max_val`, both finite.
    Hardtanh(f64, f64),
    /// `min(6, max(0, x))`, gradient 0 at 0 and 6. PyTorch: `nn.ReLU6`.
    Relu6,
    /// `relu6(x + 3)/6`, gradient 1/6 strictly inside (−3, 3), else 0. PyTorch:
    /// `nn.Hardsigmoid` (whose CPU backward multiplies by 1/6 rounded to f32 even in f64:
    /// 0.16666667163…; here 1/6 in the element type).
    Hardsigmoid,
    /// `x·relu6(x + 3)/6`; gradient `x/3 + ½` strictly inside (−3, 3), 0 at −3 and below,
    /// 1 at 3 and above. PyTorch: `nn.Hardswish`.
    Hardswish,
    /// `x·tanh(softplus(x))`. PyTorch: `nn.Mish`.
    Mish,
    /// `scale·elu(x, alpha)` with [`SELU_SCALE`] and [`SELU_ALPHA`] (gradient `scale·alpha`
    /// at 0). PyTorch: `nn.SELU`.
    Selu,
    /// `max(0, x) + min(0, alpha·(exp(x/alpha) − 1))`, gradient 1 at 0. PyTorch:
    /// `nn.CELU(alpha)` (its default 1.0: [`Activation::CELU`]; its CPU kernel takes `1/alpha`
    /// in f32 even in f64, so its gradients are that far from these). `alpha` finite and not
    /// 0.
    Celu(f64),
    /// `log(sigmoid(x)) = −softplus(−x)`. PyTorch: `nn.LogSigmoid`.
    LogSigmoid,
    /// `x/(1 + |x|)`. PyTorch: `nn.Softsign`.
    Softsign,
    /// `x − tanh x`. PyTorch: `nn.Tanhshrink`.
    Tanhshrink,
    /// `x − λ` for x > λ, `x + λ` for x < −λ, else 0; gradient 0 on [−λ, λ] (bounds
    /// included). PyTorch: `nn.Softshrink(lambd)` (its default 0.5:
    /// [`Activation::SOFTSHRINK`]). `λ ≥ 0`, finite.
    Softshrink(f64),
    /// Softmax along the last axis (x of rank ≥ 1). PyTorch: `nn.Softmax(dim=-1)`.
    Softmax,
    /// Log-softmax along the last axis. PyTorch: `nn.LogSoftmax(dim=-1)`.
    LogSoftmax,
    /// `softmax(−x)` along the last axis. PyTorch: `nn.Softmin(dim=-1)`.
    Softmin,
    /// The gated linear unit along the last axis: its 2h values split into `a` (the first h)
    /// and `b`, then `a·σ(b)`; the output's last axis is h (an odd length is an error).
    /// PyTorch: `nn.GLU(dim=-1)`.
    Glu,
}

impl Activation {
    /// `LeakyRelu` with PyTorch's default slope, 0.01 (`nn.LeakyReLU()`).
    pub const LEAKY_RELU: Activation = Activation::LeakyRelu(0.01);
    /// `Elu` with PyTorch's default alpha, 1.0 (`nn.ELU()`).
    pub const ELU: Activation = Activation::Elu(1.0);
    /// `Hardtanh` with PyTorch's default bounds, −1 and 1 (`nn.Hardtanh()`).
    pub const HARDTANH: Activation = Activation::Hardtanh(-1.0, 1.0);
    /// `Celu` with PyTorch's default alpha, 1.0 (`nn.CELU()`).
    pub const CELU: Activation = Activation::Celu(1.0);
    /// `Softshrink` with PyTorch's default λ, 0.5 (`nn.Softshrink()`).
    pub const SOFTSHRINK: Activation = Activation::Softshrink(0.5);

    /// How the activation prints: PyTorch's class name and `extra_repr()` (one arm per
    /// variant).
    fn pytorch(self) -> (&'static str, String) {
        match self {
            Activation::Relu => ("ReLU", String::new()),
            Activation::Tanh => ("Tanh", String::new()),
            Activation::Sigmoid => ("Sigmoid", String::new()),
            Activation::Gelu => ("GELU", "approximate='tanh'".into()),
            Activation::Silu => ("SiLU", String::new()),
            Activation::Softplus => ("Softplus", String::new()),
            Activation::GeluErf => ("GELU", String::new()),
            Activation::LeakyRelu(s) => ("LeakyReLU", format!("negative_slope={s:?}")),
            Activation::Elu(a) => ("ELU", format!("alpha={a:?}")),
            Activation::Hardtanh(lo, hi) => ("Hardtanh", format!("min_val={lo:?}, max_val={hi:?}")),
            Activation::Relu6 => ("ReLU6", String::new()),
            Activation::Hardsigmoid => ("Hardsigmoid", String::new()),
            Activation::Hardswish => ("Hardswish", String::new()),
            Activation::Mish => ("Mish", String::new()),
            Activation::Selu => ("SELU", String::new()),
            Activation::Celu(a) => ("CELU", format!("alpha={a:?}")),
            Activation::LogSigmoid => ("LogSigmoid", String::new()),
            Activation::Softsign => ("Softsign", String::new()),
            Activation::Tanhshrink => ("Tanhshrink", String::new()),
            Activation::Softshrink(l) => ("Softshrink", format!("{l:?}")),
            Activation::Softmax => ("Softmax", "dim=-1".into()),
            Activation::LogSoftmax => ("LogSoftmax", "dim=-1".into()),
            Activation::Softmin => ("Softmin", "dim=-1".into()),
            Activation::Glu => ("GLU", "dim=-1".into()),
        }
    }

    /// An error naming the activation unless its parameters are valid (PyTorch's checks).
    fn check(self) -> Result<()> {
        let bad = match self {
            Activation::Hardtanh(lo, hi) if !(lo.is_finite() && hi.is_finite() && lo < hi) => Some(
                format!("min_val {lo} must be below max_val {hi}, both finite"),
            ),
            Activation::Celu(a) if !a.is_finite() || a == 0.0 => {
                Some(format!("alpha {a} must be finite and not 0"))
            }
            Activation::Softshrink(l) if !(l.is_finite() && l >= 0.0) => {
                Some(format!("lambd {l} must be finite and at least 0"))
            }
            _ => None,
        };
        match bad {
            Some(detail) => Err(usage(self.pytorch().0, detail)),
            None => Ok(()),
        }
    }

    /// Apply the activation to `x`; an error naming it for invalid parameters.
    pub fn apply<'g, O: Train>(self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.check()?;
        match self {
            Activation::Relu => x.relu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Gelu => x.gelu(),
            Activation::Silu => x.silu(),
            Activation::Softplus => x.softplus(),
            Activation::GeluErf => x.gelu_erf(),
            Activation::LeakyRelu(slope) => x.leaky_relu(slope),
            Activation::Elu(alpha) => x.elu(alpha),
            // clamp: gradient strictly inside, 0 at the bounds (PyTorch's hardtanh_backward).
            Activation::Hardtanh(lo, hi) => x.clamp(lo, hi),
            Activation::Relu6 => x.clamp(0.0, 6.0),
            Activation::Hardsigmoid => x.add_scalar(3.0)?.clamp(0.0, 6.0)?.scale(1.0 / 6.0),
            // x·clamp(x + 3, 0, 6)/6: the clamp's gradient is 0 at its bounds, so the
            // product's is 0 at x = −3 and 1 at x = 3, as PyTorch's hardswish_backward.
            Activation::Hardswish => (x * &x.add_scalar(3.0)?.clamp(0.0, 6.0)?)?.scale(1.0 / 6.0),
            Activation::Mish => x * &x.softplus()?.tanh()?,
            Activation::Selu => x.elu(SELU_ALPHA)?.scale(SELU_SCALE),
            // alpha·elu(x/alpha, 1): elu's gradient 1 at 0 (its left branch, alpha·e⁰ with
            // alpha 1) times alpha/alpha.
            Activation::Celu(alpha) => x.scale(1.0 / alpha)?.elu(1.0)?.scale(alpha),
            Activation::LogSigmoid => x.scale(-1.0)?.softplus()?.scale(-1.0),
            // abs'(0) = 0, so the gradient at 0 is 1 (PyTorch's autograd of the same formula).
            Activation::Softsign => x / &x.abs()?.add_scalar(1.0)?,
            Activation::Tanhshrink => x - &x.tanh()?,
            // relu(x − λ) − relu(−x − λ): gradient 0 at ±λ (relu'(0) = 0), as PyTorch's
            // softshrink_backward (0 where |x| ≤ λ).
            Activation::Softshrink(l) => {
                let pos = x.add_scalar(-l)?.relu()?;
                let neg = x.scale(-1.0)?.add_scalar(-l)?.relu()?;
                &pos - &neg
            }
            Activation::Softmax => x.softmax(),
            Activation::LogSoftmax => x.log_softmax(),
            Activation::Softmin => x.scale(-1.0)?.softmax(),
            Activation::Glu => glu(x),
        }
    }
}

/// `a·σ(b)` of the last axis's halves: x viewed as (rows, 2h) and transposed, so each half is
/// a block of rows (`sliceRange0`), then transposed back.
fn glu<'g, O: Train>(x: &Var<'g, O>) -> Result<Var<'g, O>> {
    let dims = x.dims();
    let last = dims.last().copied().unwrap_or(0);
    if last == 0 || !last.is_multiple_of(2) {
        return Err(usage(
            "GLU",
            format!(
                "the last axis of input {} must have a positive even length (halved into a and b)",
                x.shape()
            ),
        ));
    }
    let (h, rows) = (last / 2, x.shape().numel() / last);
    let t = x.reshape(&[rows, last])?.transpose2d()?;
    let (a, b) = (t.narrow0(0, h)?, t.narrow0(h, h)?);
    let mut out = dims.to_vec();
    out[dims.len() - 1] = h;
    (&a * &b.sigmoid()?)?.transpose2d()?.reshape(&out)
}

impl Parameters for Activation {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn module_name(&self) -> String {
        self.pytorch().0.into()
    }
    fn extra_repr(&self) -> String {
        self.pytorch().1
    }
}

impl<O: Train> Module<O> for Activation {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        self.apply(x)
    }
}
