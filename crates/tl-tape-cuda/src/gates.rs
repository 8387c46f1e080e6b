//! Size-gated paths of the CUDA tape and their overrides, for tests (the CPU tape's
//! `tl_tape_cpu::gates` is the model): a fast path taken above a threshold is tested with the
//! threshold forced both ways. An override is installed **on the calling thread** until the
//! returned guard drops; with none installed every decision is the production one.
//!
//! | gate | production rule | override |
//! |---|---|---|
//! | conv forward, input and weight cotangents by the implicit-GEMM kernels ([`conv_implicit`]; the weight cotangent where the forward takes its kernel; under autocast on the tensor cores, `tl_conv_implicit_tc`, `_dw_tc`, `_dx_tc`, rounding as they stage) | at least [`CONV_IMPLICIT_MIN_TILES`] output tiles of 64×64 | [`force_conv_implicit_min_tiles`]: `Some(0)` always, `Some(usize::MAX)` never |
//! | an optimizer step on a device in one launch per parameter, or per eight in a step over all of them ([`fused_optimizer`]: [`Device::adam_update`](crate::Device::adam_update), [`Device::momentum_update`](crate::Device::momentum_update) and their `_list` forms) instead of one launch per operation of the rule | always (Adam, AdamW, momentum SGD after its first step) | [`force_fused_optimizer`]: `Some(false)` composes the rule from the primitives |
//! | a matmul split along `k` over several blocks (split-K: [`Gemm::k_chunk_tiled`](crate::Gemm::k_chunk_tiled), the simulation device and the CUDA launch alike) | under [`split_k_tiles`] output tiles of the kernel's own side, `k` at least two runs of 128 | [`force_split_k_tiles`]: `Some(n)` splits below `n` tiles, `Some(0)` never |
//! | an axis sum (`tl_axis_sum_block`: reduceSum, reduceMean, the bias cotangents of linear and conv) and a norm's `dγ`/`dβ` (`tl_norm_bwd_affine_block`) by one block of threads per output instead of one thread ([`sum_by_block`]) | a sum of more than [`AXIS_THREAD_MAX_N`] terms into at most [`AXIS_BLOCK_MAX_OUT`] outputs | [`force_sums_by_block`]: `Some(true)` every sum of at least one term into at most [`AXIS_BLOCK_MAX_OUT`] outputs, `Some(false)` none |
//! | a normalization's forward in one launch (`tl_norm_fwd`) instead of `tl_norm_stats` then `tl_norm_apply` ([`NormLayout::fused_forward`](crate::device::NormLayout::fused_forward); the same bits) | groups of at most [`NORM_FUSED_MAX`] elements whose sums are not split | [`force_norm_fused_max`]: `Some(0)` never, `Some(usize::MAX)` wherever the sums are not split |
//! | a normalization's group sums (statistics, `batchMoments`, `dx`, and `dγ`/`dβ` where the features are the groups) split over several blocks a group (`tl_norm_split_*`: chunk sums folded in a fixed order; other bits than one block a group) ([`norm_split_parts`]) | groups of more than [`NORM_SPLIT_MIN_CHUNK`] elements, fewer than [`NORM_SPLIT_BLOCKS`] groups: `min(⌈m / NORM_SPLIT_MIN_CHUNK⌉, ⌈NORM_SPLIT_BLOCKS / groups⌉)` parts | [`force_norm_split_parts`]: `Some(1)` never, `Some(p)` p parts a group everywhere |
//! | the fused attention backward on a `CudaDevice` in one pass (`tl_flash_bwd_delta`, `tl_flash_bwd_atomic`: dQ added over the key blocks with `atomicAdd`) instead of the two fixed-order kernels (`tl_flash_bwd_q`, `tl_flash_bwd_kv`) ([`flash_bwd_one_pass`]) | the device's reductions not deterministic (`CudaDevice::deterministic`) and d ≤ [`FLASH_ONE_PASS_MAX_HEAD`] | [`force_flash_bwd_one_pass`]: `Some(true)` one pass wherever d ≤ 64, `Some(false)` never |

use std::cell::Cell;

use crate::device::norm::{
    NORM_FUSED_MAX, NORM_SPLIT_BLOCKS, NORM_SPLIT_MAX_PARTS, NORM_SPLIT_MIN_CHUNK,
};
use crate::device::sim::reduce::{AXIS_BLOCK_MAX_OUT, AXIS_THREAD_MAX_N};
use crate::device::{FLASH_ONE_PASS_MAX_HEAD, SPLIT_K_TILES};

