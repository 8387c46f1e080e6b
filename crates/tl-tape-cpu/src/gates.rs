//! Overrides of the size-, shape- and thread-gated fast paths, for tests.
//!
//! Several kernels switch to another path above a size, shape or thread-count threshold: the
//! GEMM's thread split, layout copies and 16-wide kernel, the element-wise and per-row thread
//! splits, the fused attention's memory-lean form and its row blocks, conv's weight-cotangent
//! chunks, the window tables' cache and runs, the element-wise loops' staging and instruction
//! set. The small cases a property test draws
//! never cross most of those thresholds, so a bug on the far side would go unseen. A
//! [`Gates`] value names, per gate, a threshold (or a path) to use instead of the production
//! one; [`force`] installs it **on the calling thread** until the returned [`Guard`] is
//! dropped. Work the calling thread hands to the pool ([`crate::par::join`]) runs under the
//! same overrides, so a test's settings reach every thread of its ops and no other test's.
//!
//! With no override installed (the default, [`Gates::DEFAULT`]) every decision is the
//! production one, bit for bit. The thresholds a field overrides:
//!
//! | field | production decision |
//! |---|---|
//! | [`threads`](Gates::threads) | [`crate::threads`] (`set_threads`, `TL_NUM_THREADS`) |
//! | [`level`](Gates::level) | [`crate::simd::level`] (`simd::set_level`, `TL_SIMD`) |
//! | [`parallel_min_elements`](Gates::parallel_min_elements) | [`crate::par::PARALLEL_MIN_ELEMENTS`] |
//! | [`parallel_min_row_work`](Gates::parallel_min_row_work) | [`crate::par::PARALLEL_MIN_ROW_WORK`] |
//! | [`gemm_parallel_min_work`](Gates::gemm_parallel_min_work) | [`crate::gemm::PARALLEL_MIN_WORK`] |
//! | [`narrow_max_k`](Gates::narrow_max_k) | [`crate::gemm::NARROW_MAX_K`] (16-wide products at AVX-512) |
//! | [`transpose_min_side`](Gates::transpose_min_side) | the GEMM's `TRANSPOSE_MIN_SIDE` (16) |
//! | [`gemm_layout`](Gates::gemm_layout) | the GEMM's layout rule (`copies_pay`, `column_major_cheaper`, AVX-512 for `row_major_rhs`, one thread) |
//! | [`fused_keep_max`](Gates::fused_keep_max) | [`crate::ops::attention::core::FUSED_KEEP_MAX`] |
//! | [`fused_scores`](Gates::fused_scores) | [`crate::ops::attention::core::FUSED_SCORES`] |
//! | [`dw_chunk`](Gates::dw_chunk) | [`crate::ops::conv::DW_CHUNK`] |
//! | [`cached_table_max`](Gates::cached_table_max) | the window tables' `CACHED_TABLE_MAX` (2¹⁶ entries) |
//! | [`min_mean_run`](Gates::min_mean_run) | the window tables' `MIN_MEAN_RUN` (4) |
//! | [`stage`](Gates::stage) | the element-wise loops' `STAGE` (256 values) |
//! | [`bf16_kernel`](Gates::bf16_kernel) | [`crate::precision::Bf16Kernel::current`] (the portable kernel) |

use std::cell::Cell;

use crate::precision::Bf16Kernel;
use crate::simd::Level;

/// Which way an `x·wᵀ` product (row-major `a`, column-major `b`, row-major output) is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmLayout {
    /// As the operands lie: faer reads the column-major `b` strided.
    Strided,
    /// `b` copied row-major first (the GEMM's `row_major_rhs`), on any thread count.
    RowMajorRhs,
    /// The whole product column-major, `a` and the output copied (`column_major_product`).
    ColumnMajor,
}

