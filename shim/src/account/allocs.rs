//! Allocation table: which handle (device pointer, array, VMM handle) was charged how many
//! bytes on which device, so frees can be credited.
//!
//! The hot path is a lock-free open-addressing table of atomic words (a bounded linear
//! probe, claimed with compare-and-swap); a handle that finds no slot within the probe
//! window goes to a mutex-protected overflow map, which is only consulted while non-empty.
//!
//! Cache behaviour decides the cost: every new handle hashes to a line nobody touched
//! recently, so a key and its charge share one 16-byte entry (one line per insert, not
//! two) and the default table is 256 KiB, small enough to stay in a core's L2. (The first
//! version kept keys and values in separate 512 KiB arrays: two misses per insert, which
//! was most of the shim's alloc+free overhead.)
//! A handle is inserted before the allocating call returns it to the application and
//! removed by its free, so the same key is never inserted and removed concurrently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Slots probed before falling back to the overflow map.
const PROBE: usize = 32;
const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;
const DEV_BITS: u32 = 4;

/// One charged allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub dev: usize,
    pub bytes: u64,
}

impl Charge {
    fn pack(self) -> u64 {
        (self.bytes << DEV_BITS) | (self.dev as u64 & ((1 << DEV_BITS) - 1))
    }
    fn unpack(v: u64) -> Charge {
        Charge {
            dev: (v & ((1 << DEV_BITS) - 1)) as usize,
            bytes: v >> DEV_BITS,
        }
    }
    fn packable(self) -> bool {
        self.dev < (1 << DEV_BITS) && self.bytes < (1 << (64 - DEV_BITS))
    }
}

/// One slot: the handle and its packed charge, on the same cache line.
#[repr(C, align(16))]
struct Entry {
    key: AtomicU64,
    val: AtomicU64,
}

/// Handle → charge map.
pub struct AllocTable {
    slots: Box<[Entry]>,
    mask: usize,
    overflow: Mutex<HashMap<u64, Charge>>,
    overflow_len: AtomicUsize,
}

impl Default for AllocTable {
    fn default() -> Self {
        AllocTable::with_capacity(1 << 14)
    }
}

fn hash(key: u64) -> usize {
    let h = (key ^ (key >> 21) ^ (key >> 9)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 32) as usize
}

impl AllocTable {
    /// A table with `cap` (rounded to a power of two) lock-free slots.
    pub fn with_capacity(cap: usize) -> AllocTable {
        let cap = cap.next_power_of_two().max(PROBE);
        AllocTable {
            slots: (0..cap)
                .map(|_| Entry {
                    key: AtomicU64::new(EMPTY),
                    val: AtomicU64::new(0),
                })
                .collect(),
            mask: cap - 1,
            overflow: Mutex::new(HashMap::new()),
            overflow_len: AtomicUsize::new(0),
        }
    }

    fn with_overflow<R>(&self, f: impl FnOnce(&mut HashMap<u64, Charge>) -> R) -> R {
        let mut m = match self.overflow.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        let r = f(&mut m);
        self.overflow_len.store(m.len(), Ordering::Release);
        r
    }

    /// Record `key`. A handle is unique while live, so no lookup for an older entry is made
    /// (if the driver ever reused a handle whose free we missed, the old charge stays
    /// counted: an over-count, never an under-count).
    pub fn insert(&self, key: u64, charge: Charge) {
        if key != EMPTY && key != TOMBSTONE && charge.packable() {
            let start = hash(key);
            for i in 0..PROBE {
                let e = &self.slots[(start + i) & self.mask];
                let k = e.key.load(Ordering::Relaxed);
                if (k == EMPTY || k == TOMBSTONE)
                    && e.key
                        .compare_exchange(k, key, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    e.val.store(charge.pack(), Ordering::Release);
                    return;
                }
            }
        }
        self.with_overflow(|m| m.insert(key, charge));
    }

    /// Remove `key`, returning what it was charged.
    pub fn remove(&self, key: u64) -> Option<Charge> {
        if key != EMPTY && key != TOMBSTONE {
            let start = hash(key);
            for i in 0..PROBE {
                let e = &self.slots[(start + i) & self.mask];
                let k = e.key.load(Ordering::Acquire);
                if k == key {
                    let v = e.val.load(Ordering::Acquire);
                    if e.key
                        .compare_exchange(key, TOMBSTONE, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Some(Charge::unpack(v));
                    }
                }
                if k == EMPTY {
                    break;
                }
            }
        }
        if self.overflow_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.with_overflow(|m| m.remove(&key))
    }

    /// Number of live entries (tests and diagnostics).
    pub fn len(&self) -> usize {
        let fast = self
            .slots
            .iter()
            .filter(|e| {
                let k = e.key.load(Ordering::Relaxed);
                k != EMPTY && k != TOMBSTONE
            })
            .count();
        fast + self.overflow_len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_roundtrip_and_reuse() {
        let t = AllocTable::default();
        assert!(t.is_empty());
        let c = Charge {
            dev: 1,
            bytes: 2 << 20,
        };
        t.insert(0x7f00_0000_0000, c);
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(0x7f00_0000_0000), Some(c));
        assert_eq!(t.remove(0x7f00_0000_0000), None);
    }

    #[test]
    fn odd_keys_and_values_use_the_overflow() {
        let t = AllocTable::with_capacity(32);
        // (key, charge): sentinel keys and unpackable charges still round-trip.
        let cases = [
            (0u64, Charge { dev: 0, bytes: 1 }),
            (u64::MAX, Charge { dev: 3, bytes: 7 }),
            (5, Charge { dev: 40, bytes: 9 }),
            (
                6,
                Charge {
                    dev: 0,
                    bytes: u64::MAX,
                },
            ),
        ];
        for (k, c) in cases {
            t.insert(k, c);
        }
        for (k, c) in cases {
            assert_eq!(t.remove(k), Some(c), "key {k:#x}");
        }
        assert!(t.is_empty());
    }

    #[test]
    fn full_table_spills_and_still_finds_everything() {
        let t = AllocTable::with_capacity(64);
        for i in 1..=1000u64 {
            t.insert(
                i << 21,
                Charge {
                    dev: (i % 16) as usize,
                    bytes: i,
                },
            );
        }
        assert_eq!(t.len(), 1000);
        for i in (1..=1000u64).rev() {
            assert_eq!(
                t.remove(i << 21),
                Some(Charge {
                    dev: (i % 16) as usize,
                    bytes: i
                })
            );
        }
        assert!(t.is_empty());
    }

    #[test]
    fn many_threads_insert_and_remove() {
        let t = AllocTable::with_capacity(1 << 12);
        std::thread::scope(|s| {
            for th in 0..8u64 {
                let t = &t;
                s.spawn(move || {
                    for round in 0..20u64 {
                        for i in 0..500u64 {
                            let k = (th << 48) | (round << 32) | ((i + 1) << 12);
                            t.insert(k, Charge { dev: 0, bytes: i });
                        }
                        for i in 0..500u64 {
                            let k = (th << 48) | (round << 32) | ((i + 1) << 12);
                            assert_eq!(t.remove(k), Some(Charge { dev: 0, bytes: i }));
                        }
                    }
                });
            }
        });
        assert!(t.is_empty());
    }
}
