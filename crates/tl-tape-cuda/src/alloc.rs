//! The caching allocator and its telemetry (TorchLean's "Allocator Telemetry").
//!
//! Modelled on PyTorch's `CUDACachingAllocator`, simplified: a request is rounded up to a *size
//! class*; a released block goes back to a per-class free list instead of to the device, and the
//! next request of the same class reuses it without a device allocation (`cudaMalloc` is slow
//! and synchronizing). Unlike PyTorch there is no block splitting or coalescing: a cached block
//! only serves requests of exactly its class.
//!
//! | request | class |
//! |---|---|
//! | ≤ 1 MiB ([`SMALL_LIMIT`]) | rounded up to a multiple of 512 B ([`SMALL_ROUND`]), at least 512 B |
//! | > 1 MiB | rounded up to a multiple of 2 MiB ([`LARGE_ROUND`]) |
//!
//! When the device refuses an allocation, the pool returns every cached block to it and retries
//! once before reporting [`Error::OutOfMemory`]. [`CachingAllocator::collect`] returns cached
//! blocks on demand: all of them when forced, otherwise only enough to bring the cache under its
//! limit.
//!
//! The counters ([`MemoryUsage`], after burn's struct of the same name) count *buffers*: live and
//! peak bytes are the bytes requested by live buffers (not their rounded classes), and
//! `alloc_count − free_count` is the number of live buffers. Device-side figures (classes
//! reserved, cached, device allocations) are reported beside them.

use std::collections::BTreeMap;
use std::fmt;

use crate::{Error, Result};

/// Requests up to this many bytes are "small" and rounded to [`SMALL_ROUND`].
pub const SMALL_LIMIT: usize = 1 << 20;
/// Rounding of small requests (and the smallest class).
pub const SMALL_ROUND: usize = 512;
/// Rounding of large requests.
pub const LARGE_ROUND: usize = 2 << 20;
/// Default limit of a non-forced [`CachingAllocator::collect`]: cached bytes kept.
pub const DEFAULT_CACHE_LIMIT: usize = 256 << 20;

/// The size class (bytes actually reserved) serving a request of `bytes`.
pub fn size_class(bytes: usize) -> usize {
    let round = if bytes <= SMALL_LIMIT {
        SMALL_ROUND
    } else {
        LARGE_ROUND
    };
    bytes.max(1).div_ceil(round).saturating_mul(round)
}

/// Raw device memory under the pool: `cudaMalloc`/`cudaFree` on a GPU, host vectors on sim.
pub trait RawMemory {
    /// One raw allocation.
    type Block;
    /// Allocate `bytes` (already a size class) for primitive `op`, or fail with
    /// [`Error::OutOfMemory`].
    fn alloc(&mut self, op: &'static str, bytes: usize) -> Result<Self::Block>;
    /// Return a block to the device.
    fn free(&mut self, block: Self::Block, bytes: usize);
    /// `(free, total)` bytes of the device as the driver reports them (`cudaMemGetInfo`);
    /// `(0, 0)` where there is no driver (the simulation device).
    fn mem_info(&self) -> (usize, usize);
}

/// A block handed out by the pool: the raw block, its class, and the bytes requested.
#[derive(Debug)]
pub struct Allocation<B> {
    /// The raw block (at least `class` bytes).
    pub block: B,
    /// The size class the block belongs to.
    pub class: usize,
    /// The bytes the caller asked for (what telemetry counts as live).
    pub bytes: usize,
}

/// A snapshot of the allocator's counters. PyTorch: `torch.cuda.memory_stats()`; burn:
/// `MemoryUsage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes requested by live buffers.
    pub live_bytes: usize,
    /// The largest `live_bytes` seen.
    pub peak_bytes: usize,
    /// Buffers handed out (cache hits and misses).
    pub alloc_count: u64,
    /// Buffers released back to the pool.
    pub free_count: u64,
    /// Bytes of the size classes held by the pool (live and cached).
    pub reserved_bytes: usize,
    /// Bytes of the size classes cached (released, not yet returned to the device).
    pub cached_bytes: usize,
    /// Raw device allocations made (cache misses).
    pub device_alloc_count: u64,
    /// Raw device frees (by `collect` or an out-of-memory retry).
    pub device_free_count: u64,
    /// Free device memory as the driver reports it; 0 on the simulation device.
    pub device_free_bytes: usize,
    /// Total device memory as the driver reports it; 0 on the simulation device.
    pub device_total_bytes: usize,
}

impl MemoryUsage {
    /// Buffers currently live (`alloc_count − free_count`).
    pub fn live_buffers(&self) -> u64 {
        self.alloc_count - self.free_count
    }

