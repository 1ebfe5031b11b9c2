//! Memory the driver keeps after the application freed it: stream-ordered memory pools
//! (`cuMemFreeAsync` returns memory to the pool, which keeps it up to its release
//! threshold until a synchronisation or `cuMemPoolTrimTo`) and each device's graph memory
//! pool (graph allocation nodes; kept until `cuDeviceGraphMemTrim`).
//!
//! Each such reservoir is charged for what the driver holds, not for what the application
//! uses: an allocation charges only the part the reservoir cannot serve from memory it
//! already holds, a free charges nothing back, and the charge comes down only when the
//! driver says (through its `RESERVED_MEM_CURRENT` attribute) that it released memory.
//! Until a resynchronisation the charge is an upper bound of the driver's holding, never
//! below it, so the container can over-count briefly but never pass its slice.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A reservoir: a stream-ordered pool (by handle) or a device's graph memory pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    Pool(u64),
    Graph(usize),
}

/// What the shim believes one reservoir holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservoir {
    pub dev: usize,
    /// Bytes charged to the container for this reservoir.
    pub charged: u64,
    /// Bytes of it the application holds (allocated, not yet freed).
    pub in_use: u64,
    /// Retained bytes the driver keeps past a synchronisation (release threshold).
    pub threshold: u64,
    /// The pool was destroyed: frees now credit directly.
    pub destroyed: bool,
}

impl Reservoir {
    fn retained(&self) -> u64 {
        self.charged.saturating_sub(self.in_use)
    }

    /// The driver releases unused memory of a pool holding more than its threshold at
    /// the next synchronisation.
    fn releasable(&self) -> bool {
        !self.destroyed && self.retained() > 0 && self.charged > self.threshold
    }
}

/// A charge decided under the lock, to be confirmed or rolled back after the driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub key: Key,
    pub dev: usize,
    /// Bytes the application takes from the reservoir.
    pub bytes: u64,
    /// Bytes newly charged to the container (the reservoir could not serve them).
    pub extra: u64,
}

