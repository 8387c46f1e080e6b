//! Row kernels of the softmax family: one block of [`BLOCK`](super::reduce::BLOCK) threads per
//! row, row max and row sums in the block-tree order of [`super::reduce`].

use super::reduce::{block_max, block_sum};

/// Softmax of each row of `x` (rows of `cols`) into `out`.
///
/// Every pass reads `c·x` (the product rounded, as `scale` writes it): `c = 1` is plain
/// softmax, any other `c` the chain scale → softmax in one launch.
pub fn softmax(x: &[f32], cols: usize, c: f32, out: &mut [f32]) {
    for (xr, yr) in x.chunks(cols).zip(out.chunks_mut(cols)) {
        let m = block_max(cols, |j| c * xr[j]);
        let s = block_sum(cols, |j| (c * xr[j] - m).exp());
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = (c * v - m).exp() / s;
        }
    }
}

/// Log-softmax of each row: `(x − m) − ln Σ exp(x − m)`.
pub fn log_softmax(x: &[f32], cols: usize, out: &mut [f32]) {
    for (xr, yr) in x.chunks(cols).zip(out.chunks_mut(cols)) {
        let m = block_max(cols, |j| xr[j]);
        let lse = block_sum(cols, |j| (xr[j] - m).exp()).ln();
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = (v - m) - lse;
        }
    }
}

/// Softmax VJP from the output `y`, times `c`: `c · (y · (g − Σ g·y))` per row (`c = 1`:
/// the softmax VJP; else the VJP of `softmax(c·x)` with respect to `x`).
pub fn softmax_bwd(y: &[f32], g: &[f32], cols: usize, c: f32, out: &mut [f32]) {
    for ((yr, gr), dr) in y.chunks(cols).zip(g.chunks(cols)).zip(out.chunks_mut(cols)) {
        let dot = block_sum(cols, |j| gr[j] * yr[j]);
        for ((d, &y), &g) in dr.iter_mut().zip(yr).zip(gr) {
            *d = c * (y * (g - dot));
        }
    }
}

/// Log-softmax VJP from the output `y`: `g − exp(y) · Σ g` per row.
pub fn log_softmax_bwd(y: &[f32], g: &[f32], cols: usize, out: &mut [f32]) {
    for ((yr, gr), dr) in y.chunks(cols).zip(g.chunks(cols)).zip(out.chunks_mut(cols)) {
        let s = block_sum(cols, |j| gr[j]);
        for ((d, &y), &g) in dr.iter_mut().zip(yr).zip(gr) {
            *d = g - y.exp() * s;
        }
    }
}
