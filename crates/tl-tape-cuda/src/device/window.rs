//! Sliding-window geometry of the conv family's primitives ([`Device::im2col`],
//! [`Device::col2im`], [`Device::pool`], [`Device::pool_bwd`]): a *big* spatial block (conv
//! input, convTranspose output, pool input) and a *small* one (conv output, convTranspose input,
//! pool output), related by `small_i = (big_i + 2·p_i − k_i)/s_i + 1`. Window cell `k` of small
//! cell `o` reads big cell `o·s + k − p` along each axis (outside the block: padding). Spatial
//! rank 1..=[`MAX_RANK`] (the kernels receive the lists as `Dims8`).
//!
//! [`Device::im2col`]: super::Device::im2col
//! [`Device::col2im`]: super::Device::col2im
//! [`Device::pool`]: super::Device::pool
//! [`Device::pool_bwd`]: super::Device::pool_bwd

use super::{Gemm, MAX_RANK, check};
use crate::{Error, Result, abi};

/// The geometry of one windowed launch over `batch · channels` planes. PyTorch: the arguments
/// of `F.unfold` / `F.fold` (dilation 1) and of `F.max_pool*d`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    /// Batch entries (1 for an unbatched operand).
    pub batch: usize,
    /// Channels of the big block (pools: any split of the planes; only the product counts).
    pub channels: usize,
    /// Spatial dims of the big block.
    pub big: Vec<usize>,
    /// Spatial dims of the small block.
    pub small: Vec<usize>,
    /// Kernel extent per axis (≥ 1).
    pub kernel: Vec<usize>,
    /// Stride per axis (≥ 1).
    pub stride: Vec<usize>,
    /// Padding per axis, both sides.
    pub padding: Vec<usize>,
}

/// Element counts of a checked [`Windows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLens {
    /// `batch · channels`.
    pub planes: usize,
    /// Cells of the big block.
    pub big: usize,
    /// Cells of the small block.
    pub small: usize,
    /// Cells of one window (the kernel volume).
    pub kernel: usize,
}

impl WindowLens {
    /// Elements of a big operand `(batch, channels, big...)`.
    pub fn big_len(&self) -> usize {
        self.planes * self.big
    }
    /// Elements of a small operand `(batch, channels, small...)`.
    pub fn small_len(&self) -> usize {
        self.planes * self.small
    }
    /// Elements of a column matrix `(channels, kernel, batch, small)`.
    pub fn cols_len(&self) -> usize {
        self.planes * self.kernel * self.small
    }
}

impl Windows {
    /// These windows with the stride of every axis of at most one window (`small[i] ≤ 1`)
    /// lowered to the least that still gives one window, `big + 2p − k + 1`. Such an axis reads
    /// the same cells whatever its stride, and the shape rules accept any stride ≥ 1 (one past
    /// the input, 2³³, `usize::MAX`: docs/semantics.md, "Pool"), while [`Windows::check`] holds
    /// every stride to the kernels' u32 arguments: the tape ops pass their windows through
    /// this, so such strides compute as on the CPU.
    pub fn normalize_strides(mut self) -> Self {
        for i in 0..self.stride.len() {
            let (Some(&n), Some(&big), Some(&k), Some(&p)) = (
                self.small.get(i),
                self.big.get(i),
                self.kernel.get(i),
                self.padding.get(i),
            ) else {
                break; // lengths that disagree: check() names them
            };
            let one_window = big
                .saturating_add(p.saturating_mul(2))
                .saturating_sub(k)
                .saturating_add(1);
            if n <= 1 && self.stride[i] > one_window {
                self.stride[i] = one_window;
            }
        }
        self
    }