/// Hasher for handles and pointers (the standard SipHash costs more than the rest of a
/// stream-ordered allocation's bookkeeping; keys here are not attacker-chosen).
#[derive(Default, Clone, Copy)]
pub struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        // murmur3's finaliser: every input bit reaches the low bits the table indexes by
        // (pointers are 2 MiB aligned: their own low bits are all zero).
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn write_isize(&mut self, x: isize) {
        self.write_u64(x as u64);
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<HandleHasher>>;

#[derive(Default)]
pub struct Book {
    pub res: Map<Key, Reservoir>,
    /// Stream-ordered pointer → (its pool, bytes taken).
    pub ptrs: Map<u64, (Key, u64)>,
    /// Executable graph → (device, bytes its allocation nodes need) per device.
    pub execs: Map<u64, Vec<(usize, u64)>>,
    /// Release thresholds set on pools not seen yet.
    pub thresholds: Map<u64, u64>,
    /// Where created pools live: `Some(device)`, or `None` for host memory (not counted).
    pub locations: Map<u64, Option<usize>>,
}

/// All reservoirs of one process.
#[derive(Default)]
pub struct Reservoirs {
    book: Mutex<Book>,
    /// Any reservoir or graph exec is tracked (lets untouched fast paths skip the lock).
    any: AtomicBool,
    /// Some reservoir retains more than its threshold: the next synchronisation may
    /// release memory, so it is worth asking the driver then.
    release_pending: AtomicBool,
    /// Stream-ordered pointers tracked (frees of other pointers skip the lock).
    tracked: AtomicUsize,
}

impl Reservoirs {
    pub fn lock(&self) -> MutexGuard<'_, Book> {
        match self.book.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub fn mark_used(&self) {
        self.any.store(true, Ordering::Release);
    }

    pub fn release_pending(&self) -> bool {
        self.release_pending.load(Ordering::Acquire)
    }

    pub fn set_release_pending(&self, v: bool) {
        self.release_pending.store(v, Ordering::Release);
    }

    /// Any stream-ordered pointer tracked? (Updated under the lock by [`Self::note_ptrs`].)
    pub fn tracks_ptrs(&self) -> bool {
        self.tracked.load(Ordering::Acquire) != 0
    }

    /// Record how many pointers `book` tracks (call with the lock held).
    pub fn note_ptrs(&self, book: &Book) {
        self.tracked.store(book.ptrs.len(), Ordering::Release);
    }
}

impl Book {
    /// Plan taking `bytes` from `key` on `dev`: how much must be newly charged.
    pub fn plan(&mut self, key: Key, dev: usize, bytes: u64) -> Ticket {
        let threshold = match key {
            Key::Graph(_) => u64::MAX,
            Key::Pool(h) => self.thresholds.get(&h).copied().unwrap_or(0),
        };
        let r = self.res.entry(key).or_insert(Reservoir {
            dev,
            threshold,
            ..Reservoir::default()
        });
        let extra = (r.in_use.saturating_add(bytes)).saturating_sub(r.charged);
        Ticket {
            key,
            dev: r.dev,
            bytes,
            extra,
        }
    }

    /// The charge for `t.extra` succeeded: take the bytes.
    pub fn take(&mut self, t: &Ticket) {
        if let Some(r) = self.res.get_mut(&t.key) {
            r.charged = r.charged.saturating_add(t.extra);
            r.in_use = r.in_use.saturating_add(t.bytes);
        }
    }

    /// The driver call failed: give the bytes back. Returns what to credit.
    pub fn untake(&mut self, t: &Ticket) -> u64 {
        match self.res.get_mut(&t.key) {
            Some(r) => {
                r.in_use = r.in_use.saturating_sub(t.bytes);
                let back = t.extra.min(r.charged);
                r.charged -= back;
                back
            }
            None => 0,
        }
    }

    /// `ptr` was freed back to its pool. Returns `(dev, bytes to credit now, retained
    /// past the threshold)`: only a destroyed pool credits at free.
    pub fn free(&mut self, ptr: u64) -> Option<(usize, u64, bool)> {
        let (key, bytes) = self.ptrs.remove(&ptr)?;
        let r = self.res.get_mut(&key)?;
        r.in_use = r.in_use.saturating_sub(bytes);
        if r.destroyed {
            let back = bytes.min(r.charged);
            r.charged -= back;
            let dev = r.dev;
            if r.in_use == 0 {
                self.res.remove(&key);
            }
            return Some((dev, back, false));
        }
        Some((r.dev, 0, r.releasable()))
    }

    /// The driver reports `reported` bytes reserved by `key`. Returns `(dev, credit,
    /// charge)`: what to give back to or add to the container so the charge matches.
    pub fn resync(&mut self, key: Key, reported: u64) -> Option<(usize, u64, u64)> {
        let r = self.res.get_mut(&key)?;
        let target = reported.max(r.in_use);
        let out = if target < r.charged {
            (r.dev, r.charged - target, 0)
        } else {
            (r.dev, 0, target - r.charged)
        };
        r.charged = target;
        Some(out)
    }

    /// Reservoirs worth asking the driver about (retaining more than their threshold).
    pub fn releasable(&self) -> Vec<Key> {
        self.res
            .iter()
            .filter(|(_, r)| r.releasable())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Every live reservoir (before refusing an allocation, ask about all of them).
    pub fn keys(&self) -> Vec<Key> {
        self.res
            .iter()
            .filter(|(_, r)| !r.destroyed)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The application set pool `h`'s release threshold.
    pub fn set_threshold(&mut self, h: u64, threshold: u64) {
        self.thresholds.insert(h, threshold);
        if let Some(r) = self.res.get_mut(&Key::Pool(h)) {
            r.threshold = threshold;
        }
    }

    /// The pool was destroyed: what it retains goes back now (returned: `(dev, credit)`),
    /// what is still allocated goes back at each free.
    pub fn destroy(&mut self, key: Key) -> Option<(usize, u64)> {
        let r = self.res.get_mut(&key)?;
        let back = r.retained();
        r.charged -= back;
        r.destroyed = true;
        let dev = r.dev;
        if r.in_use == 0 {
            self.res.remove(&key);
        }
        Some((dev, back))
    }

    /// Is any reservoir retaining more than its threshold?
    pub fn any_releasable(&self) -> bool {
        self.res.values().any(Reservoir::releasable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Key = Key::Pool(0xabc);

    fn take(b: &mut Book, key: Key, bytes: u64) -> Ticket {
        let t = b.plan(key, 0, bytes);
        b.take(&t);
        t
    }

    #[test]
    fn pool_reuses_what_it_retains_and_credits_only_on_resync() {
        let mut b = Book::default();
        // (step, expected extra charge)
        let t1 = take(&mut b, P, 10);
        assert_eq!(t1.extra, 10);
        b.ptrs.insert(1, (P, 10));
        assert_eq!(b.free(1), Some((0, 0, true)), "retained 10 > threshold 0");
        let t2 = take(&mut b, P, 6);
        assert_eq!(t2.extra, 0, "served from retained memory");
        let t3 = take(&mut b, P, 8);
        assert_eq!(t3.extra, 4);
        assert_eq!(b.res[&P].charged, 14);
        // Driver released down to what is in use (14): nothing to credit.
        assert_eq!(b.resync(P, 14), Some((0, 0, 0)));
        // The driver reports less than in use (frees pending): keep in_use.
        assert_eq!(b.resync(P, 3), Some((0, 0, 0)));
        assert_eq!(b.res[&P].charged, 14);
        // Driver holds more than we thought (its own chunking): charge the difference.
        assert_eq!(b.resync(P, 32), Some((0, 0, 18)));
        assert_eq!(b.resync(P, 20), Some((0, 12, 0)));
    }

    #[test]
    fn threshold_decides_what_is_releasable() {
        let mut b = Book::default();
        b.set_threshold(0xabc, 100);
        take(&mut b, P, 64);
        b.ptrs.insert(7, (P, 64));
        assert_eq!(b.free(7), Some((0, 0, false)), "64 held ≤ threshold 100");
        assert!(b.releasable().is_empty());
        take(&mut b, P, 200);
        b.ptrs.insert(8, (P, 200));
        assert_eq!(b.res[&P].charged, 200, "served 64 from what it held");
        assert_eq!(b.free(8), Some((0, 0, true)));
        assert_eq!(b.releasable(), vec![P]);
    }

    #[test]
    fn failed_driver_call_rolls_back() {
        let mut b = Book::default();
        let t = take(&mut b, P, 10);
        assert_eq!(b.untake(&t), 10);
        assert_eq!(b.res[&P], Reservoir::default());
    }

    #[test]
    fn destroyed_pool_credits_retained_now_and_the_rest_at_free() {
        let mut b = Book::default();
        take(&mut b, P, 10);
        b.ptrs.insert(1, (P, 10));
        take(&mut b, P, 6);
        b.ptrs.insert(2, (P, 6));
        b.free(1);
        assert_eq!(b.destroy(P), Some((0, 10)));
        assert_eq!(b.free(2), Some((0, 6, false)));
        assert!(b.res.is_empty());
        assert_eq!(b.free(2), None);
    }

    #[test]
    fn handle_hasher_spreads_aligned_pointers() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let b = BuildHasherDefault::<HandleHasher>::default();
        // 4096 pointers 2 MiB apart land in (nearly) as many of 4096 low-bit buckets as a
        // random spread would (~2590 expected); an identity hash would put them all in one.
        let buckets: std::collections::HashSet<u64> = (0..4096u64)
            .map(|i| b.hash_one(0x7f00_0000_0000u64 + (i << 21)) & 4095)
            .collect();
        assert!(buckets.len() > 2400, "{} buckets", buckets.len());
    }

    #[test]
    fn graph_pool_never_releases_on_its_own() {
        let mut b = Book::default();
        let g = Key::Graph(1);
        let t = b.plan(g, 1, 100);
        b.take(&t);
        // A launch takes the bytes only for its duration: graph pools keep what they grew.
        b.res.get_mut(&g).unwrap().in_use = 0;
        assert!(b.releasable().is_empty(), "threshold is infinite");
        assert_eq!(b.plan(g, 1, 80).extra, 0);
        assert_eq!(b.plan(g, 1, 130).extra, 30);
        assert_eq!(b.resync(g, 0), Some((1, 100, 0)), "trimmed");
    }
}
