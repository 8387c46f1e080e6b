//! [`MaxPool`] and [`AvgPool`]: N-D pooling windows, channels first, optional batch axis.
//! PyTorch: `nn.MaxPool1d/2d/3d`, `nn.AvgPool1d/2d/3d` (count_include_pad=True).

use tl_session::{Param, Train};

use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// A pooling window: kernel, stride and padding per spatial axis.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
}

impl Window {
    fn new(what: &'static str, kernel: &[usize]) -> Result<Self> {
        if kernel.is_empty() || kernel.contains(&0) {
            return Err(usage(
                what,
                format!("need a kernel size ≥ 1 per spatial axis, got {kernel:?}"),
            ));
        }
        Ok(Window {
            kernel: kernel.to_vec(),
            stride: kernel.to_vec(),
            padding: vec![0; kernel.len()],
        })
    }
}

impl Window {
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

macro_rules! pool_layer {
    ($(#[$doc:meta])* $name:ident, $method:ident, $extra:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            window: Window,
        }

        impl $name {
            /// A window of `kernel` (one size per spatial axis), stride = kernel, no padding
            /// (PyTorch's defaults).
            pub fn new(kernel: &[usize]) -> Result<Self> {
                Ok($name { window: Window::new(concat!(stringify!($name), "::new"), kernel)? })
            }

            /// The same window with stride `stride` on every axis.
            pub fn stride(mut self, stride: usize) -> Self {
                self.window.stride = vec![stride; self.window.kernel.len()];
                self
            }

            /// The same window with padding `padding` on every axis.
            pub fn padding(mut self, padding: usize) -> Self {
                self.window.padding = vec![padding; self.window.kernel.len()];
                self
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
                let w = self.window.clone();
                x.op(concat!(stringify!($name), "::forward"), &[], |s| {
                    s.$method(x.tensor_ref(), w.kernel, w.stride, w.padding)
                })
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
