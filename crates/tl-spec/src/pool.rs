//! Buffer reuse: a [`Pool`] of spare value buffers, owned by a tape, that the kernels draw from
//! while the tape has it installed on the calling thread.
//!
//! A training step allocates the same buffers, of the same sizes, in the same order, every
//! step. Freeing them at the end of one step and asking the system allocator for them again in
//! the next costs page faults (the system hands large blocks back to the kernel and re-zeroes
//! them: 22% of the CPU cnn step, docs/performance.md). A tape therefore keeps the buffers of
//! its last step in a pool and hands them out again:
//!
//! - the owner puts buffers in ([`Pool::put`], or [`Pool::recycle`] for a tensor whose storage
//!   nothing else shares) and, while its kernels run, [`install`]s the pool on its thread;
//! - every allocation of the runtime's kernels (through [`crate::alloc::try_with_capacity`] and
//!   the helpers beside it, all fallible) takes a spare buffer of exactly the requested capacity from
//!   the installed pool of its element type, if there is one, else allocates;
//! - a kernel gives its scratch buffers back with [`give`] when it is done with them.
//!
//! A buffer is handed out empty (length 0), so no value of an earlier step can be read
//! through it, except by [`take_for_overwrite`] ([`crate::alloc::try_for_overwrite`]), for kernels that write every element before reading
//! any (a product with β = 0), which skips the zero fill. Retention is bounded: [`Pool::trim`] (the owner calls it once per step)
//! drops the buffers that stayed unused for [`IDLE_TRIMS`] steps, so the pool holds the
//! buffers of the last few steps at most, and shrinks when the step changes. Nothing is pooled
//! where no pool is installed (reference code, other threads): the behaviour is then plain
//! allocation.
//!
//! PyTorch comparison: the CUDA caching allocator's reuse of freed blocks, for host buffers and
//! scoped to one tape.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;

use crate::{Scalar, Tensor};

/// Spare buffers of one element type, keyed by capacity.
pub struct Pool<T> {
    /// Capacity → buffers, each with the trim count at which it was put.
    free: HashMap<usize, Vec<(u64, Vec<T>)>>,
    /// How many times [`Pool::trim`] has run.
    trims: u64,
    /// Buffers handed out and requests not served (see [`PoolStats`]).
    stats: PoolStats,
    /// Bytes of the buffers held now (their capacities).
    held_bytes: usize,
}

/// A buffer is dropped when this many trims have passed since it was put without it being
/// taken: a step may clear its tape more than once (a value read compiles, then the step
/// compiles again), so a buffer the backward pass needs must survive a few.
pub const IDLE_TRIMS: u64 = 3;

/// Past this many distinct capacities, a trim forgets those it holds no buffer of.
const MAX_CAPACITIES: usize = 1024;

