//! The live heap around one piece of work, counted by [`peak_alloc`]'s global allocator (live
//! bytes and a resettable peak), and the process's resident memory from `/proc/self/status`.
//! `examples/step_memory.rs` measures training steps with it; `tests/step_heap.rs` checks the
//! counts against allocations of known sizes.

#![allow(dead_code)]

use peak_alloc::PeakAlloc;

/// Live heap bytes around one call: before it, at its peak, after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapSpan {
    /// Live bytes when the call began.
    pub before: usize,
    /// The most bytes live at once during the call (at least `before` and `after`).
    pub peak: usize,
    /// Live bytes when it returned (its result included).
    pub after: usize,
}

impl HeapSpan {
    /// The call's own high-water mark: its peak over what was live before it.
    pub fn growth(&self) -> usize {
        self.peak - self.before
    }
}

/// Run `f` and count the live heap (every thread's allocations) around it. `alloc` must be the
/// process's global allocator; the peak is reset to the live bytes when `f` begins.
pub fn measure<R>(alloc: &PeakAlloc, f: impl FnOnce() -> R) -> (R, HeapSpan) {
    let before = alloc.current_usage();
    alloc.reset_peak_usage();
    let r = f();
    let after = alloc.current_usage();
    let peak = alloc.peak_usage().max(before).max(after);
    (
        r,
        HeapSpan {
            before,
            peak,
            after,
        },
    )
}

/// The process's resident set now and its high-water mark (`VmRSS`, `VmHWM`), in bytes;
/// `None` where `/proc/self/status` does not give them (not Linux).
pub fn rss() -> Option<(usize, usize)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<usize> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb = line[name.len()..].trim().strip_suffix("kB")?.trim();
        kb.parse::<usize>().ok().map(|k| k * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}
