//! Per-row work split across the threads of [`crate::threads`]: an output cut into blocks of
//! whole rows, one block per thread, each filled by the same function. Used where rows are
//! independent (pool planes, conv batch entries), so the bits do not depend on the split.

use crate::Result;
use crate::gemm::threads;

/// Work (element visits) below which the rows stay on the calling thread: on the 2-core VM
/// waking the second thread costs tens of µs (docs/performance.md), so a block must be worth
/// well over that.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 19;

/// Fill `out`, made of rows of `row_len` values, by `f(first_row, block)` on blocks of whole
/// rows: one block per thread when `work` (element visits in all) reaches
/// [`PARALLEL_MIN_ELEMENTS`], else one block on this thread. Each block's `f` gets its own
/// scratch if it needs one. The first error of any block is returned.
pub(crate) fn rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    work: usize,
    f: &(impl Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let t = match threads() {
        t if t > 1 && work >= PARALLEL_MIN_ELEMENTS && row_len > 0 => t,
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
    threads() > 1 && n >= 2 * CHUNK_ALIGN && n.saturating_mul(streams) >= PARALLEL_MIN_ELEMENTS
}

/// Block boundaries of [`chunks`], in elements (one AVX-512 vector of f32, two of f64).
pub(crate) const CHUNK_ALIGN: usize = 16;

fn split<T: Send>(
    out: &mut [T],
    row_len: usize,
    first: usize,
    t: usize,
    f: &(impl Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let n_rows = out.len().checked_div(row_len).unwrap_or(0);
    let t1 = t / 2;
    let mid = n_rows * t1 / t.max(1);
    if t < 2 || mid == 0 || mid >= n_rows {
        return f(first, out);
    }
    let (a, b) = out.split_at_mut(mid * row_len);
    let (ra, rb) = rayon::join(
        || split(a, row_len, first, t1, f),
        || split(b, row_len, first + mid, t - t1, f),
    );
    ra.and(rb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::set_threads;

    #[test]
    fn every_row_is_filled_once_whatever_the_thread_count() {
        let (rows_n, len) = (37, 5);
        for t in [1, 2, 3, 4] {
            let prev = set_threads(t);
            let mut out = vec![0usize; rows_n * len];
            rows(&mut out, len, usize::MAX, &|first, block| {
                for (k, row) in block.chunks_exact_mut(len).enumerate() {
                    row.iter_mut().for_each(|v| *v += first + k + 1);
                }
                Ok(())
            })
            .unwrap();
            set_threads(prev);
            let want: Vec<usize> = (0..rows_n * len).map(|i| i / len + 1).collect();
            assert_eq!(out, want, "{t} threads");
        }
        // An error in any block comes back.
        let prev = set_threads(2);
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
        set_threads(prev);
        assert!(r.is_err());
    }
}
