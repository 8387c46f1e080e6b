//! The activations the layer check draws ([`ACTIVATIONS`]) and their references
//! ([`activation_ref`]): each [`Activation`] written with plain catalogue ops.

use tl_ir::{GraphBuilder, Id, Op};
use tl_nn::Activation;
use tl_spec::{Shape, Tensor};

/// The activations of [`Activation`], for generation.
pub(crate) const ACTIVATIONS: [Activation; 24] = [
    Activation::Relu,
    Activation::Tanh,
    Activation::Sigmoid,
    Activation::Gelu,
    Activation::Silu,
    Activation::Softplus,
    Activation::GeluErf,
    Activation::LeakyRelu(0.2),
    Activation::Elu(0.7),
    Activation::Hardtanh(-0.8, 1.3),
    Activation::Relu6,
    Activation::Hardsigmoid,
    Activation::Hardswish,
    Activation::Mish,
    Activation::Selu,
    Activation::Celu(0.6),
    Activation::LogSigmoid,
    Activation::Softsign,
    Activation::Tanhshrink,
    Activation::Softshrink(0.4),
    Activation::Softmax,
    Activation::LogSoftmax,
    Activation::Softmin,
    Activation::Glu,
];

/// The reference of an [`Activation`] on `x` of `shape`: the catalogue's op where it is one,
/// else PyTorch's formula written another way than the layer composes it (the same function;
/// the same gradient away from the kinks, which the tl-nn tests check by hand).
pub(crate) fn activation_ref(
    b: &mut GraphBuilder,
    act: Activation,
    x: Id,
    shape: &[usize],
) -> tl_ir::Result<Id> {
    let mut c = |b: &mut GraphBuilder, v: f64| b.apply(Op::Constant(Tensor::full(shape, v)), &[]);
    let op = |b: &mut GraphBuilder, op: Op, args: &[Id]| b.apply(op, args);
    // max(0, min(1, x/6 + ½)).
    let hard_sigmoid =
        |b: &mut GraphBuilder, c: &mut dyn FnMut(&mut GraphBuilder, f64) -> tl_ir::Result<Id>| {
            let t = b.apply(Op::Scale(1.0 / 6.0), &[x])?;
            let half = c(b, 0.5)?;
            let t = b.apply(Op::Add, &[t, half])?;
            let one = c(b, 1.0)?;
            let t = b.apply(Op::Min, &[t, one])?;
            let zero = c(b, 0.0)?;
            b.apply(Op::Max, &[t, zero])
        };
    // max(0, v) + min(0, alpha·(exp(v) − 1)), v = x·k.
    let elu_parts = |b: &mut GraphBuilder,
                     c: &mut dyn FnMut(&mut GraphBuilder, f64) -> tl_ir::Result<Id>,
                     k: f64,
                     alpha: f64| {
        let zero = c(b, 0.0)?;
        let pos = b.apply(Op::Max, &[x, zero])?;
        let v = b.apply(Op::Scale(k), &[x])?;
        let e = b.apply(Op::Exp, &[v])?;
        let one = c(b, 1.0)?;
        let e = b.apply(Op::Sub, &[e, one])?;
        let e = b.apply(Op::Scale(alpha), &[e])?;
        let neg = b.apply(Op::Min, &[e, zero])?;
        b.apply(Op::Add, &[pos, neg])
    };
    match act {
        Activation::Relu => op(b, Op::Relu, &[x]),
        Activation::Tanh => op(b, Op::Tanh, &[x]),
        Activation::Sigmoid => op(b, Op::Sigmoid, &[x]),
        Activation::Gelu => op(b, Op::Gelu, &[x]),
        Activation::Silu => op(b, Op::Silu, &[x]),
        Activation::Softplus => op(b, Op::Softplus, &[x]),
        Activation::GeluErf => op(b, Op::GeluErf, &[x]),
        Activation::LeakyRelu(s) => op(b, Op::LeakyRelu { negative_slope: s }, &[x]),
        Activation::Elu(alpha) => op(b, Op::Elu { alpha }, &[x]),
        Activation::Hardtanh(lo, hi) => op(b, Op::Clamp { lo, hi }, &[x]),
        Activation::Relu6 => op(b, Op::Clamp { lo: 0.0, hi: 6.0 }, &[x]),
        Activation::Softmax => op(b, Op::Softmax, &[x]),
        Activation::LogSoftmax => op(b, Op::LogSoftmax, &[x]),
        Activation::Softmin => {
            let n = op(b, Op::Scale(-1.0), &[x])?;
            op(b, Op::Softmax, &[n])
        }
        Activation::Hardsigmoid => hard_sigmoid(b, &mut c),
        Activation::Hardswish => {
            let h = hard_sigmoid(b, &mut c)?;
            op(b, Op::Mul, &[x, h])
        }
        Activation::Mish => {
            // x·tanh(log(1 + eˣ)).
            let e = op(b, Op::Exp, &[x])?;
            let one = c(b, 1.0)?;
            let e = op(b, Op::Add, &[e, one])?;
            let l = op(b, Op::Log, &[e])?;
            let t = op(b, Op::Tanh, &[l])?;
            op(b, Op::Mul, &[x, t])
        }
        Activation::Selu => {
            let y = elu_parts(b, &mut c, 1.0, tl_nn::SELU_ALPHA)?;
            op(b, Op::Scale(tl_nn::SELU_SCALE), &[y])
        }
        Activation::Celu(alpha) => elu_parts(b, &mut c, 1.0 / alpha, alpha),
        Activation::LogSigmoid => {
            let s = op(b, Op::Sigmoid, &[x])?;
            op(b, Op::Log, &[s])
        }
        Activation::Softsign => {
            // x · 1/(1 + |x|).
            let a = op(b, Op::Abs, &[x])?;
            let one = c(b, 1.0)?;
            let d = op(b, Op::Add, &[a, one])?;
            let d = op(b, Op::Inv, &[d])?;
            op(b, Op::Mul, &[x, d])
        }
        Activation::Tanhshrink => {
            let t = op(b, Op::Tanh, &[x])?;
            op(b, Op::Sub, &[x, t])
        }
        Activation::Softshrink(l) => {
            // x − clamp(x, −λ, λ).
            let t = op(b, Op::Clamp { lo: -l, hi: l }, &[x])?;
            op(b, Op::Sub, &[x, t])
        }
        Activation::Glu => {
            // a·σ(b), a and b the halves of the last axis picked by 0/1 matrices (the layer
            // transposes and slices).
            let last = shape[shape.len() - 1];
            let (h, rows) = (last / 2, shape.iter().product::<usize>() / last);
            let flat = op(b, Op::Reshape(Shape::new(&[rows, last])), &[x])?;
            let half = |b: &mut GraphBuilder, off: usize| {
                let pick =
                    Tensor::from_fn([last, h], |i| f64::from(u8::from(i / h == i % h + off)));
                let pick = b.apply(Op::Constant(pick), &[])?;
                b.apply(Op::Matmul, &[flat, pick])
            };
            let a = half(b, 0)?;
            let g = half(b, h)?;
            let g = op(b, Op::Sigmoid, &[g])?;
            let y = op(b, Op::Mul, &[a, g])?;
            let mut out = shape.to_vec();
            out[shape.len() - 1] = h;
            op(b, Op::Reshape(Shape::new(&out)), &[y])
        }
    }
}
