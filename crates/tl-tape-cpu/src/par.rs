//! Per-row work split across the threads of [`crate::threads`]: an output cut into blocks of
//! whole rows, one block per thread, each filled by the same function. Used where rows are
//! independent (pool planes, conv batch entries), so the bits do not depend on the split.
//!
//! **Fork-join from the caller's thread ([`join`]).** `rayon::join` called from a thread
//! outside rayon's pool (the user's thread, which runs every op) hands both halves to the pool
//! and puts the caller to sleep until they are done; on the 2-core VM each such region cost
//! 12–25 µs of wake-ups, and a worker that had fallen asleep during the serial ops between two
//! regions took ~50 µs to wake, so a region after a serial gap gained nothing
//! (docs/performance.md). [`join`] runs the first half on the calling thread and offers the
//! second to the pool; if no worker has started it by the time the first half is done, the
//! caller runs it too. A pool worker stays awake for [`LINGER`] after the last such job it ran
//! (OpenMP's `KMP_BLOCKTIME`, whose default is 200 ms), so the regions of one training step find
//! it spinning instead of asleep.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Result;
use crate::gemm::threads;

/// How long a pool worker spins for more work after the last half it ran for [`join`]: longer
/// than the serial stretches between the parallel regions of a training step (tens to hundreds
/// of µs), short enough that an idle process gives its core back at once to a human's eye.
pub const LINGER: Duration = Duration::from_millis(2);

/// Whether a worker is spinning ([`keep_warm`]).
static LINGERING: AtomicBool = AtomicBool::new(false);

/// Keep one pool worker awake: unless one is already spinning, spawn a job that runs whatever
/// the pool is offered (`rayon::yield_now`) until [`LINGER`] passes without any.
fn keep_warm() {
    if LINGERING.swap(true, Ordering::AcqRel) {
        return;
    }
    rayon::spawn(|| {
        let mut last = Instant::now();
        loop {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => last = Instant::now(),
                _ if last.elapsed() > LINGER => break,
                _ => std::hint::spin_loop(),
            }
        }
        LINGERING.store(false, Ordering::Release);
    });
}

/// `(a(), b())`, possibly in parallel: on a pool worker, `rayon::join`; on any other thread,
/// `a` on this thread while `b` is offered to the pool, and `b` on this thread too if no worker
/// has taken it when `a` is done (see the module docs). A panic in either is propagated.
///
/// A thin generic shell over a type-erased `join_dyn`: the fork-join itself (rayon's jobs and
/// scope) is compiled once, not once per pair of closures (108 instances' worth of rayon code
/// were 13% of this crate's LLVM IR).
pub fn join<RA: Send, RB: Send>(
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    let (mut a, mut b) = (Some(a), Some(b));
    let (mut ra, mut rb) = (None, None);
    join_dyn(&mut || ra = a.take().map(|a| a()), &mut || {
        rb = b.take().map(|b| b())
    });
    match (ra, rb) {
        (Some(ra), Some(rb)) => (ra, rb),
        _ => unreachable!("join: both halves ran to completion or the panic propagated"),
    }
}

/// [`join`] on type-erased halves (each called exactly once).
/// Both halves run under the calling thread's [`crate::gates`] overrides and
/// [`crate::precision`], whichever thread runs them.
fn join_dyn(a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
    let (gates, precision) = (crate::gates::current(), crate::precision::current());
    let b = &mut || crate::gates::with(gates, || crate::precision::with(precision, &mut *b));
    if rayon::current_thread_index().is_some() {
        let a = || crate::gates::with(gates, || crate::precision::with(precision, a));
        rayon::join(a, b);
        return;
    }
    keep_warm();
    let task = Mutex::new(Some(b));
    let done = AtomicBool::new(false);
    // Whoever takes `b` out of `task` runs it; `done` is set even if it panics (the scope then
    // propagates the panic), so the wait below always ends.
    let run_b = || {
        let taken = task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(b) = taken {
            let _set = SetOnDrop(&done);
            b();
        }
    };
    rayon::in_place_scope(|s| {
        s.spawn(|_| run_b());
        a();
        run_b();
        while !done.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    });
}

/// Sets its flag when dropped (also while unwinding).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Elements streamed (output and operands) below which element-wise work stays on the calling
/// thread (`chunks`). 2¹⁹ while a region put the caller to sleep; with [`join`], 2¹⁸ splits
/// the cnn step's 200 704-element relu and gains there, while 2¹⁷ also split the transformer's
/// gelu backward (4 × 32 768 elements, ~10 µs) and lost 8% on its two-core step
/// (docs/performance.md).
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 18;

/// Work (element visits, multiply-adds) from which `rows` splits a conv's or a pool's rows
/// across threads. Lower than [`PARALLEL_MIN_ELEMENTS`]: a row block's visits are gathers,
/// compares and products rather than streamed elements, and with [`join`] a region costs the
/// caller no sleep. At 2¹⁷ the cnn step's second conv and pool (64×16×14×14, 200 704 cells:
/// the bias cotangent's sums, the pool's forward and backward) split, and the two-core step
/// gains about 10% over 2¹⁹ (docs/performance.md).
pub const PARALLEL_MIN_ROW_WORK: usize = 1 << 17;

