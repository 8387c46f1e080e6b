//! The reduction order of the simulation device — the order the deterministic CUDA kernels use.
//!
//! # Full reductions (`reduce_sum`, `reduce_mean`): fixed grid, two passes, tree
//!
//! With `B` = [`BLOCK`] = 256 threads per block, a warp of [`WARP`] = 32 lanes and
//! `G = clamp(ceil(n / B), 1, MAX_GRID)` blocks ([`grid_size`]; a function of `n` only, never
//! of the GPU's SM count, so results are identical on every device):
//!
//! 1. **Per-thread sums.** Thread `t` of block `b` (global index `j = b·B + t`) accumulates
//!    `acc = 0.0f; for (i = j; i < n; i += G·B) acc = acc + x[i];` — strictly left to right.
//! 2. **Warp tree.** Each warp reduces its 32 `acc` with `__shfl_down_sync` at offsets
//!    16, 8, 4, 2, 1: lane `l < off` computes `v[l] = v[l] + v[l + off]`. Lane 0 holds
//!    `((v0+v16)+(v8+v24)) + …` ([`warp_tree`]).
//! 3. **Block tree.** Lane 0 of warp `w` writes `smem[w]`; warp 0 loads `smem[l]` for `l < 8`
//!    and `0.0f` for the other lanes and runs the same warp tree ([`block_tree`]). Thread 0
//!    writes `partials[b]`.
//! 4. **Second pass.** One block of `B` threads reduces the `G` partials with steps 1–3
//!    (thread `t` sums `partials[t], partials[t + B], …`) ([`block_sum`]).
//!
//! `reduce_mean` is that sum divided by `(float)n` (one IEEE division).
//!
//! # Row reductions (softmax family)
//!
//! One block of `B` threads per row: the row's max is reduced the same way with `fmaxf`
//! (exact in any order) and the row's sums (`Σ exp(x − m)`, `Σ g·y`, `Σ g`) with steps 1–3.
//!
//! # Axis reductions, broadcast backward, matmul
//!
//! One thread per output element, accumulating from `0.0f` in increasing index order: over the
//! reduced axis for `reduce_axis_sum` (a long axis into few outputs: one block per output,
//! [`axis_sum_by_block`]), over the cotangent elements that map to the output (in
//! row-major order of the cotangent) for `reduce_broadcast`, over `k` for each matmul output
//! (few output tiles: in runs of `k`, [`crate::device::Gemm::k_chunk`]; each term one fused
//! multiply-add, `sim/linalg.rs`). No contracted multiply-add: the CUDA kernels use
//! `__fmul_rn` / `__fadd_rn` (and `--fmad=false`) so that `acc + a·b` is two roundings, as in
//! Rust, and write `__fmaf_rn` where `f32::mul_add` is meant.

/// Threads per block.
pub const BLOCK: usize = 256;
/// Lanes per warp.
pub const WARP: usize = 32;
/// The largest grid of a full reduction's first pass.
pub const MAX_GRID: usize = 1024;

/// Blocks of the first pass of a full reduction of `n` elements: `clamp(ceil(n/B), 1, MAX_GRID)`.
pub fn grid_size(n: usize) -> usize {
    n.div_ceil(BLOCK).clamp(1, MAX_GRID)
}

/// The shuffle-down tree over one warp's lanes; returns lane 0's value.
pub fn warp_tree(v: &mut [f32; WARP], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut off = WARP / 2;
    while off > 0 {
        for l in 0..off {
            v[l] = op(v[l], v[l + off]);
        }
        off /= 2;
    }
    v[0]
}

/// The block tree over `BLOCK` per-thread values: a warp tree per warp, then warp 0 reduces the
/// warp results padded with `identity` to 32 lanes.
pub fn block_tree(vals: &[f32; BLOCK], identity: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut warps = [identity; WARP];
    for (w, lanes) in vals.chunks_exact(WARP).enumerate() {
        let mut v: [f32; WARP] = lanes.try_into().expect("a chunk is one warp");
        warps[w] = warp_tree(&mut v, &op);
    }
    warp_tree(&mut warps, &op)
}

/// One block reducing `n` values `f(0..n)`: thread `t` folds `f(t), f(t + B), …` left to right
/// from `identity`, then the block tree.
pub fn block_reduce(
    n: usize,
    identity: f32,
    f: impl Fn(usize) -> f32,
    op: impl Fn(f32, f32) -> f32,
) -> f32 {
    let mut vals = [identity; BLOCK];
    for (t, v) in vals.iter_mut().enumerate() {
        let mut i = t;
        while i < n {
            *v = op(*v, f(i));
            i += BLOCK;
        }
    }
    block_tree(&vals, identity, op)
}

/// [`block_reduce`] with `+` from `0.0`.
pub fn block_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    block_reduce(n, 0.0, f, |a, b| a + b)
}

/// [`block_reduce`] with `fmaxf` from `−∞` (NaN-ignoring, like CUDA's `fmaxf`).
pub fn block_max(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    block_reduce(n, f32::NEG_INFINITY, f, f32::max)
}