    /// Check the geometry (rank, list lengths, non-zero kernel and stride, the small dims
    /// matching the big ones) and every element count against the `u32` kernel ABI.
    pub fn check(&self, op: &'static str) -> Result<WindowLens> {
        let d = self.big.len();
        if d == 0 || d > MAX_RANK {
            return Err(Error::kernel(
                op,
                format!("spatial rank {d} is outside 1..={MAX_RANK}"),
            ));
        }
        for (what, list) in [
            ("small", &self.small),
            ("kernel", &self.kernel),
            ("stride", &self.stride),
            ("padding", &self.padding),
        ] {
            if list.len() != d {
                return Err(Error::kernel(
                    op,
                    format!(
                        "{what} {list:?} has length {}, spatial rank is {d}",
                        list.len()
                    ),
                ));
            }
            abi::dims_u32(op, list)?;
        }
        abi::dims_u32(op, &self.big)?;
        for i in 0..d {
            let (k, s) = (self.kernel[i], self.stride[i]);
            let padded = self.big[i] + 2 * self.padding[i];
            if k == 0 || s == 0 || padded < k || (padded - k) / s + 1 != self.small[i] {
                return Err(Error::kernel(
                    op,
                    format!(
                        "axis {i}: big {}, small {}, kernel {k}, stride {s}, padding {} do not fit",
                        self.big[i], self.small[i], self.padding[i]
                    ),
                ));
            }
        }
        let lens = WindowLens {
            planes: check::product(op, &[self.batch, self.channels])?,
            big: check::product(op, &self.big)?,
            small: check::product(op, &self.small)?,
            kernel: check::product(op, &self.kernel)?,
        };
        abi::len_u32(op, check::product(op, &[lens.planes, lens.big])?)?;
        abi::len_u32(op, check::product(op, &[lens.planes, lens.small])?)?;
        abi::len_u32(
            op,
            check::product(op, &[lens.planes, lens.kernel, lens.small])?,
        )?;
        Ok(lens)
    }

    /// The flat big-block index read by window cell `k` (row-major over `kernel`) of small cell
    /// `o` (row-major over `small`), or `None` for padding (the kernels' `window_cell`).
    pub fn cell(&self, o: usize, k: usize) -> Option<usize> {
        let (mut o, mut k) = (o, k);
        let (mut flat, mut stride) = (0, 1);
        for i in (0..self.big.len()).rev() {
            let (oi, ki) = (o % self.small[i], k % self.kernel[i]);
            o /= self.small[i];
            k /= self.kernel[i];
            let pos = (oi * self.stride[i] + ki).checked_sub(self.padding[i])?;
            if pos >= self.big[i] {
                return None;
            }
            flat += pos * stride;
            stride *= self.big[i];
        }
        Some(flat)
    }

    /// The small cell whose window cell `k` reads big cell `j`, if any (the kernels'
    /// `window_of`): per axis `o = (j + p − k)/s` when that divides exactly and is in range.
    pub fn window_of(&self, j: usize, k: usize) -> Option<usize> {
        let (mut j, mut k) = (j, k);
        let (mut flat, mut stride) = (0, 1);
        for i in (0..self.big.len()).rev() {
            let (ji, ki) = (j % self.big[i], k % self.kernel[i]);
            j /= self.big[i];
            k /= self.kernel[i];
            let t = (ji + self.padding[i]).checked_sub(ki)?;
            if t % self.stride[i] != 0 || t / self.stride[i] >= self.small[i] {
                return None;
            }
            flat += (t / self.stride[i]) * stride;
            stride *= self.small[i];
        }
        Some(flat)
    }

    /// The product of a conv's weight cotangent over these windows with `out_channels` output
    /// channels: `dw (A, C·K) = g' (A, N·L) · colsᵀ` with the column matrix `cols (C·K, N·L)`
    /// read transposed. The im2col path runs it as a [`Gemm`]; `conv_implicit_dw` splits its
    /// `k = N·L` as that GEMM does ([`Gemm::k_chunk`]).
    pub fn dw_gemm(&self, out_channels: usize) -> Gemm {
        let kernel: usize = self.kernel.iter().product();
        let small: usize = self.small.iter().product();
        Gemm::nn(out_channels, self.batch * small, self.channels * kernel).with_t(false, true)
    }
}

/// Which pooling a [`Device::pool`](super::Device::pool) launch computes (SEMANTICS.md, "Layers").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PoolKind {
    /// Max over the real cells (padding ignored), the first maximum in window order wins; 0 for
    /// a window with no real cell. PyTorch: `F.max_pool*d`.
    Max,
    /// Sum of the real cells over the kernel volume. PyTorch: `F.avg_pool*d`
    /// (`count_include_pad=True`).
    Avg,
    /// `p + log Σ exp(β(v − p))/β` over the window values (padded cells are 0), pivot `p` the
    /// window max (β > 0) or min (β < 0). No PyTorch equivalent.
    SmoothMax(f32),
}

impl PoolKind {
    /// The kernels' `(kind, beta)` arguments: 0 max, 1 avg, 2 smooth max.
    pub fn code(self) -> (u32, f32) {
        match self {
            PoolKind::Max => (0, 0.0),
            PoolKind::Avg => (1, 0.0),
            PoolKind::SmoothMax(b) => (2, b),
        }
    }
}