/// Fill `out`, made of rows of `row_len` values, by `f(first_row, block)` on blocks of whole
/// rows: one block per thread when `work` (element visits in all) reaches
/// [`PARALLEL_MIN_ROW_WORK`], else one block on this thread. Each block's `f` gets its own
/// scratch if it needs one. The first error of any block is returned.
pub(crate) fn rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    work: usize,
    f: &(impl Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let t = match threads() {
        t if t > 1 && work >= min_row_work() && row_len > 0 => t,
        _ => 1,
    };
    split(out, row_len, 0, t, f)
}

/// Element-wise work: fill `out` by `f(first_index, block)` on contiguous blocks, one per
/// thread when the elements streamed (`out.len() · streams`, operands and output) reach
/// [`PARALLEL_MIN_ELEMENTS`], else one block on this thread. Blocks start on a multiple of
/// [`CHUNK_ALIGN`] elements (whole vectors at every width). Each element is computed alone, so
/// the bits do not depend on the split.
pub(crate) fn chunks<T: Send>(
    out: &mut [T],
    streams: usize,
    f: &(impl Fn(usize, &mut [T]) + Sync),
) {
    if !splits(out.len(), streams) {
        return f(0, out);
    }
    let t = threads();
    let _ = split(out, CHUNK_ALIGN, 0, t, &|first, block: &mut [T]| {
        f(first * CHUNK_ALIGN, block);
        Ok(())
    });
}

/// Whether [`chunks`] cuts `n` elements of `streams` streams across threads.
pub(crate) fn splits(n: usize, streams: usize) -> bool {
    threads() > 1 && n >= 2 * CHUNK_ALIGN && n.saturating_mul(streams) >= min_elements()
}

/// [`PARALLEL_MIN_ELEMENTS`], or its [`crate::gates`] override.
fn min_elements() -> usize {
    crate::gates::get(|g| g.parallel_min_elements, PARALLEL_MIN_ELEMENTS)
}

/// [`PARALLEL_MIN_ROW_WORK`], or its [`crate::gates`] override.
fn min_row_work() -> usize {
    crate::gates::get(|g| g.parallel_min_row_work, PARALLEL_MIN_ROW_WORK)
}

/// Block boundaries of [`chunks`], in elements (one AVX-512 vector of f32, two of f64).
pub(crate) const CHUNK_ALIGN: usize = 16;

/// `len · part / whole` rounded down (0 when `whole` is 0), without overflow: the first block's
/// share when `len` units are cut for `part` of `whole` threads. A thread count from
/// `TL_NUM_THREADS` or `set_threads` may be as large as `usize::MAX`.
pub(crate) fn share(len: usize, part: usize, whole: usize) -> usize {
    let exact = (len as u128 * part as u128)
        .checked_div(whole as u128)
        .unwrap_or(0);
    // part ≤ whole, so the share is at most len.
    usize::try_from(exact).unwrap_or(len)
}

fn split<T: Send>(
    out: &mut [T],
    row_len: usize,
    first: usize,
    t: usize,
    f: &(impl Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let n_rows = out.len().checked_div(row_len).unwrap_or(0);
    let t1 = t / 2;
    let mid = share(n_rows, t1, t);
    if t < 2 || mid == 0 || mid >= n_rows {
        return f(first, out);
    }
    let (a, b) = out.split_at_mut(mid * row_len);
    let (ra, rb) = join(
        || split(a, row_len, first, t1, f),
        || split(b, row_len, first + mid, t - t1, f),
    );
    ra.and(rb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::force_threads as at_threads;

    #[test]
    fn join_runs_both_halves_once_and_propagates_a_panic() {
        use std::sync::atomic::AtomicUsize;
        let runs = AtomicUsize::new(0);
        for _ in 0..200 {
            let (a, b) = join(
                || runs.fetch_add(1, Ordering::Relaxed) + 1,
                || {
                    runs.fetch_add(1, Ordering::Relaxed);
                    "b"
                },
            );
            assert!(a >= 1 && b == "b");
        }
        assert_eq!(runs.load(Ordering::Relaxed), 400);
        // From inside the pool (rayon's own join) and nested.
        let ((x, y), z) = rayon::join(|| join(|| 1, || join(|| 2, || 3)), || 4);
        assert_eq!((x, y, z), (1, (2, 3), 4));
        // A panic in the second half, whoever runs it, reaches the caller (no hang).
        let r = std::panic::catch_unwind(|| join(|| 1, || -> i32 { panic!("second half") }));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| join(|| -> i32 { panic!("first half") }, || 2));
        assert!(r.is_err());
    }

    #[test]
    fn every_row_is_filled_once_whatever_the_thread_count() {
        let (rows_n, len) = (37, 5);
        for t in [1, 2, 3, 4] {
            let forced = at_threads(t);
            let mut out = vec![0usize; rows_n * len];
            rows(&mut out, len, usize::MAX, &|first, block| {
                for (k, row) in block.chunks_exact_mut(len).enumerate() {
                    row.iter_mut().for_each(|v| *v += first + k + 1);
                }
                Ok(())
            })
            .unwrap();
            drop(forced);
            let want: Vec<usize> = (0..rows_n * len).map(|i| i / len + 1).collect();
            assert_eq!(out, want, "{t} threads");
        }
        // An error in any block comes back.
        let forced = at_threads(2);
        let mut out = vec![0u8; 64];
        let r = rows(&mut out, 1, usize::MAX, &|first, _| {
            if first > 0 {
                Err(crate::Error::Count {
                    what: "test".into(),
                    expected: 0,
                    got: first,
                })
            } else {
                Ok(())
            }
        });
        drop(forced);
        assert!(r.is_err());
    }
}