/// What a pool has done since it was made: buffers it handed out (`reused`), requests it could
/// not serve (`missed`, a fresh allocation), what it holds now and the most it has held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from the pool.
    pub reused: u64,
    /// Requests the pool had no buffer of that capacity for.
    pub missed: u64,
    /// Buffers held now.
    pub held: usize,
    /// Bytes of the buffers held now (capacity × element size).
    pub held_bytes: usize,
    /// The most bytes the pool has held at once since it was made (its high-water mark).
    pub peak_held_bytes: usize,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool {
            free: HashMap::new(),
            trims: 0,
            stats: PoolStats::default(),
            held_bytes: 0,
        }
    }
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl<T> Pool<T> {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep `buf` for a later request of its capacity (zero-capacity buffers are dropped). Its
    /// values stay in it: [`Pool::take`] empties it, [`take_for_overwrite`] hands them out.
    pub fn put(&mut self, buf: Vec<T>) {
        if buf.capacity() == 0 {
            return;
        }
        self.held_bytes += bytes(&buf);
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(self.held_bytes);
        self.free
            .entry(buf.capacity())
            .or_default()
            .push((self.trims, buf));
    }

    /// An empty buffer of capacity exactly `n`, if the pool holds one (the most recently put
    /// first).
    pub fn take(&mut self, n: usize) -> Option<Vec<T>> {
        let mut found = self.take_as_put(n);
        if let Some(buf) = &mut found {
            buf.clear();
        }
        found
    }

    /// A buffer of capacity exactly `n` with the values it was put with.
    fn take_as_put(&mut self, n: usize) -> Option<Vec<T>> {
        let found = self.free.get_mut(&n).and_then(Vec::pop).map(|(_, buf)| buf);
        match &found {
            Some(buf) => {
                self.stats.reused += 1;
                self.held_bytes -= bytes(buf);
            }
            None => self.stats.missed += 1,
        }
        found
    }

    /// Count one step and drop the buffers that have sat unused for [`IDLE_TRIMS`] of them.
    /// The owner calls it once per step (a tape: when it is cleared), which bounds what the
    /// pool holds to the buffers of the last few steps.
    pub fn trim(&mut self) {
        self.trims += 1;
        let now = self.trims;
        // Empty capacities keep their (small) entry, so a steady step allocates nothing here,
        // unless the pool has seen unusually many distinct capacities.
        let prune = self.free.len() > MAX_CAPACITIES;
        let mut dropped = 0;
        self.free.retain(|_, bufs| {
            bufs.retain(|(put, buf)| {
                let keep = now - put < IDLE_TRIMS;
                if !keep {
                    dropped += bytes(buf);
                }
                keep
            });
            !(prune && bufs.is_empty())
        });
        self.held_bytes -= dropped;
    }

    /// Drop every buffer.
    pub fn clear(&mut self) {
        self.free.clear();
        self.held_bytes = 0;
    }

    /// The counters, the buffers and bytes held now and the most bytes held at once.
    pub fn stats(&self) -> PoolStats {
        let held = self.free.values().map(Vec::len).sum();
        PoolStats {
            held,
            held_bytes: self.held_bytes,
            ..self.stats
        }
    }
}

/// The bytes a buffer holds: its capacity × the element size.
fn bytes<T>(buf: &Vec<T>) -> usize {
    buf.capacity() * std::mem::size_of::<T>()
}

impl<T: Scalar> Pool<T> {
    /// Keep `t`'s buffer if nothing else shares it (a tensor still referenced elsewhere is
    /// just dropped: its storage is never handed out while it can be read).
    pub fn recycle(&mut self, t: Tensor<T>) {
        if let Ok(v) = t.try_into_vec() {
            self.put(v);
        }
    }
}

/// The installed pools of this thread, one per element type the runtime computes in.
#[derive(Default)]
struct Installed {
    f32: Option<Pool<f32>>,
    f64: Option<Pool<f64>>,
}

thread_local! {
    static INSTALLED: RefCell<Installed> = RefCell::new(Installed::default());
}

impl Installed {
    /// The slot for element type `T`, if `T` is pooled.
    fn slot<T: 'static>(&mut self) -> Option<&mut Option<Pool<T>>> {
        if let Some(p) = (&mut self.f32 as &mut dyn Any).downcast_mut::<Option<Pool<T>>>() {
            return Some(p);
        }
        (&mut self.f64 as &mut dyn Any).downcast_mut::<Option<Pool<T>>>()
    }
}

/// Run `f` on this thread's slot for `T` (`Some(pool)` while one is installed); `None` when
/// `T` is not pooled, or the thread is being torn down.
fn with_slot<T: 'static, R>(f: impl FnOnce(&mut Option<Pool<T>>) -> R) -> Option<R> {
    INSTALLED
        .try_with(|cell| {
            let mut slots = cell.try_borrow_mut().ok()?;
            slots.slot::<T>().map(f)
        })
        .ok()
        .flatten()
}

/// While alive, `pool` is the one this thread's kernels draw from (for its element type);
/// dropping the guard puts the pool back where it came from, with what it gained and lost.
/// Installs nest: the innermost one is in force.
#[must_use = "the pool is installed only while the guard lives"]
pub struct Guard<'a, T: 'static> {
    owner: &'a mut Pool<T>,
    /// The pool this install displaced (an outer install), restored on drop.
    outer: Option<Pool<T>>,
}

