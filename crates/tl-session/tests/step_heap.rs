//! The step-memory example's heap counter (`benches/common/heap.rs`, over `peak_alloc`'s global
//! allocator) against allocations of known sizes. Its own test binary: a global allocator is
//! the whole process's, and one test function, so no other test allocates meanwhile.

#[path = "../benches/common/heap.rs"]
mod heap;

use std::hint::black_box;

use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

const MIB: usize = 1 << 20;
/// What the test harness's own thread may allocate meanwhile (output capture, names).
const SLACK: usize = 64 * 1024;

#[test]
fn heap_spans_and_the_resident_set_match_known_allocations() {
    // A block freed before a larger one: the peak is the larger, not the sum.
    let ((), s) = heap::measure(&ALLOC, || {
        black_box(vec![1u8; MIB]);
        black_box(vec![0u8; 3 * MIB]);
    });
    assert!(
        (3 * MIB..3 * MIB + SLACK).contains(&s.growth()),
        "one 3 MiB block at a time: {s:?}"
    );
    assert!(s.after.abs_diff(s.before) < SLACK, "all freed: {s:?}");

    // Two blocks live together, one kept: the peak is their sum, the kept one stays live.
    let (kept, s) = heap::measure(&ALLOC, || {
        let a = vec![2u8; 2 * MIB];
        let b = vec![3u8; MIB];
        black_box(&b);
        a
    });
    assert!(
        (3 * MIB..3 * MIB + SLACK).contains(&s.growth()),
        "2 + 1 MiB at once: {s:?}"
    );
    assert!(
        (2 * MIB..2 * MIB + SLACK).contains(&(s.after - s.before)),
        "the returned 2 MiB is live after: {s:?}"
    );

    // The next span starts from what is live, and sees a free as a drop below `before`.
    let ((), s) = heap::measure(&ALLOC, || drop(kept));
    assert!(s.growth() < SLACK, "freeing grows nothing: {s:?}");
    assert!(
        (2 * MIB - SLACK..=2 * MIB).contains(&(s.before - s.after)),
        "{s:?}"
    );

    // Growth by reallocation: the old and the new block are live together for the move.
    let ((), s) = heap::measure(&ALLOC, || {
        let mut v = Vec::<u8>::with_capacity(MIB);
        v.resize(MIB, 1);
        v.reserve_exact(MIB);
        black_box(&v);
    });
    assert!(
        s.growth() >= 2 * MIB && s.growth() < 3 * MIB + SLACK,
        "{s:?}"
    );

    // Other threads count too.
    let ((), s) = heap::measure(&ALLOC, || {
        std::thread::spawn(|| black_box(vec![4u8; 4 * MIB]).len())
            .join()
            .map(drop)
            .expect("the thread");
    });
    assert!(s.growth() >= 4 * MIB, "{s:?}");

    // The resident set and its high-water mark.
    let read = heap::rss();
    if !cfg!(target_os = "linux") {
        return;
    }
    let (rss, hwm) = read.expect("Linux has /proc/self/status");
    assert!(rss > 0 && hwm >= rss, "VmRSS {rss}, VmHWM {hwm}");
    // Touching 32 MiB raises the resident set by about that much.
    let v = black_box(vec![5u8; 32 * MIB]);
    let (rss2, hwm2) = heap::rss().expect("still readable");
    assert!(rss2 >= rss + 30 * MIB, "{rss} -> {rss2}");
    assert!(hwm2 >= rss2);
    drop(v);
}