    /// One-line report for progress logs, in MiB (TorchLean's allocator report).
    pub fn report(&self) -> String {
        self.to_string()
    }
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for MemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "live {} (peak {}), reserved {} (cached {}), allocs {} frees {} (live buffers {}), device free {} of {}",
            mib(self.live_bytes),
            mib(self.peak_bytes),
            mib(self.reserved_bytes),
            mib(self.cached_bytes),
            self.alloc_count,
            self.free_count,
            self.live_buffers(),
            mib(self.device_free_bytes),
            mib(self.device_total_bytes),
        )
    }
}

/// What a [`CachingAllocator::collect`] returned to the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    /// Cached blocks freed.
    pub blocks: usize,
    /// Their bytes (size classes).
    pub bytes: usize,
}

/// The size-class caching pool over some [`RawMemory`].
pub struct CachingAllocator<M: RawMemory> {
    mem: M,
    cache: BTreeMap<usize, Vec<M::Block>>,
    cache_limit: usize,
    usage: MemoryUsage,
}

impl<M: RawMemory> fmt::Debug for CachingAllocator<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachingAllocator({})", self.usage())
    }
}

impl<M: RawMemory> CachingAllocator<M> {
    /// A pool over `mem` with the default cache limit.
    pub fn new(mem: M) -> Self {
        CachingAllocator {
            mem,
            cache: BTreeMap::new(),
            cache_limit: DEFAULT_CACHE_LIMIT,
            usage: MemoryUsage::default(),
        }
    }

    /// Set the cached bytes a non-forced [`collect`](Self::collect) keeps.
    pub fn set_cache_limit(&mut self, bytes: usize) {
        self.cache_limit = bytes;
    }

    /// The raw memory under the pool.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// A block of at least `bytes` for primitive `op`: a cached block of the same class if there
    /// is one, else a new device allocation (after returning the whole cache to the device and
    /// retrying once if the device is out of memory).
    ///
    /// A request above the process-wide allocation cap ([`tl_spec::alloc`]) is refused before the
    /// device (or the cache) is asked.
    pub fn allocate(&mut self, op: &'static str, bytes: usize) -> Result<Allocation<M::Block>> {
        tl_spec::alloc::check_bytes(op, "device buffer", bytes, 1)?;
        let class = size_class(bytes);
        let cached = self.cache.get_mut(&class).and_then(Vec::pop);
        let block = match cached {
            Some(b) => {
                self.usage.cached_bytes -= class;
                b
            }
            None => {
                let b = match self.mem.alloc(op, class) {
                    Ok(b) => b,
                    Err(Error::OutOfMemory { .. }) if self.usage.cached_bytes > 0 => {
                        self.collect(true);
                        self.mem.alloc(op, class)?
                    }
                    Err(e) => return Err(e),
                };
                self.usage.device_alloc_count += 1;
                self.usage.reserved_bytes += class;
                b
            }
        };
        self.usage.alloc_count += 1;
        self.usage.live_bytes += bytes;
        self.usage.peak_bytes = self.usage.peak_bytes.max(self.usage.live_bytes);
        Ok(Allocation {
            block,
            class,
            bytes,
        })
    }

    /// Give a block back to the pool (it is cached, not returned to the device).
    pub fn free(&mut self, a: Allocation<M::Block>) {
        self.usage.free_count += 1;
        self.usage.live_bytes -= a.bytes;
        self.usage.cached_bytes += a.class;
        self.cache.entry(a.class).or_default().push(a.block);
    }

    /// Return cached blocks to the device: every one when `force`, otherwise the largest classes
    /// first until the cache holds at most the cache limit. Live buffers are never touched.
    pub fn collect(&mut self, force: bool) -> Collected {
        let keep = if force { 0 } else { self.cache_limit };
        let mut out = Collected::default();
        while self.usage.cached_bytes > keep {
            let Some(mut entry) = self.cache.last_entry() else {
                break;
            };
            let class = *entry.key();
            match entry.get_mut().pop() {
                Some(block) => {
                    self.mem.free(block, class);
                    self.usage.cached_bytes -= class;
                    self.usage.reserved_bytes -= class;
                    self.usage.device_free_count += 1;
                    out.blocks += 1;
                    out.bytes += class;
                }
                None => {
                    entry.remove();
                }
            }
        }
        self.cache.retain(|_, v| !v.is_empty());
        out
    }

    /// The counters, with the device's free and total bytes.
    pub fn usage(&self) -> MemoryUsage {
        let (free, total) = self.mem.mem_info();
        MemoryUsage {
            device_free_bytes: free,
            device_total_bytes: total,
            ..self.usage
        }
    }
}

