//! Softmax and log-softmax along the last axis, leading axes folded into rows (a scalar is one
//! row of one column): one row kernel forward, one backward from the output.

use crate::device::{Buffer, Device};
use crate::{AnyBuffer, Result};

/// Forward of `softmax` (or `logSoftmax` when `log`).
pub fn forward<D: Device>(dev: &mut D, x: &AnyBuffer, log: bool) -> Result<Buffer> {
    let (rows, cols) = x.shape().rows_cols();
    if log {
        dev.log_softmax_rows(x.buffer(), rows, cols)
    } else {
        dev.softmax_rows(x.buffer(), rows, cols)
    }
}

/// Backward from the output `y`: `y·(g − Σ g·y)` (softmax) or `g − exp(y)·Σ g` (log-softmax).
pub fn backward<D: Device>(dev: &mut D, y: &AnyBuffer, g: Buffer, log: bool) -> Result<Buffer> {
    let (rows, cols) = y.shape().rows_cols();
    if log {
        dev.log_softmax_rows_bwd(y.buffer(), g, rows, cols)
    } else {
        dev.softmax_rows_bwd(y.buffer(), g, rows, cols)
    }
}
