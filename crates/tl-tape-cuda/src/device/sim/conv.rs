//! The conv family's kernels on the host (twins of kernels/conv.cu): `im2col`, the fixed-order
//! (gather) `col2im`, the implicit-GEMM convolution, the pooling forward and the fixed-order
//! pooling backward. Every output
//! element is computed by one "thread" that walks its cells in the order the CUDA kernel does.

use super::linalg;
use crate::device::{PoolKind, Windows};
use crate::precision::Precision;

/// `cols[c, k, n, o] = x[n, c, cell(o, k)]` (0 for padding); one thread per column element.
pub fn im2col(x: &[f32], w: &Windows, out: &mut [f32]) {
    let (kl, sl, bl) = (
        w.kernel.iter().product::<usize>(),
        w.small.iter().product::<usize>(),
        w.big.iter().product::<usize>(),
    );
    for (i, v) in out.iter_mut().enumerate() {
        let o = i % sl;
        let n = (i / sl) % w.batch;
        let k = (i / (sl * w.batch)) % kl;
        let c = i / (sl * w.batch * kl);
        *v = w
            .cell(o, k)
            .map_or(0.0, |j| x[(n * w.channels + c) * bl + j]);
    }
}

/// The implicit-GEMM convolution (`tl_conv_implicit`): `out[n, a, o] = Σ_p w[a, p] · x[n, c,
/// cell(o, k)]` over `p = c·K + k` in increasing order from `0.0` as `fma(w, x, acc)`, a
/// padding cell contributing `fma(w, 0, acc)`, as the tiled kernel sums its staged slices; one
/// thread per output element. `a` output channels; `w` is `(a, channels·K)` row-major.
///
/// Under autocast (`prec` `Bf16` / `Tf32`) the twin of `tl_conv_implicit_tc` as the emulator
/// runs it: each operand element rounded ([`Precision::round`]), the same order, and `+ 0.0`
/// where `channels·K` is not a multiple of [`linalg::TC_K`] (the last slice's zero padding, as
/// [`linalg::gemm`] pads a run).
pub fn conv_implicit(
    w: &[f32],
    x: &[f32],
    win: &Windows,
    a: usize,
    out: &mut [f32],
    prec: Precision,
) {
    let (kl, sl, bl) = (
        win.kernel.iter().product::<usize>(),
        win.small.iter().product::<usize>(),
        win.big.iter().product::<usize>(),
    );
    let ck = win.channels * kl;
    for (i, v) in out.iter_mut().enumerate() {
        let o = i % sl;
        let r = (i / sl) % a;
        let n = i / (sl * a);
        let xn = &x[n * win.channels * bl..];
        let wr = &w[r * ck..(r + 1) * ck];
        let mut acc = 0.0f32;
        for (p, &wv) in wr.iter().enumerate() {
            let xv = win.cell(o, p % kl).map_or(0.0, |j| xn[(p / kl) * bl + j]);
            acc = prec.round(wv).mul_add(prec.round(xv), acc);
        }
        *v = linalg::tc_padded(acc, ck, prec);
    }
}

/// The implicit-GEMM conv's input cotangent (`tl_conv_implicit_dx`): thread `(n, c, j)` walks
/// the window cells `k` from last to first; where small cell `o` reads `j` through cell `k`, it
/// sums `part = Σ_a w[a, c, k]·g[n, a, o]` in increasing `a` from `0.0` as `fma`, and adds it:
/// `acc + part` from `0.0` (the gather [`col2im`] of the GEMM `wᵀ · g'`, unsplit).
///
/// Under autocast (`prec` `Bf16` / `Tf32`) the twin of `tl_conv_implicit_dx_tc`: each operand
/// element rounded, each `part` padded ([`linalg::tc_padded`] over `a` terms), the same order.
pub fn conv_implicit_dx(
    w: &[f32],
    g: &[f32],
    win: &Windows,
    a: usize,
    out: &mut [f32],
    prec: Precision,
) {
    let (kl, sl, bl) = (
        win.kernel.iter().product::<usize>(),
        win.small.iter().product::<usize>(),
        win.big.iter().product::<usize>(),
    );
    let ck = win.channels * kl;
    for (i, v) in out.iter_mut().enumerate() {
        let j = i % bl;
        let c = (i / bl) % win.channels;
        let n = i / (bl * win.channels);
        let mut acc = 0.0f32;
        for k in (0..kl).rev() {
            if let Some(o) = win.window_of(j, k) {
                let mut part = 0.0f32;
                for r in 0..a {
                    let (wv, gv) = (w[r * ck + c * kl + k], g[(n * a + r) * sl + o]);
                    part = prec.round(wv).mul_add(prec.round(gv), part);
                }
                acc += linalg::tc_padded(part, a, prec);
            }
        }
        *v = acc;
    }
}