/// Per-gate overrides; `None` keeps the production decision (see the module docs).
///
/// A threshold of `0` (or `1` for a size) turns a fast path on for every case it can take; a
/// threshold of `usize::MAX` turns it off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// Threads a product or a split may use, instead of [`crate::threads`] (at least 1).
    pub threads: Option<usize>,
    /// The element-wise loops' instruction set, instead of [`crate::simd::level`]; a level
    /// this CPU lacks is ignored.
    pub level: Option<Level>,
    /// Elements streamed from which element-wise work is split across threads.
    pub parallel_min_elements: Option<usize>,
    /// Work from which a conv's or a pool's rows are split across threads.
    pub parallel_min_row_work: Option<usize>,
    /// Multiply-adds from which a matrix product is split across threads.
    pub gemm_parallel_min_work: Option<usize>,
    /// The deepest (k) 16-wide f32 product that takes the AVX-512 kernel of one register per
    /// output row (`0`: none does; at most [`crate::gemm::NARROW_MAX_K`]).
    pub narrow_max_k: Option<usize>,
    /// The smallest side (m, k, n) of an `x·wᵀ` product that may take a layout copy.
    pub transpose_min_side: Option<usize>,
    /// The path of an `x·wᵀ` product whose sides reach the transpose threshold, instead of the
    /// production rule (level and cost).
    pub gemm_layout: Option<GemmLayout>,
    /// The most probabilities (`B·heads·n²`) a fused attention keeps as the unfused one does;
    /// past it, it runs memory-lean (row blocks, row statistics kept).
    pub fused_keep_max: Option<usize>,
    /// Scores (query rows × keys) per block of the fused attention (at least one row a block).
    pub fused_scores: Option<usize>,
    /// Batch entries per partial sum of conv's weight cotangent (at least 1).
    pub dw_chunk: Option<usize>,
    /// Entries up to which a window table is kept in the per-thread cache (`0`: none is).
    pub cached_table_max: Option<usize>,
    /// The mean run length from which a window table is also kept as runs (`0`: always).
    pub min_mean_run: Option<usize>,
    /// Values per stage of an element-wise loop that pushes its output (1 to 256).
    pub stage: Option<usize>,
    /// The kernel of bf16 products ([`crate::precision`]), instead of the production choice;
    /// a kernel this CPU lacks is ignored.
    pub bf16_kernel: Option<Bf16Kernel>,
}

impl Gates {
    /// No override: every decision is the production one.
    pub const DEFAULT: Gates = Gates {
        threads: None,
        level: None,
        parallel_min_elements: None,
        parallel_min_row_work: None,
        gemm_parallel_min_work: None,
        narrow_max_k: None,
        transpose_min_side: None,
        gemm_layout: None,
        fused_keep_max: None,
        fused_scores: None,
        dw_chunk: None,
        cached_table_max: None,
        min_mean_run: None,
        stage: None,
        bf16_kernel: None,
    };

    /// Every gated fast path on wherever it can run, on `threads` threads: every split
    /// threshold 0, the 16-wide product kernel at every depth it takes, layout copies from
    /// side 1 by the column-major product, every fused attention memory-lean with one query
    /// row per block, one batch entry per weight-cotangent chunk, every window table cached
    /// and kept as runs, one value per stage. (`level`, the copy path and the bf16
    /// kernel are left to the caller: see [`Gates::with_level`], [`Gates::with_layout`] and
    /// [`Gates::with_bf16_kernel`].)
    pub const fn fast_paths_on(threads: usize) -> Gates {
        Gates {
            threads: Some(threads),
            level: None,
            parallel_min_elements: Some(0),
            parallel_min_row_work: Some(0),
            gemm_parallel_min_work: Some(0),
            narrow_max_k: Some(usize::MAX),
            transpose_min_side: Some(1),
            gemm_layout: Some(GemmLayout::ColumnMajor),
            fused_keep_max: Some(0),
            fused_scores: Some(1),
            dw_chunk: Some(1),
            cached_table_max: Some(usize::MAX),
            min_mean_run: Some(0),
            stage: Some(1),
            bf16_kernel: None,
        }
    }

    /// Every gated fast path off: one thread, every split threshold `usize::MAX`, strided
    /// products (none by the 16-wide kernel), fused attention as the unfused one (one block
    /// per sample, A kept), one weight-cotangent chunk, no cached table, no runs, whole
    /// stages, the baseline instruction set, the portable bf16 kernel.
    pub const fn fast_paths_off() -> Gates {
        Gates {
            threads: Some(1),
            level: Some(Level::Scalar),
            parallel_min_elements: Some(usize::MAX),
            parallel_min_row_work: Some(usize::MAX),
            gemm_parallel_min_work: Some(usize::MAX),
            narrow_max_k: Some(0),
            transpose_min_side: Some(usize::MAX),
            gemm_layout: Some(GemmLayout::Strided),
            fused_keep_max: Some(usize::MAX),
            fused_scores: Some(usize::MAX),
            dw_chunk: Some(usize::MAX),
            cached_table_max: Some(0),
            min_mean_run: Some(usize::MAX),
            stage: Some(usize::MAX),
            bf16_kernel: Some(Bf16Kernel::Portable),
        }
    }