/// Install `pool` on this thread until the returned guard is dropped. A pool of an element type
/// that is not pooled (neither `f32` nor `f64`) is left where it is.
pub fn install<T: 'static>(pool: &mut Pool<T>) -> Guard<'_, T> {
    let outer = with_slot::<T, _>(|slot| slot.replace(std::mem::take(pool))).flatten();
    Guard { owner: pool, outer }
}

impl<T: 'static> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        let outer = self.outer.take();
        if let Some(Some(pool)) = with_slot::<T, _>(|slot| std::mem::replace(slot, outer)) {
            *self.owner = pool;
        }
    }
}

/// A spare buffer of `n` values from the installed pool, with the values it was put with (no
/// fill; resized to `n` if it held fewer), for a kernel that writes every value before it reads
/// any; `None` where the pool has none ([`crate::alloc::try_for_overwrite`] then allocates
/// zeros; a kernel that pushes its values needs no fill at all).
pub fn take_for_overwrite<T: Scalar>(n: usize) -> Option<Vec<T>> {
    let found = match n {
        0 => None,
        _ => with_slot::<T, _>(|slot| slot.as_mut().and_then(|p| p.take_as_put(n))).flatten(),
    };
    found.map(|mut buf| {
        if buf.len() != n {
            buf.clear();
            buf.resize(n, T::zero());
        }
        buf
    })
}

/// A spare buffer of capacity exactly `n` from the installed pool, if any (counted as a miss
/// otherwise). Empty requests are never pooled.
pub fn take<T: 'static>(n: usize) -> Option<Vec<T>> {
    if n == 0 {
        return None;
    }
    with_slot::<T, _>(|slot| slot.as_mut().and_then(|p| p.take(n))).flatten()
}

/// Hand a scratch buffer back to the installed pool of `T` (dropped where none is installed).
pub fn give<T: 'static>(buf: Vec<T>) {
    with_slot::<T, _>(|slot| {
        if let Some(p) = slot {
            p.put(buf);
        }
    });
}

