//! [`AdaptiveAvgPool`]: average pooling to a given output size. PyTorch:
//! `nn.AdaptiveAvgPool1d/2d/3d`.

use tl_session::{Param, Train};
use tl_spec::{Scalar, Tensor};

use super::At;
use super::resample::{along_axis, zero_matrix};
use crate::error::usage;
use crate::{Module, Parameters, Result, Var};

/// Average pooling of x (\[N,\] C, spatial…) to `output` cells per spatial axis (1 to 3 axes),
/// with PyTorch's windows: along an axis of `d` cells, output cell `i` averages input cells
/// `⌊i·d/o⌋ .. ⌈(i+1)·d/o⌉` (so the windows overlap where `o` does not divide `d`). PyTorch:
/// `nn.AdaptiveAvgPool2d(output_size)` (and 1d, 3d); `AdaptiveAvgPool::new(&[1, 1])` is the
/// global average pool before a ResNet's head.
///
/// Each spatial axis with `o ≠ d` is one `matmul` by a constant (d, o) matrix of window weights
/// `1/len` (the axis moved last and back with `swapLastTwo`), so the gradient is every op's
/// own; an axis with `o = d` is left as it is. Checked by tl-conformance's
/// `nn_layers::adaptive_avg_pool` against window sums divided by their counts. The output
/// sizes are checked by [`AdaptiveAvgPool::new`]; the forward pass's errors name the layer
/// (`AdaptiveAvgPool2d: …`), as [`crate::Conv`]'s do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptiveAvgPool {
    output: Vec<usize>,
}

impl AdaptiveAvgPool {
    /// Pooling to `output[k]` cells along spatial axis k (1 to 3 sizes, each ≥ 1).
    pub fn new(output: &[usize]) -> Result<Self> {
        if output.is_empty() || output.len() > 3 || output.contains(&0) {
            return Err(usage(
                "AdaptiveAvgPool::new",
                format!("need 1 to 3 output sizes, each ≥ 1, got {output:?}"),
            ));
        }
        Ok(AdaptiveAvgPool {
            output: output.to_vec(),
        })
    }
}

/// The window of output cell `i` of `o` over an axis of `d` cells (PyTorch's `start_index`,
/// `end_index`).
fn window(i: usize, d: usize, o: usize) -> std::ops::Range<usize> {
    (i * d / o)..((i + 1) * d).div_ceil(o)
}

/// The (d, o) matrix whose column i holds `1/len` on output cell i's window.
fn weights<T: Scalar>(d: usize, o: usize) -> Result<Tensor<T>> {
    let mut m: Vec<T> = zero_matrix("AdaptiveAvgPool::forward", d, o)?;
    for i in 0..o {
        let w = window(i, d, o);
        let share = T::lit(1.0 / w.len() as f64);
        for j in w {
            m[j * o + i] = share;
        }
    }
    Ok(Tensor::new([d, o], m)?)
}

impl Parameters for AdaptiveAvgPool {
    fn visit_params(&self, _: &mut dyn FnMut(&Param)) {}
    fn module_name(&self) -> String {
        format!("AdaptiveAvgPool{}d", self.output.len())
    }
    fn extra_repr(&self) -> String {
        match self.output.as_slice() {
            [o] => format!("output_size={o}"),
            v => format!("output_size={}", crate::display::py_tuple(v)),
        }
    }
}

impl<O: Train> Module<O> for AdaptiveAvgPool {
    fn forward<'g>(&self, x: &Var<'g, O>) -> Result<Var<'g, O>> {
        let at = At::unnamed(x.scope().rt, self);
        let dims = x.dims().to_vec();
        let k = self.output.len();
        if dims.len() != k + 1 && dims.len() != k + 2 {
            return Err(at.input(format!(
                "x must be (C, spatial…) or (N, C, spatial…) with {k} spatial axes, got {dims:?}"
            )));
        }
        let first = dims.len() - k;
        if let Some(axis) = (first..dims.len()).find(|&a| dims[a] == 0) {
            return Err(at.input(format!("spatial axis {axis} of x {dims:?} is empty")));
        }
        let y = || -> Result<Var<'g, O>> {
            let mut y = x.clone();
            for (axis, &o) in (first..).zip(&self.output) {
                let d = dims[axis];
                if o != d {
                    y = along_axis("AdaptiveAvgPool::forward", &y, axis, weights(d, o)?)?;
                }
            }
            Ok(y)
        };
        y().map_err(|e| at.op_error(e))
    }
}
