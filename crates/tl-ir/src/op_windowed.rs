//! Convenience constructors for the conv and pool ops under the seeds' 2-D names
//! (`conv2d`, `convTranspose2d`, `maxPool2d`, `maxPool2dPad`, ...). They are not separate
//! variants: each returns the N-D [`Op`] with 2-element parameter vectors.

use tl_spec::ops::pool::PoolParams;

use crate::Op;

impl Op {
    /// The seeds' `conv2d`: [`Op::Conv`] with the same stride and padding on both spatial axes.
    /// PyTorch: `F.conv2d(x, w, b, stride, padding)`.
    pub fn conv2d(stride: usize, padding: usize) -> Op {
        Op::Conv {
            stride: vec![stride; 2],
            padding: vec![padding; 2],
        }
    }

    /// The seeds' `convTranspose2d`: [`Op::ConvTranspose`] with scalar stride and padding.
    /// PyTorch: `F.conv_transpose2d(x, w, b, stride, padding)`.
    pub fn conv_transpose2d(stride: usize, padding: usize) -> Op {
        Op::ConvTranspose {
            stride: vec![stride; 2],
            padding: vec![padding; 2],
        }
    }

    /// The seeds' `maxPool2d` (no padding): [`Op::MaxPool`] with a `[kH, kW]` kernel.
    /// PyTorch: `F.max_pool2d(x, kernel, stride)`.
    pub fn max_pool2d(kernel: [usize; 2], stride: usize) -> Op {
        Op::max_pool2d_pad(kernel, stride, 0)
    }

    /// The seeds' `maxPool2dPad`: [`Op::MaxPool`] with symmetric padding.
    /// PyTorch: `F.max_pool2d(x, kernel, stride, padding)`.
    pub fn max_pool2d_pad(kernel: [usize; 2], stride: usize, padding: usize) -> Op {
        Op::MaxPool {
            kernel: kernel.to_vec(),
            stride: vec![stride; 2],
            padding: vec![padding; 2],
        }
    }

    /// The seeds' `avgPool2d` (no padding): [`Op::AvgPool`]. PyTorch: `F.avg_pool2d`.
    pub fn avg_pool2d(kernel: [usize; 2], stride: usize) -> Op {
        Op::avg_pool2d_pad(kernel, stride, 0)
    }

    /// The seeds' `avgPool2dPad`: [`Op::AvgPool`] with symmetric padding (counted as zeros).
    /// PyTorch: `F.avg_pool2d(x, kernel, stride, padding, count_include_pad=True)`.
    pub fn avg_pool2d_pad(kernel: [usize; 2], stride: usize, padding: usize) -> Op {
        Op::AvgPool {
            kernel: kernel.to_vec(),
            stride: vec![stride; 2],
            padding: vec![padding; 2],
        }
    }

    /// The seeds' `smoothMaxPool2d` (no padding): [`Op::SmoothMaxPool`].
    pub fn smooth_max_pool2d(kernel: [usize; 2], stride: usize, beta: f64) -> Op {
        Op::smooth_max_pool2d_pad(kernel, stride, 0, beta)
    }

    /// The seeds' `smoothMaxPool2dPad`: [`Op::SmoothMaxPool`] with symmetric padding.
    pub fn smooth_max_pool2d_pad(
        kernel: [usize; 2],
        stride: usize,
        padding: usize,
        beta: f64,
    ) -> Op {
        Op::SmoothMaxPool {
            kernel: kernel.to_vec(),
            stride: vec![stride; 2],
            padding: vec![padding; 2],
            beta,
        }
    }

    /// The window of a pool op (`maxPool`, `avgPool`, `smoothMaxPool`): its kernel, stride and
    /// padding per spatial axis; `None` for any other op.
    pub fn pool_params(&self) -> Option<PoolParams<'_>> {
        match self {
            Op::MaxPool {
                kernel,
                stride,
                padding,
            }
            | Op::AvgPool {
                kernel,
                stride,
                padding,
            }
            | Op::SmoothMaxPool {
                kernel,
                stride,
                padding,
                ..
            } => Some(PoolParams {
                kernel,
                stride,
                padding,
            }),
            _ => None,
        }
    }
}
