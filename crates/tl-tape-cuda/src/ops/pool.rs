//! `maxPool`, `avgPool` and `smoothMaxPool` (N-D, channels-first, batched or not): one window
//! kernel forward ([`Device::pool`]) and one backward ([`Device::pool_bwd`]), which recomputes
//! each window's argmax / softmax weights from the input instead of keeping them.

use tl_ir::Op;
use tl_spec::Shape;

use crate::device::{Buffer, Device, PoolKind, Windows};
use crate::{AnyBuffer, Error, Result};

/// The windows and kind of a pool node with input shape `x` and output shape `y`.
fn geometry(op: &Op, x: &Shape, y: &Shape) -> Result<(Windows, PoolKind)> {
    let (kernel, stride, padding, kind) = match op {
        Op::MaxPool {
            kernel,
            stride,
            padding,
        } => (kernel, stride, padding, PoolKind::Max),
        Op::AvgPool {
            kernel,
            stride,
            padding,
        } => (kernel, stride, padding, PoolKind::Avg),
        Op::SmoothMaxPool {
            kernel,
            stride,
            padding,
            beta,
        } => (
            kernel,
            stride,
            padding,
            PoolKind::SmoothMax(super::elementwise::param(*beta)),
        ),
        _ => return Err(Error::kernel(op.name(), "not a pool op")),
    };
    let d = kernel.len();
    let (xd, yd) = (x.dims(), y.dims());
    if xd.len() < d + 1 || yd.len() != xd.len() {
        return Err(Error::kernel(
            op.name(),
            format!("input {x} and output {y} do not fit kernel {kernel:?}"),
        ));
    }
    let lead = xd.len() - d;
    let win = Windows {
        batch: Shape::saturating_product(&xd[..lead]),
        channels: 1,
        big: xd[lead..].to_vec(),
        small: yd[lead..].to_vec(),
        kernel: kernel.clone(),
        stride: stride.clone(),
        padding: padding.clone(),
    }
    .normalize_strides();
    // The kernels' limits (u32 dims and counts) checked under the op's own name, as conv's
    // are: the device checks again under its primitive's ("pool").
    win.check(op.name())?;
    Ok((win, kind))
}

/// Forward of a pool op on `x` with output shape `shape`.
pub fn forward<D: Device>(dev: &mut D, op: &Op, x: &AnyBuffer, shape: &Shape) -> Result<Buffer> {
    let (win, kind) = geometry(op, x.shape(), shape)?;
    dev.pool(x.buffer(), &win, kind)
}

/// Backward of a pool op: the input's cotangent from the output's `g`.
pub fn backward<D: Device>(
    dev: &mut D,
    op: &Op,
    x: &AnyBuffer,
    y: &AnyBuffer,
    g: Buffer,
) -> Result<Buffer> {
    let (win, kind) = geometry(op, x.shape(), y.shape())?;
    dev.pool_bwd(x.buffer(), g, &win, kind)
}