/// The implicit-GEMM conv's weight cotangent (`tl_conv_implicit_dw`): thread `(r, c, k)` sums
/// `g[n, r, o] · x[n, c, cell(o, k)]` over `p = n·L + o` (a padding cell as `fma(g, 0, acc)`)
/// in the runs of [`Windows::dw_gemm`]'s split ([`crate::device::Gemm::k_chunk`]), each in
/// increasing `p` from `0.0` as `fma(g, x, acc)`, the runs added by [`linalg::split_sum`]: the
/// arithmetic of [`linalg::gemm`] on `g' · im2col(x)ᵀ`, term for term. `a` output channels; the
/// result `(a, channels·K)` row-major.
///
/// Under autocast (`prec` `Bf16` / `Tf32`) the twin of `tl_conv_implicit_dw_tc`: the split
/// counts the tensor-core kernel's tiles ([`crate::device::split_tile`]), each operand element
/// is rounded and each run padded ([`linalg::tc_padded`]): [`linalg::gemm`] at `prec`, term
/// for term.
pub fn conv_implicit_dw(
    g: &[f32],
    x: &[f32],
    win: &Windows,
    a: usize,
    out: &mut [f32],
    prec: Precision,
) {
    let (kl, sl, bl) = (
        win.kernel.iter().product::<usize>(),
        win.small.iter().product::<usize>(),
        win.big.iter().product::<usize>(),
    );
    let ck = win.channels * kl;
    let gm = win.dw_gemm(a);
    let chunk = gm.k_chunk_tiled(1, crate::device::split_tile(prec));
    for (i, v) in out.iter_mut().enumerate() {
        let (r, q) = (i / ck, i % ck);
        let (c, k) = (q / kl, q % kl);
        let run = |p0: usize, p1: usize| {
            let mut acc = 0.0f32;
            for p in p0..p1 {
                let (n, o) = (p / sl, p % sl);
                let xv = win
                    .cell(o, k)
                    .map_or(0.0, |j| x[(n * win.channels + c) * bl + j]);
                acc = prec
                    .round(g[(n * a + r) * sl + o])
                    .mul_add(prec.round(xv), acc);
            }
            linalg::tc_padded(acc, p1 - p0, prec)
        };
        *v = linalg::split_sum(gm.k, chunk, run);
    }
}

/// The gather form of `col2im`: thread `(n, c, j)` walks the window cells `k` from last to first
/// (so the small cells `o` reading `j` come in increasing order) and sums `cols[c, k, n, o]`
/// from 0.
pub fn col2im(cols: &[f32], w: &Windows, out: &mut [f32]) {
    let (kl, sl, bl) = (
        w.kernel.iter().product::<usize>(),
        w.small.iter().product::<usize>(),
        w.big.iter().product::<usize>(),
    );
    for (i, v) in out.iter_mut().enumerate() {
        let j = i % bl;
        let c = (i / bl) % w.channels;
        let n = i / (bl * w.channels);
        let mut acc = 0.0f32;
        for k in (0..kl).rev() {
            if let Some(o) = w.window_of(j, k) {
                acc += cols[((c * kl + k) * w.batch + n) * sl + o];
            }
        }
        *v = acc;
    }
}

/// One window's statistics, walked in window order: the argmax among the real cells
/// ([`tl_spec::ops::pool::takes_max`]: the first NaN, else the first max), the sum of the real cells,
/// and for smooth max the pivot and `z = Σ exp(β(v − p))` over all cells (padding as 0).
struct Stats {
    argmax: Option<usize>,
    sum: f32,
    pivot: f32,
    z: f32,
}

fn stats(x: &[f32], base: usize, w: &Windows, o: usize, kl: usize, kind: PoolKind) -> Stats {
    let mut s = Stats {
        argmax: None,
        sum: 0.0,
        pivot: 0.0,
        z: 0.0,
    };
    let mut best = 0.0f32;
    for k in 0..kl {
        if let Some(j) = w.cell(o, k) {
            let v = x[base + j];
            if s.argmax.is_none() || tl_spec::ops::pool::takes_max(best, v) {
                s.argmax = Some(j);
                best = v;
            }
            s.sum += v;
        }
    }
    if let PoolKind::SmoothMax(beta) = kind {
        let val = |k: usize| w.cell(o, k).map_or(0.0, |j| x[base + j]);
        let mut p = if beta > 0.0 {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        };
        for k in 0..kl {
            p = if beta > 0.0 {
                p.max(val(k))
            } else {
                p.min(val(k))
            };
        }
        let mut z = 0.0f32;
        for k in 0..kl {
            z += (beta * (val(k) - p)).exp();
        }
        s.pivot = p;
        s.z = z;
    }
    s
}