/// The fewest 64×64 output tiles from which a conv's forward (`(out_channels, batch·small)`
/// outputs) runs the implicit-GEMM kernel `tl_conv_implicit` instead of `im2col` and the GEMM,
/// and its input cotangent (`(channels, batch·big)` outputs) `tl_conv_implicit_dx` instead of
/// the GEMM and `col2im`: [`SPLIT_K_TILES`], where the GEMM stops splitting `k`, so there the
/// two paths give the same bits. Below it the GEMM may split a long `k` over more blocks,
/// which those two kernels do not. The weight cotangent (`tl_conv_implicit_dw`, which splits
/// its `k = batch·small` as the GEMM does, so its bits are the GEMM's at any size) follows the
/// forward's decision.
pub const CONV_IMPLICIT_MIN_TILES: usize = SPLIT_K_TILES;

/// The most 64-row tiles of output channels a grid holds (`gridDim.y`).
const GRID_Y_MAX: usize = 65_535;

thread_local! {
    static CONV_IMPLICIT_MIN: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Use `min_tiles` instead of [`CONV_IMPLICIT_MIN_TILES`] on this thread until the guard
/// drops (`None`: the production threshold): `Some(0)` sends every conv forward, input
/// and weight cotangent to the implicit kernels (at any precision), `Some(usize::MAX)` none.
pub fn force_conv_implicit_min_tiles(min_tiles: Option<usize>) -> Guard {
    tl_spec::scoped::install(&CONV_IMPLICIT_MIN, min_tiles)
}

/// Restores the override [`force_conv_implicit_min_tiles`] replaced when dropped.
pub type Guard = tl_spec::scoped::Guard<Option<usize>>;

/// Whether a conv product with `rows` output rows (the forward and the weight cotangent: output
/// channels; the input cotangent: input channels) over `cols` output columns (`batch·small`;
/// `batch·big`) runs its implicit-GEMM kernel: at least the threshold's tiles, and a grid that
/// holds the rows. At every precision: under autocast the kernels' tensor-core twins run,
/// rounding the operands as they stage them, each product the exact product of rounded
/// operands (docs/semantics.md, "Mixed precision").
pub fn conv_implicit(rows: usize, cols: usize) -> bool {
    let min = CONV_IMPLICIT_MIN
        .with(Cell::get)
        .unwrap_or(CONV_IMPLICIT_MIN_TILES);
    let tiles_y = rows.div_ceil(64);
    tiles_y <= GRID_Y_MAX && tiles_y.saturating_mul(cols.div_ceil(64)) >= min
}

thread_local! {
    static SPLIT_K_MIN_TILES: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The output tiles from which a matmul is not split along `k`: [`SPLIT_K_TILES`] unless
/// overridden on this thread ([`force_split_k_tiles`]). The sim and the CUDA launch read it
/// alike, so they split the same way under an override too.
pub fn split_k_tiles() -> usize {
    SPLIT_K_MIN_TILES.with(Cell::get).unwrap_or(SPLIT_K_TILES)
}

/// Use `tiles` instead of [`SPLIT_K_TILES`] on this thread until the guard drops (`None`: the
/// production threshold): `Some(0)` splits no product, `Some(usize::MAX)` every one whose `k`
/// allows. For timing other thresholds (the GPU bench's `gemm-core/…/split-*` rows): at the
/// production threshold the implicit-GEMM convs give the bits of the GEMM path
/// ([`CONV_IMPLICIT_MIN_TILES`]); under another, not necessarily.
pub fn force_split_k_tiles(tiles: Option<usize>) -> Guard {
    tl_spec::scoped::install(&SPLIT_K_MIN_TILES, tiles)
}

thread_local! {
    static FUSED_OPTIMIZER: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether an optimizer step on a device runs its rule in one launch per parameter (`true`
/// unless overridden on this thread): the session's device path asks before each step.
pub fn fused_optimizer() -> bool {
    FUSED_OPTIMIZER.with(Cell::get).unwrap_or(true)
}

/// Override [`fused_optimizer`] on this thread until the guard drops: `Some(false)` runs every
/// device optimizer step as its composed primitives (the fused kernels' reference), `None`
/// the production choice.
pub fn force_fused_optimizer(fused: Option<bool>) -> FusedGuard {
    tl_spec::scoped::install(&FUSED_OPTIMIZER, fused)
}

/// Restores the override [`force_fused_optimizer`] replaced when dropped.
pub type FusedGuard = tl_spec::scoped::Guard<Option<bool>>;

thread_local! {
    static FLASH_ONE_PASS: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether the fused attention backward of head size `d` on a CUDA device whose reductions
/// are `deterministic` (or not) runs in one pass (`tl_flash_bwd_atomic`, dQ by `atomicAdd`):
/// when they are not and `d ≤` [`FLASH_ONE_PASS_MAX_HEAD`], unless overridden on this thread.
/// The simulation device always runs the fixed-order twin of the two kernels.
pub fn flash_bwd_one_pass(deterministic: bool, d: usize) -> bool {
    d <= FLASH_ONE_PASS_MAX_HEAD && FLASH_ONE_PASS.with(Cell::get).unwrap_or(!deterministic)
}

/// Override [`flash_bwd_one_pass`] on this thread until the guard drops: `Some(true)` runs
/// the one-pass backward wherever the head fits it (d ≤ 64) whatever the reduction mode,
/// `Some(false)` the two fixed-order kernels, `None` the production choice.
pub fn force_flash_bwd_one_pass(one_pass: Option<bool>) -> OnePassGuard {
    tl_spec::scoped::install(&FLASH_ONE_PASS, one_pass)
}

/// Restores the override [`force_flash_bwd_one_pass`] replaced when dropped.
pub type OnePassGuard = tl_spec::scoped::Guard<Option<bool>>;

thread_local! {
    static SUMS_BY_BLOCK: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether a sum of `n` terms into each of `outputs` outputs gives every output a block of
/// threads (`tl_axis_sum_block`, `tl_norm_bwd_affine_block`: thread `t` folds terms `t, t +
/// 256, …`, then the block's tree) rather than one thread (the terms in order): more than
/// [`AXIS_THREAD_MAX_N`] terms into at most [`AXIS_BLOCK_MAX_OUT`] outputs, unless overridden
/// on this thread ([`force_sums_by_block`]). One thread per output leaves the GPU idle while
/// each walks its terms: a conv's bias gradient (8 channels over 64·28·28 positions) took 0.8
/// ms on an H100 that way. A function of the shape alone, read by the sim and the CUDA launch
/// alike; the two orders give different bits.
pub fn sum_by_block(n: usize, outputs: usize) -> bool {
    let long = match SUMS_BY_BLOCK.with(Cell::get) {
        None => n > AXIS_THREAD_MAX_N,
        Some(forced) => forced && n > 0,
    };
    long && outputs <= AXIS_BLOCK_MAX_OUT
}

/// Override [`sum_by_block`] on this thread until the guard drops: `Some(true)` sums every
/// axis of at least one term by block (into at most [`AXIS_BLOCK_MAX_OUT`] outputs, the grid
/// the launch allows), `Some(false)` every one by thread, `None` the production rule.
pub fn force_sums_by_block(by_block: Option<bool>) -> BlockGuard {
    tl_spec::scoped::install(&SUMS_BY_BLOCK, by_block)
}

/// Restores the override [`force_sums_by_block`] replaced when dropped.
pub type BlockGuard = tl_spec::scoped::Guard<Option<bool>>;

thread_local! {
    static NORM_FUSED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The longest group whose normalization forward is one launch: [`NORM_FUSED_MAX`] unless
/// overridden on this thread ([`force_norm_fused_max`]).
pub fn norm_fused_max() -> usize {
    NORM_FUSED.with(Cell::get).unwrap_or(NORM_FUSED_MAX)
}

/// Use `max` instead of [`NORM_FUSED_MAX`] on this thread until the guard drops (`None`: the
/// production threshold): `Some(0)` runs every normalization forward as its statistics and
/// the apply, `Some(usize::MAX)` every one whose sums are not split ([`norm_split_parts`]) as
/// one launch (`tl_norm_fwd` strides over a group of any length). The bits are the same
/// either way.
pub fn force_norm_fused_max(max: Option<usize>) -> Guard {
    tl_spec::scoped::install(&NORM_FUSED, max)
}

thread_local! {
    static NORM_SPLIT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The chunks each of `groups` normalization groups of `m` elements is summed in, one block a
/// chunk (`tl_norm_split_*`; 1: one block a group, the unsplit kernels): `min(⌈m /`
/// [`NORM_SPLIT_MIN_CHUNK`]`⌉, ⌈`[`NORM_SPLIT_BLOCKS`]` / groups⌉)`, so a split only where a
/// few long groups would leave the device's multiprocessors idle (a ResNet's 64 batch-norm
/// channels of 32 768 elements: 8 parts, 512 blocks), unless overridden on this thread
/// ([`force_norm_split_parts`]). Never more than [`NORM_SPLIT_MAX_PARTS`], and 1 for empty
/// groups or more groups than a grid's `y` holds. The simulation device and the CUDA launch
/// read it alike, so they split the same way.
pub fn norm_split_parts(groups: usize, m: usize) -> usize {
    if groups == 0 || groups > GRID_Y_MAX || m == 0 {
        return 1;
    }
    let rule = || {
        m.div_ceil(NORM_SPLIT_MIN_CHUNK)
            .min(NORM_SPLIT_BLOCKS.div_ceil(groups))
    };
    NORM_SPLIT
        .with(Cell::get)
        .unwrap_or_else(rule)
        .clamp(1, NORM_SPLIT_MAX_PARTS)
}

/// Use `parts` chunks a group instead of [`norm_split_parts`]' rule on this thread until the
/// guard drops (`None`: the production rule): `Some(1)` sums every group with one block,
/// `Some(p)` every non-empty group in `p` chunks (some empty where `p` exceeds the group's
/// length). The bits differ from the unsplit kernels' (another summation order, the same
/// on the simulation device and the CUDA device).
pub fn force_norm_split_parts(parts: Option<usize>) -> Guard {
    tl_spec::scoped::install(&NORM_SPLIT, parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_counts_output_tiles() {
        // The ResNet's 64 channels over 32·32·32 positions: 512 tiles.
        assert!(conv_implicit(64, 32 * 1024));
        // 63 tiles: one short.
        assert!(!conv_implicit(64, 63 * 64));
        assert!(conv_implicit(64, 64 * 64));
        assert!(conv_implicit(65, 32 * 64));
        // More output channels than a grid's rows of tiles hold.
        assert!(!conv_implicit(65_536 * 64, 64));
    }

    #[test]
    fn the_split_threshold_override_moves_the_split_and_restores() {
        use crate::device::{Gemm, TC_TILE};
        // 1024³ on the tensor-core kernel's 128-wide tiles: 64 tiles, no split by default.
        let g = Gemm::nn(1024, 1024, 1024);
        assert_eq!(g.k_splits_tiled(1, TC_TILE), 1);
        {
            let _more = force_split_k_tiles(Some(256));
            assert_eq!(split_k_tiles(), 256);
            // min(1024 / 128, ⌈256 / 64⌉) = 4 runs of 256.
            assert_eq!(g.k_splits_tiled(1, TC_TILE), 4);
            {
                let _never = force_split_k_tiles(Some(0));
                assert_eq!(Gemm::nn(64, 4096, 64).k_splits_tiled(1, TC_TILE), 1);
            }
            assert_eq!(g.k_splits_tiled(1, TC_TILE), 4);
        }
        assert_eq!(split_k_tiles(), SPLIT_K_TILES);
        assert_eq!(g.k_splits_tiled(1, TC_TILE), 1);
        // The default splits a one-tile product with a long k.
        assert!(Gemm::nn(64, 4096, 64).k_splits_tiled(1, TC_TILE) > 1);
    }

    #[test]
    fn the_override_forces_either_way_and_restores() {
        {
            let _on = force_conv_implicit_min_tiles(Some(0));
            assert!(conv_implicit(1, 1));
            {
                let _off = force_conv_implicit_min_tiles(Some(usize::MAX));
                assert!(!conv_implicit(64, 32 * 1024));
            }
            assert!(conv_implicit(1, 1));
        }
        assert!(!conv_implicit(1, 1));
    }

    #[test]
    fn sums_go_by_block_past_the_thresholds_or_as_forced() {
        let long = AXIS_THREAD_MAX_N + 1;
        assert!(sum_by_block(long, AXIS_BLOCK_MAX_OUT));
        assert!(!sum_by_block(AXIS_THREAD_MAX_N, 1));
        assert!(!sum_by_block(long, AXIS_BLOCK_MAX_OUT + 1));
        {
            let _on = force_sums_by_block(Some(true));
            assert!(sum_by_block(1, 1));
            assert!(!sum_by_block(0, 1), "no term: nothing for a block to sum");
            assert!(
                !sum_by_block(long, AXIS_BLOCK_MAX_OUT + 1),
                "no more blocks than the launch allows"
            );
            {
                let _off = force_sums_by_block(Some(false));
                assert!(!sum_by_block(long, 1));
            }
            assert!(sum_by_block(2, 3));
        }
        assert!(!sum_by_block(2, 3));
    }

    #[test]
    fn the_norm_forward_is_one_launch_up_to_the_threshold_or_as_forced() {
        use crate::device::NormLayout;
        assert!(NormLayout::layer(2, NORM_FUSED_MAX).fused_forward());
        assert!(!NormLayout::layer(2, NORM_FUSED_MAX + 1).fused_forward());
        {
            let _never = force_norm_fused_max(Some(0));
            assert!(!NormLayout::layer(1, 1).fused_forward());
            {
                let _always = force_norm_fused_max(Some(usize::MAX));
                // Split sums keep the two launches: tl_norm_fwd sums a group with one block.
                assert!(!NormLayout::channels(64, 3, 1 << 16).fused_forward());
                let _unsplit = force_norm_split_parts(Some(1));
                assert!(NormLayout::channels(64, 3, 1 << 16).fused_forward());
            }
            assert!(!NormLayout::rms(1, 1).fused_forward());
        }
        assert_eq!(norm_fused_max(), NORM_FUSED_MAX);
    }

    #[test]
    fn long_norm_groups_split_over_blocks_when_few() {
        // The ResNet's batch norms: 64 channels of 32·32·32 elements, 8 chunks of 4096.
        assert_eq!(norm_split_parts(64, 32 * 1024), 8);
        // Short groups (a layer norm's rows, however few) and many groups stay whole.
        assert_eq!(norm_split_parts(2, NORM_SPLIT_MIN_CHUNK), 1);
        assert_eq!(norm_split_parts(2, NORM_SPLIT_MIN_CHUNK + 1), 2);
        assert_eq!(norm_split_parts(NORM_SPLIT_BLOCKS, 1 << 20), 1);
        // One long group: as many chunks as the target allows.
        assert_eq!(norm_split_parts(1, 1 << 30), NORM_SPLIT_BLOCKS);
        assert_eq!(norm_split_parts(0, 1 << 20), 1);
        assert_eq!(norm_split_parts(GRID_Y_MAX + 1, 1 << 20), 1);
        {
            let _seven = force_norm_split_parts(Some(7));
            assert_eq!(norm_split_parts(1000, 3), 7);
            assert_eq!(norm_split_parts(1000, 0), 1, "an empty group has no chunks");
            let _huge = force_norm_split_parts(Some(usize::MAX));
            assert_eq!(norm_split_parts(1, 5), NORM_SPLIT_MAX_PARTS);
        }
        assert_eq!(norm_split_parts(64, 32 * 1024), 8);
    }

    #[test]
    fn the_fused_optimizer_is_the_default_and_the_override_restores() {
        assert!(fused_optimizer());
        {
            let _off = force_fused_optimizer(Some(false));
            assert!(!fused_optimizer());
        }
        assert!(fused_optimizer());
    }

    #[test]
    fn the_one_pass_flash_backward_follows_the_reduction_mode_and_the_override() {
        assert!(flash_bwd_one_pass(false, 64));
        assert!(!flash_bwd_one_pass(true, 64));
        assert!(
            !flash_bwd_one_pass(false, 65),
            "heads over 64 take the two kernels"
        );
        {
            let _on = force_flash_bwd_one_pass(Some(true));
            assert!(flash_bwd_one_pass(true, 1));
            assert!(!flash_bwd_one_pass(false, 128));
            {
                let _off = force_flash_bwd_one_pass(Some(false));
                assert!(!flash_bwd_one_pass(false, 64));
            }
            assert!(flash_bwd_one_pass(true, 64));
        }
        assert!(!flash_bwd_one_pass(true, 64));
    }
}