    /// The same overrides with the instruction set `level`.
    pub const fn with_level(self, level: Level) -> Gates {
        Gates {
            level: Some(level),
            ..self
        }
    }

    /// The same overrides with the bf16 product kernel `kernel`.
    pub const fn with_bf16_kernel(self, kernel: Bf16Kernel) -> Gates {
        Gates {
            bf16_kernel: Some(kernel),
            ..self
        }
    }

    /// The same overrides with the `x·wᵀ` path `layout`.
    pub const fn with_layout(self, layout: GemmLayout) -> Gates {
        Gates {
            gemm_layout: Some(layout),
            ..self
        }
    }
}

thread_local! {
    static FORCED: Cell<Gates> = const { Cell::new(Gates::DEFAULT) };
}

/// The overrides in force on this thread ([`Gates::DEFAULT`] unless [`force`] installed some).
pub fn current() -> Gates {
    FORCED.with(Cell::get)
}

/// Install `gates` on this thread (replacing what was there) until the returned guard is
/// dropped, which restores the previous overrides. Work this thread hands to the pool runs
/// under them too.
pub fn force(gates: Gates) -> Guard {
    tl_spec::scoped::install(&FORCED, gates)
}

/// [`force`] with only the thread count overridden: every product and split this thread makes
/// (and the pool work it hands out) uses `threads` threads until the guard is dropped. Tests
/// that compare thread counts use this, not the process-wide [`crate::set_threads`], which a
/// test running beside them could change.
pub fn force_threads(threads: usize) -> Guard {
    force(Gates {
        threads: Some(threads),
        ..Gates::DEFAULT
    })
}

/// Restores the overrides [`force`] replaced when dropped (on the thread that forced them).
pub type Guard = tl_spec::scoped::Guard<Gates>;

/// Run `f` under `gates` on this thread (how [`crate::par::join`] carries them to the pool).
pub(crate) fn with<R>(gates: Gates, f: impl FnOnce() -> R) -> R {
    let _guard = force(gates);
    f()
}

/// One override, or `default`.
pub(crate) fn get<V>(field: impl FnOnce(&Gates) -> Option<V>, default: V) -> V {
    FORCED.with(|f| field(&f.get())).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_restores_the_previous_overrides_and_stays_on_its_thread() {
        assert_eq!(current(), Gates::DEFAULT);
        let on = Gates::fast_paths_on(3);
        {
            let _g = force(on);
            assert_eq!(current(), on);
            assert_eq!(crate::threads(), 3);
            {
                let _h = force(Gates::fast_paths_off());
                assert_eq!(crate::threads(), 1);
            }
            assert_eq!(current(), on);
            // Another thread sees none of it.
            let other = std::thread::spawn(current).join().ok();
            assert_eq!(other, Some(Gates::DEFAULT));
            // Work handed to the pool runs under the caller's overrides.
            let (a, b) = crate::par::join(current, current);
            assert_eq!((a, b), (on, on));
            let (_, (c, d)) =
                rayon::join(|| (), || with(on, || crate::par::join(current, current)));
            assert_eq!((c, d), (on, on));
        }
        assert_eq!(current(), Gates::DEFAULT);
        assert_eq!(get(|g| g.dw_chunk, 8), 8);
    }

    /// The overrides reach the decisions: a small element-wise op splits with every fast
    /// path on and not by default, the level and the thread count follow, a level this CPU
    /// lacks is ignored.
    #[test]
    fn overrides_reach_the_decisions() {
        assert!(!crate::par::splits(64, 3));
        {
            let _on = force(Gates::fast_paths_on(2));
            assert!(crate::par::splits(64, 3));
            assert!(!crate::par::splits(16, 3), "below two aligned blocks");
        }
        {
            let _off = force(Gates::fast_paths_off());
            assert!(!crate::par::splits(1 << 30, 3));
            assert_eq!(crate::simd::level(), Level::Scalar);
        }
        for level in Level::available() {
            let _l = force(Gates::DEFAULT.with_level(level));
            assert_eq!(crate::simd::level(), level);
        }
        let missing = [Level::Avx512, Level::Avx2]
            .into_iter()
            .find(|l| !l.is_available());
        if let Some(l) = missing {
            let _l = force(Gates::DEFAULT.with_level(l));
            assert!(crate::simd::level().is_available());
        }
        let _zero = force(Gates {
            threads: Some(0),
            ..Gates::DEFAULT
        });
        assert_eq!(crate::threads(), 1);
    }
}
