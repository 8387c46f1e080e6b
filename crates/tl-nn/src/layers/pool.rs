//! [`MaxPool`] and [`AvgPool`]: N-D pooling windows, channels first, optional batch axis.
//! PyTorch: `nn.MaxPool1d/2d/3d`, `nn.AvgPool1d/2d/3d` (count_include_pad=True).
//!
//! The window is checked as it is built: [`MaxPool::new`], [`MaxPool::stride`] and
//! [`MaxPool::padding`] (and [`AvgPool`]'s) refuse a setting no input could pool with (an
//! error naming the layer, the setting and the value), so the forward pass only meets inputs
//! that do not fit, and its errors name the layer (`MaxPool2d: …`), as [`crate::Conv`]'s do.

use tl_session::{Param, Train};

use super::At;
use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// A pooling window: kernel, stride and padding per spatial axis, each setting checked when
/// it is set ([`Window::new`], [`Window::with_stride`], [`Window::with_padding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
}

impl Window {
    /// Kernel `kernel`, stride = kernel, no padding; `what` names the call in errors
    /// (`MaxPool::new`).
    fn new(what: &'static str, kernel: &[usize]) -> Result<Self> {
        Window {
            kernel: kernel.to_vec(),
            stride: kernel.to_vec(),
            padding: vec![0; kernel.len()],
        }
        .checked(what)
    }

    /// The same window with stride `stride` (≥ 1) on every axis.
    fn with_stride(mut self, what: &'static str, stride: usize) -> Result<Self> {
        self.stride = vec![stride; self.kernel.len()];
        self.checked(what)
    }

    /// The same window with padding `padding` on every axis, at most half of every kernel size
    /// (PyTorch's rule: a window always holds a real cell).
    fn with_padding(mut self, what: &'static str, padding: usize) -> Result<Self> {
        self.padding = vec![padding; self.kernel.len()];
        self.checked(what)
    }

    /// This window if the pool ops take it ([`tl_spec::ops::pool::pool_params`], the ops' own
    /// check), else an error of `what` with the op's reason.
    fn checked(self, what: &'static str) -> Result<Self> {
        let p = tl_spec::ops::pool::PoolParams {
            kernel: &self.kernel,
            stride: &self.stride,
            padding: &self.padding,
        };
        match tl_spec::ops::pool::pool_params("pool", p) {
            Ok(()) => Ok(self),
            Err(tl_spec::Error::Param { detail, .. }) => Err(usage(what, detail)),
            Err(e) => Err(usage(what, e.to_string())),
        }
    }

    /// `kernel_size=2, stride=2, padding=0` (one number where the axes agree, as PyTorch
    /// prints what it was given).
    fn repr(&self) -> String {
        let one = |v: &[usize]| match v {
            [first, rest @ ..] if rest.iter().all(|x| x == first) => first.to_string(),
            _ => crate::display::py_tuple(v),
        };
        format!(
            "kernel_size={}, stride={}, padding={}",
            one(&self.kernel),
            one(&self.stride),
            one(&self.padding)
        )
    }
}

/// The input check of a pool with `k` spatial axes: x must be (C, …k) or (N, C, …k).
fn check_input<O: Train>(at: &At<'_, O>, x: &Var<'_, O>, k: usize) -> Result<()> {
    let rank = x.dims().len();
    if rank == k + 1 || rank == k + 2 {
        return Ok(());
    }
    let axes = if k == 1 { "axis" } else { "axes" };
    Err(at.input(format!(
        "input {} has {rank} axes: a pool with {k} spatial {axes} takes (C, spatial…) or (N, C, spatial…), {} or {} axes",
        x.shape(),
        k + 1,
        k + 2
    )))
}

macro_rules! pool_layer {
    ($(#[$doc:meta])* $name:ident, $method:ident, $extra:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            window: Window,
        }

        impl $name {
            /// A window of `kernel` (one size per spatial axis, 1 to 8 axes, each ≥ 1),
            /// stride = kernel, no padding (PyTorch's defaults). An error naming the kernel
            /// otherwise.
            pub fn new(kernel: &[usize]) -> Result<Self> {
                Ok($name { window: Window::new(concat!(stringify!($name), "::new"), kernel)? })
            }

            /// The same window with stride `stride` on every axis; a stride of 0 is an error
            /// naming it.
            pub fn stride(self, stride: usize) -> Result<Self> {
                let what = concat!(stringify!($name), "::stride");
                Ok($name { window: self.window.with_stride(what, stride)? })
            }

            /// The same window with padding `padding` on every axis; padding above half a
            /// kernel size (PyTorch's rule: `2·padding ≤ kernel`) is an error naming it and the
            /// kernel.
            pub fn padding(self, padding: usize) -> Result<Self> {
                let what = concat!(stringify!($name), "::padding");
                Ok($name { window: self.window.with_padding(what, padding)? })
            }
        }

        impl Parameters for $name {
            fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
            fn module_name(&self) -> String {
                format!("{}{}d", stringify!($name), self.window.kernel.len())
            }
            fn extra_repr(&self) -> String {
                format!("{}{}", self.window.repr(), $extra)
            }
        }

        impl<O: Train> Module<O> for $name {
            fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
                let at = At::unnamed(x.scope().rt, self);
                check_input(&at, x, self.window.kernel.len())?;
                let w = self.window.clone();
                x.op(concat!(stringify!($name), "::forward"), &[], |s| {
                    s.$method(x.tensor_ref(), w.kernel, w.stride, w.padding)
                })
                .map_err(|e| at.op_error(e))
            }
        }
    };
}

pool_layer!(
    /// Max over each window; padded cells are ignored; ties go to the first element.
    /// PyTorch: `nn.MaxPoolNd`.
    MaxPool,
    max_pool,
    ", dilation=1, ceil_mode=False"
);
pool_layer!(
    /// Mean over each window, padded cells counted as 0 (divisor = kernel volume).
    /// PyTorch: `nn.AvgPoolNd(count_include_pad=True)`.
    AvgPool,
    avg_pool,
    ""
);
