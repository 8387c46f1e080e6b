//! User ops ([`tl_ir::UserOp`]): the op's own CPU kernel ([`tl_ir::UserOp::cpu_value`] and
//! [`tl_ir::UserOp::cpu_vjp`], its reference unless it brings a faster one), with what the
//! kernel returns checked against the op's shape rule and operand shapes, so a wrong kernel is an
//! error naming the op, not a wrong value downstream.

use tl_ir::{Op, user};
use tl_spec::{Scalar, Tensor};

use super::{Grads, out_shape, wrong_family};
use crate::Result;

/// The forward value of the user op `op` on `x`.
pub fn forward<T: Scalar>(op: &Op, x: &[&Tensor<T>]) -> Result<Tensor<T>> {
    let Op::User(u) = op else {
        return Err(wrong_family(op, "user"));
    };
    let out = out_shape(op, x)?;
    Ok(user::check_shape(
        u,
        "CPU kernel's value",
        u.cpu_value(x)?,
        &out,
    )?)
}

/// The operand cotangents of the user op `op` at `x` (output `y`, cotangent `g`).
pub fn backward<T: Scalar>(
    op: &Op,
    x: &[&Tensor<T>],
    y: &Tensor<T>,
    g: &Tensor<T>,
) -> Result<Grads<T>> {
    let Op::User(u) = op else {
        return Err(wrong_family(op, "user"));
    };
    let grads = user::check_grads(u, "CPU kernel's VJP", x, u.cpu_vjp(x, y, g)?)?;
    Ok(grads.into_iter().collect())
}