/// One thread per output `(plane, o)`: max, mean (sum over the kernel volume) or smooth max.
pub fn pool(x: &[f32], w: &Windows, kind: PoolKind, out: &mut [f32]) {
    let (kl, sl, bl) = (
        w.kernel.iter().product::<usize>(),
        w.small.iter().product::<usize>(),
        w.big.iter().product::<usize>(),
    );
    for (i, v) in out.iter_mut().enumerate() {
        let (plane, o) = (i / sl, i % sl);
        let s = stats(x, plane * bl, w, o, kl, kind);
        *v = match kind {
            PoolKind::Max => s.argmax.map_or(0.0, |j| x[plane * bl + j]),
            PoolKind::Avg => s.sum / kl as f32,
            PoolKind::SmoothMax(beta) => s.pivot + s.z.ln() / beta,
        };
    }
}

/// The share of window `o`'s cotangent `g` that big cell `j` (window cell `k`) receives.
fn share(x: &[f32], base: usize, s: &Stats, j: usize, g: f32, kl: usize, kind: PoolKind) -> f32 {
    match kind {
        PoolKind::Max => {
            if s.argmax == Some(j) {
                g
            } else {
                0.0
            }
        }
        PoolKind::Avg => g / kl as f32,
        PoolKind::SmoothMax(beta) => g * ((beta * (x[base + j] - s.pivot)).exp() / s.z),
    }
}

/// The gather form of the pooling VJP: thread `(plane, j)` walks the windows reading `j` in
/// increasing order (window cells from last to first), recomputes each window's statistics and
/// sums its share from 0.
pub fn pool_bwd(x: &[f32], g: &[f32], w: &Windows, kind: PoolKind, out: &mut [f32]) {
    let (kl, sl, bl) = (
        w.kernel.iter().product::<usize>(),
        w.small.iter().product::<usize>(),
        w.big.iter().product::<usize>(),
    );
    for (i, v) in out.iter_mut().enumerate() {
        let (plane, j) = (i / bl, i % bl);
        let base = plane * bl;
        let mut acc = 0.0f32;
        for k in (0..kl).rev() {
            if let Some(o) = w.window_of(j, k) {
                let s = stats(x, base, w, o, kl, kind);
                acc += share(x, base, &s, j, g[plane * sl + o], kl, kind);
            }
        }
        *v = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1×1 windows over `channels` input channels of one cell, one output channel.
    fn win(channels: usize) -> Windows {
        Windows {
            batch: 1,
            channels,
            big: vec![1],
            small: vec![1],
            kernel: vec![1],
            stride: vec![1],
            padding: vec![0],
        }
    }

    #[test]
    fn under_autocast_the_implicit_conv_rounds_its_operands_and_pads_to_the_slice() {
        // An underflowing sum is −0 in f32; under autocast a depth that is not a multiple of
        // the 16-deep slice adds the padding's fma(0, 0, acc): +0; a depth of 16 does not.
        let (w, x) = (-(2f32.powi(-100)), 2f32.powi(-100));
        let mut out = [0.0f32];
        for (channels, prec, want) in [
            (1, Precision::F32, -0.0f32),
            (1, Precision::Bf16, 0.0),
            (1, Precision::Tf32, 0.0),
            (linalg::TC_K, Precision::Bf16, -0.0),
            (linalg::TC_K + 1, Precision::Tf32, 0.0),
        ] {
            let (ws, xs) = (vec![w; channels], vec![x; channels]);
            conv_implicit(&ws, &xs, &win(channels), 1, &mut out, prec);
            assert_eq!(out[0].to_bits(), want.to_bits(), "{channels} {prec:?}");
        }
        // 1 + 2⁻⁹ rounds to 1 in bf16; TF32 keeps it.
        let x = 1.0 + 2f32.powi(-9);
        for (prec, want) in [
            (Precision::F32, 3.0 * x),
            (Precision::Bf16, 3.0),
            (Precision::Tf32, 3.0 * x),
        ] {
            conv_implicit(&[3.0], &[x], &win(1), 1, &mut out, prec);
            assert_eq!(out[0], want, "{prec:?}");
        }
    }
}