/// The two-pass full sum of `x` (steps 1–4 above).
pub fn grid_sum(x: &[f32]) -> f32 {
    let n = x.len();
    let grid = grid_size(n);
    let stride = grid * BLOCK;
    let partials: Vec<f32> = (0..grid)
        .map(|b| {
            let mut vals = [0.0f32; BLOCK];
            for (t, v) in vals.iter_mut().enumerate() {
                let mut i = b * BLOCK + t;
                while i < n {
                    *v += x[i];
                    i += stride;
                }
            }
            block_tree(&vals, 0.0, |a, b| a + b)
        })
        .collect();
    block_sum(grid, |i| partials[i])
}

/// The longest reduced axis an axis sum still gives one thread per output
/// ([`axis_sum_by_block`]).
pub const AXIS_THREAD_MAX_N: usize = 63;
/// The most outputs an axis sum gives one block each ([`axis_sum_by_block`]).
pub const AXIS_BLOCK_MAX_OUT: usize = 4096;

/// Whether an axis sum over (outer, n, inner) gives each output a block of [`BLOCK`] threads
/// (`tl_axis_sum_block`) instead of one thread (`tl_axis_sum`): the rule of
/// [`gates::sum_by_block`](crate::gates::sum_by_block) (a reduced axis longer than
/// [`AXIS_THREAD_MAX_N`] and at most [`AXIS_BLOCK_MAX_OUT`] outputs).
pub fn axis_sum_by_block(outer: usize, n: usize, inner: usize) -> bool {
    crate::gates::sum_by_block(n, outer * inner)
}

/// Sum over the middle axis of `x` viewed as (outer, n, inner), one output per (o, i),
/// accumulated in increasing k from `0.0` — or, where [`axis_sum_by_block`], by one block:
/// thread `t` folds `k = t, t + B, …` from `0.0`, then the block tree ([`block_sum`]). Each
/// sum is divided by `n` when `mean`. Nothing is done when `outer · inner` is 0 (no output
/// element), however large `outer` is.
pub fn axis_sum(x: &[f32], outer: usize, n: usize, inner: usize, mean: bool, out: &mut [f32]) {
    if outer == 0 || inner == 0 {
        return;
    }
    let by_block = axis_sum_by_block(outer, n, inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * n + k) * inner + i];
            let acc = if by_block {
                block_sum(n, at)
            } else {
                (0..n).fold(0.0f32, |acc, k| acc + at(k))
            };
            out[o * inner + i] = if mean { acc / n as f32 } else { acc };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented order written out the slow way: every thread of every block, then
    /// pairwise trees, as a GPU would run it.
    fn reference_order(x: &[f32]) -> f32 {
        let grid = grid_size(x.len());
        let mut thread_acc = vec![0.0f32; grid * BLOCK];
        for (i, &v) in x.iter().enumerate() {
            thread_acc[i % (grid * BLOCK)] += v;
        }
        let tree = |v: &mut Vec<f32>| {
            // pairwise halving over a power-of-two length
            let mut len = v.len();
            while len > 1 {
                len /= 2;
                for l in 0..len {
                    v[l] += v[l + len];
                }
            }
            v[0]
        };
        let block = |acc: &[f32]| {
            let mut warps: Vec<f32> = acc.chunks(WARP).map(|w| tree(&mut w.to_vec())).collect();
            warps.resize(WARP, 0.0);
            tree(&mut warps)
        };
        let partials: Vec<f32> = thread_acc.chunks(BLOCK).map(block).collect();
        let mut second = vec![0.0f32; BLOCK];
        for (i, &p) in partials.iter().enumerate() {
            second[i % BLOCK] += p;
        }
        block(&second)
    }

    #[test]
    fn grid_sum_follows_the_documented_order_bit_for_bit() {
        for n in [0usize, 1, 31, 257, 4096, 300_001] {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    ((i * 7919 % 1013) as f32 - 500.0) * 1e-3 + if i % 97 == 0 { 1e4 } else { 0.0 }
                })
                .collect();
            assert_eq!(
                grid_sum(&x).to_bits(),
                reference_order(&x).to_bits(),
                "n = {n}"
            );
        }
    }

    #[test]
    fn tree_order_differs_from_a_left_to_right_sum() {
        // 1e8 + 1 + 1 + ... loses every 1 left to right (the f32 spacing at 1e8 is 8); the tree
        // adds most of the ones together before they meet 1e8.
        let mut x = vec![1.0f32; 64];
        x[0] = 1e8;
        let exact = 1e8f64 + 63.0;
        let sequential: f32 = x.iter().sum();
        assert_eq!(sequential, 1e8);
        let tree = grid_sum(&x);
        assert!((f64::from(tree) - exact).abs() < (f64::from(sequential) - exact).abs());
        assert_eq!(
            tree,
            1e8 + 56.0,
            "lane 0 meets 1+2+4+8+16 one power at a time, then 32"
        );
    }

    #[test]
    fn grid_is_a_function_of_n_only() {
        assert_eq!(grid_size(0), 1);
        assert_eq!(grid_size(256), 1);
        assert_eq!(grid_size(257), 2);
        assert_eq!(grid_size(1 << 30), MAX_GRID);
    }
}
