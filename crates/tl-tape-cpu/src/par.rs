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