/// Hand `t`'s buffer to the installed pool if nothing else shares it (see [`Pool::recycle`]).
pub fn recycle<T: Scalar>(t: Tensor<T>) {
    if let Ok(v) = t.try_into_vec() {
        give(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_and_only_while_installed() {
        let mut pool = Pool::<f32>::new();
        pool.put(vec![1.0, 2.0, 3.0]);
        // Not installed: a fresh allocation, the pool keeps its buffer.
        assert!(take::<f32>(3).is_none());
        {
            let _g = install(&mut pool);
            let v = crate::alloc::try_with_capacity::<f32>("test", "buffer", 3).unwrap();
            assert!(v.is_empty() && v.capacity() == 3, "handed out empty");
            // Another capacity, another type: not served.
            assert!(take::<f32>(4).is_none());
            assert!(take::<f64>(3).is_none());
            give(v);
        }
        let s = pool.stats();
        assert_eq!((s.reused, s.held), (1, 1), "{s:?}");
        assert_eq!(
            crate::alloc::try_zeroed::<f32>("test", "zeros", 3).unwrap(),
            vec![0.0; 3],
            "uninstalled: plain zeros"
        );
    }

    #[test]
    fn for_overwrite_skips_the_fill_only_for_a_pooled_buffer() {
        let for_overwrite = |n| crate::alloc::try_for_overwrite::<f32>("test", "out", n).unwrap();
        let mut pool = Pool::<f32>::new();
        pool.put(vec![1.0, 2.0, 3.0]);
        assert_eq!(for_overwrite(3), vec![0.0; 3], "not installed: zeros");
        let _g = install(&mut pool);
        assert_eq!(for_overwrite(2), vec![0.0; 2], "no spare of that capacity");
        // The spare's old values, for a kernel that overwrites them all.
        assert_eq!(for_overwrite(3), vec![1.0, 2.0, 3.0]);
        assert_eq!(for_overwrite(0), Vec::<f32>::new());
    }

    #[test]
    fn installs_nest_and_restore_the_outer_pool() {
        let (mut outer, mut inner) = (Pool::<f64>::new(), Pool::<f64>::new());
        outer.put(vec![0.0; 5]);
        inner.put(vec![0.0; 7]);
        let _o = install(&mut outer);
        {
            let _i = install(&mut inner);
            assert!(take::<f64>(5).is_none(), "the outer pool is not in force");
            assert!(take::<f64>(7).is_some());
        }
        assert!(take::<f64>(5).is_some(), "the outer pool is back");
        drop(_o);
        assert_eq!(inner.stats().held, 0);
        assert_eq!(outer.stats().held, 0);
    }

    #[test]
    fn trim_drops_what_sat_unused_for_idle_trims_steps() {
        let mut pool = Pool::<f32>::new();
        pool.put(vec![0.0; 2]);
        pool.put(vec![0.0; 3]);
        for _ in 1..IDLE_TRIMS {
            pool.trim();
        }
        assert_eq!(pool.stats().held, 2, "survives IDLE_TRIMS - 1 trims");
        let two = pool.take(2).expect("still there");
        pool.put(two);
        pool.trim();
        assert_eq!(
            pool.stats().held,
            1,
            "the unused one is gone, the reused one stays"
        );
        assert!(pool.take(2).is_some() && pool.take(3).is_none());
    }

    #[test]
    fn held_bytes_follow_put_take_trim_and_clear() {
        // Bytes by capacity, not length; f64 elements are 8 bytes.
        let mut pool = Pool::<f64>::new();
        let mut four = Vec::with_capacity(4);
        four.push(1.0);
        pool.put(four);
        pool.put(vec![0.0; 10]);
        let s = pool.stats();
        assert_eq!(
            (s.held, s.held_bytes, s.peak_held_bytes),
            (2, 112, 112),
            "{s:?}"
        );
        let ten = pool.take(10).expect("held");
        assert_eq!(pool.stats().held_bytes, 32, "taking hands the bytes out");
        assert!(pool.take(7).is_none());
        assert_eq!(pool.stats().held_bytes, 32, "a miss changes nothing");
        pool.put(vec![0.0; 2]);
        let s = pool.stats();
        assert_eq!(
            (s.held_bytes, s.peak_held_bytes),
            (48, 112),
            "the peak stays"
        );
        pool.put(ten);
        assert_eq!(pool.stats().peak_held_bytes, 128, "a new high-water mark");
        // Everything sits unused for IDLE_TRIMS trims: all of it is dropped.
        for _ in 0..IDLE_TRIMS {
            pool.trim();
        }
        let s = pool.stats();
        assert_eq!(
            (s.held, s.held_bytes, s.peak_held_bytes),
            (0, 0, 128),
            "{s:?}"
        );
        pool.put(vec![0.0; 3]);
        pool.clear();
        assert_eq!(pool.stats().held_bytes, 0);
        // Through the installed pool's free functions too.
        let mut pool = Pool::<f32>::new();
        {
            let _g = install(&mut pool);
            give(vec![0.0f32; 5]);
            assert!(take_for_overwrite::<f32>(5).is_some());
            give(vec![0.0f32; 6]);
        }
        let s = pool.stats();
        assert_eq!((s.held_bytes, s.peak_held_bytes), (24, 24), "{s:?}");
    }

    #[test]
    fn shared_storage_is_never_pooled() {
        let mut pool = Pool::<f32>::new();
        let t = Tensor::vector(vec![1.0f32; 4]);
        let kept = t.clone();
        pool.recycle(t);
        assert_eq!(pool.stats().held, 0, "a clone still reads it");
        pool.recycle(kept);
        assert_eq!(pool.stats().held, 1, "the last owner gives it up");
    }
}