/// Host memory standing in for the device on the simulation device: blocks are `Vec<f32>`, with
/// an optional byte limit so out-of-memory paths can be exercised.
#[derive(Debug, Default)]
pub struct HostMemory {
    limit: Option<usize>,
    in_use: usize,
}

impl HostMemory {
    /// Unlimited host memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Host memory that refuses to hold more than `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        HostMemory {
            limit: Some(limit),
            in_use: 0,
        }
    }

    /// Bytes currently allocated from it (live and cached classes).
    pub fn in_use(&self) -> usize {
        self.in_use
    }
}

impl RawMemory for HostMemory {
    type Block = Vec<f32>;

    fn alloc(&mut self, op: &'static str, bytes: usize) -> Result<Vec<f32>> {
        if let Some(limit) = self.limit
            && self.in_use.saturating_add(bytes) > limit
        {
            return Err(Error::OutOfMemory {
                op,
                requested: bytes,
                in_use: self.in_use,
                limit,
            });
        }
        let block = tl_spec::alloc::try_vec(op, "simulated device block", bytes / 4, 0.0f32)?;
        self.in_use += bytes;
        Ok(block)
    }

    fn free(&mut self, block: Vec<f32>, bytes: usize) {
        self.in_use -= bytes;
        drop(block);
    }

    fn mem_info(&self) -> (usize, usize) {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_small_and_large_requests() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(4), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(SMALL_LIMIT), SMALL_LIMIT);
        assert_eq!(size_class(SMALL_LIMIT + 1), LARGE_ROUND);
        assert_eq!(size_class(LARGE_ROUND + 1), 2 * LARGE_ROUND);
    }

    #[test]
    fn released_blocks_are_reused_without_a_device_allocation() {
        let mut pool = CachingAllocator::new(HostMemory::new());
        let a = pool.allocate("t", 400).unwrap();
        let b = pool.allocate("t", 100).unwrap(); // same 512 B class
        pool.free(a);
        let u = pool.usage();
        assert_eq!(
            (u.live_bytes, u.peak_bytes, u.cached_bytes),
            (100, 500, 512)
        );
        let c = pool.allocate("t", 300).unwrap(); // hit
        let d = pool.allocate("t", 4096).unwrap(); // miss: another class
        let u = pool.usage();
        assert_eq!(u.device_alloc_count, 3);
        assert_eq!((u.alloc_count, u.free_count, u.live_buffers()), (4, 1, 3));
        assert_eq!(u.reserved_bytes, 512 + 512 + 4096);
        for x in [b, c, d] {
            pool.free(x);
        }
        assert_eq!(pool.usage().live_bytes, 0);
        assert_eq!(pool.usage().cached_bytes, 512 + 512 + 4096);
    }

    #[test]
    fn collect_trims_to_the_limit_or_empties_when_forced() {
        let mut pool = CachingAllocator::new(HostMemory::new());
        let blocks: Vec<_> = [512, 1024, 4096]
            .iter()
            .map(|&n| pool.allocate("t", n).unwrap())
            .collect();
        for b in blocks {
            pool.free(b);
        }
        pool.set_cache_limit(2000);
        let c = pool.collect(false);
        assert_eq!(
            c,
            Collected {
                blocks: 1,
                bytes: 4096
            },
            "largest class goes first"
        );
        assert_eq!(pool.memory().in_use(), 1536);
        let c = pool.collect(true);
        assert_eq!(
            c,
            Collected {
                blocks: 2,
                bytes: 1536
            }
        );
        let u = pool.usage();
        assert_eq!(
            (u.cached_bytes, u.reserved_bytes, u.device_free_count),
            (0, 0, 3)
        );
        assert_eq!(pool.memory().in_use(), 0);
    }

    #[test]
    fn out_of_memory_returns_the_cache_and_retries_then_errors() {
        let mut pool = CachingAllocator::new(HostMemory::with_limit(4096));
        let a = pool.allocate("t", 2048).unwrap();
        pool.free(a); // cached: the device is still holding 2048
        let b = pool.allocate("t", 4000).unwrap(); // needs the cache returned first
        assert_eq!(pool.usage().cached_bytes, 0);
        let e = pool.allocate("zeros", 1).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { op: "zeros", .. }), "{e}");
        assert!(e.to_string().contains("zeros"));
        pool.free(b);
    }

    #[test]
    fn report_is_one_line_in_mib() {
        let mut pool = CachingAllocator::new(HostMemory::new());
        let a = pool.allocate("t", 3 << 20).unwrap();
        let r = pool.usage().report();
        assert!(!r.contains('\n'));
        assert!(
            r.starts_with("live 3.00 MiB (peak 3.00 MiB), reserved 4.00 MiB"),
            "{r}"
        );
        pool.free(a);
    }
}
